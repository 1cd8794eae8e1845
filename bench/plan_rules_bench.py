"""What Spark's planner rules cost a millwheel micro-batch, beside Spark's own stateful floor.

    PYTHONPATH=$PWD:$PWD/bench .venv/bin/python bench/plan_rules_bench.py [--seconds 20] [--out F]

Runs, in one local Spark session, the Python stateful floor of ``bench/latency_bench.py``
(``_latency_floor.floor``, kind ``python``: one file source, ``applyInPandasWithState``) and
then millwheel's two stages ``PassA -> B`` at the same rate, each after a warm-up run, with
Spark's analyzer and optimizer rule timers (``RuleExecutor``, which also times the physical
preparation rules) reset before the measured run. It prints, per micro-batch, the rules'
total time and the rules that take the most, for both; a query's planning (``queryPlanning``
in its progress reports) and the preparation before its ``foreachBatch`` sink is called are
where these run. The rules of everything else in the session's JVM in that time (the
driver's own Spark calls) count too, in both runs alike.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _latency_floor import floor  # noqa: E402
from _spark_bench import write_results  # noqa: E402
from latency_bench import stages  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "plan_rules.json"


def _rules(text: str) -> dict[str, tuple[float, int]]:
    """``RuleExecutor.dumpTimeSpent()`` as rule -> (total ms, runs)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+)\s+\d+ / (\d+)\s+\d+ / (\d+)", line.strip())
        if m:
            out[m.group(1).split(".")[-1]] = (int(m.group(2)) / 1e6, int(m.group(3)))
    return out


def main(argv: list[str] | None = None) -> int:
    from millwheel.runtime import spark_session

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=2_000, help="records/s")
    p.add_argument("--seconds", type=float, default=20, help="each measured run's input")
    p.add_argument("--top", type=int, default=20, help="rules listed")
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench" / "plan_rules"))
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    spark = spark_session("local[2]")
    rules = spark._jvm.org.apache.spark.sql.catalyst.rules.RuleExecutor
    work = Path(args.work)
    per_batch: dict[str, dict[str, tuple[float, float]]] = {}
    batches: dict[str, int] = {}
    for name in ("floor", "millwheel"):
        for measured in (False, True):
            if measured:
                rules.resetMetrics()
            if name == "floor":
                _, progress, _, _ = floor(
                    spark, work, "python", args.rate, args.seconds if measured else 8
                )
                n = len(progress)
            else:
                run = stages(spark, work, args.rate, args.seconds if measured else 8, 8)
                n = sum(len(p) for p in run["progress"].values())
        got = _rules(rules.dumpTimeSpent())
        batches[name] = n
        per_batch[name] = {k: (ms / n, runs / n) for k, (ms, runs) in got.items()}
    out = {
        "args": vars(args),
        "batches": batches,
        "total_ms_per_batch": {
            k: round(sum(ms for ms, _ in v.values()), 1) for k, v in per_batch.items()
        },
        "rules_ms_per_batch": {
            k: {r: round(ms, 2) for r, (ms, _) in v.items() if ms >= 0.05}
            for k, v in per_batch.items()
        },
    }
    print(
        f"rules per batch: floor {out['total_ms_per_batch']['floor']} ms ({batches['floor']} batches), "
        f"millwheel {out['total_ms_per_batch']['millwheel']} ms ({batches['millwheel']} batches)"
    )
    mw, fl = per_batch["millwheel"], per_batch["floor"]
    print(f"{'rule':56s} {'millwheel ms':>12s} {'runs':>5s} {'floor ms':>9s} {'runs':>5s}")
    for r in sorted(mw, key=lambda r: -mw[r][0])[: args.top]:
        a, b = mw[r], fl.get(r, (0.0, 0.0))
        print(f"{r[:56]:56s} {a[0]:12.2f} {a[1]:5.1f} {b[0]:9.2f} {b[1]:5.1f}")
    write_results(Path(args.out), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
