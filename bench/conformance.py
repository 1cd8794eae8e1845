"""The conformance suite's long form: random scenarios on the harness and every Spark plan.

    .venv/bin/python bench/conformance.py --scenarios 20                 # a fresh seed
    .venv/bin/python bench/conformance.py --scenarios 3 --seed 1234 --plans columnar/arrow

Scenario ``i`` is drawn from seed ``S + i`` (``tests/conformance/scenario.py``'s
``random_scenario``: duplicates, out-of-order and late records, watermark moves) with one
to three control steps drawn from the same seed — clean restarts, crashes at named points
(``MILLWHEEL_CRASH``, a driver process of its own; the Arrow mapping's ``after_manifest``
among them on that plan), rescales to 2-8 key intervals — and replayed on the harness
(both kinds) and on each Spark plan (``tests/conformance/conftest.py``'s ``spark_plans``).
Each run's output streams are compared with the reference model
(``tests/conformance/model.py``): every expected output exactly once, nothing else.

Results are printed as they come and written after every scenario to ``--out`` (default
``bench/results/conformance_<date>.json``): per scenario and plan, agreement, the
differences (at most 20), seconds, crashes landed and missed, rescales refused. Exit
code 1 if any run disagreed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# as the test suite's conftest.py: Spark's workers run this interpreter and import the repository
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)
os.environ.setdefault("MILLWHEEL_SPARK_UI", "0")
os.environ.setdefault("MILLWHEEL_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

from tests.conformance.computations import KINDS  # noqa: E402
from tests.conformance.conftest import draw_seed, spark_plans  # noqa: E402
from tests.conformance.model import compare, expected, observed  # noqa: E402
from tests.conformance.runners import run_harness, run_spark  # noqa: E402
from tests.conformance.scenario import (  # noqa: E402
    ARROW_CRASH_POINTS,
    CRASH_POINTS,
    Crash,
    Rescale,
    Restart,
    random_scenario,
)


def controls(seed: int, arrow: bool) -> list:
    """One to three control steps drawn from ``seed`` (the same number, so the same data, on
    every plan; an Arrow-mapped plan may crash at its own point too)."""
    rng = random.Random(seed * 7919 + 1)
    points, own_points = sorted(CRASH_POINTS), sorted(ARROW_CRASH_POINTS)
    out = []
    for _ in range(rng.randint(1, 3)):
        # as many draws on every plan, so the plans get the same steps but for the Arrow one's point
        r, point, own, own_point, n = (
            rng.random(),
            rng.choice(points),
            rng.random(),
            rng.choice(own_points),
            rng.randint(2, 8),
        )
        if arrow and own < 0.3:
            point = own_point
        out.append(Restart() if r < 0.3 else Rescale(n) if r < 0.5 else Crash(point))
    return out


def scenario_for(seed: int, arrow: bool):
    rng = random.Random(seed)
    return random_scenario(
        seed,
        keys=rng.randint(3, 30),
        batches=rng.randint(6, 20),
        per_batch=rng.randint(5, 40),
        disorder_ms=rng.randint(0, 3_000),
        controls=controls(seed, arrow),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--scenarios", type=int, default=10, help="random scenarios (default 10)")
    p.add_argument(
        "--seed", type=int, default=None, help="the first scenario's seed (default: fresh)"
    )
    p.add_argument(
        "--plans",
        default="",
        help="comma-separated Spark plans (kind/name) to run, default all; 'none': the harness only",
    )
    p.add_argument("--workdir", default=".millwheel/conformance-bench")
    p.add_argument(
        "--out",
        default=str(ROOT / "bench" / "results" / f"conformance_{time.strftime('%Y%m%d')}.json"),
    )
    p.add_argument("--timeout-s", type=float, default=900, help="per Spark run")
    args = p.parse_args(argv)
    seed = draw_seed() if args.seed is None else args.seed
    plans = spark_plans()
    if args.plans == "none":
        plans = []
    elif args.plans:
        wanted = set(args.plans.split(","))
        plans = [pl for pl in plans if pl.id in wanted]
    print(f"conformance seed: {seed} (rerun with --seed {seed})", flush=True)
    doc: dict = {
        "what": "the conformance suite's long form (bench/conformance.py): random scenarios on the harness and every Spark plan against the reference model",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_at_start": os.getloadavg()[0],
        },
        "seed": seed,
        "plans": [pl.id for pl in plans],
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "runs": [],
    }
    spark = None
    if plans:
        from millwheel.runtime import spark_session

        spark = spark_session("local[2]")
    work = Path(args.workdir)
    out = Path(args.out)
    bad = 0
    for i in range(args.scenarios):
        s = seed + i
        targets = [(kind, None) for kind in KINDS] + [(pl.kind, pl) for pl in plans]
        for kind, plan in targets:
            sc = scenario_for(s, arrow=plan is not None and plan.mapping == "arrow")
            name = f"{kind}/{plan.name}" if plan else f"harness/{kind}"
            want = expected(sc)
            row: dict = {"seed": s, "run": name, "controls": [repr(c) for c in sc.controls()]}
            row["expected_outputs"] = sum(want.values())
            t0 = time.monotonic()
            try:
                if plan is None:
                    outputs = run_harness(sc, kind)
                else:
                    d = work / f"{s}-{kind}-{plan.name}"
                    shutil.rmtree(d, ignore_errors=True)
                    run = run_spark(sc, plan, d, spark, timeout_s=args.timeout_s)
                    outputs = run.outputs
                    row.update(
                        crashes=run.crashes,
                        missed=run.missed,
                        refused=run.refused,
                        drivers=run.drivers,
                    )
                got, problems = observed(outputs, resends=plan is None)
                diff = compare(want, got, problems)
            except Exception as exc:  # a run that failed is a disagreement, with its reason
                diff = [f"the run failed: {type(exc).__name__}: {exc}"[:2000]]
                traceback.print_exc()
            row["seconds"] = round(time.monotonic() - t0, 1)
            row["agrees"] = not diff
            row["differences"] = diff[:20]
            doc["runs"].append(row)
            bad += bool(diff)
            extra = ""
            if plan is not None and "crashes" in row:
                extra = f", crashes {len(row['crashes'])} (missed {len(row['missed'])}), rescales refused {len(row['refused'])}"
            verdict = "agrees" if not diff else f"DISAGREES ({len(diff)} differences)"
            print(f"seed {s} {name}: {verdict}, {row['seconds']} s{extra}", flush=True)
            if diff:
                print(sc.describe(), flush=True)
                print("\n".join(diff[:20]), flush=True)
        doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        doc["totals"] = {
            "scenarios": i + 1,
            "runs": len(doc["runs"]),
            "disagreements": bad,
            "crashes_landed": sum(len(r.get("crashes", ())) for r in doc["runs"]),
            "crashes_missed": sum(len(r.get("missed", ())) for r in doc["runs"]),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc.get("totals", {})), f"written to {out}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
