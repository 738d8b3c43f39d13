"""Migration operations that change a live table without locking its writes for a scan.

Workers of the previous release keep claiming and landing steps while ``migrate`` runs
(docs/guide/deploying.md, "Upgrading Queuety with runs in flight"), so no operation may hold a
lock that blocks them for longer than a catalogue update:

- ``CREATE INDEX`` holds a lock that blocks every insert and update of the table until the
  index is built, a full scan of a big runs or steps table. On PostgreSQL
  :class:`AddIndexOnline` builds it with ``CREATE INDEX CONCURRENTLY`` (the migration that uses
  it sets ``atomic = False``, as that statement cannot run in a transaction); elsewhere
  (SQLite) it is a plain ``AddIndex``. :class:`RemoveIndexOnline` and :class:`DropIndexOnline`
  are the counterparts, ``DROP INDEX CONCURRENTLY``.
- ``ADD COLUMN ... CHECK`` (every ``PositiveIntegerField``) scans the whole table under the
  ``ACCESS EXCLUSIVE`` lock the column takes, which blocks reads too. :class:`AddFieldOnline`
  adds the column without it and the check as ``NOT VALID`` (a catalogue update), and leaves
  the foreign key's index out; :class:`ValidateFieldOnline`, in a later migration with
  ``atomic = False``, validates the check under a lock writers do not wait for and builds the
  index concurrently. The schema ends as Django's own operations would leave it, with the
  same names, whichever path a database took.
"""

from __future__ import annotations

import copy
from typing import Any

from django.db import migrations


def _online(schema_editor: Any, model: Any, index: Any, *, add: bool) -> None:
    """Build (``add``) or drop ``index``: concurrently on PostgreSQL, plainly elsewhere."""
    change = schema_editor.add_index if add else schema_editor.remove_index
    if schema_editor.connection.vendor != "postgresql":
        change(model, index)
    elif not add or not already_built(schema_editor, index.name):
        change(model, index, concurrently=True)


def already_built(schema_editor: Any, name: str) -> bool:
    """Whether index ``name`` is already built and valid (nothing to do) on PostgreSQL.

    A ``CREATE INDEX CONCURRENTLY`` that failed (a ``lock_timeout``, a cancelled
    ``migrate``) leaves the index behind INVALID: the planner never uses it, and the
    migration, not recorded, runs again. That run drops the invalid index (concurrently) so
    the build starts afresh, and skips one a previous run finished, so a migration that
    stopped halfway is safe to repeat.
    """
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c "
                       "ON c.oid = i.indexrelid WHERE c.relname = %s "
                       "AND pg_table_is_visible(c.oid)", [name])
        found = cursor.fetchone()
    if found is None:
        return False
    if not found[0]:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS "
                              f"{schema_editor.quote_name(name)}")
        return False
    return True


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


class _DatabaseOnly(migrations.operations.base.Operation):
    """An operation on the database alone: the migration state already is what it leaves.

    Django's ``Operation.deconstruct`` writes it back with its constructor's arguments."""

    reduces_to_sql = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        """Change nothing: the state does not know (or already knows) what it changes."""


class DropIndexOnline(_DatabaseOnly):
    """Drop an index the migration state never knew by name (``DROP INDEX CONCURRENTLY IF EXISTS``
    on PostgreSQL, in a migration with ``atomic = False``); going back builds it again on
    ``columns`` of ``table``."""

    def __init__(self, name: str, table: str, columns: list[str]) -> None:
        self.name = name
        self.table = table
        self.columns = columns

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        quote = schema_editor.quote_name
        schema_editor.execute(f"DROP INDEX {_concurrently(schema_editor)}IF EXISTS "
                              f"{quote(self.name)}")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        quote = schema_editor.quote_name
        columns = ", ".join(quote(column) for column in self.columns)
        schema_editor.execute(f"CREATE INDEX {_concurrently(schema_editor)}IF NOT EXISTS "
                              f"{quote(self.name)} ON {quote(self.table)} ({columns})")

    def describe(self) -> str:
        """One line for ``migrate``'s output."""
        return f"Drop index {self.name} of {self.table} (concurrently on PostgreSQL)"


class AddFieldOnline(migrations.AddField):
    """``AddField`` that holds the table's ``ACCESS EXCLUSIVE`` lock for a catalogue update only.

    On PostgreSQL the column is added without its ``CHECK`` and without its index; the check is
    added ``NOT VALID`` under the name PostgreSQL gives a column's check
    (``<table>_<column>_check``), so a database that took Django's plain ``AddField`` has the
    same one. A later migration validates it and builds the index (:class:`ValidateFieldOnline`).
    Elsewhere (SQLite) it is a plain ``AddField``.

    A unique field is refused: its index is a constraint the column would lack until the later
    migration, and ``ADD COLUMN ... UNIQUE`` builds it under the lock this operation avoids.
    """

    def __init__(self, model_name: str, name: str, field: Any, preserve_default: bool = True
                 ) -> None:
        if getattr(field, "unique", False) or getattr(field, "primary_key", False):
            raise ValueError(
                f"AddFieldOnline cannot add the unique field {model_name}.{name}: add it "
                "nullable without unique=True, then build a unique index concurrently "
                "(AddIndexOnline) and add the constraint from it in a later migration.")
        super().__init__(model_name, name, field, preserve_default)

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        to_model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(connection.alias, to_model):
            return
        field = to_model._meta.get_field(self.name)
        check = field.db_check(connection)
        lean = copy.copy(field)
        # The check would make PostgreSQL scan every row under the lock, the index would block
        # writes for a second scan: both come back without a lock writers wait for.
        lean.db_check = lambda connection: None
        lean.db_index = False
        schema_editor.add_field(from_state.apps.get_model(app_label, self.model_name), lean)
        if check:
            table = to_model._meta.db_table
            quote = schema_editor.quote_name
            schema_editor.execute(f"ALTER TABLE {quote(table)} ADD CONSTRAINT "
                                  f"{quote(check_name(table, field.column))} CHECK ({check}) "
                                  "NOT VALID")


class ValidateFieldOnline(_DatabaseOnly):
    """Finish an :class:`AddFieldOnline` on PostgreSQL (in a migration with ``atomic = False``).

    ``VALIDATE CONSTRAINT`` scans under ``SHARE UPDATE EXCLUSIVE``, which no insert or update
    waits for; ``index`` (the name Django gives the field's index) is built with ``CREATE INDEX
    CONCURRENTLY`` unless a valid one exists (:func:`already_built`). Both are no-ops where the
    check is valid and the index exists already (a database that took the plain ``AddField``).
    Elsewhere it does nothing: the plain ``AddField`` made both.
    """

    def __init__(self, model_name: str, name: str, index: str = "") -> None:
        self.model_name = model_name
        self.name = name
        self.index = index

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        connection = schema_editor.connection
        model = to_state.apps.get_model(app_label, self.model_name)
        if connection.vendor != "postgresql" or not self.allow_migrate_model(connection.alias,
                                                                             model):
            return
        field = model._meta.get_field(self.name)
        table, quote = model._meta.db_table, schema_editor.quote_name
        if field.db_check(connection):
            schema_editor.execute(f"ALTER TABLE {quote(table)} VALIDATE CONSTRAINT "
                                  f"{quote(check_name(table, field.column))}")
        if self.index and not already_built(schema_editor, self.index):
            schema_editor.execute(f"CREATE INDEX CONCURRENTLY {quote(self.index)} "
                                  f"ON {quote(table)} ({quote(field.column)})")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        """Leave the check and the index: going back past ``AddFieldOnline`` drops both."""

    def describe(self) -> str:
        """One line for ``migrate``'s output."""
        return f"Validate {self.model_name}.{self.name}'s check and build its index online"


def check_name(table: str, column: str) -> str:
    """The name PostgreSQL gives the ``CHECK`` of a column declared with one."""
    return f"{table}_{column}_check"


def _concurrently(schema_editor: Any) -> str:
    return "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
