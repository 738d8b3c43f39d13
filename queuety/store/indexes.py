"""Migration operations that build or drop an index without locking its table's writes.

``CREATE INDEX`` holds a lock that blocks every insert and update of the table until the index
is built, a full scan of a big runs or steps table. On PostgreSQL this operation builds it with
``CREATE INDEX CONCURRENTLY`` (the migration that uses it sets ``atomic = False``, as that
statement cannot run in a transaction); elsewhere (SQLite) it is a plain ``AddIndex``.
:class:`RemoveIndexOnline` is its counterpart, ``DROP INDEX CONCURRENTLY``.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _online(schema_editor: Any, model: Any, index: Any, *, add: bool) -> None:
    """Build (``add``) or drop ``index``: concurrently on PostgreSQL, plainly elsewhere."""
    change = schema_editor.add_index if add else schema_editor.remove_index
    if schema_editor.connection.vendor == "postgresql":
        change(model, index, concurrently=True)
    else:
        change(model, index)


class AddIndexOnline(migrations.AddIndex):
    """``AddIndex``, built concurrently on PostgreSQL (in a migration with ``atomic = False``)."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _online(schema_editor, model, self.index, add=True)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _online(schema_editor, model, self.index, add=False)


class RemoveIndexOnline(migrations.RemoveIndex):
    """``RemoveIndex``, dropped concurrently on PostgreSQL (in a migration with
    ``atomic = False``): a plain ``DROP INDEX`` waits for, then blocks, every query of the
    table."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        self._change(app_label, schema_editor, from_state, add=False)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        self._change(app_label, schema_editor, to_state, add=True)

    def _change(self, app_label: str, schema_editor: Any, state: Any, *, add: bool) -> None:
        """Drop (or, going back, build) the index as ``state`` (the one that has it) knows it."""
        model = state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _online(schema_editor, model, index, add=add)
