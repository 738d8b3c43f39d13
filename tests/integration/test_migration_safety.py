"""Every migration is safe to apply while workers of the previous release run.

Two guards, each able to fail on a migration added later:

- ``unsafe_operations`` walks each migration's operations against the state before it and
  names every kind that breaks the code still running (a column dropped or renamed, a NOT NULL
  column without a database default, a type change) or holds a lock writers wait for during a
  scan (an index built plainly, a check or a constraint validated under the table's lock);
- ``locking_statements`` reads ``sqlmigrate``'s SQL for PostgreSQL and names every statement
  that takes a lock on a table that already existed other than a catalogue update.

A migration that must do one of these anyway goes in ``ALLOWED`` with its reason (the policy:
docs/guide/deploying.md, "Upgrading Queuety with runs in flight").
"""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, migrations, models
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState

from queuety.store import indexes

APP = "queuety"

#: (migration name, operation index) -> why it is safe anyway. Empty: none needs it today.
ALLOWED: dict[tuple[str, int], str] = {}

#: Operations that break the previous release's code or lock its tables, whatever they hold.
NEVER = (migrations.RemoveField, migrations.RenameField, migrations.RenameModel,
         migrations.DeleteModel, migrations.AlterModelTable, migrations.AlterUniqueTogether,
         migrations.AlterIndexTogether, migrations.AddConstraint, migrations.RemoveConstraint,
         migrations.RunSQL, migrations.RunPython)
#: Operations whose SQL cannot run in a transaction (CONCURRENTLY): their migration is not atomic.
ONLINE = (indexes.AddIndexOnline, indexes.RemoveIndexOnline, indexes.DropIndexOnline,
          indexes.ValidateFieldOnline)


def _field_problem(field: models.Field, *, online: bool) -> str:
    """Why adding ``field`` to a live table is unsafe, or ``""``."""
    if not field.null and field.db_default is models.NOT_PROVIDED:
        return ("it is NOT NULL without a db_default: the previous release's inserts, which "
                "do not name it, would fail")
    if hasattr(field.db_default, "resolve_expression") and not isinstance(field.db_default,
                                                                          models.Value):
        return "its db_default is an expression, which may rewrite the table under its lock"
    if online:
        return ""
    if field.db_check(connection):
        return "its CHECK scans the table under the column's ACCESS EXCLUSIVE lock"
    if field.db_index or field.unique:
        return "its index is built under a lock that blocks writes for a full scan"
    return ""


def _alter_problem(old: models.Field, new: models.Field) -> str:
    """Why changing ``old`` into ``new`` on a live table is unsafe, or ``""``."""
    if old.db_parameters(connection) != new.db_parameters(connection) or \
            old.column != new.column:
        return "it changes the column's type or check: a rewrite or a scan under lock"
    if old.null and not new.null:
        return "SET NOT NULL scans the table under its ACCESS EXCLUSIVE lock"
    if (new.db_index and not old.db_index) or (new.unique and not old.unique):
        return "its index is built under a lock that blocks writes for a full scan"
    return ""


def _operation_problem(operation: Any, state: ProjectState, created: set[str]) -> str:
    """Why ``operation`` is unsafe against ``state`` (models in ``created`` are new), or ``""``."""
    model = getattr(operation, "model_name_lower", "")
    if model in created:
        return ""
    if isinstance(operation, NEVER):
        return "the previous release still uses what it changes, or it locks a live table"
    if type(operation) in (migrations.AddIndex, migrations.RemoveIndex):
        return "a plain index build or drop locks the table: use AddIndexOnline/RemoveIndexOnline"
    if isinstance(operation, migrations.AddField):
        field = operation.field.clone()
        field.set_attributes_from_name(operation.name)  # its check names its column
        return _field_problem(field, online=isinstance(operation, indexes.AddFieldOnline))
    if isinstance(operation, migrations.AlterField):
        # Rendered models: a foreign key's column type needs its target resolved.
        after = state.clone()
        operation.state_forwards(APP, after)
        return _alter_problem(state.apps.get_model(APP, model)._meta.get_field(operation.name),
                              after.apps.get_model(APP, model)._meta.get_field(operation.name))
    return ""


def unsafe_operations(migration: migrations.Migration, state: ProjectState) -> list[str]:
    """Every unsafe operation of ``migration`` applied to ``state`` (which it moves forward)."""
    problems: list[str] = []
    created: set[str] = set()
    for position, operation in enumerate(migration.operations):
        applied = [operation]
        if isinstance(operation, migrations.SeparateDatabaseAndState):
            applied = operation.database_operations  # what the database runs
        for each in applied:
            if isinstance(each, migrations.CreateModel):
                created.add(each.name_lower)
            problem = _operation_problem(each, state, created)
            if isinstance(each, ONLINE) and migration.atomic:
                problem = "it runs CONCURRENTLY, which needs the migration's atomic = False"
            if problem and (migration.name, position) not in ALLOWED:
                problems.append(f"{migration.name} operation {position} ({each.describe()}): "
                                f"{problem}.")
        operation.state_forwards(APP, state)
    return problems


def app_migrations() -> list[migrations.Migration]:
    """The app's migrations on disk, in order."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return [loader.disk_migrations[key] for key in sorted(loader.disk_migrations)
            if key[0] == APP]


def test_migrations__no_operation_breaks_the_previous_release_or_locks_a_live_table():
    state = ProjectState()
    problems: list[str] = []
    for migration in app_migrations():
        problems += unsafe_operations(migration, state)
    assert not problems, ("Unsafe migration operations (split them, use queuety.store.indexes' "
                          "online operations, or allow-list them in ALLOWED with why):\n"
                          + "\n".join(problems))


def test_unsafe_operations__names_each_unsafe_kind():
    """The walker fails on what it is meant to catch (so the test above can fail)."""
    state = ProjectState()
    for migration in app_migrations():
        unsafe_operations(migration, state)
    bad = migrations.Migration("9999_bad", APP)
    bad.operations = [
        migrations.RemoveField("workflowrun", "loops"),
        migrations.AddField("workflowrun", "flag", models.BooleanField(default=False)),
        migrations.AddField("steprun", "count", models.PositiveIntegerField(db_default=0)),
        migrations.AddIndex("steprun", models.Index(fields=["queue"], name="bad_queue")),
        migrations.AlterField("steprun", "step_name", models.TextField()),
        indexes.AddIndexOnline("steprun", models.Index(fields=["kind"], name="bad_kind")),
        migrations.AddField("steprun", "fine", models.JSONField(null=True)),
    ]
    found = unsafe_operations(bad, state)
    assert [line.split(" (")[0] for line in found] == [
        f"9999_bad operation {n}" for n in range(6)]


# -- the SQL PostgreSQL runs --------------------------------------------------------------------

#: A statement on a table that existed before the migration, and why it is unsafe there.
LOCKING = [
    (r"^CREATE (UNIQUE )?INDEX (?!CONCURRENTLY)", "builds an index under a lock that blocks "
                                                  "writes"),
    (r"^DROP INDEX (?!CONCURRENTLY)", "drops an index under ACCESS EXCLUSIVE"),
    (r"^(DROP TABLE|TRUNCATE|LOCK|CLUSTER|REINDEX (?!.*CONCURRENTLY)|VACUUM FULL)",
     "locks the table"),
    (r"\b(DROP|RENAME) (COLUMN|CONSTRAINT|TO)\b|\bRENAME\b", "drops or renames what the "
                                                             "previous release uses"),
    (r"\bALTER COLUMN \S+ (SET DATA )?TYPE\b", "rewrites the table"),
    (r"\bSET NOT NULL\b", "scans the table under ACCESS EXCLUSIVE"),
    (r"\bADD CONSTRAINT\b(?!.*\bNOT VALID\b)", "validates a constraint under the table's lock"),
    (r"\bADD COLUMN\b.*\bCHECK \(", "scans the table under ACCESS EXCLUSIVE for the check"),
    (r"\bADD COLUMN\b.*\bDEFAULT (?!'|\d|-\d|true\b|false\b|NULL\b)", "a volatile default "
                                                                      "rewrites the table"),
]


def _tables(state: ProjectState) -> set[str]:
    return {model.options.get("db_table") or f"{APP}_{name}"
            for (app, name), model in state.models.items() if app == APP}


def locking_statements(sql: str, existing: set[str]) -> list[str]:
    """The statements of ``sql`` that lock one of the ``existing`` tables beyond a catalogue
    update (the ADD COLUMN of a nullable or constant-default column, ADD CONSTRAINT ... NOT
    VALID, and a new table's foreign key to one of them are catalogue updates)."""
    found = []
    sql = "\n".join(line for line in sql.splitlines() if not line.startswith("--"))
    for statement in re.split(r";\s*\n|; (?=SET CONSTRAINTS)", sql):
        line = " ".join(statement.split())
        subject = re.match(r'(?:ALTER TABLE|CREATE (?:UNIQUE )?INDEX .*? ON|TRUNCATE|LOCK TABLE'
                           r'|CLUSTER|DROP TABLE|REINDEX TABLE|VACUUM FULL) "([^"]+)"', line)
        # An index dropped by name may be any table's: every DROP INDEX counts.
        touched = (subject and subject.group(1) in existing) or line.startswith("DROP INDEX")
        for pattern, why in LOCKING:
            if touched and re.search(pattern, line):
                found.append(f"{line[:160]} ({why})")
                break
    return found


def test_sqlmigrate__no_statement_locks_a_table_that_already_exists():
    assert connection.vendor == "postgresql"
    state = ProjectState()
    problems: list[str] = []
    for migration in app_migrations():
        out = io.StringIO()
        call_command("sqlmigrate", APP, migration.name, stdout=out)
        if not any((migration.name, n) in ALLOWED for n in range(len(migration.operations))):
            problems += [f"{migration.name}: {each}"
                         for each in locking_statements(out.getvalue(), _tables(state))]
        for operation in migration.operations:
            operation.state_forwards(APP, state)
    assert not problems, ("Statements that lock a live table (see the policy in "
                          "docs/guide/deploying.md):\n" + "\n".join(problems))


def test_locking_statements__names_each_locking_kind():
    existing = {"queuety_steprun"}
    sql = "\n".join([
        'CREATE INDEX "x" ON "queuety_steprun" ("queue");',
        'DROP INDEX IF EXISTS "y";',
        'ALTER TABLE "queuety_steprun" ADD COLUMN "n" integer DEFAULT 0 NOT NULL CHECK ("n" >= 0);',
        'ALTER TABLE "queuety_steprun" ALTER COLUMN "kind" TYPE text;',
        'ALTER TABLE "queuety_steprun" ADD CONSTRAINT "c" CHECK ("n" > 0);',
        'ALTER TABLE "queuety_steprun" DROP COLUMN "kind" CASCADE;',
        'ALTER TABLE "queuety_steprun" ADD COLUMN "t" timestamp DEFAULT now() NOT NULL;',
        # catalogue updates only:
        'CREATE INDEX CONCURRENTLY "z" ON "queuety_steprun" ("queue");',
        'ALTER TABLE "queuety_steprun" ADD COLUMN "m" integer DEFAULT 0 NOT NULL;',
        'ALTER TABLE "queuety_steprun" ADD CONSTRAINT "d" CHECK ("m" >= 0) NOT VALID;',
        'CREATE INDEX "w" ON "queuety_newtable" ("queue");',
    ]) + "\n"
    sql = "--\n-- a comment\n--\n" + sql
    assert len(locking_statements(sql, existing)) == 7


def test_an_online_build_that_failed_halfway_is_built_again_on_the_next_run():
    # A concurrent build that fails (here on duplicates; in production a lock_timeout or a
    # cancelled migrate) leaves its index INVALID, and the migration runs again.
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS queuety_test_rebuild")
        cursor.execute("CREATE TABLE queuety_test_rebuild (x integer)")
        cursor.execute("INSERT INTO queuety_test_rebuild VALUES (1), (1)")
        try:
            cursor.execute("CREATE UNIQUE INDEX CONCURRENTLY queuety_test_rebuild_x "
                           "ON queuety_test_rebuild (x)")
        except Exception:  # noqa: BLE001 - the failure is the point
            pass
        else:
            raise AssertionError("The unique build on duplicates should have failed.")
    try:
        with connection.schema_editor(atomic=False) as editor:
            assert indexes.already_built(editor, "queuety_test_rebuild_x") is False
            # The invalid index is gone: the build can start afresh under the same name.
            editor.execute("CREATE INDEX CONCURRENTLY queuety_test_rebuild_x "
                           "ON queuety_test_rebuild (x)")
            assert indexes.already_built(editor, "queuety_test_rebuild_x") is True
            assert indexes.already_built(editor, "queuety_test_absent") is False
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE queuety_test_rebuild")


def test_an_online_column_cannot_be_unique():
    with pytest.raises(ValueError, match=r"cannot add the unique field steprun\.x: add it "
                                         r"nullable without unique=True"):
        indexes.AddFieldOnline("steprun", "x", models.IntegerField(unique=True, null=True))
