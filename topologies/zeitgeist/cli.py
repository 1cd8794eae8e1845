"""``millwheel zeitgeist generate|run|evaluate``: the sample, a harness replay, the evaluation.

Registered with the ``millwheel`` command as an entry point (``pyproject.toml``,
group ``millwheel.commands``)::

    millwheel zeitgeist generate OUT_DIR [--seed N --duration-s S --rate R ...]   write a sample
    millwheel zeitgeist run [DATA_DIR] [--mode continuous|batch] [--out DIR]     replay it, evaluate
    millwheel zeitgeist evaluate DATA_DIR ANOMALIES.jsonl [--metrics M.json]     evaluate an output

>>> import contextlib, io, tempfile
>>> d = tempfile.mkdtemp()
>>> with contextlib.redirect_stdout(io.StringIO()) as out:
...     code = main(["generate", d, "--duration-s", "20", "--rate", "100", "--queries", "10", "--spikes", "0", "--dips", "0"])
>>> code, out.getvalue().split(" (")[0]
(0, 'wrote 2134 lines')
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from .config import GeneratorConfig
from .drivers import replay
from .evaluation import RunResult, evaluate, load_truth, render
from .generator import ensure_sample, generate
from .topology import build


def main(argv: list[str] | None = None) -> int:
    """Zeitgeist sample data: generate, run, evaluate."""
    args = _parser().parse_args(argv)
    if args.command == "generate":
        started = time.perf_counter()
        cfg = GeneratorConfig(**{f.name: getattr(args, f.name) for f in fields(GeneratorConfig)})
        truth = _with_progress(
            lambda: generate(args.out_dir, cfg),
            Path(args.out_dir) / "logs",
            -(-cfg.duration_s * 1_000 // cfg.file_ms),
        )
        print(
            f"wrote {truth['lines']} lines ({truth['events']} events, {truth['duplicates_injected']} duplicates, "
            f"{truth['late_injected']} late, {truth['malformed_injected']} malformed) in {len(truth['files'])} files, "
            f"{len(truth['anomalies'])} anomalies, to {args.out_dir} in {time.perf_counter() - started:.1f}s"
        )
        return 0
    if args.command == "run":
        data = ensure_sample(args.data_dir)
        result = replay(build(data), tick_ms=args.tick_ms, mode=args.mode)
        report = evaluate(result, load_truth(data), tolerance_ms=args.tolerance_ms)
        print(render(report))
        if args.out:
            _write_outputs(Path(args.out), result, report)
        return 0
    anomalies = [
        json.loads(line)
        for line in Path(args.anomalies).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    saved: dict[str, Any] = {
        "metrics": {},
        "dead_letters": [],
        "wall_clock": all("detected_at" in a for a in anomalies),
    }
    if args.metrics:
        saved = json.loads(Path(args.metrics).read_text(encoding="utf-8"))
    result = RunResult(
        anomalies, saved["metrics"], saved["dead_letters"], wall_clock=bool(saved.get("wall_clock"))
    )
    report = evaluate(result, load_truth(args.data_dir), tolerance_ms=args.tolerance_ms)
    print(json.dumps(report, default=str, indent=1) if args.json else render(report))
    return 0


def _with_progress(work: Callable[[], Any], logs: Path, expected: int) -> Any:
    """``work()``; on a terminal, one progress line (log files written so far) redrawn while it runs."""
    if not sys.stderr.isatty():
        return work()
    done, started = threading.Event(), time.perf_counter()

    def show() -> None:
        while not done.wait(0.2):
            n = len(list(logs.glob("queries_*.jsonl"))) if logs.is_dir() else 0
            print(
                f"\rgenerating: {min(n, expected)}/{expected} files, {time.perf_counter() - started:.1f}s",
                end="",
                file=sys.stderr,
                flush=True,
            )
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)

    ticker = threading.Thread(target=show, daemon=True)
    ticker.start()
    try:
        return work()
    finally:
        done.set()
        ticker.join()


#: one line per generator setting (``GeneratorConfig``), for ``generate --help``
_GENERATOR_HELP = {
    "seed": "random seed",
    "queries": "distinct queries",
    "zipf_s": "Zipf exponent of query popularity",
    "rate": "mean events per second over all queries",
    "duration_s": "seconds of events",
    "start_ms": "event time of the first event (ms)",
    "day_s": "length of the short seasonal day, s",
    "season_amplitude": "seasonal amplitude a (traffic x [1-a, 1+a])",
    "spikes": "injected spikes",
    "dips": "injected dips",
    "spike_factor": "traffic factor during a spike",
    "dip_factor": "traffic factor during a dip",
    "anomaly_min_s": "shortest anomaly, s",
    "anomaly_max_s": "longest anomaly, s",
    "anomaly_min_rate": "lowest trough rate of a query that gets an anomaly",
    "warmup_s": "no anomaly before this, s",
    "anomaly_gap_s": "quiet time between two anomalies of a query, s",
    "file_ms": "event time per log file, ms",
    "max_delay_ms": "largest delay of an event into its file, ms",
    "window_ms": "window size, ms",
    "late_fraction": "fraction of late events",
    "duplicate_fraction": "fraction of duplicated events",
    "malformed": "malformed lines",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="millwheel zeitgeist", description="Zeitgeist sample generator and evaluation"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_gen = sub.add_parser("generate", help="write a query-log sample and its ground truth")
    p_gen.add_argument("out_dir", help="the directory to write the logs and truth.json to")
    for f in fields(GeneratorConfig):  # every setting is an option: --seed, --duration-s, ...
        text = f"{_GENERATOR_HELP.get(f.name, f.name.replace('_', ' '))} (default {f.default})"
        p_gen.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(f.default),
            default=f.default,
            dest=f.name,
            help=text,
        )
    p_run = sub.add_parser(
        "run", help="replay a sample through the topology in the harness and evaluate"
    )
    p_run.add_argument(
        "data_dir",
        nargs="?",
        default=None,
        help="default: the default sample (generated if missing)",
    )
    p_run.add_argument(
        "--mode",
        choices=["continuous", "batch"],
        default="continuous",
        help="replay file by file with a moving clock, or all at once (default continuous)",
    )
    p_run.add_argument(
        "--tick-ms",
        type=int,
        default=100,
        help="continuous mode: the clock step of the paced replay, in ms (default 100)",
    )
    p_run.add_argument(
        "--tolerance-ms",
        type=int,
        default=1_000,
        help="an anomaly matches an injected event within this many ms (default 1000)",
    )
    p_run.add_argument(
        "--out", default=None, help="write anomalies.jsonl, metrics.json, evaluation.json here"
    )
    p_eval = sub.add_parser(
        "evaluate", help="evaluate an anomalies output (JSON lines) against the ground truth"
    )
    p_eval.add_argument("data_dir", help="the sample's directory (with truth.json)")
    p_eval.add_argument(
        "anomalies", help="the anomalies, JSON lines (millwheel read RUN anomalies)"
    )
    p_eval.add_argument(
        "--metrics", default=None, help="metrics.json from the run (counters, dead letters)"
    )
    p_eval.add_argument(
        "--tolerance-ms",
        type=int,
        default=1_000,
        help="an anomaly matches an injected event within this many ms (default 1000)",
    )
    p_eval.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _write_outputs(out_dir: Path, result: RunResult, report: Mapping[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "anomalies.jsonl").open("w", encoding="utf-8") as fh:
        for a in result.anomalies:
            fh.write(json.dumps(a, default=str) + "\n")
    saved = {
        "metrics": result.metrics,
        "dead_letters": result.dead_letters,
        "wall_clock": result.wall_clock,
    }
    (out_dir / "metrics.json").write_text(json.dumps(saved, default=str, indent=1))
    (out_dir / "evaluation.json").write_text(json.dumps(report, default=str, indent=1))
