"""The harness side of columnar computations (``millwheel/_columnar.py``).

A columnar computation keeps one store for all its keys in the harness (the Spark runtime
keeps one per key interval); each round runs :meth:`ColumnarRunner.run` over its queued
input and due timers — the same call the Spark worker makes — and the harness keeps its
per-key indexes (holds, next timers) from the keys the run touched, so watermarks and
due keys work as for per-record computations.

The store is kept decoded between rounds (a paced replay makes thousands of small rounds,
and decoding and encoding the whole store in each cost more than the round): a round runs
on a copy, which the checkpoint keeps and a crash before it throws away; a restart
recovers from the store's bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from millwheel._colbatch import _to_arrow
from millwheel._columnar import ColumnarRunner, ColumnarStore, InputColumns, is_columnar
from millwheel._counters import StepMetrics
from millwheel._delivery import commit_once
from millwheel._errors import HarnessError
from millwheel._fields import StreamFields
from millwheel._record import Key, TimeDomain, Timer, decode_key, encode_key, key_problem
from millwheel.testing._rounds import Crash, _Outgoing


def columnar_sides(harness: Any) -> dict[str, ColumnarSide]:
    """A :class:`ColumnarSide` per columnar computation of the harness's topology."""
    return {
        name: ColumnarSide(
            name,
            runner,
            {
                s: f
                for s, f in harness.topology.fields.items()
                if s in harness.topology.computations[name].inputs
            },
        )
        for name, runner in harness._runners.items()
        if is_columnar(type(runner.computation))
    }


class ColumnarSide:
    """One columnar computation in the harness: its store and its rounds."""

    def __init__(self, name: str, step_runner: Any, fields: dict[str, StreamFields]) -> None:
        self.name = name
        #: the declared fields of its input streams (the types of its ``value.<field>`` columns)
        self.fields = fields
        self.runner = ColumnarRunner(
            step_runner.computation,
            name=name,
            outputs=step_runner.outputs,
            options=step_runner.options,
            fields=fields,
        )
        #: the committed store, decoded (``None``: nothing kept yet)
        self.live: ColumnarStore | None = None

    @property
    def store(self) -> bytes | None:
        """The committed store as the runtime would keep it (its bytes)."""
        return None if self.live is None else self.live.copy().encode()

    def _current(self) -> ColumnarStore:
        return (
            self.live if self.live is not None else ColumnarStore.decode(None, self.runner.options)
        )

    def restarted(self, step_runner: Any) -> None:
        self.runner = ColumnarRunner(
            step_runner.computation,
            name=self.name,
            outputs=step_runner.outputs,
            options=step_runner.options,
            fields=self.fields,
        )
        data = self.store  # a new process: what survives is what was committed, as bytes
        self.live = None if data is None else ColumnarStore.decode(data, self.runner.options)

    def process(self, h: Any, *, deliver: bool, crash: Crash | None) -> None:
        name = self.name
        lw, now = h._input_watermark(name), h._now
        queue = list(h._queues[name])
        recs = InputColumns(
            kbs=[encode_key(q.record.key) for q in queue],  # type: ignore[arg-type]
            ids=[q.record.id for q in queue],
            ts=np.fromiter((q.record.timestamp for q in queue), np.int64, len(queue)),
            streams=[q.record.stream for q in queue],  # type: ignore[misc]
            values=[q.record.value for q in queue],
            arrival=[q.arrival_watermark for q in queue],
            encoded=False,
        )
        res = self.runner.run(
            self._current().copy(),
            recs,
            low_watermark=lw,
            now=now,
            key_summaries=True,
            encode=False,
            life=h.round_life(name),
        )
        metrics = StepMetrics(**res.metrics)
        store, summaries = res.decoded, dict(res.key_summaries or {})
        once_letters: list[Any] = []
        if res.once_ids is not None:
            # one IdRegistry call for the round (Photon §2), as the per-record rounds: what
            # another pipeline holds is dropped from the outgoing and from the checkpoint
            outcome = commit_once(
                [(p.record.key, p) for p in res.productions()],
                h.registry,
                pipeline=h.pipeline_id,
                computation=name,
                metrics=metrics,
            )
            if outcome.dropped:
                res.drop(outcome.dropped)
                store, acked = self.runner.acknowledge(store, outcome.dropped)
                summaries.update(acked)
            once_letters = outcome.dead_letters
        strong = self.runner.options.strong_productions
        sent = [_Outgoing(name, p.record.key, p, strong) for p in res.productions()]
        sent += [
            _Outgoing(name, d.record.value.key, d, False)
            for d in [*res.dead_letters, *once_letters]
        ]
        weak = [o for o in sent if not o.strong]
        if weak:
            wm = h._publish_watermark(name)
            for o in weak:
                h._deliver_one(o, wm)
        if crash is Crash.BEFORE_COMMIT:
            return
        del h._queues[name][: len(queue)]
        h._rounds[name] += 1
        h._metrics[name].add(metrics)
        self.live = store
        for kb, (hold, nlw, nwall) in summaries.items():
            h._store(name, decode_key(kb), None, hold, (nlw, nwall))  # type: ignore[arg-type]
        h._outbox[name] += [o for o in sent if o.strong]
        if crash is Crash.AFTER_COMMIT:
            h._outbox[name] = []
            return
        if deliver:
            h.deliver(name, crash=crash)

    def acknowledge(self, h: Any, ids: list[str]) -> None:
        self.live, summaries = self.runner.acknowledge(self._current(), ids)
        for kb, (hold, nlw, nwall) in summaries.items():
            h._store(self.name, decode_key(kb), None, hold, (nlw, nwall))  # type: ignore[arg-type]

    def pending(self) -> list[Any]:
        return [p for _, p in self.runner.pending(self._current())]

    # ---- reading -------------------------------------------------------------------
    def state(self, key: Key) -> pd.DataFrame | None:
        """The state rows of ``key`` (``None``: it keeps none)."""
        found = self._current().state_rows([encode_key(key)])
        if found is None:
            return None
        df = found[0].drop_columns(["_kb"]).to_pandas()
        df.insert(0, "key", [key] * len(df))
        return df

    def set_state(self, key: Key, rows: pd.DataFrame | None) -> None:
        """Seed (or replace) one key's state rows (``None``: clear them); the rest is kept."""
        why = key_problem(key)
        if why is not None:
            msg = f"set_state({self.name!r}, ...): {why}"
            raise HarnessError(msg)
        if rows is not None and (not isinstance(rows, pd.DataFrame) or "key" in rows.columns):
            msg = f"set_state({self.name!r}, key, rows): a columnar computation's state is a DataFrame of its columns, without 'key'"
            raise HarnessError(msg)
        st = self._current()
        kb = encode_key(key)
        if st.state is not None and st.state.num_rows:
            st.state = st.state.filter(
                pc.invert(pc.equal(st.state.column("_kb"), pa.scalar(kb, pa.binary())))
            )
        if rows is not None and len(rows):
            table = _to_arrow(rows).add_column(0, "_kb", pa.array([kb] * len(rows), pa.binary()))
            st.state = (
                table
                if st.state is None or not st.state.num_rows
                else pa.concat_tables([st.state, table], promote_options="permissive")
            )
        self.live = st

    def dedup_ids(self, key: Key) -> set[str]:
        """The ids ``key`` still remembers."""
        d = self._current().dedup
        k = d.key_index.get(encode_key(key))
        if k is None:
            return set()
        # row i's id is ``ids[ptr[i]]`` (rows sorted by key, ids in the order they came)
        return set(d.ids.take(pa.array(d.ptr[d.kix == k])).to_pylist())

    def timers(self, key: Key) -> list[Timer]:
        kb = encode_key(key)
        st = self._current()
        items = sorted((ts, d, tag) for (k, tag), (ts, d) in st.timers.items() if k == kb)
        return [Timer(tag, ts, TimeDomain(d)) for ts, d, tag in items]

    def keys(self) -> list[Key]:
        st = self._current()
        kbs = set(st.meta) | {kb for kb, _ in st.timers}
        if st.state is not None:
            kbs |= set(st.state.column("_kb").to_pylist())
        return [decode_key(kb) for kb in sorted(kbs)]  # type: ignore[misc]
