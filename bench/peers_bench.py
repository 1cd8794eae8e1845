"""Python peers benchmark (a command, not a test): ``.venv/bin/python bench/peers_bench.py``.

The windowed count of ``bench/runtime_bench.py`` (per query, 10 s tumbling windows of
event time; by default 1M records over 10k keys, the same Parquet files, made by
``runtime_bench.make_data``) run by each system as a fresh process; the figure is the
whole process: records over the wall seconds from the bench starting the process to the
process's last output written (interpreter, JVM and mini-cluster start included; what a
process does after its output, a JVM's shutdown, is not). Every run's output is checked
against a plain batch count of the same files (``runtime_bench.expected_counts``): every
window's count equal, none missing, none extra, none emitted twice. A run that fails its
check is reported and its variant dropped from the rest of the run (exit status 1).

Variants (``--variants``; ``VARIANTS`` below says each one's guarantees, printed beside
its figures):

* ``spark_native``, ``spark_native_dedup``, ``spark_tws`` — ``runtime_bench``'s native
  Spark windowed count (without and with ``dropDuplicatesWithinWatermark``) and its
  ``transformWithStateInPandas`` count, ``local[2]``;
* ``mw_col_strong`` (``mw_col_arrow_strong``: the Arrow mapping) and ``mw_strong`` —
  millwheel's columnar and per-record computations, exactly-once + strong productions;
* ``flink_table``, ``flink_kpf``, ``flink_kpf_dedup`` — PyFlink (``bench/peers/flink_job.py``):
  the Table API's tumbling window, and a ``KeyedProcessFunction`` with ``ValueState`` and
  event-time timers (with a ``MapState`` of seen ids), checkpointing in exactly-once mode;
* ``bytewax``, ``bytewax_recovery`` — Bytewax's ``count_window`` (``bench/peers/bytewax_job.py``)
  without recovery and with a SQLite recovery directory.

The per-record APIs are slow at 1M records: ``--small-variants`` run at ``--small-records``
(100k by default) beside Spark native and millwheel at the same size; every figure is
reported with the size it was measured at, and its ratio to Spark native at that size.
PyFlink and Bytewax run in their own virtualenv outside the repository
(``$MILLWHEEL_PEERS_VENV``, default ``~/.cache/millwheel/peers-venv``), which
``bench/peers/setup.sh`` makes or completes first (the project's dependencies are not
touched). A warm-up round is discarded; the ``--reps`` rounds after it take the variants
in a rotating order, each variant's figure is the median of its rounds, and its ratio the
median of per-round ratios (the machine's load average is recorded beside every run).
Figures go to stdout and ``bench/results/peers_<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import pyarrow.csv as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _spark_bench import data_args, write_results  # noqa: E402
from runtime_bench import expected_counts, make_data  # noqa: E402

PEERS_VENV = Path(
    os.environ.get("MILLWHEEL_PEERS_VENV", Path.home() / ".cache" / "millwheel" / "peers-venv")
)
PEERS_PY = PEERS_VENV / "bin" / "python"


@dataclass(frozen=True)
class Variant:
    system: str
    #: the job: ``spark`` (``bench/peers/spark_job.py``), ``flink`` or ``bytewax``
    job: str
    #: the job's own name for it (``--variant``), or its extra arguments
    what: str
    dedup: str
    recovery: str
    user_code: str


_SPARK_RECOVERY = "exactly-once: offsets and state checkpointed every micro-batch; a micro-batch's output is rewritten whole on replay"
_MW_RECOVERY = "exactly-once + strong productions: state, ids and productions checkpointed before they are delivered"
_FLINK_RECOVERY = "exactly-once state (aligned checkpoints, every --checkpoint-s); the sink's files committed by the checkpoints"
VARIANTS: dict[str, Variant] = {
    "spark_native": Variant(
        "Spark 4 Structured Streaming, groupBy(window).count()",
        "spark",
        "spark_native",
        "no",
        _SPARK_RECOVERY,
        "none (built-in operator)",
    ),
    "spark_native_dedup": Variant(
        "the same after dropDuplicatesWithinWatermark(id)",
        "spark",
        "spark_native_dedup",
        "yes, within the watermark",
        _SPARK_RECOVERY,
        "none (built-in operators)",
    ),
    "spark_tws": Variant(
        "Spark transformWithStateInPandas (MapState per key)",
        "spark",
        "spark_tws",
        "no",
        _SPARK_RECOVERY,
        "per key and micro-batch, vectorised (pandas)",
    ),
    "mw_col_strong": Variant(
        "millwheel ColumnarWindowCounter, default mapping",
        "spark",
        "mw_col_strong",
        "yes, ids kept DedupOptions.slack_ms",
        _MW_RECOVERY,
        "per key interval and micro-batch, vectorised",
    ),
    "mw_col_arrow_strong": Variant(
        "millwheel ColumnarWindowCounter, Arrow mapping",
        "spark",
        "mw_col_arrow_strong",
        "yes, ids kept DedupOptions.slack_ms",
        _MW_RECOVERY,
        "per key interval and micro-batch, vectorised",
    ),
    "mw_strong": Variant(
        "millwheel Computation.process_record + low-watermark timers",
        "spark",
        "mw_strong",
        "yes, ids kept DedupOptions.slack_ms",
        _MW_RECOVERY,
        "per record (process_record) and per timer",
    ),
    "flink_table": Variant(
        "PyFlink Table API, TUMBLE window COUNT(*)",
        "flink",
        "table",
        "no",
        _FLINK_RECOVERY,
        "none (SQL)",
    ),
    "flink_kpf": Variant(
        "PyFlink KeyedProcessFunction, ValueState + event-time timers",
        "flink",
        "kpf",
        "no",
        _FLINK_RECOVERY,
        "per record and per timer (Python worker)",
    ),
    "flink_kpf_dedup": Variant(
        "the same with a MapState of seen ids per key and window",
        "flink",
        "kpf_dedup",
        "yes, per key and window",
        _FLINK_RECOVERY,
        "per record and per timer (Python worker)",
    ),
    "bytewax": Variant(
        "Bytewax count_window (tumbling, EventClock), 1 worker",
        "bytewax",
        "",
        "no",
        "none: a crash loses the run",
        "per record (timestamp and key functions; the operator is Python)",
    ),
    "bytewax_recovery": Variant(
        "the same with a SQLite recovery directory",
        "bytewax",
        "recovery",
        "no",
        "state and input position snapshotted every epoch (--checkpoint-s); output at-least-once (a dynamic sink)",
        "per record (as above)",
    ),
}
DEFAULT = (
    "spark_native,spark_native_dedup,mw_col_strong,mw_strong,flink_table,bytewax,bytewax_recovery"
)
DEFAULT_SMALL = "spark_native,mw_strong,flink_kpf,flink_kpf_dedup"


def csv_copy(files: Path) -> Path:
    """The input as headerless CSV files ``id,ts,query`` beside it (PyFlink's package ships no
    Parquet format); made once, outside any timing."""
    out = files.parent / "files-csv"
    if (out / "_READY").exists():
        return out
    out.mkdir(exist_ok=True)
    for f in sorted(files.glob("*.parquet")):
        pc.write_csv(
            pq.read_table(f, columns=["id", "ts", "query"]),
            out / f"{f.stem}.csv",
            pc.WriteOptions(include_header=False, quoting_style="none"),
        )
    (out / "_READY").write_text("")
    return out


def command(v: Variant, args: argparse.Namespace, files: Path, run: Path, out: Path) -> list[str]:
    """The command line of one run of ``v`` in the fresh directory ``run``."""
    if v.job == "spark":
        return [
            sys.executable,
            str(BENCH / "peers" / "spark_job.py"),
            "--variant",
            v.what,
            "--files",
            str(files),
            "--work",
            str(run),
            "--out",
            str(out),
            "--per-trigger",
            str(args.per_trigger),
            "--intervals",
            str(args.intervals),
        ]
    if v.job == "flink":
        return [
            str(PEERS_PY),
            str(BENCH / "peers" / "flink_job.py"),
            "--variant",
            v.what,
            "--csv",
            str(csv_copy(files)),
            "--out",
            str(out),
            "--parallelism",
            str(args.parallelism),
            "--checkpoint-ms",
            str(round(args.checkpoint_s * 1000)),
            "--checkpoint-dir",
            str(run / "ckpt"),
            "--watermark-delay-ms",
            str(args.watermark_delay_ms),
        ]
    cmd = [
        str(PEERS_PY),
        str(BENCH / "peers" / "bytewax_job.py"),
        "--files",
        str(files),
        "--out",
        str(out),
        "--watermark-delay-ms",
        str(args.watermark_delay_ms),
    ]
    return cmd + (
        ["--recovery", str(run / "recovery"), "--epoch-s", str(args.checkpoint_s)]
        if v.what == "recovery"
        else []
    )


def check(out: Path, expected: Counter) -> str | None:
    """What is wrong with a run's output (``None``: every window's count, once)."""
    got: dict[tuple[str, int], int] = {}
    twice = []
    for line in out.read_text(encoding="utf-8").splitlines():
        k, w, c = line.rsplit(",", 2)
        if (k, int(w)) in got:
            twice.append((k, int(w)))
        got[(k, int(w))] = int(c)
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
    if not (twice or missing or extra or wrong):
        return None
    return (
        f"{len(got)} windows of {len(expected)} expected: {len(missing)} missing {missing[:3]}, {len(extra)} extra {extra[:3]}, "
        f"{len(wrong)} with another count {[(k, got[k], expected[k]) for k in wrong[:3]]}, {len(twice)} emitted twice {twice[:3]}"
    )


def run_one(
    name: str, args: argparse.Namespace, files: Path, expected: Counter, run: Path, log: Path
) -> dict:
    """One fresh process of ``name``: its whole-process seconds and the check of its output."""
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    out = run / "out.csv"
    cmd = command(VARIANTS[name], args, files, run, out)
    load = os.getloadavg()
    started = time.time()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=f, text=True, cwd=ROOT, start_new_session=True
        )
        try:
            stdout, _ = proc.communicate(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, _ = proc.communicate()
        except BaseException:  # the bench interrupted or terminated: not its run either
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        f.write(stdout)
    exited = time.time()
    done = [
        float(line.split()[1]) for line in stdout.splitlines() if line.startswith("PEERS_DONE ")
    ]
    result = {
        "load_avg_before": [round(x, 2) for x in load],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "exit_s": round(exited - started, 3),
    }
    if proc.returncode != 0 or not done:
        return {**result, "error": f"exit status {proc.returncode} (log: {log})"}
    problem = check(out, expected)
    return {
        **result,
        "seconds": round(done[0] - started, 3),
        **({"error": f"output differs: {problem}"} if problem else {}),
    }


def versions() -> dict[str, str]:
    """The versions of the systems measured."""
    from importlib.metadata import version

    out = {
        "pyspark": version("pyspark"),
        "java": subprocess.run(
            ["java", "-version"], capture_output=True, text=True, check=False
        ).stderr.splitlines()[0],
    }
    code = "from importlib.metadata import version as v; print(v('apache-flink'), v('bytewax'))"
    got = subprocess.run(
        [str(PEERS_PY), "-c", code], capture_output=True, text=True, check=False
    ).stdout.split()
    return {**out, **dict(zip(("apache-flink", "bytewax"), got, strict=False))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_args(p, records=1_000_000, keys=10_000, files=100)
    p.add_argument(
        "--variants", default=DEFAULT, help=f"run at --records (of: {', '.join(VARIANTS)})"
    )
    p.add_argument(
        "--small-records", type=int, default=100_000, help="the size the --small-variants run at"
    )
    p.add_argument(
        "--small-variants", default=DEFAULT_SMALL, help="run at --small-records ('' for none)"
    )
    p.add_argument(
        "--checkpoint-s",
        type=float,
        default=1.0,
        help="PyFlink's checkpoint interval and Bytewax's epoch (with recovery)",
    )
    p.add_argument(
        "--watermark-delay-ms",
        type=int,
        default=100_000,
        help="PyFlink's and Bytewax's watermark delay (the input spans 100 s)",
    )
    p.add_argument(
        "--parallelism",
        type=int,
        default=2,
        help="PyFlink's parallelism (Spark runs local[2]; Bytewax one worker)",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=1800.0,
        help="a run still going after this is killed and counted as failed",
    )
    p.add_argument(
        "--out", default=None, help="results file (default bench/results/peers_<date>.json)"
    )
    p.add_argument("--work", default=str(ROOT / ".millwheel" / "bench"))
    args = p.parse_args(argv)
    signal.signal(
        signal.SIGTERM, lambda *_: sys.exit(143)
    )  # so that a run in progress is ended too

    plan = [(v, args.records) for v in args.variants.split(",") if v] + [
        (v, args.small_records) for v in args.small_variants.split(",") if v
    ]
    unknown = sorted({v for v, _ in plan} - set(VARIANTS))
    if unknown:
        p.error(f"no variant {', '.join(unknown)}; the variants are {', '.join(VARIANTS)}")
    if any(VARIANTS[v].job != "spark" for v, _ in plan):
        subprocess.run(["bash", str(BENCH / "peers" / "setup.sh")], check=True)
    data = {}
    for n in sorted({n for _, n in plan}):
        work = Path(args.work) / f"{n}-{args.keys}-{args.files}"
        files, _ = make_data(work, n, args.keys, args.files, args.intervals)
        data[n] = (work, files, expected_counts(files))
    runs: list[dict] = []
    failed: set[tuple[str, int]] = set()
    for rep in range(args.reps + 1):
        order = plan[rep % len(plan) :] + plan[: rep % len(plan)]
        for v, n in order:
            if (v, n) in failed:
                continue
            work, files, expected = data[n]
            r = {
                "rep": rep,
                "variant": v,
                "records": n,
                **run_one(v, args, files, expected, work / "peers" / v, work / f"peers-{v}.log"),
            }
            runs.append(r)
            label = (
                f"rep {rep}{' (warm-up, discarded)' if rep == 0 else ''}: {v:<20} {n:>9,} records"
            )
            if "error" in r:
                failed.add((v, n))
                print(f"{label}  FAILED: {r['error']}", flush=True)
            else:
                print(
                    f"{label} {r['seconds']:8.2f} s {n / r['seconds']:>10,.0f} rec/s  output OK  (load {r['load_avg_before'][0]:.1f})",
                    flush=True,
                )

    summary = []
    lines = [
        "| variant | records | median records/s | vs spark_native (same size) | runs (s) | load avg (1 min) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for v, n in plan:
        mine = {
            r["rep"]: r
            for r in runs
            if r["variant"] == v and r["records"] == n and r["rep"] > 0 and "error" not in r
        }
        if (v, n) in failed or not mine:
            lines.append(
                f"| {v} | {n:,} | {'failed' if (v, n) in failed else 'no round after the warm-up'} | - | - | - |"
            )
            summary.append({"variant": v, "records": n, "failed": (v, n) in failed})
            continue
        base = {
            r["rep"]: r
            for r in runs
            if r["variant"] == "spark_native"
            and r["records"] == n
            and r["rep"] > 0
            and "error" not in r
        }
        pairs = [base[k]["seconds"] / mine[k]["seconds"] for k in mine if k in base]
        rate = n / statistics.median(r["seconds"] for r in mine.values())
        ratio = statistics.median(pairs) if pairs else None
        loads = [r["load_avg_before"][0] for r in mine.values()]
        seconds = ", ".join(f"{r['seconds']:.1f}" for r in mine.values())
        lines.append(
            f"| {v} | {n:,} | {rate:,.0f} | {f'{ratio:.2f}x' if ratio else '-'} | {seconds} | {min(loads):.1f}-{max(loads):.1f} |"
        )
        summary.append(
            {
                "variant": v,
                "records": n,
                "records_per_s": round(rate),
                "vs_spark_native": round(ratio, 3) if ratio else None,
                "reps": len(mine),
            }
        )
    lines += [
        "",
        "| variant | system | dedup of input ids | on recovery | user code |",
        "|---|---|---|---|---|",
    ]
    for v in dict.fromkeys(v for v, _ in plan):
        g = VARIANTS[v]
        lines.append(f"| {v} | {g.system} | {g.dedup} | {g.recovery} | {g.user_code} |")
    print("\n".join(lines))
    out = (
        Path(args.out)
        if args.out
        else BENCH / "results" / f"peers_{dt.datetime.now(dt.timezone.utc):%Y%m%d}.json"
    )
    results = {
        "args": vars(args),
        "versions": versions(),
        "guarantees": {v: asdict(VARIANTS[v]) for v, _ in plan},
        "summary": summary,
        "runs": runs,
    }
    write_results(out, results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
