"""The model against the hand-written answers, and the harness against the model: the
hand-written scenarios and random ones (a fresh seed, printed) for both kinds of computation."""

from __future__ import annotations

from collections import Counter

import pytest

from .computations import KINDS
from .model import AmbiguousScenario, compare, expected, item, observed
from .runners import run_harness
from .scenario import CRASH_POINTS, Crash, Rescale, Restart, Scenario, concat, random_scenario
from .scenarios import HAND_WRITTEN, WANT, recs, wm


@pytest.mark.parametrize("scenario", HAND_WRITTEN, ids=lambda s: s.name)
def test_model_gives_the_hand_written_answer(scenario):
    want = Counter(item(*row) for row in WANT[scenario.name])
    assert sum(want.values()) == len(WANT[scenario.name])  # no row written twice
    assert expected(scenario) == want


def test_model_refuses_a_resend_its_answer_would_depend_on():
    # re-sent 2.5 s behind the watermark: held or collected, depending on when the id was collected
    sc = Scenario("ambiguous", (recs(("z1", "z", 100)), wm(2_700), recs(("z1", "z", 100))))
    with pytest.raises(AmbiguousScenario, match="SLACK_MS"):
        expected(sc)
    with pytest.raises(AmbiguousScenario, match="another key"):
        expected(Scenario("reused", (recs(("z1", "z", 100)), recs(("z1", "w", 100)))))


def check(scenario: Scenario, outputs: dict, where: str) -> None:
    got, problems = observed(outputs)
    want = expected(scenario)
    diff = compare(want, got, problems)
    assert not diff, f"{where} disagrees with the model on\n{scenario.describe()}\n" + "\n".join(
        diff[:40]
    )


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scenario", HAND_WRITTEN, ids=lambda s: s.name)
def test_harness_hand_written(scenario, kind):
    check(scenario, run_harness(scenario, kind), f"the harness ({kind})")


@pytest.mark.parametrize("kind", list(KINDS))
def test_harness_random(conformance_seed, kind):
    controls = [Restart(), Rescale(2), *(Crash(p) for p in CRASH_POINTS)]
    for i in range(8):
        seed = conformance_seed + i
        sc = random_scenario(seed, controls=controls[i % 3 : i % 3 + 3])
        check(sc, run_harness(sc, kind), f"the harness ({kind})")


def test_concat_keeps_each_scenarios_answer():
    """Run one after the other, each on keys and times of its own, the scenarios' answers add up."""
    both = concat(HAND_WRITTEN)
    assert sum(expected(both).values()) == sum(len(w) for w in WANT.values())
    late = {v for (s, _t, v) in expected(both) if s == "late"}
    assert len(late) == 3 and all('"s3/' in v for v in late)
