"""A connection of its own, outside Django's pool, for a thread that must never wait on it.

With ``OPTIONS["pool"]`` every thread of a process shares the pool's few connections: a lane
worker's step threads can hold them all (say, while one imports a slow handler module and
the others wait on its import lock). The heartbeat thread and the worker registry's beat
then wait too, and the sweeper takes a live worker for lost. :func:`use_own_connection`
makes the calling thread's default connection a direct one (Django's connections are per
thread), so those beats go out whatever the steps hold: one more server connection per
thread that calls it.
"""

from __future__ import annotations

import copy

from django.db import DEFAULT_DB_ALIAS, connections

#: The threads of a worker process that use one (with the pool): the step heartbeat's and the
#: worker registry's beat.
OWN_CONNECTIONS = 2


def use_own_connection() -> None:
    """From now on, the calling thread's default database connection is its own, unpooled;
    a no-op without a pool (every thread has its own connection then)."""
    current = connections[DEFAULT_DB_ALIAS]
    if not current.settings_dict.get("OPTIONS", {}).get("pool"):
        return
    settings_dict = copy.deepcopy(current.settings_dict)
    settings_dict["OPTIONS"].pop("pool")
    connections[DEFAULT_DB_ALIAS] = type(current)(settings_dict, DEFAULT_DB_ALIAS)
