"""docs/performance.md stays a page of current figures: short, each figure's results file
present, the dated history beside the results, and every link into it pointing somewhere."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERFORMANCE = ROOT / "docs" / "performance.md"
HISTORY = ROOT / "bench" / "results" / "HISTORY.md"
MAX_LINES = 400

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_RESULTS_FILE = re.compile(r"`(?:bench/results/)?([A-Za-z0-9][\w.-]*\.(?:json|txt|md))`")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {
        _slug(line.lstrip("#"))
        for line in doc.read_text(encoding="utf-8").splitlines()
        if re.match(r"#{1,6} ", line)
    }


def test_slug_is_githubs():
    assert _slug("Where a Photon run's time goes") == "where-a-photon-runs-time-goes"
    assert _slug("Why 0.6x is out of reach here (per record)") == (
        "why-06x-is-out-of-reach-here-per-record"
    )
    assert _slug("Injectors (§5.2, Fig. 10)") == "injectors-52-fig-10"


def test_performance_md_is_at_most_400_lines():
    n = len(PERFORMANCE.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, (
        f"docs/performance.md has {n} lines (at most {MAX_LINES}): it gives today's figures; "
        "move how they were reached to bench/results/HISTORY.md"
    )


def test_performance_md_links_its_history():
    assert HISTORY.is_file()
    assert "../bench/results/HISTORY.md" in PERFORMANCE.read_text(encoding="utf-8")


def test_every_results_file_performance_md_names_exists():
    """A figure's provenance is a file under bench/results/ (abbreviations such as
    ``_s11.json``, the tail of the file named just before, are not checked)."""
    text = PERFORMANCE.read_text(encoding="utf-8")
    names = set(_RESULTS_FILE.findall(text)) - {"HISTORY.md"}
    assert len(names) >= 20, sorted(names)
    results = ROOT / "bench" / "results"
    missing = sorted(n for n in names if not (results / n).is_file())
    assert missing == []


def test_relative_links_of_performance_and_history_resolve():
    bad = []
    for doc in (PERFORMANCE, HISTORY):
        for target in _LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("#"):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve()
            if not file.is_file():
                bad.append(f"{doc.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                bad.append(f"{doc.name}: {target} (no such heading)")
    assert bad == []


def test_every_link_into_performance_md_names_a_heading_of_it():
    """Other docs, the README and the code point at sections of docs/performance.md by anchor."""
    anchors = _anchors(PERFORMANCE)
    files = subprocess.run(
        ["git", "ls-files", "*.md", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    bad = []
    for name in files:
        path = ROOT / name
        if not path.is_file():
            continue
        for anchor in re.findall(r"performance\.md#([\w-]+)", path.read_text(encoding="utf-8")):
            if anchor not in anchors:
                bad.append(f"{name}: performance.md#{anchor}")
    assert bad == []
