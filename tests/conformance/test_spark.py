"""Every Spark plan, both kinds of computation, against the model: one local-Spark run per
plan replays the hand-written scenarios and a random one (a fresh seed, printed), one after
the other on keys of their own, through a clean restart, a crash at a named point in a
driver of its own, and a rescale (docs/conformance.md)."""

from __future__ import annotations

import pytest

from .model import compare, expected, observed
from .runners import run_harness, run_spark
from .scenarios import combined

pytestmark = pytest.mark.spark

#: where each plan's driver is killed in CI: a different point each, the Arrow mapping at its own
CI_CRASH = {
    "per-record/intervals": "after_output",
    "per-record/keys": "before_commit",
    "columnar/files": "mid_publish",
    "columnar/arrow": "after_manifest",
}


def test_plan_conforms(plan, spark, tmp_path, conformance_seed):
    plan_id = plan.id
    scenario = combined(conformance_seed, CI_CRASH[plan_id], name=f"ci-{plan_id}")
    want = expected(scenario)
    # the harness first: a disagreement there is not the plan's
    got, problems = observed(run_harness(scenario, plan.kind), resends=True)
    on_harness = compare(want, got, problems)
    assert not on_harness, f"the harness disagrees on\n{scenario.describe()}\n" + "\n".join(
        on_harness[:60]
    )
    run = run_spark(scenario, plan, tmp_path, spark)
    print(
        f"{plan_id}: {run.seconds:.0f}s, {run.drivers} drivers, crashes {run.crashes}, "
        f"missed {run.missed}, refused {len(run.refused)}"
    )
    got, problems = observed(run.outputs)
    diff = compare(want, got, problems)
    assert not diff, (
        f"{plan_id} disagrees with the model ({sum(want.values())} outputs expected) on\n"
        + scenario.describe()
        + "\n"
        + "\n".join(diff[:60])
    )
    assert run.crashes and not run.missed, "the crash did not land"
    assert bool(run.refused) != plan.rescalable
