"""The conformance suite's computation, in both kinds, and its topology.

A keyed windowed count: records ``{"key", "id"}`` keyed by ``key``, counted per
``WINDOW_MS`` event-time window; a low-watermark timer at each window's end produces
``{"key", "window", "count"}`` to ``counts`` at that time. Deduplication by record id
(``SLACK_MS`` behind the watermark, collected at every step), late records to the ``late``
stream, strong productions: the semantics ``model.py`` states, which
:class:`WindowCount` (per record) and :class:`ColumnarWindowCount` (a batch of many keys as
columns) implement each in its own way.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from millwheel import (
    ColumnarComputation,
    Computation,
    ComputationOptions,
    DedupOptions,
    LatePolicy,
    Topology,
)

from .scenario import SLACK_MS, WINDOW_MS, Scenario, ScriptSource

NAME = "Count"
OPTIONS = ComputationOptions(
    strong_productions=True,
    late=LatePolicy.to_stream("late"),
    dedup=DedupOptions(slack_ms=SLACK_MS, gc_interval_ms=0),
)


class WindowCount(Computation):
    """Per record: the state maps window start -> count; a timer per window."""

    def process_record(self, record):
        start = record.timestamp // WINDOW_MS * WINDOW_MS
        counts = self.state.get({})
        counts[start] = counts.get(start, 0) + 1
        self.state.set(counts)
        self.set_timer(f"w{start}", start + WINDOW_MS)

    def process_timer(self, timer):
        counts = self.state.get({})
        start = timer.timestamp - WINDOW_MS
        self.produce(
            "counts",
            {"key": self.key, "window": start, "count": counts.pop(start)},
            timestamp=timer.timestamp,
        )
        self.state.set(counts or None)


class ColumnarWindowCount(ColumnarComputation):
    """As columns: state rows ``(key, start, count)``; due windows found with one merge."""

    record_columns = ("key", "timestamp")

    def process_batch(self, batch):
        r = batch.records
        new = (
            pd.DataFrame(
                {
                    "key": r["key"].tolist(),
                    "start": r["timestamp"].to_numpy() // WINDOW_MS * WINDOW_MS,
                }
            )
            .groupby(["key", "start"], sort=False)
            .size()
            .rename("count")
            .reset_index()
        )
        old = batch.state
        rows = pd.concat([old[["key", "start", "count"]], new]) if len(old) else new
        rows = rows.groupby(["key", "start"], sort=False, as_index=False)["count"].sum()
        batch.set_state(rows.astype({"start": "int64", "count": "int64"}))
        starts = new["start"].to_numpy(np.int64)
        batch.set_timers(
            new["key"].tolist(), [f"w{s}" for s in starts.tolist()], starts + WINDOW_MS
        )

    def process_timers(self, batch, timers):
        st = batch.state
        due = pd.DataFrame(
            {
                "key": timers["key"].tolist(),
                "start": timers["timestamp"].to_numpy(np.int64) - WINDOW_MS,
            }
        )
        st = st.assign(key=st["key"].tolist())
        fired = due.merge(st, on=["key", "start"], how="inner")
        values = [
            {"key": k, "window": s, "count": c}
            for k, s, c in zip(
                fired["key"].tolist(), fired["start"].tolist(), fired["count"].tolist(), strict=True
            )
        ]
        batch.produce(
            "counts",
            values,
            keys=fired["key"].tolist(),
            timestamps=fired["start"].to_numpy(np.int64) + WINDOW_MS,
        )
        gone = set(zip(fired["key"].tolist(), fired["start"].tolist(), strict=True))
        keep = [
            (k, s) not in gone
            for k, s in zip(st["key"].tolist(), st["start"].tolist(), strict=True)
        ]
        batch.set_state(
            st[keep][["key", "start", "count"]].astype({"start": "int64", "count": "int64"})
        )


KINDS = {"per-record": WindowCount, "columnar": ColumnarWindowCount}


def topology(
    scenario: Scenario, kind: str, *, upto: int | None = None, mapping: str = "default"
) -> Topology:
    """The scenario's injector ``events`` (its batches up to ``upto``) -> ``Count`` of ``kind``
    -> ``counts`` and ``late``; ``mapping``: the Spark mapping of a columnar one."""
    t = Topology("conformance")
    t.injector("events", ScriptSource(scenario, upto))
    options = OPTIONS if mapping == "default" else dataclasses.replace(OPTIONS, mapping=mapping)
    t.computation(
        KINDS[kind],
        name=NAME,
        inputs={"events": lambda r: r.value["key"]},
        outputs=["counts", "late"],
        options=options,
    )
    return t
