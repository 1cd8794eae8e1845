"""Benchmark the low-watermark authority: sustained reports/s, and how long a read waits.

    .venv/bin/python bench/authority_bench.py                       # 10k and 100k intervals, 10 s each
    .venv/bin/python bench/authority_bench.py --intervals 10000 --seconds 5 --update-docs

Starts the real service (``python -m watermark_authority serve``, RocksDB journal, loopback
only, the bearer secret of an embedded authority sent with every write) and, per interval
count: acquires every interval, then has ``--clients`` threads send ``report_batch`` calls
of ``--batch`` intervals for ``--seconds``, each report a new oldest-work timestamp,
cycling over all intervals. Then it times watermark reads over HTTP (one round trip: the
consumer's cost) idle and *while* the same report stream runs (a reader polling every
5 ms: how long a read queues behind writes), and one percentile read. Also the core
alone, without HTTP, for reference.

Prints a table, writes ``bench/results/authority.json``, and with ``--update-docs``
replaces the "Performance" section of ``docs/authority.md`` (and nothing else); a
``bench/results/authority_before.json`` (the same bench run on an older tree) is shown
beside it as the baseline. MillWheel's target (§7.2): 500k intervals "with no loss in
performance"; ours: >= 20k reports/s at 10k intervals.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from watermark_authority import Authority, RocksJournal  # noqa: E402
from watermark_authority.client import embedded_authority  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "authority.json"
BASELINE = ROOT / "bench" / "results" / "authority_before.json"
DOCS = ROOT / "docs" / "authority.md"


def interval_names(n: int) -> list[str]:
    return [f"interval-{k}" for k in range(n)]


def percentiles_ms(samples: list[float]) -> dict[str, Any]:
    lat = sorted(samples)
    if not lat:
        return {"calls": 0, "ms_p50": None, "ms_p99": None, "ms_max": None}
    return {
        "calls": len(lat),
        "ms_p50": round(lat[len(lat) // 2] * 1000, 2),
        "ms_p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2),
        "ms_max": round(lat[-1] * 1000, 2),
    }


class ReportStream:
    """``clients`` threads sending ``report_batch`` calls of ``batch`` reports until stopped."""

    def __init__(
        self,
        svc: Any,
        computation: str,
        names: list[str],
        tokens: dict[str, int],
        *,
        batch: int,
        clients: int,
    ) -> None:
        self.svc, self.computation, self.names, self.tokens = svc, computation, names, tokens
        self.batch, self.clients = batch, clients
        self.stop = threading.Event()
        self.counts = [0] * clients
        self.latencies: list[list[float]] = [[] for _ in range(clients)]
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(k,)) for k in range(clients)]
        self.start = self.elapsed = 0.0

    def _run(self, k: int) -> None:
        share = len(self.names) // self.clients
        mine = self.names[k * share : (k + 1) * share] if self.clients > 1 else self.names
        with self.svc.client(timeout=30.0, retries=0) as c:
            ts, pos = 1_700_000_000_000, 0
            while not self.stop.is_set():
                chunk = [mine[(pos + i) % len(mine)] for i in range(self.batch)]
                pos = (pos + self.batch) % len(mine)
                ts += 1
                t0 = time.perf_counter()
                try:
                    c.report_batch(self.computation, [(iv, self.tokens[iv], ts) for iv in chunk])
                except Exception as exc:  # report it, stop this thread
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    return
                self.latencies[k].append(time.perf_counter() - t0)
                self.counts[k] += self.batch

    def __enter__(self) -> ReportStream:
        self.start = time.perf_counter()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        self.elapsed = time.perf_counter() - self.start
        if self.errors:
            msg = f"report stream failed: {self.errors[0]}"
            raise RuntimeError(msg)

    def summary(self) -> dict[str, Any]:
        lat = percentiles_ms([x for xs in self.latencies for x in xs])
        return {
            "reports": sum(self.counts),
            "seconds": round(self.elapsed, 2),
            "reports_per_s": round(sum(self.counts) / self.elapsed),
            "batch": self.batch,
            "clients": self.clients,
            "batch_latency_ms_p50": lat["ms_p50"],
            "batch_latency_ms_p99": lat["ms_p99"],
        }


def time_calls(fn: Any, n: int) -> dict[str, Any]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return {
        "calls": n,
        "us_p50": round(samples[n // 2] * 1e6, 1),
        "us_p99": round(samples[int(n * 0.99)] * 1e6, 1),
        "us_mean": round(statistics.fmean(samples) * 1e6, 1),
    }


def reads_under_load(
    svc: Any,
    computation: str,
    names: list[str],
    tokens: dict[str, int],
    *,
    seconds: float,
    batch: int,
    clients: int,
) -> dict[str, Any]:
    """Watermark read latency over HTTP, idle and while ``clients`` threads stream report batches.

    The reader polls every 5 ms (a consumer refreshing its input low watermark), so the
    reads themselves do not load the service; what they measure is how long a read waits
    behind the writes.
    """
    with svc.client(timeout=30.0, retries=0) as reader:
        idle: list[float] = []
        for _ in range(300):
            t0 = time.perf_counter()
            reader.watermark(computation)
            idle.append(time.perf_counter() - t0)
        loaded: list[float] = []
        with ReportStream(svc, computation, names, tokens, batch=batch, clients=clients) as stream:
            time.sleep(0.3)  # let the stream start
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                reader.watermark(computation)
                loaded.append(time.perf_counter() - t0)
                time.sleep(0.005)
    return {
        "idle": percentiles_ms(idle),
        "under_load": percentiles_ms(loaded),
        "stream": stream.summary(),
    }


def core_only(n: int, seconds: float, batch: int) -> dict[str, Any]:
    """The core with a RocksDB journal, no HTTP: what the service's writer thread can do."""
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
    return {
        "reports_per_s": round(count / elapsed),
        "watermark_read": read,
        "percentile_read_after_change": pct,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "settings": {"seconds": args.seconds, "batch": args.batch, "clients": args.clients},
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="wa-bench-") as d, embedded_authority(d) as svc:
        results["settings"]["authentication"] = bool(getattr(svc, "secret", None))
        for n in args.intervals:
            comp = f"bench-{n}"
            names = interval_names(n)
            wm = svc.client(timeout=60.0)
            t0 = time.perf_counter()
            tokens: dict[str, int] = {}
            for i in range(0, n, 10_000):
                tokens.update(wm.acquire_many(comp, names[i : i + 10_000]))
            acquire_s = time.perf_counter() - t0
            with ReportStream(
                svc, comp, names, tokens, batch=args.batch, clients=args.clients
            ) as batched_stream:
                time.sleep(args.seconds)
            batched = batched_stream.summary()
            with ReportStream(svc, comp, names, tokens, batch=1, clients=1) as single_stream:
                time.sleep(min(3.0, args.seconds))
            single = single_stream.summary()
            reads = reads_under_load(
                svc,
                comp,
                names,
                tokens,
                seconds=min(5.0, args.seconds),
                batch=args.batch,
                clients=args.clients,
            )
            http_read = time_calls(lambda comp=comp, wm=wm: wm.watermark(comp), 500)
            http_pct = time_calls(lambda comp=comp, wm=wm: wm.percentile_watermark(comp, 99), 50)
            core = core_only(n, min(3.0, args.seconds), args.batch)
            results["runs"][str(n)] = {
                "intervals": n,
                "acquire_all_s": round(acquire_s, 2),
                "batched": batched,
                "unbatched": single,
                "reads_under_load": reads,
                "http_watermark_read": http_read,
                "http_percentile_read": http_pct,
                "core": core,
            }
            load = reads["under_load"]
            print(
                f"{n:>7} intervals: {batched['reports_per_s']:>8,} reports/s batched ({args.batch}/call, {args.clients} clients, "
                f"p50 {batched['batch_latency_ms_p50']} ms/call), {single['reports_per_s']:>6,} reports/s one per call; "
                f"read {http_read['us_p50']:.0f} us over HTTP idle, {load['ms_p50']} / {load['ms_p99']} ms (p50/p99) under "
                f"{reads['stream']['reports_per_s']:,} reports/s; {core['watermark_read']['us_p50']:.1f} us in the core; "
                f"core alone {core['reports_per_s']:,} reports/s",
                flush=True,
            )
            wm.close()
    results["machine"]["load_average_1min_at_end"] = round(
        os.getloadavg()[0], 2
    )  # other work on a shared machine
    return results


def markdown(results: dict[str, Any], baseline: dict[str, Any] | None = None) -> str:
    s = results["settings"]
    m = results["machine"]
    auth = (
        "with the bearer secret checked on every write"
        if s.get("authentication")
        else "without authentication"
    )
    load = m.get("load_average_1min_at_end")
    busy = (
        f" (load average {load} at the end of the run: other jobs shared the machine)"
        if load is not None
        else ""
    )
    lines = [
        "## Performance",
        "",
        f"Measured by `bench/authority_bench.py` on {m['cpus']} cores{busy}, Python {m['python']}: the real",
        "service on loopback (Starlette + uvicorn; requests parsed on the event loop, writes applied",
        f"by one writer thread, RocksDB journal written before every answer), {auth},",
        f"{s['clients']} client threads sending `report_batch` calls of {s['batch']} key intervals for",
        f"{s['seconds']} s, each report a new timestamp, cycling over every key interval. Raw figures:",
        "`bench/results/authority.json`.",
        "",
        "| key intervals | reports/s, batched | ms per batch call (p50 / p99) | reports/s, one per call | watermark read over HTTP, idle (p50) | watermark read in the core (p50) | 99% watermark read over HTTP (p50) | core alone, reports/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["runs"].values():
        b, u, c = r["batched"], r["unbatched"], r["core"]
        lines.append(
            f"| {r['intervals']:,} | {b['reports_per_s']:,} | {b['batch_latency_ms_p50']} / {b['batch_latency_ms_p99']} | {u['reports_per_s']:,} "
            f"| {r['http_watermark_read']['us_p50']:.0f} µs | {c['watermark_read']['us_p50']:.1f} µs | {r['http_percentile_read']['us_p50']:.0f} µs "
            f"| {c['reports_per_s']:,} |"
        )
    if baseline is not None:
        rates = ", ".join(
            f"{r['batched']['reports_per_s']:,} at {r['intervals']:,}"
            for r in baseline["runs"].values()
        )
        lines += [
            "",
            f"The same bench on {baseline.get('commit', 'the older tree')} (no authentication, everything on the event loop), run just before: {rates} key intervals, batched reports/s.",
        ]
    lines += [
        "",
        "**A read under a stream of writes.** A reader polls the watermark every 5 ms while the",
        "client threads stream batches of reports (the same batches as above):",
        "",
        "| key intervals | version | read idle, p50 / p99 | read under load, p50 / p99 / max | reports/s meanwhile |",
        "|---:|---|---:|---:|---:|",
    ]
    before = (
        "before"
        if baseline is None
        else f"before ({baseline.get('commit', 'an older tree')}: reads on the loop behind writes)"
    )
    for label, res in ((before, baseline), ("now (snapshot reads, writer thread)", results)):
        if res is None:
            continue
        for r in res["runs"].values():
            rl = r.get("reads_under_load")
            if rl is None:
                continue
            i, lo = rl["idle"], rl["under_load"]
            lines.append(
                f"| {r['intervals']:,} | {label} | {i['ms_p50']} / {i['ms_p99']} ms | {lo['ms_p50']} / {lo['ms_p99']} / {lo['ms_max']} ms "
                f"| {rl['stream']['reports_per_s']:,} |"
            )
    lines += [
        "",
        "Target: ≥ 20k reports/s at 10k key intervals. A watermark read is O(1) in the number of",
        "key intervals (a heap with lazy deletion in the core; a snapshot dictionary in the",
        "service), so 100k intervals cost about what 10k do, which is the property MillWheel",
        'reports at 500k ("with no loss in performance"). What limits the rate is per-report',
        "Python work (JSON decoding, token check, journal encoding), not the interval count; one",
        "report per HTTP call is bounded by the round trip, which is why the runtime reports all",
        "its key intervals of a micro-batch in one `report_batch`; a single report pays the hop to the",
        "writer thread and back.",
        "",
        "Before, a read ran on the event loop behind every queued write (JSON decoding, the core,",
        "the journal). Now no read waits for a write to be applied: it is answered from the",
        "published snapshot (`test_authority_reads` stalls a journal write and reads meanwhile).",
        "What a read still shares is the interpreter lock and the two cores with the writer thread",
        "and the client threads: each time the loop thread needs the lock back (after each socket",
        "call) it waits up to the interpreter's switch interval, which the service shortens from",
        "5 ms to 1 ms (measured: 5 ms gave a p50 of ~9 ms under the same load, 0.2 ms hardly better",
        "than 1 ms and fewer reports/s). Figures on a shared 2-core machine vary from run to run;",
        "the two rows of a table were measured back to back.",
        "",
        "A percentile read sorts the key intervals after each change and is cached until the next:",
    ]
    for r in results["runs"].values():
        c = r["core"]["percentile_read_after_change"]
        lines.append(
            f"{c['us_p50'] / 1000:.1f} ms at {r['intervals']:,} key intervals (core, p50); acquiring all {r['intervals']:,} over HTTP took {r['acquire_all_s']} s."
        )
    lines += [
        "The dashboard asks for one 99% watermark per computation per second.",
        "",
    ]
    return "\n".join(lines)


def update_docs(section: str) -> None:
    """Replace (or add) the '## Performance' section of docs/authority.md, leaving the rest alone."""
    text = DOCS.read_text(encoding="utf-8")
    pattern = re.compile(r"^## Performance\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOCS.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--intervals", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="seconds of sustained reports per interval count",
    )
    p.add_argument("--batch", type=int, default=1_000, help="reports per report_batch call")
    p.add_argument("--clients", type=int, default=2, help="client threads sending reports")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument(
        "--baseline", default=str(BASELINE), help="an earlier run shown beside this one in the docs"
    )
    p.add_argument(
        "--update-docs",
        action="store_true",
        help="replace the Performance section of docs/authority.md",
    )
    p.add_argument(
        "--docs-only",
        action="store_true",
        help="do not measure: rewrite the docs section from --results",
    )
    args = p.parse_args(argv)
    baseline = (
        json.loads(Path(args.baseline).read_text(encoding="utf-8"))
        if Path(args.baseline).exists()
        else None
    )
    if args.docs_only:
        update_docs(markdown(json.loads(Path(args.results).read_text(encoding="utf-8")), baseline))
        print(f"updated the Performance section of {DOCS} from {args.results}")
        return 0
    results = run(args)
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {args.results}")
    if args.update_docs:
        update_docs(markdown(results, baseline))
        print(f"updated the Performance section of {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
