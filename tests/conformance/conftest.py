"""The Spark plans every scenario runs on: :func:`spark_plans` is the one place they are
named (a plan renamed or a seam introduced is a change here only)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the Spark runtime runs the computation: its kind (``per-record``, ``columnar``),
    the ``RuntimeSettings`` fields and the ``ComputationOptions.mapping`` it takes."""

    name: str
    kind: str
    settings: tuple[tuple[str, Any], ...] = ()
    mapping: str = "default"

    def runtime_settings(self, **more: Any) -> Any:
        from millwheel.runtime import RuntimeSettings

        return RuntimeSettings(**dict(self.settings), **more)

    @property
    def rescalable(self) -> bool:
        """``millwheel rescale`` moves Spark's state store only: it refuses the Arrow mapping
        (its state is in files of its own, docs/runtime.md)."""
        return self.mapping != "arrow"


def spark_plans() -> list[Plan]:
    """Every plan of today's runtime, for both kinds of computation. ``columnar_input="rows"``
    only while ``RuntimeSettings`` still has it."""
    from millwheel.runtime import RuntimeSettings

    plans = [
        Plan("intervals", "per-record", (("state_layout", "intervals"),)),
        Plan("keys", "per-record", (("state_layout", "keys"),)),
        Plan("files", "columnar"),
    ]
    if "columnar_input" in {f.name for f in dataclasses.fields(RuntimeSettings)}:
        plans.append(Plan("rows", "columnar", (("columnar_input", "rows"),)))
    plans.append(Plan("arrow", "columnar", mapping="arrow"))
    return plans


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
        metafunc.parametrize("plan", plans, ids=[f"{p.kind}/{p.name}" for p in plans])


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
