"""The Zeitgeist evaluation rules (topologies/zeitgeist/evaluation.py), on hand-made runs."""

from __future__ import annotations

import pytest

from topologies.zeitgeist import RunResult, evaluate, load_truth, render

TRUTH = {
    "anomalies": [
        {"query": "a", "kind": "spike", "start_ms": 10_000, "end_ms": 14_000},
        {"query": "b", "kind": "dip", "start_ms": 10_000, "end_ms": 14_000},
        {"query": "c", "kind": "dip", "start_ms": 30_000, "end_ms": 34_000},
    ],
    "duplicates_injected": 2,
    "late_injected": 1,
    "malformed_injected": 2,
    "malformed": [{"file": "f", "line": 3, "offset": 120}, {"file": "g", "line": 1, "offset": 0}],
}
METRICS = {"WindowCounter": {"records_in": 1_003, "duplicates": 2, "late_dropped": 1}}


def _anomaly(q, kind, start, detected):
    return {
        "query": q,
        "kind": kind,
        "window_start": start,
        "window_end": start + 1_000,
        "detected_at": detected,
        "actual": 0,
        "expected": 1.0,
    }


def _malformed(file, offset):
    return {"stage": "malformed_line", "file": file, "offset": offset}


def test_matching_precision_recall_and_delays():
    anomalies = [
        _anomaly("a", "spike", 11_000, 11_500),
        _anomaly("a", "spike", 14_000, 14_200),  # within the 1 s tolerance after the end
        _anomaly("b", "dip", 11_000, 13_000),
        _anomaly("b", "spike", 11_000, 11_200),  # wrong kind: false positive
        _anomaly(
            "c", "dip", 36_000, 38_000
        ),  # too far after the event: false positive; c is missed
    ]
    r = evaluate(RunResult(anomalies, METRICS, [], wall_clock=True), TRUTH)
    spike, dip, all_ = (r["by_kind"][k] for k in ("spike", "dip", "all"))
    assert (spike["precision"], spike["recall"]) == (2 / 3, 1.0)
    assert (dip["precision"], dip["recall"]) == (1 / 2, 1 / 2)
    assert (all_["precision"], all_["recall"]) == (3 / 5, 2 / 3)
    assert spike["delay_beyond_bucket_end_ms"]["p50"] == -800  # nearest rank of [-800, -500]
    assert dip["delay_beyond_bucket_end_ms"]["p50"] == 1_000
    assert dip["first_detection_after_start_ms"]["p50"] == 3_000
    assert [m["query"] for m in r["missed"]] == ["c"]
    assert r["late"]["fraction"] == 1 / 1_001
    assert r["duplicates"]["seen_and_removed"]["WindowCounter"] == 2


def test_no_delay_figures_without_a_wall_clock():
    r = evaluate(
        RunResult([_anomaly("a", "spike", 11_000, 11_500)], METRICS, [], wall_clock=False), TRUTH
    )
    assert "delay_beyond_bucket_end_ms" not in r["by_kind"]["spike"]
    assert "delay beyond bucket end" not in render(r)


@pytest.mark.parametrize(
    ("dead", "accounted", "other"),
    [
        ([_malformed("f", 120), _malformed("g", 0)], True, 0),
        ([_malformed("f", 120), _malformed("g", 7)], False, 0),  # found by (file, byte offset) only
        (
            [
                _malformed("f", 120),
                _malformed("g", 0),
                {"stage": "process_record", "reason": "boom"},
            ],
            True,
            1,
        ),
    ],
)
def test_every_malformed_line_must_be_a_dead_letter_at_its_file_and_offset(dead, accounted, other):
    r = evaluate(RunResult([], METRICS, dead, wall_clock=False), TRUTH)["dead_letters"]
    assert r["malformed_lines"] == 2 and r["malformed_injected"] == 2
    assert r["every_malformed_line_dead_lettered"] is accounted
    assert r["other"] == other


def test_truth_is_found_from_the_sample_or_its_logs(small):
    assert load_truth(small) == load_truth(small / "logs")


def test_a_missing_truth_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="millwheel zeitgeist generate"):
        load_truth(tmp_path)
