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


class AddIndexOnline(migrations.AddIndex):
    """``AddIndex``, built concurrently on PostgreSQL (in a migration with ``atomic = False``)."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, self.index, concurrently=True)
        else:
            schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)


class RemoveIndexOnline(migrations.RemoveIndex):
    """``RemoveIndex``, dropped concurrently on PostgreSQL (in a migration with
    ``atomic = False``): a plain ``DROP INDEX`` waits for, then blocks, every query of the
    table."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, index, concurrently=True)
        else:
            schema_editor.remove_index(model, index)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, index, concurrently=True)
        else:
            schema_editor.add_index(model, index)
