"""The log planners' CPU on Photon's logs, side by side with another checkout (a command, not a test).

    .venv/bin/python bench/logplan_lookups_bench.py                         # this checkout alone
    .venv/bin/python bench/logplan_lookups_bench.py --compare /path/to/old ...  # and others, alternated

A Photon run's log injectors plan their batches in Python planner processes
(``millwheel/_logplan.py``): scan each file's new bytes for timestamps and measure the
disorder over first deliveries (``millwheel/_logdisorder.py``: a record that would raise
the measure is looked up by id in the bytes read before it). This measures one pass of
the plan over each directory of Photon's throughput sample (``bench/photon_bench.py``'s
default: seed 3, 1,000 queries/s, 120 s) and, with ``--zeitgeist``, over the main job's
sample (``millwheel run topologies/zeitgeist``: 241 files, its first plan reads them all),
each pass in a fresh process (a planner
process starts cold: no index of ids yet), CPU seconds of the pass (``time.process_time``),
``--reps`` passes per checkout, alternated. Prints the medians; writes
``bench/results/logplan_lookups_<date>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _git import git_head

ROOT = Path(__file__).resolve().parent.parent

#: one pass of the plan over a directory, in the checkout on PYTHONPATH: its CPU seconds, its plans and disorder
PASS = """
import json, sys, time
from millwheel._logfile import LogFileSource, disorder, initial_offset, plan_offset
if sys.argv[2] == "zeitgeist":
    from topologies.zeitgeist.topology import make_source
    src = make_source(sys.argv[1])
else:
    from topologies.photon import PhotonConfig, make_sources
    src = make_sources(sys.argv[1], PhotonConfig())[sys.argv[2]]
opts = src.read_options
t = time.process_time()
off, plans = initial_offset(), 0
while True:
    nxt = plan_offset(off, opts, 0)
    plans += 1
    if nxt == off:
        break
    off = nxt
print(json.dumps({"cpu_s": time.process_time() - t, "plans": plans, "disorder": disorder(off)}))
"""


def one_pass(checkout: Path, data: Path, directory: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [sys.executable, "-c", PASS, str(data), directory],
        env=env,
        cwd=data,  # not a checkout: ``python -c`` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--compare", type=Path, nargs="*", default=[], help="other checkouts, measured alternately"
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rate", type=float, default=1_000.0)
    p.add_argument("--duration-s", type=int, default=120)
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--zeitgeist", action="store_true", help="also the main job's sample (its query logs)"
    )
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from topologies.photon import GeneratorConfig, generate

    checkouts = {"this": ROOT, **{c.resolve().name: c.resolve() for c in args.compare}}
    with tempfile.TemporaryDirectory(prefix="logplan-") as tmp:
        data = Path(tmp) / "data"
        generate(data, GeneratorConfig(seed=3, rate=args.rate, duration_s=args.duration_s))
        dirs = {"queries": data, "clicks": data}
        if args.zeitgeist:
            from topologies.zeitgeist.generator import ensure_sample
            from topologies.zeitgeist.topology import logs_dir

            dirs["zeitgeist"] = Path(ensure_sample()).resolve()
        sizes = {
            d: sum(
                f.stat().st_size
                for f in Path(logs_dir(where) if d == "zeitgeist" else where / d).iterdir()
            )
            for d, where in dirs.items()
        }
        runs: dict[str, dict[str, list[dict]]] = {k: {d: [] for d in dirs} for k in checkouts}
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        for _ in range(args.reps):
            for name, checkout in checkouts.items():
                for d, where in dirs.items():
                    runs[name][d].append(one_pass(checkout, where, d))
    load = os.getloadavg()
    result = {
        "what": "one plan pass over each directory of Photon's throughput sample (and the main job's, zeitgeist), CPU seconds, fresh process each (bench/logplan_lookups_bench.py)",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_after": load,
        },
        "started": started,
        "sample": {"seed": 3, "rate": args.rate, "duration_s": args.duration_s, "bytes": sizes},
        "checkouts": {k: git_head(v, dirty=True) or "?" for k, v in checkouts.items()},
        "median_cpu_s": {
            k: {d: round(statistics.median(r["cpu_s"] for r in v[d]), 4) for d in v}
            for k, v in runs.items()
        },
        "disorder": {k: {d: v[d][0]["disorder"] for d in v} for k, v in runs.items()},
        "runs": runs,
    }
    for k, v in result["median_cpu_s"].items():
        print(
            f"{k:8s} " + "   ".join(f"{d} {t:.3f} s" for d, t in v.items()) + f"   ({checkouts[k]})"
        )
    out = args.out or ROOT / "bench" / "results" / f"logplan_lookups_{time.strftime('%Y%m%d')}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
