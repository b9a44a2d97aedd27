"""Files that ship inside installed PyPI packages (real models the tests check against),
located without importing the package: some import torch or cv2 at import time."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def package_dir(package: str) -> Path | None:
    """The installed package's folder, or None when it is not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_file(package: str, relative: str, *, env: str | None = None) -> Path | None:
    """The file `relative` inside the installed package, or None when either is missing;
    the environment variable `env`, when set, names the file instead."""
    if env is not None and os.environ.get(env):
        return Path(os.environ[env])
    root = package_dir(package)
    path = root / relative if root is not None else None
    return path if path is not None and path.exists() else None
