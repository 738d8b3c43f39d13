"""``workflow edit-state`` and ``workflow retry --from-step``: editing a run by hand."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from queuety import exceptions, operations, state_edits
from queuety.management import acting
from queuety.management.starting import Error


def add_edit_actions(actions: Any) -> None:
    """Add ``edit-state``, and ``--from-step`` to ``retry``, to the ``workflow`` group's
    sub-parsers (``retry`` must exist already)."""
    edit = actions.add_parser(
        "edit-state", help="Edit a paused or failed run's state with a JSON merge patch.")
    edit.add_argument("run_id", type=int)
    source = edit.add_mutually_exclusive_group(required=True)
    source.add_argument("--patch", default=None,
                        help='A JSON merge patch (RFC 7396): {"key": value} sets a key, objects '
                             'merge, {"key": null} deletes it.')
    source.add_argument("--patch-file", default=None,
                        help="A file holding the JSON merge patch ('-' for stdin).")
    edit.add_argument("--reason", required=True, help="Why (recorded in the timeline).")
    edit.add_argument("--format", choices=["text", "json"], default="text")
    actions.choices["retry"].add_argument(
        "--from-step", default=None, metavar="STEP",
        help="Run this step (name or index, at or before the failed step) and every later "
             "one again, from the state it last started from.")


def edit_action(action: str, options: dict[str, Any], write: Callable[[str], None]) -> bool:
    """Run ``edit-state``, or ``retry`` with ``--from-step``; False for any other action.

    With ``--as-user`` (``options["acting_user"]``) the user needs
    ``queuety.change_workflowrun`` (an edit is a change) and the timeline names them."""
    user = options.get("acting_user")
    if action == "edit-state":
        acting.check_change(user, options["run_id"])
        _edit_state(options, acting.actor(user), write)
        return True
    if action == "retry" and options.get("from_step") is not None:
        acting.check_change(user, options["run_id"])
        step = options["from_step"]
        where = int(step) if step.isdigit() else step
        _call(operations.retry, options["run_id"], actor=acting.actor(user), from_step=where)
        write(f"Success: Workflow #{options['run_id']} scheduled for retry from step {step}.")
        return True
    return False


def _edit_state(options: dict[str, Any], actor: str, write: Callable[[str], None]) -> None:
    run_id = options["run_id"]
    patch = _read_patch(options["patch"], options["patch_file"])
    edit = _call(state_edits.edit_state, run_id, patch, reason=options["reason"], actor=actor)
    shown = edit.to_dict()
    if options["format"] == "json":
        write(json.dumps(shown, indent=4, ensure_ascii=False))
        return
    write(f"Success: Workflow #{run_id}'s state edited ({len(shown['changes'])} change(s)):")
    for change in shown["changes"]:
        before = json.dumps(change["before"]) if "before" in change else "(absent)"
        after = json.dumps(change["after"]) if "after" in change else "(removed)"
        write(f"  {change['path']}: {before} -> {after}")


def _read_patch(text: str | None, path: str | None) -> Any:
    option = "--patch"
    if path is not None:
        option = "--patch-file"
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
        except OSError as error:
            raise Error(f"Cannot read the patch file {path!r}: {error.strerror}.") from None
    try:
        return json.loads(text or "")
    except ValueError as error:
        raise Error(f"{option} is not valid JSON: {error}. Give a JSON object such as "
                    '\'{"key": "value"}\'.') from None


def _call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return function(*args, **kwargs)
    except exceptions.RunNotFound as error:
        raise Error(f"Workflow #{error.run_id} not found.") from None
    except exceptions.QueuetyError as error:
        raise Error(str(error)) from None
