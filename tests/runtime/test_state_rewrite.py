"""``millwheel state rewrite``: a function applied offline to every key of a stopped run, atomically.

A count per key (per-record ``Count``: a production per record and a final one when the
input is finished; columnar ``ColumnarCount``: the final one) runs part of its input, is
stopped, rewritten by ``_rewrite_fns.py`` (every third key deleted, the others' counts
times ten, timers kept) and resumed to the end. The output must be the plain answer for the
state the run resumed from, computed from the counts the stopped run held: nothing lost,
nothing twice, the dedup ids kept (one record is delivered twice). Every plan: interval
rows, key rows, columnar on the default mapping and on the Arrow mapping; ``--undo``
restores the old state exactly (``millwheel state --json`` before and after); refused while a
driver runs; after a rescale; and a crash campaign that kills the command (kill -9) at random
points, after which the run resumes with the old or the new state, never a mix.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from millwheel import (
    ColumnarComputation,
    Computation,
    ComputationOptions,
    MillwheelError,
    Record,
    SampleSource,
    TimeDomain,
    Topology,
)
from millwheel._record import MAX_TIMESTAMP
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._rewrite_apply import RewriteError
from millwheel.runtime._state_reader import read_state, state_main
from millwheel.runtime._state_rewrite import load_function, rewrite, undo
from tests.runtime import _rewrite_fns as fns

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000
KEYS = 24
N = 480
FNS = str(Path(fns.__file__))


class Count(Computation):
    def process_record(self, record):
        n = self.state.get(0) + 1
        self.state.set(n)
        self.produce("counted", [self.key, n])
        self.set_timer("end", MAX_TIMESTAMP, TimeDomain.LOW_WATERMARK)

    def process_timer(self, timer):
        self.produce("final", [self.key, self.state.get(0)], timestamp=T0)


class ColumnarCount(ColumnarComputation):
    def process_batch(self, batch):
        n = batch.records.groupby("key", observed=True).size().rename("n").reset_index()
        rows = pd.concat([batch.state, n]).groupby("key", observed=True, as_index=False)["n"].sum()
        batch.set_state(rows.astype({"n": "int64"}))
        batch.set_timers(rows["key"], ["end"] * len(rows), [MAX_TIMESTAMP] * len(rows))

    def process_timers(self, batch, timers):
        s = batch.state
        batch.produce(
            "final",
            [[k, int(n)] for k, n in zip(s["key"].tolist(), s["n"].tolist(), strict=True)],
            keys=s["key"],
            timestamps=[T0] * len(s),
        )


def topology(kind: str = "record", mapping: str = "default") -> Topology:
    recs = [Record(None, {"k": f"k{i % KEYS}"}, T0 + i, f"r{i}") for i in range(N)]
    recs.insert(N // 2, recs[7])  # delivered twice, to a key the rewrite keeps: its ids must stay
    t = Topology("rewrite")
    t.injector("in", SampleSource(recs, batch_size=20))
    if kind == "columnar":
        t.computation(
            ColumnarCount,
            name="Count",
            inputs={"in": lambda r: r.value["k"]},
            outputs=["final"],
            options=ComputationOptions(mapping=mapping),
        )
    else:
        t.computation(Count, inputs={"in": lambda r: r.value["k"]}, outputs=["counted", "final"])
    return t


def settings(layout: str = "intervals", *, drain: bool) -> RuntimeSettings:
    return RuntimeSettings(
        drain=drain,
        intervals=2,
        state_layout=layout,
        max_files_per_trigger=1,
        poll_ms=50,
        heartbeat_ms=100,
    )


def run_part(t: Topology, run: str, layout: str, spark, records: int = 120) -> None:
    """Until ``records`` records are counted in published batches, then stop (Ctrl-C's path)."""
    rt = SparkRuntime(t, run, settings(layout, drain=False), spark=spark)
    rt.start()
    try:
        deadline = time.monotonic() + 300
        while rt.computations["Count"].metrics["records_in"] < records:
            assert time.monotonic() < deadline, "the run did not count enough records in 300 s"
            rt.poll()
            time.sleep(0.05)
    finally:
        rt.stop()


def run_to_end(t: Topology, run: str, layout: str, spark) -> SparkRuntime:
    rt = SparkRuntime(t, run, settings(layout, drain=True), spark=spark)
    rt.run(timeout_s=600)
    return rt


def counts(spark, run: str) -> dict[str, int]:
    """Each key's count in the committed state (a per-record count, or a columnar key's row)."""
    out = {}
    for k in read_state(spark, run, "Count").keys:
        s = k.state
        out[k.key] = s if isinstance(s, int) else int(s["n"])
    return out


def answer(at_stop: dict[str, int] | None) -> tuple[Counter, dict[str, int]]:
    """The plain answer: every key's counts, one per record, and its final count — for the
    state the run left (``at_stop=None``) or for that state rewritten by ``_rewrite_fns``."""
    counted: Counter = Counter()
    final = {}
    for i in range(KEYS):
        k, n = f"k{i}", N // KEYS
        c0 = (at_stop or {}).get(k, 0)
        if at_stop is None or c0 == 0:
            seq = list(range(1, n + 1))
        elif fns.deleted(k):
            seq = list(range(1, c0 + 1)) + list(range(1, n - c0 + 1))
        else:
            seq = list(range(1, c0 + 1)) + [fns.FACTOR * c0 + j for j in range(1, n - c0 + 1)]
        counted.update((k, v) for v in seq)
        if at_stop is None or c0 == 0 or not fns.deleted(k):
            final[k] = seq[-1]
        elif n > c0:
            final[k] = n - c0  # a deleted key made again by later records
    return counted, final


def outcome(rt: SparkRuntime, kind: str) -> tuple[Counter, dict[str, int]]:
    final_recs = rt.output("final")
    assert len({r.id for r in final_recs}) == len(final_recs), "a production id given twice"
    final = {}
    for r in final_recs:
        assert r.value[0] not in final, f"two final counts for {r.value[0]}"
        final[r.value[0]] = r.value[1]
    counted: Counter = Counter()
    if kind == "record":
        recs = rt.output("counted")
        assert len({r.id for r in recs}) == len(recs), "a production id given twice"
        counted = Counter((r.value[0], r.value[1]) for r in recs)
    return counted, final


def expect(rt: SparkRuntime, kind: str, at_stop: dict[str, int] | None) -> None:
    counted, final = outcome(rt, kind)
    want_counted, want_final = answer(at_stop)
    if kind == "record":
        assert counted == want_counted, (counted - want_counted, want_counted - counted)
    assert final == want_final


def which_answer(rt: SparkRuntime, kind: str, at_stop: dict[str, int]) -> str:
    got = outcome(rt, kind)
    for name, state in (("old", None), ("new", at_stop)):
        want = answer(state)
        if (kind != "record" or got[0] == want[0]) and got[1] == want[1]:
            return name
    msg = f"the output is neither the old state's answer nor the new one's: {got[1]}"
    raise AssertionError(msg)


def state_json(run: str, capsys) -> dict:
    capsys.readouterr()
    assert state_main([run, "Count", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


PLANS = [
    pytest.param("record", "default", "intervals", id="interval-rows"),
    pytest.param("record", "default", "keys", id="key-rows"),
    pytest.param("columnar", "default", "intervals", id="columnar"),
    pytest.param("columnar", "arrow", "intervals", id="arrow"),
]


@pytest.mark.parametrize(("kind", "mapping", "layout"), PLANS)
def test_a_rewrite_is_the_state_the_run_resumes_from_on_every_plan(
    spark, tmp_path, kind, mapping, layout, capsys
):
    """Rewritten, undone (the state as before, exactly), rewritten again, resumed."""
    run = str(tmp_path / "run")
    t = topology(kind, mapping)
    run_part(t, run, layout, spark)
    shown = state_json(run, capsys)
    before = {k.key: k for k in read_state(spark, run, "Count").keys}
    at_stop = counts(spark, run)
    assert at_stop
    fn = fns.columnar_times_ten if kind == "columnar" else fns.times_ten
    rewrite(run, "Count", fn, spark=spark)
    assert counts(spark, run) != at_stop
    undo(run, "Count")
    again = state_json(run, capsys)
    assert (again["keys"], again["batch"]) == (shown["keys"], shown["batch"])
    done = rewrite(run, "Count", fn, spark=spark)
    gone = {k for k in at_stop if fns.deleted(k)}
    assert (done["keys"], done["deleted"]) == (len(at_stop) - len(gone), len(gone))
    after = {k.key: k for k in read_state(spark, run, "Count").keys}
    assert set(after) == set(at_stop) - gone
    for k, ks in after.items():
        assert ks.timers == before[k].timers  # what the function returned: the same timers
        assert ks.dedup_ids == before[k].dedup_ids  # what it does not see is kept
    assert {k: fns.FACTOR * c for k, c in at_stop.items() if k not in gone} == counts(spark, run)
    expect(run_to_end(t, run, layout, spark), kind, at_stop)


def test_undo_restores_the_old_state_exactly(spark, tmp_path, capsys):
    """Refused while a driver runs; a function that fails changes nothing; two rewrites stack;
    ``--undo`` puts back the state the run left (``millwheel state --json`` as before), and the
    run resumes with it."""
    run = str(tmp_path / "run")
    t = topology()
    rt = SparkRuntime(t, run, settings(drain=False), spark=spark)
    rt.start()
    try:
        deadline = time.monotonic() + 300
        while rt.computations["Count"].metrics["records_in"] < 100:
            assert time.monotonic() < deadline
            rt.poll()
            time.sleep(0.05)
        with pytest.raises(MillwheelError, match="a driver may still be running"):
            rewrite(run, "Count", fns.times_ten, spark=spark)
    finally:
        rt.stop()
    before = state_json(run, capsys)
    at_stop = counts(spark, run)

    def boom(key, state, timers):
        return state // 0

    with pytest.raises(RewriteError, match="boom failed on key 'k\\d+': ZeroDivisionError"):
        rewrite(run, "Count", boom, spark=spark)  # the function's error, and nothing changed
    assert counts(spark, run) == at_stop
    rewrite(run, "Count", fns.times_ten, spark=spark)
    second = rewrite(run, "Count", fns.times_ten, spark=spark)  # stacked: times 100
    assert second["stacked"] == 2
    assert counts(spark, run) == {
        k: fns.FACTOR**2 * c for k, c in at_stop.items() if not fns.deleted(k)
    }
    undone = undo(run, "Count")
    assert undone["undone"] == 2
    after = state_json(run, capsys)
    assert after["keys"] == before["keys"] and after["batch"] == before["batch"]
    with pytest.raises(MillwheelError, match="no rewrite to undo"):
        undo(run, "Count")
    expect(run_to_end(t, run, "intervals", spark), "record", None)


def test_a_rewrite_after_a_rescale(spark, tmp_path):
    """Refused while the rescale's state move waits for its batch; done once it has moved;
    ``--undo`` refused once the run has committed a batch after the rewrite."""
    from millwheel.runtime._rescale import rescale

    run = str(tmp_path / "run")
    t = topology()
    run_part(t, run, "intervals", spark, records=80)
    rescale(run, "Count", 3, spark=spark)
    with pytest.raises(MillwheelError, match="has not moved its state yet"):
        rewrite(run, "Count", fns.times_ten, spark=spark)
    run_part(t, run, "intervals", spark, records=160)
    at_stop = counts(spark, run)
    rewrite(run, "Count", fns.times_ten, spark=spark)
    expect(run_to_end(t, run, "intervals", spark), "record", at_stop)
    # committed by the batches since: --undo is refused, saying why
    with pytest.raises(MillwheelError, match=r"committed batch \d+ after the rewrite"):
        undo(run, "Count")


def test_load_function_takes_a_module_or_a_file():
    fn, _ = load_function(f"{FNS}:times_ten")
    assert fn("k1", 2, {}) == (20, {})
    fn, _ = load_function("tests.runtime._rewrite_fns:times_ten")
    assert fn("k3", 2, {}) is None
    with pytest.raises(MillwheelError, match="has no function"):
        load_function(f"{FNS}:nothing")
    with pytest.raises(MillwheelError, match="module:function"):
        load_function("no_colon")


# -- the crash campaign ---------------------------------------------------------------------
_CLI = "import sys; from millwheel.cli import main; sys.exit(main(sys.argv[1:]))"
_POINTS = ("rewrite_read", "rewrite_staged", "rewrite_pinned", "rewrite_swapping")


def _campaign(spark, tmp_path, rounds: int, mapping: str | None = None) -> None:
    """``rounds`` kills of the command (``mapping``: a columnar computation on it, else the
    per-record count on interval rows), each followed by a resume to the end."""
    seed = int(os.environ.get("MILLWHEEL_REWRITE_SEED") or random.SystemRandom().randrange(2**32))
    print(f"rewrite crash campaign: seed {seed} (MILLWHEEL_REWRITE_SEED={seed} repeats it)")
    rng = random.Random(seed)
    run, snapshot = tmp_path / "run", tmp_path / "snapshot"
    kind = "record" if mapping is None else "columnar"
    t = topology(kind, mapping or "default")
    fn = "times_ten" if mapping is None else "columnar_times_ten"
    # the Arrow mapping's rewrite is one manifest written: no swap of directories to kill
    points = _POINTS if mapping != "arrow" else _POINTS[:3]
    run_part(t, str(run), "intervals", spark)
    at_stop = counts(spark, str(run))
    batch = read_state(spark, str(run), "Count").batch
    shutil.copytree(run, snapshot)
    from faults.inject import kill_tree

    seen = Counter()
    whole, measured = 15.0, False  # how long a whole command takes (seconds), learned as it goes
    for r in range(rounds):
        shutil.rmtree(run)
        shutil.copytree(snapshot, run)  # the same path: the checkpoint names its files by path
        env = dict(os.environ)
        point = None
        if r % 2 == 0:
            point = rng.choice(points)
            env["MILLWHEEL_CRASH"] = f"Count:{point}:{batch}"
            where = f"at {point}"
        else:
            delay = rng.uniform(0.5, whole)
            where = f"after {delay:.1f} s"
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _CLI, "state", "rewrite", str(run), "Count"]
            + ["--with", f"{FNS}:{fn}"],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=600 if point else delay)
        finally:
            rc = proc.poll()
            kill_tree(proc)
        took = time.monotonic() - t0
        if rc == 0 or point in ("rewrite_pinned", "rewrite_swapping"):
            whole = max(whole, took) if measured else took  # it ran (nearly) to its end
            measured = True
        got = which_answer(run_to_end(t, str(run), "intervals", spark), kind, at_stop)
        seen[got] += 1
        print(
            f"round {r}: killed {where} (exit {rc}, {took:.1f} s): the run resumed with the {got} state"
        )
        if point is not None:
            assert got == ("old" if point in ("rewrite_read", "rewrite_staged") else "new")
    print(f"rewrite crash campaign, seed {seed}: {dict(seen)}")


def test_a_rewrite_killed_at_random_points_leaves_the_old_state_or_the_new(spark, tmp_path):
    _campaign(spark, tmp_path, 2)


def test_a_rewrite_on_the_arrow_mapping_killed_leaves_the_old_state_or_the_new(spark, tmp_path):
    """Its own files: the old manifest kept, the new one written or not."""
    _campaign(spark, tmp_path, 2, mapping="arrow")


@pytest.mark.slow
@pytest.mark.parametrize("mapping", [None, "arrow"])
def test_a_rewrite_killed_at_ten_random_points_leaves_the_old_state_or_the_new(
    spark, tmp_path, mapping
):
    _campaign(spark, tmp_path, 10, mapping)


def test_the_docs_example_on_spark(spark, tmp_path):
    """docs/concepts.md, "Offline rewrite": its ``Bill`` and ``repair`` on a Spark run, stopped
    mid-stream, rewritten, resumed: each bill is the plain answer for the rewritten state."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts.md").read_text()
    section = page.split("### Offline rewrite", 1)[1].split("\n### ", 1)[0]
    code = re.search(r"^```python\n(.*?)^```", section, re.S | re.M).group(1)
    ns: dict = {"__name__": "docs_offline_rewrite"}
    exec(compile(code, "docs/concepts.md", "exec"), ns)  # noqa: S102 - the page's own example
    customers = ["ann", "bob", "acme/bo", "acme/cy"]
    month_end = T0 + 10_000_000
    recs = [
        Record(
            None,
            {"customer": customers[i % 4], "cents": 1 + i % 7, "month_end": month_end},
            T0 + i,
            f"c{i}",
        )
        for i in range(240)
    ]

    def topo() -> Topology:
        t = Topology("billing")
        t.injector("charges", SampleSource(recs, batch_size=10))
        t.computation(
            ns["Bill"], inputs={"charges": lambda r: r.value["customer"]}, outputs=["bills"]
        )
        return t

    run = str(tmp_path / "run")
    rt = SparkRuntime(topo(), run, settings(drain=False), spark=spark)
    rt.start()
    try:
        while rt.computations["Bill"].metrics["records_in"] < 40:
            rt.poll()
            time.sleep(0.05)
    finally:
        rt.stop()
    held = {k.key: k.state for k in read_state(spark, run, "Bill").keys}
    seen = {c: sum(r.value["cents"] for r in recs if r.value["customer"] == c) for c in customers}
    rewrite(run, "Bill", ns["repair"], spark=spark)
    rt = SparkRuntime(topo(), run, settings(drain=True), spark=spark)
    rt.run(timeout_s=600)
    bills = {r.value["customer"]: r.value["cents"] for r in rt.output("bills")}
    want = {}
    for c in customers:
        at_stop = held.get(c, 0)
        rest = seen[c] - at_stop
        want[c] = rest if c.startswith("acme/") else at_stop * 100 + rest
    assert bills == {c: v for c, v in want.items() if v}
