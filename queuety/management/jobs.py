"""``manage.py queuety job list|inspect|retry|retry-buried|cancel|bury|purge``: seeing and
steering the jobs of Django's tasks framework from the shell (mirrors ``wp queuety list``,
``inspect``, ``retry``, ``retry-buried``, ``bury`` and ``purge``); thin over
``queuety.jobs.operations``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from queuety import exceptions
from queuety.jobs import operations as jobs
from queuety.management import acting
from queuety.management.starting import Error

Write = Callable[[str], None]
Table = Callable[[list[str], list[list[str]]], None]


def _job_id(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a job id (a whole number, the "
                                         "job's run id).") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a job id (ids start at 1).")
    return number


def _count(value: str, least: int, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        raise argparse.ArgumentTypeError(f"{what} must be a whole number of at least {least} "
                                         f"(got {value!r}).")
    return number


def _days(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number < 100_000:
        raise argparse.ArgumentTypeError(f"--older-than is a number of days, 0 or more (such "
                                         f"as --older-than 7); got {value!r}.")
    return number


def _as_user(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--as-user", default=None, metavar="USERNAME",
        help="Act for this user: only the jobs QUEUETY['RUN_SCOPE'] gives them, each decided "
             "by QUEUETY['RUN_ACCESS'] (default: full access).")


def add_job_group(groups: Any) -> None:
    """Add the ``job`` group and its subcommands to the command's groups."""
    group = groups.add_parser("job", help="Jobs: the tasks of Django's tasks framework "
                                          "(docs/guide/tasks.md).")
    actions = group.add_subparsers(dest="action", required=True,
                                   metavar="{list,inspect,retry,retry-buried,cancel,bury,purge}")
    listing = actions.add_parser("list", help="List jobs, newest first.")
    listing.add_argument("--task", default=None, help="Only jobs of this task (its module "
                                                      "path, such as shop.tasks.send_receipt).")
    listing.add_argument("--queue", dest="queue_name", default=None,
                         help="Only jobs with this queue_name.")
    listing.add_argument("--status", default=None,
                         help="READY, RUNNING, SUCCESSFUL, FAILED or buried.")
    listing.add_argument("--limit", type=lambda v: _count(v, 1, "--limit"), default=50)
    listing.add_argument("--offset", type=lambda v: _count(v, 0, "--offset"), default=0)
    listing.add_argument("--format", choices=["table", "json"], default="table")
    inspect = actions.add_parser("inspect", help="Show one job: its result, attempts, "
                                                 "workers, errors and timeline.")
    inspect.add_argument("job_id", type=_job_id)
    inspect.add_argument("--format", choices=["text", "json"], default="text")
    for action, what in (("retry", "Run a buried job again."),
                         ("cancel", "Cancel an unfinished job."),
                         ("bury", "Stop an unfinished job and keep it as buried.")):
        _as_user(actions.add_parser(action, help=what))
        actions.choices[action].add_argument("job_id", type=_job_id)
    buried = actions.add_parser("retry-buried", help="Run every buried job again.")
    buried.add_argument("--task", default=None, help="Only jobs of this task.")
    buried.add_argument("--format", choices=["text", "json"], default="text")
    purge = actions.add_parser("purge", help="Delete finished jobs (default: successful "
                                             "ones), with their timelines.")
    purge.add_argument("--status", default="SUCCESSFUL",
                       help="SUCCESSFUL (default), FAILED (buried and cancelled), buried, or "
                            "all (every finished job).")
    purge.add_argument("--older-than", type=_days, default=None, metavar="DAYS",
                       help="Only jobs that finished more than DAYS days ago.")
    purge.add_argument("--task", default=None, help="Only jobs of this task.")
    for parser in (listing, inspect, buried, purge):
        _as_user(parser)


def job_action(options: dict[str, Any], write: Write, table: Table) -> None:
    """Run the ``job`` subcommand ``options["action"]``, writing its output with ``write``."""
    user = acting.acting_user(options)
    actor = acting.actor(user)
    action = options["action"]
    try:
        _ACTIONS[action](options, user, actor, write, table)
    except exceptions.QueuetyError as error:
        raise Error(str(error)) from None


def _list(options: dict[str, Any], user: Any, actor: str, write: Write, table: Table) -> None:
    found = jobs.list_jobs(task=options["task"], queue_name=options["queue_name"],
                           status=options["status"], limit=options["limit"],
                           offset=options["offset"], user=user)
    if options["format"] == "json":
        write(_json(found))
        return
    if not found:
        write("No jobs found.")
        return
    table(["ID", "Task", "Queue", "Status", "Attempts", "Enqueued_at", "Finished_at"], [
        [str(job["id"]), str(job["task"]), str(job["queue_name"]), _status(job),
         str(job["attempts"]), _when(job["enqueued_at"]), _when(job["finished_at"])]
        for job in found])


def _inspect(options: dict[str, Any], user: Any, actor: str, write: Write,
             table: Table) -> None:
    job = jobs.inspect(options["job_id"], user=user)
    if options["format"] == "json":
        write(_json(job))
        return
    for label, value in (
            ("Job", f"#{job['id']}"), ("Task", job["task"]), ("Backend", job["backend"]),
            ("Queue", job["queue_name"]), ("Priority", job["priority"]),
            ("Status", _status(job)), ("Attempts", job["attempts"]),
            ("Workers", ", ".join(job["worker_ids"]) or "-"),
            ("Enqueued", _when(job["enqueued_at"])), ("Started", _when(job["started_at"])),
            ("Last try", _when(job["last_attempted_at"])),
            ("Finished", _when(job["finished_at"])),
            ("Args", json.dumps(job["args"], ensure_ascii=False)),
            ("Kwargs", json.dumps(job["kwargs"], ensure_ascii=False))):
        write(f"{label + ':':<10}{value}")
    if "return_value" in job:
        write(f"{'Returned:':<10}{json.dumps(job['return_value'], ensure_ascii=False)}")
    if job["run_error"]:
        write(f"{'Error:':<10}{job['run_error'].get('type')}: {job['run_error'].get('message')}")
    if job.get("unreadable"):
        write(f"{'Note:':<10}{job['unreadable']}")
    for number, error in enumerate(job["errors"], start=1):
        last = (error["traceback"].strip().splitlines() or [""])[-1]
        write(f"Attempt error {number}: {error['exception_class_path']}: {last}")
    write("Timeline:")
    table(["ID", "Event", "Attempt", "Duration_ms", "By/Error", "Created_at"], [
        [str(e["id"]), e["kind"], str(e["attempt"] or "-"),
         "-" if e["duration_ms"] is None else f"{e['duration_ms']:g}",
         _event_note(e["data"] or {}), str(e["created_at"])] for e in job["timeline"]])


def _event_note(data: dict[str, Any]) -> str:
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("message", "-"))[:60]
    return str(data.get("by") or data.get("worker") or "-")[:60]


def _retry(options: dict[str, Any], user: Any, actor: str, write: Write, table: Table) -> None:
    jobs.retry(options["job_id"], actor=actor, user=user)
    write(f"Success: Job #{options['job_id']} scheduled for retry.")


def _retry_buried(options: dict[str, Any], user: Any, actor: str, write: Write,
                  table: Table) -> None:
    report = jobs.retry_buried(task=options["task"], actor=actor, user=user)
    if options["format"] == "json":
        write(_json(report.to_dict()))
        return
    for job_id, why in report.failed:
        write(f"Warning: Job #{job_id} was not retried: {why}")
    write(f"Success: {len(report.retried)} buried job(s) scheduled for retry.")


def _cancel(options: dict[str, Any], user: Any, actor: str, write: Write, table: Table) -> None:
    jobs.cancel(options["job_id"], actor=actor, user=user)
    write(f"Success: Job #{options['job_id']} cancelled.")


def _bury(options: dict[str, Any], user: Any, actor: str, write: Write, table: Table) -> None:
    jobs.bury(options["job_id"], actor=actor, user=user)
    write(f"Success: Job #{options['job_id']} buried.")


def _purge(options: dict[str, Any], user: Any, actor: str, write: Write, table: Table) -> None:
    status = None if options["status"].strip().lower() == "all" else options["status"]
    days = options["older_than"]
    count = jobs.purge(status=status, task=options["task"], user=user,
                       older_than=None if days is None else timedelta(days=days))
    write(f"Success: Purged {count} job(s).")


_ACTIONS: dict[str, Callable[[dict[str, Any], Any, str, Write, Table], None]] = {
    "list": _list, "inspect": _inspect, "retry": _retry, "retry-buried": _retry_buried,
    "cancel": _cancel, "bury": _bury, "purge": _purge,
}


def _status(job: dict[str, Any]) -> str:
    if job["buried"]:
        return "FAILED (buried)"
    if job["run_status"] == "cancelled":
        return "FAILED (cancelled)"
    return str(job["status"])


def _when(value: Any) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _json(value: Any) -> str:
    return json.dumps(value, indent=4, ensure_ascii=False, default=str)
