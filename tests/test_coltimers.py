"""The columnar store's timers as columns (``millwheel/_coltimers.py``): the same answers as
the dict of ``(key, tag) -> (timestamp, domain)`` they replace, under random changes."""

from __future__ import annotations

import random

import numpy as np

from millwheel._colstore import ColumnarStore
from millwheel._coltimers import TimerTable


def test_a_timer_table_answers_as_the_dict_it_replaces():
    rng = random.Random(4)
    table, ref = TimerTable(), {}
    keys = [f"k{i}".encode() for i in range(12)]
    for _ in range(300):
        n = rng.randrange(0, 15)
        kbs, tags = [rng.choice(keys) for _ in range(n)], [f"t{rng.randrange(5)}" for _ in range(n)]
        if rng.random() < 0.7:
            ts, d = [rng.randrange(0, 1_000) for _ in range(n)], rng.choice([0, 1])
            table = table.set_many(kbs, tags, np.array(ts, np.int64), d)
            ref.update(
                {(k, t): (s, d) for k, t, s in zip(kbs, tags, ts, strict=True)}
            )  # the last of a repeated pair wins
        else:
            table = table.delete_many(kbs, tags)
            for k in zip(kbs, tags, strict=True):
                ref.pop(k, None)
        assert dict(table.items()) == ref and len(table) == len(ref)
        lw, now = rng.randrange(0, 1_000), rng.randrange(0, 1_000)
        due = sorted(
            (kb, ts, d, tag) for (kb, tag), (ts, d) in ref.items() if ts <= (lw if d == 0 else now)
        )
        got = table.ordered(table.due(lw, now))
        assert [
            (table.kb[i], int(table.ts[i]), int(table.d[i]), table.tag[i]) for i in got.tolist()
        ] == due
        lws = [ts for ts, d in ref.values() if d == 0]
        walls = [ts for ts, d in ref.values() if d != 0]
        assert table.next_timers() == (min(lws, default=None), min(walls, default=None))
    assert table == ref


def test_a_store_keeps_its_timers_through_encoding_split_and_merge():
    st = ColumnarStore(
        timers=TimerTable().set_many([b"a", b"b", b"c"], ["x", "y", "z"], np.array([5, 6, 7]), 0)
    )
    back = ColumnarStore.decode(st.encode())
    assert dict(back.timers.items()) == {
        (b"a", "x"): (5, 0),
        (b"b", "y"): (6, 0),
        (b"c", "z"): (7, 0),
    }
    parts = back.split(lambda kb: 0 if kb == b"b" else 1)
    assert dict(parts[0].timers) == {(b"b", "y"): (6, 0)}
    assert ColumnarStore.merge([parts[1], parts[0]]).timers == back.timers
