"""``millwheel authority ...``: run the low-watermark authority, or ask one for its watermarks.

    millwheel authority serve [--port 7300] [--host 127.0.0.1] [--data-dir .millwheel/authority]
                              [--secret-file FILE] [--allow-host NAME ...] [--allow-origin ORIGIN ...]
                              [--ssl-certfile PEM --ssl-keyfile PEM] [--sync]
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
    from servicekit.http import DEFAULT_MAX_BODY_BYTES

    parser = argparse.ArgumentParser(prog="millwheel authority", description="the central low-watermark authority (MillWheel §7.2)")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the authority service and its dashboard")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: loopback only; beyond it, use TLS)")
    s.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"where the RocksDB journal lives (default {DEFAULT_DATA_DIR})")
    s.add_argument(
        "--secret-file",
        help="file holding the bearer secret every write must carry (default: $MILLWHEEL_AUTHORITY_SECRET, "
        "$MILLWHEEL_AUTHORITY_SECRET_FILE, else DATA_DIR/secret, generated on the first start)",
    )
    s.add_argument("--allow-host", action="append", default=[], metavar="NAME", help="also answer for this Host name (repeatable; loopback names and IP addresses always)")
    s.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN", help="let pages of this origin call the service, e.g. https://ops.example.com (repeatable)")
    s.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help=f"largest request body accepted (default {DEFAULT_MAX_BODY_BYTES})")
    s.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM); needs --ssl-keyfile")
    s.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
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

        problem = None
        if not 0 <= args.port <= 65535:
            problem = f"--port must be in 0..65535, got {args.port}"
        elif args.sample_interval <= 0 or args.history <= 0:
            problem = "--sample-interval and --history must be > 0"
        elif args.max_body_bytes < 1024:
            problem = f"--max-body-bytes must be at least 1024, got {args.max_body_bytes}"
        elif bool(args.ssl_certfile) != bool(args.ssl_keyfile):
            problem = "--ssl-certfile and --ssl-keyfile go together: give both, or neither"
        if problem:
            print(f"millwheel authority: {problem}", file=sys.stderr)
            return 2
        return serve(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            secret_file=args.secret_file,
            allow_hosts=args.allow_host,
            allow_origins=args.allow_origin,
            max_body_bytes=args.max_body_bytes,
            ssl_certfile=args.ssl_certfile,
            ssl_keyfile=args.ssl_keyfile,
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
