"""What ``millwheel rescale`` costs (a command, not a test): ``python bench/rescale_bench.py``.

For each held-key count, a computation that keeps a count per key (exactly-once: each
key also keeps its dedup ids) is loaded with that many distinct keys on 8 key intervals
(``local[2]``) and stopped; then ``rescale`` takes it to 16 intervals, and the run is
resumed with nothing new to read, so its first micro-batch is the state move. Measured:

* ``rescale_s``: the command (publishing, reading the state through Spark's state data
  source, writing the heartbeat file, ``run.json``), and ``read_s`` of it;
* ``move_file_mb``: the heartbeat file's size;
* ``resume_s`` / ``resume_plain_s``: the resumed run's wall time (start to drained) after
  the rescale, and of the same resume without one (measured first): the difference is
  what the move batch costs.

Figures go to stdout and ``bench/results/rescale.json``. ``--keys`` overrides the counts,
``--intervals FROM TO`` the layouts (10M held keys: ``--keys 10000000 --intervals 64 128``,
so an interval row holds ~160k keys, not 1.25M).

``--columnar`` runs the same count as a columnar computation (``ColumnarComputation``: one
store per key interval, split and merged by the move) into ``bench/results/rescale_columnar.json``.

``--layout keys`` (or ``intervals``) measures a layout change instead (``_relayout.py``):
the run is loaded in the other layout with 8 intervals and ``rescale --layout`` moves it
(``relayout_s``: the command — publishing, reading the state, ``build_s`` of the query that
builds the new store, the graft, ``run.json``; ``read_s``); the resume after it (whose first
batch loads the new store) is timed against a plain resume as above. Figures go to
``bench/results/relayout.json``.

``--online`` measures the online rescale instead (``millwheel/runtime/_online.py``), into
``bench/results/rescale_online.json``:

* per held-key count, the same loaded computation rescaled 8 -> 16 *while its driver runs*
  (this script is the driver's loop; the request comes from another thread, as from
  ``millwheel rescale``): the answer's figures — the whole request (``total_s``), how long
  C's query was down (``stopped_s``: stop, publish, read, write, restart), of which the
  move itself (``move_s``, ``read_s``), and from the restart to the published move batch
  (``restart_to_moved_s``);
* a skewed load (``skew``): ``--skew-keys`` keys held, then batches whose records all go
  to a few hot keys of one key interval; a micro-batch's time (Spark's
  ``triggerExecution``) and the hot interval's step time (``step_ms`` of its summary),
  medians over ``--skew-batches`` batches with 4 intervals, then after an online split to
  8 (the hot interval's rows are rewritten whole each batch: half the keys, half the bytes).

``--online --layout keys`` (or ``intervals``) measures a layout change *while its driver
runs* (``_online.py`` with ``_relayout.move_layout``), into ``bench/results/relayout_online.json``:
the computation loaded in the other layout with 8 intervals, then moved, the answer's
figures as above (``stopped_s``: stop, publish, read, build the new store, graft, swap,
restart; of which ``move_s``, ``read_s``, ``build_s``; ``restart_to_moved_s``: until a
batch on the new store is published).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from millwheel import (  # noqa: E402
    MAX_TIMESTAMP,
    ColumnarComputation,
    Computation,
    Record,
    Source,
    SourceBatch,
    Topology,
)
from millwheel.runtime import RuntimeSettings, SparkRuntime, spark_session  # noqa: E402
from millwheel.runtime._rescale import rescale  # noqa: E402


class Count(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)


class ColumnarCount(ColumnarComputation):
    """The same count per key, columnar: the interval's store holds a ``(key, n)`` table."""

    record_columns = ("key",)

    def process_batch(self, batch) -> None:
        n = batch.records.groupby("key", sort=False, observed=True).size().rename("n").reset_index()
        old = batch.state
        if len(old):
            n = (
                pd.concat([old, n])
                .groupby("key", sort=False, as_index=False, observed=True)["n"]
                .sum()
            )
        batch.set_state(n)


class Keys(Source):
    """``keys`` distinct keys, one record each, made batch by batch: the driver never holds
    them all (a ``SampleSource`` of 10M records took the process past 11 GB)."""

    def __init__(self, keys: int) -> None:
        self.keys, self.per = keys, max(min(keys // 4, 500_000), 1)

    def batches(self, injector: str = "injector", stream: str = "records"):
        for lo in range(0, self.keys, self.per):
            yield SourceBatch(
                [
                    Record(None, {"k": i}, 1_000 + i % 1_000, f"r{i}")
                    for i in range(lo, min(lo + self.per, self.keys))
                ],
                1_000,
            )
        yield SourceBatch([], MAX_TIMESTAMP)


def topology(keys: int, columnar: bool = False) -> Topology:
    t = Topology("rescale_bench")
    t.injector("in", Keys(keys))
    t.computation(
        ColumnarCount if columnar else Count, name="Count", inputs={"in": lambda r: r.value["k"]}
    )
    return t


def held_keys(spark, run: Path) -> int:
    """Keys ``Count`` holds at its last committed batch (envelopes, or columnar stores)."""
    from millwheel._colstore import ColumnarStore
    from millwheel.runtime._fs import Location
    from millwheel.runtime._spark_internals import committed_batches, read_interval_states

    ckpt = Location.of(str(run / "checkpoints" / "Count"))
    what, states = read_interval_states(spark, ckpt.uri, committed_batches(ckpt)[-1])
    if what == "columnar":
        return sum(len(ColumnarStore.decode(b).keys_held()) for b in states.values())
    return sum(len(envs) for envs in states.values())


def one(spark, work: Path, keys: int, start: int = 8, to: int = 16, columnar: bool = False) -> dict:
    run = work / f"run-{keys}"
    shutil.rmtree(run, ignore_errors=True)
    settings = RuntimeSettings(drain=True, intervals=start)
    t0 = time.perf_counter()
    SparkRuntime(topology(keys, columnar), str(run), settings, spark=spark).run(timeout_s=3600)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    SparkRuntime(topology(keys, columnar), str(run), settings, spark=spark).run(timeout_s=3600)
    plain_s = time.perf_counter() - t0
    done = rescale(str(run), "Count", to, spark=spark)
    size = os.path.getsize(run / "heartbeats" / "Count" / done["file"]) / 1e6
    t0 = time.perf_counter()
    rt = SparkRuntime(topology(keys, columnar), str(run), settings, spark=spark)
    rt.run(timeout_s=3600)
    resume_s = time.perf_counter() - t0
    held = held_keys(spark, run)
    assert held == keys, f"{held} keys after the move, {keys} before"
    shutil.rmtree(run, ignore_errors=True)
    return {
        "keys": keys,
        "columnar": columnar,
        "from": start,
        "to": to,
        "load_s": round(load_s, 1),
        "rescale_s": round(done["seconds"], 2),
        "read_s": round(done["read_s"], 2),
        "move_file_mb": round(size, 1),
        "resume_plain_s": round(plain_s, 1),
        "resume_s": round(resume_s, 1),
        "move_batch_s": round(resume_s - plain_s, 1),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg_at_end": [round(x, 1) for x in os.getloadavg()],
    }


def one_layout(spark, work: Path, keys: int, layout: str) -> dict:
    run = work / f"relayout-{keys}"
    shutil.rmtree(run, ignore_errors=True)
    other = "intervals" if layout == "keys" else "keys"
    settings = RuntimeSettings(drain=True, intervals=8, state_layout=other)
    t0 = time.perf_counter()
    SparkRuntime(topology(keys), str(run), settings, spark=spark).run(timeout_s=3600)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    SparkRuntime(topology(keys), str(run), settings, spark=spark).run(timeout_s=3600)
    plain_s = time.perf_counter() - t0
    done = rescale(str(run), "Count", layout=layout, spark=spark)
    t0 = time.perf_counter()
    rt = SparkRuntime(topology(keys), str(run), settings, spark=spark)
    rt.run(timeout_s=3600)
    resume_s = time.perf_counter() - t0
    held = len(rt.envelopes("Count"))
    assert held == keys == done["keys"], f"{held} keys after the move, {keys} before"
    shutil.rmtree(run, ignore_errors=True)
    return {
        "keys": keys,
        "from": other,
        "to": layout,
        "intervals": 8,
        "load_s": round(load_s, 1),
        "relayout_s": round(done["seconds"], 2),
        "read_s": round(done["read_s"], 2),
        "build_s": round(done["build_s"], 2),
        "resume_plain_s": round(plain_s, 1),
        "resume_s": round(resume_s, 1),
        "first_batch_extra_s": round(resume_s - plain_s, 1),
    }


def _drive(rt: SparkRuntime, until, timeout_s: float = 3600) -> None:
    """The driver's loop, by hand, until ``until()``."""
    deadline = time.monotonic() + timeout_s
    while not until():
        if time.monotonic() > deadline:
            msg = "the bench's run did not get there in time"
            raise TimeoutError(msg)
        rt.poll()
        time.sleep(rt.settings.poll_ms / 1000)


def _online_rescale(
    rt: SparkRuntime, run: Path, computation: str, intervals: int | None, layout: str | None = None
) -> dict:
    """Ask the running driver ``rt`` (driven here) for a rescale, as ``millwheel rescale`` does from another process."""
    import threading

    from millwheel.runtime._online import rescale as rescale_online

    answer: dict = {}
    asker = threading.Thread(
        target=lambda: answer.update(
            rescale_online(str(run), computation, intervals, layout=layout, timeout_s=3600)
        )
    )
    asker.start()
    _drive(rt, lambda: not asker.is_alive())
    assert answer.get("state") == "done", answer
    return answer


def online(spark, work: Path, keys: int) -> dict:
    run = work / f"online-{keys}"
    shutil.rmtree(run, ignore_errors=True)
    rt = SparkRuntime(topology(keys), str(run), RuntimeSettings(intervals=8), spark=spark)
    rt.start()
    try:
        _drive(rt, lambda: rt.computations["Count"].metrics["records_in"] >= keys)
        a = _online_rescale(rt, run, "Count", 16)
    finally:
        rt.stop()
    shutil.rmtree(run, ignore_errors=True)
    return {
        "keys": keys,
        "from": 8,
        "to": 16,
        "total_s": a["total_s"],
        "stopped_s": a["stopped_s"],
        "move_s": a["move_s"],
        "read_s": a["read_s"],
        "restart_to_moved_s": a["restart_to_moved_s"],
        "at_batch_boundary": a["stopped_at_batch_boundary"],
    }


def online_layout(spark, work: Path, keys: int, layout: str) -> dict:
    run = work / f"online-relayout-{keys}"
    shutil.rmtree(run, ignore_errors=True)
    other = "intervals" if layout == "keys" else "keys"
    rt = SparkRuntime(
        topology(keys), str(run), RuntimeSettings(intervals=8, state_layout=other), spark=spark
    )
    rt.start()
    try:
        _drive(rt, lambda: rt.computations["Count"].metrics["records_in"] >= keys)
        a = _online_rescale(rt, run, "Count", None, layout)
        held = len(rt.envelopes("Count"))
    finally:
        rt.stop()
    assert held == keys == a["keys"], f"{held} keys after the move, {keys} before ({a})"
    shutil.rmtree(run, ignore_errors=True)
    return {
        "keys": keys,
        "from": other,
        "to": layout,
        "intervals": 8,
        "total_s": a["total_s"],
        "stopped_s": a["stopped_s"],
        "move_s": a["move_s"],
        "read_s": a["read_s"],
        "build_s": a["build_s"],
        "restart_to_moved_s": a["restart_to_moved_s"],
        "at_batch_boundary": a["stopped_at_batch_boundary"],
    }


class Touch(Computation):
    """A count per key (the hot keys' records touch their interval's row every batch)."""

    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)


def skew(spark, work: Path, held: int, batches: int) -> dict:
    """A batch's time with a hot key interval, before and after an online split (see the module docstring)."""
    from statistics import median

    from millwheel._record import encode_key
    from millwheel.runtime._keying import interval_of

    hot = [k for k in range(held, held + 10_000) if interval_of(encode_key(k), 8) == 0][
        :4
    ]  # one interval of 8, so of 4 too
    per = 2_000
    load = [Record(None, {"k": i}, 1_000, f"h{i}") for i in range(held)]
    waves = [
        [Record(None, {"k": hot[j % len(hot)]}, 2_000 + b, f"b{b}-{j}") for j in range(per)]
        for b in range(4 * batches + 10)
    ]  # enough for the batches before, during and after the split

    class Skewed(Source):
        """The held keys in one batch, then the hot keys' batches."""

        def batches(self, injector: str = "injector", stream: str = "records"):
            yield SourceBatch(load, 2_000)
            for b, wave in enumerate(waves):
                yield SourceBatch(wave, 2_001 + b)
            yield SourceBatch([], MAX_TIMESTAMP)

    t = Topology("rescale_skew")
    t.injector("in", Skewed())
    t.computation(Touch, inputs={"in": lambda r: r.value["k"]})
    run = work / "skew"
    shutil.rmtree(run, ignore_errors=True)
    rt = SparkRuntime(
        t, str(run), RuntimeSettings(intervals=4, max_files_per_trigger=1), spark=spark
    )
    steps: list[tuple[int, int]] = []  # (intervals, the hot interval's step_ms) per published batch
    c = rt.computations["Touch"]
    inner = c.outbox.on_summary

    def on_summary(batch: int, summaries: list) -> None:
        inner(batch, summaries)
        if summaries:
            steps.append((c.intervals, max(s.step_ms for s in summaries)))

    c.outbox.on_summary = on_summary
    rt.start()
    try:
        _drive(rt, lambda: c.metrics["records_in"] >= held + per * (batches + 2))
        hot_batch = lambda p: per <= p["numInputRows"] < held  # noqa: E731 - a wave (and its heartbeats), not the load nor the move
        before = [p for p in c.query.recentProgress if hot_batch(p)][-batches:]
        n_req = len(steps)
        a = _online_rescale(rt, run, "Touch", 8)
        n0 = len(steps)
        split = lambda: [s for n, s in steps[n0:] if n == 8]  # noqa: E731
        _drive(rt, lambda: len(split()) >= batches + 1 or rt.drained(), timeout_s=900)
        if len(split()) < batches + 1:
            msg = f"the input ran out {len(split())} batches after the split ({batches + 1} needed): more waves"
            raise RuntimeError(msg)
        after = [p for p in c.query.recentProgress if hot_batch(p)][-batches:]
    finally:
        rt.stop()
    shutil.rmtree(run, ignore_errors=True)
    ms = lambda ps: median(p["durationMs"]["triggerExecution"] for p in ps)  # noqa: E731
    step_before = median(s for n, s in steps[:n_req][-batches:] if n == 4)
    step_after = median(split()[1:])  # the first one may be the move batch
    return {
        "held_keys": held,
        "hot_keys": len(hot),
        "records_per_batch": per,
        "batches": batches,
        "batch_ms_4": ms(before),
        "batch_ms_8": ms(after),
        "hot_step_ms_4": step_before,
        "hot_step_ms_8": step_after,
        "split_total_s": a["total_s"],
        "split_stopped_s": a["stopped_s"],
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--keys", type=int, nargs="*", default=[100_000, 1_000_000])
    p.add_argument("--work", default="/tmp/millwheel-rescale-bench")
    p.add_argument(
        "--layout",
        choices=("intervals", "keys"),
        default=None,
        help="measure a change to this state layout instead (bench/results/relayout.json)",
    )
    p.add_argument(
        "--online",
        action="store_true",
        help="the online rescale and a hot interval's split (bench/results/rescale_online.json)",
    )
    p.add_argument("--skew-keys", type=int, default=400_000)
    p.add_argument("--skew-batches", type=int, default=8)
    p.add_argument(
        "--columnar",
        action="store_true",
        help="the stopped-run rescale of the same count as a columnar computation (bench/results/rescale_columnar.json)",
    )
    p.add_argument(
        "--intervals",
        type=int,
        nargs=2,
        default=[8, 16],
        metavar=("FROM", "TO"),
        help="the stopped-run rescale: from and to this many key intervals",
    )
    args = p.parse_args()
    spark = spark_session("local[2]")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.online and args.layout is not None:
        path = ROOT / "bench" / "results" / "relayout_online.json"
        kept = json.loads(path.read_text())["runs"] if path.exists() else []
        out = []
        for keys in args.keys:
            r = online_layout(spark, work, keys, args.layout)
            r.update(
                measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                load_avg=[round(x, 2) for x in os.getloadavg()],
            )
            print(json.dumps(r), flush=True)
            out.append(r)
        fresh = {(r["keys"], r["to"]) for r in out}
        runs = sorted(
            [r for r in kept if (r["keys"], r["to"]) not in fresh] + out,
            key=lambda r: (r["to"], r["keys"]),
        )
        result = {
            "what": "millwheel rescale --layout while the driver runs (online), 8 key intervals, local[2]",
            "runs": runs,
        }
        path.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    if args.online:
        runs = []
        for keys in args.keys:
            r = online(spark, work, keys)
            print(json.dumps(r), flush=True)
            runs.append(r)
        sk = skew(spark, work, args.skew_keys, args.skew_batches)
        print(json.dumps(sk), flush=True)
        result = {
            "what": "online rescale (the driver running) 8 -> 16 key intervals, local[2]; a hot interval split 4 -> 8 online",
            "runs": runs,
            "skew": sk,
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_avg_at_end": os.getloadavg(),
        }
        (ROOT / "bench" / "results" / "rescale_online.json").write_text(
            json.dumps(result, indent=1) + "\n"
        )
        return 0
    out = []
    for keys in args.keys:
        r = (
            one(spark, work, keys, *args.intervals, columnar=args.columnar)
            if args.layout is None
            else one_layout(spark, work, keys, args.layout)
        )
        print(json.dumps(r), flush=True)
        out.append(r)
    path = (
        ROOT
        / "bench"
        / "results"
        / (
            "relayout.json"
            if args.layout is not None
            else "rescale_columnar.json"
            if args.columnar
            else "rescale.json"
        )
    )
    kept = json.loads(path.read_text())["runs"] if path.exists() else []
    fresh = {(r["keys"], r.get("to")) for r in out}
    runs = sorted(
        [r for r in kept if (r["keys"], r.get("to")) not in fresh] + out,
        key=lambda r: (str(r.get("to")), r["keys"]),
    )  # other figures stay
    what = "millwheel rescale of a stopped run (from -> to key intervals: each run's own), local[2], interval-row layout"
    if args.columnar:
        what += "; a columnar computation (its store per key interval split and merged)"
    if args.layout is not None:
        what = "millwheel rescale --layout (intervals <-> keys), 8 key intervals, local[2]"
    result = {"what": what, "runs": runs}
    path.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
