"""Soak: millions of ledger records with a fault every 30-120 s, then the checker (``docs/reliability.md``).

    .venv/bin/python bench/soak.py [--records 10000000] [--min-minutes 30] [--seed S] [--workdir DIR]
                                   [--cluster] [--disk-mb 3072] [--classes driver,workers,...]

Runs the fault campaign of ``faults/campaign.py`` in its soak form: the input is written up
front (the ledger's Zeitgeist-like generator), then, until the run drains and at least
``--min-minutes`` have passed, a fault of a random class lands every 30-120 s (seeded:
the seed is printed first and reproduces the schedule). The faults are those of the CI
campaign — kill -9 of the driver, of Spark's Python workers and of the watermark
authority, a zombie driver, a full disk, an hour's jump of the JVM's wall clock — and, with
``--cluster``, kill -9 of a standalone cluster's executor JVM. If the run drains before
``--min-minutes``, the soak starts another round on fresh input in a new run directory.

Prints one line per fault, then the fault counts, the checker's report per round, and
writes them to ``bench/results/soak.json``. Exit status 1 if the checker found anything.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faults.campaign import CLASSES, Campaign  # noqa: E402

RESULTS = Path(__file__).with_name("results") / "soak.json"


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--min-minutes", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--workdir",
        default=None,
        help="where input, run directory and logs go (default a new directory under /tmp)",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="run on a local standalone cluster and kill its executors too",
    )
    p.add_argument(
        "--disk-mb",
        type=int,
        default=3072,
        help="size of the run directory's tmpfs (the full-disk fault)",
    )
    p.add_argument("--every", default="30,120", help="seconds between faults: MIN,MAX")
    p.add_argument(
        "--max-bytes",
        type=int,
        default=8_000_000,
        help="log bytes per injector batch (the CI campaign: 150,000)",
    )
    p.add_argument(
        "--per-trigger",
        type=int,
        default=2,
        help="stream files per computation micro-batch (the CI campaign: 1)",
    )
    p.add_argument(
        "--classes",
        default=",".join(CLASSES),
        help=f"fault classes (default all: {','.join(CLASSES)}; --cluster adds executor)",
    )
    args = p.parse_args(argv)
    # a SIGTERM stops the soak as Ctrl-C does: the campaign kills its driver and authority
    # and unmounts the run directory's tmpfs on the way out
    signal.signal(signal.SIGTERM, _terminate)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    lo, hi = (float(x) for x in args.every.split(","))
    work = Path(args.workdir or f"/tmp/millwheel-soak-{seed}")
    print(
        f"soak: seed {seed} (rerun with --seed {seed}), {args.records} records per round, a fault every {lo:.0f}-{hi:.0f}s, "
        f"at least {args.min_minutes} minutes; work directory {work}",
        flush=True,
    )
    cluster = None
    if args.cluster:
        from millwheel.runtime._cluster import StandaloneCluster

        cluster = StandaloneCluster(str(work / "cluster")).up(
            workers=2, cores=1, memory="1g", port=0, ui_port=0
        )
        print(f"soak: standalone cluster at {cluster.url}", flush=True)
    started = time.monotonic()
    rounds = []
    faults: Counter[str] = Counter()
    clean = True
    try:
        r = 0
        while True:
            campaign = Campaign(
                work / f"round{r}",
                records=args.records,
                faults=0,
                seed=seed + r,
                cluster=cluster,
                every_s=(lo, hi),
                max_bytes=args.max_bytes,
                per_trigger=args.per_trigger,
                disk_mb=args.disk_mb,
                log=lambda m: print(m, flush=True),
                classes=tuple(c for c in args.classes.split(",") if c),
            )
            result = campaign.run()
            report = result.report
            assert report is not None
            faults.update(result.faults)
            clean = clean and report.clean
            rounds.append(
                {
                    "seed": result.seed,
                    "records": result.records,
                    "faults": dict(result.faults),
                    "drivers": result.drivers,
                    "elapsed_s": round(result.elapsed_s),
                    "clean": report.clean,
                    "counts": report.counts(),
                    "inputs": report.inputs,
                    "outputs": report.outputs,
                    "late_planted": report.late_planted,
                    "sent_twice": report.sent_twice,
                    "malformed": report.malformed,
                    "skipped": result.skipped,
                }
            )
            print(report.text(), flush=True)
            r += 1
            if time.monotonic() - started >= args.min_minutes * 60 or not report.clean:
                break
    finally:
        if cluster is not None:
            cluster.down()
    minutes = (time.monotonic() - started) / 60
    summary = {
        "seed": seed,
        "minutes": round(minutes, 1),
        "records": sum(x["records"] for x in rounds),
        "faults": dict(faults),
        "clean": clean,
        "rounds": rounds,
        "cluster": args.cluster,
        "cores": os.cpu_count(),
        "every_s": [lo, hi],
        "load_average_at_end": os.getloadavg()[0],
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"soak: {summary['records']} records in {minutes:.1f} minutes, {sum(faults.values())} faults {dict(faults)}, "
        f"checker {'clean' if clean else 'VIOLATIONS'}; written to {RESULTS}",
        flush=True,
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
