"""``QUEUETY["AGENT_LIMITS"]``, the pure part: the limits of an agent's model requests.

Pure Python. The table maps a model, named as Pydantic AI names it (``system:model_name``,
such as ``"openai:gpt-4o"``), or a pattern (``"openai:*"``, ``"*"``), to the requests of that
model in flight at once and a rate limit of request starts::

    QUEUETY["AGENT_LIMITS"] = {
        "openai:gpt-4o": {"concurrency": 3, "rate_limit": "60/m"},
        "*": {"concurrency": 10},
    }

Each model's requests share the concurrency group ``agent:<system>:<model_name>`` across
every run, workflow and worker (``queuety.contrib.pydantic_ai`` holds a slot of it around each
request that really goes to the model). The most specific entry wins, as in the other
resource tables (:func:`queuety.core.resources.lookup`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from queuety.core import resources

#: The prefix of the concurrency group of a model's requests.
GROUP_PREFIX = "agent:"
#: The longest concurrency group name (``GroupLease.group``'s column).
MAX_GROUP_LENGTH = 255

_KEYS = ("concurrency", "rate_limit")
_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([smhd])\s*$")


@dataclass(frozen=True, slots=True)
class AgentLimit:
    """What bounds the requests of one model."""

    group: str
    """The concurrency group of the model's requests (``agent:openai:gpt-4o``)."""
    concurrency: int | None = None
    """Requests in flight at once."""
    rate: tuple[int, float] | None = None
    """At most ``rate[0]`` request starts in any ``rate[1]`` seconds."""

    @property
    def gated(self) -> bool:
        """Whether anything bounds the model's requests (False: no slot is taken at all)."""
        return self.concurrency is not None or self.rate is not None


def parse_rate(value: Any) -> tuple[int, float]:
    """A rate limit: ``"60/m"`` (also ``/s``, ``/h``, ``/d``, or ``"5/10s"``) or a pair
    ``(starts, seconds)``.

    Raises:
        ValueError: anything else; the message says what to give.
    """
    if isinstance(value, str):
        found = _RATE.match(value)
        if found and int(found.group(1)) >= 1:
            multiple = float(found.group(2)) if found.group(2) else 1.0
            if multiple > 0:
                return int(found.group(1)), multiple * _PERIODS[found.group(3)]
    elif isinstance(value, list | tuple) and len(value) == 2:
        starts, period = value
        if isinstance(starts, int) and not isinstance(starts, bool) and starts >= 1 and \
                isinstance(period, int | float) and not isinstance(period, bool) and period > 0:
            return starts, float(period)
    raise ValueError(f"a rate limit is a string such as '60/m' (starts per second, minute, "
                     f"hour or day: /s, /m, /h, /d) or a pair (starts, seconds); got {value!r}")


def check_table(table: Any) -> dict[str, AgentLimit]:
    """Validate the ``AGENT_LIMITS`` table and resolve each entry.

    Raises:
        ValueError: the table, a key or an entry is malformed; the message names which.
    """
    if not isinstance(table, dict):
        raise ValueError(f"it must be a dict of model names (such as 'openai:gpt-4o', or "
                         f"'*' for every model) to limits (got {table!r})")
    resolved: dict[str, AgentLimit] = {}
    for name, entry in table.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"its keys must be model names such as 'openai:gpt-4o' or "
                             f"patterns such as 'openai:*' (got {name!r})")
        if not isinstance(entry, dict) or not entry or any(key not in _KEYS for key in entry):
            raise ValueError(f"the entry of {name!r} must be a dict with 'concurrency' "
                             f"and/or 'rate_limit', such as {{'concurrency': 3, "
                             f"'rate_limit': '60/m'}} (got {entry!r})")
        concurrency = entry.get("concurrency")
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(
                concurrency, int) or concurrency < 1):
            raise ValueError(f"the concurrency of {name!r} must be a whole number of at "
                             f"least 1 (got {concurrency!r})")
        try:
            rate = None if entry.get("rate_limit") is None else parse_rate(entry["rate_limit"])
        except ValueError as error:
            raise ValueError(f"the rate_limit of {name!r} is wrong: {error}") from None
        if len(GROUP_PREFIX + name) > MAX_GROUP_LENGTH:
            raise ValueError(f"the model name {name[:60]!r}... is {len(name)} characters: "
                             f"at most {MAX_GROUP_LENGTH - len(GROUP_PREFIX)} fit a "
                             f"concurrency group's name; use a pattern such as 'openai:*'")
        resolved[name] = AgentLimit(GROUP_PREFIX + name, concurrency, rate)
    return resolved


def limit_for(table: dict[str, AgentLimit], model: str) -> AgentLimit:
    """The limit of the requests of ``model`` (``system:model_name``): its own entry, else the
    most specific pattern that matches it, else none (an ungated limit)."""
    found = resources.lookup(table, model)
    group = GROUP_PREFIX + model
    if found is None:
        return AgentLimit(group)
    if len(group) > MAX_GROUP_LENGTH:
        raise ValueError(
            f"The model {model[:60]!r}... has a name of {len(model)} characters, too long "
            f"for its requests' concurrency group (at most {MAX_GROUP_LENGTH - len(GROUP_PREFIX)}"
            f"), and QUEUETY['AGENT_LIMITS'] limits it: give the model a shorter name.")
    return AgentLimit(group, found.concurrency, found.rate)


def ledger_horizon(rate_periods: list[float], table: dict[str, AgentLimit]) -> float:
    """How far back (seconds) the rate ledger must keep starts: the longest window of the
    steps' rate limits (``rate_periods``) and of the models' (``table``), at least an hour."""
    periods = [*rate_periods, *(limit.rate[1] for limit in table.values() if limit.rate)]
    return max([resources.rate_window(period) for period in periods] + [3600.0])
