"""A rewrite function applied to one key (``_rewrite_apply.py``) and the swap of a rewrite's
stores (``_rewrite_pin.py``), without Spark: what the function sees, what is kept, what it
may return, and that every step of a swap or undo can be redone after a kill."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from millwheel._codec import MsgpackCodec, PickleCodec
from millwheel._colstore import ColumnarStore
from millwheel._coltimers import TimerTable
from millwheel._envelope import DedupStats, Envelope, PendingProduction
from millwheel._record import MAX_TIMESTAMP, TimeDomain, encode_key
from millwheel.runtime._fs import Location
from millwheel.runtime._rewrite_apply import RewriteError, rewrite_envelope, rewrite_store
from millwheel.runtime._rewrite_pin import (
    PRIOR,
    STAGED,
    pin_rewrite,
    settle_rewrite,
    swap_back,
    swap_in,
)
from millwheel.runtime._state_reader import columnar_key_states


def _envelope(codec, state, **kw) -> bytes:
    env = Envelope(state=codec.encode(state), timers={"end": (5_000, 0)}, seq=4, life=7, **kw)
    env.dedup.add("r1", 1_000)
    env.dedup.finish(0, 0.01, None, 0, DedupStats())
    return env.encode()


def test_the_function_sees_user_types_and_what_it_does_not_see_is_kept():
    seen = {}

    def fn(key, state, timers):
        seen[key] = (state, timers)
        return {**state, "n": state["n"] * 10}, {**timers, "late": (9_000, TimeDomain.WALL_TIME)}

    codec = MsgpackCodec()
    raw, gone = rewrite_envelope(
        fn, "fn", codec, encode_key(("cats", 3)), _envelope(codec, {"n": 2})
    )
    assert not gone
    assert seen == {("cats", 3): ({"n": 2}, {"end": (5_000, TimeDomain.LOW_WATERMARK)})}
    env = Envelope.decode(raw)
    assert codec.decode(env.state) == {"n": 20}
    assert env.timers == {"end": (5_000, 0), "late": (9_000, 1)}
    assert (env.seq, env.life, env.dedup.count) == (4, 7, 1)  # sequence, life, dedup ids kept


def test_none_deletes_a_key_and_a_key_left_with_nothing_is_dropped():
    codec = PickleCodec()
    assert rewrite_envelope(
        lambda k, s, t: None, "fn", codec, encode_key("a"), _envelope(codec, 1)
    ) == (None, True)
    bare = Envelope(state=codec.encode(1), seq=3, life=2).encode()  # no timers, no ids
    assert rewrite_envelope(lambda k, s, t: (None, {}), "fn", codec, encode_key("a"), bare) == (
        None,
        False,
    )


def test_a_key_with_undelivered_strong_productions_cannot_be_deleted():
    codec = PickleCodec()
    raw = _envelope(codec, 1, pending=[PendingProduction("out", "a", b"v", 1_000, "id1")])
    with pytest.raises(RewriteError, match="strong productions not yet delivered"):
        rewrite_envelope(lambda k, s, t: None, "fn", codec, encode_key("a"), raw)


@pytest.mark.parametrize(
    ("out", "match"),
    [
        (5, "return \\(state, timers\\)"),
        ((1, [("t", 1)]), "give a dict"),
        ((1, {"t": (1.5, TimeDomain.LOW_WATERMARK)}), "timer 't'"),
        ((1, {"t": (MAX_TIMESTAMP, TimeDomain.WALL_TIME)}), "timer 't'"),
        ((1, {3: (1, TimeDomain.WALL_TIME)}), "timer 3"),
    ],
)
def test_what_the_function_returns_is_checked(out, match):
    codec = PickleCodec()
    with pytest.raises(RewriteError, match=match):
        rewrite_envelope(lambda k, s, t: out, "fn", codec, encode_key("a"), _envelope(codec, 1))


def test_a_failing_function_names_the_key():
    codec = PickleCodec()
    with pytest.raises(RewriteError, match="failed on key 'a': ZeroDivisionError"):
        rewrite_envelope(lambda k, s, t: 1 / 0, "fn", codec, encode_key("a"), _envelope(codec, 1))


def test_a_columnar_store_is_rewritten_key_by_key():
    kbs = [encode_key(f"k{i}") for i in range(4)]
    table = pa.table(
        {
            "_kb": pa.array(kbs, pa.binary()),
            "key": [f"k{i}" for i in range(4)],
            "n": pa.array([1, 2, 3, 4], pa.int64()),
        }
    )
    store = ColumnarStore(
        state=table,
        timers=TimerTable.of(kbs, ["end"] * 4, [MAX_TIMESTAMP] * 4, [0] * 4),
        meta={kb: [2, None, 9] for kb in kbs},
    )

    def fn(key, rows, timers):
        if key == "k0":
            return None
        if key == "k1":
            return None, {}  # keeps nothing: dropped as a step drops it
        return [{**r, "n": r["n"] * 10} for r in rows], timers

    blob, kept, deleted = rewrite_store(fn, "fn", store.encode())
    assert (kept, deleted) == (2, 1)
    keys = {k.key: k for k in columnar_key_states([blob])}
    assert {k: v.state for k, v in keys.items()} == {
        "k2": {"key": "k2", "n": 30},
        "k3": {"key": "k3", "n": 40},
    }
    assert keys["k3"].timers == {"end": (MAX_TIMESTAMP, "low_watermark")}
    assert ColumnarStore.decode(blob).meta[kbs[2]] == [2, None, 9]


def _stores(tmp_path) -> tuple[Location, Location]:
    root = Location.of(str(tmp_path))
    (tmp_path / "run.json").write_text(json.dumps({"intervals": 2}))
    ckpt = root.child("checkpoints", "C")
    for name, text in (("state", "old"), (STAGED, "new")):
        ckpt.child(name).mkdirs()
        ckpt.child(name, "1.delta").write_text(text)
    return root, ckpt


def _live(ckpt: Location) -> str | None:
    return ckpt.child("state", "1.delta").read_text()


def test_a_swap_killed_between_its_renames_is_finished_by_the_next_start(tmp_path):
    root, ckpt = _stores(tmp_path)
    pin_rewrite(root, "C", {"step": "swapping", "batch": 0})

    def killed():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        swap_in(ckpt, crash=killed)
    assert not ckpt.child("state").exists()  # the old store aside, the new one not in place yet
    assert settle_rewrite(root, "C", ckpt) == "pending"  # what ComputationQuery.start calls
    assert _live(ckpt) == "new" and ckpt.child(PRIOR, "1.delta").read_text() == "old"
    swap_back(ckpt)
    assert _live(ckpt) == "old" and not ckpt.child(PRIOR).exists()


def test_a_stacked_rewrite_keeps_the_first_prior_store(tmp_path):
    root, ckpt = _stores(tmp_path)
    swap_in(ckpt)
    ckpt.child(STAGED).mkdirs()
    ckpt.child(STAGED, "1.delta").write_text("newer")
    swap_in(ckpt)
    assert _live(ckpt) == "newer" and ckpt.child(PRIOR, "1.delta").read_text() == "old"
    swap_back(ckpt)
    assert _live(ckpt) == "old"


def test_a_rewrite_committed_by_a_later_batch_is_forgotten(tmp_path):
    root, ckpt = _stores(tmp_path)
    swap_in(ckpt)
    pin_rewrite(root, "C", {"step": "pending", "batch": 0})
    ckpt.child("commits").mkdirs()
    ckpt.child("commits", "0").write_text("v1")
    assert settle_rewrite(root, "C", ckpt) == "pending"
    ckpt.child("commits", "1").write_text("v1")
    assert settle_rewrite(root, "C", ckpt) == "committed"
    assert not ckpt.child(PRIOR).exists()
    assert "rewrites" not in json.loads((tmp_path / "run.json").read_text())


def _run_dir(tmp_path) -> str:
    """A run directory with one computation ``C`` and no rewrite (no Spark needed)."""
    (tmp_path / "run.json").write_text(json.dumps({"intervals": 2, "groups": [0, 1]}))
    (tmp_path / "checkpoints" / "C" / "state").mkdir(parents=True)
    return str(tmp_path)


def test_the_command_refuses_while_a_driver_holds_the_run(tmp_path, capsys):
    """A lease whose driver (this process) runs: refused before anything is read."""
    import os

    from millwheel.runtime._state_reader import state_main

    run = _run_dir(tmp_path)
    lease = tmp_path / "leases" / "C"
    lease.mkdir(parents=True)
    (lease / f"{7:012d}").write_text(f"{os.uname().nodename}:{os.getpid()}\n")
    assert state_main(["rewrite", run, "C", "--with", "tests.runtime._rewrite_fns:times_ten"]) == 2
    err = capsys.readouterr().err
    assert "a driver may still be running" in err and f"process {os.getpid()}" in err
    assert state_main(["rewrite", run, "C", "--undo"]) == 2
    assert "a driver may still be running" in capsys.readouterr().err


def test_undo_without_a_rewrite_says_so(tmp_path, capsys):
    from millwheel.runtime._state_reader import state_main

    assert state_main(["rewrite", _run_dir(tmp_path), "C", "--undo"]) == 2
    assert "it has no rewrite to undo" in capsys.readouterr().err
