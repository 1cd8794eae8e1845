"""millwheel's cache directory on this machine: the class-data archive (``_cds.py``) and the
Spark home of local sessions (``_worker_home.py``) are built there once."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MILLWHEEL_CACHE_DIR"


def cache_dir() -> Path:
    """millwheel's cache: ``$MILLWHEEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/millwheel``, else ``~/.cache/millwheel``."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "millwheel"
    )
    return Path(base)
