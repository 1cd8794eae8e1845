"""The driver process faults are injected into: runs the ledger topology on Spark until drained.

    python -m faults.driver RUN DATA [--authority URL] [--master M] [--max-bytes N] [--per-trigger N]
                                     [--timeout S] [--faketime FILE] [--follow]

Exit status 0 once drained ("DRAINED" printed); a fenced zombie exits 3 with the reason;
anything else that stops the run exits 1 with the error (a full disk names the device and
says how to resume). ``--faketime FILE`` starts Spark's JVM (and so its Python workers)
under Debian's libfaketime, reading the clock offset from FILE: write ``+3600s`` into it and
the JVM's wall clock jumps an hour ahead (``faults/inject.py``, ``ClockJump``). The driver's
own Python process keeps the real clock.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Iterator

from millwheel import MillwheelError
from millwheel.runtime import disk_full

FENCED_EXIT = 3
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes and contexts."""
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def _in_chain(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of type ``kind`` in ``exc``'s chain."""
    return next((e for e in _chain(exc) if isinstance(e, kind)), None)


def _disk_full(exc: BaseException) -> bool:
    return any(
        (isinstance(e, OSError) and e.errno == errno.ENOSPC) or disk_full(e) is not None
        for e in _chain(exc)
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.driver")
    p.add_argument("run")
    p.add_argument("data")
    p.add_argument(
        "--authority",
        default=None,
        help="URL of a running watermark authority (default: one in this process)",
    )
    p.add_argument("--master", default="local[2]")
    p.add_argument("--intervals", type=int, default=4)
    p.add_argument("--max-bytes", type=int, default=600_000, help="log bytes per injector batch")
    p.add_argument("--per-trigger", type=int, default=2, help="stream files per computation batch")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--faketime", default=None, help="libfaketime offset file for the JVM")
    p.add_argument(
        "--follow",
        action="store_true",
        help="the input directory is complete once _DONE appears (input written in chunks while it runs)",
    )
    p.add_argument(
        "--injector",
        choices=["spark", "driver"],
        default="spark",
        help="who reads the logs: a Spark query (LogFileSource) or the driver",
    )
    args = p.parse_args(argv)
    if args.faketime:
        if not os.path.exists(LIBFAKETIME):
            print(
                f"faults.driver: --faketime needs {LIBFAKETIME} (apt-get install faketime)",
                file=sys.stderr,
            )
            return 2
        # inherited by the JVM spark-submit starts; this process keeps the real clock, and so do
        # Spark's Python workers (spark.executorEnv below): under libfaketime their socket
        # timeouts misfire ("Python worker failed to connect back")
        os.environ.update(
            LD_PRELOAD=LIBFAKETIME,
            FAKETIME_TIMESTAMP_FILE=args.faketime,
            FAKETIME_CACHE_DURATION="1",
        )
    from faults.ledger import build
    from millwheel.runtime import FencedError, RuntimeSettings, SparkRuntime
    from watermark_authority.client import HttpWatermarkClient, client_secret

    topo = build(
        args.data,
        max_bytes=args.max_bytes,
        in_driver=args.injector == "driver",
        finite=not args.follow,
    )
    settings = RuntimeSettings(
        drain=not args.follow,
        intervals=args.intervals,
        master=args.master,
        max_files_per_trigger=args.per_trigger,
    )
    watermarks = None
    if args.authority:
        # patient: an authority killed -9 and restarted comes back within a few seconds
        watermarks = HttpWatermarkClient(
            args.authority, secret=client_secret(None, data_dir=None), retries=12, backoff=0.1
        )
    from millwheel.runtime import spark_session

    # the checker maps every input file to the batch that consumed it: keep every batch's offsets
    conf = {"spark.sql.streaming.minBatchesToRetain": "1000000"}
    if args.faketime:
        conf["spark.executorEnv.LD_PRELOAD"] = ""
    spark = spark_session(args.master, conf=conf)
    os.environ.pop(
        "LD_PRELOAD", None
    )  # the JVM has started with it; nothing else started from here gets it
    rt = SparkRuntime(
        topo,
        args.run,
        settings,
        spark=spark,
        watermarks=watermarks,
        log=lambda m: print(m, flush=True),
    )
    try:
        rt.run(timeout_s=args.timeout)
    except FencedError as exc:
        print(f"FENCED: {exc}", flush=True)
        return FENCED_EXIT
    except Exception as exc:
        fenced = _in_chain(exc, FencedError)
        if (
            fenced is not None
        ):  # fenced, then something failed while stopping (e.g. a write refused)
            print(
                f"FENCED: {fenced} (then, while stopping: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})",
                flush=True,
            )
            return FENCED_EXIT
        if _disk_full(exc):
            print(
                f"DISK FULL: the run directory {args.run} (or Spark's) has no space left: {str(exc).splitlines()[0][:300]}; "
                "free space, then run again with the same run directory to resume",
                flush=True,
            )
            return 1
        if isinstance(exc, MillwheelError):
            print(f"STOPPED: {exc}", flush=True)
            return 1
        raise
    print("DRAINED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
