"""The scenario language of the conformance suite: a script of steps replayed on every backend.

A scenario is a list of steps, TestStream-style (Beam's ``TestStream``):

* :class:`Records` — one injector batch: events ``(id, key, ts)``, in the order sent; an id
  sent again is a duplicate (a client's retry: same key and timestamp), an event whose
  timestamp is below the injector low watermark when it is sent is late;
* :class:`AdvanceWatermark` — the injector low watermark moves to ``t`` (never back);
* :class:`Crash` — the process running the computation dies at a named point of the next
  round (harness) or micro-batch (Spark) that has data, and a new one recovers;
* :class:`Restart` — the driver stops cleanly and a new one resumes;
* :class:`Rescale` — the driver stops, the computation moves to ``n`` key intervals
  (``millwheel.runtime.rescale``), a new driver resumes.

The end of the script finishes the injector (its low watermark becomes +inf): every window
closes. :func:`source_batches` turns the data steps into a :class:`~millwheel.Source`'s
batches, :func:`segments` cuts the script at its control steps, :func:`random_scenario`
draws one from a seed and :func:`concat` runs several one after the other, on disjoint keys
and times, so that one Spark run covers them all.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from millwheel import MAX_TIMESTAMP, MIN_TIMESTAMP, Record, Source, SourceBatch

#: event times start here (2023-11-14T22:13:20Z): far from 0, as real ones are
T0 = 1_700_000_000_000
#: the computations' window (event-time buckets of this many ms)
WINDOW_MS = 1_000
#: how far behind the low watermark a record id is still held for deduplication
#: (``DedupOptions.slack_ms``): a duplicate within it is dropped whatever the backend's timing
SLACK_MS = 2_000
#: where a computation may die (``millwheel/runtime/_outbox.py``'s ``CRASH_POINTS``, and the
#: Arrow mapping's ``after_manifest``), and the harness's crash each corresponds to: before the
#: checkpoint nothing is acknowledged; after it, strong productions are not yet sent (or sent
#: and not yet acknowledged)
CRASH_POINTS = {
    "before_output": "before_commit",
    "after_output": "before_commit",
    "before_commit": "before_commit",
    "before_publish": "after_commit",
    "mid_publish": "after_deliver",
}
#: the Arrow mapping's own point: its manifest written, the batch not committed
ARROW_CRASH_POINTS = {"after_manifest": "before_commit"}


@dataclass(frozen=True)
class Event:
    id: str
    key: str
    ts: int

    def record(self) -> Record:
        return Record(None, {"key": self.key, "id": self.id}, self.ts, self.id)


@dataclass(frozen=True)
class Records:
    events: tuple[Event, ...]


@dataclass(frozen=True)
class AdvanceWatermark:
    t: int


@dataclass(frozen=True)
class Crash:
    point: str

    def __post_init__(self) -> None:
        if self.point not in CRASH_POINTS and self.point not in ARROW_CRASH_POINTS:
            msg = f"Crash: unknown point {self.point!r}"
            raise ValueError(msg)


@dataclass(frozen=True)
class Restart:
    pass


@dataclass(frozen=True)
class Rescale:
    n: int


Step = Records | AdvanceWatermark | Crash | Restart | Rescale
CONTROL = (Crash, Restart, Rescale)


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: tuple[Step, ...]
    #: the seed it was drawn from (``None``: written by hand)
    seed: int | None = None
    notes: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        """The script, one step a line: what a failure prints to replay it."""
        head = f"scenario {self.name!r}" + (f" (seed {self.seed})" if self.seed is not None else "")
        return "\n".join([head, *(f"  {i:3d} {_show(s)}" for i, s in enumerate(self.steps))])

    def to_json(self) -> str:
        return json.dumps(
            {"name": self.name, "seed": self.seed, "steps": [_step_json(s) for s in self.steps]}
        )

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        d = json.loads(text)
        return cls(d["name"], tuple(_step_of(s) for s in d["steps"]), d["seed"])

    def controls(self) -> list[Step]:
        return [s for s in self.steps if isinstance(s, CONTROL)]


def _show(step: Step) -> str:
    if isinstance(step, Records):
        return "Records([" + ", ".join(f"{e.id}:{e.key}@{e.ts - T0}" for e in step.events) + "])"
    if isinstance(step, AdvanceWatermark):
        return f"AdvanceWatermark(T0+{step.t - T0})"
    return repr(step)


def _step_json(step: Step) -> dict:
    if isinstance(step, Records):
        return {"records": [[e.id, e.key, e.ts] for e in step.events]}
    if isinstance(step, AdvanceWatermark):
        return {"watermark": step.t}
    if isinstance(step, Crash):
        return {"crash": step.point}
    if isinstance(step, Rescale):
        return {"rescale": step.n}
    return {"restart": True}


def _step_of(d: dict) -> Step:
    if "records" in d:
        return Records(tuple(Event(i, k, t) for i, k, t in d["records"]))
    if "watermark" in d:
        return AdvanceWatermark(d["watermark"])
    if "crash" in d:
        return Crash(d["crash"])
    if "rescale" in d:
        return Rescale(d["rescale"])
    return Restart()


# ---- the script as source batches and segments --------------------------------------------
def source_batches(steps: Sequence[Step]) -> list[SourceBatch]:
    """One batch per data step, the last finishing the injector: a :class:`Records` step is its
    records under the watermark so far (what they are late against), an
    :class:`AdvanceWatermark` an empty batch that moves it."""
    out, wm = [], MIN_TIMESTAMP
    for step in steps:
        if isinstance(step, Records):
            out.append(SourceBatch([e.record() for e in step.events], wm))
        elif isinstance(step, AdvanceWatermark):
            if step.t < wm:
                msg = f"AdvanceWatermark({step.t}): the watermark cannot go back from {wm}"
                raise ValueError(msg)
            wm = step.t
            out.append(SourceBatch([], wm))
    out.append(SourceBatch([], MAX_TIMESTAMP))
    return out


def segments(steps: Sequence[Step]) -> list[tuple[Step | None, int]]:
    """The script cut at its control steps: ``(control step before it, data batches up to its
    end)`` per segment; the first has no control step, the last ends with every batch."""
    cuts: list[tuple[Step | None, int]] = []
    before: Step | None = None
    n = 0
    for step in steps:
        if isinstance(step, CONTROL):
            cuts.append((before, n))
            before = step
        else:
            n += 1
    cuts.append((before, n + 1))  # + the batch that finishes the injector
    return cuts


class ScriptSource(Source):
    """The scenario's batches up to ``upto`` (all by default); the Spark driver resumes a
    source by skipping the batches it published, so each segment's driver gets one with a
    larger ``upto``."""

    def __init__(self, scenario: Scenario, upto: int | None = None) -> None:
        self.all = source_batches(scenario.steps)
        self.upto = len(self.all) if upto is None else upto

    def batches(self, injector: str = "injector", stream: str = "records") -> Iterator[SourceBatch]:
        yield from self.all[: self.upto]


# ---- building scenarios ---------------------------------------------------------------------
def concat(scenarios: Sequence[Scenario], name: str = "concat") -> Scenario:
    """The scenarios one after the other, each on keys and ids of its own (``s<i>/...``) and
    shifted in time past everything before it (its events and watermarks), so that what one
    expects does not depend on the others (control steps stay where they are)."""
    steps: list[Step] = []
    base = 0  # the shift of the next one
    for i, sc in enumerate(scenarios):
        lo = min(_times(sc.steps), default=T0)
        shift = max(0, -(-(base - lo) // WINDOW_MS) * WINDOW_MS)  # whole windows: the same buckets
        for step in sc.steps:
            if isinstance(step, Records):
                evs = tuple(
                    Event(f"s{i}/{e.id}", f"s{i}/{e.key}", e.ts + shift) for e in step.events
                )
                steps.append(Records(evs))
            elif isinstance(step, AdvanceWatermark):
                steps.append(AdvanceWatermark(step.t + shift))
            else:
                steps.append(step)
        top = max((t + shift for t in _times(sc.steps)), default=T0)
        base = (top // WINDOW_MS + 2) * WINDOW_MS + SLACK_MS
    seeds = [s.seed for s in scenarios if s.seed is not None]
    return Scenario(name, tuple(steps), seeds[0] if len(seeds) == 1 else None)


def _times(steps: Sequence[Step]) -> Iterator[int]:
    for step in steps:
        if isinstance(step, Records):
            yield from (e.ts for e in step.events)
        elif isinstance(step, AdvanceWatermark):
            yield step.t


def random_scenario(
    seed: int,
    *,
    keys: int = 12,
    batches: int = 12,
    per_batch: int = 25,
    disorder_ms: int = 1_500,
    controls: Sequence[Step] = (),
    late_fraction: float = 0.06,
    duplicate_fraction: float = 0.1,
) -> Scenario:
    """A scenario drawn from ``seed``: ``batches`` injector batches of about ``per_batch``
    events over ``keys`` keys, each up to ``disorder_ms`` behind the newest time, about
    ``late_fraction`` of them deliberately behind the watermark, ``duplicate_fraction``
    re-sends of earlier events (only within ``SLACK_MS`` of the watermark, where every
    backend must still hold their ids), watermark moves between batches, and the
    ``controls`` steps at random places (each followed by data that closes windows, so a
    crash lands in a round that produces)."""
    rng = random.Random(seed)
    steps: list[Step] = []
    sent: list[Event] = []
    newest, wm, n = T0, MIN_TIMESTAMP, 0
    under: dict[str, int] = {}  # id -> the watermark it was first sent under

    def held(e: Event) -> bool:
        """Every backend still holds ``e``'s id (``model.held_until``)."""
        return wm == MIN_TIMESTAMP or max(e.ts, under[e.id]) >= wm - SLACK_MS

    where = sorted(rng.sample(range(1, batches), min(len(controls), batches - 1)))
    pending = dict(zip(where, controls, strict=False))
    for b in range(batches):
        if b in pending:
            steps.append(pending[b])
        evs: list[Event] = []
        for _ in range(rng.randint(per_batch // 2, per_batch * 3 // 2)):
            r = rng.random()
            if r < duplicate_fraction and sent:
                old = rng.choice(sent[-60:])
                if held(old):
                    evs.append(old)
                continue
            key = f"k{rng.randrange(keys)}"
            newest += rng.randint(0, 120)
            if r < duplicate_fraction + late_fraction and wm > T0:
                ts = wm - rng.randint(1, 3 * WINDOW_MS)  # late: behind the watermark
            else:
                ts = newest - rng.randint(0, disorder_ms)
                if wm != MIN_TIMESTAMP:
                    ts = max(ts, wm)
            ev = Event(f"e{n}", key, ts)
            n += 1
            evs.append(ev)
            sent.append(ev)
            under[ev.id] = wm
        if rng.random() < 0.2 and len(evs) > 1:  # a retry inside the same batch
            again = rng.choice(evs)
            if held(again):
                evs.insert(evs.index(again) + 1 + rng.randrange(len(evs) - evs.index(again)), again)
        steps.append(Records(tuple(evs)))
        if rng.random() < 0.75 or b in pending:
            target = newest - rng.randint(0, disorder_ms)
            if b in pending:
                # past the end of the window of this batch's earliest record at or above
                # the watermark: that window is open (its end is above the record) and
                # closes here, so the round after a control produces (a crash armed for
                # the first batch with output lands in it)
                fresh = [e.ts for e in evs if e.ts >= wm]
                close = (min(fresh) // WINDOW_MS + 1) * WINDOW_MS if fresh else newest
                target = max(target, close, wm + 1)
            if target > wm:
                wm = target
                steps.append(AdvanceWatermark(wm))
    return Scenario(f"random-{seed}", tuple(steps), seed)
