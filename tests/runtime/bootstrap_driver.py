"""The bootstrap tests' topology and driver process (``test_state_load.py``, ``tests/testing/test_initial_state.py``).

Log-shaped input: one JSON-lines file per day (``clicks-2026-01-01.jsonl``, ...), each
day's clicks by user, with duplicates (a line repeated in its file: the same click id) and
disorder across files (each file also holds clicks of the previous day's last hours).
:class:`ClickLog` reads the files in order, one batch per file; the injector's low
watermark after a file is the oldest timestamp still to come (the next file's first
possible click), so no click is late. ``cap``: the watermark never passes it and the
source ends there without finishing, which leaves the computation at a point in time:
days before it closed, the last one open with its timer pending.

``DailyClicks``: :class:`~computations.windowing.WindowCounter` (per-record) or
:class:`~computations.columnar_windowing.ColumnarWindowCounter` (columnar; ``arrow``: on
the Arrow mapping), one-day windows, counting each user's clicks per day into ``daily``.

    python tests/runtime/bootstrap_driver.py ROOT DATA FIRST LAST {record|columnar|arrow}
        [--layout keys] [--initial STATE.pkl | --initial-path FILE] [--dump FILE]

runs files ``FIRST..LAST`` (1-based days) on local Spark until drained, with
``MILLWHEEL_CRASH`` (``millwheel/runtime/_outbox.py``) honoured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from millwheel import MAX_TIMESTAMP, Record, Topology  # noqa: E402
from millwheel._sources import Source, SourceBatch  # noqa: E402

DAY = 86_400_000
#: 2026-01-01 00:00 UTC
START = 1_767_225_600_000
#: how far into the previous day a file's clicks reach (its disorder)
SPILL = 6 * 3_600_000
NAME = "DailyClicks"


def day_start(day: int) -> int:
    return START + (day - 1) * DAY


def file_name(day: int) -> str:
    return f"clicks-2026-01-{day:02d}.jsonl"


def write_clicks(data: Path, days: int, per_day: int, users: int = 40, seed: int = 7) -> list[dict]:
    """The log files; returns every line written (duplicates included)."""
    rng = random.Random(seed)
    data.mkdir(parents=True, exist_ok=True)
    lines_all = []
    for d in range(1, days + 1):
        lines = []
        lo = day_start(d) - (SPILL if d > 1 else 0)
        for i in range(per_day):
            rec = {
                "id": f"c{d}-{i}",
                "ts": rng.randrange(lo, day_start(d) + DAY),
                "user": f"u{rng.randrange(users)}",
            }
            lines.append(rec)
            if rng.random() < 0.05:  # the same click logged twice
                lines.insert(rng.randrange(len(lines) + 1), dict(rec))
        (data / file_name(d)).write_text("".join(json.dumps(r) + "\n" for r in lines))
        lines_all += lines
    return lines_all


def batch_answer(lines: list[dict]) -> Counter:
    """The plain batch computation: distinct clicks per (day, user)."""
    seen = {r["id"]: r for r in lines}
    return Counter((r["ts"] // DAY * DAY, r["user"]) for r in seen.values())


def as_answer(values: list[dict]) -> Counter:
    """``daily`` productions as the batch answer's form."""
    out: Counter = Counter()
    for v in values:
        out[(v["window_start"], v["key"])] += v["count"]
    return out


class ClickLog(Source):
    """The day files ``first..last`` of ``data``, one batch per file (module docstring)."""

    def __init__(self, data: str, first: int, last: int, cap: int | None = None) -> None:
        self.data, self.first, self.last, self.cap = data, first, last, cap

    def batches(self, injector: str = "clicks", stream: str = "clicks") -> Iterator[SourceBatch]:
        for d in range(self.first, self.last + 1):
            recs = []
            with open(os.path.join(self.data, file_name(d))) as f:
                for line in f:
                    r = json.loads(line)
                    recs.append(Record(None, r, r["ts"], r["id"]))
            wm = day_start(d + 1) - SPILL  # the next file's oldest possible click
            if self.cap is not None:
                wm = min(wm, self.cap)
            yield SourceBatch(recs, wm)
        if self.cap is None:
            yield SourceBatch([], MAX_TIMESTAMP)


def cap_after(day: int) -> int:
    """The watermark once file ``day`` is read (days before it close, ``day`` stays open)."""
    return day_start(day + 1) - SPILL


def build(
    data: str,
    first: int,
    last: int,
    kind: str = "record",
    *,
    cap: int | None = None,
    initial_state: Any = None,
) -> Topology:
    t = Topology("clicks")
    t.injector("clicks", ClickLog(data, first, last, cap))
    if kind == "record":
        from computations.windowing import WindowCounter as counter
    else:
        from computations.columnar_windowing import ColumnarWindowCounter as counter
    opts = dataclasses.replace(counter.options, mapping="arrow") if kind == "arrow" else None
    t.computation(
        counter,
        name=NAME,
        inputs={"clicks": lambda r: r.value["user"]},
        outputs=["daily"],
        options=opts,
        params={"window_ms": DAY, "trailing_empty": 0, "output": "daily"},
        initial_state=initial_state,
    )
    return t


def harness_state(h: Any) -> list[tuple[Any, Any, dict]]:
    """``(key, state, timers)`` of every key of ``DailyClicks`` in harness ``h``."""
    out = []
    for k in h.keys(NAME):
        st = h.state(NAME, k)
        if st is not None and hasattr(st, "columns"):
            st = st.drop(columns=["key"])
        out.append((k, st, {t.tag: (t.timestamp, t.domain) for t in h.timers(NAME, k)}))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("data")
    p.add_argument("first", type=int)
    p.add_argument("last", type=int)
    p.add_argument("kind", choices=["record", "columnar", "arrow"])
    p.add_argument("--layout", default="intervals")
    p.add_argument("--initial", help="a pickle of (key, state, timers) items")
    p.add_argument("--initial-path", help="a Parquet or JSON-lines file")
    p.add_argument("--dump")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    initial: Any = args.initial_path
    if args.initial:
        with open(args.initial, "rb") as f:
            initial = pickle.load(f)
    topo = build(args.data, args.first, args.last, args.kind, initial_state=initial)
    settings = RuntimeSettings(drain=True, intervals=4, master="local[2]", state_layout=args.layout)
    rt = SparkRuntime(topo, args.root, settings, log=lambda m: print(m, flush=True))
    rt.run(timeout_s=args.timeout)
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(rt.values("daily"), f)
    print("DRAINED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
