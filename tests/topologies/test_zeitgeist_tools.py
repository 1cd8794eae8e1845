"""The Zeitgeist generator, loader and evaluation (topologies/zeitgeist_tools.py)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path

import pytest

from topologies.zeitgeist_tools import (
    GeneratorConfig,
    LogDirectorySource,
    RunResult,
    evaluate,
    generate,
    load_truth,
    main,
)

SMALL = GeneratorConfig(seed=3, duration_s=40, rate=300, queries=30, spikes=2, dips=2, warmup_s=12, anomaly_gap_s=3, late_fraction=5e-4, duplicate_fraction=0.01)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("zg")
    generate(d, SMALL)
    return d


def lines(d: Path) -> list[tuple[str, int, str]]:
    out = []
    for p in sorted((d / "logs").glob("queries_*.jsonl")):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            out.append((p.name, i, line))
    return out


def file_time(name: str) -> int:
    return int(name[len("queries_"):-len(".jsonl")])


def test_seeded(tmp_path, sample):
    generate(tmp_path, SMALL)
    assert [(n, t) for n, _, t in lines(tmp_path)] == [(n, t) for n, _, t in lines(sample)]
    assert load_truth(tmp_path) == load_truth(sample)


def test_lines_are_the_documented_json_and_files_rotate_by_time(sample):
    truth = load_truth(sample)
    names = sorted(p.name for p in (sample / "logs").glob("queries_*.jsonl"))
    assert len(names) == len(truth["files"]) >= SMALL.duration_s  # one file per second of arrival
    good = 0
    for _, _, text in lines(sample):
        try:
            v = json.loads(text)
        except ValueError:
            continue
        if isinstance(v.get("ts"), int):
            assert set(v) == {"id", "ts", "query"}
            good += 1
    assert good == truth["events"] + truth["duplicates_injected"]


def test_on_time_records_are_never_behind_their_files_time_and_late_ones_are_truly_late(sample):
    truth = load_truth(sample)
    late = {x["id"] for x in truth["late"]}
    assert len(late) == truth["late_injected"] > 0
    seen_late = 0
    dups = dup_ids(sample)
    for name, _, text in lines(sample):
        try:
            v = json.loads(text)
        except ValueError:
            continue
        if not isinstance(v.get("ts"), int):
            continue
        if v["id"] in late:
            seen_late += 1
            # written into a file whose time is past the record's whole bucket (§4.5)
            assert file_time(name) > v["ts"] // 1_000 * 1_000 + SMALL.window_ms
        else:
            assert v["ts"] >= file_time(name) or v["id"] in dups
    assert seen_late == len(late)


def dup_ids(d: Path) -> set[str]:
    c = Counter()
    for _, _, text in lines(d):
        with contextlib.suppress(ValueError, KeyError):
            c[json.loads(text)["id"]] += 1
    return {k for k, n in c.items() if n > 1}


def test_duplicates_are_the_same_line_again_after_the_original(sample):
    truth = load_truth(sample)
    first: dict[str, str] = {}
    dups = 0
    for _, _, text in lines(sample):
        try:
            rid = json.loads(text)["id"]
        except (ValueError, KeyError):
            continue
        if rid in first:
            assert first[rid] == text
            dups += 1
        else:
            first[rid] = text
    assert dups == truth["duplicates_injected"] > 0


def test_malformed_lines_are_where_the_ground_truth_says_and_the_loader_rejects_them(sample):
    truth = load_truth(sample)
    src = LogDirectorySource(sample)
    n = sum(len(b.records) for b in src.batches())
    assert n == truth["lines"] - truth["malformed_injected"]
    assert {(m["file"], m["line"]) for m in src.malformed} == {(m["file"], m["line"]) for m in truth["malformed"]}
    assert {m["kind"] for m in truth["malformed"]} == {"broken_json", "missing_ts", "non_integer_ts"}


def test_loader_watermark_is_the_oldest_unfinished_files_time(sample):
    src = LogDirectorySource(sample)
    times = [f.time_ms for f in src.files()]
    wms = [b.low_watermark for b in src.batches()]
    assert wms[:-1] == times[1:]


def test_anomalies_are_on_popular_queries_after_the_warmup(sample):
    truth = load_truth(sample)
    rates = {q["query"]: q["rate"] for q in truth["queries"]}
    assert Counter(a["kind"] for a in truth["anomalies"]) == {"spike": 2, "dip": 2}
    for a in truth["anomalies"]:
        assert a["start_ms"] >= SMALL.start_ms + SMALL.warmup_s * 1_000
        assert rates[a["query"]] * (1 - SMALL.season_amplitude) >= SMALL.anomaly_min_rate


def _anomaly(q, kind, start, detected):
    return {"query": q, "kind": kind, "window_start": start, "window_end": start + 1_000, "detected_at": detected, "actual": 0, "expected": 1.0}


def test_evaluation_rule():
    truth = {
        "anomalies": [
            {"query": "a", "kind": "spike", "start_ms": 10_000, "end_ms": 14_000},
            {"query": "b", "kind": "dip", "start_ms": 10_000, "end_ms": 14_000},
            {"query": "c", "kind": "dip", "start_ms": 30_000, "end_ms": 34_000},
        ],
        "duplicates_injected": 2,
        "late_injected": 1,
        "malformed_injected": 1,
        "malformed": [{"file": "f", "line": 3}],
    }
    anomalies = [
        _anomaly("a", "spike", 11_000, 11_500),
        _anomaly("a", "spike", 14_000, 14_200),  # within the 1 s tolerance after the end
        _anomaly("b", "dip", 11_000, 13_000),
        _anomaly("b", "spike", 11_000, 11_200),  # wrong kind: false positive
        _anomaly("c", "dip", 36_000, 38_000),  # too far after the event: false positive; c is missed
    ]
    metrics = {"WindowCounter": {"records_in": 1_003, "duplicates": 2, "late_dropped": 1}}
    dead = [{"stage": "malformed_line", "file": "f", "line": 3}]
    r = evaluate(RunResult(anomalies, metrics, dead, wall_clock=True), truth)
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
    assert r["dead_letters"]["every_malformed_line_dead_lettered"] is True


def test_cli_generate_and_evaluate(tmp_path, capsys):
    d = tmp_path / "data"
    assert main(["generate", str(d), "--seed", "5", "--duration-s", "30", "--rate", "200", "--queries", "20", "--spikes", "0", "--dips", "0"]) == 0
    assert "wrote" in capsys.readouterr().out
    (tmp_path / "anomalies.jsonl").write_text("")
    assert main(["evaluate", str(d), str(tmp_path / "anomalies.jsonl"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["anomalies"] == 0 and report["events"] == 0
