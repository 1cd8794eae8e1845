"""Benchmark of the per-key step's exactly-once machinery (MillWheel §6.1.1). A command, not a test.

    .venv/bin/python bench/dedup_bench.py [--quick]

Measures, side by side in one run (medians of interleaved repetitions, a warm-up discarded;
time is CPU time, ``time.process_time``: on a shared machine wall time measures the others):

1. the Bloom filter (rbloom + xxh3-128) against a Python ``set``: ids added and checked per
   second, and bytes per id;
2. a "never seen" check on a key that retains 100k ids: Bloom fast path versus decoding the
   exact id list (what the fast path saves);
3. the step: records/s through ``StepRunner.step`` for a counting computation with
   exactly-once + strong productions, and with both off, for hot keys (1000 records a step,
   each key's first step), warm keys (100 records a step, 10 steps a key: the filter is
   built, checked and grown) and cold keys (1 record a step: the cost is the envelope's
   decode and encode).

Figures go to stdout and to ``bench/results/dedup.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from millwheel import Computation, ComputationOptions, Record
from millwheel._bloom import BloomFilter, fingerprint
from millwheel._envelope import DedupIndex, DedupStats
from millwheel._step import StepRunner

RESULTS = Path(__file__).parent / "results" / "dedup.json"


class Count(Computation):
    def process_record(self, record):
        self.state.set(self.state.get(0) + 1)
        self.set_timer("flush", record.timestamp // 1_000 * 1_000 + 1_000)

    def process_timer(self, timer):  # pragma: no cover - not reached in the bench
        pass


def timed(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def median_rate(n: int, fns: dict, reps: int) -> dict[str, float]:
    """Interleave repetitions of each variant; discard the first round (warm-up)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(reps + 1):
        for name, fn in fns.items():
            t = timed(fn)
            if r:
                times[name].append(t)
    return {k: n / statistics.median(v) for k, v in times.items()}


def bench_bloom(n: int, reps: int) -> dict:
    ids = [f"rec-{i:09d}" for i in range(n)]
    probes = [f"new-{i:09d}" for i in range(n)]
    bloom = BloomFilter.create(n, 0.01)
    s: set[str] = set()
    bloom.update(map(fingerprint, ids))
    s.update(ids)

    # the Bloom figures include fingerprinting the id (xxh3-64), as the step does
    def bloom_add():
        b = BloomFilter.create(n, 0.01)
        for i in ids:
            b.add(fingerprint(i))

    def set_add():
        t: set[str] = set()
        for i in ids:
            t.add(i)

    def bloom_check():
        for p in probes:
            fingerprint(p) in bloom  # noqa: B015

    def set_check():
        for p in probes:
            p in s  # noqa: B015

    rates = median_rate(
        n,
        {
            "bloom_add": bloom_add,
            "set_add": set_add,
            "bloom_check": bloom_check,
            "set_check": set_check,
        },
        reps,
    )
    fp = sum(fingerprint(p) in bloom for p in probes) / n
    return {
        **{f"{k}_per_s": round(v) for k, v in rates.items()},
        "bloom_bytes_per_id": round(len(bloom.to_bytes()) / n, 2),
        "measured_fpr": round(fp, 4),
    }


def bench_fast_path(n: int, reps: int) -> dict:
    idx = DedupIndex()
    idx.admit([f"rec-{i:09d}" for i in range(n)], list(range(n)), DedupStats())
    idx.finish(-1, 0.01, None, 0, DedupStats())
    wire = idx.to_wire()
    probes = [f"new-{i}" for i in range(200)]

    def bloom_path():
        for p in probes:
            fresh = DedupIndex.from_wire(wire)  # a new step: nothing decoded yet
            fresh.contains(p, DedupStats())

    def exact_path():
        for p in probes:
            fresh = DedupIndex.from_wire(wire)
            p in fresh._exact_ids()  # noqa: B015  # what a check costs without the filter

    rates = median_rate(len(probes), {"bloom": bloom_path, "exact": exact_path}, reps)
    return {
        "retained_ids": n,
        "first_check_per_s_bloom": round(rates["bloom"]),
        "first_check_per_s_exact": round(rates["exact"]),
        "speedup": round(rates["bloom"] / rates["exact"], 1),
    }


def bench_step(n: int, reps: int) -> dict:
    strong = ComputationOptions()
    weak = ComputationOptions(exactly_once=False, strong_productions=False)
    out: dict[str, float] = {}
    for shape, per_step in (
        ("hot_keys_1000_per_step", 1000),
        ("warm_keys_100_per_step", 100),
        ("cold_keys_1_per_step", 1),
    ):
        batches = [
            [Record(f"k{b % 50}", None, 1_000 + i, f"{b}-{i}") for i in range(per_step)]
            for b in range(n // per_step)
        ]

        def run(options, batches=batches):
            runner = StepRunner(Count(), name="Count", outputs=[], options=options)
            envs: dict = {}
            for batch in batches:
                key = batch[0].key
                envs[key] = runner.step(key, envs.get(key), batch, low_watermark=0, now=0).envelope

        rates = median_rate(
            n,
            {"exactly_once_strong": lambda: run(strong), "no_dedup_weak": lambda: run(weak)},
            reps,
        )
        for k, v in rates.items():
            out[f"{shape}.{k}_records_per_s"] = round(v)
        out[f"{shape}.cost_ratio_exactly_once_vs_none"] = round(
            rates["no_dedup_weak"] / rates["exactly_once_strong"], 2
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="results file (default bench/results/dedup.json)"
    )
    args = parser.parse_args()
    n, reps = (20_000, 3) if args.quick else (200_000, 5)
    results = {
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
        "bloom_vs_set": bench_bloom(n, reps),
        "first_check_on_a_key_with_100k_ids": bench_fast_path(
            100_000 if not args.quick else 10_000, reps
        ),
        "step": bench_step(n // 4, reps),
    }
    print(json.dumps(results, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
