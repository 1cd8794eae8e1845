"""Bootstrapping state on Spark: ``initial_state=`` at a driver's start and ``millwheel state load``
(``millwheel/runtime/_state_load.py``, ``_state_write.py``; docs/runtime.md, "Bootstrapping state").

The differential of issue 38: ``DailyClicks`` (``bootstrap_driver.py``: log files per day
with duplicates and disorder across files, one-day windows) runs on Spark over the first
days up to a point in time (the last day open, its timer pending); its state, read with the
reader API, bootstraps a second run fed the rest of the log. The two runs' output together
equal the harness's one run over the whole log, and the plain batch answer — per-record and
columnar, on every plan the house keeps (interval rows, key rows, columnar interval rows,
the Arrow mapping). A kill -9 during the load (before and after ``run.json`` pins it) and
inside the batch that installs it leaves a run that finishes with exactly the same output.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from millwheel import MillwheelError
from millwheel._initial_state import InitialState
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin
from millwheel.runtime._query import HB_MOVE_SCHEMA
from millwheel.runtime._spark_internals import committed_batches
from millwheel.runtime._state_load import BOOTSTRAPS, load
from millwheel.runtime._state_reader import read_state, state_main
from millwheel.runtime._state_write import HB_MOVE_SCHEMA as WRITTEN_SCHEMA
from millwheel.runtime._state_write import install_rows
from millwheel.testing import Harness

from . import bootstrap_driver as bd
from ._procs import kill_group

DRIVER = str(Path(__file__).with_name("bootstrap_driver.py"))
DAYS = 5


def test_the_written_rows_are_a_state_moves():
    assert WRITTEN_SCHEMA == HB_MOVE_SCHEMA


def test_install_rows_do_not_depend_on_the_sources_order():
    from computations.windowing import Buckets

    t = bd.build("unused", 1, 1)
    spec = t.computations[bd.NAME]
    items = [(f"u{i}", Buckets({0: i + 1}, 0), {f"w{i}": (86_400_000, 0)}) for i in range(50)]
    a = install_rows(spec, InitialState(bd.NAME, items, columnar=False), 4, [7, 3, 9, 1])
    b = install_rows(spec, InitialState(bd.NAME, items[::-1], columnar=False), 4, [7, 3, 9, 1])
    assert a.digest == b.digest and a.keys == 50 and a.table.equals(b.table)
    assert set(a.table.column("group").to_pylist()) <= {7, 3, 9, 1}
    c = install_rows(spec, InitialState(bd.NAME, items[1:], columnar=False), 4, [7, 3, 9, 1])
    assert c.digest != a.digest


# ---- Spark ------------------------------------------------------------------------------
def _settings(layout: str = "intervals") -> RuntimeSettings:
    return RuntimeSettings(drain=True, intervals=4, state_layout=layout)


def _run_to_point(rt: SparkRuntime, cap: int, timeout: float = 400) -> None:
    """Run until the injector's source ended, the computation's low watermark reached ``cap``
    and it consumed and published all its input: the point in time, then stop."""
    rt.start()
    try:
        t0 = time.monotonic()
        while True:
            rt.poll()
            c = rt.computations[bd.NAME]
            if (
                rt.injectors["clicks"].finished
                and c.low_watermark >= cap
                and not c.pending_inputs
                and not c.outbox.loc.list()
            ):
                return
            assert time.monotonic() - t0 < timeout, rt.status()
            time.sleep(0.2)
    finally:
        rt.stop()


def _whole(data: Path, kind: str) -> list[dict]:
    h = Harness(bd.build(str(data), 1, DAYS, "columnar" if kind == "arrow" else kind))
    h.run_sources()
    return h.values("daily")


def _key(v: dict) -> tuple:
    return (v["window_start"], v["key"])


def _state_items(spark, root: Path, kind: str) -> list[tuple]:
    """The first run's state with the reader API (``millwheel state``'s), as ``(key, state, timers)``."""
    codec = None
    if kind == "record":
        from computations.windowing import WindowCounter

        codec = WindowCounter.options.state_codec
    cs = read_state(spark, str(root), bd.NAME, codec=codec)
    return [(k.key, k.state, k.timers) for k in cs.keys]


@pytest.mark.spark
@pytest.mark.parametrize(
    ("kind", "layout"),
    [
        ("record", "intervals"),
        ("columnar", "intervals"),
        pytest.param("record", "keys", marks=pytest.mark.slow),
        pytest.param("arrow", "intervals", marks=pytest.mark.slow),
    ],
)
def test_bootstrapped_from_a_spark_run_at_a_point_in_time(tmp_path, spark, kind, layout):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    data = tmp_path / "data"
    lines = bd.write_clicks(data, DAYS, per_day=rng.randrange(150, 250), seed=seed)
    split = rng.randrange(2, DAYS)
    first = SparkRuntime(
        bd.build(str(data), 1, split, kind, cap=bd.cap_after(split)),
        str(tmp_path / "first"),
        _settings(layout),
        spark=spark,
    )
    _run_to_point(first, bd.cap_after(split))
    before = first.values("daily")
    items = _state_items(spark, tmp_path / "first", kind)
    assert any(timers for _, _, timers in items)  # the open day is in the state, its timer too
    source: object = items
    if (
        kind != "record"
    ):  # rows are plain: through a JSON-lines file, as `millwheel state --json` writes them
        path = tmp_path / "state.jsonl"
        path.write_text(
            "".join(
                json.dumps({"key": k, "state": s, "timers": {t: list(v) for t, v in tm.items()}})
                + "\n"
                for k, s, tm in items
            )
        )
        source = str(path)
    rest = SparkRuntime(
        bd.build(str(data), split + 1, DAYS, kind, initial_state=source),
        str(tmp_path / "rest"),
        _settings(layout),
        spark=spark,
    )
    rest.run(timeout_s=400)
    both = before + rest.values("daily")
    assert sorted(both, key=_key) == sorted(_whole(data, kind), key=_key)
    assert bd.as_answer(both) == bd.batch_answer(lines)
    entry = read_pin(Location.of(str(tmp_path / "rest")))[BOOTSTRAPS][bd.NAME]
    # a key that keeps nothing (its days closed, only its record ids held) gets no row
    assert entry["keys"] == len({k for k, state, timers in items if state is not None or timers})
    # resumed, the load is done: nothing is read or loaded again, the output stays
    again = SparkRuntime(
        bd.build(str(data), split + 1, DAYS, kind, initial_state=source),
        str(tmp_path / "rest"),
        _settings(layout),
        spark=spark,
    )
    again.run(timeout_s=400)
    assert sorted(again.values("daily"), key=_key) == sorted(rest.values("daily"), key=_key)


def _topology_file(tmp_path: Path, kind: str) -> Path:
    f = tmp_path / "clicks_topology.py"
    f.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import bootstrap_driver as bd\n"
        f"topology = bd.build({str(tmp_path / 'data')!r}, 1, {DAYS}, {kind!r})\n"
    )
    return f


@pytest.mark.spark
def test_state_load_command_exactly_once_and_its_refusals(tmp_path, spark, capsys):
    data = tmp_path / "data"
    lines = bd.write_clicks(data, DAYS, per_day=120, seed=11)
    root = tmp_path / "run"
    # the harness's state after day 2 (a point in time) as `millwheel state --json` prints it
    h = Harness(bd.build(str(data), 1, 2, "columnar", cap=bd.cap_after(2)))
    h.run_sources()
    before = h.values("daily")
    doc = {
        "computation": bd.NAME,
        "keys": [
            {
                "key": k,
                "state": None if s is None else s.to_dict("records"),
                "timers": {t: {"ts": ts, "domain": "low_watermark"} for t, (ts, _) in tm.items()},
            }
            for k, s, tm in bd.harness_state(h)
        ],
    }
    src = tmp_path / "state.json"
    src.write_text(json.dumps(doc))
    topo = _topology_file(tmp_path, "columnar")

    # a run directory that never ran: refused (no key intervals pinned yet)
    assert state_main(["load", str(root), bd.NAME, str(src), "--topology", str(topo)]) == 2
    assert "no run.json" in capsys.readouterr().err
    # the run's injector alone has run: the run directory is pinned, DailyClicks never started
    only = SparkRuntime(
        bd.build(str(data), 3, DAYS, "columnar"),
        str(root),
        RuntimeSettings(drain=False, intervals=4, only=("clicks",)),
        spark=spark,
    )
    only.start()
    only.stop()
    assert state_main(["load", str(root), bd.NAME, str(src), "--topology", str(topo)]) == 0
    assert "loaded:" in capsys.readouterr().out
    assert state_main(["load", str(root), bd.NAME, str(src), "--topology", str(topo)]) == 0
    assert "already loaded" in capsys.readouterr().out
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"key": "u1", "start": 0, "count": 1, "empty_run": 0}) + "\n")
    assert state_main(["load", str(root), bd.NAME, str(other), "--topology", str(topo)]) == 2
    assert "another initial state already" in capsys.readouterr().err

    rt = SparkRuntime(bd.build(str(data), 3, DAYS, "columnar"), str(root), _settings(), spark=spark)
    rt.run(timeout_s=400)
    both = before + rt.values("daily")
    assert bd.as_answer(both) == bd.batch_answer(lines)
    assert committed_batches(Location.of(str(root / "checkpoints" / bd.NAME)))
    # committed: the same load is still a no-op, any other refused with the reason
    assert state_main(["load", str(root), bd.NAME, str(src), "--topology", str(topo)]) == 0
    assert "installed" in capsys.readouterr().err
    fresh = tmp_path / "fresh"
    fresh_rt = SparkRuntime(
        bd.build(str(data), 3, DAYS, "columnar"), str(fresh), _settings(), spark=spark
    )
    fresh_rt.run(timeout_s=400)
    spec = bd.build(str(data), 3, DAYS, "columnar").computations[bd.NAME]
    with pytest.raises(MillwheelError, match="has committed .* batches"):
        load(str(fresh), spec, str(src))
    assert state_main(["load", str(fresh), bd.NAME, str(src), "--topology", str(topo)]) == 2
    assert "its state is its own now" in capsys.readouterr().err
    # and a topology that names an initial state the run never loaded is refused at start
    late = SparkRuntime(
        bd.build(str(data), 3, DAYS, "columnar", initial_state=str(src)),
        str(fresh),
        _settings(),
        spark=spark,
    )
    with pytest.raises(MillwheelError, match="initial_state in the topology"):
        late.run(timeout_s=120)


def _driver(root, data, first, last, kind, *extra, env=None, log=None):
    """A ``bootstrap_driver.py`` process over days ``first..last``, in a session of its own."""
    e = dict(os.environ)
    e.update(env or {})
    e["PYSPARK_PYTHON"] = sys.executable
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, DRIVER, str(root), str(data), str(first), str(last), kind, *extra],
            env=e,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["record", pytest.param("columnar", marks=pytest.mark.slow)])
def test_kill_9_during_the_load_and_inside_the_batch_that_installs_it(tmp_path, kind):
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    lines = bd.write_clicks(data, DAYS, per_day=150, seed=5)
    split = 2
    h = Harness(bd.build(str(data), 1, split, kind, cap=bd.cap_after(split)))
    h.run_sources()
    before = h.values("daily")
    state = tmp_path / "state.pkl"
    state.write_bytes(pickle.dumps(bd.harness_state(h)))
    dump = tmp_path / "out.json"
    args = (root, data, split + 1, DAYS, kind, "--initial", str(state), "--dump", str(dump))
    # killed with the load's file written and not pinned, then pinned and not renamed into
    # view, then inside the first batch (which installs it) before Spark's commit, then
    # once it committed and before its output is published
    for crash in (
        "bootstrap_written:0",
        "bootstrap_pinned:0",
        "before_commit:0",
        "before_publish:0",
    ):
        proc = _driver(*args, env={"MILLWHEEL_CRASH": f"{bd.NAME}:{crash}"}, log=log)
        try:
            assert proc.wait(timeout=600) == -9, log.read_text()[-3000:]
        finally:
            kill_group(proc)
        pin = read_pin(Location.of(str(root)))
        assert (BOOTSTRAPS in pin) == (crash != "bootstrap_written:0"), crash
        committed = committed_batches(Location.of(str(root / "checkpoints" / bd.NAME)))
        assert committed == ([0] if crash == "before_publish:0" else []), (crash, committed)
    proc = _driver(*args, log=log)
    try:
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        kill_group(proc)
    after = json.loads(dump.read_text())
    assert sorted(before + after, key=_key) == sorted(_whole(data, kind), key=_key)
    assert bd.as_answer(before + after) == bd.batch_answer(lines)


def _running_total():
    from millwheel import Computation

    class RunningTotal(Computation):
        def process_record(self, record):
            total = self.state.get(0) + record.value
            self.state.set(total)
            self.produce("totals", total)

        def process_timer(self, timer):
            self.produce("totals", ("closed", self.state.get()))

    return RunningTotal


@pytest.mark.spark
def test_the_docs_example_on_spark(tmp_path, spark):
    """docs/concepts.md's "Bootstrap" example, its records from a source, run on Spark."""
    from millwheel import Record, Topology
    from millwheel._sources import SampleSource

    t = Topology("bills")
    t.injector(
        "charges",
        SampleSource([Record("acme", 30, 1_000, "c1"), Record("zeta", 1, 1_200, "c2")]),
    )
    t.computation(
        _running_total(),
        name="RunningTotal",
        inputs=["charges"],
        outputs=["totals"],
        initial_state=[("acme", 120, {"close": 5_000}), ("zeta", 7)],
    )
    rt = SparkRuntime(t, str(tmp_path / "run"), _settings(), spark=spark)
    rt.run(timeout_s=300)
    values = rt.values("totals")
    assert sorted(map(repr, values)) == sorted(map(repr, [150, 8, ("closed", 150)]))


@pytest.mark.spark
def test_a_spark_dataframe_as_the_source(spark):
    """A Spark DataFrame (duck-typed: millwheel/ imports no pyspark), per-record and columnar."""
    import pandas as pd

    rows = pd.DataFrame(
        {"key": ["u1", "u2"], "start": [0, 0], "count": [3, 4], "empty_run": [0, 0]}
    )
    t = bd.build("unused", 1, 1, "columnar", initial_state=spark.createDataFrame(rows))
    h = Harness(t)
    assert h.state(bd.NAME, "u2")["count"].tolist() == [4]
    spec = t.computations[bd.NAME]
    done = install_rows(spec, t.initial_states[bd.NAME], 2, [5, 6])
    assert done.keys == 2 and done.table.num_rows <= 2  # one store per key interval
    frame = spark.createDataFrame(pd.DataFrame({"key": ["a"], "counts": [1]}))
    with pytest.raises(MillwheelError, match="cannot encode"):
        Harness(bd.build("unused", 1, 1, "record", initial_state=frame))
