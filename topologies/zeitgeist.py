"""Zeitgeist (MillWheel §2, Fig. 1, Fig. 9): query events -> WindowCounter -> DipDetector.

Run it with ``millwheel run topologies/zeitgeist.py``. The built-in sample is a seeded
stream of search queries in which one popular query stops arriving for a few seconds.
"""

from __future__ import annotations

import random

from computations.anomalies import DipDetector
from computations.windowing import WindowCounter
from millwheel import Record, SampleSource, Topology

QUERIES = ["weather", "news", "cats", "football", "recipes", "flights", "stocks", "movies"]


def sample_events(seed: int = 7, seconds: int = 60, rate_per_s: int = 400, dip: tuple[str, int, int] = ("cats", 30, 36)) -> list[Record]:
    """Seeded query events, Zipf-like popularity, with ``dip`` = (query, from_s, to_s) missing."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(QUERIES))]
    out: list[Record] = []
    n = 0
    for second in range(seconds):
        for _ in range(rate_per_s):
            q = rng.choices(QUERIES, weights)[0]
            if q == dip[0] and dip[1] <= second < dip[2]:
                continue
            ts = second * 1_000 + rng.randrange(1_000)
            out.append(Record(None, {"query": q, "ts": ts}, ts, f"q-{n}"))
            n += 1
    # mild out-of-order arrival, as from several log files
    out.sort(key=lambda r: r.timestamp + rng.randrange(300))
    return out


def build(events: list[Record] | None = None) -> Topology:
    t = Topology("zeitgeist")
    t.injector("queries", SampleSource(events if events is not None else sample_events(), batch_size=2_000))
    t.computation(WindowCounter, inputs={"queries": lambda r: r.value["query"]}, outputs=["window_counts"])
    t.computation(
        DipDetector,
        inputs={"window_counts": lambda r: r.value["key"]},
        outputs=["dips"],
        params={"confidence_threshold": 2, "dip_ratio": 0.3},
    )
    t.sink("dips")
    return t


topology = build()
