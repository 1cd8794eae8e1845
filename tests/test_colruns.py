"""``millwheel/_colruns.Runs``: a batch's rows cut by arrival watermark into calls.

The invariant: each row is in exactly one call, which sees the low watermark the per-key
step gives its run (the next run's arrival watermark, capped by the batch's; the batch's
for the key's last run; runs seeing the same one merged); a key's calls come in the order
of its runs; and the calls are at most as many as the batch's arrival watermarks, plus
the last one (a call per key's run and watermark made ~24 times as many for the main
job's counter: ``bench/arrival_runs_bench.py``). ``tests/test_contract.py`` runs both
kinds of computation over such batches and compares what they produce.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel._colruns import Runs

rows = st.lists(
    st.tuples(st.integers(0, 12), st.integers(0, 5)),  # (arrival watermark, key)
    min_size=1,
    max_size=60,
)


def expected_bounds(wms: list[int], lw: int) -> dict[int, int]:
    """One key's arrival watermark -> the watermark its run's call sees (the per-key step's cut)."""
    distinct = sorted(set(wms))
    return {
        w: (min(distinct[i + 1], lw) if i + 1 < len(distinct) else lw)
        for i, w in enumerate(distinct)
    }


@settings(print_blob=True, deadline=None)
@given(rows=rows, lw=st.integers(0, 14))
def test_each_row_sees_its_runs_watermark_in_one_call_per_watermark(rows, lw):
    wm = np.array([w * 100 for w, _ in rows], np.int64)
    keys = np.array([k for _, k in rows], np.int64)
    lw *= 100
    runs = Runs(wm, keys, lw)
    assert runs.count <= len(set(wm.tolist())) + 1
    call_of = np.full(len(rows), -1)
    for g in range(runs.count):
        got = runs.rows(g)
        assert (call_of[got] == -1).all(), "a row in two calls"
        call_of[got] = g
        # each call's rows in the order they were sent: by arrival watermark, stably
        assert list(got) == sorted(got, key=lambda r: (wm[r], r))
        # a call's keys are those with a later call, each key once
        ks = runs.keys(g).tolist()
        assert len(ks) == len(set(ks))
        assert set(ks) == ({int(keys[r]) for r in got} if g < runs.count - 1 else set())
    assert (call_of >= 0).all(), "a row in no call"
    for k in set(keys.tolist()):
        mine = np.flatnonzero(keys == k)
        want = expected_bounds(wm[mine].tolist(), lw)
        for r in mine:
            assert runs.call_watermark(int(call_of[r])) == want[int(wm[r])]
        # the key's last run goes with every key's last run; its calls ascend with its runs
        assert call_of[mine[np.argmax(wm[mine])]] == runs.count - 1
        order = sorted(mine, key=lambda r: (wm[r], r))
        assert list(call_of[order]) == sorted(call_of[order])
    assert set(runs.complex_keys.tolist()) == {
        int(k)
        for k in set(keys.tolist())
        if len(set(expected_bounds(wm[keys == k].tolist(), lw).values())) > 1
    }


def test_rare_keys_in_a_few_of_many_files_make_a_call_per_file_not_per_key_and_file():
    """Keys of a query log: a few popular ones in every file, many in a few, each at a
    different place among its own runs. The calls follow the files."""
    rng = np.random.default_rng(5)
    files, per = 50, 40
    wm = np.repeat(np.arange(files, dtype=np.int64) * 1_000, per)
    keys = (200 * rng.random(files * per) ** 4).astype(np.int64)
    runs = Runs(wm, keys, 10**9)
    assert runs.count <= files + 1
    assert sum(len(runs.rows(g)) for g in range(runs.count)) == files * per
