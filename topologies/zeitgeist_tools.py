"""Zeitgeist tools: a query-log generator, a log-directory loader, a continuous replay and an evaluation.

Commands (``python -m topologies.zeitgeist_tools ...``; ``main(argv)`` is the CLI entry)::

    generate OUT_DIR [--seed N --duration S --rate R ...]   write OUT_DIR/logs/*.jsonl + OUT_DIR/ground_truth.json
    run [DATA_DIR] [--mode continuous|batch] [--out DIR]     replay it through the topology, evaluate
    evaluate DATA_DIR ANOMALIES.jsonl [--metrics M.json]     evaluate an anomalies output

**The generated logs.** ``OUT_DIR/logs/queries_<time_ms>.jsonl`` files (``_``, not ``-``,
before the time, so no reader takes it for a minus sign) (and a ``_DONE``
marker: the directory is complete), one JSON object a line: ``{"id": "<unique id>", "ts": <int ms>, "query": "<text>"}``. Files rotate every
``file_ms`` of *arrival* time, like logs: file ``k`` holds the events that arrived in
``[start + k*file_ms, start + (k+1)*file_ms)``, in arrival order. An event arrives up to
``max_delay_ms`` after its timestamp (out-of-order arrival), so a file's *time* — the
number in its name, also its mtime — is ``start + k*file_ms - max_delay_ms``, a lower
bound on the timestamps of its on-time events. A file injector that publishes the
oldest unfinished file's time as its low watermark (MillWheel Fig. 10, §5.2) is then
never early for them. Injected on top:

* spikes and dips (traffic x ``spike_factor`` / x ``dip_factor`` on a popular query for
  a few seconds), listed in ``OUT_DIR/ground_truth.json`` (outside ``logs/``, so no log
  reader takes it for a log) with their ``[start_ms, end_ms)``;
* late records: delivered more than ``max_delay_ms + window + file_ms`` after their
  timestamp, i.e. into a file whose time is past the record's bucket (§4.5's late data);
* duplicate deliveries: the same line again (same id and content), up to 3 s later,
  possibly in a later file (§6.1.1);
* malformed lines: broken JSON, a missing ``ts``, a non-integer ``ts`` (file and line
  in the ground truth).

Traffic per query is Zipf-like (``rate_i ~ 1/i^zipf_s``) with a daily-style sinusoidal
seasonality over a short "day" (``day_s``), a random phase per query. Everything is
seeded.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> truth = generate(d, GeneratorConfig(duration_s=30, rate=300, queries=30, spikes=1, dips=1, warmup_s=10))
>>> truth["duplicates_injected"] > 0, truth["malformed_injected"], len(truth["anomalies"])
(True, 6, 2)
>>> sorted(p.name for p in Path(d).iterdir()), len(list(Path(d, "logs").glob("*.jsonl"))) == len(truth["files"])
(['ground_truth.json', 'logs'], True)
>>> src = LogDirectorySource(d)
>>> n = sum(len(b.records) for b in src.batches())
>>> n == truth["lines"] - truth["malformed_injected"], len(src.malformed)
(True, 6)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from computations.anomalies import Thresholds
from millwheel import MAX_TIMESTAMP, Record, Source, SourceBatch

WORDS_A = [
    "cat", "dog", "weather", "football", "election", "recipe", "flight", "stock", "movie", "music",
    "news", "pizza", "coffee", "garden", "guitar", "marathon", "volcano", "comet", "bitcoin", "opera",
    "tennis", "museum", "train", "ferry", "laptop", "phone", "camera", "chess", "yoga", "soup",
]
WORDS_B = [
    "videos", "forecast", "scores", "results", "near me", "tickets", "prices", "reviews", "live",
    "today", "lyrics", "schedule", "history", "tips", "deals", "map", "recipes", "tonight", "trailer",
    "meaning",
]

DEFAULT_SEED = 42
FILE_PATTERN = re.compile(r"^queries_(-?\d+)\.jsonl$")


# =====================================================================================
# topology settings
# =====================================================================================
@dataclass(frozen=True)
class ZeitgeistConfig:
    """The topology's settings: bucket size, model, detector thresholds (Fig. 9), dedup horizon."""

    window_ms: int = 1_000
    #: the model's short "day" and its slots (the generator's default day is 60 s)
    day_ms: int = 60_000
    slot_ms: int = 3_000
    model_alpha: float = 0.1
    model_gamma: float = 0.3
    model_warmup_windows: int = 10
    thresholds: Thresholds = field(default_factory=Thresholds)
    #: empty buckets the window counter still emits (as zeros) after a query goes quiet
    trailing_empty: int = 10
    #: how long record ids are kept for exactly-once (§6.1.1): beyond any redelivery delay
    dedup_slack_ms: int = 30_000


# =====================================================================================
# generator
# =====================================================================================
@dataclass(frozen=True)
class GeneratorConfig:
    """Everything the generator does, seeded. Defaults: the README's "main job" sample."""

    seed: int = DEFAULT_SEED
    queries: int = 200
    zipf_s: float = 1.0
    #: mean events per second over all queries
    rate: float = 800.0
    duration_s: int = 240
    start_ms: int = 1_700_000_000_000
    #: the short "day" of the seasonality, and its amplitude (traffic x [1-a, 1+a])
    day_s: int = 60
    season_amplitude: float = 0.3
    spikes: int = 12
    dips: int = 12
    spike_factor: float = 5.0
    dip_factor: float = 0.1
    anomaly_min_s: int = 4
    anomaly_max_s: int = 8
    #: anomalies go to queries whose trough rate (base x (1 - amplitude)) is at least this
    anomaly_min_rate: float = 15.0
    #: no anomaly before this (the models learn a first "day")
    warmup_s: int = 70
    #: quiet time between two anomalies of the same query
    anomaly_gap_s: int = 10
    file_ms: int = 1_000
    max_delay_ms: int = 500
    window_ms: int = 1_000
    late_fraction: float = 5e-5
    duplicate_fraction: float = 0.002
    malformed: int = 6

    def derived_name(self) -> str:
        """A directory name that changes with every setting (for the cached default sample)."""
        import hashlib

        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"zeitgeist-{self.seed}-{digest}"


def query_names(n: int, rng: np.random.Generator) -> list[str]:
    combos = [f"{a} {b}" for a in WORDS_A for b in WORDS_B]
    if n > len(combos):
        combos += [f"query {i}" for i in range(n - len(combos))]
    idx = rng.permutation(len(combos))[:n]
    return [combos[i] for i in idx]


def _place_anomalies(cfg: GeneratorConfig, rng: np.random.Generator, names: list[str], base: np.ndarray) -> list[dict[str, Any]]:
    eligible = [i for i in range(len(names)) if base[i] * (1 - cfg.season_amplitude) >= cfg.anomaly_min_rate]
    kinds = ["spike"] * cfg.spikes + ["dip"] * cfg.dips
    if kinds and not eligible:
        msg = f"generator: no query has a trough rate >= {cfg.anomaly_min_rate}/s; raise --rate or lower --anomaly-min-rate"
        raise ValueError(msg)
    rng.shuffle(kinds)
    taken: dict[int, list[tuple[int, int]]] = {}
    out: list[dict[str, Any]] = []
    last_start = cfg.duration_s - cfg.anomaly_max_s - 3
    if kinds and last_start <= cfg.warmup_s:
        msg = f"generator: duration {cfg.duration_s}s leaves no room for anomalies after the {cfg.warmup_s}s warm-up"
        raise ValueError(msg)
    for kind in kinds:
        for _attempt in range(10_000):
            q = int(rng.choice(eligible))
            dur = int(rng.integers(cfg.anomaly_min_s, cfg.anomaly_max_s + 1))
            start = int(rng.integers(cfg.warmup_s, last_start + 1))
            gap = cfg.anomaly_gap_s
            if all(start + dur + gap <= s or e + gap <= start for s, e in taken.get(q, [])):
                taken.setdefault(q, []).append((start, start + dur))
                out.append({"query_index": q, "kind": kind, "start_s": start, "end_s": start + dur})
                break
        else:
            msg = "generator: cannot place every anomaly without overlaps; fewer anomalies or a longer duration"
            raise ValueError(msg)
    return sorted(out, key=lambda a: (a["start_s"], a["query_index"]))


def generate(out_dir: str | os.PathLike[str], cfg: GeneratorConfig | None = None) -> dict[str, Any]:
    """Write a sample to ``out_dir`` (see the module docstring); return the ground truth."""
    cfg = cfg or GeneratorConfig()
    rng = np.random.default_rng(cfg.seed)
    root = Path(out_dir)
    out = root / "logs"
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("queries_*.jsonl"), out / "_DONE", root / "ground_truth.json"]:
        old.unlink(missing_ok=True)

    names = query_names(cfg.queries, rng)
    ranks = np.arange(1, cfg.queries + 1, dtype=float)
    weights = 1.0 / ranks**cfg.zipf_s
    base = cfg.rate * weights / weights.sum()  # events/s per query
    phase = rng.uniform(0, 2 * math.pi, cfg.queries)
    secs = np.arange(cfg.duration_s)
    t_mid = (secs + 0.5) / cfg.day_s * 2 * math.pi
    season = 1 + cfg.season_amplitude * np.sin(t_mid[None, :] + phase[:, None])
    rates = base[:, None] * season  # queries x seconds
    anomalies = _place_anomalies(cfg, rng, names, base)
    for a in anomalies:
        factor = cfg.spike_factor if a["kind"] == "spike" else cfg.dip_factor
        rates[a["query_index"], a["start_s"]:a["end_s"]] *= factor
    counts = rng.poisson(rates)
    q_idx = np.repeat(np.repeat(np.arange(cfg.queries), cfg.duration_s), counts.ravel())
    s_idx = np.repeat(np.tile(secs, cfg.queries), counts.ravel())
    n = int(q_idx.size)
    ts = cfg.start_ms + s_idx * 1_000 + rng.integers(0, 1_000, n)
    order = np.argsort(ts, kind="stable")
    q_idx, ts = q_idx[order], ts[order]
    arrival = ts + rng.integers(0, cfg.max_delay_ms + 1, n)

    # late records: arrive after the file injector's watermark has passed their bucket
    n_late = int(round(cfg.late_fraction * n))
    late_idx = rng.choice(n, size=n_late, replace=False) if n_late else np.array([], dtype=int)
    arrival[late_idx] = ts[late_idx] + cfg.max_delay_ms + cfg.window_ms + rng.integers(cfg.file_ms + 1, cfg.file_ms + 4_000, n_late)
    # duplicates: the same line again, later (never of a late record: that one is dropped)
    n_dup = int(round(cfg.duplicate_fraction * n))
    pool = np.setdiff1d(np.arange(n), late_idx)
    dup_idx = rng.choice(pool, size=n_dup, replace=False) if n_dup else np.array([], dtype=int)
    all_idx = np.concatenate([np.arange(n), dup_idx])
    all_arrival = np.concatenate([arrival, arrival[dup_idx] + rng.integers(1, 3_000, n_dup)])
    file_of = (all_arrival - cfg.start_ms) // cfg.file_ms
    order = np.lexsort((all_arrival, file_of))
    all_idx, file_of = all_idx[order], file_of[order]

    qjson = [json.dumps(q) for q in names]
    ids = [f"e{cfg.seed}-{i:07d}" for i in range(n)]
    ts_list = ts.tolist()
    q_list = q_idx.tolist()
    lines_by_file: dict[int, list[str]] = {}
    bounds = np.flatnonzero(np.diff(file_of)) + 1
    for chunk in np.split(np.arange(all_idx.size), bounds):
        if chunk.size == 0:
            continue
        k = int(file_of[chunk[0]])
        lines_by_file[k] = [
            f'{{"id": "{ids[i]}", "ts": {ts_list[i]}, "query": {qjson[q_list[i]]}}}' for i in all_idx[chunk].tolist()
        ]

    def file_time(k: int) -> int:
        return cfg.start_ms + k * cfg.file_ms - cfg.max_delay_ms

    def file_name(k: int) -> str:
        return f"queries_{file_time(k)}.jsonl"

    # malformed lines, at seeded places
    bad_kinds = [
        ("broken_json", '{"id": "bad-{n}", "ts": 17000'),
        ("missing_ts", '{"id": "bad-{n}", "query": "cat videos"}'),
        ("non_integer_ts", '{"id": "bad-{n}", "ts": "soon", "query": "cat videos"}'),
        ("non_integer_ts", '{"id": "bad-{n}", "ts": 1700000000000.5, "query": "cat videos"}'),
    ]
    keys = sorted(lines_by_file)
    malformed: list[dict[str, Any]] = []
    for j in range(cfg.malformed):
        k = int(keys[int(rng.integers(0, len(keys)))])
        lines = lines_by_file[k]
        pos = int(rng.integers(0, len(lines) + 1))
        kind, text = bad_kinds[j % len(bad_kinds)]
        lines.insert(pos, text.replace("{n}", str(j)))
        malformed.append({"file": file_name(k), "kind": kind, "id": f"bad-{j}"})
    files = []
    for k in keys:
        path = out / file_name(k)
        lines = lines_by_file[k]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        t = file_time(k) / 1_000
        os.utime(path, (t, t))
        files.append(
            {
                "name": path.name,
                "time_ms": file_time(k),
                "written_from_ms": cfg.start_ms + k * cfg.file_ms,
                "written_to_ms": cfg.start_ms + (k + 1) * cfg.file_ms,
                "lines": len(lines),
            }
        )
    for m in malformed:  # line numbers and byte offsets once every insertion is done
        lines = lines_by_file[int((int(FILE_PATTERN.match(m["file"]).group(1)) + cfg.max_delay_ms - cfg.start_ms) // cfg.file_ms)]  # type: ignore[union-attr]
        i = next(i for i, line in enumerate(lines) if f'"{m["id"]}"' in line)
        m["line"] = i + 1
        m["offset"] = sum(len(line.encode()) + 1 for line in lines[:i])

    truth = {
        "generator": asdict(cfg),
        "injector": {"id_field": "id", "ts_field": "ts", "file_pattern": "queries_<time_ms>.jsonl", "file_ms": cfg.file_ms, "max_delay_ms": cfg.max_delay_ms},
        "events": n,
        "lines": n + n_dup + cfg.malformed,
        "anomalies": [
            {
                "query": names[a["query_index"]],
                "kind": a["kind"],
                "start_ms": cfg.start_ms + a["start_s"] * 1_000,
                "end_ms": cfg.start_ms + a["end_s"] * 1_000,
                "factor": cfg.spike_factor if a["kind"] == "spike" else cfg.dip_factor,
                "base_rate": round(float(base[a["query_index"]]), 3),
            }
            for a in anomalies
        ],
        "duplicates_injected": n_dup,
        "late_injected": n_late,
        "late": [{"id": ids[i], "ts": ts_list[i]} for i in sorted(late_idx.tolist())],
        "malformed_injected": cfg.malformed,
        "malformed": malformed,
        "files": files,
        "queries": [{"query": q, "rate": round(float(r), 3)} for q, r in zip(names, base, strict=True)],
    }
    (root / "ground_truth.json").write_text(json.dumps(truth, indent=1), encoding="utf-8")
    (out / "_DONE").write_text("")  # the log directory is complete (a file injector may finish)
    return truth


def default_sample_dir() -> Path:
    """Where the default sample lives (generated on first use; ``ZEITGEIST_DATA`` overrides)."""
    env = os.environ.get("ZEITGEIST_DATA")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parent.parent
    return root / ".millwheel" / "data" / GeneratorConfig().derived_name()


def ensure_sample(directory: str | os.PathLike[str] | None = None, cfg: GeneratorConfig | None = None) -> Path:
    """The sample directory, generating it (seeded, so always the same) if it is missing."""
    path = Path(directory) if directory is not None else default_sample_dir()
    if not (path / "ground_truth.json").is_file() or not (path / "logs").is_dir():
        started = time.perf_counter()
        truth = generate(path, cfg)
        print(
            f"zeitgeist: generated {truth['lines']} lines in {len(truth['files'])} files at {path} "
            f"in {time.perf_counter() - started:.1f}s",
            file=sys.stderr,
        )
    return path


def logs_dir(directory: str | os.PathLike[str]) -> Path:
    """The log files of a sample: ``directory/logs`` if there is one, else ``directory``."""
    p = Path(directory)
    return p / "logs" if (p / "logs").is_dir() else p


def truth_file(directory: str | os.PathLike[str]) -> Path:
    """``ground_truth.json`` of a sample, given the sample or its ``logs`` directory."""
    p = Path(directory)
    for d in (p, p.parent):
        if (d / "ground_truth.json").is_file():
            return d / "ground_truth.json"
    msg = f"no ground_truth.json in {p} or {p.parent}; generate the sample with `zeitgeist_tools generate`"
    raise FileNotFoundError(msg)


def load_truth(directory: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads(truth_file(directory).read_text(encoding="utf-8"))


# =====================================================================================
# loader: a log-directory injector source (stand-in for the runtime's file source)
# =====================================================================================
@dataclass(frozen=True)
class LogFile:
    name: str
    #: the file's time: a lower bound on its on-time records (MillWheel Fig. 10)
    time_ms: int
    records: list[Record]


class LogDirectorySource(Source):
    """Reads ``queries_<time_ms>.jsonl`` files in time order, one batch per file (Fig. 10).

    After each file, the injector low watermark is the next file's time (the oldest
    unfinished file); after the last, ``MAX_TIMESTAMP``. Records behind it are late.

    TEMPORARY: this is the stand-in for the Spark runtime's log-file injector
    (``millwheel/runtime``, JSON lines with configurable id/ts fields, malformed lines to
    the ``dead_letters`` stream). Until that lands, malformed lines are not records: they
    are collected in :attr:`malformed` (file, line, reason) and the evaluation reports
    them as dead letters. Replace with the runtime's file source in
    ``topologies/zeitgeist.py:make_source``.
    """

    def __init__(self, directory: str | os.PathLike[str], *, id_field: str = "id", ts_field: str = "ts") -> None:
        self.directory = logs_dir(directory)
        self.id_field = id_field
        self.ts_field = ts_field
        self.malformed: list[dict[str, Any]] = []
        self._files: list[LogFile] | None = None

    def file_paths(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.directory.iterdir():
            m = FILE_PATTERN.match(p.name)
            if m:
                out.append((int(m.group(1)), p))
            elif p.suffix == ".jsonl":  # not named by time: fall back on the mtime (creation time)
                out.append((int(p.stat().st_mtime * 1_000), p))
        return sorted(out)

    def files(self) -> list[LogFile]:
        """Parse every file once (and fill :attr:`malformed`)."""
        if self._files is None:
            self.malformed = []
            self._files = [LogFile(p.name, t, self._parse(p)) for t, p in self.file_paths()]
        return self._files

    def _parse(self, path: Path) -> list[Record]:
        recs: list[Record] = []
        id_f, ts_f = self.id_field, self.ts_field
        loads = json.loads
        offset = 0
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                line, at = raw.decode("utf-8", errors="replace"), offset
                offset += len(raw)
                if not line.strip():
                    continue
                try:
                    value = loads(line)
                except ValueError as exc:
                    self.malformed.append({"file": path.name, "line": lineno, "offset": at, "reason": f"broken JSON: {exc}"})
                    continue
                if not isinstance(value, dict):
                    self.malformed.append({"file": path.name, "line": lineno, "offset": at, "reason": "not a JSON object"})
                    continue
                ts, rid = value.get(ts_f), value.get(id_f)
                if ts is None:
                    self.malformed.append({"file": path.name, "line": lineno, "offset": at, "reason": f"missing {ts_f!r}"})
                    continue
                if type(ts) is not int:
                    self.malformed.append({"file": path.name, "line": lineno, "offset": at, "reason": f"{ts_f!r} is not an integer: {ts!r}"})
                    continue
                if not isinstance(rid, str) or not isinstance(value.get("query"), str):
                    self.malformed.append({"file": path.name, "line": lineno, "offset": at, "reason": f"missing {id_f!r} or 'query'"})
                    continue
                recs.append(Record(None, value, ts, rid))
        return recs

    def batches(self) -> Iterator[SourceBatch]:
        files = self.files()
        for i, f in enumerate(files):
            nxt = files[i + 1].time_ms if i + 1 < len(files) else MAX_TIMESTAMP
            yield SourceBatch(f.records, nxt)
        if not files:
            yield SourceBatch([], MAX_TIMESTAMP)


# =====================================================================================
# continuous replay in the harness
# =====================================================================================
@dataclass
class RunResult:
    """What a run leaves for the evaluation: the anomalies and counters."""

    anomalies: list[dict[str, Any]]
    metrics: dict[str, dict[str, int]]
    dead_letters: list[dict[str, Any]]
    wall_clock: bool
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def replay(topology: Any, *, injector: str = "queries", tick_ms: int = 100, mode: str = "continuous") -> RunResult:
    """Run the Zeitgeist topology in the harness on its log-directory source.

    ``mode="continuous"`` simulates a live deployment: the wall clock is the event
    clock, each file is replayed over the wall-time interval in which it was written
    (its lines spread evenly, delivered every ``tick_ms``), and the injector low
    watermark is the oldest unfinished file's time (Fig. 10), so it lags wall time by
    ``max_delay_ms`` plus up to one file. Processing itself is instantaneous, so delays
    measure how long the *data* and the *low watermark* make detection wait, not CPU.
    ``mode="batch"`` feeds file after file as fast as possible (wall time fixed): no
    delay figures.
    """
    from millwheel.testing import Harness

    spec = topology.injectors[injector]
    source = spec.source
    directory = getattr(source, "path", None)
    if directory is None:
        msg = f"replay needs the injector {injector!r} to read a log directory, got {type(source).__name__}"
        raise TypeError(msg)
    # the continuous replay paces the files itself; batch mode runs the topology's own source
    loader = source if isinstance(source, LogDirectorySource) else LogDirectorySource(directory)
    started = time.perf_counter()
    files = loader.files()
    written: dict[str, tuple[int, int]] = {}
    with contextlib.suppress(FileNotFoundError):
        written = {f["name"]: (f["written_from_ms"], f["written_to_ms"]) for f in load_truth(directory)["files"]}
    first_wall = written.get(files[0].name, (files[0].time_ms, 0))[0] if files else 0
    h = Harness(topology, wall_time=first_wall, raise_errors=False)
    if mode == "batch":
        h.run_sources()
    else:
        for i, f in enumerate(files):
            w_from, w_to = written.get(f.name, (f.time_ms, files[i + 1].time_ms if i + 1 < len(files) else f.time_ms + 1_000))
            h.advance_watermark(injector, f.time_ms)  # the oldest unfinished file (Fig. 10)
            ticks = max(1, (w_to - w_from) // tick_ms)
            recs = f.records
            n = len(recs)
            for j in range(ticks):
                h.advance_wall_time(to=max(h.now, w_from + (j + 1) * (w_to - w_from) // ticks))
                chunk = recs[j * n // ticks:(j + 1) * n // ticks]
                if chunk:
                    h.inject(injector, chunk)
                h.run()
        h.finish(injector)
        h.run()
    metrics = {name: h.metrics(name) for name in topology.order()}
    dead = [r.value.as_dict() for r in h.dead_letters()]
    if mode != "batch":
        dead += [{"stage": "malformed_line", **m} for m in loader.malformed]  # TEMPORARY: LogDirectorySource
    anomalies = [dict(v) for v in h.values("anomalies")]
    return RunResult(anomalies, metrics, dead, wall_clock=(mode == "continuous"), elapsed_s=time.perf_counter() - started)


def run_spark(topology: Any, root: str | os.PathLike[str], *, timeout_s: float = 900, settings: Any = None) -> RunResult:
    """Run the topology on local Spark (``millwheel.runtime``) until its finite input is drained.

    Not paced: the files are read as fast as Spark goes, so wall time says nothing about
    detection delay (``wall_clock=False``); precision, recall, duplicates, late records and
    dead letters are comparable with :func:`replay` (the differential test).
    """
    import dataclasses

    from millwheel.runtime import RuntimeSettings, SparkRuntime

    settings = settings or RuntimeSettings(drain=True)
    if not settings.drain:
        settings = dataclasses.replace(settings, drain=True)
    started = time.perf_counter()
    rt = SparkRuntime(topology, os.fspath(root), settings)
    rt.run(timeout_s=timeout_s)
    metrics = {name: dict(getattr(q, "metrics", None) or q.status()) for name, q in rt.computations.items()}
    dead = [r.value.as_dict() for r in rt.dead_letters()]
    anomalies = [dict(v) for v in rt.values("anomalies")]
    return RunResult(anomalies, metrics, dead, wall_clock=False, elapsed_s=time.perf_counter() - started)


# =====================================================================================
# evaluation
# =====================================================================================
def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile; ``None`` for no values.

    >>> percentile([5, 1, 3, 2, 4], 50), percentile([5, 1, 3, 2, 4], 95), percentile([], 50)
    (3, 5, None)
    """
    if not values:
        return None
    s = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(s)))
    return s[rank - 1]


def matches(anomaly: Mapping[str, Any], event: Mapping[str, Any], tolerance_ms: int) -> bool:
    """The matching rule: same query and kind, and the anomaly's bucket overlaps the event ± tolerance.

    >>> ev = {"query": "cats", "kind": "dip", "start_ms": 10_000, "end_ms": 15_000}
    >>> a = {"query": "cats", "kind": "dip", "window_start": 15_000, "window_end": 16_000}
    >>> matches(a, ev, 1_000), matches(a, ev, 0), matches({**a, "kind": "spike"}, ev, 1_000)
    (True, False, False)
    """
    return (
        anomaly["query"] == event["query"]
        and anomaly["kind"] == event["kind"]
        and anomaly["window_start"] < event["end_ms"] + tolerance_ms
        and anomaly["window_end"] > event["start_ms"] - tolerance_ms
    )


def evaluate(result: RunResult, truth: Mapping[str, Any], *, tolerance_ms: int = 1_000, counter: str = "WindowCounter") -> dict[str, Any]:
    """Compare a run's anomalies with the ground truth; see ``docs/zeitgeist.md`` for every rule."""
    events = list(truth["anomalies"])
    anomalies = result.anomalies
    report: dict[str, Any] = {"tolerance_ms": tolerance_ms, "anomalies": len(anomalies), "events": len(events)}
    matched_anomaly = [False] * len(anomalies)
    by_query: dict[str, list[int]] = {}
    for i, ev in enumerate(events):
        by_query.setdefault(ev["query"], []).append(i)
    first_detection: dict[int, int] = {}
    delays: dict[str, list[int]] = {"spike": [], "dip": []}
    for j, a in enumerate(anomalies):
        for i in by_query.get(a["query"], []):
            if matches(a, events[i], tolerance_ms):
                matched_anomaly[j] = True
                t = a.get("detected_at")
                if t is not None and (i not in first_detection or t < first_detection[i]):
                    first_detection[i] = t
        if matched_anomaly[j] and result.wall_clock:
            delays[a["kind"]].append(a["detected_at"] - a["window_end"])
    per_kind: dict[str, Any] = {}
    for kind in ("spike", "dip", "all"):
        idx_a = [j for j, a in enumerate(anomalies) if kind in ("all", a["kind"])]
        idx_e = [i for i, e in enumerate(events) if kind in ("all", e["kind"])]
        tp_a = sum(matched_anomaly[j] for j in idx_a)
        detected = [i for i in idx_e if i in first_detection]
        entry: dict[str, Any] = {
            "anomalies": len(idx_a),
            "matched_anomalies": tp_a,
            "events": len(idx_e),
            "detected_events": len(detected),
            "precision": tp_a / len(idx_a) if idx_a else None,
            "recall": len(detected) / len(idx_e) if idx_e else None,
        }
        if result.wall_clock:
            d = delays["spike"] + delays["dip"] if kind == "all" else delays[kind]
            first = [first_detection[i] - events[i]["start_ms"] for i in detected]
            entry["delay_beyond_bucket_end_ms"] = {"p50": percentile(d, 50), "p95": percentile(d, 95), "max": max(d) if d else None, "n": len(d)}
            entry["first_detection_after_start_ms"] = {"p50": percentile(first, 50), "p95": percentile(first, 95)}
        per_kind[kind] = entry
    report["by_kind"] = per_kind
    report["missed"] = [events[i] for i in range(len(events)) if i not in first_detection]
    report["false_positives"] = [anomalies[j] for j in range(len(anomalies)) if not matched_anomaly[j]]

    m = result.metrics.get(counter, {})
    delivered = m.get("records_in", 0)
    unique = delivered - m.get("duplicates", 0)
    report["records"] = {"delivered": delivered, "unique": unique, "events_generated": truth.get("events")}
    report["late"] = {
        "dropped": m.get("late_dropped", 0),
        "injected": truth.get("late_injected"),
        "fraction": m.get("late_dropped", 0) / unique if unique else None,
        "millwheel_reported_fraction": 1e-5,
    }
    report["duplicates"] = {
        "injected": truth.get("duplicates_injected"),
        "seen_and_removed": {name: mm.get("duplicates", 0) for name, mm in result.metrics.items() if mm.get("duplicates", 0) or name == counter},
    }
    malformed_dead = [d for d in result.dead_letters if d.get("stage") == "malformed_line"]
    # a dead letter names its line by byte offset (the runtime's file source) or line number (the loader)
    seen_at = {_where(d) for d in malformed_dead}
    found = [("offset", x["file"], x.get("offset")) in seen_at or ("line", x["file"], x.get("line")) in seen_at for x in truth.get("malformed", [])]
    report["dead_letters"] = {
        "total": len(result.dead_letters),
        "malformed_lines": len(malformed_dead),
        "malformed_injected": truth.get("malformed_injected"),
        "every_malformed_line_dead_lettered": all(found),
        "other": len(result.dead_letters) - len(malformed_dead),
    }
    report["elapsed_s"] = round(result.elapsed_s, 2)
    report["wall_clock"] = "continuous simulation" if result.wall_clock else "none (batch): no delay figures"
    return report


def _where(dead: Mapping[str, Any]) -> tuple[str, Any, Any]:
    if isinstance(dead.get("offset"), int):
        return ("offset", dead.get("file"), dead["offset"])
    return ("line", dead.get("file"), dead.get("line"))


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    if pct:
        return f"{x:.3f}"
    return str(x)


def render(report: Mapping[str, Any]) -> str:
    """The evaluation as text, as ``run`` prints it."""
    lines = [f"zeitgeist evaluation (match: same query+kind, bucket overlaps event ± {report['tolerance_ms']} ms; wall clock: {report['wall_clock']})"]
    for kind in ("spike", "dip", "all"):
        e = report["by_kind"][kind]
        line = (
            f"  {kind:<5} precision {_fmt(e['precision'], True)} ({e['matched_anomalies']}/{e['anomalies']} anomalies)  "
            f"recall {_fmt(e['recall'], True)} ({e['detected_events']}/{e['events']} events)"
        )
        if "delay_beyond_bucket_end_ms" in e:
            d, f = e["delay_beyond_bucket_end_ms"], e["first_detection_after_start_ms"]
            line += (
                f"  delay beyond bucket end p50 {_fmt(d['p50'])} ms p95 {_fmt(d['p95'])} ms max {_fmt(d['max'])} ms"
                f"; first detection after start p50 {_fmt(f['p50'])} ms p95 {_fmt(f['p95'])} ms"
            )
        lines.append(line)
    late, dup, dl, rec = report["late"], report["duplicates"], report["dead_letters"], report["records"]
    frac = late["fraction"]
    lines.append(
        f"  records: {rec['delivered']} delivered, {rec['unique']} unique ({rec['events_generated']} generated)"
    )
    lines.append(
        f"  late records dropped: {late['dropped']} (injected {late['injected']}), "
        f"{'n/a' if frac is None else f'{frac * 100:.4f}%'} of records (MillWheel reports about 0.001%)"
    )
    seen = ", ".join(f"{k} {v}" for k, v in dup["seen_and_removed"].items())
    lines.append(f"  duplicates injected {dup['injected']}; seen and removed: {seen}")
    lines.append(
        f"  dead letters: {dl['total']} ({dl['malformed_lines']} malformed lines, injected {dl['malformed_injected']}, "
        f"all accounted for: {dl['every_malformed_line_dead_lettered']}; other {dl['other']})"
    )
    if report["missed"]:
        lines.append("  missed: " + "; ".join(f"{m['kind']} {m['query']!r} [{m['start_ms']}, {m['end_ms']})" for m in report["missed"][:10]))
    if report["false_positives"]:
        lines.append(
            "  false positives: "
            + "; ".join(f"{a['kind']} {a['query']!r} @{a['window_start']} ({a['actual']} vs {a['expected']})" for a in report["false_positives"][:10])
        )
    if report["elapsed_s"]:  # `millwheel run` prints its own run time
        lines.append(f"  ran in {report['elapsed_s']} s")
    return "\n".join(lines)


# =====================================================================================
# CLI
# =====================================================================================
def _add_generator_args(p: argparse.ArgumentParser) -> None:
    for f in fields(GeneratorConfig):
        default = f.default
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=default, dest=f.name)


def _config_from(args: argparse.Namespace) -> GeneratorConfig:
    return GeneratorConfig(**{f.name: getattr(args, f.name) for f in fields(GeneratorConfig)})


def _write_outputs(out_dir: Path, result: RunResult, report: Mapping[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "anomalies.jsonl").open("w", encoding="utf-8") as fh:
        for a in result.anomalies:
            fh.write(json.dumps(a, default=str) + "\n")
    (out_dir / "metrics.json").write_text(json.dumps({"metrics": result.metrics, "dead_letters": result.dead_letters, "wall_clock": result.wall_clock}, default=str, indent=1))
    (out_dir / "evaluation.json").write_text(json.dumps(report, default=str, indent=1))


def main(argv: list[str] | None = None) -> int:
    """``millwheel zeitgeist generate|run|evaluate ...`` (or ``python -m topologies.zeitgeist_tools``)."""
    parser = argparse.ArgumentParser(prog="millwheel zeitgeist", description="Zeitgeist sample generator and evaluation")
    sub = parser.add_subparsers(dest="command", required=True)
    p_gen = sub.add_parser("generate", help="write a query-log sample and its ground truth")
    p_gen.add_argument("out_dir")
    _add_generator_args(p_gen)
    p_run = sub.add_parser("run", help="replay a sample through the topology in the harness and evaluate")
    p_run.add_argument("data_dir", nargs="?", default=None, help="default: the default sample (generated if missing)")
    p_run.add_argument("--mode", choices=["continuous", "batch"], default="continuous")
    p_run.add_argument("--tick-ms", type=int, default=100)
    p_run.add_argument("--tolerance-ms", type=int, default=1_000)
    p_run.add_argument("--out", default=None, help="write anomalies.jsonl, metrics.json, evaluation.json here")
    p_eval = sub.add_parser("evaluate", help="evaluate an anomalies output (JSON lines) against the ground truth")
    p_eval.add_argument("data_dir")
    p_eval.add_argument("anomalies")
    p_eval.add_argument("--metrics", default=None, help="metrics.json from the run (counters, dead letters)")
    p_eval.add_argument("--tolerance-ms", type=int, default=1_000)
    p_eval.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    if args.command == "generate":
        started = time.perf_counter()
        truth = generate(args.out_dir, _config_from(args))
        print(
            f"wrote {truth['lines']} lines ({truth['events']} events, {truth['duplicates_injected']} duplicates, "
            f"{truth['late_injected']} late, {truth['malformed_injected']} malformed) in {len(truth['files'])} files, "
            f"{len(truth['anomalies'])} anomalies, to {args.out_dir} in {time.perf_counter() - started:.1f}s"
        )
        return 0
    if args.command == "run":
        from topologies.zeitgeist import build

        data = ensure_sample(args.data_dir)
        topo = build(data)
        result = replay(topo, tick_ms=args.tick_ms, mode=args.mode)
        report = evaluate(result, load_truth(data), tolerance_ms=args.tolerance_ms)
        print(render(report))
        if args.out:
            _write_outputs(Path(args.out), result, report)
        return 0
    anomalies = [json.loads(line) for line in Path(args.anomalies).read_text(encoding="utf-8").splitlines() if line.strip()]
    metrics: dict[str, Any] = {"metrics": {}, "dead_letters": [], "wall_clock": all("detected_at" in a for a in anomalies)}
    if args.metrics:
        metrics = json.loads(Path(args.metrics).read_text(encoding="utf-8"))
    result = RunResult(anomalies, metrics["metrics"], metrics["dead_letters"], wall_clock=bool(metrics.get("wall_clock")))
    report = evaluate(result, load_truth(args.data_dir), tolerance_ms=args.tolerance_ms)
    print(json.dumps(report, default=str, indent=1) if args.json else render(report))
    return 0


if __name__ == "__main__":
    # run the importable module's main, so classes are the ones topologies.zeitgeist imports
    from topologies.zeitgeist_tools import main as _main

    sys.exit(_main())
