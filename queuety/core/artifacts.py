"""Artifacts and streamed chunks as stored bytes: the rules, without the storage.

An artifact is a named output of a run kept outside its public state (a draft, a plan, a
transcript). Its ``kind`` says how its content is stored and read back:

- ``json``: any JSON value, stored as compact UTF-8 JSON, read back as the value;
- ``text`` and ``markdown``: a string, stored as UTF-8;
- ``bytes``: ``bytes``, stored as they are.

A chunk of a streaming step is one JSON value (usually a string: a token), stored as its
compact JSON text.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any

from queuety.exceptions import InvalidArtifact

#: The kinds an artifact may have.
KINDS = ("json", "text", "markdown", "bytes")
#: Longest key (the column's size).
MAX_KEY_LENGTH = 255


@dataclass(frozen=True, slots=True)
class Encoded:
    """An artifact ready to store: its checked key, kind, bytes and metadata."""

    key: str
    kind: str
    data: bytes
    metadata: dict[str, Any]

    @property
    def size(self) -> int:
        """Bytes of content."""
        return len(self.data)


def check_key(key: Any, run_id: int | None = None) -> str:
    """Return ``key`` if it can name an artifact (1-255 characters, no ``/``, no control
    characters, as it appears in URLs and file names), else raise InvalidArtifact."""
    where = "" if run_id is None else f" of run {run_id}"
    if not isinstance(key, str) or not key.strip():
        raise InvalidArtifact(f"An artifact{where} needs a non-empty key (a string such as "
                              f"'draft'); got {key!r}.")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidArtifact(f"Artifact key {key[:40]!r}...{where} is {len(key)} characters "
                              f"long; the limit is {MAX_KEY_LENGTH}.")
    if "/" in key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise InvalidArtifact(f"Artifact key {key!r}{where} contains '/' or a control "
                              "character; use letters, digits and - _ . : (e.g. 'draft.v2').")
    return key


def encode(key: Any, content: Any, kind: Any = "json", metadata: Any = None, *,
           limit: int, run_id: int | None = None) -> Encoded:
    """Check an artifact and turn its content into bytes.

    Raises:
        InvalidArtifact: the key, kind, content or metadata is wrong, or the content is over
            ``limit`` bytes; the message names the run, the key and the fix.
    """
    key = check_key(key, run_id)
    name = f"Artifact {key!r}" + ("" if run_id is None else f" of run {run_id}")
    if kind not in KINDS:
        raise InvalidArtifact(f"{name} has kind {kind!r}; use one of {', '.join(KINDS)}.")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise InvalidArtifact(f"{name}: metadata must be a dict of JSON values or None "
                              f"(got {type(metadata).__name__}).")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidArtifact(f"{name}: metadata is not JSON ({error}).") from None
    if kind == "json":
        try:
            data = json.dumps(content, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError) as error:
            raise InvalidArtifact(f"{name} of kind 'json' holds content that is not JSON "
                                  f"({error}); give a dict, list, string, number, bool or "
                                  "None, or use kind='bytes'.") from None
    elif kind == "bytes":
        if not isinstance(content, bytes | bytearray | memoryview):
            raise InvalidArtifact(f"{name} of kind 'bytes' needs bytes (got "
                                  f"{type(content).__name__}).")
        data = bytes(content)
    else:
        if not isinstance(content, str):
            raise InvalidArtifact(f"{name} of kind {kind!r} needs a string (got "
                                  f"{type(content).__name__}); use kind='json' for other "
                                  "values.")
        data = content.encode()
    if len(data) > limit:
        raise InvalidArtifact(f"{name} is {len(data)} bytes; the limit is {limit} "
                              "(QUEUETY['MAX_ARTIFACT_BYTES']). Store it elsewhere and keep "
                              "its address in the artifact.", too_large=True)
    return Encoded(key, kind, data, metadata)


def decode(kind: str, data: bytes) -> Any:
    """The content of a stored artifact, as it was given (``bytes`` for ``bytes``)."""
    if kind == "bytes":
        return bytes(data)
    text = bytes(data).decode()
    return json.loads(text) if kind == "json" else text


def portable(kind: str, data: bytes) -> Any:
    """The content as a JSON document can carry it: ``bytes`` as base64 text."""
    if kind == "bytes":
        return base64.b64encode(bytes(data)).decode("ascii")
    return decode(kind, data)


def from_portable(kind: str, content: Any) -> Any:
    """The inverse of :func:`portable` (an export document's content back to a value).

    Raises:
        InvalidArtifact: ``bytes`` content that is not base64 text.
    """
    if kind != "bytes":
        return content
    try:
        return base64.b64decode(content, validate=True)
    except (TypeError, ValueError):
        raise InvalidArtifact("Content of a 'bytes' artifact in a document must be base64 "
                              "text.") from None


def encode_chunk(content: Any, *, limit: int, step: str, run_id: int) -> str:
    """A yielded chunk as stored JSON text.

    Raises:
        InvalidArtifact: the chunk is not JSON, or longer than ``limit`` bytes.
    """
    if isinstance(content, float) and not math.isfinite(content):
        raise InvalidArtifact(f"Step {step!r} of run {run_id} yielded {content!r}, which "
                              "JSON cannot carry.")
    try:
        text = json.dumps(content, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidArtifact(f"Step {step!r} of run {run_id} yielded a chunk that is not "
                              f"JSON ({error}); yield strings, or dicts and lists of JSON "
                              "values.") from None
    if len(text.encode()) > limit:
        raise InvalidArtifact(f"Step {step!r} of run {run_id} yielded a chunk of "
                              f"{len(text.encode())} bytes; the limit is {limit} "
                              "(QUEUETY['MAX_CHUNK_BYTES']).", too_large=True)
    return text


#: Content types of a downloaded artifact, by kind.
CONTENT_TYPES = {"json": "application/json", "text": "text/plain; charset=utf-8",
                 "markdown": "text/markdown; charset=utf-8",
                 "bytes": "application/octet-stream"}


def file_name(run_id: int, key: str, kind: str) -> str:
    """The file name a downloaded artifact gets: ``run-<id>-<key>`` plus the kind's suffix,
    with any character a file name may not hold replaced."""
    suffix = {"json": ".json", "text": ".txt", "markdown": ".md"}.get(kind, "")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return f"run-{run_id}-{safe}{suffix}"
