"""The whole Zeitgeist topology replayed in the harness (topologies/zeitgeist/drivers.py), MillWheel §2, Fig. 1.

``continuous`` and ``batch`` (conftest) are replays of the 75 s ``sample`` with a 20 s "day".
"""

from __future__ import annotations

import pytest

from millwheel import SampleSource, Stage
from topologies.zeitgeist import build, evaluate, replay


@pytest.fixture(scope="module")
def report(continuous, truth):
    return evaluate(continuous, truth)


def test_precision_and_recall_of_injected_spikes_and_dips(report):
    for kind in ("spike", "dip"):
        e = report["by_kind"][kind]
        assert e["events"] == 3
        assert e["precision"] >= 0.95, (kind, report["false_positives"])
        assert e["recall"] >= 0.95, (kind, report["missed"])


def test_duplicates_removed_equal_duplicates_injected(report, truth):
    injected = truth["duplicates_injected"]
    assert injected > 0
    assert report["duplicates"]["seen_and_removed"] == {
        "WindowCounter": injected,
        "SpikeDetector": injected,
    }


def test_late_records_are_dropped_and_counted(report, truth):
    assert report["late"]["dropped"] == truth["late_injected"] > 0


@pytest.mark.parametrize("mode", ["continuous", "batch"])
def test_every_malformed_line_is_on_the_dead_letters_stream(mode, continuous, batch, truth):
    result = continuous if mode == "continuous" else batch
    assert {d["stage"] for d in result.dead_letters} == {Stage.MALFORMED}
    assert sorted((d["file"], d["offset"]) for d in result.dead_letters) == sorted(
        (m["file"], m["offset"]) for m in truth["malformed"]
    )
    dl = evaluate(result, truth)["dead_letters"]
    assert dl["malformed_lines"] == truth["malformed_injected"] == 6
    assert dl["every_malformed_line_dead_lettered"] and dl["other"] == 0


def test_dips_never_fire_before_the_low_watermark_passes_the_bucket(continuous, truth):
    dips = [a for a in continuous.anomalies if a["kind"] == "dip"]
    assert dips
    max_delay = truth["injector"]["max_delay_ms"]
    for a in dips:
        assert a["low_watermark"] >= a["window_end"], a
        # the injector watermark lags the (simulated) wall clock by at least the out-of-order bound
        assert a["detected_at"] >= a["window_end"] + max_delay, a


def test_spikes_fire_before_their_bucket_is_complete(continuous):
    spikes = [a for a in continuous.anomalies if a["kind"] == "spike"]
    assert spikes
    assert all(a["low_watermark"] < a["window_end"] for a in spikes)
    assert sum(a["detected_at"] < a["window_end"] for a in spikes) >= len(spikes) // 2


def test_dip_delay_target_in_continuous_mode(report):
    d = report["by_kind"]["dip"]["delay_beyond_bucket_end_ms"]
    assert d["p50"] is not None and d["p50"] <= 2_000


def test_batch_replay_gives_the_same_evaluation(batch, report, truth, dips, continuous):
    """Delivery timing must not change what is detected: dips are exactly the same records."""
    assert dips(batch) == dips(continuous)
    rb = evaluate(batch, truth)
    for kind in ("spike", "dip", "all"):
        assert rb["by_kind"][kind]["detected_events"] == report["by_kind"][kind]["detected_events"]
    assert rb["duplicates"] == report["duplicates"] and rb["late"] == report["late"]
    assert not batch.wall_clock and "delay_beyond_bucket_end_ms" not in rb["by_kind"]["dip"]


def test_replay_needs_a_log_directory_and_a_known_mode(sample, config):
    with pytest.raises(TypeError, match="LogFileSource"):
        replay(build(config=config, source=SampleSource([])))
    with pytest.raises(ValueError, match="'continuous' or 'batch'"):
        replay(build(sample, config=config), mode="paced")
