"""``manage.py queuety purge [--dry-run]`` and ``manage.py queuety archive import PATH``:
retention by hand. Thin over ``queuety.retention`` and ``queuety.archive``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from queuety import archive, exceptions, retention
from queuety.conf import settings
from queuety.management.starting import Error


def add_retention_groups(groups: Any) -> None:
    """Add the ``purge`` and ``archive`` groups to the command's sub-parsers."""
    purge = groups.add_parser(
        "purge", help="Archive and delete the finished runs past QUEUETY['RETENTION'] "
                      "(in batches), then forget expired dispatch-key tombstones.")
    purge.add_argument("--dry-run", action="store_true",
                       help="Only show, per workflow and status, how many runs would go.")
    purge.add_argument("--batch", type=int, default=retention.BATCH,
                       help=f"Runs per batch and transaction (default {retention.BATCH}).")
    purge.add_argument("--format", choices=["text", "json"], default="text")
    group = groups.add_parser("archive", help="The run archive (QUEUETY['ARCHIVE_STORAGE']).")
    actions = group.add_subparsers(dest="action", required=True, metavar="{import}")
    imported = actions.add_parser(
        "import", help="Bring archived runs back, with their ids and timelines: a local "
                       ".jsonl file, or an object name in the archive storage.")
    imported.add_argument("path", help="A local file, or a name such as "
                                       "queuety/archive/order/2026-01-31/1.jsonl.")


def purge_action(options: dict[str, Any], write: Callable[[str], None]) -> None:
    """Run (or, with ``--dry-run``, plan) a purge pass and print what it did."""
    if options["batch"] < 1:
        raise Error(f"--batch must be at least 1 (got {options['batch']}).")
    dry = options["dry_run"]
    try:
        report = retention.plan() if dry else retention.purge(batch=options["batch"])
    except exceptions.PurgeRunning as error:
        raise Error(str(error)) from None
    if options["format"] == "json":
        write(json.dumps({
            "dry_run": dry, "total": report.total, "tombstones_forgotten": report.forgotten,
            "runs": [{"workflow": w, "status": s, "count": n}
                     for (w, s), n in sorted(report.counts.items())],
            "archived_to": report.objects,
        }, indent=4, ensure_ascii=False))
        return
    verb = "Would archive and delete" if dry else "Archived and deleted"
    if settings.ARCHIVE_STORAGE is None:
        verb = "Would delete (no ARCHIVE_STORAGE: no archive)" if dry else \
            "Deleted (no ARCHIVE_STORAGE: no archive)"
    for (workflow, status), count in sorted(report.counts.items()):
        write(f"{workflow}  {status}: {count}")
    write(f"{verb} {report.total} run{'s' if report.total != 1 else ''}; "
          f"{'would forget' if dry else 'forgot'} {report.forgotten} dispatch-key "
          f"tombstone{'s' if report.forgotten != 1 else ''}.")
    for name in report.objects:
        write(f"  archived to {name}")


def archive_action(options: dict[str, Any], write: Callable[[str], None]) -> None:
    """``archive import``: restore each run of an archive object; an existing run is skipped.

    Raises:
        Error: the object cannot be read or a line is not JSON (the runs before it stay
            imported), or some runs failed (each is listed, the others are imported).
    """
    path = options["path"]
    restored = skipped = failed = 0
    try:
        for number, document in archive.read_archive(path):
            try:
                run_id = archive.restore(document)
            except Exception as error:  # noqa: BLE001 - one bad run must not stop the rest
                failed += 1
                write(f"Failed line {number} (run #{_run_id(document)}): "
                      f"{type(error).__name__}: {error} Nothing of that run was imported.")
                continue
            if run_id is None:
                skipped += 1
                write(f"Skipped run #{document['run']['id']}: a run with that id exists.")
            else:
                restored += 1
                write(f"Restored run #{run_id} ({document['run']['name']}, "
                      f"{document['run']['status']}).")
    except exceptions.ArchiveError as error:
        raise Error(str(error)) from None
    summary = (f"{restored} run{'s' if restored != 1 else ''} restored, {skipped} skipped, "
               f"{failed} failed, from {path}.")
    if failed:
        raise Error(f"{summary} The failed lines are listed above; fix them and import the "
                    "object again (restored runs are skipped).")
    write(f"Success: {summary}")


def _run_id(document: Any) -> Any:
    """The run id a document says it carries, for an error line (``?`` when it has none)."""
    run = document.get("run") if isinstance(document, dict) else None
    return run.get("id", "?") if isinstance(run, dict) else "?"
