"""The CPython versions the project supports, and the project venv for each."""

from __future__ import annotations

SUPPORTED = ("3.11", "3.12", "3.13")


def venv_python(version: str) -> str:
    """Return the interpreter of the project venv for ``version`` (made by ``./dev test``)."""
    import sys
    from pathlib import Path

    if sys.version.startswith(version + "."):
        return sys.executable
    path = Path(__file__).resolve().parents[1] / f".venv-{version}" / "bin" / "python"
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run the suite with ./dev test, which creates a "
                           f"virtualenv for every supported Python ({', '.join(SUPPORTED)}).")
    return str(path)
