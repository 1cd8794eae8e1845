"""The worker side: key extraction, then the per-key step over one key interval (MillWheel §7.1).

This module is Arrow/pandas plumbing around the delivery core (``millwheel/_delivery.py``:
keying, step planning, due timers) and the per-key step (``millwheel/_step.py``), the same
calls the in-memory harness makes.

Spark groups a computation's input by *key interval* (a hash range of the consumer's
encoded key), not by raw key: each Spark group costs a pandas frame in and out, so one
group per key is two orders of magnitude slower (``docs/architecture.md``). The interval's GroupState row holds
``envs`` (key -> envelope, msgpack) and ``meta`` (key -> [hold, next low-watermark timer,
next wall timer]). A batch decodes the map once, runs :meth:`StepRunner.step` for the keys
that have input or due timers, and re-encodes the map; envelopes of untouched keys stay
opaque bytes, so they cost a copy, not a decode. State, timers and dedup ids of every key
commit atomically with Spark's state store at the end of the micro-batch (§6.2).

Time (§4.5, §4.6, §7.2):

* the **low watermark** is Spark's event-time watermark, which the driver drives with
  heartbeat rows carrying the framework's input low watermark (``withWatermark(..., "0
  seconds")``). It is recorded in Spark's offset log, so a replayed batch sees the same
  value. Low-watermark timers map onto Spark's single ``EventTimeTimeout`` per group: the
  earliest pending timer of the interval.
* **wall time** is the batch's processing time (also fixed per batch and replay); wall
  timers fire when a batch runs for the interval, and the driver sends a tick row to an
  interval whose earliest wall timer is due.

Productions are not kept pending in the envelope here: the runtime checkpoints them in the
batch's outbox, which commits with the state (see ``_query.py`` and ``docs/runtime.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pandas as pd
import xxhash

from millwheel._codec import decode_value, encode_value
from millwheel._deadletter import DEAD_LETTER_STREAM
from millwheel._delivery import key_record, plan_steps, timers_due
from millwheel._once import resolve_once
from millwheel._record import MIN_TIMESTAMP, Production, Record, decode_key, encode_key
from millwheel._step import StepRunner
from millwheel._topology import ComputationSpec
from millwheel.runtime._wire import (
    SUMMARY_STREAM,
    IntervalSummary,
    RowKind,
    from_spark,
    timer_timeout,
)

_packb = msgpack.packb
_unpackb = msgpack.unpackb
_hash = xxhash.xxh3_64_intdigest

#: step metrics summed per interval and reported in the summary row
METRICS = (
    "records_in", "duplicates", "late", "late_dropped", "late_to_stream", "processed",
    "timers_fired", "productions", "dead_letters", "dead_letters_dropped", "once_committed", "once_conflicts",
)  # fmt: skip
#: the ones the per-key step counts (the others are counted around it)
STEP_METRICS = METRICS[:-2]


def interval_of(encoded_key: bytes, intervals: int) -> int:
    """The key interval of an encoded key: a stable hash range (same in every process)."""
    return _hash(encoded_key) % intervals


def make_key_extractor(consumer: str, stream: str, extractor: Callable[[Record], Any], intervals: int) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A ``mapInPandas`` function: stream-log rows -> rows keyed by the consumer's extractor (§4.2)."""

    def extract(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        rows_read: dict[str, int] = {}  # rows of each file seen so far in this partition
        for pdf in frames:
            srcs = pdf["src"].tolist()
            o_row = [0] * len(srcs)
            for i, src in enumerate(srcs):
                o_row[i] = rows_read[src] = rows_read.get(src, -1) + 1
            ids = pdf["id"].tolist()
            tss = pdf["ts"].tolist()
            pkeys = pdf["key"].tolist()
            vals = pdf["value"].tolist()
            n = len(ids)
            o_interval = [0] * n
            o_kind = [int(RowKind.RECORD)] * n
            o_key: list[bytes | None] = [None] * n
            o_id = list(ids)
            o_ts = list(tss)
            o_val = list(vals)
            cache: dict[Any, tuple[bytes, int]] = {}
            for i in range(n):
                rec = Record(decode_key(pkeys[i]), decode_value(vals[i]), tss[i], ids[i])
                keyed, dead = key_record(consumer, stream, extractor, rec)
                if keyed is not None:
                    key = keyed.key
                    hit = cache.get((type(key), key))
                    if hit is None:
                        kb = encode_key(key)  # type: ignore[arg-type]
                        hit = cache[(type(key), key)] = (kb, _hash(kb) % intervals)
                    o_key[i], o_interval[i] = hit
                    continue
                o_interval[i] = _hash(str(ids[i]).encode()) % intervals
                if dead is None:
                    o_kind[i] = int(RowKind.DROPPED)
                    continue
                o_kind[i] = int(RowKind.DEAD_LETTER)
                o_id[i], o_ts[i], o_val[i] = dead.id, dead.timestamp, encode_value(dead.value)
            yield pd.DataFrame(
                {"interval": o_interval, "kind": o_kind, "key": o_key, "id": o_id, "ts": o_ts, "value": o_val,
                 "wm": pdf["wm"], "stream": [stream] * n, "src": srcs, "row": o_row, "now": [None] * n}
            )  # fmt: skip

    return extract


def _send_order(row: tuple[Any, ...]) -> tuple[int, str, int]:
    w = row[3]
    return (MIN_TIMESTAMP if w is None or w != w else int(w), row[5] or "", row[6] or 0)


class _Out:
    """The rows one interval emits: productions, dead letters, the summary."""

    __slots__ = ("stream", "id", "ts", "key", "value")

    def __init__(self) -> None:
        self.stream: list[str] = []
        self.id: list[str | None] = []
        self.ts: list[int | None] = []
        self.key: list[bytes | None] = []
        self.value: list[bytes] = []

    def add(self, stream: str, rid: str | None, ts: int | None, key: bytes | None, value: bytes) -> None:
        self.stream.append(stream)
        self.id.append(rid)
        self.ts.append(ts)
        self.key.append(key)
        self.value.append(value)

    def add_production(self, p: Production) -> None:
        r = p.record
        value = p.encoded if p.encoded is not None else encode_value(r.value)
        self.add(p.stream, r.id, r.timestamp, None if r.key is None else encode_key(r.key), value)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"stream": self.stream, "id": self.id, "ts": self.ts, "key": self.key, "value": self.value, "wm": [None] * len(self.id)})


class IntervalStep:
    """The ``applyInPandasWithState`` function of one computation. Picklable; builds its
    :class:`StepRunner` lazily, once per Python worker."""

    def __init__(self, spec: ComputationSpec, *, pipeline: str = "default", registry: Callable[[], Any] | None = None) -> None:
        self.spec = spec
        self.pipeline = pipeline
        #: a picklable factory of the IdRegistry client that ``once_id`` productions commit to
        self.registry_factory = registry
        self._runner: StepRunner | None = None
        self._registry: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "pipeline": self.pipeline, "registry": self.registry_factory}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.spec = d["spec"]
        self.pipeline = d["pipeline"]
        self.registry_factory = d["registry"]
        self._runner = None
        self._registry = None

    def registry(self) -> Any:
        if self._registry is None and self.registry_factory is not None:
            self._registry = self.registry_factory()
        return self._registry

    def runner(self) -> StepRunner:
        if self._runner is None:
            spec = self.spec
            # strong productions are checkpointed in the batch outbox, not in the envelope
            opts = dataclasses.replace(spec.options, strong_productions=False)
            self._runner = StepRunner(spec.instantiate(), name=spec.name, outputs=spec.all_outputs, options=opts)
        return self._runner

    def __call__(self, group: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        interval = int(group[0])
        lw = from_spark(state.getCurrentWatermarkMs())
        now = state.getCurrentProcessingTimeMs()
        totals = dict.fromkeys(METRICS, 0)
        out = _Out()
        once: list[tuple[Any, Production]] = []
        # key bytes -> [(id, ts, value bytes, sender watermark, stream, source file, row)]
        per_key: dict[bytes, list[tuple[str, int, bytes, Any, str, str, int]]] = {}
        for pdf in frames:
            if interval < 0:
                continue  # the heartbeat group: it only moves Spark's watermark
            ids = pdf["id"].tolist()
            kinds = pdf["kind"].tolist()
            keys = pdf["key"].tolist()
            tss = pdf["ts"].tolist()
            vals = pdf["value"].tolist()
            nows = pdf["now"].tolist()
            wms = pdf["wm"].tolist()
            streams = pdf["stream"].tolist()
            srcs = pdf["src"].tolist()
            rownos = pdf["row"].tolist()
            for i in range(len(ids)):
                kind = kinds[i]
                if kind != kind or kind is None:  # a tick: a wall timer of this interval is due
                    t = nows[i]
                    if t == t and t is not None and t > now:
                        now = int(t)
                    continue
                if kind != RowKind.RECORD:
                    totals["records_in"] += 1
                    if kind == RowKind.DROPPED:
                        totals["dead_letters_dropped"] += 1
                    else:
                        totals["dead_letters"] += 1
                        out.add(DEAD_LETTER_STREAM, ids[i], tss[i], None, vals[i])
                    continue
                row = (ids[i], tss[i], vals[i], wms[i], streams[i], srcs[i], rownos[i])
                lst = per_key.get(keys[i])
                if lst is None:
                    per_key[keys[i]] = [row]
                else:
                    lst.append(row)
        if interval < 0:
            return
        step = self.runner().step
        if state.exists:
            envs_b, meta_b = state.get
            envs = _unpackb(envs_b, raw=False, strict_map_key=False)
            meta = _unpackb(meta_b, raw=False, strict_map_key=False)
        else:
            envs, meta = {}, {}
        for kb, (_hold, nlw, nwall) in meta.items():
            if kb not in per_key and timers_due(nlw, nwall, lw, now):
                per_key[kb] = []
        for kb, rows in per_key.items():
            key = decode_key(kb)
            env = envs.get(kb)
            if len(rows) > 1:
                # send order: Spark reads a batch's files in any order; sender watermarks
                # only grow, and file names sort in publication order
                rows.sort(key=_send_order)
            items = [
                (Record(key, decode_value(v), int(t), rid, stream), None if w is None or w != w else int(w))
                for rid, t, v, w, stream, _, _ in rows
            ]
            for call in plan_steps(items, lw):
                res = step(key, env, call.records, low_watermark=call.low_watermark, now=now, late_watermark=call.late_watermark)  # type: ignore[arg-type]
                env = res.envelope
                m = res.metrics
                for name in STEP_METRICS:
                    totals[name] += m[name]
                for plist in (res.productions, res.dead_letters):
                    for p in plist:
                        if p.once_id is not None:
                            once.append((key, p))
                            continue
                        out.add_production(p)
            if env is None:
                envs.pop(kb, None)
                meta.pop(kb, None)
            else:
                envs[kb] = env
                if res.hold is None and res.next_low_watermark_timer is None and res.next_wall_timer is None:
                    meta.pop(kb, None)
                else:
                    meta[kb] = [res.hold, res.next_low_watermark_timer, res.next_wall_timer]
        if once:
            # one IdRegistry round trip for the interval's whole batch (Photon §2); a replay
            # commits the same ids with the same tokens and gets the same answers
            outcome = resolve_once(once, self.registry(), pipeline=self.pipeline, computation=self.spec.name)
            totals["once_committed"] += outcome.committed
            totals["once_conflicts"] += outcome.conflicts
            totals["dead_letters"] += len(outcome.dead_letters)
            for _, p in once:
                if p.record.id not in outcome.dropped:
                    out.add_production(p)
            for p in outcome.dead_letters:
                out.add_production(p)
        if envs:
            state.update((_packb(envs, use_bin_type=True), _packb(meta, use_bin_type=True)))
        elif state.exists:
            state.remove()
        hold = nlw_min = nwall_min = None
        for h, t_lw, t_wall in meta.values():
            if h is not None and (hold is None or h < hold):
                hold = h
            if t_lw is not None and (nlw_min is None or t_lw < nlw_min):
                nlw_min = t_lw
            if t_wall is not None and (nwall_min is None or t_wall < nwall_min):
                nwall_min = t_wall
        if nlw_min is not None and envs:
            state.setTimeoutTimestamp(max(timer_timeout(nlw_min), state.getCurrentWatermarkMs()))
        summary = IntervalSummary(interval, hold, nlw_min, nwall_min, len(envs), totals, lw, now)
        out.add(SUMMARY_STREAM, None, 0, None, summary.encode())
        yield out.frame()
