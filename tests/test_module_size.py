"""No module of the packages grows past 600 lines: a module that long holds more than one
concept, and splits along them (as ``watermark_authority/_core.py`` did into its state,
checks and percentiles, and ``millwheel/_logfile.py`` into its parser and reading plan)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [
    "millwheel",
    "computations",
    "topologies",
    "watermark_authority",
    "id_registry",
    "servicekit",
    "faults",
]
MAX_LINES = 600


def test_no_module_is_over_600_lines():
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
    }
    over = {name: n for name, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, (
        f"modules over {MAX_LINES} lines: {over}; split each by responsibility, re-exporting what other modules import"
    )
