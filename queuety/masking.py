"""Hide the values a site marks secret (``QUEUETY["SECRET_KEYS"]``) wherever people see JSON.

The admin (state, timeline, signals, exports it downloads) and the approval-link page show
runs' data to people; keys named in ``SECRET_KEYS`` (compared case-insensitively, at any depth)
have their values replaced by ``MASK`` there. The stored data and the Python API are unchanged:
steps, ``workflow_status()`` and ``export_workflow()`` still see the real values.
"""

from __future__ import annotations

from typing import Any

from queuety.conf import settings

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
                else _mask(item, secret) for key, item in value.items()}
    if isinstance(value, list):
        return [_mask(item, secret) for item in value]
    return value


def mask_changes(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return a state diff (``{"path", "before", "after"}`` changes, JSON Pointer paths) with
    ``before``/``after`` masked where the path passes through a secret key, and masked inside
    (an object value's own secret keys)."""
    secret = {key.lower() for key in settings.SECRET_KEYS}
    if not secret:
        return changes
    masked = []
    for change in changes:
        tokens = [token.replace("~1", "/").replace("~0", "~").lower()
                  for token in change["path"].split("/")[1:]]
        hidden = any(token in secret for token in tokens)
        masked.append({key: (MASK if hidden else _mask(value, secret))
                       if key in ("before", "after") else value
                       for key, value in change.items()})
    return masked
