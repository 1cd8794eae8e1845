"""Replaying a scenario: on the in-memory harness, and on a Spark plan (``conftest.Plan``).

Both return the run's output streams ``{stream: records}`` for ``model.observed``.

The harness feeds the scenario's batches as the Spark driver's injector does (each batch's
records under the watermark so far, then the watermark it moves to) and runs the topology
after each. A :class:`~.scenario.Crash` makes the next round with records crash at the
harness's corresponding point (``scenario.CRASH_POINTS``) and restart the computation;
:class:`~.scenario.Restart` and :class:`~.scenario.Rescale` (no key intervals here)
restart it.

On Spark, the script is cut into segments at its control steps (``scenario.segments``);
each segment is one driver on the same run directory whose source serves the batches up to
the segment's end. A segment's driver runs until the injector has sent them and the
computation has caught up with its watermark, then stops cleanly; the last one drains. A
:class:`~.scenario.Crash` runs its segment first in a driver process of its own with
``MILLWHEEL_CRASH`` set (``driver.py``): SIGKILL at the named point of the first batch with
data. A :class:`~.scenario.Rescale` calls ``millwheel.runtime.rescale`` on the stopped run
(the Arrow mapping must refuse it, unchanged) before the segment's driver starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from millwheel import MAX_TIMESTAMP
from millwheel._delivery import timers_due
from millwheel.testing import Crash as HarnessCrash
from millwheel.testing import Harness

from .computations import NAME, topology
from .model import STREAMS
from .scenario import (
    ARROW_CRASH_POINTS,
    CRASH_POINTS,
    Crash,
    Rescale,
    Restart,
    Scenario,
    segments,
    source_batches,
)

ROOT = Path(__file__).resolve().parents[2]
#: intervals of a conformance run (the run directory's first driver pins them)
INTERVALS = 4


def harness_crash(point: str) -> HarnessCrash:
    return HarnessCrash(CRASH_POINTS.get(point) or ARROW_CRASH_POINTS[point])


def run_harness(scenario: Scenario, kind: str) -> dict[str, list[Any]]:
    h = Harness(topology(scenario, kind))
    batches = iter(source_batches(scenario.steps))
    crash: str | None = None
    for step in scenario.steps:
        if isinstance(step, Crash):
            crash = step.point
            continue
        if isinstance(step, (Restart, Rescale)):
            h.restart(NAME)
            continue
        batch = next(batches)
        h.inject("events", batch.records)
        if crash is not None and batch.records:
            h.process(NAME, crash=harness_crash(crash))
            h.restart(NAME)
            crash = None
        h.advance_watermark("events", batch.low_watermark)
        h.run()
    last = next(batches)
    assert last.low_watermark == MAX_TIMESTAMP and next(batches, None) is None
    h.finish("events")
    h.run()
    return {s: h.output(s) for s in STREAMS}


# ---- Spark -------------------------------------------------------------------------------
@dataclass
class SparkRun:
    """What a Spark replay did besides its output: crashes that landed, those that did not
    (the driver finished its segment first), rescales refused, drivers started."""

    outputs: dict[str, list[Any]] = field(default_factory=dict)
    crashes: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    drivers: int = 0
    seconds: float = 0.0


def settings(plan: Any, **more: Any) -> Any:
    return plan.runtime_settings(
        drain=True, intervals=INTERVALS, injector_batches_per_poll=3, **more
    )


def due(rt: Any, low_watermark: int) -> bool:
    """Whether a computation's last summaries hold a low-watermark timer at or below
    ``low_watermark``: its watermark can reach the input's while that timer waits for the
    batch that fires it (on the per-key layout, the batch after the one that read the
    watermark: Spark's timers see a watermark one batch later), and a crash armed for the
    segment's first batch with output lands in that batch."""
    return any(
        timers_due(s.next_low_watermark_timer, None, low_watermark, 0)
        for c in rt.computations.values()
        for s in c.summaries.values()
    )


def run_segment(rt: Any, *, last: bool, timeout_s: float) -> None:
    """One driver's share of the script: to the end (``last``: drained), or until the injector
    has sent its batches, the computation caught up with the injector's watermark and fired
    every timer that watermark makes due (:func:`due`)."""
    if last:
        rt.run(timeout_s=timeout_s)
        return
    rt.start()
    t0 = time.monotonic()
    try:
        settle = 0
        while settle < 3:  # a few more rounds once caught up: publication goes on in them
            rt.poll()
            inj = rt.injectors["events"]
            if inj.finished and rt.caught_up(inj.low_watermark) and not due(rt, inj.low_watermark):
                settle += 1
            if time.monotonic() - t0 > timeout_s:
                msg = f"segment did not catch up within {timeout_s}s: {rt.status()}"
                raise TimeoutError(msg)
            time.sleep(rt.settings.poll_ms / 1000)
    finally:
        rt.stop()


def crash_driver(spec: dict, log: Path, timeout_s: float) -> int:
    """Run ``driver.py`` with ``spec`` in a process of its own (killed with its JVM and
    workers when done); its exit code (-9: the crash point killed it)."""
    from faults.inject import kill_tree

    env = dict(os.environ)
    env["MILLWHEEL_CRASH"] = f"{NAME}:{spec['crash']}:data"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.conformance.driver", json.dumps(spec)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s)
        finally:
            kill_tree(proc)


def run_spark(
    scenario: Scenario,
    plan: Any,
    root: Path,
    spark: Any,
    *,
    timeout_s: float = 600,
    log: Any = None,
) -> SparkRun:
    from millwheel import MillwheelError
    from millwheel.runtime import SparkRuntime, rescale

    t0 = time.monotonic()
    run = SparkRun()
    root.mkdir(parents=True, exist_ok=True)
    run_dir = str(root / "run")
    cuts = segments(scenario.steps)
    total = cuts[-1][1]
    rt = None
    for control, upto in cuts:
        last = upto == total
        if isinstance(control, Crash):
            spec = {
                "scenario": scenario.to_json(),
                "plan": f"{plan.kind}/{plan.name}",
                "run_dir": run_dir,
                "upto": upto,
                "crash": control.point,
                "timeout_s": timeout_s,
            }
            rc = crash_driver(spec, root / "crash-driver.log", timeout_s)
            run.drivers += 1
            what = f"{control.point} (segment up to batch {upto})"
            if rc == -9:
                run.crashes.append(what)
            elif rc == 0:
                run.missed.append(what)
            else:
                tail = (root / "crash-driver.log").read_text()[-4000:]
                msg = f"the crash driver exited {rc}:\n{tail}"
                raise AssertionError(msg)
        elif isinstance(control, Rescale):
            if plan.rescalable:
                rescale(run_dir, NAME, control.n, spark=spark)
            else:
                try:
                    rescale(run_dir, NAME, control.n, spark=spark)
                except MillwheelError as exc:
                    run.refused.append(str(exc)[:200])
                else:
                    msg = f"rescale of {plan.kind}/{plan.name} was not refused"
                    raise AssertionError(msg)
        topo = topology(scenario, plan.kind, upto=upto, mapping=plan.mapping)
        rt = SparkRuntime(topo, run_dir, settings(plan), spark=spark, log=log or (lambda _m: None))
        run.drivers += 1
        run_segment(rt, last=last, timeout_s=timeout_s)
    assert rt is not None
    run.outputs = {s: rt.output(s) for s in STREAMS}
    run.seconds = time.monotonic() - t0
    return run
