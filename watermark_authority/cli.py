"""``millwheel authority ...``: run the low-watermark authority, or ask one for its watermarks.

    millwheel authority serve [--port 7300] [--host 127.0.0.1] [--data-dir .millwheel/authority]
                              [--secret-file FILE] [--allow-host NAME ...] [--allow-origin ORIGIN ...]
                              [--ssl-certfile PEM --ssl-keyfile PEM] [--sync] [--dashboard-source ORIGIN ...]
    millwheel authority watermarks [--url http://127.0.0.1:7300]

The dashboard is at the service's root URL. Every write needs the service's secret
(``--secret-file``, ``$MILLWHEEL_AUTHORITY_SECRET``, or ``DATA_DIR/secret``, generated on the
first start); reading watermarks does not.
"""

from __future__ import annotations

import argparse
import json
import sys

from watermark_authority._errors import AuthorityError

DEFAULT_PORT = 7300
DEFAULT_DATA_DIR = ".millwheel/authority"


def _parser() -> argparse.ArgumentParser:
    from servicekit.cli import add_serve_arguments
    from watermark_authority.client import SERVICE

    parser = argparse.ArgumentParser(
        prog="millwheel authority",
        description="the central low-watermark authority (MillWheel §7.2)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the authority service and its dashboard")
    add_serve_arguments(
        s,
        SERVICE,
        default_port=DEFAULT_PORT,
        default_data_dir=DEFAULT_DATA_DIR,
        data_dir_help="where the RocksDB journal and the generated secret live",
    )
    s.add_argument(
        "--sync",
        action="store_true",
        help="fsync the journal on every write (survives machine crashes, slower)",
    )
    s.add_argument(
        "--sample-interval",
        type=float,
        default=1.0,
        help="seconds between dashboard samples (default 1)",
    )
    s.add_argument(
        "--history",
        type=float,
        default=600.0,
        help="seconds of samples the dashboard keeps (default 600)",
    )
    s.add_argument(
        "--dashboard-source",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an origin beyond loopback the dashboard may read, e.g. an IdRegistry's https://registry.example.com (repeatable)",
    )
    w = sub.add_parser("watermarks", help="print the published watermarks of a running authority")
    w.add_argument(
        "--url",
        default=f"http://127.0.0.1:{DEFAULT_PORT}",
        help=f"the authority's URL (default http://127.0.0.1:{DEFAULT_PORT})",
    )
    w.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``millwheel authority ARGS...``; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        from servicekit.cli import serve_flags, serve_problem
        from watermark_authority._server import check_source, serve

        problem = serve_problem(args)
        if problem is None and (args.sample_interval <= 0 or args.history <= 0):
            problem = "--sample-interval and --history must be > 0"
        sources: list[str] = []
        try:
            sources = [check_source(s) for s in args.dashboard_source]
        except ValueError as exc:
            problem = problem or str(exc)
        if problem:
            print(f"millwheel authority: {problem}", file=sys.stderr)
            return 2
        return serve(
            serve_flags(args),
            sync=args.sync,
            sample_interval=args.sample_interval,
            history_seconds=args.history,
            dashboard_sources=sources,
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
