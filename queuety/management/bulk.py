"""``manage.py queuety workflow bulk``, ``bulk-list``, ``bulk-status`` and ``bulk-cancel``: bulk actions by
filter from the shell (thin over ``queuety.bulk_actions``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from queuety import bulk_actions, exceptions, queries
from queuety.management.starting import Error


def _tag(text: str) -> tuple[str, str]:
    """An argparse type: ``key=value``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--tag takes KEY=VALUE (got {text!r}).")
    return key.strip(), value


def _age(text: str) -> Any:
    try:
        return queries.parse_age(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _op_id(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"A bulk operation id is a positive whole number "
                                         f"(got {text!r}).")
    return int(text)


def add_bulk_actions(actions: Any) -> None:
    """Add ``bulk``, ``bulk-list``, ``bulk-status`` and ``bulk-cancel`` to the ``workflow`` sub-parsers."""
    bulk = actions.add_parser("bulk", help="Act on every run a filter matches, as a durable "
                                           "operation a worker processes (--dry-run first).")
    bulk.add_argument("bulk_action", metavar="ACTION", choices=list(bulk_actions.ACTIONS),
                      help=f"One of {', '.join(bulk_actions.ACTIONS)}.")
    bulk.add_argument("--workflow", default=None, help="Only runs of this workflow.")
    bulk.add_argument("--definition", default=None,
                      help="Only runs of this definition (id, hash or hash prefix).")
    bulk.add_argument("--status", default=None, help="Only runs with this status.")
    bulk.add_argument("--version", default=None, help="Only runs of this version() label.")
    bulk.add_argument("--waiting", default=None,
                      help="true, false, or a kind of wait (approval, decision, input, "
                           "person: any of those three, signal, workflows).")
    bulk.add_argument("--tag", dest="tags", type=_tag, action="append", default=None,
                      metavar="KEY=VALUE", help="Only runs with this tag (repeatable: all).")
    bulk.add_argument("--older-than", type=_age, default=None, metavar="AGE",
                      help="Only runs created longer ago: seconds, or 30m, 12h, 7d, 2w.")
    bulk.add_argument("--error-type", default=None,
                      help="Only runs whose error is of this type (ValueError, mod.Class).")
    bulk.add_argument("--step", default=None, help="rewind: the step (index or name).")
    bulk.add_argument("--to", default=None, help="migrate: latest (default), hash or id.")
    bulk.add_argument("--dry-run", action="store_true",
                      help="Count the matching runs; change nothing.")
    bulk.add_argument("--json", action="store_true", help="Print the operation as JSON.")
    listing = actions.add_parser("bulk-list", help="List the most recent bulk operations.")
    listing.add_argument("--limit", type=_op_id, default=20, metavar="N",
                         help="How many, newest first (default 20).")
    listing.add_argument("--json", action="store_true", help="Print them as JSON.")
    status = actions.add_parser("bulk-status", help="Show a bulk operation's progress.")
    cancel = actions.add_parser("bulk-cancel", help="Stop a bulk operation.")
    for parser in (status, cancel):
        parser.add_argument("op_id", type=_op_id, metavar="ID")
        parser.add_argument("--json", action="store_true", help="Print it as JSON.")
    for parser in (bulk, listing, status, cancel):
        parser.add_argument("--as-user", default=None, metavar="USERNAME",
                            help="Act for this user: only the runs QUEUETY['RUN_SCOPE'] gives "
                                 "them (default: full access).")


def bulk_action(action: str, options: dict[str, Any], write: Callable[[str], None]) -> bool:
    """Run ``workflow bulk``, ``bulk-list``, ``bulk-status`` or ``bulk-cancel``; False for
    another action.

    Raises:
        Error: bad input (nothing recorded), or no such operation.
    """
    if action not in ("bulk", "bulk-list", "bulk-status", "bulk-cancel"):
        return False
    user = options.get("acting_user")
    if action == "bulk-list":
        _list(bulk_actions.recent(user, options["limit"]), options["json"], write)
        return True
    try:
        if action == "bulk":
            progress = _start(options, user)
        else:
            # --as-user: only their own, whichever way (API, admin, CLI) they started it.
            op = bulk_actions.status(options["op_id"], requested_by=user)
            progress = op if action == "bulk-status" else bulk_actions.cancel(op.id)
    except (exceptions.QueuetyError, ValueError) as error:
        raise Error(str(error)) from None
    if options["json"]:
        write(json.dumps(progress.to_dict(), indent=4, default=str))
    else:
        write(_text(progress))
    return True


def _list(found: list[bulk_actions.BulkProgress], as_json: bool,
          write: Callable[[str], None]) -> None:
    if as_json:
        write(json.dumps([each.to_dict() for each in found], indent=4, default=str))
        return
    if not found:
        write("No bulk operations.")
    for each in found:
        write(f"{each.id}  {each.action} {each.status}{' (dry run)' if each.dry_run else ''}  "
              f"{each.processed} of {each.matched} processed ({each.acted} acted on, "
              f"{each.skipped} skipped)  by {each.requested_by or '-'}  {each.created_at:%Y-%m-%d %H:%M}  "
              f"filter {json.dumps(each.filter, default=str)}")


def _actor(user: Any) -> str:
    return f"manage.py --as-user {user.get_username()}"


def _start(options: dict[str, Any], user: Any) -> bulk_actions.BulkProgress:
    step = options["step"]
    arguments = {"step": int(step) if step is not None and step.isdigit() else step,
                 "to": options["to"]}
    filters = {key: options[key] for key in ("workflow", "definition", "status", "version",
                                             "waiting", "older_than", "error_type")}
    if options["tags"]:
        filters["tags"] = dict(options["tags"])
    return bulk_actions.start(
        options["bulk_action"], filters,
        {key: value for key, value in arguments.items() if value is not None},
        dry_run=options["dry_run"], user=user,
        actor="manage.py" if user is None else _actor(user))


def _text(progress: bulk_actions.BulkProgress) -> str:
    if progress.dry_run:
        return (f"Dry run: {progress.matched} run(s) match; bulk {progress.action} would act "
                f"on those it applies to (nothing changed; operation {progress.id}).")
    lines = [f"Bulk operation {progress.id}: {progress.action} {progress.status}, "
             f"{progress.processed} of {progress.matched} run(s) processed "
             f"({progress.acted} acted on, {progress.skipped} skipped)."]
    lines += [f"  skipped {count}: {reason}"
              for reason, count in sorted(progress.skipped_reasons.items())]
    if progress.error:
        lines.append(f"  error: {progress.error}")
    if progress.status in ("pending", "running"):
        lines.append(f"Follow it with: manage.py queuety workflow bulk-status {progress.id}")
    return "\n".join(lines)
