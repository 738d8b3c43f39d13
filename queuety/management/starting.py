"""``manage.py queuety workflow dispatch|definitions`` and ``manage.py queuety schedule ...``:
starting runs of registered workflows and managing schedules from the shell (thin over
``queuety.registry`` and ``queuety.schedules``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from queuety import exceptions, registry, schedules


class Error(CommandError):
    """Printed by Django as ``Error: <message>`` on stderr, with exit code 1."""


def add_workflow_actions(actions: Any) -> None:
    """Add ``dispatch`` and ``definitions`` to the ``workflow`` group's sub-parsers."""
    dispatch = actions.add_parser("dispatch", help="Start a run of a registered workflow.")
    dispatch.add_argument("name", help="The registered workflow's name (see definitions).")
    source = dispatch.add_mutually_exclusive_group()
    source.add_argument("--payload", default=None, help="The run's payload, a JSON object.")
    source.add_argument("--payload-file", default=None, help="A file holding the payload.")
    dispatch.add_argument("--key", default=None, help="An idempotency key: a key already "
                                                      "used prints the run it started.")
    definitions = actions.add_parser("definitions", help="List the registered workflows.")
    definitions.add_argument("--format", choices=["table", "json"], default="table")


def add_schedule_group(groups: Any) -> None:
    """Add the ``schedule`` group: ``list``, ``add``, ``remove``, ``run``."""
    group = groups.add_parser("schedule", help="Schedules (django-celery-beat periodic tasks "
                                               "that start workflows).")
    actions = group.add_subparsers(dest="action", required=True,
                                   metavar="{list,add,remove,run}")
    listing = actions.add_parser("list", help="List the schedules.")
    listing.add_argument("--format", choices=["table", "json"], default="table")
    add = actions.add_parser("add", help="Add or update a schedule.")
    add.add_argument("name", help="The schedule's name.")
    add.add_argument("--workflow", default=None, help="The registered workflow it starts "
                                                      "(default: the schedule's name).")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", default=None, help="Five-field cron expression, e.g. "
                                                   "'0 3 * * *'.")
    when.add_argument("--every", default=None, help="An interval: '90', '30 minutes', "
                                                    "'1 hour', '2d'.")
    add.add_argument("--payload", default=None, help="The runs' payload, a JSON object.")
    add.add_argument("--overlap", default="allow",
                     help="allow (default), skip or buffer: what a fire does while the "
                          "schedule's previous run is live.")
    add.add_argument("--timezone", default=None, help="The cron expression's time zone "
                                                      "(default: CELERY_TIMEZONE or UTC).")
    add.add_argument("--disabled", action="store_true", help="Save it disabled.")
    remove = actions.add_parser("remove", help="Delete a schedule (its runs stay).")
    remove.add_argument("name")
    run = actions.add_parser("run", help="Fire schedules for their current tick now (a tick "
                                         "that already started a run starts none).")
    run.add_argument("name", nargs="?", default=None,
                     help="One schedule (default: every enabled schedule).")
    run.add_argument("--now", action="store_true",
                     help="Start a run now even if this tick's run exists (one schedule).")


def _payload(text: str | None, file: str | None) -> Any:
    if file is not None:
        try:
            with open(file) as handle:
                text = handle.read()
        except OSError as error:
            raise Error(f"Unable to read the payload file {file}: {error}.") from None
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise Error(f"The payload is not valid JSON: {error}.") from None
    if not isinstance(value, dict):
        raise Error(f"The payload must be a JSON object (got "
                           f"{type(value).__name__}); nothing was dispatched.")
    return value


def _guarded(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return function(*args, **kwargs)
    except exceptions.QueuetyError as error:
        raise Error(str(error)) from None


def workflow_action(action: str, options: dict[str, Any], write: Callable[[str], None],
                    table: Callable[[list[str], list[list[str]]], None]) -> bool:
    """Run ``workflow dispatch`` or ``workflow definitions``; False for another action."""
    if action == "dispatch":
        payload = _payload(options["payload"], options["payload_file"])
        run_id, reused = _guarded(registry.start_run, options["name"], payload,
                                  idempotency_key=options["key"])
        said = f"Success: dispatched workflow #{run_id}"
        write(said + (f" (key {options['key']!r} had already started it; nothing new was "
                      "dispatched)." if reused else "."))
        return True
    if action == "definitions":
        entries = [entry.to_dict() for entry in registry.registered()]
        if options["format"] == "json":
            write(json.dumps(entries, indent=4, ensure_ascii=False))
        elif not entries:
            write("No workflows are registered (queuety.register() in an app's "
                  "workflows.py).")
        else:
            table(["Name", "Version", "Hash", "Steps", "Description"],
                  [[e["name"], e["version"] or "-", e["definition_hash"][:12],
                    str(len(e["steps"])), e["description"] or "-"] for e in entries])
        return True
    return False


def schedule_action(action: str, options: dict[str, Any], write: Callable[[str], None],
                    table: Callable[[list[str], list[list[str]]], None]) -> None:
    """Run ``schedule list|add|remove|run``."""
    if action == "list":
        found = [each.to_dict() for each in schedules.schedules()]
        if options["format"] == "json":
            write(json.dumps(found, indent=4, ensure_ascii=False))
        elif not found:
            write("No schedules found.")
        else:
            table(["Name", "Workflow", "When", "Overlap", "Enabled", "Last_run_at"],
                  [[s["name"], s["workflow"],
                    f"cron {s['cron']} {s['timezone']}" if s["cron"] else f"every {s['every']}s",
                    s["overlap"], "yes" if s["enabled"] else "no", s["last_run_at"] or "-"]
                   for s in found])
    elif action == "add":
        every = None if options["every"] is None else _guarded(schedules.parse_every,
                                                               options["every"])
        saved = _guarded(schedules.schedule, options["name"],
                         workflow=options["workflow"] or options["name"], cron=options["cron"],
                         every=every, payload=_payload(options["payload"], None),
                         overlap=options["overlap"], timezone=options["timezone"],
                         enabled=not options["disabled"])
        write(f"Success: schedule '{saved.name}' saved: workflow '{saved.workflow}', "
              + (f"cron '{saved.cron}' ({saved.timezone})" if saved.cron
                 else f"every {saved.every}s") + f", overlap {saved.overlap}.")
    elif action == "remove":
        _guarded(schedules.remove, options["name"])
        write(f"Success: schedule '{options['name']}' removed.")
    else:
        if options["now"] and options["name"] is None:
            raise Error("--now needs a schedule name: it starts a run whatever the "
                               "tick.")
        names = [options["name"]] if options["name"] else \
            [each.name for each in schedules.schedules() if each.enabled]
        if not names:
            write("No enabled schedules.")
        for name in names:
            fired = _guarded(schedules.fire_and_follow, name, manual=options["now"])
            write(_fired_line(name, fired))


def _fired_line(name: str, fired: schedules.Fire) -> str:
    if fired.outcome == "started":
        return f"Success: schedule '{name}' dispatched workflow #{fired.run_id}."
    if fired.outcome == "already_started":
        return f"Schedule '{name}': this tick already started workflow #{fired.run_id}."
    if fired.outcome == "skipped":
        return (f"Schedule '{name}' skipped: its run #{fired.waiting_for} is still live "
                "(overlap skip).")
    return (f"Schedule '{name}' buffered: it starts a run once #{fired.waiting_for} finishes "
            "(overlap buffer; a worker does that).")
