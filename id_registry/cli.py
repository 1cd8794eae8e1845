"""``millwheel registry ...``: run Photon's IdRegistry, or ask one for its status.

    millwheel registry serve [--port 7310] [--host 127.0.0.1] [--data-dir .millwheel/registry]
                             [--secret-file FILE] [--backend rocksdb|etcd] [--etcd-endpoint URL ...]
                             [--shards 16] [--max-inflight-items N] [--max-inflight-requests N] ...
    millwheel registry status [--url http://127.0.0.1:7310]
    millwheel registry stats [--seconds 60] [--url ...]
    millwheel registry dashboard-link --authority http://127.0.0.1:7300 [--url ...]
    millwheel registry gc --boundary-ms T [--url ...]
    millwheel registry reshard --effective-from-ms T --shards N [--url ...]

Every request but the status needs the service's secret (``--secret-file``,
``$MILLWHEEL_REGISTRY_SECRET``, ``$MILLWHEEL_REGISTRY_SECRET_FILE``, or ``DATA_DIR/secret``,
generated on the first start). ``dashboard-link`` prints the address of the authority's
dashboard with this registry's panel: ``#registry=URL&registry_key=KEY``, the secret's read
key, which reads ``/v1/stats`` and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_PORT = 7310
DEFAULT_DATA_DIR = ".millwheel/registry"


def _parser() -> argparse.ArgumentParser:
    from id_registry._core import DEFAULT_RESHARD_LEAD_MS, DEFAULT_SHARD_COUNT
    from id_registry._worker import (
        DEFAULT_MAX_GROUP_ITEMS,
        DEFAULT_MAX_INFLIGHT_ITEMS,
        DEFAULT_MAX_INFLIGHT_REQUESTS,
    )
    from id_registry.client import SERVICE
    from servicekit.cli import add_serve_arguments

    parser = argparse.ArgumentParser(
        prog="millwheel registry",
        description="Photon's IdRegistry: conditional commits of event ids (Photon §2)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the registry service")
    add_serve_arguments(
        s,
        SERVICE,
        default_port=DEFAULT_PORT,
        default_data_dir=DEFAULT_DATA_DIR,
        data_dir_help="where the RocksDB store and the generated secret live",
    )
    s.add_argument(
        "--backend",
        choices=["rocksdb", "etcd"],
        default="rocksdb",
        help="rocksdb: embedded, one node (default); etcd: replicated (Raft)",
    )
    s.add_argument(
        "--no-sync",
        action="store_true",
        help="rocksdb: do not fsync each write batch (survives kill -9, not a machine crash)",
    )
    s.add_argument(
        "--etcd-endpoint",
        action="append",
        default=[],
        metavar="URL",
        help="etcd: a member's client URL (repeatable)",
    )
    s.add_argument(
        "--etcd-prefix",
        help="etcd: the key prefix of this registry (default millwheel/id_registry/)",
    )
    s.add_argument(
        "--etcd-max-txn-ops", type=int, help="etcd: the cluster's --max-txn-ops (default 128)"
    )
    s.add_argument(
        "--shards",
        type=int,
        default=DEFAULT_SHARD_COUNT,
        help=f"shards of a new registry (default {DEFAULT_SHARD_COUNT}; ignored once it has a map)",
    )
    s.add_argument(
        "--reshard-lead-ms",
        type=int,
        default=DEFAULT_RESHARD_LEAD_MS,
        help=f"a new shard configuration starts at least this far ahead (default {DEFAULT_RESHARD_LEAD_MS})",
    )
    s.add_argument(
        "--max-inflight-items",
        type=int,
        default=DEFAULT_MAX_INFLIGHT_ITEMS,
        help=f"items queued or being written before commits get 429 (default {DEFAULT_MAX_INFLIGHT_ITEMS})",
    )
    s.add_argument(
        "--max-inflight-requests",
        type=int,
        default=DEFAULT_MAX_INFLIGHT_REQUESTS,
        help=f"requests in progress before new ones get 429 (default {DEFAULT_MAX_INFLIGHT_REQUESTS})",
    )
    s.add_argument(
        "--max-group-items",
        type=int,
        default=DEFAULT_MAX_GROUP_ITEMS,
        help=f"most items in one durable write (default {DEFAULT_MAX_GROUP_ITEMS})",
    )
    commands = (
        ("status", "print a running registry's status"),
        ("stats", "print its figures second by second (GET /v1/stats)"),
        ("dashboard-link", "print the authority dashboard's address with this registry's panel"),
        ("gc", "move the GC boundary forward"),
        ("reshard", "add a shard configuration"),
    )
    for name, text in commands:
        c = sub.add_parser(name, help=text)
        c.add_argument(
            "--url",
            default=f"http://127.0.0.1:{DEFAULT_PORT}",
            help=f"the registry's address (default http://127.0.0.1:{DEFAULT_PORT})",
        )
        c.add_argument(
            "--data-dir",
            help="find the secret in DATA_DIR/secret (else $MILLWHEEL_REGISTRY_SECRET[_FILE])",
        )
        if name == "stats":
            c.add_argument(
                "--seconds",
                type=int,
                default=60,
                help="how many seconds of figures (1 to 600; default 60)",
            )
        if name == "dashboard-link":
            c.add_argument(
                "--authority",
                required=True,
                help="the watermark authority's URL (its dashboard), e.g. http://127.0.0.1:7300",
            )
        if name == "gc":
            c.add_argument(
                "--boundary-ms",
                type=int,
                required=True,
                help="entries of events before this time are deleted",
            )
        if name == "reshard":
            c.add_argument(
                "--effective-from-ms",
                type=int,
                required=True,
                help="the event time from which the new count applies",
            )
            c.add_argument("--shards", type=int, required=True, help="the new shard count")
    return parser


def _problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the registry's own flags of ``serve``; ``None`` if nothing."""
    positive = {
        "--max-inflight-items": args.max_inflight_items,
        "--max-inflight-requests": args.max_inflight_requests,
        "--max-group-items": args.max_group_items,
    }
    if args.backend == "etcd" and not args.etcd_endpoint:
        return (
            "--backend etcd needs --etcd-endpoint URL (once per member, e.g. http://127.0.0.1:2379)"
        )
    if args.reshard_lead_ms < 0:
        return f"--reshard-lead-ms must be >= 0, got {args.reshard_lead_ms}"
    return next(
        (
            f"{flag} must be at least 1, got {value}"
            for flag, value in positive.items()
            if value < 1
        ),
        None,
    )


def _serve(args: argparse.Namespace) -> int:
    from id_registry._server import serve
    from servicekit.cli import serve_flags, serve_problem

    problem = serve_problem(args) or _problem(args)
    if problem:
        print(f"millwheel registry: {problem}", file=sys.stderr)
        return 2
    return serve(
        serve_flags(args),
        backend_options={
            "backend": args.backend,
            "sync": not args.no_sync,
            "etcd_endpoints": args.etcd_endpoint,
            "etcd_prefix": args.etcd_prefix,
            "etcd_max_txn_ops": args.etcd_max_txn_ops,
        },
        registry_options={"shard_count": args.shards, "reshard_lead_ms": args.reshard_lead_ms},
        worker_options={
            "max_inflight_items": args.max_inflight_items,
            "max_inflight_requests": args.max_inflight_requests,
            "max_group_items": args.max_group_items,
        },
    )


def _dashboard_link(args: argparse.Namespace) -> int:
    from id_registry._errors import RegistryError
    from id_registry.client import dashboard_link

    try:
        print(dashboard_link(args.authority, args.url, data_dir=args.data_dir))
    except RegistryError as exc:
        print(f"millwheel registry: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str]) -> int:
    """Photon's IdRegistry: ``millwheel registry serve|status|stats|dashboard-link|gc|reshard``."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    from id_registry._errors import RegistryError
    from id_registry.client import HttpRegistryClient, client_secret

    if args.command == "dashboard-link":
        return _dashboard_link(args)
    try:
        with HttpRegistryClient(
            args.url, secret=client_secret(data_dir=args.data_dir), retries=1, throttle_timeout=10.0
        ) as client:
            if args.command == "status":
                out: object = client.status()
            elif args.command == "stats":
                out = client.stats(args.seconds)
            elif args.command == "gc":
                out = client.advance_gc(args.boundary_ms)._asdict()
            else:
                out = {
                    "shards": [
                        [c.effective_from_ms, c.shard_count]
                        for c in client.reshard(args.effective_from_ms, args.shards)
                    ]
                }
    except RegistryError as exc:
        print(f"millwheel registry: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0
