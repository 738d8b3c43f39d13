"""``manage.py queuety machine status RUN_ID | list``: a state machine run's current state and
its history, and the machine runs, from the shell (thin over ``queuety.machines``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from queuety import exceptions, machines
from queuety.management import acting
from queuety.management.starting import Error

Write = Callable[[str], None]
Table = Callable[[list[str], list[list[str]]], None]


def _whole(what: str, example: str) -> Callable[[str], int]:
    """An argparse type: a whole number of at least 1, else an error naming ``what``."""
    def parse(value: str) -> int:
        number = int(value) if value.isdigit() else 0
        if number < 1:
            raise argparse.ArgumentTypeError(f"{what} must be a whole number of at least 1, "
                                             f"such as {example} (got {value!r}).")
        return number
    return parse


def add_machine_group(groups: Any) -> None:
    """Add the ``machine`` group and its subcommands to the command's groups."""
    group = groups.add_parser("machine", help="State machine runs "
                                              "(docs/guide/state-machines.md).")
    actions = group.add_subparsers(dest="action", required=True, metavar="{status,list}")
    status = actions.add_parser("status", help="Show a machine run's current state, the "
                                               "events it accepts and its history.")
    status.add_argument("run_id", type=_whole("A run id", "42"))
    status.add_argument("--json", action="store_true", dest="as_json",
                        help="Print the status as JSON.")
    listing = actions.add_parser("list", help="List machine runs, newest first.")
    listing.add_argument("--name", default=None, help="Only runs of this machine.")
    listing.add_argument("--limit", type=_whole("--limit", "--limit 20"), default=50)
    listing.add_argument("--format", choices=["table", "json"], default="table")
    for parser in (status, listing):
        parser.add_argument(
            "--as-user", default=None, metavar="USERNAME",
            help="Act for this user: only the runs QUEUETY['RUN_SCOPE'] gives them "
                 "(default: full access).")


def machine_action(options: dict[str, Any], write: Write, table: Table) -> None:
    """Run ``machine status`` or ``machine list``.

    Raises:
        Error: the run does not exist (or is outside ``--as-user``'s scope), or is not a
            state machine's.
    """
    user = acting.acting_user(options)
    if options["action"] == "status":
        run_id = options["run_id"]
        acting.check_run(user, run_id)
        try:
            status = machines.machine_status(run_id)
        except exceptions.RunNotFound:
            raise Error(f"Workflow #{run_id} not found.") from None
        except exceptions.NotAMachine as error:
            raise Error(str(error)) from None
        if options["as_json"]:
            write(json.dumps(status.to_dict(), indent=4, ensure_ascii=False, default=str))
            return
        _write_status(status, write, table)
        return
    found = machines.machine_runs(acting.reachable(user), name=options["name"],
                                  limit=options["limit"])
    if options["format"] == "json":
        write(json.dumps([s.to_dict() for s in found], indent=4, ensure_ascii=False))
        return
    table(["ID", "MACHINE", "STATE", "STATUS", "TRANSITIONS", "UPDATED"],
          [[str(s.run_id), s.machine, s.state, s.status, str(s.transitions),
            s.updated_at.isoformat(timespec="seconds")] for s in found])


def _write_status(status: machines.MachineStatus, write: Write, table: Table) -> None:
    write(f"Machine:  {status.machine} (run #{status.run_id}, definition "
          f"{status.definition_hash[:12]}"
          + (f", {status.definition_version}" if status.definition_version else "") + ")")
    write(f"State:    {status.state}" + (" (final)" if status.final else ""))
    write(f"Status:   {status.status}")
    write(f"Accepts:  {', '.join(status.events) or '-'}")
    shown = len(status.history)
    write(f"Transitions: {status.transitions}" + (
        f" (the last {shown} below)" if shown < status.transitions else ""))
    write("")
    if not status.history:
        write("No transitions yet.")
        return
    table(["AT", "FROM", "TO", "EVENT"],
          [[h["at"], h["from"], h["to"], h["event"]] for h in status.history])
