"""The reference model: what a scenario's output streams must hold, in plain Python.

Not the harness, not millwheel: a reading of the semantics the computations are written
to (``computations.py``) and the guarantees MillWheel gives them (§4.5, §6.1):

* an event is judged by its id's **first delivery**: later deliveries of the id are
  duplicates and leave no trace (the script only re-sends an id while every backend must
  still hold it — its timestamp, or for a late one the watermark it was late for, within
  ``SLACK_MS`` of the watermark: :func:`expected` refuses a script that does otherwise, as
  its answer would depend on when ids are collected);
* a first delivery whose timestamp is below the injector low watermark it was sent under is
  **late**: it goes, unchanged, to the ``late`` stream (``{"key", "id"}`` at its timestamp);
* every other event counts in its key's window ``[ts // W * W, + W)``; once the watermark
  passes the window's end (at the latest when the input finishes) the window produces one
  ``counts`` record ``{"key", "window", "count"}`` at its end. A window cannot close before
  one of its on-time events arrives (its end would be at or below the watermark that event
  was sent under), so each produces exactly once, with its whole count;
* crashes, restarts and rescales change nothing of the above.

Output is a multiset of ``(stream, timestamp, value)`` (values as sorted JSON): production
ids are each run's own (``millwheel/_identity.py``) and checked unique per run instead.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from millwheel import MIN_TIMESTAMP

from .scenario import SLACK_MS, WINDOW_MS, AdvanceWatermark, Records, Scenario

STREAMS = ("counts", "late")


class AmbiguousScenario(ValueError):
    """The script's answer would depend on a backend's timing (when ids are collected)."""


def item(stream: str, timestamp: int, value: Any) -> tuple[str, int, str]:
    return (stream, timestamp, json.dumps(value, sort_keys=True))


def held_until(ts: int, sent_under: int) -> int:
    """The time a delivered id is kept by: its timestamp, or for a late record the watermark
    it was late for (``_step.py``: a re-delivery is a duplicate, not late again); kept while
    that is at least the low watermark minus ``SLACK_MS``."""
    return max(ts, sent_under)


def expected(scenario: Scenario) -> Counter:
    """The multiset of ``(stream, timestamp, value)`` the scenario must produce."""
    wm = MIN_TIMESTAMP
    first: dict[str, tuple[str, int]] = {}  # id -> (key, ts) of its first delivery
    sent_under: dict[str, int] = {}  # id -> the watermark its first delivery was sent under
    windows: Counter = Counter()
    out: Counter = Counter()
    for i, step in enumerate(scenario.steps):
        if isinstance(step, AdvanceWatermark):
            wm = max(wm, step.t)
        elif isinstance(step, Records):
            for e in step.events:
                if e.id in first:
                    if first[e.id] != (e.key, e.ts):
                        msg = f"step {i}: id {e.id!r} sent again with another key or timestamp"
                        raise AmbiguousScenario(msg)
                    if wm != MIN_TIMESTAMP and held_until(e.ts, sent_under[e.id]) < wm - SLACK_MS:
                        msg = f"step {i}: {e.id!r} re-sent more than SLACK_MS behind the watermark: its id may be collected"
                        raise AmbiguousScenario(msg)
                    continue
                first[e.id] = (e.key, e.ts)
                sent_under[e.id] = wm
                if e.ts < wm:
                    out[item("late", e.ts, {"key": e.key, "id": e.id})] += 1
                else:
                    windows[(e.key, e.ts // WINDOW_MS * WINDOW_MS)] += 1
    for (key, start), n in windows.items():
        out[item("counts", start + WINDOW_MS, {"key": key, "window": start, "count": n})] += 1
    return out


def observed(
    outputs: dict[str, Iterable[Any]], *, resends: bool = False
) -> tuple[Counter, list[str]]:
    """A run's output streams (``{stream: records}``) as the model's multiset, and the problems
    no multiset shows.

    A production id given twice within a stream is a problem, unless ``resends``: then the
    same production sent again (same id, timestamp and value) counts once — MillWheel
    re-sends a strong production after a crash between its delivery and its acknowledgement
    (§6.1.2) and the consumer drops the copy by id; the harness shows such re-sends
    (``Crash.AFTER_DELIVER``), the Spark runtime's stream log must not (a committed batch is
    published once). Another production under an id already given is a problem either way."""
    got: Counter = Counter()
    problems = []
    for stream, records in outputs.items():
        seen: dict[str, tuple[int, str]] = {}
        twice, reused = [], []
        for r in records:
            key = item(stream, r.timestamp, r.value)
            if r.id in seen:
                (reused if seen[r.id] != key[1:] else twice).append(r.id)
                if resends and seen[r.id] == key[1:]:
                    continue
            seen[r.id] = key[1:]
            got[key] += 1
        if twice and not resends:
            problems.append(f"{stream}: production ids given twice: {sorted(twice)[:10]}")
        if reused:
            problems.append(f"{stream}: ids given to different productions: {sorted(reused)[:10]}")
    return got, problems


def compare(want: Counter, got: Counter, problems: list[str] = ()) -> list[str]:
    """Every expected output present exactly once, nothing extra: the differences, in words."""
    out = list(problems)
    missing, extra = want - got, got - want
    for (stream, ts, value), n in sorted(missing.items()):
        out.append(f"missing {n}x {stream} @{ts} {value}")
    for (stream, ts, value), n in sorted(extra.items()):
        kind = "twice" if (stream, ts, value) in want else "unexpected"
        out.append(f"{kind} {n}x {stream} @{ts} {value}")
    return out
