"""Hide the values a site marks secret (``QUEUETY["SECRET_KEYS"]``) wherever people see JSON.

The admin (state, timeline, signals, exports it downloads) and the approval-link page show
runs' data to people; keys named in ``SECRET_KEYS`` (compared case-insensitively, at any depth)
have their values replaced by ``MASK`` there. The stored data and the Python API are unchanged:
steps, ``workflow_status()`` and ``export_workflow()`` still see the real values.
"""

from __future__ import annotations

from typing import Any

from queuety.conf import settings
from queuety.core.state_patch import pointer_token
from queuety.exceptions import InvalidStateEdit

MASK = "********"


def mask(value: Any) -> Any:
    """Return a copy of ``value`` with the values of secret keys replaced by ``MASK``."""
    secret = {key.lower() for key in settings.SECRET_KEYS}
    if not secret:
        return value
    return _mask(value, secret)


def _mask(value: Any, secret: set[str]) -> Any:
    if isinstance(value, dict):
        return {key: MASK if isinstance(key, str) and key.lower() in secret
                else _changes(item, secret) if key == "changes" and _is_diff(item)
                else _mask(item, secret) for key, item in value.items()}
    if isinstance(value, list):
        return [_mask(item, secret) for item in value]
    return value


def mask_changes(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return a state diff (``{"path", "before", "after"}`` changes, JSON Pointer paths) with
    ``before``/``after`` masked where the path passes through a secret key, and masked inside
    (an object value's own secret keys). :func:`mask` does this to a ``"changes"`` diff it
    meets (a ``state_edited`` event's), which keys alone would not hide."""
    secret = {key.lower() for key in settings.SECRET_KEYS}
    if not secret:
        return changes
    return _changes(changes, secret)


def unmask(shown: Any, edited: Any, real: Any, path: str = "") -> Any:
    """Return ``edited`` (a masked value ``shown`` as edited by a person) with the real value
    put back wherever it still holds ``MASK`` where ``shown`` did, in objects and in lists
    (item by item, so a list that holds masked values must keep its length: the items of
    a shorter or longer list cannot be matched to the real values).

    Raises:
        InvalidStateEdit: a list holding masked values changed length.
    """
    if isinstance(edited, str) and edited == MASK and shown == MASK:
        return real
    if isinstance(edited, dict) and isinstance(shown, dict) and isinstance(real, dict):
        return {key: unmask(shown.get(key), item, real.get(key), f"{path}/{pointer_token(key)}")
                if key in real else item for key, item in edited.items()}
    if isinstance(edited, list) and isinstance(shown, list) and isinstance(real, list):
        if len(edited) != len(shown) and _holds_mask(shown):
            raise InvalidStateEdit(
                f"The list at {path or '/'} holds masked secret values and now has "
                f"{len(edited)} items instead of {len(shown)}, so they cannot be matched to "
                "their real values; nothing was changed. Change its items in place, or set "
                "the whole list (with its real values) through the REST API or the CLI.")
        return [unmask(shown[i], item, real[i], f"{path}/{i}") if i < len(shown) else item
                for i, item in enumerate(edited)]
    return edited


def _holds_mask(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_mask(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_mask(item) for item in value)
    return isinstance(value, str) and value == MASK


def _is_diff(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(change, dict) and isinstance(change.get("path"), str) for change in value)


def _changes(changes: list[dict[str, Any]], secret: set[str]) -> list[dict[str, Any]]:
    masked = []
    for change in changes:
        tokens = [token.replace("~1", "/").replace("~0", "~").lower()
                  for token in change["path"].split("/")[1:]]
        hidden = any(token in secret for token in tokens)
        masked.append({key: (MASK if hidden else _mask(value, secret))
                       if key in ("before", "after") else value
                       for key, value in change.items()})
    return masked
