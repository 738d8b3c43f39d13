"""Queuety's settings: one ``QUEUETY = {...}`` dict in the Django settings, with defaults.

Read through :data:`settings` (``from queuety.conf import settings``); values are looked up on
first use and re-read when tests change ``QUEUETY`` with ``override_settings``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from queuety.core import agent_limits, imports
from queuety.core import retention as retention_rules
from queuety.core.retry import NO_RETRY, RetryPolicy

DEFAULTS: dict[str, Any] = {
    # Celery queue for step messages; None uses Celery's default queue (task_default_queue).
    "QUEUE": None,
    # Whole seconds between sweeper runs: every worker's main process offers to sweep this
    # often and one at a time sweeps (also the interval of the optional beat entry, set on
    # migrate).
    "SWEEP_INTERVAL": 5,
    # Bulk operations (queuety.bulk()): runs read per chunk (each run then acted on in its own
    # short transaction), and seconds a processing worker's lease lasts without a renewal (it
    # renews with every run): an operation whose worker died is taken over this long after.
    "BULK_CHUNK_SIZE": 500,
    "BULK_LEASE": 30.0,
    # Seconds a sweep holds the sweeper's lease without renewing it (it renews before each
    # of its phases): a sweeper that dies mid-sweep is taken over this long after its last
    # renewal. Longer than any one phase takes (or a slow phase's sweep is overlapped by the
    # next, which is safe but not one at a time); well under WORKER_LOST_AFTER in production,
    # so that a dead sweeper delays the recovery of other lost workers by little.
    "SWEEP_LEASE": 20.0,
    # A processing step whose heartbeat is older than this is treated as lost and re-run.
    "STALE_AFTER": 60.0,
    # How often a running step's heartbeat is refreshed (well under STALE_AFTER), and how
    # often each worker's main process says it is alive.
    "HEARTBEAT_INTERVAL": 10.0,
    # Largest progress a step may report with context.heartbeat(progress={...}), in bytes of
    # compact JSON, and the least time between two progress writes of one worker process
    # (reports in between are coalesced: the latest is written).
    "MAX_PROGRESS_BYTES": 4096,
    "PROGRESS_INTERVAL": 0.5,
    # A worker whose main process has not said it is alive for this long is lost: the sweeper
    # retries the attempts its processes held (once their heartbeats are this old too) and
    # re-publishes the messages it may have reserved (a back-off, a short delay). More than
    # two heartbeats, so a worker busy for a moment is not taken for a lost one.
    "WORKER_LOST_AFTER": 25.0,
    # A due pending step whose message has not been consumed after this long is re-published.
    "REDELIVER_AFTER": 60.0,
    # Back-offs up to this many seconds ride on the broker (countdown); longer ones wait in the
    # database and are published by the sweeper, so hours-long waits never sit in a broker.
    "MAX_ETA": 60.0,
    # Policy for steps whose step and workflow set none (a RetryPolicy or its keyword dict).
    "DEFAULT_RETRY": NO_RETRY,
    # Steps one task may run in a row in its worker process, its first included: when a task
    # step is followed by an untimed task step, the transition hands that step to the same
    # process (no broker message, no separate claim). 1 turns this off.
    "INLINE_STEPS": 10,
    # ... and no inline step starts once the task has run this many seconds, so one long run
    # cannot keep a worker process from the other runs waiting in the queue.
    "INLINE_SECONDS": 1.0,
    # Seconds past a step's timeout before its worker process is killed (hard limit).
    "HARD_TIMEOUT_GRACE": 1.0,
    # The I/O lane (a worker with --pool threads): sync step bodies still running past their
    # deadline (recorded as StepTimeout; Python cannot stop a thread) a lane worker tolerates
    # before it restarts itself, which ends them.
    "LANE_MAX_ABANDONED": 10,
    # ... and how long a body may block the lane's event loop before it is reported.
    "LANE_BLOCKED_AFTER": 0.5,
    # ... and the most PostgreSQL connections one lane worker may open: without Django's
    # connection pool a lane worker with more threads refuses to start; with it, one whose
    # pool's max_size is larger does (docs/deploy/io-lane.md, "Connections").
    "LANE_MAX_CONNECTIONS": 20,
    # Largest signal, approval or input payload accepted, in bytes of compact UTF-8 JSON.
    "MAX_SIGNAL_BYTES": 65536,
    # Largest body an inbound webhook (queuety.inbound, POST hooks/<name>/) accepts, in bytes;
    # a larger one is answered 413 and not stored.
    "INBOUND_MAX_BYTES": 1024 * 1024,
    # Largest artifact content accepted, in bytes (JSON kinds: of compact UTF-8 JSON).
    "MAX_ARTIFACT_BYTES": 10 * 1024 * 1024,
    # Largest chunk a streaming step may yield, in bytes of compact UTF-8 JSON.
    "MAX_CHUNK_BYTES": 65536,
    # Chunks of a streaming step are stored in batches, at most this many seconds after they
    # were yielded (one transaction per batch); 0 stores each before the generator resumes.
    "CHUNK_FLUSH_INTERVAL": 0.05,
    # Chunks a streaming step may have waiting to be stored before its generator waits.
    "CHUNK_BUFFER": 1000,
    # Seconds between two reads of new chunks by the Server-Sent Events endpoint.
    "STREAM_POLL_INTERVAL": 0.2,
    # Seconds one Server-Sent Events response stays open before it ends (the browser's
    # EventSource then reconnects with Last-Event-ID and misses nothing).
    "STREAM_MAX_SECONDS": 300.0,
    # DRF permission classes of the API (dotted paths).
    "API_PERMISSION_CLASSES": ["queuety.api.permissions.RunPermission"],
    # Optional ``f(user, run) -> bool`` (a callable or its dotted path): object-level access
    # to one run through the API (e.g. runs scoped by owner). None: every run, given the
    # model permissions. Runs outside RUN_SCOPE never reach it.
    "RUN_ACCESS": None,
    # Optional ``f(user, queryset) -> queryset`` of runs (a callable or its dotted path): the
    # runs a user may reach at all, applied in SQL by every list, count, bulk action and
    # lookup of the API, the admin and the CLI's --as-user (queuety.scope). A run outside it
    # is "not found". None: every run.
    "RUN_SCOPE": None,
    # How long finished runs are kept, per workflow and terminal status, before the sweeper
    # archives and purges them (docs/guide/operating-runs.md, "Retention"), such as
    # {"default": "30d", "order_fulfilment": {"completed": "7d", "failed": "90d"}}.
    # None (or no "default"): runs of workflows not listed are kept forever.
    "RETENTION": None,
    # The older form: RETENTION's default in days (both giving a default is an error).
    "RETENTION_DAYS": None,
    # An alias of Django's STORAGES that purged runs are archived into (JSON Lines of export
    # documents, one object per workflow, day and batch); None purges without an archive.
    "ARCHIVE_STORAGE": None,
    # Module prefixes whose code a replayed document may name when this site has never stored
    # its definition (see queuety.export.replay); the default trusts only known definitions.
    "REPLAY_MODULES": [],
    # Seconds an approval link stays valid.
    "APPROVAL_LINK_MAX_AGE": 7 * 24 * 3600,
    # The site's address, such as "https://shop.example.com": approval_link() then returns an
    # absolute URL (for an e-mail sent from a Celery task, which has no request to build one
    # from). None: it returns the page's path.
    "BASE_URL": None,
    # Keys (case-insensitive, at any depth) whose values the admin and the approval-link page
    # show as "********": in states, timelines, signal payloads and admin exports.
    "SECRET_KEYS": [],
    # Webhook endpoints may be on loopback, private, link-local or otherwise non-public
    # addresses (refused by default, at creation and again after DNS resolution at delivery:
    # a site's secrets must not be POSTed into its own network by whoever can add an endpoint).
    "WEBHOOK_ALLOW_PRIVATE": False,
    # Seconds a webhook endpoint has to answer a delivery (connect and read).
    "WEBHOOK_TIMEOUT": 10.0,
    # Pauses before each further attempt of a webhook delivery that failed (no 2xx answer);
    # after the last one the delivery is failed (the admin can redeliver it).
    "WEBHOOK_RETRY_DELAYS": [10, 60, 300, 1800, 7200, 21600],
    # A token that lets a scraper read the metrics endpoint with "Authorization: Bearer
    # <token>"; None: only a signed-in user with the view permission on runs can.
    "METRICS_TOKEN": None,
    # Count steps and sweeps in the worker with prometheus-client (queuety-django[metrics]).
    "METRICS": False,
    # Trace runs and step attempts with OpenTelemetry (needs queuety-django[otel] and a
    # tracer provider configured by the site).
    "TRACING": False,
    # Resource control (docs/guide/resources.md). Group name (or pattern such as "tenant:*")
    # -> attempts in flight at once, across every run, workflow and worker; overrides a
    # step's concurrency_limit.
    "CONCURRENCY_LIMITS": {},
    # Group name or pattern -> (starts, seconds): at most that many starts in any such period.
    "RATE_LIMITS": {},
    # Celery queue -> cost units (the steps' cost_units) in flight at once on that queue.
    "QUEUE_COST_BUDGETS": {},
    # Group name or pattern -> cost units in flight at once in that group.
    "GROUP_COST_BUDGETS": {},
    # Durable agents (queuety.contrib.pydantic_ai, docs/guide/durable-agents.md): a model as
    # Pydantic AI names it ("openai:gpt-4o"), or a pattern ("openai:*", "*"), -> its requests'
    # limits: {"concurrency": requests in flight at once, "rate_limit": "60/m"}, shared by every
    # run, workflow and worker in the group "agent:<model>".
    "AGENT_LIMITS": {},
    # Worker admission: before a step starts, a worker process with less headroom than this
    # defers it (no attempt used). Keys: MAX_RSS_MB (the process's resident memory ceiling),
    # MIN_AVAILABLE_MB (memory left to the container's cgroup, else the machine),
    # DEFER_SECONDS (when the step is offered again; default 5). Empty: no check.
    "ADMISSION": {},
    # Celery message priority of each priority word; None picks by the broker: Redis (0 is
    # served first) {"high": 0, "normal": 3, "low": 6}, else (RabbitMQ: higher first)
    # {"high": 9, "normal": 5, "low": 0}. Only steps that set a priority carry one.
    "MESSAGE_PRIORITIES": None,
    # Stored handler paths a deploy renamed or moved, old dotted path -> new dotted path: the
    # workers import the new one for definitions that name the old (their hash unchanged).
    "HANDLER_ALIASES": {},
}

_ADMISSION_KEYS = ("MAX_RSS_MB", "MIN_AVAILABLE_MB", "DEFER_SECONDS")


def _check_resources(values: dict[str, Any]) -> None:
    """Refuse malformed resource-control tables, naming the key and what to give."""
    for key in ("CONCURRENCY_LIMITS", "QUEUE_COST_BUDGETS", "GROUP_COST_BUDGETS"):
        table = values[key]
        if not isinstance(table, dict) or not all(
                isinstance(name, str) and name and isinstance(limit, int)
                and not isinstance(limit, bool) and limit >= 1 for name, limit in table.items()):
            raise ImproperlyConfigured(
                f"QUEUETY[{key!r}] must be a dict of names to whole numbers of at least 1, "
                f"such as {{'openai': 8}} (got {table!r}).")
    rates = values["RATE_LIMITS"]
    if not isinstance(rates, dict) or not all(
            isinstance(name, str) and name and isinstance(rate, list | tuple) and len(rate) == 2
            and isinstance(rate[0], int) and not isinstance(rate[0], bool) and rate[0] >= 1
            and isinstance(rate[1], int | float) and not isinstance(rate[1], bool)
            and rate[1] > 0 for name, rate in rates.items()):
        raise ImproperlyConfigured(
            "QUEUETY['RATE_LIMITS'] must be a dict of group names to (starts, seconds) pairs, "
            f"such as {{'openai': (500, 60)}} (got {rates!r}).")
    try:
        values["AGENT_LIMITS"] = agent_limits.check_table(values["AGENT_LIMITS"])
    except ValueError as error:
        raise ImproperlyConfigured(f"QUEUETY['AGENT_LIMITS'] is wrong: {error}.") from None
    admission = values["ADMISSION"]
    if not isinstance(admission, dict) or any(key not in _ADMISSION_KEYS for key in admission) \
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                       for v in admission.values()):
        raise ImproperlyConfigured(
            "QUEUETY['ADMISSION'] must be a dict whose keys are among "
            f"{', '.join(_ADMISSION_KEYS)} and whose values are positive numbers "
            f"(got {admission!r}).")
    priorities = values["MESSAGE_PRIORITIES"]
    if priorities is not None and (not isinstance(priorities, dict) or sorted(priorities) != [
            "high", "low", "normal"] or not all(isinstance(v, int) and 0 <= v <= 255
                                                for v in priorities.values())):
        raise ImproperlyConfigured(
            "QUEUETY['MESSAGE_PRIORITIES'] must be None or a dict giving 'high', 'normal' and "
            f"'low' each a Celery priority from 0 to 255 (got {priorities!r}).")


def _check_retention(values: dict[str, Any]) -> None:
    """Refuse malformed retention rules and an archive storage Django does not define."""
    try:
        retention_rules.compile_rules(values["RETENTION"], values["RETENTION_DAYS"])
    except ValueError as error:
        raise ImproperlyConfigured(str(error)) from None
    alias = values["ARCHIVE_STORAGE"]
    if alias is None:
        return
    storages = getattr(django_settings, "STORAGES", {}) or {}
    if not isinstance(alias, str) or alias not in storages:
        raise ImproperlyConfigured(
            f"QUEUETY['ARCHIVE_STORAGE'] is {alias!r}, which is not an alias of the STORAGES "
            f"setting (it defines {', '.join(map(repr, storages)) or 'none'}); add "
            f"STORAGES[{alias!r}] (such as django-storages' S3 backend), or set None to purge "
            "without an archive.")


def retention() -> retention_rules.RetentionRules:
    """The retention rules in force (``RETENTION``, with ``RETENTION_DAYS`` as its default)."""
    return retention_rules.compile_rules(settings.RETENTION, settings.RETENTION_DAYS)


def _whole(least: int) -> Callable[[Any], bool]:
    """A whole number (not a bool) of at least ``least``."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least


def _positive(value: Any) -> bool:
    return bool(value > 0)


_POSITIVE = "a positive number."
_WHOLE_1 = "a whole number, at least 1."

#: The settings checked one by one: each key, what a valid value is, and the rest of the
#: sentence that says so (``{value!r}`` is the value given). Checked in this order.
_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("SWEEP_INTERVAL", lambda v: isinstance(v, int) and v >= 1,
     "a whole number of seconds, at least 1."),
    ("INLINE_STEPS", lambda v: isinstance(v, int) and v >= 1,
     "a whole number, at least 1 (1 runs every step from its own message)."),
    ("LANE_MAX_ABANDONED", _whole(0),
     "a whole number, at least 0 (0 restarts the lane worker at the first stuck sync body)."),
    ("LANE_MAX_CONNECTIONS", _whole(1),
     "a whole number, at least 1 (the most PostgreSQL connections one lane worker opens)."),
    *((key, _positive, _POSITIVE) for key in (
        "STALE_AFTER", "HEARTBEAT_INTERVAL", "REDELIVER_AFTER", "INLINE_SECONDS",
        "WORKER_LOST_AFTER", "MAX_PROGRESS_BYTES", "PROGRESS_INTERVAL", "STREAM_POLL_INTERVAL",
        "STREAM_MAX_SECONDS", "LANE_BLOCKED_AFTER", "SWEEP_LEASE", "BULK_LEASE")),
    ("WEBHOOK_RETRY_DELAYS", lambda v: not isinstance(v, str | bytes) and all(
        isinstance(d, int | float) and d >= 0 for d in v),
     "a list of non-negative numbers of seconds, such as [10, 60, 300]."),
    ("WEBHOOK_TIMEOUT", _positive, _POSITIVE),
    ("WEBHOOK_ALLOW_PRIVATE", lambda v: isinstance(v, bool), "True or False."),
    ("METRICS_TOKEN", lambda v: v is None or (isinstance(v, str) and len(v) >= 16),
     "None or a string of at least 16 characters (a scraper sends it as a Bearer token)."),
    ("CHUNK_FLUSH_INTERVAL", lambda v: not isinstance(v, bool) and isinstance(v, int | float)
     and 0 <= v <= 5, "a number of seconds from 0 (store each chunk at once) to 5."),
    *((key, _whole(1), _WHOLE_1) for key in ("MAX_ARTIFACT_BYTES", "MAX_CHUNK_BYTES",
                                             "CHUNK_BUFFER", "INBOUND_MAX_BYTES",
                                             "BULK_CHUNK_SIZE")),
    ("SECRET_KEYS", lambda v: not isinstance(v, str) and all(isinstance(k, str) for k in v),
     "a list of key names (strings), such as ['password', 'api_key']."),
    ("BASE_URL", lambda v: v is None or _is_site_address(v),
     "None or the site's scheme and host, such as 'https://shop.example.com' (not {value!r}); "
     "a site served under a path sets FORCE_SCRIPT_NAME for it."),
)


class QueuetySettings:
    """Attribute access to ``QUEUETY`` with defaults, validation and reload."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        user = getattr(django_settings, "QUEUETY", {}) or {}
        unknown = [key for key in user if key not in DEFAULTS]
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, DEFAULTS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ImproperlyConfigured(f"Unknown QUEUETY setting {key!r}.{hint}")
        values = {**DEFAULTS, **user}
        retry = values["DEFAULT_RETRY"]
        if isinstance(retry, dict):
            values["DEFAULT_RETRY"] = RetryPolicy(**retry)
        elif not isinstance(retry, RetryPolicy):
            raise ImproperlyConfigured(
                "QUEUETY['DEFAULT_RETRY'] must be a queuety.RetryPolicy or a dict of its options."
            )
        for key, valid, message in _RULES:
            if not valid(values[key]):
                raise ImproperlyConfigured(f"QUEUETY[{key!r}] must be "
                                           + message.format(value=values[key]))
        _check_resources(values)
        _check_retention(values)
        for key, shape in _HOOKS.items():
            values[key] = _hook(key, values[key], shape)
        aliases = imports.alias_problem(values["HANDLER_ALIASES"])
        if aliases is not None:
            raise ImproperlyConfigured(
                f"QUEUETY['HANDLER_ALIASES'] must map old dotted handler paths to new ones: "
                f"{aliases}")
        if values["HEARTBEAT_INTERVAL"] >= values["STALE_AFTER"]:
            raise ImproperlyConfigured(
                "QUEUETY['HEARTBEAT_INTERVAL'] must be shorter than QUEUETY['STALE_AFTER'], "
                "or live steps would be taken for lost ones."
            )
        if values["WORKER_LOST_AFTER"] < 2 * values["HEARTBEAT_INTERVAL"]:
            raise ImproperlyConfigured(
                "QUEUETY['WORKER_LOST_AFTER'] must be at least twice QUEUETY["
                "'HEARTBEAT_INTERVAL'], or a worker that missed one beat would be taken for a "
                "lost one.")
        return values

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._cache is None:
            self._cache = self._load()
        try:
            return self._cache[name]
        except KeyError:
            raise AttributeError(f"Unknown QUEUETY setting {name!r}.") from None

    def validate(self) -> None:
        """Read ``QUEUETY`` afresh; raise ImproperlyConfigured naming the first bad key.

        The system check ``queuety.E003`` calls it, so ``manage.py check`` reports what would
        otherwise fail only when a value is first used.
        """
        self._cache = self._load()

    def reload(self) -> None:
        """Forget cached values (called when ``QUEUETY`` changes)."""
        self._cache = None


#: The settings that name a site's function, and the shape the error message shows.
_HOOKS = {"RUN_ACCESS": "f(user, run) -> bool", "RUN_SCOPE": "f(user, queryset) -> queryset"}


def _hook(key: str, value: Any, shape: str) -> Callable[..., Any] | None:
    """A hook setting's function: ``None``, a callable, or the callable a dotted path names
    (imported here, so a bad path fails at start, through the system check, not at the
    first request)."""
    if value is None or callable(value):
        hook: Callable[..., Any] | None = value
        return hook
    if isinstance(value, str):
        try:
            found = import_string(value)
        except ImportError as error:
            raise ImproperlyConfigured(
                f"QUEUETY[{key!r}] names {value!r}, which cannot be imported ({error}); give "
                f"the dotted path of a function {shape}, or the function itself.") from None
        if callable(found):
            return found  # type: ignore[no-any-return]
    raise ImproperlyConfigured(
        f"QUEUETY[{key!r}] must be None, a function {shape}, or its dotted path "
        f"(got {value!r}).")


def _is_site_address(value: object) -> bool:
    """An http(s) URL with a host and nothing after it (the script prefix of a site served
    under a path comes from Django's ``FORCE_SCRIPT_NAME``, as ``reverse()`` adds it)."""
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.path in (
        "", "/") and not (parts.query or parts.fragment)


settings = QueuetySettings()


def handler_aliases() -> dict[str, str]:
    """``QUEUETY["HANDLER_ALIASES"]``: the source of the settings' aliases that the app
    installs into ``queuety.core.imports`` (which imports no Django)."""
    table: dict[str, str] = settings.HANDLER_ALIASES
    return table


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "QUEUETY":
        settings.reload()
        imports.forget_aliases()


setting_changed.connect(_reload)
