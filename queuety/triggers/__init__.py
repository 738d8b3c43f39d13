"""Model triggers: a row saved or deleted starts a run, or signals one, in the save's transaction.

``declare`` holds the triggers declared with ``queuety.trigger(model, on=..., ...)`` in the
apps' ``workflows.py``; ``fire`` holds the Django ``post_save``/``post_delete`` receivers and
``queuety.fire(instance, event)``, which starts or signals for one row. Guide:
docs/guide/triggers-and-events.md, "Model triggers".
"""
