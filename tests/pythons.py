"""Find the CPython interpreters the project supports (3.11, 3.12, 3.13) on this machine."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

SUPPORTED = ("3.11", "3.12", "3.13")


def find_python(version: str) -> str:
    """Return a path to a working ``python<version>``; raise with a fix when there is none."""
    candidates = [shutil.which(f"python{version}")]
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(f"{root}/versions/{version}*/bin/python{version}"),
                         reverse=True)
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version[:4])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip().startswith(version):
            return candidate
    raise RuntimeError(f"Python {version} was not found (tried PATH and {root}/versions). "
                       f"Install it, e.g. `pyenv install {version}`.")


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
