"""docs/runtime.md's module map names every module of ``millwheel/runtime/`` (its
subpackages' as ``plans/x.py``), and no module that does not exist: a module added, moved
or removed is a row of the map changed in the same commit."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "millwheel" / "runtime"
DOC = ROOT / "docs" / "runtime.md"


def mapped(text: str) -> set[str]:
    """The modules the map's table names: the first cell of each row after ``| module | what |``."""
    lines = text.splitlines()
    start = lines.index("| module | what |")
    names: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        names |= set(re.findall(r"`([\w/]+\.py)`", first))
    return names


def modules() -> set[str]:
    return {
        p.relative_to(RUNTIME).as_posix()
        for p in RUNTIME.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def test_the_map_reads_a_table():
    names = mapped(DOC.read_text())
    assert {"_query.py", "plans/_choice.py"} <= names  # the parser sees both kinds of row


def test_every_runtime_module_is_in_the_map_and_every_mapped_one_exists():
    names, present = mapped(DOC.read_text()), modules()
    assert not present - names, (
        f"modules missing from docs/runtime.md's map: {sorted(present - names)}"
    )
    assert not names - present, (
        f"docs/runtime.md's map names modules that do not exist: {sorted(names - present)}"
    )


def test_the_check_fails_on_a_missing_or_a_stale_row():
    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `_query.py` |"))
    assert "_query.py" not in mapped(text.replace(row + "\n", ""))
    stale = text.replace(row, row.replace("`_query.py`", "`_query.py`, `_gone.py`"))
    assert "_gone.py" in mapped(stale) - modules()
