"""The HTML reply form of a human wait: its fields, read from the wait's JSON Schema, and the
reply read back from a POSTed form. Shared by the approval page and the admin."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NoReturn


def refuse_constant(name: str) -> NoReturn:
    """``json.loads`` hook: NaN and Infinity are not JSON, so a reply holding them is refused."""
    raise ValueError(f"{name} is not JSON")


def form_fields(schema: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """Form fields for a flat object schema; None means 'one JSON text area'."""
    if not schema or schema.get("type", "object") != "object" or "properties" not in schema:
        return None
    fields = []
    required = set(schema.get("required", []))
    for name, prop in schema["properties"].items():
        kind = "select" if "enum" in prop else prop.get("type", "string")
        if kind not in ("string", "integer", "number", "boolean", "select"):
            return None
        fields.append({"name": name, "kind": kind, "required": name in required,
                       "choices": prop.get("enum", []), "title": prop.get("title", name)})
    return fields


def form_reply(schema: dict[str, Any] | None, post: Mapping[str, str]) -> Any:
    """Read a reply from the form: typed by each field's declared type, then the schema
    validates it exactly (a number field holding 'abc' stays 'abc' and is refused)."""
    fields = form_fields(schema)
    if fields is None:
        text = post.get("reply", "")
        try:
            return json.loads(text, parse_constant=refuse_constant)
        except ValueError as error:
            raise ValueError(f"The reply is not valid JSON: {error}.") from None
    reply: dict[str, Any] = {}
    for field in fields:
        raw = post.get(field["name"])
        if field["kind"] == "boolean":
            reply[field["name"]] = raw == "on"
        elif raw is None or raw == "":  # spelt out so mypy narrows raw to str below
            continue
        elif field["kind"] == "integer" and raw.lstrip("-").isdigit():
            reply[field["name"]] = int(raw)
        elif field["kind"] == "number":
            try:
                reply[field["name"]] = float(raw) if "." in raw else int(raw)
            except ValueError:
                reply[field["name"]] = raw
        else:
            reply[field["name"]] = raw
    return reply
