"""The README's Python examples run (stale examples are bugs)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README lost its examples"
    namespace: dict = {}
    exec(compile("\n".join(blocks), str(README), "exec"), namespace)  # noqa: S102


def test_readme_opens_with_the_two_setup_commands():
    lines = [ln for ln in README.read_text().splitlines() if ln.startswith("bash scripts/setup.sh")]
    assert lines[0].startswith("bash scripts/setup.sh && .venv/bin/millwheel run")
    assert lines[1].startswith("bash scripts/setup.sh --test && .venv/bin/python -m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh --test && .venv/bin/python -m pytest" in ci
