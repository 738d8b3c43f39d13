"""Retention rules: how long finished runs are kept, per workflow and terminal status.

Pure: ``QUEUETY["RETENTION"]`` is read into :class:`RetentionRules` here (the settings layer
calls :func:`compile_rules` and turns a :class:`ValueError` into ``ImproperlyConfigured``);
``queuety.retention`` turns the rules into queries.

The setting's shape::

    {"default": "30d",                                   # every workflow not listed
     "order_fulfilment": {"completed": "7d", "failed": "90d"},   # per terminal status
     "nightly_report": "2d"}                             # all its terminal statuses

A duration is ``"<n>d"``, ``"<n>h"`` or ``"<n>m"`` (days, hours, minutes; ``n`` a whole
number), a :class:`datetime.timedelta`, or ``None`` (keep forever). A status missing from a
workflow's dict takes the default's value for that status; no default keeps forever.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from queuety.core.status import FINISHED

#: The terminal statuses a rule may name.
TERMINAL: tuple[str, ...] = tuple(str(status) for status in FINISHED)
#: The accepted written forms, for error messages.
FORMS = '"30d" (days), "12h" (hours), "90m" (minutes), a datetime.timedelta, or None'

_DURATION = re.compile(r"^\s*(\d+)\s*([dhm])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}

Keep = timedelta | None
"""How long a run is kept after it finished; None: forever."""


def parse_duration(value: Any, where: str) -> Keep:
    """``value`` as a duration; raise ValueError naming ``where`` and the accepted forms."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise ValueError(f"{where} must be a positive duration (got {value!r}).")
        return value
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"{where} must be a positive duration: {FORMS} (got {value!r}).")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _per_status(value: Any, where: str) -> dict[str, Keep]:
    """A workflow's (or the default's) value: one duration for every terminal status, or a
    dict of some of them."""
    if isinstance(value, Mapping):
        unknown = [status for status in value if status not in TERMINAL]
        if unknown:
            raise ValueError(
                f"{where} names {unknown[0]!r}, which is not a terminal status; a rule may "
                f"name {', '.join(TERMINAL)}.")
        return {status: parse_duration(keep, f"{where}[{status!r}]")
                for status, keep in value.items()}
    keep = parse_duration(value, where)
    return dict.fromkeys(TERMINAL, keep)


@dataclass(frozen=True)
class RetentionRules:
    """The compiled rules: the default per status and each listed workflow's own values."""

    default: dict[str, Keep] = field(default_factory=dict)
    workflows: dict[str, dict[str, Keep]] = field(default_factory=dict)

    def keep(self, workflow: str, status: str) -> Keep:
        """How long a ``workflow`` run finished with ``status`` is kept (None: forever)."""
        own = self.workflows.get(workflow, {})
        return own[status] if status in own else self.default.get(status)

    @property
    def empty(self) -> bool:
        """True when no run is ever purged."""
        return all(keep is None for keep in self.default.values()) and all(
            keep is None for own in self.workflows.values() for keep in own.values())

    def clauses(self) -> list[Clause]:
        """The rules as disjoint filters: each listed workflow's explicit statuses, then the
        default per status for every workflow that does not set that status itself."""
        found = [Clause(status, keep, workflow=name)
                 for name, own in sorted(self.workflows.items())
                 for status, keep in own.items() if keep is not None]
        for status, keep in self.default.items():
            if keep is not None:
                found.append(Clause(status, keep, excluded=tuple(sorted(
                    name for name, own in self.workflows.items() if status in own))))
        return found


@dataclass(frozen=True)
class Clause:
    """Runs of one terminal status kept ``keep``: of ``workflow``, or (None) of every
    workflow but ``excluded``."""

    status: str
    keep: timedelta
    workflow: str | None = None
    excluded: tuple[str, ...] = ()


def compile_rules(retention: Any, retention_days: Any = None) -> RetentionRules:
    """Read ``QUEUETY["RETENTION"]`` (with the older ``RETENTION_DAYS`` as its default);
    raise ValueError naming the faulty key.

    ``RETENTION_DAYS`` is the default when ``RETENTION`` gives none; both giving one is an
    error (which would win is not obvious).
    """
    if retention is None:
        retention = {}
    if not isinstance(retention, Mapping):
        raise ValueError(
            "QUEUETY['RETENTION'] must be a dict such as {'default': '30d', 'order_fulfilment': "
            f"{{'completed': '7d', 'failed': '90d'}}}} (got {retention!r}).")
    if retention_days is not None:
        if "default" in retention:
            raise ValueError(
                "QUEUETY['RETENTION_DAYS'] and QUEUETY['RETENTION']['default'] are both set; "
                "keep one (RETENTION_DAYS = n is RETENTION = {'default': 'nd'}).")
        if isinstance(retention_days, bool) or not isinstance(retention_days, int | float) \
                or retention_days <= 0:
            raise ValueError("QUEUETY['RETENTION_DAYS'] must be None or a positive number of "
                             f"days (got {retention_days!r}).")
        retention = {**retention, "default": timedelta(days=retention_days)}
    default: dict[str, Keep] = {}
    workflows: dict[str, dict[str, Keep]] = {}
    for name, value in retention.items():
        if not isinstance(name, str) or not name:
            raise ValueError("QUEUETY['RETENTION'] keys must be workflow names or 'default' "
                             f"(got {name!r}).")
        where = f"QUEUETY['RETENTION'][{name!r}]"
        if name == "default":
            default = _per_status(value, where)
        else:
            workflows[name] = _per_status(value, where)
    return RetentionRules(default, workflows)
