"""The code is formatted by ``ruff format`` and passes ``ruff check``, both configured in
``pyproject.toml``; CI fails on a file either would change. ``ruff format .`` fixes the first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("ruff")


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_code_is_formatted():
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, f"run `ruff format .`:\n{done.stdout}{done.stderr}"


def test_code_passes_the_linter():
    done = _ruff("check", ".")
    assert done.returncode == 0, done.stdout + done.stderr
