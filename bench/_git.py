"""The commit a checkout is at, as the benches write it beside their figures (no machine path)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_head(checkout: Path, *, dirty: bool = False) -> str | None:
    """``checkout``'s short commit (``None``: not a git checkout); with ``dirty``, a ``+`` when
    its tracked files differ from that commit."""
    git = ["git", "-C", str(checkout)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    if dirty and subprocess.run([*git, "diff", "--quiet", "HEAD"], capture_output=True).returncode:
        head += "+"
    return head
