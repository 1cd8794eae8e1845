"""The main job's wall times (a command, not a test): ``python bench/main_job_bench.py``.

Runs the README's first command, ``millwheel run topologies/zeitgeist`` (its embedded
defaults: ``local[*]``, the embedded authority, the bundled sample), ``--runs`` times for
each variant, alternating (variant 1, variant 2, variant 1, ...), each in a fresh run
directory, and measures from the moment the command is started:

* ``first_output_s`` — the first anomaly the job publishes (a file appears in its
  ``anomalies`` stream log): the job's first result;
* ``first_records_s`` / ``first_windows_s`` — the first records the injector publishes,
  the first window counts (``WindowCounter``'s output);
* ``spark_up_s`` — the ``Spark ... up`` line; ``started_s`` — every query started;
* ``whole_run_s`` — the command's exit; ``reported_s`` — what it says it took.

A variant is ``LABEL=CHECKOUT`` (a directory holding ``millwheel/`` and ``topologies/``,
run with ``PYTHONPATH`` set to it), optionally with environment settings:
``--variant "main=../main" --variant "mine=." --env "mine:MILLWHEEL_JAVA_OPTIONS=-XX:TieredStopAtLevel=4"``,
and ``millwheel run`` arguments of its own: ``--variant "i16=." --arg "i16:--intervals" --arg "i16:16"``.
Each run takes the Spark lock (``--lock``, a file for ``flock``) for itself, so the bench
can share the machine with other Spark work; the time waiting for it is not counted.
Every run's evaluation (the text the command prints after ``zeitgeist evaluation``, and
its dead letters) must be the same: the figures say so (``evaluation_identical``).

Figures go to stdout and ``bench/results/main_job.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _git import git_head

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "main_job.json"
#: the streams whose first published file is timed, and the figure each gives
FIRSTS = {
    "anomalies": "first_output_s",
    "queries": "first_records_s",
    "window_counts": "first_windows_s",
}
_LINES = {
    "spark_up_s": re.compile(r"Spark \S+ up in"),
    "started_s": re.compile(r"computation\(s\) started in"),
}


def _first_file(directory: Path) -> bool:
    """Has any producer of this stream-log directory published a file?"""
    if not directory.is_dir():
        return False
    for producer in os.scandir(directory):
        if producer.is_dir() and not producer.name.startswith(("_", ".")):
            with os.scandir(producer.path) as it:
                if any(not e.name.startswith(("_", ".")) and e.is_file() for e in it):
                    return True
    return False


def evaluation_text(stdout: str) -> str:
    """What must not change: the evaluation block and the dead letters the command prints."""
    lines = stdout.splitlines()
    keep = [ln.strip() for ln in lines if ln.strip().startswith("malformed_line")]
    if any("zeitgeist evaluation" in ln for ln in lines):
        keep += [
            ln.rstrip()
            for ln in lines[next(i for i, ln in enumerate(lines) if "zeitgeist evaluation" in ln) :]
        ]
    return "\n".join(keep)


@contextlib.contextmanager
def spark_lock(path: str | None):
    if not path:
        yield 0.0
        return
    t = time.perf_counter()
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield time.perf_counter() - t
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_once(
    checkout: Path,
    env_extra: dict[str, str],
    python: str,
    lock: str | None,
    timeout_s: float,
    extra_args: list[str] | None = None,
) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="millwheel-main-job-"))
    env = {**os.environ, "PYTHONPATH": str(checkout), **env_extra}
    env.pop("MILLWHEEL_SPARK_UI", None)  # the command's own default: the Spark UI on
    cmd = [
        python,
        "-m",
        "millwheel.cli",
        "run",
        "topologies/zeitgeist",
        "--checkpoint",
        str(run_dir / "run"),
        *(extra_args or []),
    ]
    out: dict[str, Any] = {}
    stderr_lines: list[tuple[float, str]] = []
    try:
        with spark_lock(lock) as waited:
            out["lock_wait_s"] = round(waited, 1)
            out["load_1min"] = round(os.getloadavg()[0], 2)
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                cmd,
                cwd=checkout,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

            def read_stderr() -> None:
                assert proc.stderr is not None
                for line in proc.stderr:
                    stderr_lines.append((time.perf_counter() - t0, line.rstrip("\n")))

            reader = threading.Thread(target=read_stderr, daemon=True)
            reader.start()
            stdout_chunks: list[str] = []
            stdout_reader = threading.Thread(
                target=lambda: stdout_chunks.append(proc.stdout.read()), daemon=True
            )  # type: ignore[union-attr]
            stdout_reader.start()
            pending = dict(FIRSTS)
            while proc.poll() is None:
                for stream, figure in list(pending.items()):
                    if _first_file(run_dir / "run" / "streams" / stream):
                        out[figure] = round(time.perf_counter() - t0, 2)
                        del pending[stream]
                if time.perf_counter() - t0 > timeout_s:
                    proc.kill()
                    break
                time.sleep(0.05)
            proc.wait()
            out["whole_run_s"] = round(time.perf_counter() - t0, 2)
            reader.join(5)
            stdout_reader.join(5)
        stdout = "".join(stdout_chunks)
        out["returncode"] = proc.returncode
        for figure, rx in _LINES.items():
            hit = next((t for t, ln in stderr_lines if rx.search(ln)), None)
            out[figure] = None if hit is None else round(hit, 2)
        m = re.search(r"ran on Spark in ([0-9.]+)s", stdout)
        out["reported_s"] = float(m.group(1)) if m else None
        out["evaluation"] = evaluation_text(stdout)
        if proc.returncode != 0:
            out["stderr_tail"] = [ln for _, ln in stderr_lines[-15:]]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


def ensure_sample(checkout: Path, python: str) -> None:
    """Generate the bundled sample once, outside the timed runs (the command would, in 0.3 s)."""
    code = "from topologies.zeitgeist.generator import ensure_sample; ensure_sample()"
    subprocess.run(
        [python, "-c", code],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        check=True,
    )


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for figure in (
        "first_output_s",
        "first_records_s",
        "first_windows_s",
        "spark_up_s",
        "started_s",
        "whole_run_s",
        "reported_s",
    ):
        xs = [r[figure] for r in runs if r.get(figure) is not None]
        out[figure] = (
            {"median": round(statistics.median(xs), 2), "min": min(xs), "max": max(xs)}
            if xs
            else None
        )
    return out


def checkout_label(path: str) -> str:
    """A variant's checkout as its results file records it: relative to the repository, or a
    placeholder for one outside it (its commit is recorded beside it), never a machine's path."""
    rel = os.path.relpath(path, ROOT)
    return "<a checkout outside the repository>" if rel.split(os.sep)[0] == ".." else rel


def write_results(variants: dict[str, dict[str, Any]], out: str, *, done: bool) -> dict[str, Any]:
    texts = {r["evaluation"] for v in variants.values() for r in v["runs"] if r["returncode"] == 0}
    identical = len(texts) == 1
    results: dict[str, Any] = {
        "what": "millwheel run topologies/zeitgeist (embedded defaults, bundled sample), alternating runs; seconds from the command's start",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "complete": done,
        "evaluation_identical": identical,
        "evaluation": next(iter(texts)) if identical else sorted(texts),
        "variants": {},
    }
    for label, v in variants.items():
        results["variants"][label] = {
            "checkout": checkout_label(v["checkout"]),
            "commit": v["commit"],
            "env": v["env"],
            "args": v["args"],
            "summary": summary(v["runs"]),
            "runs": [{k: val for k, val in r.items() if k != "evaluation"} for r in v["runs"]],
        }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=CHECKOUT",
        help="a checkout to run (repeatable; default: this one)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE",
        help="an environment setting for one variant (repeatable)",
    )
    p.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="LABEL:ARG",
        help="a command-line argument for one variant's `millwheel run` (repeatable, in order; "
        'e.g. --arg "i4:--intervals" --arg "i4:4")',
    )
    p.add_argument("--runs", type=int, default=2, help="runs per variant, alternating")
    p.add_argument(
        "--python", default=sys.executable, help="the interpreter (the one with pyspark)"
    )
    p.add_argument(
        "--lock",
        default="/tmp/millwheel-spark.lock",
        help="flock file taken for each run ('' for none)",
    )
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    variants: dict[str, dict[str, Any]] = {}
    for item in args.variant or [f"this={ROOT}"]:
        label, _, path = item.partition("=")
        variants[label] = {"checkout": Path(path).resolve(), "env": {}, "args": []}
    for item in args.env:
        label, _, setting = item.partition(":")
        name, _, value = setting.partition("=")
        variants[label]["env"][name] = value
    for item in args.arg:
        label, _, arg = item.partition(":")
        variants[label]["args"].append(arg)
    for v in variants.values():
        v["commit"] = git_head(v["checkout"])
        ensure_sample(v["checkout"], args.python)
        v["runs"] = []

    for i in range(args.runs):
        for label, v in variants.items():
            r = run_once(
                v["checkout"], v["env"], args.python, args.lock or None, args.timeout, v["args"]
            )
            v["runs"].append(r)
            figures = {
                k: r.get(k)
                for k in (
                    "first_records_s",
                    "first_windows_s",
                    "first_output_s",
                    "whole_run_s",
                    "reported_s",
                    "spark_up_s",
                    "started_s",
                    "load_1min",
                )
            }
            print(
                f"run {i + 1} {label:>10}: "
                + "  ".join(f"{k}={val}" for k, val in figures.items()),
                flush=True,
            )
            if r["returncode"] != 0:
                print("\n".join(r.get("stderr_tail", [])), file=sys.stderr)
            write_results(
                variants, args.out, done=False
            )  # a bench cut short keeps the runs it made
    results = write_results(variants, args.out, done=True)
    print(f"evaluation identical in every run: {results['evaluation_identical']}")
    for label, v in results["variants"].items():
        print(
            f"{label:>10}: "
            + "  ".join(
                f"{k} {val['median']} ({val['min']}-{val['max']})"
                for k, val in v["summary"].items()
                if val
            )
        )
    print(f"wrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
