"""Differential test: the Zeitgeist topology in the harness and on local Spark give the same evaluation.

Both backends run the same per-key step (design.md, "One semantics, two backends") on the
same generated logs through ``millwheel.LogFileSource``. Spark is not paced, so only
delay-free figures are compared: detected events per kind, the dip records themselves
(they depend only on complete windows), duplicates, late records and dead letters.
Spike records may differ in which bucket first crosses the threshold: that depends on
when the model snapshot reaches ``SpikeDetector`` relative to the raw events.
"""

from __future__ import annotations

import pytest

from topologies.zeitgeist import build, evaluate, run_spark

pytestmark = pytest.mark.spark


def test_harness_and_spark_agree(tmp_path, sample, config, batch, truth, dips):
    spark = run_spark(build(sample, config=config), tmp_path / "run", timeout_s=600)
    rh, rs = evaluate(batch, truth), evaluate(spark, truth)

    for kind in ("spike", "dip"):
        assert rs["by_kind"][kind]["precision"] >= 0.95, rs["false_positives"]
        assert rs["by_kind"][kind]["recall"] >= 0.95, rs["missed"]
        assert rs["by_kind"][kind]["detected_events"] == rh["by_kind"][kind]["detected_events"]
    assert dips(spark) == dips(batch)
    assert rs["duplicates"]["seen_and_removed"]["WindowCounter"] == truth["duplicates_injected"]
    assert rs["late"]["dropped"] == rh["late"]["dropped"] == truth["late_injected"]
    # malformed lines reach the dead_letters stream on both backends, at their file and offset
    assert rs["dead_letters"] == rh["dead_letters"]
    assert rs["dead_letters"]["malformed_lines"] == truth["malformed_injected"]
    assert rs["dead_letters"]["every_malformed_line_dead_lettered"]
