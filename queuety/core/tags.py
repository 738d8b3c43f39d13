"""Run tags: the pure rules of ``tags=`` (dispatch, ``start()``, ``.with_tags()``,
``context.tag()``) and of the ``tag=`` filters (``customer:42`` in REST, ``customer=42`` on
the command line).

A tag is a key and a value, both strings. A key is 1 to 64 characters of letters, digits,
``_``, ``-``, ``.`` and ``/`` (so ``:`` and ``=``, which the filters split on, never occur in
one); a value is at most 255 characters and holds no NUL or other control character. Keys
are case-sensitive (``Customer`` and ``customer`` are two tags).

A dispatch (its ``tags=`` over the builder's ``.with_tags()``) sets at most ``MAX_TAGS`` (32),
and so does one attempt of a step with ``context.tag()``. A run's tags are those merged, so a
run whose steps tag under different keys can carry more: nothing the engine wrote is refused
later (an export of it replays; :func:`check_tags` with ``most=None``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from queuety import exceptions

if TYPE_CHECKING:
    from queuety.core.definition import WorkflowSpec

MAX_TAGS = 32
MAX_KEY = 64
MAX_VALUE = 255
_KEY = re.compile(r"[A-Za-z0-9_.\-/]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_pair(key: Any, value: Any, where: str) -> tuple[str, str]:
    """Return ``(key, value)`` when they make a valid tag; ``where`` names the caller in the
    error (``"the tags of workflow 'order'"``).

    Raises:
        InvalidPayload: the key or the value breaks the rules above, naming the key.
    """
    if not isinstance(key, str) or not key or len(key) > MAX_KEY or not _KEY.fullmatch(key):
        raise exceptions.InvalidPayload(
            f"Tag key {key!r} in {where} is not valid: a key is 1 to {MAX_KEY} characters of "
            "letters, digits, '_', '-', '.' and '/' (no ':' or '=', which the tag filters "
            "split on); nothing was written.")
    if not isinstance(value, str):
        raise exceptions.InvalidPayload(
            f"Tag {key!r} in {where} has a value of type {type(value).__name__}; tag values "
            f"are strings (pass str({value!r:.40})); nothing was written.")
    if len(value) > MAX_VALUE or _CONTROL.search(value):
        raise exceptions.InvalidPayload(
            f"Tag {key!r} in {where} has a value that is over {MAX_VALUE} characters or holds "
            "a control character; nothing was written.")
    return key, value


def check_tags(tags: Any, where: str, most: int | None = MAX_TAGS) -> dict[str, str]:
    """Return ``tags`` as a new dict after checking every pair (``None``: no tags); ``most``
    caps their number (``None``: no cap, for a run's tags as stored, such as a replayed one).

    Raises:
        InvalidPayload: ``tags`` is not a mapping, has more than ``most`` pairs, or a
            pair breaks the rules (the error names its key).
    """
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise exceptions.InvalidPayload(
            f"The tags of {where} must be a mapping of strings to strings, like "
            f"{{'customer': '42'}} (got {type(tags).__name__}); nothing was written.")
    checked = dict(check_pair(key, value, where) for key, value in tags.items())
    if most is not None and len(checked) > most:
        raise exceptions.InvalidPayload(
            f"{where[:1].upper()}{where[1:]} has {len(checked)} tags; a dispatch sets at most "
            f"{most}; nothing was written.")
    return checked


def merged(*layers: Mapping[str, str] | None, where: str) -> dict[str, str]:
    """The tags of ``layers`` merged, a later layer's value winning for a key (the builder's
    ``.with_tags()``, then the dispatch's ``tags=``), checked as :func:`check_tags` does."""
    combined: dict[str, str] = {}
    for layer in layers:
        combined.update(check_tags(layer, where))
    return check_tags(combined, where)


def parse_filters(values: list[str], separator: str) -> dict[str, str]:
    """Parse filters ``key<separator>value`` (REST ``tag=customer:42`` with ``":"``, the CLI's
    ``--tag customer=42`` with ``"="``) into the pairs all of which a run must carry. An
    empty filter (``?tag=``) is no filter, as other empty filters are.

    Raises:
        ValueError: a filter without the separator, with an invalid key, or two filters giving
            one key different values; the message names the filter.
    """
    wanted: dict[str, str] = {}
    for text in values:
        if not text:
            continue
        key, found, value = text.partition(separator)
        if not found:
            raise ValueError(f"Tag filter {text!r} is not key{separator}value (for example "
                             f"customer{separator}42).")
        try:
            check_pair(key, value, f"tag filter {text!r}")
        except exceptions.InvalidPayload as error:
            raise ValueError(str(error).replace("; nothing was written.", ".")) from None
        if wanted.get(key, value) != value:
            raise ValueError(f"Tag filters give key {key!r} two values ({wanted[key]!r} and "
                             f"{value!r}); no run carries both.")
        wanted[key] = value
    return wanted


def of_spec(spec: WorkflowSpec, tags: Mapping[str, str] | None) -> dict[str, str]:
    """The tags of a run of ``spec`` dispatched with ``tags``: the builder's
    (``.with_tags()``) merged with ``tags``, which win for a key."""
    return merged(dict(spec.tags), tags, where=f"the tags of a run of workflow {spec.name!r}")


def tagged(spec: WorkflowSpec, tags: Mapping[str, str] | None) -> WorkflowSpec:
    """``spec`` carrying ``tags`` too (checked, winning over its own for a key), so every
    way of starting it (flow control per key included) writes them on the run's row.

    Raises:
        InvalidPayload: ``tags`` is not a mapping (``[]`` or ``0`` too), or breaks the rules.
    """
    if tags is None:
        return spec
    return replace(spec, tags=tuple(sorted(of_spec(spec, tags).items())))
