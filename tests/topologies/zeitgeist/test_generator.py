"""The Zeitgeist generator (topologies/zeitgeist/generator.py): seeded logs, and the ground truth they match."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import Counter
from pathlib import Path

from millwheel import LogFileSource, Stage, file_time
from topologies.zeitgeist import generate, load_truth, logs_dir


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(d)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_seeded_and_unchanged(tmp_path, small, small_config):
    generate(tmp_path, small_config)
    assert _digest(tmp_path) == _digest(small)
    # the bytes written before the package split (docs/zeitgeist.md quotes figures of these samples)
    assert _digest(small)[:16] == "7474e618efe5e899"


def test_lines_are_the_documented_json_and_files_rotate_by_time(small, small_config, log_lines):
    truth = load_truth(small)
    names = sorted(p.name for p in (small / "logs").glob("queries_*.jsonl"))
    assert (
        len(names) == len(truth["files"]) >= small_config.duration_s
    )  # one file per second of arrival
    good = 0
    for _, _, text in log_lines(small):
        try:
            v = json.loads(text)
        except ValueError:
            continue
        if isinstance(v.get("ts"), int):
            assert set(v) == {"id", "ts", "query"}
            good += 1
    assert good == truth["events"] + truth["duplicates_injected"]


def _duplicate_ids(lines: list[tuple[str, int, str]]) -> set[str]:
    c: Counter[str] = Counter()
    for _, _, text in lines:
        with contextlib.suppress(ValueError, KeyError):
            c[json.loads(text)["id"]] += 1
    return {k for k, n in c.items() if n > 1}


def test_on_time_records_are_never_behind_their_files_time_and_late_ones_are_truly_late(
    small, small_config, log_lines
):
    truth = load_truth(small)
    late = {x["id"] for x in truth["late"]}
    assert len(late) == truth["late_injected"] > 0
    seen_late = 0
    lines = log_lines(small)
    dups = _duplicate_ids(lines)
    for name, _, text in lines:
        try:
            v = json.loads(text)
        except ValueError:
            continue
        if not isinstance(v.get("ts"), int):
            continue
        if v["id"] in late:
            seen_late += 1
            # written into a file whose time is past the record's whole bucket (§4.5)
            assert file_time(name) > v["ts"] // 1_000 * 1_000 + small_config.window_ms
        else:
            assert v["ts"] >= file_time(name) or v["id"] in dups
    assert seen_late == len(late)


def test_duplicates_are_the_same_line_again_after_the_original(small, log_lines):
    first: dict[str, str] = {}
    dups = 0
    for _, _, text in log_lines(small):
        try:
            rid = json.loads(text)["id"]
        except (ValueError, KeyError):
            continue
        if rid in first:
            assert first[rid] == text
            dups += 1
        else:
            first[rid] = text
    assert dups == load_truth(small)["duplicates_injected"] > 0


def test_malformed_lines_are_where_the_ground_truth_says_and_the_file_source_dead_letters_them(
    small, log_lines
):
    truth = load_truth(small)
    by_line = {(name, i): text for name, i, text in log_lines(small)}
    for m in truth["malformed"]:
        assert f'"{m["id"]}"' in by_line[(m["file"], m["line"])]
    assert {m["kind"] for m in truth["malformed"]} == {
        "broken_json",
        "missing_ts",
        "non_integer_ts",
    }
    batches = list(LogFileSource(logs_dir(small), finite=True).batches("queries", "queries"))
    assert sum(len(b.records) for b in batches) == truth["lines"] - truth["malformed_injected"]
    dead = [r.value for b in batches for r in b.dead_letters]
    assert {d.stage for d in dead} == {Stage.MALFORMED}
    assert sorted((d.file, d.offset) for d in dead) == sorted(
        (m["file"], m["offset"]) for m in truth["malformed"]
    )


def test_file_times_are_the_file_sources_watermarks(small):
    """A file's time (name and ground truth) is the low watermark its records are sent under (Fig. 10)."""
    truth = load_truth(small)
    sent_under = [
        b.low_watermark for b in LogFileSource(logs_dir(small), finite=True).batches() if b.records
    ]
    assert (
        sent_under
        == [f["time_ms"] for f in truth["files"]]
        == [file_time(f["name"]) for f in truth["files"]]
    )


def test_anomalies_are_on_popular_queries_after_the_warmup(small, small_config):
    truth = load_truth(small)
    rates = {q["query"]: q["rate"] for q in truth["queries"]}
    assert Counter(a["kind"] for a in truth["anomalies"]) == {"spike": 2, "dip": 2}
    for a in truth["anomalies"]:
        assert a["start_ms"] >= small_config.start_ms + small_config.warmup_s * 1_000
        assert (
            rates[a["query"]] * (1 - small_config.season_amplitude) >= small_config.anomaly_min_rate
        )
