"""The run archive: purged runs as JSON Lines of export documents in a Django storage.

``QUEUETY["ARCHIVE_STORAGE"]`` names an alias of Django's ``STORAGES`` (a filesystem, or S3
through django-storages). Each object holds one batch of one workflow's runs that finished
on one day (UTC), one export document (format 2) per line::

    queuety/archive/<workflow>/<YYYY-MM-DD>/<first run id>-<last run id>-<pass>.jsonl

Object stores cannot append, so a day with many runs has several objects. An object is never
overwritten: ``<pass>`` (the write's UTC instant and a random part) makes every name new, so
a batch written again (after a crash between the write and the delete, or a run skipped by
the delete and archived by a later pass) lands beside the first copy. A run may so be in two
objects; :func:`restore` skips a run that exists, so importing both is harmless.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from datetime import date
from typing import Any
from urllib.parse import quote

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from queuety import exceptions
from queuety import export as exports
from queuety.conf import settings
from queuety.core import artifacts as artifact_rules
from queuety.models import DispatchKey, Event, Signal, StepChunk, StepRun, WorkflowRun
from queuety.runtime import artifacts as artifact_rows
from queuety.store.definitions import definition_id

#: Where every archive object lives in the storage.
PREFIX = "queuety/archive"


def archive_storage() -> Storage | None:
    """The storage ``QUEUETY["ARCHIVE_STORAGE"]`` names, or None (purge without archive)."""
    alias = settings.ARCHIVE_STORAGE
    return None if alias is None else storages[alias]


def day_folder(workflow: str, day: date) -> str:
    """The folder of the archive objects of ``workflow`` runs finished on ``day`` (the
    workflow name quoted: a job's ``task:pkg.mod`` stays legible, a ``/`` cannot make a
    folder)."""
    return f"{PREFIX}/{quote(workflow, safe=':.-_@')}/{day.isoformat()}"


def object_name(workflow: str, day: date, first_id: int, last_id: int) -> str:
    """A new name for the object of a batch of ``workflow`` runs finished on ``day``, runs
    ``first_id`` to ``last_id``: unique per write, so no object is ever replaced."""
    stamp = timezone.now().strftime("%Y%m%dT%H%M%S%fZ")
    return (f"{day_folder(workflow, day)}/{first_id}-{last_id}-{stamp}"
            f"{secrets.token_hex(4)}.jsonl")


def write_batch(storage: Storage, workflow: str, day: date,
                documents: list[dict[str, Any]]) -> str:
    """Write ``documents`` (export documents of ``workflow`` runs finished on ``day``, in run
    id order) as one new JSON Lines object; return its name. Nothing is deleted or replaced:
    the name is new (:func:`object_name`), and a storage that still finds it taken saves
    under a name of its own choosing, which is returned.
    """
    name = object_name(workflow, day, documents[0]["run"]["id"], documents[-1]["run"]["id"])
    body = "".join(json.dumps(document, separators=(",", ":"), sort_keys=True) + "\n"
                   for document in documents)
    return str(storage.save(name, ContentFile(body.encode("utf-8"))))


def read_archive(path_or_name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The documents of an archive object: a local file, or a name in the archive storage;
    each with its line number.

    Raises:
        ArchiveError: neither a local file nor an object of the archive storage, or a line
            that is not JSON.
    """
    if os.path.isfile(path_or_name):
        with open(path_or_name, encoding="utf-8") as handle:
            text = handle.read()
    else:
        text = _read_object(path_or_name)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as error:
            raise exceptions.ArchiveError(
                f"Line {number} of {path_or_name!r} is not JSON ({error}); the lines before it "
                "were imported.") from None


def _read_object(name: str) -> str:
    """An object of the archive storage, read whole. Opened, not first asked ``exists()``:
    some django-storages releases answer False for every name when overwriting is on."""
    storage = archive_storage()
    problem = "QUEUETY['ARCHIVE_STORAGE'] is not set"
    if storage is not None:
        try:
            with storage.open(name, "rb") as handle:
                return bytes(handle.read()).decode("utf-8")
        except Exception as error:  # noqa: BLE001 - each backend raises its own kind
            problem = (f"nor an object of storage {settings.ARCHIVE_STORAGE!r} "
                       f"({type(error).__name__}: {error})")
    raise exceptions.ArchiveError(
        f"{name!r} is neither a local file {problem}; give a file path or an object name "
        f"such as {day_folder('order', date(2026, 1, 31)) + '/1-40-20260201T0300Z.jsonl'!r}.")


def restore(document: Any) -> int | None:
    """Bring an archived run back as it was, with its id, status, timeline, step rows,
    signals, artifacts and chunks; return its id, or None when a run of that id exists
    (nothing is written). Its idempotency key, if still a tombstone, points at it again.

    Raises:
        WorkflowDefinitionError: the document is malformed, altered, or names code this site
            cannot import (the checks of replay); nothing is written.
    """
    document, spec = exports.read_document(document)
    source = document["run"]
    run_id = source.get("id")
    if not isinstance(run_id, int) or isinstance(run_id, bool) or run_id < 1:
        raise exceptions.WorkflowDefinitionError(
            "Invalid export document: an archived run carries its id (run.id); nothing was "
            "imported.")
    if WorkflowRun.objects.filter(pk=run_id).exists():
        return None
    now = timezone.now()
    try:
        with transaction.atomic():
            _write_run(document, spec.name, definition_id(spec), len(spec.steps), now)
    except IntegrityError:  # restored meanwhile by another import
        if WorkflowRun.objects.filter(pk=run_id).exists():
            return None
        raise
    return int(run_id)


def _when(text: str | None) -> Any:
    return parse_datetime(text) if text else None


def _write_run(document: dict[str, Any], name: str, definition_pk: int, total_steps: int,
               now: Any) -> None:
    source = document["run"]
    counters = source["counters"]
    run_id = source["id"]
    WorkflowRun.objects.create(
        id=run_id, definition_id=definition_pk, name=name, state=source["state"],
        total_steps=total_steps, current_step=source["current_step"], status=source["status"],
        error=source.get("error"), idempotency_key=source.get("idempotency_key"),
        transitions=counters.get("transitions", 0), cost_units=counters.get("cost_units", 0),
        started_workflows=counters.get("started_workflows", 0),
        groups=exports.run_groups(source.get("groups")), group=source.get("group") or "",
        cleanup=source.get("cleanup"),
        deadline_at=_when(source.get("deadline_at")), restored_at=now)
    # created_at is auto_now_add: set the archived instants afterwards.
    WorkflowRun.objects.filter(pk=run_id).update(
        created_at=_when(source.get("created_at")) or now,
        finished_at=_when(source.get("finished_at")) or now)
    StepRun.objects.bulk_create([StepRun(
        id=s["id"], run_id=run_id, kind=s.get("kind") or "step", seq=s["seq"],
        branch=s.get("branch") or 0, step_index=s["step_index"], step_name=s["step_name"],
        status=s["status"], attempt=s.get("attempt") or 0,
        max_attempts=s.get("max_attempts") or 1, timeout=s.get("timeout"),
        available_at=_when(s.get("available_at")) or now,
        claimed_at=_when(s.get("claimed_at")), finished_at=_when(s.get("finished_at")),
        output=s.get("output"), error=s.get("error"),
    ) for s in document.get("steps") or []])
    events = Event.objects.bulk_create([Event(
        id=e.get("id"), run_id=run_id, kind=e["kind"], step_index=e.get("step_index"),
        step_name=e.get("step_name") or "", attempt=e.get("attempt"),
        duration_ms=e.get("duration_ms"), data=e.get("data") or {},
    ) for e in document["events"]])
    for event, item in zip(events, document["events"], strict=True):
        event.created_at = _when(item.get("created_at")) or now
    Event.objects.bulk_update(events, ["created_at"], batch_size=500)
    signals = Signal.objects.bulk_create([Signal(
        id=s.get("id"), dedupe_key=s.get("dedupe_key") or None, run_id=run_id, name=s["name"], payload=s.get("payload"), sent_by=s.get("sent_by") or "",
        consumed_at=_when(s.get("consumed_at")), consumed_by_step=s.get("consumed_by_step") or "",
    ) for s in document["signals"]])
    for signal, item in zip(signals, document["signals"], strict=True):
        signal.received_at = _when(item.get("received_at")) or now
    Signal.objects.bulk_update(signals, ["received_at"], batch_size=500)
    for item in document.get("artifacts") or []:
        artifact_rows.write_visible(run_id, artifact_rules.encode(
            item["key"], artifact_rules.from_portable(item["kind"], item["content"]),
            item["kind"], item.get("metadata"), limit=settings.MAX_ARTIFACT_BYTES),
            item.get("step_index"), item.get("step_name") or "")
    StepChunk.objects.bulk_create([StepChunk(
        run_id=run_id, step_run_id=c["step_run_id"], step_index=c["step_index"],
        step_name=c["step_name"], index=c["index"], attempt=c["attempt"],
        content=json.dumps(c["content"], separators=(",", ":")),
        created_at=_when(c.get("created_at")) or now,
    ) for c in document.get("chunks") or []])
    _raise_sequences(WorkflowRun, StepRun, Event, Signal, StepChunk)
    Event.objects.create(run_id=run_id, kind="run_restored", data={
        "archived_at": document.get("exported_at"), "definition_hash": source["definition_hash"]})
    if source.get("idempotency_key"):
        DispatchKey.objects.filter(key=source["idempotency_key"], run_id=run_id).update(
            purged_at=None, purged_workflow="", forget_at=None)


def _raise_sequences(*models: Any) -> None:
    """Raise each table's id sequence past the ids an import wrote (never lower it): an
    archive imported into a younger database (a restore elsewhere) must not leave the next
    dispatch an id that is taken."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for model in models:
            table = model._meta.db_table
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence(%s, 'id'), m) FROM (SELECT max(id) AS m "
                f"FROM {connection.ops.quote_name(table)}) AS t "
                "WHERE m > nextval(pg_get_serial_sequence(%s, 'id'))", [table, table])
