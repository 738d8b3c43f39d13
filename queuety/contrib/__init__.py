"""Integrations with other libraries, each behind an extra of its own (``queuety-django[...]``).

Nothing here is imported by ``queuety`` itself: a site imports the integration it installed,
such as :mod:`queuety.contrib.pydantic_ai` (``queuety-django[pydantic-ai]``).
"""
