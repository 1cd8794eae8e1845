"""A Jepsen-style check of Photon's guarantee under the operations people perform (``millwheel photon check``).

Two pipelines on Spark, ``dc1`` and ``dc2``, run *at the same time* over the same logs and
share one IdRegistry (the real service). Each round, from a seed nobody chose (drawn at
random and printed unless ``--seed`` replays one):

* a sample is generated; a few click files are held back and **shipped later** than the
  pipelines' ``dedup_slack_ms`` (a click log that arrives late);
* ``dc1`` reads its own copy of the query log, **delayed**: only part of it at first, the
  rest once ``dc1`` has given up on clicks beyond ``max_delay_ms``;
* one of the pipelines starts with a crash point (``after_output``, ``before_publish`` or
  ``mid_publish``: it kills itself with SIGKILL at its first batch with data); the other
  is killed (kill -9 of its whole process group) at a random moment;
* killed pipelines are restarted, one of them (at random) **from a deleted checkpoint**;
* ``photon verify`` runs at random moments, over both runs or over one of them; where it
  asks which directory takes its re-injections, a random one is named (``--target``);
* **a whole click file is shipped twice** (a copy under another name);
* **a start refused under a taken name**: a third driver under one of the two names in a
  directory of its own must be refused, and a verification naming that directory must
  refuse it too (it is not a run) and write nothing there;
* **kill -9 of the registry and an outage** of ``outage_min_s``–``outage_max_s`` seconds
  (30–60 in the long form), then the registry restarted on its store: the pipelines wait
  inside their batches and must not stop;
* at the end, once both drained, **a click file repeating clicks already joined** (a
  re-delivery far beyond the dedup horizon) is shipped, both drain again, a final
  verification runs over both runs, and each pipeline runs again to consume what it was
  given (repeated until verification recovers nothing).

The checker (``checker.py``) compares the union of the two runs' outputs with a plain
batch join of the complete logs and counts per click: lost, twice (in every output
stream), unseen, joined and unjoinable, unexpected; a pipeline that **stopped** on its own
(an exit the check did not cause) and a refused start or verification that was not
refused are counted too. Any of them fails the round. A sink database restart is not an
operation of this check: its pipelines write stream logs, not a database (the PostgreSQL
sink's restart is ``tests/runtime/test_spark_sink.py``'s).

The processes a round drives (the registry service, each pipeline's driver), the shipping
of a file into a log directory and the ``photon verify`` command are in
``jepsen_processes.py``; this module is the round's script and its verdict.
"""

from __future__ import annotations

import json
import os
import random
import shutil
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
from .evaluation import read_records
from .generator import generate
from .jepsen_processes import CheckRegistry, PipelineProcess, check_registry, run_verify, ship

__all__ = [
    "CRASH_POINTS",
    "OPERATIONS",
    "CheckRegistry",
    "CheckSettings",
    "PhotonCheck",
    "RoundResult",
    "check_outputs",
    "check_registry",
    "fresh_seed",
    "main",
]

#: the crash points a pipeline's first start may die at (``millwheel/runtime/_outbox.py``)
CRASH_POINTS = ("after_output", "before_publish", "mid_publish")
#: what a round does between the pipelines' starts and the end, in a random order
OPERATIONS = (
    "kill",
    "verify_all",
    "verify_subset",
    "ship_late_clicks",
    "deliver_delayed_queries",
    "ship_click_file_twice",
    "refused_start",
    "registry_outage",
)


@dataclass
class CheckSettings:
    """A round's size and the pipelines' settings (the long form by default; CI shortens the outage)."""

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
    #: the registry outage (kill -9, then a restart this many seconds later): at least
    outage_min_s: float = 30.0
    #: and at most
    outage_max_s: float = 60.0
    #: how long the pipelines' registry calls wait for the registry to come back
    registry_patience_s: float = 600.0
    #: clicks already joined that the late repeat file delivers again
    repeat_clicks: int = 25


@dataclass
class RoundResult:
    round: int
    seed: int
    plan: list[str] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    #: exits of a pipeline the check did not cause (a stop on its own: an outage it did not ride out)
    stops: list[str] = field(default_factory=list)
    #: a start or a verification that should have been refused and was not
    not_refused: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.counts.ok and not self.stops and not self.not_refused

    def line(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        extra = "".join(
            f"; {label}: {', '.join(items)}"
            for label, items in (("stopped", self.stops), ("not refused", self.not_refused))
            if items
        )
        return f"round {self.round} (seed {self.seed}) {verdict} in {self.elapsed_s:.0f}s: {self.counts.line()}{extra}\n  plan: {', '.join(self.plan)}"


class PhotonCheck:
    """Rounds of the check (see the module docstring) against one registry service."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        registry: CheckRegistry,
        *,
        seed: int,
        settings: CheckSettings | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.workdir = Path(workdir)
        self.registry = registry
        self.seed = seed
        self.settings = settings or CheckSettings()
        self.say = say
        s = self.settings
        self.config = PhotonConfig(
            dedup_slack_ms=s.dedup_slack_ms, max_delay_ms=s.max_delay_ms, max_bytes_per_batch=20_000
        )

    def _common(self) -> list[str]:
        s, c = self.settings, self.config
        return [
            "--backend",
            "spark",
            "--registry",
            self.registry.url,
            "--secret-file",
            self.registry.secret_file,
            "--intervals",
            str(s.intervals),
            "--master",
            s.master,
            "--max-restarts",
            "500",
            "--registry-patience-s",
            str(s.registry_patience_s),
            "--dedup-slack-ms",
            str(c.dedup_slack_ms),
            "--max-delay-ms",
            str(c.max_delay_ms),
            "--max-bytes-per-batch",
            str(c.max_bytes_per_batch),
        ]

    def _verify(self, runs: list[Path], rng: random.Random, plan: list[str]) -> dict[str, Any]:
        """``photon verify RUNS``; where it asks which directory takes the re-injections, a random one is named."""
        out = run_verify(self.registry, runs)
        if out.returncode == 2 and "--target" in out.stderr and len(runs) > 1:
            target = rng.choice(runs)
            plan.append(f"verify asked where to re-inject; --target {target.name}")
            out = run_verify(self.registry, runs, "--target", str(target))
        if out.returncode != 0:
            msg = f"photon verify {[r.name for r in runs]} failed ({out.returncode}): {out.stderr[-2000:]}"
            raise RuntimeError(msg)
        return dict(json.loads(out.stdout))

    def round(self, number: int) -> RoundResult:  # noqa: C901, PLR0915 - one round's script, read top to bottom
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
        generate(
            data,
            GeneratorConfig(
                seed=result.seed, duration_s=s.duration_s, rate=s.rate, start_ms=start_ms
            ),
        )
        # a click log shipped late: files from the first half, held back
        clicks = sorted(p for p in (data / "clicks").glob("*.jsonl"))
        held = base / "held-clicks"
        held.mkdir()
        for p in rng.sample(
            clicks[1 : max(2, len(clicks) // 2)], k=min(2, max(1, len(clicks) // 2 - 1))
        ):
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
            "dc1": PipelineProcess(
                f"dc1-r{number}", d1, runs["dc1"], self._common(), base / "dc1.log"
            ),
            "dc2": PipelineProcess(
                f"dc2-r{number}", data, runs["dc2"], self._common(), base / "dc2.log"
            ),
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
            if (
                code is not None and not p.killed
            ):  # it stopped on its own: the check did nothing to it
                result.stops.append(f"{name} exited with {code} (see {p.log.name})")
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
                for (
                    name,
                    p,
                ) in pipes.items():  # a driver that died (a crash point, a kill) comes back
                    if p.proc is not None and not p.running() and p.proc.returncode not in (0,):
                        restart(name, wipe=name == deleted_checkpoint and name not in wiped)
                if predicate():
                    return True
                time.sleep(1.0)
            self.say(f"round {number}: {what} not within {seconds:.0f}s; going on")
            return False

        def drained() -> bool:
            return all(p.drained() and p.running() for p in pipes.values())

        try:
            for name in sorted(pipes):
                pipes[name].start(follow=True, crash=point if name == crashing else None)
            ops = list(OPERATIONS)
            rng.shuffle(ops)
            for op in ops:
                # progress first: some output, or a pipeline that has read everything (its
                # clicks may all be held by a dead epoch until verification runs)
                wait(
                    lambda: any(p.published() or p.drained() for p in pipes.values()),
                    "progress",
                    600,
                )
                time.sleep(rng.uniform(1.0, 6.0))
                self._operation(
                    op, rng, result, base, data, d1, held, pending_queries, runs, pipes, crashing
                )
            # the end: both drain; a click file repeating clicks already joined, far behind the
            # dedup horizon; both drain again; a final verification, reruns until nothing is recovered or offered
            wait(drained, "both drained", 900)
            self._repeat_joined(rng, result, data, runs)
            time.sleep(
                15.0
            )  # the running pipelines read it (the finite reruns below do, at the latest)
            for p in pipes.values():
                p.stop()
            for _ in range(4):
                r = self._verify(list(runs.values()), rng, result.plan)
                result.counts.recovered += r["recovered"]
                result.plan.append(
                    f"final verify: recovered {r['recovered']} {r['reinjected_into'] or ''}".rstrip()
                    + (f"; offered {r['offered']} {r['offered_into']}" if r["offered"] else "")
                )
                for name, p in sorted(
                    pipes.items()
                ):  # finite reruns: they read their re-injections, then exit
                    p.start(follow=False)
                    p.proc.wait(max(60.0, deadline - time.monotonic()))  # type: ignore[union-attr]
                    if p.proc.returncode != 0:  # type: ignore[union-attr]
                        msg = f"the final rerun of {name} exited with {p.proc.returncode}; see {p.log}"  # type: ignore[union-attr]
                        raise RuntimeError(msg)
                if r["recovered"] + r["offered"] == 0:
                    break
        finally:
            for p in pipes.values():
                p.kill()
        recovered = result.counts.recovered
        result.counts = check_outputs(data, list(runs.values()), self.config)
        result.counts.recovered = recovered
        result.elapsed_s = time.monotonic() - started
        return result

    def _operation(
        self,
        op: str,
        rng: random.Random,
        result: RoundResult,
        base: Path,
        data: Path,
        d1: Path,
        held: Path,
        pending_queries: list[Path],
        runs: dict[str, Path],
        pipes: dict[str, PipelineProcess],
        crashing: str,
    ) -> None:
        s = self.settings
        if op == "kill":
            victim = next(n for n in sorted(pipes) if n != crashing)
            result.plan.append(f"kill -9 {victim}")
            pipes[victim].kill()
        elif op == "verify_all":
            r = self._verify(list(runs.values()), rng, result.plan)
            result.plan.append(
                f"verify both: recovered {r['recovered']} {r['reinjected_into'] or ''}".rstrip()
                + (f"; offered {r['offered']} {r['offered_into']}" if r["offered"] else "")
            )
        elif op == "verify_subset":
            one = rng.choice(sorted(runs))
            r = self._verify([runs[one]], rng, result.plan)
            result.plan.append(
                f"verify {one} alone: recovered {r['recovered']}, not given {r['holder_not_given']}"
            )
        elif op == "ship_late_clicks":
            for p in held.glob("*.jsonl"):
                ship(p, data / "clicks", p.name)
            result.plan.append("late click files shipped")
        elif op == "deliver_delayed_queries":
            for p in pending_queries:
                ship(p, d1 / "queries", p.name)
            result.plan.append("dc1's delayed queries delivered")
        elif op == "ship_click_file_twice":
            shipped = sorted(
                p
                for p in (data / "clicks").glob("*.jsonl")
                if "_again" not in p.name and "_repeat" not in p.name
            )
            original = rng.choice(shipped)
            ship(
                original, data / "clicks", f"{original.stem}_again.jsonl"
            )  # the time in its name: the original's
            result.plan.append(f"click file {original.name} shipped twice")
        elif op == "refused_start":
            self._refused_start(rng, result, base, runs, pipes)
        elif op == "registry_outage":
            down = rng.uniform(s.outage_min_s, s.outage_max_s)
            self.registry.kill()
            time.sleep(down)
            self.registry.restart()
            result.plan.append(f"registry kill -9, down {down:.0f}s, restarted")

    def _refused_start(
        self,
        rng: random.Random,
        result: RoundResult,
        base: Path,
        runs: dict[str, Path],
        pipes: dict[str, PipelineProcess],
    ) -> None:
        """A third driver under a name another run directory holds: refused; a verification naming its directory too."""
        taken = pipes[rng.choice(sorted(pipes))]
        other = base / f"refused-{taken.name}"
        out = subprocess.run(
            taken.command(follow=False, run=other),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
        if out.returncode == 0 or "is held in this IdRegistry" not in out.stderr:
            result.not_refused.append(
                f"start of {taken.name} in {other.name} (exit {out.returncode}: {out.stderr[-300:]!r})"
            )
        ver = run_verify(self.registry, [other, *runs.values()])
        if (
            ver.returncode == 0
            or "not a Photon run directory" not in ver.stderr
            or any(other.glob("reinject/reinject_*"))
        ):
            result.not_refused.append(
                f"verify naming {other.name} (exit {ver.returncode}: {ver.stderr[-300:]!r})"
            )
        result.plan.append(
            f"start of {taken.name} in {other.name} refused (exit {out.returncode}); verify naming it refused (exit {ver.returncode})"
        )

    def _repeat_joined(
        self, rng: random.Random, result: RoundResult, data: Path, runs: dict[str, Path]
    ) -> None:
        """A click file, shipped after the pipelines drained, that delivers again clicks already joined."""
        joined = sorted(
            {j[self.config.click_id_field] for run in runs.values() for j in read_run(run).joined}
        )
        again = set(rng.sample(joined, k=min(self.settings.repeat_clicks, len(joined))))
        records, _ = read_records(data / "clicks", self.config.click_id_field, self.config.ts_field)
        lines, seen = [], set()
        for rec in records:
            cid = rec.get(self.config.click_id_field)
            if cid in again and cid not in seen:
                seen.add(cid)
                lines.append(json.dumps(rec))
        if not lines:
            return
        oldest = min(json.loads(line)[self.config.ts_field] for line in lines)
        tmp = data / f".clicks_{oldest}_repeat.jsonl"
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, data / f"clicks_{oldest}_repeat.jsonl")
        result.plan.append(
            f"after the drain: {len(lines)} joined clicks delivered again (clicks_{oldest}_repeat.jsonl)"
        )

    def run(self, rounds: int) -> Iterator[RoundResult]:
        for n in range(rounds):
            yield self.round(n)


def fresh_seed() -> int:
    """A seed nobody chose (printed by the check, so a failing round can be replayed)."""
    return random.SystemRandom().randrange(1, 1 << 31)


def main(args: Any) -> int:
    """``millwheel photon check``: rounds against a registry service of its own; exit 1 on any failure."""
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    settings = CheckSettings(
        **{f.name: getattr(args, f.name) for f in fields(CheckSettings) if hasattr(args, f.name)}
    )
    seed = args.seed if args.seed is not None else fresh_seed()
    failed = 0
    results = []
    with check_registry(workdir / "registry") as registry:
        check = PhotonCheck(workdir, registry, seed=seed, settings=settings)
        print(
            f"photon check: {args.rounds} round(s), seed {seed} (replay with --seed {seed}), in {workdir} (registry {registry.url})",
            flush=True,
        )
        for result in check.run(args.rounds):
            print(result.line(), flush=True)
            results.append({**asdict(result), "ok": result.ok, "check_seed": seed})
            failed += not result.ok
            (workdir / "check.json").write_text(json.dumps(results, indent=1))
    total: Counter[str] = Counter()
    for r in results:
        total.update(
            {
                k: v
                for k, v in r["counts"].items()
                if k in ("lost", "twice", "unseen", "both", "unexpected")
            }
        )
        total["stops"] += len(r["stops"])
        total["not_refused"] += len(r["not_refused"])
    print(
        f"photon check (seed {seed}): {len(results) - failed}/{len(results)} rounds ok; lost {total['lost']}, twice {total['twice']}, "
        f"unseen {total['unseen']}, joined and unjoinable {total['both']}, unexpected {total['unexpected']}, "
        f"stopped {total['stops']}, not refused {total['not_refused']}"
    )
    return 1 if failed else 0
