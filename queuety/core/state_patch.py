"""Editing a run's state by hand: JSON merge patches (RFC 7396) and the diff they make.

Pure Python. A patch is a JSON object merged into the state: a key with a value sets it (an
object value merges into an object at that key, recursively), a key with ``null`` deletes it,
any other value replaces what was there. A list is replaced whole. A merge patch cannot set a
value to ``null`` (``null`` always means delete): give the key another value instead.

The diff of an edit is a list of ``{"path", "before", "after"}`` changes, one per leaf that
changed; ``path`` is a JSON Pointer (RFC 6901: ``/order/lines``, ``~0`` for ``~`` and ``~1`` for
``/`` in a key), and ``before`` (or ``after``) is absent when the key did not exist before (or
no longer exists after).
"""

from __future__ import annotations

import json
import math
from typing import Any

from queuety.exceptions import InvalidStateEdit


def check_patch(patch: Any) -> dict[str, Any]:
    """Return ``patch`` if it is a merge patch a run's state can take.

    Raises:
        InvalidStateEdit: it is not a JSON object, a top-level key is reserved (``_``-prefixed
            keys never enter the public state), or a value is not plain JSON.
    """
    if not isinstance(patch, dict):
        raise InvalidStateEdit("A state patch must be a JSON object (a JSON merge patch, RFC 7396: "
                           f'{{"key": value}} sets a key, {{"key": null}} deletes it), not '
                           f"{type(patch).__name__}.")
    reserved = sorted(key for key in patch if not isinstance(key, str) or key.startswith("_"))
    if reserved:
        raise InvalidStateEdit(f"State keys starting with '_' are reserved and never stored; the "
                           f"patch names {', '.join(map(repr, reserved))}.")
    try:
        check_json(patch, "")
    except RecursionError:
        raise InvalidStateEdit("The state patch is nested too deeply to store.") from None
    return patch


def check_json(value: Any, path: str) -> None:
    """Refuse a value JSON cannot hold as it is: non-string keys, NaN, tuples, objects."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidStateEdit(f"The key {key!r} at {path or '/'} is not a string; JSON "
                                   "object keys are strings.")
            check_json(item, f"{path}/{pointer_token(key)}")
    elif isinstance(value, list):
        for position, item in enumerate(value):
            check_json(item, f"{path}/{position}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidStateEdit(f"The value at {path or '/'} is {value}, which JSON cannot hold.")
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        raise InvalidStateEdit(f"The value at {path or '/'} is a {type(value).__name__}, not JSON "
                           "(use objects, lists, strings, numbers, booleans).")


def apply_patch(state: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Return ``state`` with the merge patch ``patch`` applied (neither is changed)."""
    merged = dict(state)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict):
            inner = merged.get(key)
            merged[key] = apply_patch(inner if isinstance(inner, dict) else {}, value)
        else:
            merged[key] = json.loads(json.dumps(value))  # a copy the caller cannot alias
    return merged


def make_patch(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Return the smallest merge patch that turns ``before`` into ``after``.

    A ``null`` inside ``after`` cannot be expressed (it would delete): it is refused.

    Raises:
        InvalidStateEdit: ``after`` holds a ``null`` value where a patch would need to set one.
    """
    patch: dict[str, Any] = {}
    for key in before.keys() - after.keys():
        patch[key] = None
    for key, value in after.items():
        old = before.get(key, _ABSENT)
        if isinstance(value, dict) and isinstance(old, dict):
            inner = make_patch(old, value)
            if inner:
                patch[key] = inner
        elif value is None:
            if old is not None:
                raise InvalidStateEdit(f"The key {key!r} is set to null; a state edit cannot store "
                                   "null (a JSON merge patch reads null as delete). Remove the "
                                   "key, or give it another value.")
        elif not _same(old, value):
            if isinstance(value, dict):  # set whole over a non-object: a patch merges it
                patch[key] = make_patch({}, value)
            else:
                patch[key] = value
    return patch


def diff(before: dict[str, Any], after: dict[str, Any], path: str = ""
         ) -> list[dict[str, Any]]:
    """Return the changes from ``before`` to ``after``: ``{"path", "before", "after"}`` per
    changed leaf, keys in sorted order (``before``/``after`` absent for an added/removed key)."""
    changes: list[dict[str, Any]] = []
    for key in sorted(before.keys() | after.keys()):
        where = f"{path}/{pointer_token(key)}"
        old, new = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if isinstance(old, dict) and isinstance(new, dict):
            changes.extend(diff(old, new, where))
        elif not _same(old, new):
            change: dict[str, Any] = {"path": where}
            if old is not _ABSENT:
                change["before"] = old
            if new is not _ABSENT:
                change["after"] = new
            changes.append(change)
    return changes


def pointer_token(key: str) -> str:
    """``key`` as one JSON Pointer reference token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


_ABSENT: Any = object()


def _same(old: Any, new: Any) -> bool:
    # 1 == True and 1 == 1.0 in Python, not in JSON: compare the types too.
    return type(old) is type(new) and old == new
