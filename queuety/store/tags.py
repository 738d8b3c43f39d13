"""The tag filters in SQL: runs (or, through ``run__``, their events) carrying every one of
some tags, as the runs' GIN index ``queuety_run_tags`` serves them."""

from __future__ import annotations

from collections.abc import Mapping

from django.db import connection
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact

from queuety import exceptions
from queuety.core import tags as tag_rules


def tagged(tags: Mapping[str, str], through: str = "") -> Q:
    """A filter for runs carrying every one of ``tags`` (``through="run__"``: for rows that
    point at a run, such as events); no condition at all for no tags.

    On PostgreSQL one containment test, ``tags @> '{"customer": "42"}'``, which the GIN index
    answers for all the pairs at once.

    Raises:
        ValueError: a key or value is not a valid tag (``queuety.core.tags``), named.
    """
    try:
        wanted = tag_rules.check_tags(tags, "the tag filter")
    except exceptions.InvalidPayload as error:
        raise ValueError(str(error).replace("; nothing was written.", ".")) from None
    if not wanted:
        return Q()
    if connection.vendor == "postgresql":
        return Q(**{f"{through}tags__contains": wanted})
    # SQLite has no JSON containment: each pair as an equality on its key (no index; a demo).
    return Q(*(Exact(KeyTextTransform(key, f"{through}tags"), value)
               for key, value in wanted.items()))
