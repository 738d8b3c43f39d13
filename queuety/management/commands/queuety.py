"""``manage.py queuety ...``: operate workflow runs from the shell (mirrors ``wp queuety``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from queuety import exceptions, services
from queuety.core.status import WorkflowStatus


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


def _json(value: Any) -> str:
    return json.dumps(value, indent=4, ensure_ascii=False, default=str)


class Command(BaseCommand):
    help = "Inspect and operate Queuety workflow runs."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        groups = parser.add_subparsers(dest="group", required=True, metavar="{workflow,sweep}")
        workflow = groups.add_parser("workflow", help="Workflow runs.")
        actions = workflow.add_subparsers(dest="action", required=True,
                                          metavar="{status,list}")

        status = actions.add_parser("status", help="Show one run.")
        status.add_argument("run_id", type=_run_id)
        status.add_argument("--format", choices=["text", "json"], default="text")

        listing = actions.add_parser("list", help="List runs, newest first.")
        listing.add_argument("--status", default=None)
        listing.add_argument("--limit", type=_limit, default=50)
        listing.add_argument("--format", choices=["table", "json"], default="table")

        groups.add_parser("sweep", help="Run the sweeper once (recover lost steps, re-publish "
                                        "due ones) and print what it did.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["group"] == "sweep":
            self.stdout.write(_json(services.sweep()))
            return
        getattr(self, f"_{options['action']}")(**options)

    def _status(self, run_id: int, format: str, **options: Any) -> None:
        try:
            status = services.workflow_status(run_id)
        except exceptions.RunNotFound:
            raise Error(f"Workflow #{run_id} not found.") from None
        if format == "json":
            self.stdout.write(_json(status.to_dict()))
            return
        self.stdout.write("\n".join(format_status(status)))

    def _list(self, status: str | None, limit: int, format: str, **options: Any) -> None:
        try:
            runs = services.list_workflows(status=status, limit=limit)
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
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def format_status(status: WorkflowStatus) -> list[str]:
    """Return the lines of ``workflow status`` text output (labels as in ``wp queuety``)."""
    lines = [
        f"Workflow: {status.name} (#{status.id})",
        f"Status:   {status.status}",
        f"Step:     {status.current_step}/{status.total_steps}",
    ]
    if status.current_step_name is not None:
        lines.append(f"StepName: {status.current_step_name}")
    if status.definition_version is not None:
        lines.append(f"Version:  {status.definition_version}")
    lines.append(f"Hash:     {status.definition_hash}")
    if status.idempotency_key is not None:
        lines.append(f"Key:      {status.idempotency_key}")
    if status.budget is not None:
        lines.append(f"Budget:   {json.dumps(status.budget, separators=(',', ':'))}")
    if status.retry_policy is not None and status.status not in ("completed", "cancelled"):
        lines.append(f"Retry:    {status.retry_policy}")
    if status.error:
        error = status.error
        where = f" (step {error.get('step')!r}, attempt {error.get('attempt')}" \
                f"/{error.get('max_attempts')})" if error.get("step") else ""
        lines.append(f"Error:    {error.get('type')}: {error.get('message')}{where}")
    if status.state:
        lines.append("State:")
        lines.append(_json(status.state))
    return lines
