"""Benchmark the low-watermark authority: sustained reports/s and the cost of a watermark read.

    .venv/bin/python bench/authority_bench.py                       # 10k and 100k intervals, 10 s each
    .venv/bin/python bench/authority_bench.py --intervals 10000 --seconds 3 --update-docs

Starts the real service (``python -m watermark_authority serve``, RocksDB journal, loopback
only) and, per interval count: acquires every interval, then has ``--clients`` threads
send ``report_batch`` calls of ``--batch`` intervals for ``--seconds``, each report a new
oldest-work timestamp, cycling over all intervals. Then it times watermark reads over HTTP
(one round trip: the consumer's cost) and in the core (the authority's cost), and one
percentile read. Also the core alone, without HTTP, for reference.

Prints a table, writes ``bench/results/authority.json``, and with ``--update-docs``
replaces the "Authority" section of ``docs/performance.md`` (and nothing else).
MillWheel's target (§7.2): 500k intervals "with no loss in performance"; ours: >= 20k
reports/s at 10k intervals.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from watermark_authority import Authority, HttpWatermarkClient, RocksJournal  # noqa: E402
from watermark_authority.client import embedded_authority  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "authority.json"
DOCS = ROOT / "docs" / "performance.md"


def interval_names(n: int) -> list[str]:
    return [f"h{k:06x}" for k in range(n)]


def sustained_reports(url: str, computation: str, names: list[str], tokens: dict[str, int], *, seconds: float, batch: int, clients: int) -> dict:
    """Reports/s with ``clients`` threads each sending batches of ``batch`` reports."""
    stop = threading.Event()
    counts = [0] * clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    share = len(names) // clients

    def run(k: int) -> None:
        mine = names[k * share : (k + 1) * share] if clients > 1 else names
        with HttpWatermarkClient(url, timeout=30.0, retries=0) as c:
            ts, pos = 1_700_000_000_000, 0
            while not stop.is_set():
                chunk = [mine[(pos + i) % len(mine)] for i in range(batch)]
                pos = (pos + batch) % len(mine)
                ts += 1
                t0 = time.perf_counter()
                c.report_batch(computation, [(iv, tokens[iv], ts) for iv in chunk])
                latencies[k].append(time.perf_counter() - t0)
                counts[k] += batch

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    lat = sorted(x for xs in latencies for x in xs)
    return {
        "reports": sum(counts),
        "seconds": round(elapsed, 2),
        "reports_per_s": round(sum(counts) / elapsed),
        "batch": batch,
        "clients": clients,
        "batch_latency_ms_p50": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
        "batch_latency_ms_p99": round(lat[int(len(lat) * 0.99)] * 1000, 2) if lat else None,
    }


def time_calls(fn, n: int) -> dict:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return {"calls": n, "us_p50": round(samples[n // 2] * 1e6, 1), "us_p99": round(samples[int(n * 0.99)] * 1e6, 1), "us_mean": round(statistics.fmean(samples) * 1e6, 1)}


def core_only(n: int, seconds: float, batch: int) -> dict:
    """The core with a RocksDB journal, no HTTP: what the service's one thread can do."""
    with tempfile.TemporaryDirectory(prefix="wa-bench-core-") as d:
        a = Authority(RocksJournal(d))
        names = interval_names(n)
        tokens = a.acquire("core", names)
        ts, pos, count = 1_700_000_000_000, 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            chunk = [names[(pos + i) % n] for i in range(batch)]
            pos = (pos + batch) % n
            ts += 1
            a.report("core", [(iv, tokens[iv], ts, None) for iv in chunk])
            count += batch
        elapsed = time.perf_counter() - start
        read = time_calls(lambda: a.watermark("core"), 2_000)
        # a percentile read after a change (not cached): sorts every interval
        def pct_after_change() -> None:
            a.report("core", [(names[0], tokens[names[0]], ts + 1, None)])
            a.percentile_watermark("core", 99)

        pct = time_calls(pct_after_change, 20)
        a.close()
    return {"reports_per_s": round(count / elapsed), "watermark_read": read, "percentile_read_after_change": pct}


def run(args: argparse.Namespace) -> dict:
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "settings": {"seconds": args.seconds, "batch": args.batch, "clients": args.clients},
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="wa-bench-") as d, embedded_authority(d) as svc:
        for n in args.intervals:
            comp = f"bench-{n}"
            names = interval_names(n)
            wm = svc.client(timeout=60.0)
            t0 = time.perf_counter()
            tokens: dict[str, int] = {}
            for i in range(0, n, 10_000):
                tokens.update(wm.acquire_many(comp, names[i : i + 10_000]))
            acquire_s = time.perf_counter() - t0
            batched = sustained_reports(svc.url, comp, names, tokens, seconds=args.seconds, batch=args.batch, clients=args.clients)
            single = sustained_reports(svc.url, comp, names, tokens, seconds=min(3.0, args.seconds), batch=1, clients=1)
            http_read = time_calls(lambda comp=comp, wm=wm: wm.watermark(comp), 500)
            http_pct = time_calls(lambda comp=comp, wm=wm: wm.percentile_watermark(comp, 99), 50)
            core = core_only(n, min(3.0, args.seconds), args.batch)
            results["runs"][str(n)] = {
                "intervals": n,
                "acquire_all_s": round(acquire_s, 2),
                "batched": batched,
                "unbatched": single,
                "http_watermark_read": http_read,
                "http_percentile_read": http_pct,
                "core": core,
            }
            print(
                f"{n:>7} intervals: {batched['reports_per_s']:>8,} reports/s batched ({args.batch}/call, {args.clients} clients, "
                f"p50 {batched['batch_latency_ms_p50']} ms/call), {single['reports_per_s']:>6,} reports/s one per call; "
                f"read {http_read['us_p50']:.0f} us over HTTP, {core['watermark_read']['us_p50']:.1f} us in the core; "
                f"core alone {core['reports_per_s']:,} reports/s",
                flush=True,
            )
            wm.close()
    return results


def markdown(results: dict) -> str:
    s = results["settings"]
    m = results["machine"]
    lines = [
        "## Authority",
        "",
        "The central low-watermark authority (`watermark_authority/`, MillWheel §7.2), measured by",
        f"`bench/authority_bench.py` on {m['cpus']} cores, Python {m['python']}: the real service on loopback",
        "(Starlette + uvicorn, one event-loop thread, RocksDB journal written before every answer),",
        f"{s['clients']} client threads sending `report_batch` calls of {s['batch']} intervals for {s['seconds']} s,",
        "each report a new timestamp, cycling over every interval. Raw figures: `bench/results/authority.json`.",
        "",
        "| intervals | reports/s, batched | ms per batch call (p50 / p99) | reports/s, one per call | watermark read over HTTP (p50) | watermark read in the core (p50) | 99% watermark read over HTTP (p50) | core alone, reports/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["runs"].values():
        b, u, c = r["batched"], r["unbatched"], r["core"]
        lines.append(
            f"| {r['intervals']:,} | {b['reports_per_s']:,} | {b['batch_latency_ms_p50']} / {b['batch_latency_ms_p99']} | {u['reports_per_s']:,} "
            f"| {r['http_watermark_read']['us_p50']:.0f} µs | {c['watermark_read']['us_p50']:.1f} µs | {r['http_percentile_read']['us_p50']:.0f} µs "
            f"| {c['reports_per_s']:,} |"
        )
    lines += [
        "",
        "Target: ≥ 20k reports/s at 10k intervals. A watermark read is O(1) in the number of",
        "intervals (a heap with lazy deletion), so 100k intervals cost about what 10k do, which is",
        "the property MillWheel reports at 500k (\"with no loss in performance\"). What limits the",
        "rate is per-report Python work in one thread (JSON decoding, token check, journal encoding),",
        "not the interval count; one report per HTTP call is bounded by the round trip, which is why",
        "the runtime reports all its intervals of a micro-batch in one `report_batch`. The p99",
        "batch latency includes RocksDB flushes and the two client threads sharing the two cores",
        "with the service.",
        "",
        "A percentile read sorts the intervals after each change and is cached until the next:",
    ]
    for r in results["runs"].values():
        c = r["core"]["percentile_read_after_change"]
        lines.append(f"{c['us_p50'] / 1000:.1f} ms at {r['intervals']:,} intervals (core, p50); acquiring all {r['intervals']:,} over HTTP took {r['acquire_all_s']} s.")
    lines += [
        "The dashboard asks for one 99% watermark per computation per second.",
        "",
    ]
    return "\n".join(lines)


def update_docs(section: str) -> None:
    """Replace (or add) the '## Authority' section of docs/performance.md, leaving the rest alone."""
    text = DOCS.read_text(encoding="utf-8") if DOCS.exists() else "# Performance\n\n"
    pattern = re.compile(r"^## Authority\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOCS.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--intervals", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of sustained reports per interval count")
    p.add_argument("--batch", type=int, default=1_000, help="reports per report_batch call")
    p.add_argument("--clients", type=int, default=2, help="client threads sending reports")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--update-docs", action="store_true", help="replace the Authority section of docs/performance.md")
    p.add_argument("--docs-only", action="store_true", help="do not measure: rewrite the docs section from --results")
    args = p.parse_args(argv)
    if args.docs_only:
        update_docs(markdown(json.loads(Path(args.results).read_text(encoding="utf-8"))))
        print(f"updated the Authority section of {DOCS} from {args.results}")
        return 0
    results = run(args)
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {args.results}")
    if args.update_docs:
        update_docs(markdown(results))
        print(f"updated the Authority section of {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
