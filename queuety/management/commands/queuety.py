"""``manage.py queuety ...``: operate workflow runs from the shell (mirrors ``wp queuety``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from django.core.management.base import BaseCommand

from queuety import definition_diff, exceptions, inbox, metrics, operations, outputs, queries
from queuety import export as exports  # "export" and "timeline" name sub-parsers below
from queuety import timeline as timelines
from queuety.core import artifacts as artifact_rules
from queuety.core import tags as tag_rules
from queuety.core.describe import format_status, tags_text
from queuety.management import (
    acting,
    deploying,
    editing,
    eventlog,
    migrating,
    quarantine,
    retaining,
    starting,
)
from queuety.management import bulk as bulk_commands
from queuety.management import jobs as job_commands
from queuety.management import machines as machine_commands
from queuety.management import queues as queue_commands
from queuety.management.starting import Error
from queuety.runtime import sweeper

_P = ParamSpec("_P")
_R = TypeVar("_R")


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


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1, else a clear error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of minutes, at "
                                         "least 1 (such as --minutes 15).")
    return value


def _json(value: Any) -> str:
    return json.dumps(value, indent=4, ensure_ascii=False, default=str)


def _portable(item: dict[str, Any]) -> dict[str, Any]:
    """An artifact as JSON output carries it: ``bytes`` content as base64 text."""
    if "content" in item and item["kind"] == "bytes":
        return {**item, "content": artifact_rules.portable("bytes", item["content"])}
    return item


class Command(BaseCommand):
    help = "Inspect and operate Queuety workflow runs."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        groups = parser.add_subparsers(dest="group", required=True,
                                       metavar="{workflow,job,schedule,status,sweep,"
                                               "metrics,deploy-check,log,purge,archive,queue}")
        workflow = groups.add_parser("workflow", help="Workflow runs.")
        actions = workflow.add_subparsers(dest="action", required=True,
                                          metavar="{dispatch,definitions,diff,status,list,retry,"
                                                  "pause,resume,cancel,approve,reject,input,"
                                                  "signal,timeline,state-at,rewind,fork,"
                                                  "edit-state,"
                                                  "export,replay,artifacts,artifact,"
                                                  "delete-artifact,chunks,migrate,diff,bulk,"
                                                  "bulk-status,bulk-cancel}")
        starting.add_workflow_actions(actions)
        migrating.add_migrate_action(actions)
        bulk_commands.add_bulk_actions(actions)
        diff = actions.add_parser("diff", help="Show what changed between two stored "
                                               "definitions (steps, options, handlers).")
        for side, which in (("a", "The older definition"), ("b", "The newer definition")):
            diff.add_argument(side, help=f"{which}: its id, its hash or at least 8 characters "
                                         "of it.")
        diff.add_argument("--json", action="store_true", dest="as_json",
                          help="Print the diff as JSON.")

        status = actions.add_parser("status", help="Show one run.")
        status.add_argument("run_id", type=_run_id)
        status.add_argument("--format", choices=["text", "json"], default="text")

        listing = actions.add_parser("list", help="List runs, newest first.")
        listing.add_argument("--status", default=None)
        listing.add_argument("--limit", type=_limit, default=50)
        listing.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                             help="Only runs carrying this tag (customer=42); repeat it for "
                                  "several, all of which must match.")
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
                             ("pause", "Pause a running or waiting run (or, with "
                                       "--definition, every one of a definition)."),
                             ("resume", "Resume a paused run (or, with --definition, "
                                        "every paused run of a definition)."),
                             ("cancel", "Cancel a run (compensations run afterwards)."),
                             ("fork", "Start a new run from this run's current state.")):
            op = actions.add_parser(action, help=what)
            if action in ("pause", "resume"):
                # Or a whole definition's runs: the run id is then left out.
                op.add_argument("run_id", type=_run_id, nargs="?")
                quarantine.add_definition_options(op, action)
            else:
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
        listed = actions.add_parser("artifacts", help="List a run's artifacts.")
        listed.add_argument("run_id", type=_run_id)
        listed.add_argument("--format", choices=["table", "json"], default="table")
        listed.add_argument("--with-content", action="store_true",
                            help="Add each artifact's content (bytes as base64).")
        one = actions.add_parser("artifact", help="Show one artifact with its content.")
        one.add_argument("run_id", type=_run_id)
        one.add_argument("key")
        one.add_argument("--output", default=None,
                         help="Write the content alone to this file (as stored).")
        gone = actions.add_parser("delete-artifact", help="Delete one artifact of a run.")
        gone.add_argument("run_id", type=_run_id)
        gone.add_argument("key")
        streamed = actions.add_parser("chunks", help="Show the chunks a streaming step "
                                                    "stored so far.")
        streamed.add_argument("run_id", type=_run_id)
        streamed.add_argument("step", help="Step index or name.")
        streamed.add_argument("--after", type=int, default=-1,
                              help="Only chunks whose index is greater.")
        streamed.add_argument("--format", choices=["text", "json"], default="text",
                              help="text: the chunks joined (strings as they are); json: "
                                   "each chunk with its index and attempt.")

        editing.add_edit_actions(actions)
        acting.add_as_user(actions)
        starting.add_schedule_group(groups)

        overview = groups.add_parser("status", help="Runs per status, the oldest due "
                                                    "pending step's age, and each concurrency "
                                                    "group's load.")
        overview.add_argument("--format", choices=["text", "json"], default="text")

        groups.add_parser("sweep", help="Run the sweeper once (recover lost steps, re-publish "
                                        "due ones) and print what it did.")

        stats = groups.add_parser("metrics", help="Per workflow step: attempts completed and "
                                                  "failed, average and p95 duration, error rate.")
        stats.add_argument("--minutes", type=_positive, default=60,
                           help="The window, in minutes back from now (default 60).")
        stats.add_argument("--format", choices=["table", "json"], default="table")

        deploying.add_deploy_check(groups)
        job_commands.add_job_group(groups)
        machine_commands.add_machine_group(groups)
        eventlog.add_log_group(groups)
        queue_commands.add_queue_group(groups)
        retaining.add_retention_groups(groups)

    #: The groups whose action takes the options and a writer, each over its service.
    _WRITERS: dict[str, Callable[[dict[str, Any], Callable[[str], None]], None]] = {
        "deploy-check": deploying.deploy_check, "purge": retaining.purge_action,
        "archive": retaining.archive_action}

    def handle(self, *args: Any, **options: Any) -> None:
        if options["group"] == "sweep":
            self.stdout.write(_json(sweeper.sweep()))
            return
        if options["group"] == "status":
            self._overview(**options)
            return
        groups: dict[str, Callable[[], Any]] = {
            "metrics": lambda: self._metrics(options["minutes"], options["format"]),
            "log": lambda: eventlog.log_action(options, self.stdout.write, self.stdout.flush),
            "job": lambda: job_commands.job_action(options, self.stdout.write, self._table),
            "machine": lambda: machine_commands.machine_action(options, self.stdout.write,
                                                               self._table),
            "queue": lambda: queue_commands.queue_action(options, self.stdout.write, self._table),
        }
        if options["group"] in self._WRITERS:
            self._WRITERS[options["group"]](options, self.stdout.write)
            return
        if options["group"] in groups:
            groups[options["group"]]()
            return
        if options["group"] == "schedule":
            starting.schedule_action(options["action"], options, self.stdout.write, self._table)
            return
        if starting.workflow_action(options["action"], options, self.stdout.write, self._table):
            return
        options["acting_user"] = user = acting.acting_user(options)
        acting.check_run(user, options.get("run_id"))
        if migrating.migrate_action(options["action"], options, self.stdout.write, self._table) \
                or bulk_commands.bulk_action(options["action"], options, self.stdout.write):
            return
        if (quarantine.definition_action(options["action"], options, self.stdout.write)
                or editing.edit_action(options["action"], options, self.stdout.write)):
            return
        if options["action"] in self._LIFECYCLE:
            self._lifecycle(options["action"], options["run_id"])
            return
        getattr(self, f"_{options['action'].replace('-', '_')}")(**options)

    def _metrics(self, minutes: int, format: str) -> None:
        stats = metrics.handler_stats(minutes)
        if format == "json":
            self.stdout.write(_json(metrics.stats_as_json(stats)))
            return
        if not stats:
            self.stdout.write(f"No step attempts finished in the last {minutes} minutes.")
            return
        header = ["Workflow", "Step", "Completed", "Failed", "Avg_ms", "P95_ms", "Error_rate"]
        rows = [[row.workflow, row.step, str(row.completed), str(row.failed),
                 "-" if row.avg_ms is None else f"{row.avg_ms:g}",
                 "-" if row.p95_ms is None else f"{row.p95_ms:g}",
                 f"{row.error_rate:.1%}"] for row in stats]
        self._table(header, rows)

    def _overview(self, format: str, **options: Any) -> None:
        data = {**queries.overview(), "groups": queries.resource_groups(),
                "queues": queries.queue_budgets()}
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
        if data["queues"]:
            self.stdout.write("")
            self._table(["QUEUE", "RUNNING", "COST/BUDGET", "WAITING"], [
                [q["queue"], str(q["running"]),
                 f"{q['running_cost']}/{'-' if q['budget'] is None else q['budget']}",
                 str(q["waiting"])] for q in data["queues"]])

    #: Lifecycle subcommands: the operation and the original's success line.
    _LIFECYCLE: dict[str, tuple[Callable[..., Any], str]] = {
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

    def _diff(self, a: str, b: str, as_json: bool, **options: Any) -> None:
        found = self._call(definition_diff.diff_definitions, a, b)
        self.stdout.write(_json(found.to_dict()) if as_json else found.to_text())

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

    def _artifacts(self, run_id: int, format: str, with_content: bool, **options: Any) -> None:
        found = [_portable(item) for item in self._call(
            outputs.artifacts, run_id, with_content=with_content)]
        if format == "json":
            self.stdout.write(_json(found))
            return
        if not found:
            self.stdout.write(f"No artifacts found for workflow #{run_id}.")
            return
        header = ["Key", "Kind", "Size", "Step", "UpdatedAt"] + (
            ["Content"] if with_content else [])
        rows = [[item["key"], item["kind"], str(item["size"]), item["step_name"] or "-",
                 item["updated_at"].isoformat()] + (
            [json.dumps(item["content"], ensure_ascii=False)[:80]] if with_content else [])
            for item in found]
        self._table(header, rows)

    def _artifact(self, run_id: int, key: str, output: str | None, **options: Any) -> None:
        try:
            item = outputs.artifact(run_id, key)
        except exceptions.ArtifactNotFound:
            raise Error(f"Artifact '{key}' not found for workflow #{run_id}.") from None
        except exceptions.RunNotFound:
            raise Error(f"Workflow #{run_id} not found.") from None
        if output is None:
            self.stdout.write(_json(_portable(item)))
            return
        kind, data = outputs.artifact_bytes(run_id, key)
        try:
            with open(output, "wb") as handle:
                handle.write(data)
        except OSError as error:
            raise Error(f"Unable to write artifact '{key}' to {output}: {error}.") from None
        self.stdout.write(f"Success: Artifact '{key}' of workflow #{run_id} ({len(data)} "
                          f"bytes) written to {output}.")

    def _delete_artifact(self, run_id: int, key: str, **options: Any) -> None:
        try:
            outputs.delete_artifact(run_id, key)
        except exceptions.ArtifactNotFound:
            raise Error(f"Artifact '{key}' not found for workflow #{run_id}.") from None
        except exceptions.RunNotFound:
            raise Error(f"Workflow #{run_id} not found.") from None
        self.stdout.write(f"Success: Artifact '{key}' of workflow #{run_id} deleted.")

    def _chunks(self, run_id: int, step: str, after: int, format: str, **options: Any) -> None:
        page = self._call(outputs.chunks, run_id, step, after=after)
        if format == "json":
            self.stdout.write(_json(page.to_dict()))
            return
        self.stdout.write("".join(c["content"] if isinstance(c["content"], str)
                                  else json.dumps(c["content"]) for c in page.chunks))

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
    def _call(function: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
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

    def _list(self, status: str | None, limit: int, format: str, acting_user: Any = None,
              tag: list[str] | None = None, **options: Any) -> None:
        try:
            runs = queries.list_workflows(status=status, limit=limit,
                                          among=acting.reachable(acting_user),
                                          tags=tag_rules.parse_filters(tag or [], "="))
        except ValueError as error:
            raise Error(str(error)) from None
        if format == "json":
            self.stdout.write(_json([run.to_dict() for run in runs]))
            return
        if not runs:
            self.stdout.write("No workflows found.")
            return
        # The original's columns; a Tags column only when a listed run has tags.
        tagged = any(run.tags for run in runs)
        header = ["ID", "Name", "Version", "Hash", "Status", "Step", "StepName",
                  *(["Tags"] if tagged else [])]
        rows = [[str(run.id), run.name, run.definition_version or "-",
                 run.definition_hash[:12], run.status,
                 f"{run.current_step}/{run.total_steps}", run.current_step_name or "-",
                 *([tags_text(run.tags)] if tagged else [])]
                for run in runs]
        self._table(header, rows)
