"""``manage.py queuety workflow pause|resume --definition HASH``: pause every live run of one
definition, or resume its paused runs, from the shell (thin over ``queuety.quarantine``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from queuety import exceptions, quarantine, scope
from queuety.conf import settings
from queuety.management.starting import Error

#: Each action's verb in the past tense, as the report says it.
_DONE = {"pause": "paused", "resume": "resumed"}


def add_definition_options(parser: argparse.ArgumentParser, action: str) -> None:
    """Add ``--definition`` and ``--format`` to the ``pause`` or ``resume`` sub-parser (whose
    run id is then optional)."""
    which = "live" if action == "pause" else "paused"
    parser.add_argument("--definition", default=None, metavar="HASH",
                        help=f"{action.capitalize()} every {which} run of this definition "
                             "instead: its hash, a unique prefix of it (8 characters at "
                             "least) or its id.")
    parser.add_argument("--format", choices=["text", "json"], default="text",
                        help="With --definition: text, or the counts as JSON.")


def definition_action(action: str, options: dict[str, Any],
                      write: Callable[[str], None]) -> bool:
    """Run ``workflow pause|resume --definition``; False for one run (a run id and no
    ``--definition``), which the command does as before.

    Raises:
        Error: neither or both of a run id and ``--definition`` were given; the definition
            is unknown; some runs could not be resumed (after the report is written).
    """
    if action not in _DONE:
        return False
    run_id, ref = options.get("run_id"), options.get("definition")
    if run_id is not None and ref is not None:
        raise Error(f"Give either a run id or --definition, not both (got run #{run_id} and "
                    f"--definition {ref!r}).")
    if run_id is None and ref is None:
        what = "every live run" if action == "pause" else "every paused run"
        raise Error(f"Give the id of the run to {action}, or --definition HASH to {action} "
                    f"{what} of a definition.")
    if ref is None:
        if options.get("format", "text") != "text":
            raise Error("--format goes with --definition; one run's "
                        f"{action} prints one line.")
        return False
    operation = quarantine.pause_definition if action == "pause" else \
        quarantine.resume_definition
    user = options.get("acting_user")
    try:
        result = operation(ref, actor="manage.py", **_for_user(user))
    except exceptions.QueuetyError as error:
        raise Error(str(error)) from None
    if options.get("format") == "json":
        write(json.dumps(result.to_dict(), indent=4, ensure_ascii=False))
    else:
        for line in report(result):
            write(line)
    if result.failed:
        count = len(result.failed)
        raise Error(f"{count} run{'s' if count > 1 else ''} of definition "
                    f"{result.definition_hash[:12]} could not be {_DONE[action]} (listed "
                    "above); the others were.")
    return True


def _for_user(user: Any) -> dict[str, Any]:
    """With ``--as-user``: the bulk action reads only that user's runs (``RUN_SCOPE``) and
    changes only those ``RUN_ACCESS`` allows."""
    if user is None:
        return {}
    narrowed: dict[str, Any] = {"scope": lambda runs: scope.scoped_runs(user, runs)}
    if settings.RUN_ACCESS is not None:  # else every run would be read only to be kept
        narrowed["include"] = lambda run: scope.may_access(user, run)
    return narrowed


def report(result: quarantine.BulkResult) -> list[str]:
    """The text report of a definition-wide pause or resume."""
    done = _DONE[result.action]
    lines = [f"Success: {result.done} run{'' if result.done == 1 else 's'} of workflow "
             f"'{result.workflow}' {done} (definition {result.definition_hash[:12]}, id "
             f"{result.definition_id})."]
    if result.skipped:
        counts = ", ".join(f"{reason} {n}" for reason, n in sorted(result.skipped.items()))
        lines.append(f"Skipped {sum(result.skipped.values())}: {counts}.")
    lines += [f"Failed: run #{pk}: {error}" for pk, error in sorted(result.failed.items())]
    return lines
