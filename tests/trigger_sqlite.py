"""Model triggers on SQLite (the embedded default), run by tests/integration/test_triggers.py
in a subprocess with ``QUEUETY_VAR_DIR`` set and no server variables: SQLite has no
``txid_current()``, so the transaction's token is kept as an on-commit hook instead.

Prints a JSON object of run counts. The workflow parks at a signal wait at once, so nothing is
published (no worker is needed).
"""

from __future__ import annotations

import json

import django


class Rollback(Exception):
    pass


def main() -> None:
    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    import queuety
    from queuety.models import WorkflowRun
    from tests import workflows
    from tests.testapp.models import Article

    call_command("migrate", verbosity=0)
    parked = queuety.workflow("trig_sqlite").wait_for_signal("go").then(workflows.step_a)
    queuety.trigger(Article, on="saved", start=parked, name="sqlite")

    def runs() -> int:
        return WorkflowRun.objects.filter(name="trig_sqlite").count()

    counts = {}
    with transaction.atomic():
        article = Article.objects.create(token="sqlite")
        article.title = "again"
        article.save()
        queuety.fire(article, "updated")
    counts["one_transaction"] = runs()
    with transaction.atomic():
        article.save()
    counts["a_later_transaction"] = runs()
    try:
        with transaction.atomic():
            article.save()
            counts["inside_rolled_back"] = runs()
            raise Rollback
    except Rollback:
        pass
    counts["after_rollback"] = runs()
    article.save()  # autocommit: a transaction of its own
    article.save()
    counts["two_autocommit_saves"] = runs()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
