"""No committed file carries a path of the machine it was written on.

Results files, docs and notes are read on other machines: a path such as a home directory, a
workspace, a pytest temporary directory or a scratch directory under ``/tmp`` says nothing
there and leaks how one machine was laid out. Paths are written relative to the repository
(``bench/results/x.json``, ``.millwheel/bench``) or as placeholders (``<a checkout>``).

Two rules, over every file ``git ls-files`` lists that is text:

* anywhere: a home or workspace directory (``/home/<user>/``, ``/Users/<user>/``, ``/root/``,
  ``/work/``, ``C:\\Users\\``), a pytest or macOS temporary directory, or a relative path that
  climbs out of the repository into ``tmp/`` or the helpers' ``shared/`` folder;
* in data and prose (not code): any absolute ``/tmp/`` path. Code may name one as a default
  or in a docstring's example (a lock file, a scratch directory a bench makes), since code
  runs on the machine it names; a doc's example is written relative (``zg-small``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: not preceded by a character that would make it part of a longer path or a URL
_START = r"(?<![\w.~/-])"
ANYWHERE = re.compile(
    "|".join(
        [
            _START + r"/home/[^/\s\"'`]+/",
            _START + r"/Users/[^/\s\"'`]+/",
            _START + r"/root/",
            _START + r"/work/",
            r"(?i:\b[a-z]:\\{1,2}users\\)",
            r"/tmp/pytest-of-",
            r"/(?:private/)?var/folders/",
            r"(?:\.\./)+(?:tmp|shared)/",
        ]
    )
)
TMP = re.compile(_START + r"/tmp/")
CODE = {".py", ".sh", ".js", ".typed"}


def _tracked_text_files() -> list[tuple[str, str]]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = []
    for raw in names:
        name = raw.decode()
        path = ROOT / name
        if not name or not path.is_file() or path == Path(__file__).resolve():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        files.append((name, data.decode("utf-8", errors="replace")))
    return files


def _hits(name: str, text: str) -> list[str]:
    code = Path(name).suffix in CODE or name.startswith(".ci/")
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in ANYWHERE.finditer(line):
            found.append(f"{name}:{n}: {m.group(0)!r} in {line.strip()[:120]!r}")
        if not code:
            for m in TMP.finditer(line):
                found.append(f"{name}:{n}: {m.group(0)!r} in {line.strip()[:120]!r}")
    return found


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("bench/results/x.json", '"work": "/work/main/.millwheel/bench"'),
        ("bench/results/x.json", '"checkout": "../../tmp/fo/base"'),
        ("bench/results/x.json", '"out": "/tmp/b/lat_base.json"'),
        ("bench/results/x.txt", "== /tmp/ab_main_1.log"),
        ("docs/x.md", '`build("/tmp/zg-small")`'),
        ("docs/x.md", "see ../shared/design.md"),
        ("tests/x.py", 'p = "/home/alice/src/millwheel"'),
        ("tests/x.py", "'/tmp/pytest-of-root/pytest-3/test_a0'"),
        ("README.md", r"C:\Users\bob\millwheel"),
        ("README.md", "/Users/bob/millwheel"),
        ("bench/x.py", "/root/.cache/x"),
    ],
)
def test_a_machine_path_is_found(name, line):
    assert _hits(name, line)


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("bench/x.py", 'p.add_argument("--lock", default="/tmp/millwheel-spark.lock")'),
        ("bench/results/x.json", '"work": ".millwheel/bench", "out": "bench/results/x.json"'),
        ("docs/x.md", "`millwheel zeitgeist generate zg-small`"),
        ("docs/x.md", "https://example.org/work/home/root/ and hdfs:///runs/t"),
        ("docs/x.md", "the service's `/v1/watermarks` endpoint, `$TMPDIR/x`"),
        ("bench/results/x.json", '"checkout": "<a checkout outside the repository>"'),
    ],
)
def test_what_is_not_a_machine_path(name, line):
    assert _hits(name, line) == []


def test_no_tracked_file_carries_a_machine_path():
    files = _tracked_text_files()
    assert len(files) > 100  # the scan saw the repository
    hits = [hit for name, text in files for hit in _hits(name, text)]
    assert hits == [], "\n".join(hits)
