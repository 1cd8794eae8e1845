"""The disorder a log injector measures, and the lateness a run advises from it
(``millwheel/_logdisorder.py``, ``_logplan.disorder``, ``_runner.late_notes``): first
deliveries only, and never an absurd ``lateness_ms``."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel import Computation, Topology
from millwheel._logfile import LogFileSource, disorder, initial_offset, plan_offset
from millwheel._runner import late_lines
from millwheel.cli import main

T0 = 1_767_261_600_000  # 2026-01-01T10:00:00Z


def _measured(d, lines: list[dict], name: str = "part-0001.jsonl", budget: int = 64 << 20):
    (d / name).write_text("".join(json.dumps(v) + "\n" for v in lines))
    return _planned(d, budget)


def _planned(d, budget: int = 64 << 20):
    """The disorder of directory ``d``, planned from its start to its end."""
    opts = LogFileSource(str(d), finite=True, max_bytes_per_batch=budget).read_options
    offset = initial_offset()
    while True:
        end = plan_offset(offset, opts, now_ms=0)
        if end == offset:
            return disorder(end)
        offset = end


def test_a_duplicate_far_behind_is_not_disorder_a_new_record_is(tmp_path):
    lines = [{"id": f"r{i}", "ts": T0 + i * 1_000} for i in range(300)]
    lines.append({"id": "r3", "ts": T0 + 3_000})  # delivered again, 296 s behind the newest
    lines.append({"id": "late", "ts": T0 + 294_000})  # a record of its own, 5 s behind
    assert _measured(tmp_path, lines) == (5_000, "part-0001.jsonl")


def test_a_copy_in_another_file_is_not_disorder(tmp_path):
    first = [{"id": f"a{i}", "ts": T0 + i * 1_000} for i in range(100)]
    (tmp_path / "events-2026-01-01T10-00-00.jsonl").write_text(
        "".join(json.dumps(v) + "\n" for v in first)
    )
    second = [{"id": f"b{i}", "ts": T0 + 300_000 + i * 1_000} for i in range(100)]
    second.insert(
        50, {"id": "a7", "ts": T0 + 7_000}
    )  # a copy of the first file's, 5 min before the second's time
    second.insert(60, {"id": "b-late", "ts": T0 + 298_000})  # 2 s before the second file's time
    # b-late: 60 s behind b58 before it (and 2 s before the file's time); a7, 351 s behind and
    # 293 s before the file's time, is a copy of the first file's record, left out
    assert _measured(tmp_path, second, name="events-2026-01-01T10-05-00.jsonl") == (
        60_000,
        "events-2026-01-01T10-05-00.jsonl",
    )


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1))
def test_the_measure_is_the_most_a_first_delivery_ran_behind(seed):
    """Random orders with random copies, read in random batch sizes: the measure is, over records
    whose id was not read before, the most one ran behind the newest record read before it."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    lines: list[dict] = []
    ts = T0
    for i in range(rng.randint(1, 120)):
        ts += rng.randint(0, 2_000)
        lines.append({"id": f"r{i}", "ts": ts - rng.choice([0, 0, 0, rng.randint(0, 30_000)])})
    for _ in range(rng.randint(0, 8)):  # copies, anywhere after their original
        j = rng.randrange(len(lines))
        lines.insert(rng.randint(j + 1, len(lines)), dict(lines[j]))
    seen: set[str] = set()
    newest, want = None, 0
    for v in lines:
        if v["id"] not in seen and newest is not None:
            want = max(want, newest - v["ts"])
        seen.add(v["id"])
        newest = v["ts"] if newest is None else max(newest, v["ts"])
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp())
    got = _measured(d, lines, budget=rng.choice([64, 200, 1 << 20]))
    assert (got[0] if got else 0) == want, (seed, got, want)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_copies_in_earlier_files_are_found_in_any_batch_sizes_and_on_a_second_plan(seed):
    """Several files read in name order: a record whose id was read before — earlier in its
    file, or in an earlier file — is no disorder. The ids this process indexed (the search's
    cache) change nothing: planning the directory again from its start gives the same measure,
    and so does a file replaced by another of the same name."""
    import tempfile
    from pathlib import Path

    print(f"seed {seed}")
    rng = random.Random(seed)
    files: list[list[dict]] = [[] for _ in range(rng.randint(1, 4))]
    ts, n = T0, 0
    for part in files:
        for _ in range(rng.randint(1, 40)):
            ts += rng.randint(0, 2_000)
            part.append({"id": f"r{n}", "ts": ts - rng.choice([0, 0, rng.randint(0, 30_000)])})
            n += 1
    spelled = {"id": 'caf\u00e9 "1"', "ts": T0}  # an id with escapes, spelled two ways
    files[0].insert(0, spelled)
    for _ in range(rng.randint(0, 10)):  # copies, in the original's file after it or a later one
        f = rng.randrange(len(files))
        j = rng.randrange(len(files[f]))
        g = rng.randint(f, len(files) - 1)
        lo = j + 1 if g == f else 0
        files[g].insert(rng.randint(lo, len(files[g])), dict(files[f][j]))

    def want() -> int:
        seen: set[str] = set()
        most = 0
        for part in files:
            newest = None
            for v in part:
                if v["id"] not in seen and newest is not None:
                    most = max(most, newest - v["ts"])
                seen.add(v["id"])
                newest = v["ts"] if newest is None else max(newest, v["ts"])
        return most

    def write(d: Path) -> None:
        for k, part in enumerate(files):
            text = "".join(json.dumps(v, ensure_ascii=rng.random() < 0.5) + "\n" for v in part)
            tmp = d / f".part-{k:04d}.jsonl"
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(d / f"part-{k:04d}.jsonl")  # a new file (inode) under the same name

    d = Path(tempfile.mkdtemp())
    write(d)
    budget = rng.choice([64, 300, 1 << 20])
    got = _planned(d, budget)
    assert (got[0] if got else 0) == want(), (seed, got, want())
    assert _planned(d, budget) == got  # again, the index warm
    rng.shuffle(files)  # other files under the same names
    write(d)
    got = _planned(d, budget)
    assert (got[0] if got else 0) == want(), (seed, got, want())


class Count(Computation):
    def process_record(self, record):
        self.state.set((self.state.get(0) or 0) + 1)


def test_no_absurd_lateness_is_advised():
    t = Topology("t")
    t.injector("logs", stream="events")
    t.computation(Count, inputs=["events"])
    metrics = {"Count": {"records_in": 4_001, "late": 2_000, "late_dropped": 2_000}}
    (line,) = late_lines(t, metrics, {"logs": (1_765_458_394_380_000, "app-1765458394.jsonl")})
    assert (
        "lateness_ms=1765458394380000" not in line and "which no lateness_ms should cover" in line
    ), line
    assert "implausible_timestamp" in line
    (line,) = late_lines(t, metrics, {"logs": (2**63 - 1, "x.jsonl")})
    assert "lateness_ms=" not in line
    (line,) = late_lines(t, metrics, {"logs": (5_000, "x.jsonl")})
    assert "LogFileSource(lateness_ms=5000) would have kept them" in line


def test_the_run_advises_the_lateness_of_the_late_records_not_of_a_copy(late_log_topology, capsys):
    """The fixture's second file was opened 3 s after its first records: 30 records late,
    ``lateness_ms=3000`` keeps them. A copy of the first file's first record, delivered
    again at the end of the second file (30 s before its time), is dedup's, not lateness's."""
    path, logs = late_log_topology
    second = logs / "events-2026-01-01T10-00-30.jsonl"
    first_line = (logs / "events-2026-01-01T10-00-00.jsonl").read_text().splitlines()[0]
    second.write_text(second.read_text() + first_line + "\n")
    assert main(["run", "--backend", "harness", str(path)]) == 0
    out = capsys.readouterr().out
    assert "LogFileSource(lateness_ms=3000) would have kept them" in out, out
    assert "lateness_ms=30000" not in out
