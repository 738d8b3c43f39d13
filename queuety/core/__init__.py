"""The pure engine core: no Django, Celery or DRF imports here (a test enforces it)."""
