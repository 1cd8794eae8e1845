"""``ColumnarModelCalculator`` (``computations/columnar_model.py``) against the per-record
``ModelCalculator``: the same productions (values, timestamps, ids), models, counters and
dead letters in the harness, over random window streams (a property test: a fresh
hypothesis seed each run, printed with any failure)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from computations.columnar_model import ColumnarModelCalculator
from computations.model import ModelCalculator, expected_count
from millwheel import DEAD_LETTER_STREAM, ComputationOptions, LatePolicy, Record
from millwheel.testing import Harness

W = 1_000
PARAMS = {"day_ms": 12_000, "slot_ms": 2_000, "warmup_windows": 4}


def scenario(seed: int) -> tuple[list[tuple[list[Record], int | None]], str]:
    """Rounds of ``window_counts`` records shaped like the counter's output: per query a
    seasonal count per window with gaps, windows out of order within and across rounds,
    duplicates sent again later, a few malformed (no count, a count that is text)."""
    rng = random.Random(seed)
    recs: list[Record] = []
    for k in [f"q{i}" for i in range(rng.randrange(1, 5))]:
        base = rng.randrange(3, 30)
        for b in range(rng.randrange(5, 60)):
            if rng.random() < 0.1:
                continue  # a gap: the counter emitted nothing for it
            value: dict[str, Any] = {
                "key": k,
                "window_start": b * W,
                "count": int(base * (1.5 if b % 12 < 6 else 0.6)) + rng.randrange(3),
            }
            r = rng.random()
            if r < 0.02:
                del value["count"]
            elif r < 0.03:
                value["count"] = "many"
            # stamped at the window's end, or (a producer of its own) before or after it
            ts = (b + 1) * W + rng.choice((0, 0, -300, 200))
            recs.append(Record(None, value, ts, f"{k}-{b}"))
    recs.sort(key=lambda r: r.timestamp + rng.randrange(-3 * W, 3 * W))
    rounds: list[tuple[list[Record], int | None]] = []
    i, wm, sent = 0, 0, []
    while i < len(recs):
        take = recs[i : i + rng.randrange(1, 40)]
        i += len(take)
        batch = list(take)
        if sent and rng.random() < 0.3:
            batch += rng.sample(sent, min(3, len(sent)))
        sent += take
        rng.shuffle(batch)
        advance = None
        if rng.random() < 0.3:
            wm = max(wm, min(r.timestamp for r in batch) - rng.randrange(0, 4 * W))
            advance = wm
        rounds.append((batch, advance))
    return rounds, rng.choice(("drop", "process"))


def run(cls: type, seed: int) -> Harness:
    rounds, late = scenario(seed)
    h = Harness.for_computation(
        cls,
        name="ModelCalculator",
        inputs={"window_counts": lambda r: r.value["key"]},
        outputs=["window_models"],
        params=PARAMS,
        options=ComputationOptions(
            late=LatePolicy.process() if late == "process" else LatePolicy.drop()
        ),
        raise_errors=False,
    )
    for batch, wm in rounds:
        h.inject("window_counts", batch)
        if wm is not None:
            h.advance_watermark("window_counts", wm)
        h.run()
    return h


@given(st.integers(0, 2**32 - 1))
def test_the_columnar_model_gives_the_per_record_productions_models_and_dead_letters(
    forms_agree, seed
):
    forms_agree(
        run(ModelCalculator, seed),
        run(ColumnarModelCalculator, seed),
        "ModelCalculator",
        "window_models",
        [f"q{i}" for i in range(4)],
        ("records_in", "duplicates", "late", "late_dropped", "productions", "dead_letters"),
    )


def test_the_scenarios_exercise_predictions_and_dead_letters():
    """The property test means something only if its streams warm models up (predictions
    made) and have malformed windows: over a fixed spread of seeds, they do."""
    predicted = dead = 0
    for seed in range(30):
        h = run(ColumnarModelCalculator, seed)
        predicted += sum(v["expected"] is not None for v in h.values("window_models"))
        dead += len(h.output(DEAD_LETTER_STREAM))
    assert predicted > 100 and dead > 0


def test_a_steady_count_is_predicted_by_both_forms():
    """A plain answer: a query with the same count every window is predicted that count once
    the model is warm (a whole day seen), by either form."""
    for cls in (ModelCalculator, ColumnarModelCalculator):
        h = Harness.for_computation(
            cls,
            name="ModelCalculator",
            inputs={"w": lambda r: r.value["key"]},
            outputs=["window_models"],
            params=PARAMS,
        )
        h.inject(
            "w",
            [
                h.record({"key": "a", "window_start": b * W, "count": 20}, (b + 1) * W)
                for b in range(30)
            ],
        )
        h.finish("w")
        out = h.run().values("window_models")
        assert len(out) == 30 and [round(v["expected"], 6) for v in out[-5:]] == [20.0] * 5
        assert expected_count(out[-1]["model"], 31 * W) == 20.0
