"""A production's identity is never reused within a pipeline epoch, and a replay reproduces it
(docs/concepts.md, "The identity of a production"; ``millwheel/_identity.py``).

Hypothesis drives a harness through random interleavings of deliveries, re-deliveries of
records already sent (kept by the dedup horizon, or after it collected them and the key
was forgotten), watermark moves small and far, drains, crashes at every crash point with
their replays, and moves of the computation's state (a columnar store split by key and
merged again, as a rescale moves it; per-record envelopes re-encoded). Each delivery
carries a tag of its own, and every production says which delivery (or which delivery's
timer) made it, with that tag as its ``once_id``. Afterwards:

* no production id and no once-token was given to two different productions;
* each production has one id (a replayed round made the ids of its crashed attempt) and
  each ``once_id`` was committed with one token, which the registry never refused;
* a consumer with a longer dedup horizon than the producer's received each production
  exactly once: none was dropped as a duplicate of an older one with the same id.

Per-record and columnar computations, strong and weak productions (``identity_topology``
in ``tests/conftest.py``). Hypothesis prints the falsifying operations (and
``@reproduce_failure``) when it fails.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import msgpack
import numpy as np
import pytest
import xxhash
from hypothesis import example, given, settings
from hypothesis import strategies as st

from millwheel import MAX_TIMESTAMP, PickleCodec, Record
from millwheel._colinput import InputColumns
from millwheel._colstore import STORE_VERSION, ColumnarStore
from millwheel._columnar import ColumnarRunner
from millwheel._envelope import ENVELOPE_VERSION, Envelope
from millwheel._identity import batch_life, production_id
from millwheel._once import MemoryOnceRegistry
from millwheel._record import encode_key
from millwheel._step import StepRunner
from millwheel.testing import Crash, Harness


class Recording(MemoryOnceRegistry):
    """An in-memory IdRegistry that remembers every token each once-id was committed with."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: dict[str, set[str]] = defaultdict(set)
        self.ids: dict[str, set[str]] = defaultdict(set)

    def commit_many(self, items):
        for rid, token, _ in items:
            self.tokens[rid].add(token)
            self.ids[token].add(rid)
        return super().commit_many(items)


def _move(h: Harness, columnar: bool) -> None:
    """Move Echo's state as a rescale does: a columnar store split by key into three pieces,
    each encoded and decoded, merged again; per-record envelopes decoded and encoded."""
    if columnar:
        side = h._columnar["Echo"]
        if side.live is not None:
            pieces = side.live.split(lambda kb: xxhash.xxh3_64_intdigest(kb) % 3)
            opts = side.runner.options
            side.live = ColumnarStore.merge(
                [ColumnarStore.decode(p.encode(), opts) for p in pieces.values()]
            )
        return
    envs = h._envelopes["Echo"]
    for key, env in list(envs.items()):
        envs[key] = Envelope.decode(env).encode()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(0, 1), st.integers(-1_500, 1_500)),
        st.tuples(st.just("again"), st.integers(0, 10**6)),
        # the watermark moves, then rounds run: far enough, keys are collected and forgotten
        st.tuples(st.just("later"), st.sampled_from([10, 500, 2_000, 10**6])),
        st.tuples(st.just("run"), st.just(0)),
        st.tuples(st.just("crash"), st.sampled_from(list(Crash))),
        st.tuples(st.just("move"), st.just(0)),
        st.tuples(st.just("drain"), st.just(0)),
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize("columnar", [False, True], ids=["per_record", "columnar"])
@settings(max_examples=150, deadline=None, print_blob=True)
@given(ops=ops, strong=st.booleans())
# issue 35's case: a record delivered again after its key was collected; a drained run's key made again
@example(ops=[("new", 0, 0), ("later", 10**6), ("again", 0), ("run", 0)], strong=True)
@example(
    ops=[("new", 0, 0), ("run", 0), ("drain", 0), ("new", 0, 0), ("crash", Crash.BEFORE_COMMIT)],
    strong=False,
)
def test_a_production_id_is_never_reused_and_a_replay_reproduces_it(
    identity_topology, columnar, ops, strong
):
    registry = Recording()
    h = Harness(identity_topology(columnar=columnar, strong=strong), registry=registry)
    base = wm = 10_000
    sent: list[tuple[str, str, int]] = []  # (record id, key, timestamp) of every record sent
    deliveries = 0

    def deliver(rid: str, key: str, ts: int) -> None:
        nonlocal deliveries
        deliveries += 1
        h.inject("in", [Record(None, {"key": key, "tag": f"{rid}#{deliveries}"}, ts, rid)])

    for op, *args in ops:
        if op == "new":
            rid, key, ts = f"r{len(sent)}", f"k{args[0]}", base + args[1]
            sent.append((rid, key, ts))
            deliver(rid, key, ts)
        elif op == "again" and sent:
            deliver(*sent[args[0] % len(sent)])
        elif op == "later" and wm < MAX_TIMESTAMP:
            wm = base = wm + args[0]
            h.advance_watermark("in", wm)
            h.run()
        elif op == "run":
            h.run()
        elif op == "crash":
            h.process("Echo", crash=args[0])
            h.restart("Echo")
            h.run()
        elif op == "move":
            _move(h, columnar)
        elif op == "drain" and wm < MAX_TIMESTAMP:
            wm = MAX_TIMESTAMP
            h.finish("in")
            h.run()
    h.run()
    out = h.output("out")
    ids_of: dict[str, set[str]] = defaultdict(set)
    tags_of: dict[str, set[str]] = defaultdict(set)
    for r in out:
        ids_of[r.value["tag"]].add(r.id)
        tags_of[r.id].add(r.value["tag"])
    shared = {rid: tags for rid, tags in tags_of.items() if len(tags) > 1}
    assert not shared, f"production ids given to two productions: {shared}"
    assert all(len(ids) == 1 for ids in ids_of.values()), (
        f"a replay changed a production's id: {dict(ids_of)}"
    )
    reused = {t: ids for t, ids in registry.ids.items() if len(ids) > 1}
    assert not reused, f"once-tokens committed for two productions: {reused}"
    assert all(len(t) == 1 for t in registry.tokens.values()), (
        "a replay committed a once-id with another token"
    )
    assert h.metrics("Echo")["once_conflicts"] == 0
    seen = Counter(h.values("seen"))
    assert seen == Counter(set(ids_of)), "the consumer lost a production (or got one twice)"


# ---- compatibility: envelopes and stores written before lives keep their numbering -------------
def _legacy_id(computation: str, key: str, seq: int) -> str:
    """A production id as millwheel wrote them before lives: the hash of (computation, key, seq)."""
    return xxhash.xxh3_128_hexdigest(f"{computation}\x00{key!r}\x00{seq}".encode())


def test_an_envelope_from_before_lives_keeps_its_numbering_until_its_key_is_forgotten(
    identity_topology,
):
    spec = identity_topology(strong=False).computations[
        "Echo"
    ]  # as on Spark: productions in the outbox
    runner = StepRunner(
        spec.instantiate(), name="Echo", outputs=spec.all_outputs, options=spec.options
    )
    # as version 3 wrote it: key "k" made 5 productions, keeps a state and a timer
    old = msgpack.packb(
        [3, PickleCodec().encode("r4#5"), ["t", 1_050, 0], [], 5, None, None], use_bin_type=True
    )
    res = runner.step(
        "k",
        old,
        [Record("k", {"key": "k", "tag": "r5#6"}, 2_000, "r5")],
        low_watermark=1_000,
        now=0,
        life=batch_life("q", 9),
    )
    assert [p.record.id for p in res.productions] == [_legacy_id("Echo", "k", 5)]
    env = Envelope.decode(res.envelope)
    assert (env.seq, env.life) == (6, None) and msgpack.unpackb(res.envelope)[
        0
    ] == 3  # still written as before
    # the key forgotten (its timer fired, its ids collected): the next production starts a life
    res = runner.step("k", res.envelope, [], low_watermark=10**9, now=0, life=batch_life("q", 10))
    assert res.envelope is None and [p.record.id for p in res.productions] == [
        _legacy_id("Echo", "k", 6)
    ]
    res = runner.step(
        "k",
        None,
        [Record("k", {"key": "k", "tag": "r5#7"}, 2_000, "r5")],
        low_watermark=10**9,
        now=0,
        life=batch_life("q", 11),
    )
    life = batch_life("q", 11)
    assert [p.record.id for p in res.productions] == [
        production_id("Echo", "k", 0, life),
        production_id("Echo", "k", 1, life),
    ]  # the record, its timer
    assert not {p.record.id for p in res.productions} & {
        _legacy_id("Echo", "k", s) for s in range(7)
    }
    assert (
        Envelope.decode(res.envelope).life == batch_life("q", 11)
        and msgpack.unpackb(res.envelope)[0] == ENVELOPE_VERSION == 4
    )


def test_a_columnar_store_from_before_lives_keeps_its_keys_numbering(identity_topology):
    spec = identity_topology(columnar=True, strong=False).computations["Echo"]
    runner = ColumnarRunner(
        spec.instantiate(), name="Echo", outputs=spec.all_outputs, options=spec.options
    )
    kb, held = encode_key("k"), encode_key("h")
    # as version 2 wrote it: "k" made 4 productions, "h" none yet (it only holds the watermark)
    wire = msgpack.unpackb(
        ColumnarStore(meta={kb: [4, None], held: [0, 1_000]}).encode(), raw=False
    )
    wire[1] = 2
    old = msgpack.packb(wire, use_bin_type=True)
    recs = InputColumns(
        [kb, held, encode_key("new")],
        ["r5", "h1", "n1"],
        np.array([2_000] * 3),
        ["in"] * 3,
        [{"key": k, "tag": f"{k}#1"} for k in ("k", "h", "new")],
        encoded=False,
    )
    life = batch_life("q", 9)
    res = runner.run(old, recs, low_watermark=1_000, now=0, life=life)
    assert dict(zip(res.keys, res.ids, strict=True)) == {
        "k": _legacy_id("Echo", "k", 4),  # numbered as before
        "h": production_id("Echo", "h", 0, life),  # its first production: a life of its own
        "new": production_id("Echo", "new", 0, life),
    }
    meta = ColumnarStore.decode(res.store).meta
    assert (
        meta[kb] == [5, None]
        and meta[held] == [1, 1_000, life]
        and meta[encode_key("new")] == [1, None, life]
    )
    assert msgpack.unpackb(res.store, raw=False)[1] == STORE_VERSION == 4
