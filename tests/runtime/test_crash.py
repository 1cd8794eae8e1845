"""Crash test: a two-stage topology over >= 100k records survives kill -9 of the driver and of
Python workers at chosen points; the final output equals the answer computed in pandas,
with no duplicate and no loss (``docs/architecture.md``, "Where each guarantee is enforced").

Kill points are chosen by progress — input files a query's committed batches consumed,
read from its checkpoint (``faults.inject.consumed_inputs``) — not by seconds, so the test
means the same on a fast and a slow machine. Committed batches alone would not do: a
driver that starts commits a heartbeat or tick batch or two per computation even when the
run has nothing left to read, and a kill there is a kill of a finished run.

JSON-lines logs -> ``WindowCounter`` (per query, 1 s buckets, low-watermark timers) ->
``Tally`` (per bucket) -> ``tallies``: one record per (bucket, query) with its count.
The short version runs in CI; ``pytest -m slow`` runs >= 5 driver kills and >= 5 worker kills,
each of which must land while input is left to read.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from faults.inject import consumed_inputs
from millwheel.runtime._fs import Location
from millwheel.runtime._streams import FileStreamLog

from ._procs import (
    expected_tallies,
    kill_a_worker,
    kill_group,
    start,
    wait_for_progress,
    write_logs,
)

pytestmark = pytest.mark.spark

N = 100_000
#: small injector batches and two stream files per computation batch, so kills land between
#: output writes, commits and publications
PACING = ("--max-bytes", "600000", "--per-trigger", "2")
#: the short form's: one log file (one-second bucket) per injector batch, one stream file
#: per computation batch: ~20 batches with input per query, so its kills land with input
#: left (with ``PACING`` the injected crash's driver had consumed 6 to 10 of 10 files)
SHORT_PACING = ("--max-bytes", "300000", "--per-trigger", "1")
#: the long form's run: 60 one-second buckets (``Tally`` reads a file per batch of
#: ``WindowCounter`` that closed one), ~100 KB injector batches and one stream file per
#: computation batch: ~60 batches with input per query, for 12 kills spread over them
LONG_FILES = 60
LONG_PACING = ("--max-bytes", "100000", "--per-trigger", "1")
QUERIES = ("injector.queries", "WindowCounter", "Tally")
#: what the driver logs when it restarts a failed query (``RestartPolicy.failed``)
RESTARTED = "; restarting from its checkpoint"


def _progress(root) -> str:
    return ", ".join(f"{q} {consumed_inputs(root, q)}" for q in QUERIES)


def _kill_workers_until_a_query_fails(
    proc, root, log, settle_s: float = 5.0, timeout: float = 300, keep_busy=lambda: None
) -> str | None:
    """kill -9 the Spark Python workers running a task (``kill_a_worker``), again until a
    query failed of it: the driver logs that it restarts the query. A task may end between
    seeing its worker busy and the kill, so a kill counts only once the restart is logged;
    ``settle_s``: how long that may take before the next kill; ``keep_busy`` is called
    between kills (:meth:`_Feed.top_up`: the run has work for a worker to be busy with).
    Returns where the kill that landed was (the progress, and how many kills it took), or
    ``None`` if the driver ended first."""
    attempts, give_up = 0, time.monotonic() + timeout
    while proc.poll() is None:
        keep_busy()
        if time.monotonic() > give_up:
            msg = f"no query failed of {attempts} kills of busy Python workers within {timeout}s (see the driver's log: {log})"
            raise TimeoutError(msg)
        mark = log.stat().st_size
        if not kill_a_worker(proc):  # none busy within 50 ms
            continue
        attempts += 1
        at = _progress(root)
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            with open(log, "rb") as f:
                f.seek(mark)
                if RESTARTED.encode() in f.read():
                    return f"{at} (kill {attempts} of busy workers)"
            if proc.poll() is not None:
                return None
            time.sleep(0.05)
    return None


class _Feed:
    """A crash loop's input, written while the run goes on (as ``faults/campaign.py`` does):
    ``files`` log files at first and no ``_DONE``; one more file whenever a planned kill
    waits and the run has read every file (or made no progress for ``STALL_S``); ``_DONE``
    once the plan is through. A planned kill then never misses because the run drained
    first, on a fast machine or a loaded one (CI once drained the short run while its worker
    kill still looked for a busy worker)."""

    #: no progress for this long: the run has read what there is
    STALL_S = 20.0

    def __init__(self, data, root, records: int, files: int, keys: int) -> None:
        self.data, self.root, self.keys, self.files = data, root, keys, files
        self.per = records // files
        self.records = write_logs(data, records, files=files, keys=keys, done=False)
        self.appended = 0
        self._seen, self._moved = -1, time.monotonic()

    def top_up(self, measure: int | None = None) -> None:
        """Append a file if the injector published one per file written (it read them all)
        or ``measure`` (the progress a kill waits for) stood still for ``STALL_S``."""
        now = time.monotonic()
        if measure is not None and measure != self._seen:
            self._seen, self._moved = measure, now
        read_all = consumed_inputs(self.root, "injector.queries") >= self.files
        if read_all or now - self._moved > self.STALL_S:
            self.records += write_logs(
                self.data, self.per, 1, self.keys, seed=3 + self.files, first=self.files, done=False
            )
            self.files += 1
            self.appended += 1
            self._moved = now

    def wait_for(self, proc, query: str, more: int) -> bool:
        """Until ``query`` consumed ``more`` more input files (topping the input up); ``False``
        if the driver ended first."""
        return wait_for_progress(
            proc, self.root, query, more, 600, measure=consumed_inputs, meanwhile=self.top_up
        )

    def close(self) -> None:
        (self.data / "_DONE").write_text("")


def _crash_loop(
    tmp_path,
    plan,
    seed,
    layout="intervals",
    extra=(),
    records=N,
    files=20,
    pacing=PACING,
    strict=False,
):
    """``plan``: ("driver" | "worker", (query, input files)) kills, or ("inject:<crash spec>", None).

    Injected crashes come first, each in a driver of its own started with ``MILLWHEEL_CRASH``.
    A kill waits until ``query`` consumed that many more input files (plus a random 0-2,
    from ``seed``; an injector: published), then kills. ``driver``: kill -9 of the driver's
    process tree, and the next step starts a new driver. ``worker``: kill -9 of Python
    workers until a query fails (:func:`_kill_workers_until_a_query_fails`); the same driver
    restarts the query, goes on with the next step and, after the last one, must drain.
    The input stays open until the plan is through (:class:`_Feed`: the driver follows the
    log directory, files are appended while a kill waits for work), so a planned kill lands
    however fast the run reads; a driver that ended on its own before its kill must have
    drained, and the kill is counted missed (``kills["missed"]``; with ``strict`` an
    ``AssertionError`` that names it).

    ``layout``: the state layout of every driver of the run (``RuntimeSettings.state_layout``);
    ``extra``: more driver arguments (``--columnar``); ``records``, ``files``: the log
    records and files (one-second buckets) written first; ``pacing``: injector and trigger sizes.
    """
    rng = random.Random(seed)
    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    feed = _Feed(data, root, records, files, keys=300)
    env = {"MILLWHEEL_STATE_LAYOUT": layout}
    kills, landed, missed = Counter(), [], []

    def new_driver(crash=None):
        return start(
            root,
            data,
            "twostage",
            "--follow",
            *pacing,
            *extra,
            env={**env, **(crash or {})},
            log=log,
        )

    def ended(proc):
        """``proc`` ended on its own: it must have drained (exit 0)."""
        assert proc.returncode == 0, (
            f"the driver exited {proc.returncode}:\n{log.read_text()[-4000:]}"
        )

    proc = None
    try:
        for i, (what, at) in enumerate(plan):
            if what.startswith("inject:"):
                if proc is not None:
                    msg = f"step {i} ({what}): a plan's injected crashes come first (each needs a driver of its own)"
                    raise ValueError(msg)
                crashing = new_driver({"MILLWHEEL_CRASH": what.split(":", 1)[1]})
                try:
                    crashing.wait(timeout=300)
                finally:
                    kill_group(crashing)
                kills["injected"] += crashing.returncode == -9
                continue
            if proc is not None and proc.poll() is not None:
                ended(proc)
                proc = None
            proc = proc or new_driver()
            query, more = at
            more += rng.randint(0, 2)
            point = f"step {i}: {what} kill after {more} more input files of {query}"
            if feed.wait_for(proc, query, more):
                if what == "driver":
                    kill_group(proc)
                    proc = None
                    kills["driver"] += 1
                    landed.append(f"{point}, at {_progress(root)}")
                    continue
                at_kill = _kill_workers_until_a_query_fails(proc, root, log, keep_busy=feed.top_up)
                if at_kill is not None:
                    kills["worker"] += 1
                    landed.append(f"{point}, at {at_kill}")
                    continue
            proc.wait(timeout=60)
            ended(proc)
            missed.append(f"{point}: the run drained first, at {_progress(root)}")
            kills["missed"] += 1
            assert not strict, f"a planned kill did not land: {missed[-1]}\nlanded:\n" + "\n".join(
                landed
            )
        # the plan is through: the input is complete; the last driver (a worker kill's)
        # finishes the run, or a new one
        feed.close()
        final = proc if proc is not None else new_driver()
        proc = final
        rc = final.wait(timeout=900)
    finally:
        if proc is not None:
            kill_group(proc)
    assert rc == 0, log.read_text()[-4000:]
    out = FileStreamLog(Location.of(str(root))).read("tallies")
    got = Counter((r.value["window_start"], r.value["key"], r.value["count"]) for r in out)
    expected = expected_tallies(feed.records)
    ids = Counter(r.id for r in out)
    duplicates = sum(n - 1 for n in ids.values()) + sum(n - 1 for n in got.values())
    losses = sum((expected - got).values())
    print("\n".join(["kills landed:", *landed, *(["missed:", *missed] if missed else [])]))
    print(
        f"kills: {dict(kills)}; {feed.appended} files appended; tallies: {len(out)}, expected {sum(expected.values())}; duplicates {duplicates}; losses {losses}"
    )
    assert duplicates == 0
    assert losses == 0
    assert got == expected
    return kills


# slow (-m slow) on both layouts: in CI the fault campaign (tests/faults/test_campaign.py)
# kills drivers and busy workers at fresh-seeded progress points on interval rows, and on
# per-key rows after its relayout; crash points inside a batch are the kill tests' of
# test_strong_productions.py, test_state_load.py, test_spark_sink.py and Photon's
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["intervals", "keys"])
def test_crash_short(tmp_path, layout):
    # the worker kill's driver goes on to drain the run: no driver of its own at the end
    # the worker kill waits for 0-2 more of Tally's files (seed 1: 2): with one input file a batch,
    # waiting for 3 left one batch to kill a busy worker in, which a loaded machine missed
    plan = [
        ("inject:Tally:after_output:data", None),
        ("driver", ("WindowCounter", 1)),
        ("worker", ("Tally", 0)),
    ]
    kills = _crash_loop(tmp_path, plan, seed=1, layout=layout, pacing=SHORT_PACING, strict=True)
    assert kills == {"injected": 1, "driver": 1, "worker": 1}


@pytest.mark.slow
def test_crash_long(tmp_path):
    steps = [("driver", (q, 2)) for q in ("WindowCounter", "Tally") * 2]
    steps += [("worker", (q, 2)) for q in ("WindowCounter", "Tally") * 3]
    random.Random(7).shuffle(steps)
    # the injector only reads and publishes, so it runs ahead of the computations: its kills
    # come first, while it has files left to publish
    plan = [
        ("inject:WindowCounter:mid_publish:data", None),
        ("inject:Tally:before_commit:data", None),
        ("driver", ("injector.queries", 1)),
        ("driver", ("injector.queries", 1)),
        *steps,
    ]
    kills = _crash_loop(tmp_path, plan, seed=7, files=LONG_FILES, pacing=LONG_PACING, strict=True)
    assert kills["injected"] == 2
    assert kills["driver"] >= 5 and kills["worker"] >= 5
