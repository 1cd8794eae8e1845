"""The ``serve`` command line every service shares: its flags, their checks, and what they mean.

s = sub.add_parser("serve")
add_serve_arguments(s, INFO, default_port=7300, default_data_dir=".millwheel/x", data_dir_help="...")
s.add_argument(...)                          # the service's own flags
args = parser.parse_args(argv)
problem = serve_problem(args)                 # then the service's own checks
serve(serve_flags(args), ...)
"""

from __future__ import annotations

import argparse

from servicekit.service import DEFAULT_MAX_BODY_BYTES, ServeFlags, ServiceInfo

LOG_LEVELS = ["debug", "info", "warning", "error"]


def add_serve_arguments(
    parser: argparse.ArgumentParser,
    info: ServiceInfo,
    *,
    default_port: int,
    default_data_dir: str,
    data_dir_help: str,
) -> None:
    """``--port --host --data-dir --secret-file --allow-host --allow-origin --max-body-bytes
    --ssl-certfile --ssl-keyfile --ready-file --log-level`` for the service ``info``."""
    env, env_file, name = info.secret_env, info.secret_file_env, info.secret_file_name
    secret_help = f"file holding the bearer secret (default: ${env}, ${env_file}, else DATA_DIR/{name}, generated on the first start)"
    p = parser.add_argument
    p(
        "--port",
        type=int,
        default=default_port,
        help=f"TCP port (default {default_port}; 0 picks a free one)",
    )
    p(
        "--host",
        default="127.0.0.1",
        help="bind address (default 127.0.0.1: loopback only; beyond it, use TLS)",
    )
    p("--data-dir", default=default_data_dir, help=f"{data_dir_help} (default {default_data_dir})")
    p("--secret-file", help=secret_help)
    p(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer for this Host name (repeatable; loopback names and IP addresses always)",
    )
    p(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let pages of this origin call the service, e.g. https://ops.example.com (repeatable)",
    )
    p(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest request body accepted (default {DEFAULT_MAX_BODY_BYTES})",
    )
    p("--ssl-certfile", help="serve HTTPS with this certificate (PEM); needs --ssl-keyfile")
    p("--ssl-keyfile", help="the certificate's private key (PEM)")
    p("--ready-file", help="write the service URL to this file once it is listening")
    p(
        "--log-level",
        default="warning",
        choices=LOG_LEVELS,
        help=f"what the service logs: {', '.join(LOG_LEVELS)} (default warning)",
    )


def serve_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the shared flags, in words that name the fix; ``None`` if nothing."""
    if not 0 <= args.port <= 65535:
        return f"--port must be in 0..65535, got {args.port}"
    if args.max_body_bytes < 1024:
        return f"--max-body-bytes must be at least 1024, got {args.max_body_bytes}"
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        return "--ssl-certfile and --ssl-keyfile go together: give both, or neither"
    return None


def serve_flags(args: argparse.Namespace) -> ServeFlags:
    """The shared flags, for a service's ``serve()``."""
    return ServeFlags(
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        secret_file=args.secret_file,
        allow_hosts=args.allow_host,
        allow_origins=args.allow_origin,
        max_body_bytes=args.max_body_bytes,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        ready_file=args.ready_file,
        log_level=args.log_level,
    )
