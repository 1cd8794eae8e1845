"""Differential test: the Zeitgeist topology in the harness and on local Spark give the same evaluation.

Both backends run the same per-key step (docs/architecture.md, "One semantics, two backends") on the
same generated logs through the runtime's ``LogFileSource``. Spark is not paced, so only
delay-free figures are compared: detected events per kind, the dip records themselves
(they depend only on complete windows), duplicates, late records and dead letters.
Spike records may differ in which bucket first crosses the threshold: that depends on
when the model snapshot reaches ``SpikeDetector`` relative to the raw events.
"""

from __future__ import annotations

import pytest

from topologies.zeitgeist import ZeitgeistConfig, build
from topologies.zeitgeist_tools import (
    GeneratorConfig,
    evaluate,
    generate,
    load_truth,
    logs_dir,
    replay,
    run_spark,
)

pytestmark = pytest.mark.spark

from millwheel import LogFileSource  # noqa: E402

GEN = GeneratorConfig(
    seed=11, duration_s=75, rate=400, queries=40, day_s=20, warmup_s=25, spikes=3, dips=3,
    anomaly_gap_s=4, late_fraction=2e-4, duplicate_fraction=0.005,
)
CFG = ZeitgeistConfig(day_ms=20_000, slot_ms=2_000)


def _strip(a):
    return {k: v for k, v in a.items() if k not in ("detected_at", "low_watermark")}


def _dips(result):
    return sorted((_strip(a) for a in result.anomalies if a["kind"] == "dip"), key=lambda a: (a["query"], a["window_start"]))


def test_harness_and_spark_agree(tmp_path):
    data = tmp_path / "data"
    truth = generate(data, GEN)

    def topology():
        return build(data, config=CFG, source=LogFileSource(logs_dir(data), finite=True))

    harness = replay(topology(), mode="batch")
    spark = run_spark(topology(), tmp_path / "run", timeout_s=600)
    rh, rs = evaluate(harness, truth), evaluate(spark, load_truth(data))

    for kind in ("spike", "dip"):
        assert rs["by_kind"][kind]["precision"] >= 0.95, rs["false_positives"]
        assert rs["by_kind"][kind]["recall"] >= 0.95, rs["missed"]
        assert rs["by_kind"][kind]["detected_events"] == rh["by_kind"][kind]["detected_events"]
    assert _dips(spark) == _dips(harness)
    assert rs["duplicates"]["injected"] == truth["duplicates_injected"]
    assert rs["duplicates"]["seen_and_removed"]["WindowCounter"] == truth["duplicates_injected"]
    assert rs["late"]["dropped"] == rh["late"]["dropped"] == truth["late_injected"]
    # on Spark the file source publishes malformed lines to the dead_letters stream itself
    assert rs["dead_letters"]["malformed_lines"] == truth["malformed_injected"]
    assert rs["dead_letters"]["every_malformed_line_dead_lettered"]
