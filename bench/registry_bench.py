"""Benchmark the IdRegistry: conditional commits/s with server-side batching, per backend.

    .venv/bin/python bench/registry_bench.py                      # every scenario, 8 s each
    .venv/bin/python bench/registry_bench.py --seconds 5 --skip-etcd

Scenarios (fresh click ids, one token per client thread, event times of now):

* ``core`` — :class:`id_registry.Registry` on RocksDB (fsync'd write batches) in this
  process, ``commit_many`` of ``--batch`` items in a loop: the ceiling without HTTP;
* ``embedded`` — the real service (``python -m id_registry serve``: loopback, the bearer
  secret, RocksDB, one fsync'd write batch per group), ``--procs`` client processes of
  ``--threads`` threads each sending ``commit_many`` of ``--batch`` items (a micro-batch
  of a Spark task) for ``--seconds``;
* ``embedded_small`` — the same service, 32 threads sending 100 items per call: how many
  requests server-side batching folds into one durable write;
* ``etcd`` — the service on the etcd backend, three etcd members on loopback (Raft: every
  transaction is on a majority's disk), the ``embedded`` client load with ``--etcd-batch``
  items per call; ``etcd_1024`` the same with etcd's ``--max-txn-ops`` raised from 128 to
  1024 (fewer, larger transactions). Skipped if etcd is not installed.

Prints a table and writes ``bench/results/registry.json``. Target: >= 50k commits/s on the
embedded backend on 2 cores. The clients run on the same machine and share its cores with
the service.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from id_registry import Registry, RocksBackend  # noqa: E402
from id_registry.client import HttpRegistryClient, start_registry  # noqa: E402
from id_registry.testing import LocalEtcdCluster, etcd_binary  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "registry.json"


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by processes ``pids`` (all their threads), from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def percentiles_ms(samples: list[float]) -> dict[str, Any]:
    lat = sorted(samples)
    if not lat:
        return {"calls": 0, "ms_p50": None, "ms_p99": None}
    return {
        "calls": len(lat),
        "ms_p50": round(lat[len(lat) // 2] * 1000, 2),
        "ms_p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2),
    }


def bench_core(batch: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="registry-bench-") as d:
        registry = Registry(RocksBackend(d))
        n = calls = 0
        latencies = []
        cpu = 0.0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            now = wall_ms()
            items = [(f"core-{calls}-{i:06d}", "joiner-core", now) for i in range(batch)]
            t0, c0 = time.perf_counter(), time.process_time()
            n += sum(r.committed for r in registry.commit_many(items))
            latencies.append(time.perf_counter() - t0)
            cpu += time.process_time() - c0
            calls += 1
        elapsed = time.perf_counter() - started
        writes = registry.backend.writes
        registry.close()
    return {
        "commits_per_s": round(n / elapsed),
        "commits": n,
        "seconds": round(elapsed, 2),
        "durable_writes": writes,
        "server_cpu_us_per_commit": round(cpu / max(1, n) * 1e6, 2),
        "commits_per_server_core_s": round(n / max(cpu, 1e-9)),
        **percentiles_ms(latencies),
    }


def _client_process(
    url: str,
    secret: str,
    name: str,
    threads: int,
    batch: int,
    seconds: float,
    start_at: float,
    out: Any,
    patience: float = 0.0,
) -> None:
    """One client process: ``threads`` threads sending ``commit_many`` of ``batch`` fresh ids until the deadline."""
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        committed = calls = other = 0
        latencies = []
        with HttpRegistryClient(
            url, secret=secret, timeout=60.0, throttle_timeout=60.0, patience=patience
        ) as c:
            while time.time() < start_at:
                time.sleep(0.001)
            while time.time() < start_at + seconds:
                now = wall_ms()
                items = [
                    (f"{name}-{k}-{calls}-{i:06d}", f"joiner-{name}-{k}", now) for i in range(batch)
                ]
                t0 = time.perf_counter()
                answers = c.commit_many(items)
                latencies.append(time.perf_counter() - t0)
                calls += 1
                ok = sum(r.committed for r in answers)
                committed += ok
                other += len(answers) - ok
            throttled = c.throttled
        with lock:
            results.append(
                {
                    "committed": committed,
                    "calls": calls,
                    "not_committed": other,
                    "latencies": latencies,
                    "throttled": throttled,
                    "ended": time.time(),
                }
            )

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    while time.time() < start_at:
        time.sleep(0.001)
    cpu_start = time.process_time()
    for w in workers:
        w.join()
    results[0]["cpu"] = time.process_time() - cpu_start
    out.put(results)


def load(
    url: str,
    secret: str,
    *,
    procs: int,
    threads: int,
    batch: int,
    seconds: float,
    patience: float = 0.0,
) -> dict[str, Any]:
    """``procs`` client processes of ``threads`` threads each for ``seconds``; commits/s over the whole run."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0  # every process imported and connected before the clock starts
    ps = [
        ctx.Process(
            target=_client_process,
            args=(
                url,
                secret,
                f"p{p}-{time.monotonic_ns()}",
                threads,
                batch,
                seconds,
                start_at,
                out,
                patience,
            ),
        )
        for p in range(procs)
    ]
    for p in ps:
        p.start()
    rows = [row for _ in ps for row in out.get(timeout=seconds + 120)]
    for p in ps:
        p.join(30)
    elapsed = max(r["ended"] for r in rows) - start_at
    committed = sum(r["committed"] for r in rows)
    client_cpu = sum(r.get("cpu", 0.0) for r in rows)
    latencies = [x for r in rows for x in r["latencies"]]
    return {
        "commits_per_s": round(committed / elapsed),
        "commits": committed,
        "not_committed": sum(r["not_committed"] for r in rows),
        "seconds": round(elapsed, 2),
        "clients": procs * threads,
        "batch": batch,
        "throttled_retries": sum(r["throttled"] for r in rows),
        "client_cpu_us_per_commit": round(client_cpu / max(1, committed) * 1e6, 2),
        **percentiles_ms(latencies),
    }


def with_server_figures(
    result: dict[str, Any], before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    requests = after["stats"]["requests"] - before["stats"]["requests"]
    writes = after["backend"]["durable_writes"] - before["backend"]["durable_writes"]
    result.update(
        requests=requests,
        durable_writes=writes,
        requests_per_durable_write=round(requests / max(1, writes), 2),
        items_per_durable_write=round(result["commits"] / max(1, writes)),
        group_sizes={
            k: n - before["stats"]["group_sizes"].get(k, 0)
            for k, n in after["stats"]["group_sizes"].items()
            if n > before["stats"]["group_sizes"].get(k, 0)
        },
    )
    if "txns" in after["backend"]:
        result["etcd_txns"] = after["backend"]["txns"] - before["backend"]["txns"]
    return result


def bench_service(
    extra_args: list[str], runs: list[dict[str, Any]], store_pids: list[int] | None = None
) -> list[dict[str, Any]]:
    """The service with ``extra_args`` under each client load of ``runs``; with the CPU the service
    (and ``store_pids``, etcd's members) spent per commit, whatever else the machine was doing."""
    with tempfile.TemporaryDirectory(prefix="registry-bench-") as d:
        svc = start_registry(d, extra_args=extra_args)
        try:
            secret = svc.secret.reveal() if svc.secret else ""
            with svc.client(timeout=60.0) as c:
                out = []
                for run in runs:
                    before = c.status()
                    cpu = cpu_seconds([svc.pid]), cpu_seconds(store_pids or [])
                    result = load(svc.url, secret, **run)
                    used = cpu_seconds([svc.pid]) - cpu[0], cpu_seconds(store_pids or []) - cpu[1]
                    result["server_cpu_us_per_commit"] = round(
                        used[0] / max(1, result["commits"]) * 1e6, 2
                    )
                    result["server_cpu_share"] = round(
                        used[0] / result["seconds"], 2
                    )  # cores the service got
                    result["commits_per_server_core_s"] = round(
                        result["commits"] / max(used[0], 1e-9)
                    )
                    if store_pids:
                        result["etcd_cpu_us_per_commit"] = round(
                            used[1] / max(1, result["commits"]) * 1e6, 2
                        )
                    out.append(with_server_figures(result, before, c.status()))
                return out
        finally:
            svc.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument(
        "--batch", type=int, default=5_000, help="items per commit_many call (a micro-batch)"
    )
    p.add_argument("--procs", type=int, default=2, help="client processes")
    p.add_argument("--threads", type=int, default=2, help="threads per client process")
    p.add_argument("--etcd-batch", type=int, default=2_000)
    p.add_argument("--skip-etcd", action="store_true")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument(
        "--patience",
        type=float,
        default=0.0,
        help="the clients' patience (s): a pipeline's clients wait out outages (600)",
    )
    args = p.parse_args(argv)

    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_1min_at_start": round(os.getloadavg()[0], 2),
        },
        "settings": {
            "seconds": args.seconds,
            "batch": args.batch,
            "procs": args.procs,
            "threads": args.threads,
            "etcd_batch": args.etcd_batch,
            "patience": args.patience,
        },
    }
    print(f"core (RocksDB, fsync, in process, {args.batch} items per call) ...", flush=True)
    results["core"] = bench_core(args.batch, args.seconds)
    print(
        f"embedded service (RocksDB, fsync; {args.procs}x{args.threads} clients x {args.batch} items; then 32 x 100) ...",
        flush=True,
    )
    big = {
        "procs": args.procs,
        "threads": args.threads,
        "batch": args.batch,
        "seconds": args.seconds,
        "patience": args.patience,
    }
    small = {
        "procs": 2,
        "threads": 16,
        "batch": 100,
        "seconds": args.seconds,
        "patience": args.patience,
    }
    results["embedded"], results["embedded_small"] = bench_service([], [big, small])
    if args.skip_etcd or etcd_binary() is None:
        results["etcd"] = results["etcd_1024"] = {
            "skipped": "etcd is not installed" if etcd_binary() is None else "--skip-etcd"
        }
    else:
        print(
            f"etcd service (three members on loopback; {args.procs}x{args.threads} clients x {args.etcd_batch} items) ...",
            flush=True,
        )
        for name, ops in (("etcd", None), ("etcd_1024", 1024)):
            cluster_args = ["--max-txn-ops", str(ops)] if ops else []
            with (
                tempfile.TemporaryDirectory(prefix="registry-bench-etcd-") as d,
                LocalEtcdCluster(d, extra_args=cluster_args) as cluster,
            ):
                endpoints = [a for e in cluster.endpoints for a in ("--etcd-endpoint", e)]
                registry_args = ["--etcd-max-txn-ops", str(ops)] if ops else []
                pids = [p.pid for p in cluster.processes if p is not None]
                results[name] = bench_service(
                    ["--backend", "etcd", *endpoints, *registry_args],
                    [{**big, "batch": args.etcd_batch}],
                    pids,
                )[0]
                results[name].update(members=len(cluster.endpoints), max_txn_ops=ops or 128)
    results["machine"]["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)

    print()
    print(
        f"{'scenario':<16} {'commits/s':>10} {'clients x items':>16} {'ms/call p50':>12} {'p99':>8} {'requests/write':>15} {'items/write':>12} {'server CPU us/commit':>21} {'per server core':>16}"
    )
    for name in ("core", "embedded", "embedded_small", "etcd", "etcd_1024"):
        r = results[name]
        if "skipped" in r:
            print(f"{name:<16} skipped: {r['skipped']}")
            continue
        shape = f"{r.get('clients', 1)} x {r.get('batch', args.batch)}"
        print(
            f"{name:<16} {r['commits_per_s']:>10,} {shape:>16} {r['ms_p50']:>12} {r['ms_p99']:>8} "
            f"{r.get('requests_per_durable_write', '-'):>15} {r.get('items_per_durable_write', '-'):>12} "
            f"{r.get('server_cpu_us_per_commit', '-'):>21} {r.get('commits_per_server_core_s', '-'):>16}"
        )
    print(
        f"load average (1 min): {results['machine']['load_average_1min_at_start']} at start, {results['machine']['load_average_1min_at_end']} at end"
    )
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
