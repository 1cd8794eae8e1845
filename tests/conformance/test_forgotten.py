"""A key that keeps nothing but record ids is forgotten on every Spark plan, both kinds of
computation (``DedupOptions``; ``docs/concepts.md``, "Dedup garbage collection"; §6.1.1).

A key is stepped only for its records or its timers, so a key seen once, keyed by its
record id, was never stepped again and kept its ids and its envelope for ever. It is now
woken once the low watermark passes its oldest ids by ``slack_ms + gc_interval_ms``, and is
forgotten if it kept nothing else. ``tests/test_dedup.py`` proves the invariant over random
rounds in the harness; this runs the production plans on a live input whose watermark moves
while the run goes on, and checks that the drained run keeps no key: the wake-ups its final
watermark (+inf) made due are ticked before it stops (``ComputationQuery.drained``), and the
keys of the last records, which arrive with it, are forgotten in the batch that brings them
(``_contract.dedup_horizon``).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable

import pytest

from millwheel import (
    MAX_TIMESTAMP,
    ComputationOptions,
    DedupOptions,
    Record,
    Source,
    SourceBatch,
    Topology,
)

pytestmark = pytest.mark.spark

SLACK_MS, GC_MS = 2_000, 1_000


class Trickle(Source):
    """``n`` batches of ``per_batch`` records, one every ``every_s`` of wall time once
    ``ready()`` (the consumer is running: its first batch may take seconds to start); batch
    ``b`` holds event times ``b`` s to ``b`` s + ``per_batch`` ms, and its watermark is ``b`` s,
    but for the last, which comes with the final watermark (+inf): its records arrive with
    it. The driver's loop pulls the batches: while one is not due, an empty one (no sleep)."""

    def __init__(
        self, n: int, per_batch: int, every_s: float, seed: int, ready: Callable[[], bool]
    ) -> None:
        self.n, self.per_batch, self.every_s, self.seed = n, per_batch, every_s, seed
        self.ready = ready

    def batches(self, injector: str = "injector", stream: str = "records"):
        rng = random.Random(self.seed)
        due = 0.0
        for b in range(self.n):
            while b and (not self.ready() or time.monotonic() < due):
                yield SourceBatch([], (b - 1) * 1_000)
            due = time.monotonic() + self.every_s
            recs = [
                Record(None, {"id": f"r{b}-{i}"}, b * 1_000 + i, f"r{b}-{i}")
                for i in range(self.per_batch)
            ]
            rng.shuffle(recs)
            yield SourceBatch(recs, b * 1_000 if b < self.n - 1 else MAX_TIMESTAMP)


@pytest.mark.parametrize("timers", [False, True], ids=["no-timers", "timers"])
def test_keys_seen_once_are_forgotten_while_the_run_goes_on(
    plan, spark, tmp_path, id_relays, timed_id_relays, timers
):
    # with timers, the interval plans address heartbeats to the key intervals (a tick is not
    # held back for a row a batch already read: ``_wire.due_ticks``), and the Arrow mapping,
    # which has no no-data batches, ticks its wake-ups (``Plan.timers_in_no_data_batches``)
    from millwheel.runtime import SparkRuntime
    from millwheel.runtime._state_reader import read_state

    seed = random.SystemRandom().randrange(1, 10**6)
    print(f"\nseed {seed}")
    n, per_batch = 24, 20
    t = Topology("forgotten")
    runtime: list[SparkRuntime] = []
    t.injector(
        "feed",
        Trickle(
            n,
            per_batch,
            0.3,
            seed,
            lambda: bool(runtime) and runtime[0].computations["Relay"].batches > 0,
        ),
        stream="events",
    )
    t.computation(
        (timed_id_relays if timers else id_relays)[plan.kind == "columnar"],
        name="Relay",
        inputs={"events": lambda r: r.id},  # a key per record
        outputs=["out"],
        options=ComputationOptions(
            dedup=DedupOptions(slack_ms=SLACK_MS, gc_interval_ms=GC_MS), mapping=plan.mapping
        ),
    )
    run = str(tmp_path / "run")
    rt = SparkRuntime(
        t,
        run,
        plan.runtime_settings(drain=True, intervals=2, poll_ms=20, heartbeat_ms=50),
        spark=spark,
    )
    runtime.append(rt)
    rt.run(timeout_s=300)
    sent = {f"r{b}-{i}": b for b in range(n) for i in range(per_batch)}
    out = Counter(r.value["id"] for r in rt.output("out"))
    assert out == Counter(sent.keys()), f"seed {seed}: lost or duplicated records"
    held = {k.key for k in read_state(spark, run, "Relay").keys}
    print(f"{plan.id}, timers {timers}: {len(held)} of {len(sent)} keys held after the drain")
    # a key of batch b can go once the watermark passes b s + SLACK_MS + GC_MS: after the
    # injector's batch b + 4, while the run goes on; the rest with the ticks of the final
    # watermark (+inf) before the run stops; those whose records arrived with it in that
    # batch (at +inf every id goes: ``_contract.dedup_horizon``)
    assert not held, (
        f"seed {seed}: {len(held)} keys held after the drain, of injector batches "
        f"{sorted(Counter(sent[k] for k in held).items())}, e.g. {sorted(held)[:5]}"
    )
