"""``manage.py queuety workflow migrate``: move live runs onto another definition from the
shell (thin over ``queuety.run_migration``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from queuety import exceptions, run_migration
from queuety.management.starting import Error


def _mapping(text: str) -> tuple[str, str]:
    """An argparse type: ``old=new``."""
    old, sep, new = text.partition("=")
    if not sep or not old.strip() or not new.strip():
        raise argparse.ArgumentTypeError(
            f"--map takes OLD=NEW, an old step name and the new one (got {text!r}).")
    return old.strip(), new.strip()


def add_migrate_action(actions: Any) -> None:
    """Add ``migrate`` to the ``workflow`` group's sub-parsers."""
    migrate = actions.add_parser(
        "migrate", help="Move a workflow's live runs onto another of its definitions "
                        "(--dry-run first).")
    migrate.add_argument("name", help="The workflow's name.")
    migrate.add_argument("--to", default="latest",
                         help="'latest' (the definition registered now, the default), or a "
                              "definition's hash, hash prefix or id.")
    migrate.add_argument("--from", dest="from_definition", default=None,
                         help="Only the runs of this definition (hash, prefix or id).")
    migrate.add_argument("--map", dest="step_map", type=_mapping, action="append", default=[],
                         metavar="OLD=NEW", help="A renamed step (repeatable); other steps "
                                                 "map by name.")
    migrate.add_argument("--state", default=None, metavar="DOTTED.PATH",
                         help="A function state(state, run) -> state each run's state goes "
                              "through.")
    migrate.add_argument("--run", dest="runs", type=int, action="append", default=None,
                         metavar="RUN_ID", help="Only this run (repeatable).")
    migrate.add_argument("--dry-run", action="store_true",
                         help="Say what each run would do; change nothing.")
    migrate.add_argument("--json", action="store_true", help="Print the report as JSON.")


def migrate_action(action: str, options: dict[str, Any], write: Callable[[str], None],
                   table: Callable[[list[str], list[list[str]]], None]) -> bool:
    """Run ``workflow migrate``; False for another action.

    Raises:
        Error: bad input (nothing changed), or a run failed to move (exit code 1).
    """
    if action != "migrate":
        return False
    try:
        report = run_migration.migrate_runs(
            options["name"], options["to"], from_definition=options["from_definition"],
            step_map=dict(options["step_map"]), state=options["state"],
            runs=options["runs"], dry_run=options["dry_run"], actor="manage.py")
    except exceptions.QueuetyError as error:
        raise Error(str(error)) from None
    if options["json"]:
        write(json.dumps(report.to_dict(), indent=4, ensure_ascii=False, default=str))
    else:
        _print(report, write, table)
    failed = report.counts[run_migration.FAILED]
    if failed:
        raise Error(f"{failed} run(s) could not be moved; each is listed with the reason. "
                    "The others were " + ("left as they are (dry run)." if report.dry_run
                                          else "moved as listed."))
    return True


def _print(report: run_migration.MigrationReport, write: Callable[[str], None],
           table: Callable[[list[str], list[list[str]]], None]) -> None:
    verb = "would move" if report.dry_run else "moved"
    counts = report.counts
    write(f"{'Dry run: ' if report.dry_run else ''}{report.workflow} -> "
          f"{report.to_hash[:12]} (definition {report.to_definition}): "
          f"{counts['moved'] + counts['moved_in_place']} {verb} now, "
          f"{counts['at_boundary']} at their next boundary, {counts['skipped']} skipped, "
          f"{counts['failed']} failed.")
    if report.runs:
        table(["Run", "Status", "Step", "Outcome", "To", "Reason"],
              [[str(run.run_id), run.status or "-", run.step or "-", run.outcome,
                run.to_step or "-", run.reason] for run in report.runs])
