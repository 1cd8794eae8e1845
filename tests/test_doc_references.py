"""Every dotted ``millwheel.…`` name the docs give in code resolves: a module, or a name in one."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from millwheel.cli import COMMAND_GROUP

ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"`(millwheel(?:\.[A-Za-z_]\w*)+)`")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_millwheel_name_in_the_docs_resolves():
    bad = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for name in _NAME.findall(line):
                if name != COMMAND_GROUP and not _resolves(name):
                    bad.append(f"{doc.relative_to(ROOT)}:{n}: {name}")
    assert bad == []


def test_runtime_md_says_where_a_files_time_comes_from_as_the_code_does():
    """A file's time is in its name or it has none (``file_time``; docs/concepts.md, "Log files"):
    it never comes from a record."""
    from millwheel._logfile import LogFileSource, plan_offset
    from millwheel._logplan import initial_offset

    text = " ".join((ROOT / "docs" / "runtime.md").read_text(encoding="utf-8").split())
    assert "first line's timestamp" not in text
    assert "A file's time comes from its name" in text
    import tempfile

    d = tempfile.mkdtemp()
    Path(d, "part-0003.jsonl").write_text('{"id": "a", "ts": 1700000000000}\n')
    end = plan_offset(initial_offset(), LogFileSource(d, finite=True).read_options, now_ms=0)
    assert end["files"]["part-0003.jsonl"]["time"] is None
