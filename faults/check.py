"""``millwheel check RUN``: verify a run directory against the guarantees, after any faults.

    millwheel check RUN [--input DATA] [--authority-dir DIR] [--json]

Checks that need nothing but the run directory (any topology on the Spark runtime):

* **uncommitted output** — every stream-log file a query published is named after its
  micro-batch (``b<N>-...``); ``N`` must be in that query's commit log. Weak productions
  (``b<N>-w<attempt>-...``, §6.1.3) are counted apart: they are published before the commit
  by design;
* **double publication** — one batch's files must all come from one attempt (one Spark
  write job); two attempts of a batch both visible is a replay (or a zombie driver)
  publishing a second version;
* **watermarks that went back** — every published low watermark a driver read is in
  ``audit/watermarks.jsonl`` with the monotonic-clock interval of the read; a read that
  *began after* another *ended* must not see a lower value (§7.2). With the authority's
  journal (``RUN/authority`` or ``--authority-dir``), the journaled value must be at least
  every value read;
* **early timers** — ``audit/batches/<C>.jsonl`` says which low watermark each batch ran
  under and how many timers it fired; the checkpoint says which input files each batch
  consumed. A batch ``M >= N`` that consumed a file holding input older than the watermark
  batch ``N`` fired timers under means those timers fired before the input watermark passed
  them (§4.6). The same test over every batch finds a low watermark that passed pending
  input (reported with the early timers).

With ``--input DATA``, the run is a *ledger* run (``faults/ledger.py``) and the answer is
known from the input files alone, record by record:

* **lost** — a valid, non-late input id in no ``ledger`` record; **duplicated** — an id in
  more than one, or a ``ledger`` record id published twice; **misplaced** — in the wrong
  window or key; **unseen** — ids in no output and no dead letter beyond the drops the run
  counted (``late_dropped``);
* **dead letters** — every malformed line has its dead letter (file, byte offset);
* **per-key sequences** — ``windows`` (per query) and ``ledger`` (per window) number each
  key's productions 0, 1, 2, ...: a gap is a lost production, a repeat a duplicate, and a
  query's windows must come in time order (timers in timestamp order, §4.6); one record id
  published with two different values is a replay that diverged.

Limits: record-level accounting needs the ledger's shape (outputs that carry the ids they
account for); other topologies get the run-directory checks only. The watermark-order
check trusts one monotonic clock, so drivers on one machine. The early-timer check sees
the input a batch *consumed*, not records a late injector never sent.

Exit status: 0 clean, 1 a violation (each named), 2 the run directory cannot be read.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faults.ledger import LEDGER, WINDOW_MS, WINDOWS
from millwheel import DEAD_LETTER_STREAM
from millwheel.logfiles import MalformedLine, file_time, is_log_file, parse_line
from millwheel.runtime.rundir import (
    BATCHES,
    WATERMARKS,
    ConsumedFiles,
    FileStreamLog,
    Location,
    min_ts_of,
    read_lines,
)

#: how many examples of each violation a report lists
EXAMPLES = 5
_BATCH_FILE = re.compile(r"^b(\d{10})-(w[0-9a-f]+-)?(.*)-m-?\d+\.parquet$")
_JOB = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class Report:
    """What :func:`check_run` found; :attr:`clean` when no guarantee was broken."""

    run: str
    #: ledger runs: input figures
    inputs: int = 0
    sent_twice: int = 0
    malformed: int = 0
    late_planted: int = 0
    outputs: int = 0
    counted_drops: int = 0
    dead_letters: int = 0
    weak_files: int = 0
    published_files: int = 0
    batches_checked: int = 0
    watermark_reads: int = 0
    #: violations: each a count and a few examples
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)
    unseen: int = 0
    dead_letters_missing: list[str] = field(default_factory=list)
    unexpected_dead_letters: list[str] = field(default_factory=list)
    sequence_breaks: list[str] = field(default_factory=list)
    divergent: list[str] = field(default_factory=list)
    watermark_regressions: list[str] = field(default_factory=list)
    early_timers: list[str] = field(default_factory=list)
    uncommitted_visible: list[str] = field(default_factory=list)
    double_published: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    VIOLATIONS = (
        "lost",
        "duplicated",
        "misplaced",
        "dead_letters_missing",
        "unexpected_dead_letters",
        "sequence_breaks",
        "divergent",
        "watermark_regressions",
        "early_timers",
        "uncommitted_visible",
        "double_published",
    )

    @property
    def clean(self) -> bool:
        return self.unseen == 0 and not any(getattr(self, name) for name in self.VIOLATIONS)

    def counts(self) -> dict[str, int]:
        out = {name: len(getattr(self, name)) for name in self.VIOLATIONS}
        out["unseen"] = self.unseen
        return out

    def text(self) -> str:
        lines = [f"run {self.run}: {'CLEAN' if self.clean else 'VIOLATIONS'}"]
        if self.inputs:
            lines.append(
                f"  input: {self.inputs} valid records ({self.sent_twice} sent twice, {self.late_planted} late), "
                f"{self.malformed} malformed lines; output: {self.outputs} ledger records, {self.dead_letters} dead letters, "
                f"{self.counted_drops} counted drops"
            )
        lines.append(
            f"  checked: {self.published_files} published files ({self.weak_files} weak), {self.batches_checked} batches, "
            f"{self.watermark_reads} watermark reads"
        )
        for name, n in self.counts().items():
            lines.append(f"  {name.replace('_', ' ')}: {n}")
            for example in (getattr(self, name) if name != "unseen" else [])[:EXAMPLES]:
                lines.append(f"      {example}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---- the run directory -----------------------------------------------------------------------


def _commits(root: Location, query: str) -> set[int]:
    return {int(n) for n in root.child("checkpoints", query, "commits").list() if n.isdigit()}


def _query_of(root: Location, producer: str) -> str | None:
    """The checkpoint directory name of a stream's producer (a computation or a log-file injector)."""
    for name in (producer, f"injector.{producer}"):
        if root.child("checkpoints", name).exists():
            return name
    return None


def check_published(root: Location, report: Report) -> None:
    """Every published ``b<N>-...`` file comes from a committed batch, one attempt per batch."""
    streams = FileStreamLog(root)
    commits: dict[str, set[int]] = {}
    attempts: dict[tuple[str, int], set[str]] = defaultdict(set)
    for stream in streams.root.list():
        if stream.startswith((".", "_")):
            continue
        for producer in streams.producers(stream):
            query = _query_of(root, producer)
            for name in streams.files(stream, producer):
                m = _BATCH_FILE.match(name)
                if m is None or query is None:
                    continue  # a driver-side injector's file (s<position>): no micro-batch
                report.published_files += 1
                n = int(m.group(1))
                if m.group(2):
                    report.weak_files += 1
                    continue
                if query not in commits:
                    commits[query] = _commits(root, query)
                # Spark keeps the last 100 commit-log entries (minBatchesToRetain) and purges
                # only committed batches: a batch below the oldest entry kept has committed
                if n not in commits[query] and n >= min(commits[query], default=0):
                    report.uncommitted_visible.append(
                        f"{stream}/{producer}/{name}: batch {n} of {query} never committed"
                    )
                job = _JOB.search(m.group(3))
                attempts[(query, n)].add(job.group(0) if job else m.group(3))
    for (query, n), jobs in sorted(attempts.items()):
        if len(jobs) > 1:
            report.double_published.append(
                f"{query} batch {n}: files of {len(jobs)} attempts published ({', '.join(sorted(jobs))})"
            )


def check_watermarks(root: Location, report: Report, authority_dir: str | None) -> None:
    """No published low watermark read after another read ended is lower (across drivers)."""
    by_name: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
    for e in read_lines(root.child("audit", WATERMARKS)):
        by_name[e["name"]].append((e["t0"], e["t1"], e["lw"], e.get("pid", 0)))
    for name, events in by_name.items():
        report.watermark_reads += len(events)
        ended = sorted((t1, lw, pid) for _, t1, lw, pid in events)
        ends = [t for t, _, _ in ended]
        best: list[tuple[int, int]] = []  # prefix max of (lw, pid) over reads in end order
        for _, lw, pid in ended:
            best.append(max(best[-1], (lw, pid)) if best else (lw, pid))
        for t0, _, lw, pid in events:
            k = bisect.bisect_left(ends, t0)  # reads that ended before this one began
            if k and best[k - 1][0] > lw:
                report.watermark_regressions.append(
                    f"{name}: read {lw} (pid {pid}) after a read of {best[k - 1][0]} (pid {best[k - 1][1]}) had ended"
                )
    journal = _journal_watermarks(root, authority_dir, report)
    for name, events in by_name.items():
        top = max(lw for _, _, lw, _ in events)
        if name in journal and journal[name] < top:
            report.watermark_regressions.append(
                f"{name}: the authority's journal holds {journal[name]}, below {top}, published earlier"
            )


def _journal_watermarks(
    root: Location, authority_dir: str | None, report: Report
) -> dict[str, int]:
    path = authority_dir or os.path.join(root.path, "authority")
    if not os.path.isdir(path):
        report.notes.append(
            f"no authority journal at {path} (pass --authority-dir): journaled watermarks not compared"
        )
        return {}
    from watermark_authority import RocksJournal, WatermarkPublished

    try:
        journal = RocksJournal(path)
    except Exception as exc:  # noqa: BLE001 - a locked or foreign directory is a note, not a crash
        report.notes.append(
            f"authority journal at {path} not read ({type(exc).__name__}: {str(exc)[:120]}); is the authority still running?"
        )
        return {}
    try:
        return {r.name: r.value for r in journal.load() if isinstance(r, WatermarkPublished)}
    finally:
        journal.close()


def check_timers(root: Location, report: Report) -> None:
    """No batch fired timers (or ran) under a low watermark that later-consumed input was behind."""
    batches_dir = root.child("audit", BATCHES)
    for entry in sorted(batches_dir.list()):
        if not entry.endswith(".jsonl"):
            continue
        computation = entry[: -len(".jsonl")]
        runs: dict[int, tuple[int, int]] = {}
        for e in read_lines(batches_dir.child(entry)):
            runs.setdefault(e["batch"], (e["lw"], e["fired"]))
        report.batches_checked += len(runs)
        checkpoint = root.child("checkpoints", computation)
        committed = sorted(_commits(root, computation))
        consumed = ConsumedFiles(checkpoint)
        consumed.refresh()
        offsets = [(m, consumed.log_offsets(m)) for m in committed]
        order = sorted(runs)
        lws = [runs[n][0] for n in order]
        fired_lws = [runs[n][0] if runs[n][1] else -(2**63) for n in order]
        top_all: list[tuple[int, int]] = []
        top_fired: list[tuple[int, int]] = []
        for n, lw, flw in zip(order, lws, fired_lws, strict=True):
            top_all.append(max(top_all[-1], (lw, n)) if top_all else (lw, n))
            top_fired.append(max(top_fired[-1], (flw, n)) if top_fired else (flw, n))
        unmapped = 0
        for (stream, producer), files in consumed.files.items():
            for name, (source, log_batch) in files.items():
                lo = min_ts_of(name)
                at = next((m for m, offs in offsets if offs.get(source, -1) >= log_batch), None)
                if lo is None or at is None:
                    unmapped += (
                        1  # consumed by a batch whose offsets Spark has purged (it keeps 100)
                    )
                    continue
                k = bisect.bisect_right(order, at)
                if not k:
                    continue
                flw, fn = top_fired[k - 1]
                lw, n = top_all[k - 1]
                if flw > lo:
                    report.early_timers.append(
                        f"{computation}: batch {fn} fired timers under low watermark {flw}, but batch {at} then consumed "
                        f"{stream}/{producer}/{name}, holding input from {lo}"
                    )
                elif lw > lo:
                    report.early_timers.append(
                        f"{computation}: batch {n} ran under low watermark {lw}, past input from {lo} that batch {at} "
                        f"consumed ({stream}/{producer}/{name})"
                    )
        if unmapped:
            report.notes.append(
                f"{computation}: {unmapped} input files consumed by batches whose offsets Spark no longer keeps: not checked for early timers"
            )


# ---- ledger runs ---------------------------------------------------------------------------------


@dataclass
class Expected:
    """The ledger's answer, from its input files: id -> (query, window start, late by construction)."""

    records: dict[str, tuple[str, int, bool]] = field(default_factory=dict)
    sent_twice: int = 0
    malformed: set[tuple[str, int]] = field(default_factory=set)


def expected(data: str) -> Expected:
    """Parse every log file of ``data`` as the injector does (``millwheel/_logfile.py``)."""
    out = Expected()
    for name in sorted(os.listdir(data)):
        if not is_log_file(name):
            continue
        ftime = file_time(name)
        raw = Path(data, name).read_bytes()
        offset = 0
        for line in raw.split(b"\n"):
            here, offset = offset, offset + len(line) + 1
            if not line.strip():
                continue
            try:
                rid, ts, value = parse_line(line, "id", "ts", name, here)
            except MalformedLine:
                out.malformed.add((name, here))
                continue
            if rid in out.records:
                out.sent_twice += 1
                continue
            query = value["query"] if isinstance(value, dict) else None
            late = ftime is not None and ts < ftime
            out.records[rid] = (str(query), ts // WINDOW_MS * WINDOW_MS, late)
    return out


def _tally(root: Location, metric: str) -> int:
    total = 0
    for name in root.child("tallies").list():
        text = root.child("tallies", name).read_text() if name.endswith(".json") else None
        if text:
            total += int(json.loads(text).get("metrics", {}).get(metric, 0))
    return total


def _read_stream(streams: FileStreamLog, stream: str) -> list[Any]:
    if stream not in streams.root.list():
        return []
    return streams.read(stream)


def check_ledger(root: Location, data: str, report: Report) -> None:
    exp = expected(data)
    streams = FileStreamLog(root)
    report.inputs = sum(1 for *_, late in exp.records.values() if not late)
    report.late_planted = sum(1 for *_, late in exp.records.values() if late)
    report.sent_twice = exp.sent_twice
    report.malformed = len(exp.malformed)
    ledger = _read_stream(streams, LEDGER)
    report.outputs = len(ledger)
    seen: Counter[str] = Counter()
    record_ids: Counter[str] = Counter(r.id for r in ledger)
    for rid, n in record_ids.items():
        if n > 1:
            report.duplicated.append(f"ledger record {rid} published {n} times")
    by_id = {}
    for r in ledger:
        by_id[r.id] = r
    for r in by_id.values():
        v = r.value
        for i in v["ids"]:
            seen[i] += 1
            want = exp.records.get(i)
            if want is None:
                report.misplaced.append(f"{i}: in the output but not a valid input id")
            elif (want[0], want[1]) != (v["key"], v["window_start"]):
                report.misplaced.append(
                    f"{i}: in window {v['window_start']} of {v['key']!r}, expected {want[1]} of {want[0]!r}"
                )
            elif want[2]:
                report.misplaced.append(
                    f"{i}: late by construction, yet processed (the late policy is drop)"
                )
    for i, n in seen.items():
        if n > 1:
            report.duplicated.append(f"input {i} counted {n} times")
    missing = [i for i, (_, _, late) in exp.records.items() if not seen[i]]
    report.lost = [
        f"input {i} ({exp.records[i][0]!r}, window {exp.records[i][1]})"
        for i in missing
        if not exp.records[i][2]
    ]
    report.counted_drops = _tally(root, "late_dropped")
    report.unseen = max(0, len(missing) - report.counted_drops)
    # dead letters: one per malformed line, nothing else
    letters = _read_stream(streams, DEAD_LETTER_STREAM)
    report.dead_letters = len({r.id for r in letters})
    found: set[tuple[str, int]] = set()
    for r in {r.id: r for r in letters}.values():
        v = r.value
        if getattr(v, "stage", None) == "malformed_line" and v.file is not None:
            found.add((os.path.basename(v.file), int(v.offset)))
        else:
            report.unexpected_dead_letters.append(
                f"{r.id}: {getattr(v, 'stage', '?')}: {getattr(v, 'reason', v)!s:.160}"
            )
    report.dead_letters_missing = [f"{f} at byte {o}" for f, o in sorted(exp.malformed - found)]
    # per-key sequences
    _sequences(
        _read_stream(streams, WINDOWS),
        "windows",
        lambda v: v["key"],
        report,
        ordered_by="window_start",
    )
    _sequences(ledger, "ledger", lambda v: v["window_start"], report)
    for r in _read_stream(streams, WINDOWS):
        v = r.value
        if v["fired_lw"] < v["window_start"] + WINDOW_MS:
            report.early_timers.append(
                f"windows: {v['key']!r} window {v['window_start']} fired under low watermark {v['fired_lw']}"
            )


def _sequences(
    records: list[Any], stream: str, key_of: Any, report: Report, ordered_by: str | None = None
) -> None:
    versions: dict[str, Any] = {}
    for r in records:
        prev = versions.setdefault(r.id, r.value)
        if prev != r.value:
            report.divergent.append(f"{stream}: record {r.id} published with two different values")
    per_key: dict[Any, list[tuple[int, Any]]] = defaultdict(list)
    for v in versions.values():
        per_key[key_of(v)].append((v["seq"], v.get(ordered_by) if ordered_by else None))
    for key, seqs in per_key.items():
        seqs.sort(key=lambda s: s[0])
        got = [s for s, _ in seqs]
        if got != list(range(len(got))):
            gaps = sorted(set(range(max(got) + 1)) - set(got))
            repeats = sorted(s for s, n in Counter(got).items() if n > 1)
            report.sequence_breaks.append(
                f"{stream} key {key!r}: sequence {got[:8]}{'...' if len(got) > 8 else ''} (gaps {gaps[:5]}, repeats {repeats[:5]})"
            )
        elif ordered_by:
            times = [t for _, t in seqs]
            if times != sorted(times) or len(set(times)) != len(times):
                report.sequence_breaks.append(
                    f"{stream} key {key!r}: {ordered_by} out of order along the sequence: {times[:8]}"
                )


# ---- entry points ----------------------------------------------------------------------------------


def check_run(run: str, data: str | None = None, *, authority_dir: str | None = None) -> Report:
    """Check the run directory ``run`` (and, for a ledger run, its input ``data``); see the module docstring."""
    root = Location.of(run)
    if not root.child("checkpoints").exists():
        msg = f"{run} is not a run directory (it has no checkpoints/); give the --checkpoint of a millwheel run"
        raise FileNotFoundError(msg)
    report = Report(run)
    check_published(root, report)
    check_watermarks(root, report, authority_dir)
    check_timers(root, report)
    if data is not None:
        check_ledger(root, data, report)
    leftovers = [
        n
        for n in root.child("outbox").list()
        for b in root.child("outbox", n).list()
        if b.isdigit()
    ]
    if leftovers:
        report.notes.append(
            f"{len(leftovers)} staged batches not published yet (the run did not finish, or is running)"
        )
    return report


def main(argv: list[str] | None = None) -> int:
    """Check a run directory: lost, duplicated, unseen records, sequences, watermarks, timers, uncommitted output."""
    p = argparse.ArgumentParser(prog="millwheel check", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="the run directory (millwheel run --checkpoint)")
    p.add_argument(
        "--input",
        help="the log directory of a ledger run (faults/ledger.py): check record by record",
    )
    p.add_argument(
        "--authority-dir", help="data directory of the watermark authority (default RUN/authority)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        report = check_run(args.run, args.input, authority_dir=args.authority_dir)
    except (FileNotFoundError, OSError) as exc:
        print(f"millwheel check: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps({**asdict(report), "clean": report.clean}, indent=1)
        if args.json
        else report.text()
    )
    return 0 if report.clean else 1


__all__ = ["Expected", "Report", "check_run", "expected", "main"]
