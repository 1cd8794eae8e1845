"""Zeitgeist samples, settings and runs shared by the tests of ``topologies/zeitgeist/``.

Two generated samples: ``small`` (40 s, for the generator and the CLI) and ``sample``
(75 s with a 20 s "day", for whole runs), with the topology settings that match it.
Runs are session-scoped: each is made once and read by several test modules.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from topologies.zeitgeist import (
    GeneratorConfig,
    RunResult,
    ZeitgeistConfig,
    build,
    generate,
    replay,
)


@pytest.fixture(scope="session")
def small_config() -> GeneratorConfig:
    return GeneratorConfig(
        seed=3,
        duration_s=40,
        rate=300,
        queries=30,
        spikes=2,
        dips=2,
        warmup_s=12,
        anomaly_gap_s=3,
        late_fraction=5e-4,
        duplicate_fraction=0.01,
    )


def _generated(tmp_path_factory, cfg: GeneratorConfig) -> Path:
    d = tmp_path_factory.mktemp(f"zeitgeist-{cfg.seed}")
    generate(d, cfg)
    return d


@pytest.fixture(scope="session")
def small(tmp_path_factory, small_config) -> Path:
    return _generated(tmp_path_factory, small_config)


@pytest.fixture(scope="session")
def sample_config() -> GeneratorConfig:
    return GeneratorConfig(
        seed=11,
        duration_s=75,
        rate=200,
        queries=40,
        day_s=20,
        warmup_s=25,
        spikes=3,
        dips=3,
        anomaly_gap_s=4,
        late_fraction=2e-4,
        duplicate_fraction=0.005,
    )


@pytest.fixture(scope="session")
def config() -> ZeitgeistConfig:
    """The topology settings for ``sample``'s 20 s "day"."""
    return ZeitgeistConfig(day_ms=20_000, slot_ms=2_000)


@pytest.fixture(scope="session")
def sample(tmp_path_factory, sample_config) -> Path:
    return _generated(tmp_path_factory, sample_config)


@pytest.fixture(scope="session")
def truth(sample) -> dict:
    return json.loads((sample / "ground_truth.json").read_text())


@pytest.fixture(scope="session")
def continuous(sample, config) -> RunResult:
    return replay(build(sample, config=config), mode="continuous")


@pytest.fixture(scope="session")
def batch(sample, config) -> RunResult:
    return replay(build(sample, config=config), mode="batch")


@pytest.fixture(scope="session")
def log_lines() -> Callable[[Path], list[tuple[str, int, str]]]:
    """``log_lines(sample)``: ``(file name, line number, text)`` of every line of a sample's logs."""

    def read(d: Path) -> list[tuple[str, int, str]]:
        out = []
        for p in sorted((d / "logs").glob("queries_*.jsonl")):
            out += [(p.name, i, line) for i, line in enumerate(p.read_text().splitlines(), 1)]
        return out

    return read


@pytest.fixture(scope="session")
def dips() -> Callable[[RunResult], list[dict]]:
    """``dips(result)``: its dip records without the wall-time fields, in (query, bucket) order.

    Dips depend only on complete windows, so every backend and mode must agree on them.
    """

    def strip(result: RunResult) -> list[dict]:
        found = [
            {k: v for k, v in a.items() if k not in ("detected_at", "low_watermark")}
            for a in result.anomalies
            if a["kind"] == "dip"
        ]
        return sorted(found, key=lambda a: (a["query"], a["window_start"]))

    return strip
