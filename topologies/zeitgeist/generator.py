"""The Zeitgeist sample generator: seeded query logs with injected anomalies, and their ground truth.

``generate(OUT_DIR, GeneratorConfig(...))`` (``millwheel zeitgeist generate OUT_DIR``) writes

* ``OUT_DIR/logs/queries_<time_ms>.jsonl`` (``_``, not ``-``, before the time, so no reader
  takes it for a minus sign) and a ``_DONE`` marker (the directory is complete), one JSON
  object a line: ``{"id": "<unique id>", "ts": <int ms>, "query": "<text>"}``;
* ``OUT_DIR/ground_truth.json`` (outside ``logs/``, so no log reader takes it for a log).

Files rotate every ``file_ms`` of *arrival* time, like logs: file ``k`` holds the events
that arrived in ``[start + k*file_ms, start + (k+1)*file_ms)``, in arrival order. An event
arrives up to ``max_delay_ms`` after its timestamp (out-of-order arrival), so a file's
*time* — the number in its name, also its mtime — is ``start + k*file_ms - max_delay_ms``,
a lower bound on the timestamps of its on-time events. A file injector that publishes the
oldest unfinished file's time as its low watermark (MillWheel Fig. 10, §5.2; here
:class:`millwheel.LogFileSource`) is then never early for them. Injected on top:

* spikes and dips (traffic x ``spike_factor`` / x ``dip_factor`` on a popular query for
  a few seconds), listed in the ground truth with their ``[start_ms, end_ms)``;
* late records: delivered more than ``max_delay_ms + window + file_ms`` after their
  timestamp, i.e. into a file whose time is past the record's bucket (§4.5's late data);
* duplicate deliveries: the same line again (same id and content), up to 3 s later,
  possibly in a later file (§6.1.1);
* malformed lines: broken JSON, a missing ``ts``, a non-integer ``ts`` (file, line number
  and byte offset in the ground truth).

Traffic per query is Zipf-like (``rate_i ~ 1/i^zipf_s``) with a daily-style sinusoidal
seasonality over a short "day" (``day_s``), a random phase per query. Everything is
seeded: the same config writes the same bytes.

>>> import tempfile
>>> from millwheel import LogFileSource
>>> d = tempfile.mkdtemp()
>>> truth = generate(d, GeneratorConfig(duration_s=30, rate=300, queries=30, spikes=1, dips=1, warmup_s=10))
>>> truth["duplicates_injected"] > 0, truth["malformed_injected"], len(truth["anomalies"])
(True, 6, 2)
>>> sorted(p.name for p in Path(d).iterdir()), len(list(Path(d, "logs").glob("*.jsonl"))) == len(truth["files"])
(['ground_truth.json', 'logs'], True)
>>> batches = list(LogFileSource(logs_dir(d), finite=True).batches())
>>> sum(len(b.records) for b in batches) == truth["lines"] - truth["malformed_injected"]
True
>>> sorted((dl.value.file, dl.value.offset) for b in batches for dl in b.dead_letters) == sorted((m["file"], m["offset"]) for m in truth["malformed"])
True
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .config import GeneratorConfig

WORDS_A = [
    "cat",
    "dog",
    "weather",
    "football",
    "election",
    "recipe",
    "flight",
    "stock",
    "movie",
    "music",
    "news",
    "pizza",
    "coffee",
    "garden",
    "guitar",
    "marathon",
    "volcano",
    "comet",
    "bitcoin",
    "opera",
    "tennis",
    "museum",
    "train",
    "ferry",
    "laptop",
    "phone",
    "camera",
    "chess",
    "yoga",
    "soup",
]
WORDS_B = [
    "videos",
    "forecast",
    "scores",
    "results",
    "near me",
    "tickets",
    "prices",
    "reviews",
    "live",
    "today",
    "lyrics",
    "schedule",
    "history",
    "tips",
    "deals",
    "map",
    "recipes",
    "tonight",
    "trailer",
    "meaning",
]

FILE_PATTERN = re.compile(r"^queries_(-?\d+)\.jsonl$")


def query_names(n: int, rng: np.random.Generator) -> list[str]:
    combos = [f"{a} {b}" for a in WORDS_A for b in WORDS_B]
    if n > len(combos):
        combos += [f"query {i}" for i in range(n - len(combos))]
    idx = rng.permutation(len(combos))[:n]
    return [combos[i] for i in idx]


def _place_anomalies(
    cfg: GeneratorConfig, rng: np.random.Generator, names: list[str], base: np.ndarray
) -> list[dict[str, Any]]:
    eligible = [
        i for i in range(len(names)) if base[i] * (1 - cfg.season_amplitude) >= cfg.anomaly_min_rate
    ]
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
        rates[a["query_index"], a["start_s"] : a["end_s"]] *= factor
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
    arrival[late_idx] = (
        ts[late_idx]
        + cfg.max_delay_ms
        + cfg.window_ms
        + rng.integers(cfg.file_ms + 1, cfg.file_ms + 4_000, n_late)
    )
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
            f'{{"id": "{ids[i]}", "ts": {ts_list[i]}, "query": {qjson[q_list[i]]}}}'
            for i in all_idx[chunk].tolist()
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
        lines = lines_by_file[
            int(
                (int(FILE_PATTERN.match(m["file"]).group(1)) + cfg.max_delay_ms - cfg.start_ms)
                // cfg.file_ms
            )
        ]  # type: ignore[union-attr]
        i = next(i for i, line in enumerate(lines) if f'"{m["id"]}"' in line)
        m["line"] = i + 1
        m["offset"] = sum(len(line.encode()) + 1 for line in lines[:i])

    truth = {
        "generator": asdict(cfg),
        "injector": {
            "id_field": "id",
            "ts_field": "ts",
            "file_pattern": "queries_<time_ms>.jsonl",
            "file_ms": cfg.file_ms,
            "max_delay_ms": cfg.max_delay_ms,
        },
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
        "queries": [
            {"query": q, "rate": round(float(r), 3)} for q, r in zip(names, base, strict=True)
        ],
    }
    (root / "ground_truth.json").write_text(json.dumps(truth, indent=1), encoding="utf-8")
    (out / "_DONE").write_text("")  # the log directory is complete (a file injector may finish)
    return truth


def default_sample_dir() -> Path:
    """Where the default sample lives (generated on first use; ``ZEITGEIST_DATA`` overrides)."""
    env = os.environ.get("ZEITGEIST_DATA")
    if env:
        return Path(env)
    root = (
        Path(__file__).resolve().parents[2]
    )  # the checkout (or site-packages) holding topologies/
    return root / ".millwheel" / "data" / GeneratorConfig().derived_name()


def ensure_sample(
    directory: str | os.PathLike[str] | None = None, cfg: GeneratorConfig | None = None
) -> Path:
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
