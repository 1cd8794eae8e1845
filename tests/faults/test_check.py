"""The checker's own tests: it passes a correct run directory and catches each planted violation.

The run directory is built here without Spark, file by file in the runtime's layout
(stream-log files named after their micro-batch, commit logs, the file-source logs that say
which batch consumed which file, the audit trail), from the ledger's known answer. Each test
then plants one fault — a duplicate, a loss, a regressed watermark, an early timer, output
from an uncommitted batch, a broken sequence — and the checker must name it.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict

import pytest

from faults.check import check_run, expected
from faults.ledger import LEDGER, WINDOW_MS, WINDOWS, write_input
from millwheel import DEAD_LETTER_STREAM, Record
from millwheel._deadletter import malformed_line
from millwheel.runtime._fs import Location
from millwheel.runtime._streams import FileStreamLog

JOB = "0b1c2d3e-0000-4000-8000-{:012d}"


def _tag(batch: int, job: int = 0) -> str:
    return f"b{batch:010d}-part-00000-{JOB.format(job)}_c000_snappy"


def _commit(root, query, *batches):
    d = root / "checkpoints" / query / "commits"
    d.mkdir(parents=True, exist_ok=True)
    for b in batches:
        (d / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def _consumed(root, query, batch, files):
    """Query ``query``'s batch ``batch`` consumed ``files`` (paths) from its source 1 (source 0: heartbeats)."""
    cp = root / "checkpoints" / query
    (cp / "sources" / "1").mkdir(parents=True, exist_ok=True)
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1"] + [
        json.dumps({"path": f"file://{p}", "timestamp": 0, "batchId": batch}) for p in files
    ]
    (cp / "sources" / "1" / str(batch)).write_text("\n".join(lines) + "\n")
    (cp / "offsets" / str(batch)).write_text(
        f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{batch}}}\n{{"logOffset":{batch}}}\n'
    )


def _audit(root, name, *entries):
    path = root / "audit" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")


def build_run(tmp_path, n=3_000, seed=5):
    """A correct ledger run: queries in two injector batches, windows and ledger one batch each."""
    data, root = tmp_path / "data", tmp_path / "run"
    write_input(data, n, seed=seed, files=3, keys=40)
    exp = expected(str(data))
    log = FileStreamLog(Location.of(str(root)))
    for stream, producer in (
        ("queries", "queries"),
        (WINDOWS, "LedgerWindow"),
        (LEDGER, "LedgerTally"),
        (DEAD_LETTER_STREAM, "queries"),
    ):
        log.ensure(stream, producer)
    # the injector: valid records in two batches by file (late ones too: the step drops them)
    recs = sorted(exp.records.items(), key=lambda kv: kv[1][1])
    half = len(recs) // 2
    files = []
    for b, part in enumerate((recs[:half], recs[half:])):
        log.append(
            "queries",
            "queries",
            _tag(b),
            [Record(None, {"query": q}, w, rid) for rid, (q, w, _) in part],
        )
        files += [
            root / "streams" / "queries" / "queries" / n
            for n in log.files("queries", "queries")
            if n.startswith(f"b{b:010d}")
        ]
    letters = [
        malformed_line("queries", "queries", f, o, "broken", b"x", 1)
        for f, o in sorted(exp.malformed)
    ]
    log.append(DEAD_LETTER_STREAM, "queries", _tag(0), letters)
    _commit(root, "injector.queries", 0, 1)
    # LedgerWindow: one window record per (query, window), numbered per query in time order
    windows = defaultdict(list)
    for rid, (q, w, late) in exp.records.items():
        if not late:
            windows[(q, w)].append(rid)
    seq = defaultdict(int)
    out = []
    for (q, w), ids in sorted(windows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        v = {
            "key": q,
            "window_start": w,
            "ids": sorted(ids),
            "seq": seq[q],
            "fired_lw": w + WINDOW_MS,
        }
        seq[q] += 1
        out.append(Record(q, v, w + WINDOW_MS, f"w-{q}-{w}"))
    log.append(WINDOWS, "LedgerWindow", _tag(1), out)
    _commit(root, "LedgerWindow", 0, 1)
    _consumed(root, "LedgerWindow", 0, files[:1])
    _consumed(root, "LedgerWindow", 1, files[1:])
    # LedgerTally: each window re-emitted, numbered per window
    tseq = defaultdict(int)
    ledger = []
    for r in out:
        v = dict(r.value)
        w = v["window_start"]
        ledger.append(
            Record(w, {**v, "window_seq": v["seq"], "seq": tseq[w]}, r.timestamp, f"t-{r.id}")
        )
        tseq[w] += 1
    log.append(LEDGER, "LedgerTally", _tag(0), ledger)
    _commit(root, "LedgerTally", 0)
    lates = sum(1 for *_, late in exp.records.values() if late)
    (root / "tallies").mkdir(parents=True, exist_ok=True)
    (root / "tallies" / "LedgerWindow.json").write_text(
        json.dumps({"published": 1, "written_by_stream": {}, "metrics": {"late_dropped": lates}})
    )
    first = min(w for _, w, _ in exp.records.values())
    _audit(
        root,
        "watermarks.jsonl",
        {"name": "LedgerWindow", "lw": first, "t0": 1, "t1": 2, "pid": 1},
        {"name": "LedgerWindow", "lw": first + 1_000, "t0": 3, "t1": 4, "pid": 1},
    )
    _audit(
        root,
        "batches/LedgerWindow.jsonl",
        {"batch": 0, "lw": -(2**63), "fired": 0, "epoch": 1},
        {"batch": 1, "lw": first + WINDOW_MS, "fired": 3, "epoch": 1},
    )
    return root, data


def _ledger_file(root):
    d = root / "streams" / LEDGER / "LedgerTally"
    return d / sorted(p.name for p in d.iterdir())[0]


@pytest.fixture
def run(tmp_path):
    return build_run(tmp_path)


def test_a_correct_run_is_clean(run):
    root, data = run
    report = check_run(str(root), str(data))
    print(report.text())
    assert report.clean, report.text()
    assert (
        report.inputs > 2_900
        and report.outputs > 0
        and report.late_planted > 0
        and report.malformed > 0
    )
    assert report.batches_checked == 2 and report.watermark_reads == 2


def test_catches_a_planted_duplicate(run):
    """A second attempt's copy of a published batch: its ids counted twice, the batch published twice."""
    root, data = run
    src = _ledger_file(root)
    shutil.copy(src, src.with_name(src.name.replace(JOB.format(0), JOB.format(1))))
    report = check_run(str(root), str(data))
    assert not report.clean
    assert report.duplicated and report.double_published, report.text()
    assert "LedgerTally batch 0" in report.double_published[0]


def test_catches_a_planted_loss(run):
    """One id removed from one ledger record: lost, and unseen beyond the counted drops."""
    import pyarrow.parquet as pq

    from millwheel._codec import decode_value, encode_value

    root, data = run
    path = _ledger_file(root)
    table = pq.read_table(path).to_pydict()
    v = decode_value(table["value"][0])
    gone = v["ids"].pop()
    table["value"][0] = encode_value(v)
    import pyarrow as pa

    pq.write_table(pa.table(table, schema=pq.read_schema(path)), path)
    report = check_run(str(root), str(data))
    assert [x for x in report.lost if gone in x], report.text()
    assert report.unseen == 1 and not report.duplicated


def test_catches_a_regressed_watermark(run):
    """A read that began after another ended saw a lower published low watermark."""
    root, data = run
    _audit(
        root, "watermarks.jsonl", {"name": "LedgerWindow", "lw": 5, "t0": 10, "t1": 11, "pid": 2}
    )
    report = check_run(str(root), str(data))
    assert len(report.watermark_regressions) == 1, report.text()
    assert "read 5 (pid 2)" in report.watermark_regressions[0]


def test_overlapping_reads_are_not_a_regression(run):
    """Two drivers' reads that overlap in time are not ordered: no regression."""
    root, data = run
    _audit(root, "watermarks.jsonl", {"name": "LedgerWindow", "lw": 5, "t0": 2, "t1": 11, "pid": 2})
    assert not check_run(str(root), str(data)).watermark_regressions


def test_catches_an_early_timer(run):
    """Batch 0 fired timers under a watermark past input that batch 1 consumed afterwards."""
    root, data = run
    exp = expected(str(data))
    last = max(w for _, w, _ in exp.records.values())
    _audit(
        root,
        "batches/LedgerWindow.jsonl",
        {"batch": 0, "lw": last + WINDOW_MS, "fired": 2, "epoch": 1},
    )
    (root / "audit" / "batches" / "LedgerWindow.jsonl").write_text(
        "\n".join(
            ln
            for ln in (root / "audit" / "batches" / "LedgerWindow.jsonl").read_text().splitlines()
            if '"batch": 0, "lw": -' not in ln
        )
        + "\n"
    )
    report = check_run(str(root), str(data))
    assert report.early_timers, report.text()
    assert any(
        "batch 0 fired timers" in e and "batch 1 then consumed" in e for e in report.early_timers
    ), report.text()


def test_catches_output_of_an_uncommitted_batch(run):
    root, data = run
    src = _ledger_file(root)
    shutil.copy(src, src.with_name(src.name.replace("b0000000000", "b0000000007")))
    report = check_run(str(root), str(data))
    assert (
        report.uncommitted_visible
        and "batch 7 of LedgerTally never committed" in report.uncommitted_visible[0]
    )


def test_catches_a_sequence_break_and_a_missing_dead_letter(run):
    root, data = run
    d = root / "streams" / DEAD_LETTER_STREAM / "queries"
    for p in d.iterdir():
        p.unlink()
    d = root / "streams" / WINDOWS / "LedgerWindow"
    import pyarrow.parquet as pq

    path = next(d.iterdir())
    t = pq.read_table(path)
    pq.write_table(t.slice(1), path)  # the first window of some query is gone
    report = check_run(str(root), str(data))
    assert report.sequence_breaks and "windows key" in report.sequence_breaks[0], report.text()
    assert len(report.dead_letters_missing) == report.malformed


def test_cli_exit_status(run, capsys):
    from faults.check import main

    root, data = run
    assert main([str(root), "--input", str(data)]) == 0
    assert "CLEAN" in capsys.readouterr().out
    _audit(
        root, "watermarks.jsonl", {"name": "LedgerWindow", "lw": 5, "t0": 10, "t1": 11, "pid": 2}
    )
    assert main([str(root), "--input", str(data), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["clean"] is False
    assert main([str(data)]) == 2
