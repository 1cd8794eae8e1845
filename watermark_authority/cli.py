"""``millwheel authority ...``: run the low-watermark authority, or ask one for its watermarks.

    millwheel authority serve [--port 7300] [--host 127.0.0.1] [--data-dir .millwheel/authority] [--sync]
    millwheel authority watermarks [--url http://127.0.0.1:7300]

The dashboard is at the service's root URL.
"""

from __future__ import annotations

import argparse
import json
import sys

from watermark_authority._errors import AuthorityError

DEFAULT_PORT = 7300
DEFAULT_DATA_DIR = ".millwheel/authority"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="millwheel authority", description="the central low-watermark authority (MillWheel §7.2)")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the authority service and its dashboard")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: loopback only; the service has no authentication)")
    s.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"where the RocksDB journal lives (default {DEFAULT_DATA_DIR})")
    s.add_argument("--sync", action="store_true", help="fsync the journal on every write (survives machine crashes, slower)")
    s.add_argument("--sample-interval", type=float, default=1.0, help="seconds between dashboard samples (default 1)")
    s.add_argument("--history", type=float, default=600.0, help="seconds of samples the dashboard keeps (default 600)")
    s.add_argument("--ready-file", help="write the service URL to this file once it is listening")
    s.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    w = sub.add_parser("watermarks", help="print the published watermarks of a running authority")
    w.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    w.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``millwheel authority ARGS...``; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        from watermark_authority._server import serve

        if not 0 <= args.port <= 65535:
            print(f"millwheel authority: --port must be in 0..65535, got {args.port}", file=sys.stderr)
            return 2
        if args.sample_interval <= 0 or args.history <= 0:
            print("millwheel authority: --sample-interval and --history must be > 0", file=sys.stderr)
            return 2
        return serve(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            sync=args.sync,
            ready_file=args.ready_file,
            sample_interval=args.sample_interval,
            history_seconds=args.history,
            log_level=args.log_level,
        )
    from watermark_authority._core import summarize
    from watermark_authority.client import HttpWatermarkClient

    try:
        with HttpWatermarkClient(args.url, retries=1) as client:
            marks = client.watermarks()
    except AuthorityError as exc:
        print(f"millwheel authority: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(marks, indent=2, sort_keys=True) if args.json else summarize(marks))
    return 0
