"""Resolve handlers and exception classes to and from dotted import paths."""

from __future__ import annotations

import functools
import importlib
from typing import Any


def dotted_path(obj: Any) -> str:
    """Return ``module.QualName`` for a class or function."""
    return f"{obj.__module__}.{obj.__qualname__}"


@functools.lru_cache(maxsize=1024)
def import_path(path: str) -> Any:
    """Import ``package.module.Attr.nested`` and return the object.

    Tries the longest importable module prefix, then walks attributes, so nested classes work.
    Raises ImportError naming the path when nothing resolves.
    """
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only swallow "this prefix is not a module"; an import error inside the
            # module is the user's bug and must surface.
            if error.name and module_name.startswith(error.name):
                continue
            raise
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise ImportError(f"{path!r} is not an importable dotted path")
