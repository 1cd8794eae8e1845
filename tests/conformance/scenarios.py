"""Hand-written scenarios, each on keys of its own, each about one rule of the model.

Times are offsets from ``T0`` (``t(ms)``); the window is ``WINDOW_MS`` (1 s). ``WANT`` gives
each scenario's answer as written by hand — ``test_model.py`` checks the model against it,
so the model is not only checked against itself.
"""

from __future__ import annotations

from .scenario import (
    T0,
    AdvanceWatermark,
    Crash,
    Event,
    Records,
    Rescale,
    Restart,
    Scenario,
    Step,
    concat,
    random_scenario,
)


def t(ms: int) -> int:
    return T0 + ms


def recs(*events: tuple[str, str, int]) -> Records:
    return Records(tuple(Event(i, k, t(ms)) for i, k, ms in events))


def wm(ms: int) -> AdvanceWatermark:
    return AdvanceWatermark(t(ms))


def _sc(name: str, *steps: Step) -> Scenario:
    return Scenario(name, tuple(steps))


IN_ORDER = _sc(
    "in-order",
    recs(("a1", "a", 100), ("a2", "a", 200), ("b1", "b", 300)),
    wm(900),
    recs(("a3", "a", 1_100), ("b2", "b", 1_999)),
    wm(1_000),  # exactly the first window's end: it closes
    recs(("a4", "a", 2_500)),
)

OUT_OF_ORDER = _sc(
    "out-of-order",
    recs(("o1", "k", 2_900), ("o2", "k", 150), ("o3", "k", 1_500)),
    recs(("o4", "k", 999), ("o5", "k", 1_000), ("o6", "j", 0)),
    wm(1_000),
    recs(("o7", "k", 1_000)),  # at the watermark exactly: on time
    wm(2_000),
)

DUPLICATES = _sc(
    "duplicates",
    recs(("d1", "d", 100), ("d1", "d", 100), ("d2", "d", 400)),  # a retry in the same batch
    recs(("d2", "d", 400), ("d3", "e", 1_200)),  # and in the next
    wm(1_500),
    recs(("d3", "e", 1_200), ("d1", "d", 100)),  # after its window closed, within the slack
    wm(2_500),
    recs(("d4", "e", 2_600), ("d4", "e", 2_600)),
)

LATE = _sc(
    "late",
    recs(("l1", "x", 500), ("l2", "x", 1_700)),
    wm(1_500),
    recs(
        ("l3", "x", 900),  # its window fired already: late
        ("l4", "x", 1_200),  # its window is still open, but it is behind the watermark: late
        ("l5", "x", 1_500),  # at the watermark: on time
        ("l6", "y", 200),  # a key that never had an on-time record
    ),
    recs(("l4", "x", 1_200)),  # a late record re-sent: nothing more
    wm(4_000),
)

CONTROLS = _sc(
    "controls",
    recs(("c1", "c", 100), ("c2", "c", 600), ("c3", "d", 700)),
    Restart(),
    recs(("c4", "c", 1_100), ("c1", "c", 100)),
    wm(1_200),
    Crash("after_output"),
    recs(("c5", "d", 1_300), ("c6", "c", 2_100)),
    wm(2_200),
    Rescale(2),
    recs(("c7", "d", 2_300), ("c6", "c", 2_100)),
    wm(3_000),
    Restart(),
    recs(("c8", "c", 3_100)),
)

HAND_WRITTEN = (IN_ORDER, OUT_OF_ORDER, DUPLICATES, LATE, CONTROLS)


def combined(seed: int, crash: str, name: str = "combined") -> Scenario:
    """What one CI run replays: the hand-written data scenarios, then a random one from
    ``seed`` with a clean restart, a crash at ``crash`` and a rescale to 2 intervals."""
    controls = [Restart(), Crash(crash), Rescale(2)]
    drawn = random_scenario(seed, keys=10, batches=10, per_batch=20, controls=controls)
    return concat([*HAND_WRITTEN[:-1], drawn], name=name)


def _counts(*rows: tuple[str, int, int]) -> list[tuple[str, int, dict]]:
    return [("counts", t(w + 1_000), {"key": k, "window": t(w), "count": n}) for k, w, n in rows]


def _late(*rows: tuple[str, str, int]) -> list[tuple[str, int, dict]]:
    return [("late", t(ms), {"key": k, "id": i}) for i, k, ms in rows]


#: each scenario's output, by hand: ``(stream, timestamp, value)``
WANT = {
    "in-order": _counts(
        ("a", 0, 2), ("b", 0, 1), ("a", 1_000, 1), ("b", 1_000, 1), ("a", 2_000, 1)
    ),
    "out-of-order": _counts(("k", 0, 2), ("k", 1_000, 3), ("k", 2_000, 1), ("j", 0, 1)),
    "duplicates": _counts(("d", 0, 2), ("e", 1_000, 1), ("e", 2_000, 1)),
    "late": _counts(("x", 0, 1), ("x", 1_000, 2))
    + _late(("l3", "x", 900), ("l4", "x", 1_200), ("l6", "y", 200)),
    "controls": _counts(
        ("c", 0, 2),
        ("d", 0, 1),
        ("c", 1_000, 1),
        ("d", 1_000, 1),
        ("c", 2_000, 1),
        ("d", 2_000, 1),
        ("c", 3_000, 1),
    ),
}
