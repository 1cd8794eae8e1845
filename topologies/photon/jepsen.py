"""A Jepsen-style check of Photon's guarantee under the operations people perform (``millwheel photon check``).

Two pipelines on Spark, ``dc1`` and ``dc2``, run *at the same time* over the same logs and
share one IdRegistry (the real service). Each round, from one seed:

* a sample is generated; a few click files are held back and **shipped later** than the
  pipelines' ``dedup_slack_ms`` (a click log that arrives late);
* ``dc1`` reads its own copy of the query log, **delayed**: only part of it at first, the
  rest once ``dc1`` has given up on clicks beyond ``max_delay_ms``;
* one of the pipelines starts with a crash point (``after_output``, ``before_publish`` or
  ``mid_publish``: it kills itself with SIGKILL at its first batch with data); the other
  is killed (kill -9 of its whole process group) at a random moment;
* killed pipelines are restarted, one of them (at random) **from a deleted checkpoint**;
* ``photon verify`` runs at random moments, over both runs or over one of them;
* at the end: both drain, a final verification over both runs, and each pipeline runs
  again to consume what verification re-injected (repeated until verification recovers
  nothing).

The checker then compares the union of the two runs' outputs with a plain batch join of
the complete logs and counts, per click: **lost** (joinable, in no ``joined_clicks``),
**twice** (in ``joined_clicks`` more than once), **unseen** (an orphan in no
``unjoinable``), **both** (joined and *decided* unjoinable) and **unexpected** (joined, not
in the batch join). Any of them fails the round. Clicks one pipeline gave up and the other
joined are reported (superseded give-ups), not failures.

The checker is ``checker.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .checker import Counts, check_outputs
from .config import GeneratorConfig, PhotonConfig
from .drivers import read_run
from .generator import generate

#: the crash points a pipeline's first start may die at (``millwheel/runtime/_outbox.py``)
CRASH_POINTS = ("after_output", "before_publish", "mid_publish")
#: what a round does between the pipelines' starts and the end, in a random order
OPERATIONS = ("kill", "verify_all", "verify_subset", "ship_late_clicks", "deliver_delayed_queries")


@dataclass
class CheckSettings:
    """A round's size and the pipelines' settings (small enough for CI by default)."""

    #: seconds of generated logs in a round
    duration_s: int = 30
    #: queries per second of the generated logs
    rate: float = 40.0
    #: the pipelines' dedup horizon: the late click files are shipped further behind than this
    dedup_slack_ms: int = 5_000
    #: the pipelines' give-up age (dc1's delayed query log runs past it)
    max_delay_ms: int = 4_000
    #: key intervals of each pipeline
    intervals: int = 2
    #: seconds after which a round stops waiting and checks what it has
    round_timeout_s: float = 1_500.0
    #: the Spark master of the pipelines
    master: str = "local[2]"


@dataclass
class RoundResult:
    round: int
    seed: int
    plan: list[str] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    elapsed_s: float = 0.0

    def line(self) -> str:
        verdict = "ok" if self.counts.ok else "FAILED"
        return f"round {self.round} (seed {self.seed}) {verdict} in {self.elapsed_s:.0f}s: {self.counts.line()}\n  plan: {', '.join(self.plan)}"


class _Pipeline:
    """One pipeline's driver process (``millwheel photon run --backend spark``)."""

    def __init__(self, name: str, data: Path, run: Path, common: list[str], log: Path) -> None:
        self.name, self.data, self.run, self.common, self.log = name, data, run, common, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, follow: bool, crash: str | None = None) -> None:
        cmd = [sys.executable, "-m", "millwheel.cli", "photon", "run", str(self.data), "--checkpoint", str(self.run),
               "--pipeline", self.name, *self.common, *(["--follow"] if follow else [])]  # fmt: skip
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        env.pop("MILLWHEEL_CRASH", None)
        if crash is not None:
            env["MILLWHEEL_CRASH"] = f"Joiner:{crash}:data"
        with open(self.log, "ab") as out:
            out.write(f"\n==== {time.strftime('%H:%M:%S')} start {self.name} follow={follow} crash={crash}\n".encode())
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 of the driver and everything it started (its JVM, its Python workers)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)

    def stop(self) -> None:
        """A clean stop (SIGTERM: a ``--follow`` run ends its loop and exits)."""
        if self.running():
            self.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            try:
                self.proc.wait(180)  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                self.kill()
        self.kill()  # what is left of its process group

    def drained(self) -> bool:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return bool(json.loads((self.run / "photon-status.json").read_text())["drained"])
        return False

    def published(self) -> bool:
        """Some joined output is visible already (a moment worth interrupting)."""
        return bool(read_run(self.run).joined) if (self.run / "streams").exists() else False


class PhotonCheck:
    """Rounds of the check (see the module docstring) against one registry service."""

    def __init__(
        self, workdir: str | os.PathLike[str], registry_url: str, secret_file: str, *, seed: int = 1,
        settings: CheckSettings | None = None, say: Callable[[str], None] = print,
    ) -> None:  # fmt: skip
        self.workdir = Path(workdir)
        self.registry_url, self.secret_file = registry_url, secret_file
        self.seed = seed
        self.settings = settings or CheckSettings()
        self.say = say
        s = self.settings
        self.config = PhotonConfig(dedup_slack_ms=s.dedup_slack_ms, max_delay_ms=s.max_delay_ms, max_bytes_per_batch=20_000)

    def _common(self) -> list[str]:
        s, c = self.settings, self.config
        return ["--backend", "spark", "--registry", self.registry_url, "--secret-file", self.secret_file,
                "--intervals", str(s.intervals), "--master", s.master, "--max-restarts", "500",
                "--dedup-slack-ms", str(c.dedup_slack_ms), "--max-delay-ms", str(c.max_delay_ms),
                "--max-bytes-per-batch", str(c.max_bytes_per_batch)]  # fmt: skip

    def _verify(self, runs: list[Path]) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "millwheel.cli", "photon", "verify", *map(str, runs), "--registry", self.registry_url,
             "--secret-file", self.secret_file, "--json"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            msg = f"photon verify {[r.name for r in runs]} failed ({out.returncode}): {out.stderr[-2000:]}"
            raise RuntimeError(msg)
        return dict(json.loads(out.stdout))

    def round(self, number: int) -> RoundResult:
        rng = random.Random(self.seed * 1_000_003 + number)
        result = RoundResult(number, rng.randrange(1 << 30))
        started = time.monotonic()
        base = self.workdir / f"round-{number:03d}"
        if base.exists():
            shutil.rmtree(base)
        data = base / "data"
        s = self.settings
        # each round its own event times (query and click ids carry them) and pipeline names: one
        # registry serves every round, and its roster holds each name for one run directory
        start_ms = GeneratorConfig.start_ms + number * 10**9
        generate(data, GeneratorConfig(seed=result.seed, duration_s=s.duration_s, rate=s.rate, start_ms=start_ms))
        # a click log shipped late: files from the first half, held back
        clicks = sorted(p for p in (data / "clicks").glob("*.jsonl"))
        held = base / "held-clicks"
        held.mkdir()
        for p in rng.sample(clicks[1 : max(2, len(clicks) // 2)], k=min(2, max(1, len(clicks) // 2 - 1))):
            p.rename(held / p.name)
        # dc1's query log is delayed: it has the first part only, the rest comes later
        d1 = base / "data-dc1"
        (d1 / "queries").mkdir(parents=True)
        (d1 / "clicks").symlink_to(data / "clicks", target_is_directory=True)
        queries = sorted((data / "queries").glob("*.jsonl"))
        cut = rng.randint(len(queries) // 3, max(len(queries) // 3 + 1, 2 * len(queries) // 3))
        for p in queries[:cut]:
            shutil.copy(p, d1 / "queries" / p.name)
        pending_queries = queries[cut:]
        runs = {"dc1": base / "dc1", "dc2": base / "dc2"}
        pipes = {
            "dc1": _Pipeline(f"dc1-r{number}", d1, runs["dc1"], self._common(), base / "dc1.log"),
            "dc2": _Pipeline(f"dc2-r{number}", data, runs["dc2"], self._common(), base / "dc2.log"),
        }
        starts: Counter[str] = Counter()
        wiped: set[str] = set()  # pipelines already restarted from a deleted run directory
        crashing = rng.choice(sorted(pipes))
        point = rng.choice(CRASH_POINTS)
        deleted_checkpoint = rng.choice(sorted(pipes))
        result.plan.append(f"{crashing} crashes at {point}")
        deadline = started + s.round_timeout_s

        def restart(name: str, *, wipe: bool = False) -> None:
            p = pipes[name]
            starts[name] += 1
            if starts[name] > 40:  # a start refused for a reason that does not go away
                msg = f"round {number}: {name} keeps exiting ({p.proc.returncode if p.proc else '?'}); see {p.log}"
                raise RuntimeError(msg)
            code = p.proc.returncode if p.proc is not None else None
            p.kill()
            with open(p.log, "ab") as out:
                out.write(f"==== {time.strftime('%H:%M:%S')} {name} exited with {code}\n".encode())
            if wipe:  # its checkpoint (the run directory) is lost: it starts again as a new epoch
                wiped.add(name)
                shutil.rmtree(p.run, ignore_errors=True)
                result.plan.append(f"{name} restarts from a deleted checkpoint")
            else:
                result.plan.append(f"{name} restarts")
            p.start(follow=True)

        def wait(predicate: Callable[[], bool], what: str, seconds: float) -> bool:
            until = min(deadline, time.monotonic() + seconds)
            while time.monotonic() < until:
                for name, p in pipes.items():  # a driver that died (a crash point, a refused start) comes back
                    if p.proc is not None and not p.running() and p.proc.returncode not in (0,):
                        restart(name, wipe=name == deleted_checkpoint and name not in wiped)
                if predicate():
                    return True
                time.sleep(1.0)
            self.say(f"round {number}: {what} not within {seconds:.0f}s; going on")
            return False

        try:
            for name in sorted(pipes):
                pipes[name].start(follow=True, crash=point if name == crashing else None)
            ops = list(OPERATIONS)
            rng.shuffle(ops)
            for op in ops:
                # progress first: some output, or a pipeline that has read everything (its
                # clicks may all be held by a dead epoch until verification runs)
                wait(lambda: any(p.published() or p.drained() for p in pipes.values()), "progress", 600)
                time.sleep(rng.uniform(1.0, 6.0))
                if op == "kill":
                    victim = next(n for n in sorted(pipes) if n != crashing)
                    result.plan.append(f"kill -9 {victim}")
                    pipes[victim].kill()
                elif op == "verify_all":
                    r = self._verify(list(runs.values()))
                    result.plan.append(f"verify both: recovered {r['recovered']}")
                elif op == "verify_subset":
                    one = rng.choice(sorted(runs))
                    r = self._verify([runs[one]])
                    result.plan.append(f"verify {one} alone: recovered {r['recovered']}, not given {r['holder_not_given']}")
                elif op == "ship_late_clicks":
                    for p in held.glob("*.jsonl"):
                        shutil.copy(p, data / "clicks" / f".{p.name}")
                        os.replace(data / "clicks" / f".{p.name}", data / "clicks" / p.name)
                    result.plan.append("late click files shipped")
                elif op == "deliver_delayed_queries":
                    for p in pending_queries:
                        shutil.copy(p, d1 / "queries" / f".{p.name}")
                        os.replace(d1 / "queries" / f".{p.name}", d1 / "queries" / p.name)
                    result.plan.append("dc1's delayed queries delivered")
            # the end: both drain, a final verification, reruns until nothing is recovered
            wait(lambda: all(p.drained() and p.running() for p in pipes.values()), "both drained", 900)
            for p in pipes.values():
                p.stop()
            for _ in range(4):
                r = self._verify(list(runs.values()))
                result.counts.recovered += r["recovered"]
                result.plan.append(f"final verify: recovered {r['recovered']}")
                for name, p in sorted(pipes.items()):  # finite reruns: they read their re-injections, then exit
                    p.start(follow=False)
                    p.proc.wait(max(60.0, deadline - time.monotonic()))  # type: ignore[union-attr]
                    if p.proc.returncode != 0:  # type: ignore[union-attr]
                        msg = f"the final rerun of {name} exited with {p.proc.returncode}; see {p.log}"  # type: ignore[union-attr]
                        raise RuntimeError(msg)
                if r["recovered"] == 0:
                    break
        finally:
            for p in pipes.values():
                p.kill()
        counts = check_outputs(data, list(runs.values()), self.config)
        counts.recovered = result.counts.recovered
        result.counts = counts
        result.elapsed_s = time.monotonic() - started
        return result

    def run(self, rounds: int) -> Iterator[RoundResult]:
        for n in range(rounds):
            yield self.round(n)


def main(args: Any) -> int:
    """``millwheel photon check``: rounds against a registry service of its own; exit 1 on any failure."""
    from id_registry import embedded_registry

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    settings = CheckSettings(**{f.name: getattr(args, f.name) for f in fields(CheckSettings) if hasattr(args, f.name)})
    failed = 0
    results = []
    with embedded_registry(str(workdir / "registry")) as service:
        check = PhotonCheck(workdir, service.url, str(Path(service.data_dir) / "secret"), seed=args.seed, settings=settings)
        print(f"photon check: {args.rounds} round(s), seed {args.seed}, in {workdir} (registry {service.url})", flush=True)
        for result in check.run(args.rounds):
            print(result.line(), flush=True)
            results.append({**asdict(result), "ok": result.counts.ok})
            failed += not result.counts.ok
    (workdir / "check.json").write_text(json.dumps(results, indent=1))
    total = Counter()
    for r in results:
        total.update({k: v for k, v in r["counts"].items() if k in ("lost", "twice", "unseen", "both", "unexpected")})
    print(f"photon check: {len(results) - failed}/{len(results)} rounds ok; lost {total['lost']}, twice {total['twice']}, "
          f"unseen {total['unseen']}, joined and unjoinable {total['both']}, unexpected {total['unexpected']}")  # fmt: skip
    return 1 if failed else 0
