"""The package's version, in one place.

A module of its own, pure and importing nothing, so that the modules that print or store the
version (``export``, the API's schema) read it without importing the facade ``queuety`` above
them; the facade re-exports it as ``queuety.__version__`` and the wheel's metadata reads it
here (``[tool.setuptools.dynamic]`` in ``pyproject.toml``).
"""

__version__ = "0.1.0"
