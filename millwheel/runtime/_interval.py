"""The worker side: key extraction, then the per-key step over one key interval (MillWheel §7.1).

Spark groups a computation's input by *key interval* (a hash shard of the consumer's
key), not by raw key: each Spark group costs a pandas frame in and out, so one group per
key is two orders of magnitude slower (design.md). The interval's GroupState row holds
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

from millwheel._record import MIN_TIMESTAMP, Record
from millwheel._step import DEAD_LETTER_STREAM, StepRunner
from millwheel._topology import ComputationSpec
from millwheel.runtime._wire import (
    SUMMARY_STREAM,
    decode_value,
    encode_value,
    from_spark,
    timer_timeout,
)

_packb = msgpack.packb
_unpackb = msgpack.unpackb
_hash = xxhash.xxh3_64_intdigest

#: step metrics summed per interval and reported in the summary row
METRICS = (
    "records_in", "duplicates", "late", "late_dropped", "late_to_stream", "processed",
    "timers_fired", "productions", "dead_letters",
)  # fmt: skip


def shard_of(encoded_key: bytes, intervals: int) -> int:
    """The key interval of an encoded key: a stable hash shard (same in every process)."""
    return _hash(encoded_key) % intervals


def make_key_extractor(consumer: str, stream: str, extractor: Callable[[Record], Any], intervals: int) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A ``mapInPandas`` function: stream-log rows -> rows keyed by the consumer's extractor (§4.2)."""
    loads = decode_value
    unpack = _unpackb

    def extract(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in frames:
            ids = pdf["id"].tolist()
            tss = pdf["ts"].tolist()
            pkeys = pdf["key"].tolist()
            vals = pdf["value"].tolist()
            n = len(ids)
            shards = [0] * n
            keys: list[bytes | None] = [None] * n
            errs: list[str | None] = [None] * n
            cache: dict[Any, tuple[bytes, int]] = {}
            for i in range(n):
                pk = pkeys[i]
                try:
                    rec = Record(None if pk is None else unpack(pk, raw=False), loads(vals[i]), tss[i], ids[i])
                    key = extractor(rec)
                    hit = cache.get((type(key), key))
                    if hit is None:
                        if not isinstance(key, (str, int, bytes)) or isinstance(key, bool):
                            msg = f"key extractor returned {type(key).__name__} {key!r}; keys must be str, int or bytes"
                            raise TypeError(msg)
                        kb = _packb(key, use_bin_type=True)
                        hit = cache[(type(key), key)] = (kb, _hash(kb) % intervals)
                    keys[i], shards[i] = hit
                except Exception as exc:
                    shards[i] = _hash(str(ids[i]).encode()) % intervals
                    errs[i] = f"{stream}\x00{type(exc).__name__}: {exc}"
            yield pd.DataFrame(
                {"shard": shards, "key": keys, "id": ids, "ts": tss, "value": vals, "wm": pdf["wm"], "err": errs, "now": [None] * n}
            )

    return extract


class IntervalStep:
    """The ``applyInPandasWithState`` function of one computation. Picklable; builds its
    :class:`StepRunner` lazily, once per Python worker."""

    def __init__(self, spec: ComputationSpec) -> None:
        self.spec = spec
        self._runner: StepRunner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.spec = d["spec"]
        self._runner = None

    def runner(self) -> StepRunner:
        if self._runner is None:
            spec = self.spec
            # strong productions are checkpointed in the batch outbox, not in the envelope
            opts = dataclasses.replace(spec.options, strong_productions=False)
            self._runner = StepRunner(spec.instantiate(), name=spec.name, outputs=spec.all_outputs, options=opts)
        return self._runner

    def __call__(self, group: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        shard = int(group[0])
        lw = from_spark(state.getCurrentWatermarkMs())
        now = state.getCurrentProcessingTimeMs()
        per_key: dict[bytes, list[tuple[str, int, bytes, Any]]] = {}
        bad: list[tuple[str, int, bytes, str]] = []
        for pdf in frames:
            ids = pdf["id"].tolist()
            if shard < 0:
                continue  # the heartbeat group: it only moves Spark's watermark
            keys = pdf["key"].tolist()
            tss = pdf["ts"].tolist()
            vals = pdf["value"].tolist()
            errs = pdf["err"].tolist()
            nows = pdf["now"].tolist()
            wms = pdf["wm"].tolist()
            for i in range(len(ids)):
                rid = ids[i]
                if rid is None:  # a tick: a wall timer of this interval is due
                    t = nows[i]
                    if t == t and t is not None and t > now:
                        now = int(t)
                    continue
                err = errs[i]
                if err is not None:
                    bad.append((rid, tss[i], vals[i], err))
                    continue
                kb = keys[i]
                lst = per_key.get(kb)
                if lst is None:
                    per_key[kb] = [(rid, tss[i], vals[i], wms[i])]
                else:
                    lst.append((rid, tss[i], vals[i], wms[i]))
        if shard < 0:
            return
        runner = self.runner()
        step = runner.step
        if state.exists:
            envs_b, meta_b = state.get
            envs = _unpackb(envs_b, raw=False, strict_map_key=False)
            meta = _unpackb(meta_b, raw=False, strict_map_key=False)
        else:
            envs, meta = {}, {}
        for kb, (_hold, nlw, nwall) in meta.items():
            if kb not in per_key and ((nlw is not None and nlw <= lw) or (nwall is not None and nwall <= now)):
                per_key[kb] = []
        o_stream: list[str] = []
        o_id: list[str | None] = []
        o_ts: list[int | None] = []
        o_key: list[bytes | None] = []
        o_val: list[bytes] = []
        totals = dict.fromkeys(METRICS, 0)
        loads = decode_value
        unpack = _unpackb
        for kb, rows in per_key.items():
            key = unpack(kb, raw=False)
            env = envs.get(kb)
            for late_wm, recs in _runs(key, rows, lw, loads):
                res = step(key, env, recs, low_watermark=lw, now=now, late_watermark=late_wm)
                env = res.envelope
                m = res.metrics
                for name in METRICS:
                    totals[name] += m[name]
                for plist in (res.productions, res.dead_letters):
                    for p in plist:
                        r = p.record
                        o_stream.append(p.stream)
                        o_id.append(r.id)
                        o_ts.append(r.timestamp)
                        o_key.append(None if r.key is None else _packb(r.key, use_bin_type=True))
                        o_val.append(encode_value(r.value))
            if env is None:
                envs.pop(kb, None)
                meta.pop(kb, None)
            else:
                envs[kb] = env
                if res.hold is None and res.next_low_watermark_timer is None and res.next_wall_timer is None:
                    meta.pop(kb, None)
                else:
                    meta[kb] = [res.hold, res.next_low_watermark_timer, res.next_wall_timer]
        name = self.spec.name
        for rid, ts, val, err in bad:
            stream, reason = err.split("\x00", 1)
            value = {"computation": name, "stream": stream, "what": "key_extractor", "reason": reason, "item": Record(None, loads(val), ts, rid)}
            o_stream.append(DEAD_LETTER_STREAM)
            o_id.append(xxhash.xxh3_128_hexdigest(f"dlk\x00{name}\x00{stream}\x00{rid}".encode()))
            o_ts.append(ts)
            o_key.append(None)
            o_val.append(encode_value(value))
            totals["records_in"] += 1
            totals["dead_letters"] += 1
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
        summary = [shard, hold, nlw_min, nwall_min, len(envs), [totals[m] for m in METRICS], lw, now]
        o_stream.append(SUMMARY_STREAM)
        o_id.append(None)
        o_ts.append(0)
        o_key.append(None)
        o_val.append(_packb(summary, use_bin_type=True))
        yield pd.DataFrame({"stream": o_stream, "id": o_id, "ts": o_ts, "key": o_key, "value": o_val, "wm": [None] * len(o_id)})


def _runs(key: Any, rows: list[tuple[str, int, bytes, Any]], lw: int, loads: Callable[[bytes], Any]) -> list[tuple[int, list[Record]]]:
    """A key's records as runs sharing the watermark they arrived under (§4.5).

    A record is late if it is behind the consumer's low watermark or behind the sender
    watermark it was injected under, whichever is higher. Almost always one run.

    Spark reads the files of one batch in no particular order, so records are put back in
    the order they were sent: sender watermarks only grow, so a stable sort on them restores
    the injector's order across files (a duplicate delivered in a later file must meet its
    original first, as in the harness, or it would count as late instead of duplicate).
    """
    first = rows[0][3] if rows else None
    if any(r[3] != first for r in rows):
        rows = sorted(rows, key=lambda r: MIN_TIMESTAMP if r[3] is None or r[3] != r[3] else r[3])
    out: list[tuple[int, list[Record]]] = []
    cur_wm: int | None = None
    cur: list[Record] = []
    for rid, t, v, w in rows:
        late_wm = lw if w is None or w != w or w <= lw else int(w)
        if late_wm != cur_wm and cur:
            out.append((cur_wm, cur))  # type: ignore[arg-type]
            cur = []
        cur_wm = late_wm
        cur.append(Record(key, loads(v), int(t), rid))
    if cur or not out:
        out.append((lw if cur_wm is None else cur_wm, cur))
    return out


