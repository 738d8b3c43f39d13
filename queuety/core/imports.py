"""Resolve handlers and exception classes to and from dotted import paths, through aliases.

A stored definition names its handlers by dotted path, and keeps those paths (its hash is
theirs). When a deploy renames or moves a handler, an **alias** says where an old path now
lives: ``queuety.alias("shop.steps.charge", "shop.billing.charge_card")``, or the site's
``QUEUETY["HANDLER_ALIASES"]``. :func:`import_path`, which everything that imports a stored
path goes through, follows the alias before importing.

Two tables are kept: the aliases declared in code (:func:`alias`), and those of the settings,
which Django's side installs as a *source* (:func:`use_alias_source`, read on first use and
again after :func:`forget_aliases`), so this module never imports Django. A path in both
tables follows the settings'. An alias may point to a path that is itself aliased (a chain,
followed to its end); a chain that comes back to where it started is refused.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

#: Code aliases (``alias()``), old path -> new path.
_declared: dict[str, str] = {}
#: Where the settings' aliases come from (installed by the Django app); None: none.
_source: Callable[[], Mapping[str, str]] | None = None
#: The effective table, computed on first use after a change.
_table: dict[str, str] | None = None
#: Bumped by every change, so an import that declared an alias is resolved again.
_generation = 0


def dotted_path(obj: Any) -> str:
    """Return ``module.QualName`` for a class or function."""
    return f"{obj.__module__}.{obj.__qualname__}"


def import_path(path: str) -> Any:
    """Import ``package.module.Attr.nested`` and return the object, following aliases.

    When ``path`` is aliased, the alias's target is imported instead. When the path does not
    import but importing its module declared an alias for it (``queuety.alias()`` next to the
    renamed handler), that alias is followed.

    Raises:
        ImportError: nothing resolves (the message names the path), or the aliases loop.
    """
    seen = _generation
    target = resolve(path)
    try:
        return import_exact(target)
    except ImportError:
        if _generation == seen or resolve(path) == target:
            raise
    return import_exact(resolve(path))


@functools.lru_cache(maxsize=1024)
def import_exact(path: str) -> Any:
    """Import ``path`` itself, ignoring aliases (cached per path; see :func:`import_path`).

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


def forget_imports() -> None:
    """Forget the objects :func:`import_exact` cached (code changed on disk, in a test)."""
    import_exact.cache_clear()


# -- aliases ------------------------------------------------------------------------------------


def alias(old: str, new: str) -> None:
    """Resolve the stored handler path ``old`` to ``new`` from now on, in this process.

    Raises:
        ValueError: a path is not a dotted import path, ``old`` is ``new``, or the alias
            would close a loop with those already declared; nothing is changed.
    """
    global _table, _generation
    problem = alias_problem({**aliases(), old: new}, focus=old)
    if problem is not None:
        raise ValueError(f"queuety.alias({old!r}, {new!r}) is refused: {problem}")
    _declared[old] = new
    _table = None
    _generation += 1


def remove_alias(old: str) -> None:
    """Take back the alias of ``old`` declared by :func:`alias` (if any)."""
    global _table, _generation
    if _declared.pop(old, None) is not None:
        _table = None
        _generation += 1


def use_alias_source(source: Callable[[], Mapping[str, str]] | None) -> None:
    """Read the settings' aliases from ``source()`` (on first use, and after
    :func:`forget_aliases`); ``None``: none."""
    global _source
    _source = source
    forget_aliases()


def forget_aliases() -> None:
    """Read the settings' aliases again on next use (``QUEUETY`` changed)."""
    global _table, _generation
    _table = None
    _generation += 1


def aliases() -> dict[str, str]:
    """Return every alias in force, old path -> new path: the code's, then the settings'
    (which win for a path in both)."""
    global _table
    if _table is None:
        _table = {**_declared, **(dict(_source()) if _source is not None else {})}
    return _table


def resolve(path: str) -> str:
    """Return the path ``path`` is imported from: the end of its alias chain, or itself.

    Raises:
        ImportError: the chain comes back to a path it passed (a loop).
    """
    table = aliases()
    if path not in table:
        return path
    chain = [path]
    while chain[-1] in table:
        chain.append(table[chain[-1]])
        if chain[-1] in chain[:-1]:
            raise ImportError(f"The handler aliases of {path!r} loop: "
                              f"{' -> '.join(map(repr, chain))}.")
    return chain[-1]


def shown(path: str) -> str:
    """``path``, or ``old → new`` when it is aliased (what the admin shows of a handler)."""
    try:
        target = resolve(path)
    except ImportError:
        return f"{path} → (aliases loop)"
    return path if target == path else f"{path} → {target}"


def is_dotted(value: Any) -> bool:
    """Whether ``value`` reads as a dotted import path: identifiers joined by dots, at least
    a module and a name."""
    return isinstance(value, str) and value.count(".") >= 1 and all(
        part.isidentifier() for part in value.split("."))


def alias_problem(table: Any, *, focus: str | None = None) -> str | None:
    """Why ``table`` cannot be an alias table, in a full sentence, or None when it can.

    A table is a dict of dotted import paths to dotted import paths, none pointing to itself,
    no chain coming back to where it started. ``focus``: look for a loop from that path only.
    """
    if not isinstance(table, dict):
        return (f"aliases are a dict of old dotted paths to new ones, such as "
                f"{{'shop.steps.charge': 'shop.billing.charge'}} (got {type(table).__name__}).")
    for old, new in table.items():
        for path in (old, new):
            if not is_dotted(path):
                return (f"{path!r} is not a dotted import path (a module and a name, such as "
                        "'shop.steps.charge').")
        if old == new:
            return f"{old!r} is aliased to itself."
    for start in table if focus is None else [focus]:
        chain = [start]
        while chain[-1] in table:
            chain.append(table[chain[-1]])
            if chain[-1] == start:
                return f"the aliases loop: {' -> '.join(map(repr, chain))}."
            if chain[-1] in chain[:-1]:
                break  # a loop further on, reported from its own start
    return None
