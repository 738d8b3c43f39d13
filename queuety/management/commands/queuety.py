"""``manage.py queuety ...``: operate workflow runs from the shell (mirrors ``wp queuety``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from queuety import exceptions, inbox, operations, queries
from queuety import export as exports  # "export" and "timeline" name sub-parsers below
from queuety import timeline as timelines
from queuety.core.describe import format_status
from queuety.runtime import sweeper


class Error(CommandError):
    """Printed by Django as ``Error: <message>`` on stderr, with exit code 1."""


def _run_id(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a run id (a whole number).") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a run id (ids start at 1).")
    return number


def _limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"--limit must be a whole number of at least 1 "
                                         f"(got {value!r}).")
    return number


def _json_option(text: str | None, object_only: bool = False) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise Error(f"--data is not valid JSON: {error}.") from None
    if object_only and not isinstance(value, dict):
        raise Error("--data must be a JSON object.")
    return value


def _json(value: Any) -> str:
    return json.dumps(value, indent=4, ensure_ascii=False, default=str)


class Command(BaseCommand):
    help = "Inspect and operate Queuety workflow runs."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        groups = parser.add_subparsers(dest="group", required=True,
                                       metavar="{workflow,status,sweep}")
        workflow = groups.add_parser("workflow", help="Workflow runs.")
        actions = workflow.add_subparsers(dest="action", required=True,
                                          metavar="{status,list,retry,pause,resume,cancel,"
                                                  "approve,reject,input,signal,timeline,"
                                                  "state-at,rewind,fork,export,replay}")

        status = actions.add_parser("status", help="Show one run.")
        status.add_argument("run_id", type=_run_id)
        status.add_argument("--format", choices=["text", "json"], default="text")

        listing = actions.add_parser("list", help="List runs, newest first.")
        listing.add_argument("--status", default=None)
        listing.add_argument("--limit", type=_limit, default=50)
        listing.add_argument("--format", choices=["table", "json"], default="table")

        for action, what in (("approve", "Approve the run's current approval or decision wait."),
                             ("reject", "Reject the run's current decision wait."),
                             ("input", "Answer the run's current input wait.")):
            reply = actions.add_parser(action, help=what)
            reply.add_argument("run_id", type=_run_id)
            reply.add_argument("--data", default=None, help="JSON data of the reply.")
            reply.add_argument("--signal", default=None, help="Signal name, if not the "
                                                              "wait's default.")
        signal = actions.add_parser("signal", help="Send a signal to a run.")
        signal.add_argument("run_id", type=_run_id)
        signal.add_argument("name")
        signal.add_argument("--data", default=None, help="JSON data of the signal.")

        for action, what in (("retry", "Run a failed run again from its failed step."),
                             ("pause", "Pause a running or waiting run."),
                             ("resume", "Resume a paused run."),
                             ("cancel", "Cancel a run (compensations run afterwards)."),
                             ("fork", "Start a new run from this run's current state.")):
            op = actions.add_parser(action, help=what)
            op.add_argument("run_id", type=_run_id)
        timeline = actions.add_parser("timeline", help="Show a run's events.")
        timeline.add_argument("run_id", type=_run_id)
        timeline.add_argument("--limit", type=_limit, default=100)
        timeline.add_argument("--offset", type=int, default=0)
        timeline.add_argument("--format", choices=["table", "json"], default="table")
        for action, what in (("state-at", "Show the state right after a step completed."),
                             ("rewind", "Go back to the state right after a step.")):
            op = actions.add_parser(action, help=what)
            op.add_argument("run_id", type=_run_id)
            op.add_argument("step", help="Step index or name.")
            if action == "state-at":
                op.add_argument("--format", choices=["text", "json"], default="text")
        export = actions.add_parser("export", help="Export a run as JSON.")
        export.add_argument("run_id", type=_run_id)
        export.add_argument("--output", default=None, help="File to write (default stdout).")
        replay = actions.add_parser("replay", help="Start a run from an export file.")
        replay.add_argument("file")

        overview = groups.add_parser("status", help="Runs per status, the oldest due "
                                                    "pending step's age, and each concurrency "
                                                    "group's load.")
        overview.add_argument("--format", choices=["text", "json"], default="text")

        groups.add_parser("sweep", help="Run the sweeper once (recover lost steps, re-publish "
                                        "due ones) and print what it did.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["group"] == "sweep":
            self.stdout.write(_json(sweeper.sweep()))
            return
        if options["group"] == "status":
            self._overview(**options)
            return
        if options["action"] in self._LIFECYCLE:
            self._lifecycle(options["action"], options["run_id"])
            return
        getattr(self, f"_{options['action'].replace('-', '_')}")(**options)

    def _overview(self, format: str, **options: Any) -> None:
        data = {**queries.overview(), "groups": queries.resource_groups()}
        if format == "json":
            self.stdout.write(_json(data))
            return
        for status, count in data["runs"].items():
            self.stdout.write(f"{status + ':':<23}{count}")
        age = data["oldest_pending_step_age_seconds"]
        self.stdout.write(f"{'Oldest pending step:':<23}" + ("-" if age is None else f"{age}s"))
        if data["groups"]:
            self.stdout.write("")
            self._table(["GROUP", "IN FLIGHT", "LIMIT", "WAITING", "STARTS/RATE", "COST"], [
                [g["group"], str(g["in_flight"] + g["woken"]),
                 "-" if g["limit"] is None else str(g["limit"]), str(g["waiting"]),
                 "-" if g["rate_limit"] is None
                 else f"{g['recent_starts']}/{g['rate_limit'][0]} per {g['rate_limit'][1]:g}s",
                 str(g["running_cost"]) + ("" if g["cost_budget"] is None
                                           else f"/{g['cost_budget']}")]
                for g in data["groups"]])

    #: Lifecycle subcommands: the operation and the original's success line.
    _LIFECYCLE = {
        "retry": (operations.retry, "Success: Workflow #{id} scheduled for retry."),
        "pause": (operations.pause, "Success: Workflow #{id} paused."),
        "resume": (operations.resume, "Success: Workflow #{id} resumed."),
        "cancel": (operations.cancel, "Success: Workflow #{id} cancelled."),
        "fork": (operations.fork, "Success: Workflow #{id} forked. New workflow ID: {new}."),
    }

    def _lifecycle(self, action: str, run_id: int) -> None:
        operation, said = self._LIFECYCLE[action]
        new = self._call(operation, run_id, actor="manage.py")
        self.stdout.write(said.format(id=run_id, new=new))

    def _timeline(self, run_id: int, limit: int, offset: int, format: str,
                  **options: Any) -> None:
        events = self._call(timelines.timeline, run_id, limit, offset)
        if format == "json":
            self.stdout.write(_json(events))
            return
        if not events:
            self.stdout.write(f"No events found for workflow #{run_id}.")
            return
        header = ["ID", "Step", "Event", "Attempt", "Duration_ms", "Error", "Created_at"]
        rows = [[str(e["id"]), e["step_name"] or "-", e["kind"], str(e["attempt"] or "-"),
                 "-" if e["duration_ms"] is None else f"{e['duration_ms']:g}",
                 ((e["data"] or {}).get("error") or {}).get("message", "-")[:60],
                 e["created_at"]] for e in events]
        self._table(header, rows)

    def _state_at(self, run_id: int, step: str, format: str = "text", **options: Any) -> None:
        where = int(step) if step.isdigit() else step
        try:
            state = self._call(timelines.state_at, run_id, where)
        except LookupError:
            raise Error(f"No recorded state found for workflow #{run_id} at step "
                        f"{step}.") from None
        if format == "json":
            self.stdout.write(_json(state))
            return
        self.stdout.write(f"State at step {step} for workflow #{run_id}:")
        self.stdout.write(_json(state))

    def _rewind(self, run_id: int, step: str, **options: Any) -> None:
        where = int(step) if step.isdigit() else step
        try:
            self._call(operations.rewind, run_id, where, actor="manage.py")
        except LookupError:
            raise Error(f"No recorded state found for workflow #{run_id} at step "
                        f"{step}.") from None
        self.stdout.write(f"Success: Workflow #{run_id} rewound to step {step}.")

    def _export(self, run_id: int, output: str | None, **options: Any) -> None:
        document = self._call(exports.export, run_id)
        text = json.dumps(document, indent=4, ensure_ascii=False)
        if output is None:
            self.stdout.write(text)
            return
        try:
            with open(output, "w") as handle:
                handle.write(text + "\n")
        except OSError as error:
            raise Error(f"Unable to write workflow export to {output}: {error}.") from None
        self.stdout.write(f"Success: Workflow #{run_id} exported to {output}.")

    def _replay(self, file: str, **options: Any) -> None:
        try:
            with open(file) as handle:
                text = handle.read()
        except FileNotFoundError:
            raise Error(f"File not found: {file}") from None
        try:
            document = json.loads(text)
        except ValueError as error:
            raise Error(f"Invalid JSON: {error}") from None
        new = self._call(exports.replay, document)
        self.stdout.write(f"Success: Workflow replayed. New workflow ID: {new}.")

    def _table(self, header: list[str], rows: list[list[str]]) -> None:
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())

    def _approve(self, **options: Any) -> None:
        self._reply("approve", "Approval sent to", **options)

    def _reject(self, **options: Any) -> None:
        self._reply("reject", "Rejection sent to", **options)

    def _input(self, **options: Any) -> None:
        self._reply("input", "Input sent to", **options)

    def _reply(self, kind: str, said: str, run_id: int, data: str | None, signal: str | None,
               **options: Any) -> None:
        value = _json_option(data, object_only=kind != "input")
        if value is None and kind != "input":
            value = {}
        receipt = self._call(inbox.reply, run_id, kind, value, signal=signal,
                             sent_by="manage.py")
        self.stdout.write(f"Success: {said} workflow #{run_id}. Status: {receipt.status}.")

    def _signal(self, run_id: int, name: str, data: str | None, **options: Any) -> None:
        receipt = self._call(inbox.send_signal, run_id, name, _json_option(data),
                             sent_by="manage.py")
        outcome = "completed its wait" if receipt.settled else "stored"
        self.stdout.write(f"Success: Signal '{name}' sent to workflow #{run_id} ({outcome}). "
                          f"Status: {receipt.status}.")

    @staticmethod
    def _call(function, *args: Any, **kwargs: Any):
        try:
            return function(*args, **kwargs)
        except exceptions.RunNotFound as error:
            raise Error(f"Workflow #{error.run_id} not found.") from None
        except exceptions.QueuetyError as error:
            raise Error(str(error)) from None

    def _status(self, run_id: int, format: str, **options: Any) -> None:
        try:
            status = queries.workflow_status(run_id)
        except exceptions.RunNotFound:
            raise Error(f"Workflow #{run_id} not found.") from None
        if format == "json":
            self.stdout.write(_json(status.to_dict()))
            return
        self.stdout.write("\n".join(format_status(status)))

    def _list(self, status: str | None, limit: int, format: str, **options: Any) -> None:
        try:
            runs = queries.list_workflows(status=status, limit=limit)
        except ValueError as error:
            raise Error(str(error)) from None
        if format == "json":
            self.stdout.write(_json([run.to_dict() for run in runs]))
            return
        if not runs:
            self.stdout.write("No workflows found.")
            return
        header = ["ID", "Name", "Version", "Hash", "Status", "Step", "StepName"]
        rows = [[str(run.id), run.name, run.definition_version or "-",
                 run.definition_hash[:12], run.status,
                 f"{run.current_step}/{run.total_steps}", run.current_step_name or "-"]
                for run in runs]
        self._table(header, rows)
