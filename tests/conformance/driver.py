"""A driver process for a scenario's crash segment (``runners.crash_driver``):

    python -m tests.conformance.driver SPEC_JSON

``SPEC_JSON``: ``{"scenario", "plan", "run_dir", "upto", "timeout_s"}``. Runs the plan's
driver on the run directory over the scenario's batches up to ``upto`` (as
``runners.run_segment``); ``MILLWHEEL_CRASH`` in the environment kills it at its point.
Exits 0 if it finished its segment alive.
"""

from __future__ import annotations

import json
import sys

from millwheel.runtime import SparkRuntime, spark_session

from .computations import topology
from .conftest import plan_named
from .runners import run_segment, settings
from .scenario import Scenario


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    scenario = Scenario.from_json(spec["scenario"])
    plan = plan_named(spec["plan"])
    total = len(scenario.steps) - len(scenario.controls()) + 1
    topo = topology(scenario, plan.kind, upto=spec["upto"], mapping=plan.mapping)
    rt = SparkRuntime(
        topo,
        spec["run_dir"],
        settings(plan),
        spark=spark_session("local[2]"),
        log=lambda m: print(m, flush=True),
    )
    run_segment(rt, last=spec["upto"] == total, timeout_s=spec["timeout_s"])
    print("SEGMENT DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
