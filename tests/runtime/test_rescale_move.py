"""The state move of ``millwheel rescale`` (``millwheel/runtime/_rescale.py``) without Spark.

The move is rows of one heartbeat file, grouped by Spark group and handed to the
interval step (``IntervalStep``) as Spark would in one micro-batch. Here Spark is
simulated: each group's state is a :class:`MemoryGroupState`, every group is called in
every batch (a superset of Spark's calls: a call with nothing due changes nothing).

The property: for random old and new interval counts, keys, and records (some delivered
again after the move), every key's envelope ends in exactly one new interval — the one its
key hashes to —, the old groups are emptied, the group values are disjoint, and the
output (productions, including those of low-watermark timers) and final states equal
those of a run that had the new count from the start.
"""

from __future__ import annotations

from collections import Counter

import msgpack
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from millwheel import Computation, Record, Topology
from millwheel._codec import decode_value, encode_value
from millwheel._colstore import ColumnarStore
from millwheel._columnar import is_columnar
from millwheel._record import decode_key, encode_key
from millwheel.runtime._columnar import ColumnarIntervalStep
from millwheel.runtime._interval import MemoryGroupState, earliest, unpack_meta
from millwheel.runtime._keying import Keyer, interval_of
from millwheel.runtime._move import RescaleMismatch, blob_digest, state_digest
from millwheel.runtime._rescale import move_rows, move_stores
from millwheel.runtime._wire import (
    SUMMARY_STREAM,
    RowKind,
    interval_groups,
    spark_hash_int,
    timer_timeout,
    to_spark,
)
from millwheel.runtime.plans.intervals import IntervalStep

PARTITIONS = 2


class CountThenFlush(Computation):
    """Counts its records (exactly once: dedup by id) and, at the low-watermark timer at its
    newest record's time, produces the count."""

    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)
        self.set_timer(
            "flush",
            max(
                record.timestamp, self.pending_timers()[0].timestamp if self.pending_timers() else 0
            ),
        )

    def process_timer(self, timer) -> None:
        self.produce("counts", (self.key, self.state.get(0)))


def _spec():
    t = Topology("move")
    t.injector("in", None)
    t.computation(CountThenFlush, inputs={"in": lambda r: r.value["k"]}, outputs=["counts"])
    return t.validate().computations["CountThenFlush"]


SPEC = _spec()


def _step_class(spec):
    """The interval plans' step of ``spec`` (``plans/intervals.py``, ``plans/columnar.py``)."""
    return ColumnarIntervalStep if is_columnar(spec.cls) else IntervalStep


class Cluster:
    """One computation's groups and their states, stepped as Spark's stateful operator would."""

    def __init__(self, intervals: int, groups: list[int], spec=None) -> None:
        self.intervals = intervals
        self.groups = groups
        spec = spec or SPEC
        self.step = _step_class(spec)(spec, groups=groups)
        self.states: dict[int, MemoryGroupState] = {}
        self.out: list[tuple[str, bytes]] = []

    def batch(
        self,
        records: list[Record],
        low_watermark: int,
        extra: dict[int, pd.DataFrame] | None = None,
    ) -> None:
        """One micro-batch at ``low_watermark``: ``records`` keyed by the producer, and ``extra``
        rows by group (a rescale's heartbeat rows)."""
        frames: dict[int, list[pd.DataFrame]] = {g: [] for g in self.groups}
        by_group: dict[int, list[Record]] = {}
        for r in records:
            kb = encode_key(r.value["k"])
            by_group.setdefault(self.groups[interval_of(kb, self.intervals)], []).append(r)
        for g, rs in by_group.items():
            frames[g].append(_records_frame(rs))
        for g, f in (extra or {}).items():
            frames.setdefault(g, []).append(f)
        for g, fs in frames.items():
            state = self.states.setdefault(g, MemoryGroupState())
            state.watermark = to_spark(low_watermark)
            for out in state_outputs(self.step((g,), iter(fs), state)):
                self.out.append(out)

    def envelopes(self) -> dict[int, dict[bytes, bytes]]:
        return {
            g: msgpack.unpackb(s.value[0], raw=False, strict_map_key=False)
            for g, s in self.states.items()
            if s.value is not None
        }

    def blobs(self) -> dict[int, bytes]:
        """A columnar computation's store blob per group that holds one."""
        return {g: s.value[0] for g, s in self.states.items() if s.value is not None}


def state_outputs(frames) -> list[tuple[str, bytes]]:
    out = []
    for f in frames:
        for stream, value in zip(f["stream"], f["value"], strict=True):
            if stream != SUMMARY_STREAM:
                out.append((stream, value))
    return out


def _records_frame(rs: list[Record]) -> pd.DataFrame:
    n = len(rs)
    return pd.DataFrame(
        {
            "kind": [int(RowKind.RECORD)] * n,
            "key": [encode_key(r.value["k"]) for r in rs],
            "id": [r.id for r in rs],
            "ts": [r.timestamp for r in rs],
            "value": [encode_value(r.value) for r in rs],
            "wm": pd.array([None] * n, dtype="Int64"),
            "stream": ["in"] * n,
            "src": ["f.parquet"] * n,
            "row": list(range(n)),
            "now": pd.array([None] * n, dtype="Int64"),
        }
    )


def heartbeat_frames(table) -> dict[int, pd.DataFrame]:
    """A rescale's heartbeat file as the query hands its rows to the step (``_query._build``), by group."""
    d = table.to_pandas()
    n = len(d)
    frame = pd.DataFrame(
        {
            "kind": d["kind"],
            "key": d["key"],
            "id": [None] * n,
            "ts": [0] * n,
            "value": d["value"],
            "wm": pd.array([None] * n, dtype="Int64"),
            "stream": [None] * n,
            "src": [None] * n,
            "row": pd.array([None] * n, dtype="Int64"),
            "now": pd.array([None] * n, dtype="Int64"),
        }
    )
    return {int(g): frame[d["group"] == g].reset_index(drop=True) for g in d["group"].unique()}


def _records(keys: list[int], n: int, seed: int) -> list[Record]:
    import random

    rng = random.Random(seed)
    return [
        Record(None, {"k": f"k{rng.choice(keys)}"}, 1_000 + i, f"r{seed}-{i}") for i in range(n)
    ]


#: the property tests' examples: random old and new interval counts, keys and records
EXAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MOVES = given(
    old=st.integers(1, 9),
    new=st.integers(1, 12),
    keys=st.lists(st.integers(0, 500), min_size=1, max_size=40, unique=True),
    n=st.integers(1, 120),
    seed=st.integers(0, 1_000),
)


def _moved_run(spec, old: int, new: int, keys: list[int], n: int, seed: int):
    """``(reference, run, after, held, keys moved)``: a run of ``spec`` (default: the per-record
    one) with ``old`` intervals, its state (``held``, as read) moved to ``new`` between two
    batches — the second with some of the first's records again, dropped by the moved dedup
    ids — and the reference run with ``new`` from the start."""
    first, second = _records(keys, n, seed), _records(keys, n // 2 + 1, seed + 1)
    again = first[: len(first) // 3]
    ref = Cluster(new, interval_groups(new, PARTITIONS), spec)
    ref.batch(first, low_watermark=1_000 + n // 2)
    ref.batch(second + again, low_watermark=2_000 + n)
    run = Cluster(old, interval_groups(old, PARTITIONS), spec)
    run.batch(first, low_watermark=1_000 + n // 2)
    held = run.envelopes() if spec is None else run.blobs()
    new_groups = interval_groups(new, PARTITIONS, avoid=run.groups)
    table, moved = _move(run, held, new_groups)
    after = Cluster(new, new_groups, spec)
    after.states = run.states  # the same state store: the old groups' rows are still in it
    after.out = run.out
    after.batch(second + again, low_watermark=2_000 + n, extra=heartbeat_frames(table))
    return ref, run, after, held, moved


@EXAMPLES
@MOVES
def test_a_move_puts_every_key_in_its_new_interval_once_and_changes_nothing_else(
    old, new, keys, n, seed
):
    ref, run, after, held, moved = _moved_run(None, old, new, keys, n, seed)
    new_groups = after.groups
    assert not set(new_groups) & set(run.groups)
    assert [spark_hash_int(g) % PARTITIONS for g in new_groups] == [
        i % PARTITIONS for i in range(new)
    ]
    assert moved == sum(len(e) for e in held.values())

    # every key's envelope in exactly one group, the one of its new interval; old groups emptied
    placed = after.envelopes()
    assert not set(placed) & set(run.groups), "an old group kept its state"
    seen = Counter(kb for envs in placed.values() for kb in envs)
    assert all(c == 1 for c in seen.values())
    for g, envs in placed.items():
        assert all(new_groups[interval_of(kb, new)] == g for kb in envs)
    # the same states and the same output as the run with the new count from the start
    by_interval = {new_groups.index(g): envs for g, envs in placed.items()}
    assert by_interval == {ref.groups.index(g): envs for g, envs in ref.envelopes().items()}
    assert sorted(after.out) == sorted(ref.out)
    assert sorted(decode_value(v)[1] for _, v in after.out if decode_value(v)) == sorted(
        decode_value(v)[1] for _, v in ref.out
    )
    # each new interval's event-time timeout is at its earliest low-watermark timer
    for g in new_groups:
        s = after.states.get(g)
        if s is not None and s.value is not None and s.timeout is not None:
            _, nlw, _ = earliest(unpack_meta(s.value[1]).values())
            assert s.timeout == max(timer_timeout(nlw), s.watermark)


def _held(keys=("a", "b", "c"), spec=None) -> tuple[Cluster, dict[int, dict[bytes, bytes]]]:
    c = Cluster(2, interval_groups(2, PARTITIONS), spec)
    c.batch(
        [Record(None, {"k": k}, 1_000 + i, f"r{i}") for i, k in enumerate(keys)], low_watermark=0
    )
    return c, c.envelopes() if spec is None else c.blobs()


def _move(c: Cluster, held, new_groups: list[int]):
    """The heartbeat rows moving ``c``'s state (as read: ``held``) to ``new_groups``, and how many keys."""
    if c.step.spec is SPEC:
        return move_rows(held, c.groups, new_groups)
    stores = {g: ColumnarStore.decode(b) for g, b in held.items()}
    return move_stores(stores, {g: blob_digest(b) for g, b in held.items()}, c.groups, new_groups)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (None, r"\d+ keys \(digest .* not the .* the rescale read"),
        ("columnar", "bytes of columnar store .* not the .* the rescale read"),
    ],
)
def test_an_old_group_that_holds_other_state_than_was_read_fails_the_batch(spec, match):
    spec = COLUMNAR if spec == "columnar" else None
    c, held = _held(spec=spec)
    new_groups = interval_groups(4, PARTITIONS, avoid=c.groups)
    table, _ = _move(c, held, new_groups)
    c.batch(
        [Record(None, {"k": "a"}, 1_500, "late-write")], low_watermark=0
    )  # the state changed after the read
    after = Cluster(4, new_groups, spec)
    after.states = c.states
    with pytest.raises(RescaleMismatch, match=match):
        after.batch([], low_watermark=0, extra=heartbeat_frames(table))


def test_an_install_into_a_group_that_holds_keys_or_to_the_wrong_interval_fails():
    c, held = _held()
    new_groups = interval_groups(4, PARTITIONS, avoid=c.groups)
    table, _ = move_rows(held, c.groups, new_groups)
    frames = heartbeat_frames(table)
    g, frame = next((g, f) for g, f in frames.items() if g in new_groups)
    step = IntervalStep(SPEC, groups=new_groups)
    busy = MemoryGroupState()
    busy.value = (msgpack.packb({b"x": b"y"}), msgpack.packb({}))
    with pytest.raises(RescaleMismatch, match="already holds 1 keys"):
        list(step((g,), iter([frame]), busy))
    other = next(x for x in new_groups if x != g)
    with pytest.raises(RescaleMismatch, match="sent key .* to key interval"):
        list(step((other,), iter([frame]), MemoryGroupState()))


def test_a_group_of_no_layout_that_gets_records_fails_rather_than_dropping_them():
    c, _ = _held()
    step = IntervalStep(SPEC, groups=interval_groups(4, PARTITIONS, avoid=c.groups))
    rows = _records_frame([Record(None, {"k": "a"}, 1, "r")])
    with pytest.raises(RescaleMismatch, match="not a key interval of this layout"):
        list(step((c.groups[0],), iter([rows]), MemoryGroupState()))


def test_the_digest_covers_keys_and_envelopes():
    assert state_digest({}) == state_digest({})
    assert state_digest({b"a": b"1"}) != state_digest({b"a": b"2"})
    assert state_digest({b"a": b"1", b"b": b"2"}) == state_digest({b"b": b"2", b"a": b"1"})
    assert state_digest({b"ab": b""}) != state_digest({b"a": b"b"})


@given(st.integers(1, 64), st.lists(st.text(max_size=6), min_size=1, max_size=30))
def test_producers_key_a_rescaled_consumer_into_its_own_column(n, keys):
    keyer = Keyer(
        {"in": [("C", lambda r: r.value), ("D", lambda r: r.value)]}, intervals=4, own={"C": n}
    )
    cols = keyer.rows([("in", Record(None, k, 0, str(i))) for i, k in enumerate(keys)], ["C", "D"])
    assert set(cols) == {"key:C", f"interval:C@{n}", "key:D", "interval:D"}
    assert cols[f"interval:C@{n}"] == [interval_of(encode_key(k), n) for k in keys]
    assert cols["interval:D"] == [interval_of(encode_key(k), 4) for k in keys]
    assert [decode_key(k) for k in cols["key:C"]] == keys


# ---- a columnar computation (``millwheel/_columnar.py``): its store per interval is split and merged
def _columnar_spec():
    from computations.columnar_windowing import ColumnarWindowCounter

    t = Topology("move-columnar")
    t.injector("in", None)
    t.computation(
        ColumnarWindowCounter,
        name="C",
        inputs={"in": lambda r: r.value["k"]},
        outputs=["counts"],
        params={"window_ms": 50, "output": "counts", "trailing_empty": 0},
    )
    return t.validate().computations["C"]


COLUMNAR = _columnar_spec()


def _store_view(blob: bytes) -> dict:
    """What a columnar store holds, in a form two stores can be compared by (row and id
    order, its segments, and the Bloom filter's size, are the store's business)."""
    st = ColumnarStore.decode(blob)
    rows = (
        [] if st.state is None else sorted(tuple(sorted(r.items())) for r in st.state.to_pylist())
    )
    d = st.dedup
    held = d.ids.to_pylist()  # in the order they were added; row i's id is held[ptr[i]]
    ids = sorted(
        zip(
            [d.keys[k] for k in d.kix.tolist()],
            [held[p] for p in d.ptr.tolist()],
            d.ts.tolist(),
            strict=True,
        )
    )
    return {
        "state": rows,
        "timers": dict(st.timers),
        "meta": dict(st.meta),
        "pending": sorted(map(tuple, st.pending)),
        "ids": ids,
    }


@EXAMPLES
@MOVES
def test_a_columnar_move_splits_and_merges_every_store_into_the_new_intervals(
    old, new, keys, n, seed
):
    """The property above, for a columnar computation: every key's state, timers, sequence
    and dedup ids end in the store of its new interval, and the output and stores equal a
    run with the new count from the start."""
    ref, run, after, held, moved = _moved_run(COLUMNAR, old, new, keys, n, seed)
    new_groups = after.groups
    assert moved == sum(len(ColumnarStore.decode(b).keys_held()) for b in held.values())

    placed = after.blobs()
    assert not set(placed) & set(run.groups), "an old group kept its store"
    seen = Counter(kb for b in placed.values() for kb in ColumnarStore.decode(b).keys_held())
    assert all(c == 1 for c in seen.values())
    for g, b in placed.items():
        assert all(
            new_groups[interval_of(kb, new)] == g for kb in ColumnarStore.decode(b).keys_held()
        )
    by_interval = {new_groups.index(g): _store_view(b) for g, b in placed.items()}
    assert by_interval == {ref.groups.index(g): _store_view(b) for g, b in ref.blobs().items()}
    assert sorted(after.out) == sorted(ref.out)


def test_a_columnar_install_into_a_busy_interval_or_the_wrong_one_fails():
    c, held = _held(spec=COLUMNAR)
    new_groups = interval_groups(4, PARTITIONS, avoid=c.groups)
    frames = heartbeat_frames(_move(c, held, new_groups)[0])
    g, frame = next((g, f) for g, f in frames.items() if g in new_groups)
    step = ColumnarIntervalStep(COLUMNAR, groups=new_groups)
    busy = MemoryGroupState()
    busy.value = (next(iter(held.values())), b"")
    with pytest.raises(RescaleMismatch, match="already holds a store"):
        list(step((g,), iter([frame]), busy))
    other = next(x for x in new_groups if x != g)
    with pytest.raises(RescaleMismatch, match="sent key .* to key interval"):
        list(step((other,), iter([frame]), MemoryGroupState()))
