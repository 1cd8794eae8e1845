"""A randomised fault campaign over the ledger topology, then the checker (``docs/reliability.md``).

    from faults.campaign import Campaign
    result = Campaign(workdir, records=100_000, faults=10, seed=7).run()
    assert result.report.clean, result.report.text()

One seed decides everything random: the input, the order of the fault classes, which query's
progress each fault waits for and how many committed batches. It is printed first, so a
failure reproduces with the same seed. Each fault waits for progress (committed batches),
never for seconds.

Every planned fault lands before the run drains, however fast the run: the input directory
stays open (the drivers run with ``--follow``; no ``_DONE``) until the last fault is
applied, and while faults are pending the campaign keeps at least two files unread ahead
of LedgerWindow (the newest input file its committed batches consumed), appending one more
second of records (ids and file times continuing, seeded by the campaign's seed and the
file's number) whenever it enters the last two, as a logger keeps writing while an
operator works. How many files
are appended depends on how fast the run went (``Result.appended``); the checker reads
every file. A soak (``faults=0``: faults until drained) writes its input complete.

Fault classes (``CLASSES``):

* ``driver`` — kill -9 of the driver and everything it started; a new driver resumes;
* ``workers`` — kill -9 of Spark's Python workers; the driver restarts the failed query;
* ``authority`` — kill -9 of ``millwheel authority serve``, restarted on the same port and
  journal; the driver's client retries meanwhile;
* ``zombie`` — SIGSTOP the driver's process tree, start a second driver on the same run
  directory, let it commit, SIGCONT the first: it must stop, fenced, without a trace;
* ``disk`` — fill the run directory's tmpfs: the driver stops with an error naming the
  full disk; the ballast is deleted and a new driver resumes;
* ``clock`` — the JVM's wall clock jumps an hour ahead (libfaketime), and later back.

An operator's actions mix in as classes too (``classes=CLASSES + OPERATIONS``,
``faults/operate.py``): online rescales and layout changes, one killed -9 mid-request and
finished the way the docs tell an operator to, and a Ctrl-C restart.

The executor-JVM kill needs a standalone cluster (``Campaign(cluster=True)``, used by the
soak and ``tests/faults/test_executor.py``): every driver then runs with
``--master spark://...`` and the ``executor`` class kills a worker's executor.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults import inject
from faults.check import Report, check_run
from faults.driver import FENCED_EXIT
from faults.ledger import START_MS, WINDOW_MS, write_input
from faults.operate import OPERATIONS, operate

CLASSES = ("driver", "workers", "authority", "zombie", "disk", "clock")
QUERIES = ("injector.queries", "LedgerWindow", "LedgerTally")
#: valid records per file appended while faults are pending (one second of the ledger's input)
APPEND = 5_000


@dataclass
class Result:
    seed: int
    records: int
    faults: Counter[str] = field(default_factory=Counter)
    plan: list[str] = field(default_factory=list)
    drivers: int = 0
    elapsed_s: float = 0.0
    report: Report | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    #: drivers that stopped with an error outside a planned fault (and were replaced)
    unplanned_exits: int = 0
    #: valid records appended while faults were pending (the run read faster than they landed)
    appended: int = 0

    def line(self) -> str:
        clean = "clean" if self.report is not None and self.report.clean else "VIOLATIONS"
        return (
            f"seed {self.seed}: {self.records} records"
            + (f" (+{self.appended} appended)" if self.appended else "")
            + f", {sum(self.faults.values())} faults {dict(self.faults)}, "
            f"{self.drivers} drivers ({self.unplanned_exits} unplanned exits), {self.elapsed_s:.0f}s, checker {clean}"
        )


class Campaign:
    """See the module docstring. ``workdir`` holds the input, the run directory and the logs."""

    def __init__(
        self,
        workdir: Path | str,
        *,
        records: int = 100_000,
        faults: int = 10,
        seed: int = 0,
        classes: tuple[str, ...] = CLASSES,
        max_bytes: int = 150_000,
        per_trigger: int = 1,
        cluster: Any = None,
        log: Callable[[str], None] = print,
        disk_mb: int = 2048,
        every_s: tuple[float, float] | None = None,
        injector: str | None = None,
    ) -> None:
        self.work = Path(workdir)
        self.records = records
        self.n_faults = faults
        self.seed = seed
        self.rng = random.Random(seed)
        self.cluster = cluster
        self.log = log
        self.max_bytes = max_bytes
        #: stream files per computation micro-batch (1: many small batches for faults to land between)
        self.per_trigger = per_trigger
        #: soak: a fault every ``every_s`` seconds (a random pause in that range), until drained
        self.every_s = every_s
        #: the input directory stays open until every planned fault landed (module docstring)
        self.follow = faults > 0
        #: who reads the logs: "spark" (the runtime's log-file injector: it follows an open
        #: directory; each driver draws its reader, Spark's query or the driver's thread,
        #: ``RuntimeSettings.log_reader``) or "driver" (``faults.ledger.InDriver``: the
        #: directory as it is when a driver starts, so only for complete input: the soak's default)
        self.injector = injector or ("spark" if self.follow else "driver")
        if self.follow and self.injector != "spark":
            msg = "planned faults keep the input directory open, which only the Spark reader follows: injector='spark'"
            raise ValueError(msg)
        self.queries = QUERIES if self.injector == "spark" else QUERIES[1:]
        self.result = Result(seed, records)
        #: drivers started with each log reader
        self.readers: Counter[str] = Counter()
        #: log files written so far; the next appended file continues ids and times after them
        self._files = 0
        self._feed_error: BaseException | None = None
        self._stop_feed = threading.Event()
        self._feeder = threading.Thread(target=self._feed, name="campaign-feeder")
        if self.follow and records < APPEND:
            msg = f"a campaign with faults needs at least {APPEND} records (one file a second), got {records}"
            raise ValueError(msg)
        self.classes = list(classes)
        why = inject.SmallDisk.available() if "disk" in classes else None
        if why:
            self.classes.remove("disk")
            self.result.skipped["disk"] = why
        why = inject.ClockJump.available() if "clock" in classes else None
        if why:
            self.classes.remove("clock")
            self.result.skipped["clock"] = why
        if cluster is not None:
            self.classes.append("executor")
        self.work.mkdir(parents=True, exist_ok=True)  # the clock's offset file is written at once
        self.data = self.work / "data"
        self.disk = (
            inject.SmallDisk(self.work / "disk", disk_mb) if "disk" in self.classes else None
        )
        self.root = (self.work / "disk" if self.disk else self.work) / "run"
        #: each driver's own log (``driver-<n>.log``), so a failing driver's tail is its own
        self._logs: dict[int, Path] = {}
        self.clock = inject.ClockJump(self.work / "faketimerc") if "clock" in self.classes else None
        self.authority = inject.AuthorityProcess(self.work / "authority")

    # ---- the plan ----------------------------------------------------------------------------
    def plan(self) -> list[str]:
        """Every class at least once (when there is room), the rest at random, shuffled.

        ``faults=0`` (the soak): every class once, shuffled; then random classes until drained.
        """
        plan = list(self.classes)[: self.n_faults or None]
        while len(plan) < self.n_faults:
            plan.append(self.rng.choice(self.classes))
        self.rng.shuffle(plan)
        return plan

    # ---- drivers -------------------------------------------------------------------------------
    def _start(self) -> Any:
        extra = [
            "--authority",
            self.authority.url,
            "--max-bytes",
            str(self.max_bytes),
            "--per-trigger",
            str(self.per_trigger),
            "--injector",
            self.injector,
        ]
        if self.follow:
            extra.append("--follow")
        if self.clock is not None:
            extra += ["--faketime", str(self.clock.path)]
        if self.cluster is not None:
            extra += ["--master", self.cluster.url]
        self.result.drivers += 1
        log = self.work / f"driver-{self.result.drivers}.log"
        env = self.authority.env()
        # either log reader, drawn per driver: each resumes the other's run
        if self.injector == "spark":
            env["MILLWHEEL_LOG_READER"] = self.rng.choice(("driver", "spark"))
            self.readers[env["MILLWHEEL_LOG_READER"]] += 1
            self.log(f"    driver {self.result.drivers}: log reader {env['MILLWHEEL_LOG_READER']}")
        proc = inject.start_driver(self.root, self.data, *extra, env=env, log=log)
        self._logs[proc.pid] = log
        return proc

    def _progress(self, proc: Any) -> bool:
        """Wait for a random query to commit 1-3 more batches (the soak: 30-120 s); False if the driver ended first."""
        if self.every_s is not None:
            deadline = time.monotonic() + self.rng.uniform(*self.every_s)
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return False
                time.sleep(0.2)
            return True
        query = self.rng.choice(self.queries)
        return inject.wait_for_progress(proc, self.root, query, self.rng.randint(1, 3), timeout=600)

    def _log(self, proc: Any = None) -> Path | None:
        """``proc``'s own log (default: the newest driver's), if it exists."""
        log = self._logs.get(proc.pid) if proc is not None else None
        if log is None and self._logs:
            log = list(self._logs.values())[-1]
        return log if log is not None and log.exists() else None

    def _tail(self, proc: Any = None) -> str:
        """The end of ``proc``'s own log (default: the newest driver's), named."""
        log = self._log(proc)
        return (
            f"[{log.name}]\n" + log.read_text(errors="replace")[-3000:] if log is not None else ""
        )

    # ---- one fault -------------------------------------------------------------------------------
    def _apply(self, what: str, proc: Any) -> Any:
        """Inject ``what`` into the running driver ``proc``; return the driver running afterwards."""
        if what == "driver":
            inject.kill_tree(proc)
            return self._start()
        if what == "workers":
            # only workers running a task (an idle one's kill fails nothing: ``busy_python_workers``)
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                root = self.cluster.workers[0].pid if self.cluster is not None else proc.pid
                killed = inject.kill_python_workers(root, busy=True)
                if self.cluster is not None:
                    killed += sum(
                        inject.kill_python_workers(w.pid, busy=True)
                        for w in self.cluster.workers[1:]
                    )
                if killed:
                    self.log(f"    {killed} Python worker(s) killed mid-task")
                    return proc
            self.log(
                "    no Python worker ran a task within 60 s (the driver ended, or was idle): nothing killed"
            )
            return proc
        if what == "executor":
            index = self.rng.randrange(len(self.cluster.workers))
            pid = inject.kill_executor(self.cluster, index)
            self.log(
                f"    executor of worker {index}: "
                + (f"pid {pid} killed" if pid else "none running at that moment")
            )
            return proc
        if what == "authority":
            self.authority.restart()
            return proc
        if what == "clock":
            self.clock.jump(3600 if self.clock.offset_s == 0 else -self.clock.offset_s)  # type: ignore[union-attr]
            return proc
        if what == "zombie":
            return self._zombie(proc)
        if what == "disk":
            return self._disk(proc)
        if what in OPERATIONS:
            return operate(self, what, proc)
        msg = f"unknown fault class {what!r}; known: {', '.join(CLASSES)}, executor, {', '.join(OPERATIONS)}"
        raise ValueError(msg)

    def _zombie(self, proc: Any) -> Any:
        stopped = inject.pause(proc)
        second = self._start()
        try:
            # the second driver takes over and publishes past the batch the first was in
            inject.wait_for_progress(second, self.root, "LedgerWindow", 2, timeout=600)
        finally:
            inject.resume(stopped)
        try:
            rc = proc.wait(timeout=300)
        except Exception:  # noqa: BLE001 - a zombie that does not stop is a failure of the fence
            inject.kill_tree(proc)
            msg = f"the zombie driver (pid {proc.pid}) did not stop within 300s after SIGCONT:\n{self._tail(proc)}"
            raise AssertionError(msg) from None
        inject.kill_tree(proc)
        if rc not in (FENCED_EXIT, 0):
            msg = f"the zombie driver exited {rc}, not fenced ({FENCED_EXIT}):\n{self._tail(proc)}\nthe driver that took over:\n{self._tail(second)}"
            raise AssertionError(msg)
        self.log(
            f"    zombie (pid {proc.pid}) exited {rc}: {'fenced' if rc == FENCED_EXIT else 'finished first'}"
        )
        return second

    def _disk(self, proc: Any) -> Any:
        assert self.disk is not None
        self.disk.fill()
        try:
            rc = proc.wait(timeout=600)
        except Exception:  # noqa: BLE001
            inject.kill_tree(proc)
            msg = f"the driver did not stop within 600s on a full disk:\n{self._tail(proc)}"
            raise AssertionError(msg) from None
        inject.kill_tree(proc)
        # anywhere in its log: the JVM may log its own shutdown after the driver's last line
        log = self._log(proc)
        if rc != 0 and (log is None or "DISK FULL" not in log.read_text(errors="replace")):
            msg = f"the driver stopped on a full disk (exit {rc}) without saying so:\n{self._tail(proc)}"
            raise AssertionError(msg)
        self.disk.free()
        return self._start()

    # ---- the campaign ------------------------------------------------------------------------------
    def run(self) -> Result:
        started = time.monotonic()
        self.log(
            f"fault campaign: seed {self.seed}, {self.records} records, {self.n_faults} faults over {self.classes}"
            + (f"; skipped: {self.result.skipped}" if self.result.skipped else "")
        )
        shutil.rmtree(self.data, ignore_errors=True)
        self._files = write_input(
            self.data, self.records, seed=self.seed, done=not self.follow
        ).files
        plan = self.result.plan = self.plan()
        if self.disk is not None:
            self.disk.mount()
        try:
            result = self._run(plan, started)
            if self.disk is not None and not result.report.clean:
                # the evidence outlives the tmpfs: the run directory beside the drivers' logs
                shutil.copytree(self.root, self.work / "run-kept", dirs_exist_ok=True)
                self.log(f"  run directory kept at {self.work / 'run-kept'}")
            return result
        finally:
            if self.disk is not None:
                with contextlib.suppress(Exception):
                    self.disk.unmount()

    def _run(self, plan: list[str], started: float) -> Result:
        self.authority.start()
        proc = None
        try:
            proc = self._start()
            if self.follow:
                self._feeder.start()
            i = 0
            while not self.n_faults or i < self.n_faults:
                what = plan[i] if i < len(plan) else self.rng.choice(self.classes)
                i += 1
                if not self._progress(proc):
                    if proc.wait() == 0:
                        break  # drained before every fault landed: the result says how many did
                    proc = self._replace(
                        proc
                    )  # stopped on its own (see _replace); the faults go on
                    continue
                used = (
                    f" (run directory's tmpfs: {self.disk.used_mb():.0f} of {self.disk.size_mb} MB used)"
                    if self.disk
                    else ""
                )
                self.log(f"  fault {sum(self.result.faults.values()) + 1}: {what}{used}")
                proc = self._apply(what, proc)
                self.result.faults[what] += 1
            self._close_input()
            proc = self._finish(proc)
        finally:
            self._stop_feeding()  # on an error: no file lands after the campaign stopped
            if proc is not None:
                inject.kill_tree(proc)
            self.authority.stop()
        self.result.report = check_run(
            str(self.root), str(self.data), authority_dir=self.authority.data_dir
        )
        self.result.elapsed_s = time.monotonic() - started
        if self.readers:
            self.log(f"  log readers of the drivers: {dict(self.readers)}")
        self.log(self.result.line())
        return self.result

    # ---- the input while faults are pending ---------------------------------------------------
    def _reading(self) -> int:
        """The number of the input file (0 first) LedgerWindow reads now: that of the newest
        injector file its last committed batch had consumed. A file's time is its oldest
        record's, or the sender watermark it was sent under if newer: never ahead."""
        from millwheel.runtime.rundir import min_ts_of

        names = inject.consumed_files(self.root, "LedgerWindow").get(("queries", "queries"), ())
        times = (min_ts_of(n) for n in names)
        return (max((t for t in times if t is not None), default=START_MS) - START_MS) // WINDOW_MS

    def _feed(self) -> None:
        try:
            self._feed_until_stopped()
        except BaseException as e:  # noqa: BLE001 - raised again by _close_input, in the campaign's thread
            self._feed_error = e

    def _feed_until_stopped(self) -> None:
        """Keep two files unread ahead of the reading until :meth:`_stop_feeding` (module docstring)."""
        while not self._stop_feed.wait(0.5):
            try:
                if self._reading() < self._files - 2:
                    continue
            except Exception:  # noqa: BLE001 - a checkpoint file moved or half written while read: look again
                continue
            staging = self.work / f".append{self._files}"
            more = write_input(
                staging,
                APPEND,
                seed=self.seed * 100_003 + self._files,
                files=1,
                first=self.records + self.result.appended,
                done=False,
            )
            for f in sorted(staging.glob("queries_*.jsonl")):
                f.rename(self.data / f.name)  # whole, as a logger rotates
            staging.rmdir()
            self._files += more.files
            self.result.appended += more.records

    def _stop_feeding(self) -> None:
        self._stop_feed.set()
        if self._feeder.is_alive():
            self._feeder.join()

    def _close_input(self) -> None:
        """Every planned fault landed: no more files; ``_DONE``."""
        self._stop_feeding()
        if self.follow and not (self.data / "_DONE").exists():
            if self.result.appended:
                self.log(
                    f"  input closed: {self.result.appended} records appended while faults were pending"
                )
            (self.data / "_DONE").write_text("")
        if self._feed_error is not None:
            error, self._feed_error = self._feed_error, None
            raise error

    def _replace(self, proc: Any) -> Any:
        """A driver that stopped with an error outside a planned fault: counted, and replaced.

        On a heavily loaded machine Spark gives a new Python worker 10 s to connect back (a
        constant in Spark), and a query that keeps failing that way stops its driver after
        ``max_restarts``; the checker then judges what the replacement makes of it.
        """
        self.result.unplanned_exits += 1
        self.log(f"  driver exited {proc.returncode} outside a planned fault; starting another")
        inject.kill_tree(proc)
        if self.disk is not None:
            self.disk.free()
        return self._start()

    def _finish(self, proc: Any) -> Any:
        """Run drivers until one drains; a driver that died of a fault is replaced."""
        for _ in range(5):
            if proc.wait(timeout=1800) == 0:
                return proc
            proc = self._replace(proc)
        msg = f"no driver drained after 5 restarts:\n{self._tail(proc)}"
        raise AssertionError(msg)
