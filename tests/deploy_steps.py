"""Handlers of every shape a definition can name, fitting or not: the deploy check's cases
(tests/unit/test_handler_refs.py)."""

from __future__ import annotations

import queuety


def plain(state):
    return {"plain": True}


def with_context(state, context):
    return {"attempt": context.attempt}


def needs_three(state, item, index):
    return {"item": item}


def takes_nothing():
    return None


async def awaits(state):
    return {"awaited": True}


def streams(state):
    yield "chunk"


def reduce_items(state, aggregate):
    return {"reduced": aggregate["succeeded"]}


async def reduce_later(state, aggregate):
    return {}


def is_done(state):
    return bool(state.get("done"))


async def is_done_later(state):
    return True


class Charge(queuety.Step):
    def handle(self, state):
        return {"charged": True}


class Unimplemented(queuety.Step):
    """Subclasses Step but never overrides handle()."""


class NotAStep:
    pass


class Items(queuety.Step):
    def handle_item(self, state, item, index):
        return {"item": item}


class Streams(queuety.Step):
    def handle(self, state):
        yield "chunk"


class Reducer:
    def reduce(self, state, aggregate):
        return {}


class Flaky(Exception):
    pass


NOT_CALLABLE = 3
