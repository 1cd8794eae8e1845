"""The Spark plans every scenario runs on: :func:`spark_plans` is the one place they are
named and selected (a plan renamed or added is a change here only)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the Spark runtime is made to run the computation on one of its plans
    (``millwheel.runtime.plans.PlanKind``, value ``seam``): the computation's kind
    (``per-record``, ``columnar``), the ``RuntimeSettings`` fields and the
    ``ComputationOptions.mapping`` that select it."""

    name: str
    kind: str
    seam: str
    settings: tuple[tuple[str, Any], ...] = ()
    mapping: str = "default"

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"

    def runtime_settings(self, **more: Any) -> Any:
        from millwheel.runtime import RuntimeSettings

        return RuntimeSettings(**dict(self.settings), **more)

    @property
    def rescalable(self) -> bool:
        """``millwheel rescale`` moves Spark's state store only: it refuses the Arrow mapping
        (its state is in files of its own, docs/runtime.md)."""
        return self.mapping != "arrow"


def spark_plans() -> list[Plan]:
    """Every plan of the runtime's seam (``millwheel/runtime/plans/``), each with both kinds
    of computation it runs; ``test_harness.py`` checks that these settings choose these plans
    and that no plan of the seam is left out."""
    return [
        Plan("intervals", "per-record", "interval rows", (("state_layout", "intervals"),)),
        Plan("keys", "per-record", "key rows", (("state_layout", "keys"),)),
        Plan("files", "columnar", "columnar"),
        Plan("arrow", "columnar", "arrow", mapping="arrow"),
    ]


def plan_named(name: str) -> Plan:
    for p in spark_plans():
        if f"{p.kind}/{p.name}" == name:
            return p
    msg = (
        f"no Spark plan {name!r} (plans: {', '.join(f'{p.kind}/{p.name}' for p in spark_plans())})"
    )
    raise KeyError(msg)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``plan``: one test per Spark plan (its id ``kind/name``)."""
    if "plan" in metafunc.fixturenames:
        plans = spark_plans()
        metafunc.parametrize("plan", plans, ids=[p.id for p in plans])


SEED_ENV = "MILLWHEEL_CONFORMANCE_SEED"


def draw_seed() -> int:
    """``$MILLWHEEL_CONFORMANCE_SEED``, or a fresh one."""
    import os
    import random

    return int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1, 10**6))


@pytest.fixture
def conformance_seed() -> int:
    """The seed of the random scenarios, printed (``MILLWHEEL_CONFORMANCE_SEED=<seed>`` reruns it)."""
    seed = draw_seed()
    print(f"\nconformance seed: {seed} (rerun with {SEED_ENV}={seed})")
    return seed
