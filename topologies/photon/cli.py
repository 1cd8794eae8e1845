"""``millwheel photon generate|run|verify|evaluate``: the sample, a pipeline, verification, the evaluation.

Registered with the ``millwheel`` command as an entry point (``pyproject.toml``, group
``millwheel.commands``)::

    millwheel photon generate OUT_DIR [--seed N --duration-s S --rate R ...]      write a sample
    millwheel photon run [DATA_DIR] [--backend harness|spark] [--mode continuous|batch]
                         [--checkpoint RUN --pipeline NAME --registry URL [--follow] [--dashboard]]
                                                                                 run one pipeline, evaluate
    millwheel photon verify RUN [RUN ...] [--registry URL] [--target RUN] [--dry-run] [--json]
                                                                                 verification and recovery (§3.3.3)
    millwheel photon evaluate DATA_DIR RUN [RUN ...] [--json]                    the union of runs' outputs vs a batch join

``run`` and ``evaluate`` read ``DATA_DIR`` and never write it: only the default sample's
location (no ``DATA_DIR``) is generated into, when missing. On logs that are not a generated
sample (no ``ground_truth.json``) ``run`` reports what it joined and ``evaluate`` compares
against a batch join of the logs themselves.

On Spark, ``run`` commits to the registry at ``--registry`` (``millwheel registry serve``),
or to one it starts for the run (``RUN/registry``) when none is given. Two pipelines
reading the same logs with different ``--pipeline`` names and ``--checkpoint`` directories
and the same ``--registry`` are Photon's multi-homing (§2, Fig. 6). With ``--dashboard``
the pipeline reports its watermarks to an authority of its own (``RUN/authority``) and prints
the address of its lag dashboard with the registry's panel (commits, conflicts, too-old
answers and server-side batch sizes per second, §2.2.1): ``#registry=URL&registry_key=KEY``,
where KEY, the read key of the registry's secret, reads those figures and nothing else.

>>> import contextlib, io, tempfile
>>> d = tempfile.mkdtemp()
>>> with contextlib.redirect_stdout(io.StringIO()) as out:
...     code = main(["generate", d, "--duration-s", "5", "--rate", "40"])
>>> code, out.getvalue().split(" (")[0]
(0, 'wrote 200 queries and 13 clicks')
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from millwheel import MillwheelError

from .config import GeneratorConfig, PhotonConfig
from .drivers import PipelineBusyError, read_manifest, read_run, replay, run_lock, run_spark
from .evaluation import RunResult, evaluate, render
from .generator import check_logs, generate, has_truth, load_truth, resolve_data_dir
from .registry import PATIENCE_S, OnceRegistryAdapter, RegistryFactory, open_client, registry_secret
from .verify_runs import report_dict, verify_runs


def main(argv: list[str] | None = None) -> int:
    """Photon: the click-query join across pipelines (generate, run, verify, evaluate)."""
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except (FileNotFoundError, ValueError, PipelineBusyError, MillwheelError) as exc:
        print(f"millwheel photon {args.command}: {exc}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    truth = generate(args.out_dir, _settings(GeneratorConfig, args))
    print(
        f"wrote {truth['queries']} queries and {truth['clicks']} clicks ({truth['orphan_clicks']} orphans, "
        f"{truth['clicks_before_query']} logged before their query, {truth['duplicate_clicks']} duplicate clicks, "
        f"{truth['malformed_injected']} malformed lines) to {args.out_dir} in {time.perf_counter() - started:.1f}s"
    )
    return 0


def _settings(cls: Any, args: argparse.Namespace) -> Any:
    """A settings dataclass from the options :func:`_options` added for it."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def _options(parser: argparse.ArgumentParser, cls: Any) -> None:
    """Every field of a settings dataclass as an option: ``--seed``, ``--retention-ms``, ``--log-store false``,
    its help the field's ``#:`` comment."""
    docs = field_docs(cls)
    for f in fields(cls):
        kind = type(f.default)
        parse = (lambda text: text.lower() in ("1", "true", "yes")) if kind is bool else kind
        text = docs.get(f.name, f.name.replace("_", " "))
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=parse,
            default=f.default,
            dest=f.name,
            help=f"{text} (default {f.default})",
        )


def field_docs(cls: Any) -> dict[str, str]:
    """Each field's ``#:`` comment (the lines right above it), on one line.

    >>> field_docs(PhotonConfig)["max_delay_ms"][:40]
    'a click still unjoined once the low wate'
    """
    out: dict[str, str] = {}
    comment: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            comment.append(text[2:].strip())
            continue
        name = text.split(":", 1)[0]
        if comment and name.isidentifier() and ":" in text:
            out[name] = " ".join(comment).replace("``", "")
        comment = []
    return out


def _config(args: argparse.Namespace) -> PhotonConfig:
    return _settings(PhotonConfig, args)


def _pipeline_name(args: argparse.Namespace) -> str:
    """The pipeline's name: given; else the run directory's (a resumed run); else ``dc1`` — but
    never a silent default with a shared registry, where two runs under one name would be one
    pipeline to every other (two run directories would emit each click twice)."""
    if args.pipeline is not None:
        return str(args.pipeline)
    held = read_manifest(args.checkpoint) if args.checkpoint else None
    if held is not None:
        return str(held["pipeline"])
    if args.registry is not None:
        msg = (
            f"--registry {args.registry} is shared between pipelines: name this one with --pipeline NAME "
            "(each run directory its own name; the registry refuses a name another run directory holds)"
        )
        raise ValueError(msg)
    return "dc1" if args.backend == "spark" else "harness"


def _run(args: argparse.Namespace) -> int:
    config = _config(args)
    args.pipeline = _pipeline_name(args)
    if args.backend == "harness" and args.dashboard:
        msg = "--dashboard needs --backend spark (the harness keeps its watermarks in memory)"
        raise ValueError(msg)
    if args.backend == "spark" and not args.checkpoint:
        msg = "--backend spark needs --checkpoint RUN_DIR (the pipeline's own run directory)"
        raise ValueError(msg)
    data = resolve_data_dir(
        args.data_dir
    )  # the default sample (generated if missing), or logs read and never written
    sample = has_truth(data)
    if args.backend == "harness":
        mode = args.mode or ("continuous" if sample else "batch")
        if mode == "continuous" and not sample:
            msg = (
                f"--mode continuous paces the logs by when each file was written, which only a generated sample "
                f"records (ground_truth.json); {data} has none: run it with --mode batch (the default on such logs)"
            )
            raise ValueError(msg)
        with _registry(args.registry, args.secret_file) as reg:
            result = replay(data, config=config, mode=mode, registry=reg, pipeline=args.pipeline)
    else:
        result = _run_spark(args, data, config)
    if sample:
        print(render(evaluate(result, data, load_truth(data), config)))
    else:
        print(_joined_report(result, data, args.checkpoint if args.backend == "spark" else None))
    return 0


def _joined_report(result: RunResult, data: Path, run: str | None) -> str:
    """What a run joined from logs that are not a generated sample (there is no ground truth to check)."""
    files = {
        log: sum(
            1 for p in (data / log).iterdir() if p.is_file() and not p.name.startswith((".", "_"))
        )
        for log in ("queries", "clicks")
    }
    reasons = Counter(str(u.get("reason_code")) for u in result.unjoinable)
    lines = [
        f"photon: joined {len(result.joined)} clicks from the logs in {data} (query files: {files['queries']}, click files: {files['clicks']}; "
        f"read, nothing written there)",
        f"  unjoinable: {len(result.unjoinable)}"
        + (f" ({', '.join(f'{r}: {n}' for r, n in sorted(reasons.items()))})" if reasons else ""),
        f"  dead letters (malformed lines, clicks without a query id): {len(result.dead_letters)}",
    ]
    if run is not None:
        lines.append(
            f"  compare with a batch join of the same logs: millwheel photon evaluate {data} {run}"
        )
    return "\n".join(lines)


def _run_spark(args: argparse.Namespace, data: Path, config: PhotonConfig) -> RunResult:
    from millwheel.runtime import RuntimeSettings

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    settings = RuntimeSettings(
        master=args.master,
        intervals=args.intervals,
        trigger_ms=args.trigger_ms,
        max_files_per_trigger=args.max_files_per_trigger,
        max_restarts=args.max_restarts,
    )
    with run_lock(
        args.checkpoint
    ):  # a running pipeline is refused here, before the services of its run directory start
        pass
    with contextlib.ExitStack() as stack:
        url, secret_file = args.registry, args.secret_file
        if url is None:
            from id_registry import embedded_registry

            service = stack.enter_context(
                embedded_registry(str(Path(args.checkpoint) / "registry"))
            )
            url, secret_file = service.url, str(Path(service.data_dir) / "secret")
            print(
                f"photon: IdRegistry for this run at {url} (give --registry URL to share one between pipelines)",
                file=sys.stderr,
            )
        watermarks = (
            _dashboard(stack, args.checkpoint, url, secret_file) if args.dashboard else None
        )
        try:
            return run_spark(
                data,
                args.checkpoint,
                config=config,
                settings=settings,
                pipeline=args.pipeline,
                watermarks=watermarks,
                registry=RegistryFactory(
                    url,
                    secret_file,
                    patience_s=args.registry_patience_s,
                    waits=str(Path(args.checkpoint) / "waits"),
                ),
                registry_url=url,
                follow=args.follow,
                finite=not args.live,
                timeout_s=args.timeout,
                stop=stop,
                log=lambda m: print(f"millwheel: {m}", file=sys.stderr, flush=True),
            )
        except KeyboardInterrupt:
            stop.set()
            raise


def _dashboard(
    stack: contextlib.ExitStack, run: str, registry_url: str, secret_file: str | None
) -> Any:
    """A watermark authority of this run's own (``RUN/authority``: two pipelines' computations share
    names, so they never share an authority) for the ``with`` block; prints its dashboard's address
    with the registry's panel. Returns a client of it, for the runtime."""
    from id_registry import AuthenticationError
    from id_registry.client import dashboard_link
    from watermark_authority import embedded_authority

    authority = stack.enter_context(embedded_authority(str(Path(run) / "authority")))
    try:
        link = dashboard_link(authority.url, registry_url, registry_secret(secret_file))
        say = f"photon: watermark authority and its lag dashboard, with the IdRegistry panel, at {link}"
    except AuthenticationError:
        say = f"photon: watermark authority and its lag dashboard at {authority.url}/ (no registry secret at hand here: no registry panel)"
    print(say, file=sys.stderr, flush=True)
    return authority.client()


@contextlib.contextmanager
def _registry(url: str | None, secret_file: str | None) -> Iterator[Any]:
    if url is None:
        yield None  # the harness's own in-memory registry
        return
    client = open_client(url, secret_file)
    try:
        yield OnceRegistryAdapter(client)
    finally:
        client.close()


def _verify(args: argparse.Namespace) -> int:
    url = args.registry or next(
        (m["registry"] for m in map(read_manifest, args.runs) if m and m.get("registry")), None
    )
    if url is None:
        msg = "no --registry URL, and the runs' manifests name none"
        raise ValueError(msg)
    with _registry(url, args.secret_file) as reg:
        report = verify_runs(
            args.runs, reg, clear_tokens=args.clear_tokens, dry_run=args.dry_run, target=args.target
        )
    print(json.dumps(report_dict(report), indent=1) if args.json else report.text())
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    runs = [read_run(r) for r in args.runs]
    union = RunResult(
        [j for r in runs for j in r.joined],
        [u for r in runs for u in r.unjoinable],
        [d for r in runs[:1] for d in r.dead_letters],
        runs[0].metrics,
    )
    manifest = read_manifest(args.runs[0])
    config = PhotonConfig(**manifest["config"]) if manifest else PhotonConfig()
    data = check_logs(args.data_dir)
    report = evaluate(
        union, data, load_truth(data) if has_truth(data) else None, config
    )  # a user's logs: the batch join alone
    print(json.dumps(report, indent=1, default=str) if args.json else render(report))
    return 0 if report["ok"] else 1


def _check(args: argparse.Namespace) -> int:
    from .jepsen import main as check_main

    return check_main(args)


_COMMANDS = {
    "generate": _generate,
    "run": _run,
    "verify": _verify,
    "evaluate": _evaluate,
    "check": _check,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="millwheel photon",
        description="Photon: clicks joined with their queries, exactly once across pipelines",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_gen = sub.add_parser("generate", help="write query and click logs and their ground truth")
    p_gen.add_argument(
        "out_dir", help="the directory to write (queries/, clicks/, ground_truth.json)"
    )
    _options(p_gen, GeneratorConfig)
    p_run = sub.add_parser("run", help="run one pipeline (harness or Spark) and evaluate it")
    p_run.add_argument(
        "data_dir",
        nargs="?",
        default=None,
        help="DATA/queries/ and DATA/clicks/ of JSON-lines logs, read and never written (default: the default sample, generated if missing)",
    )
    p_run.add_argument(
        "--backend",
        choices=["harness", "spark"],
        default="harness",
        help="harness: in memory; spark: a pipeline on Spark in --checkpoint RUN (default harness)",
    )
    p_run.add_argument(
        "--mode",
        choices=["continuous", "batch"],
        default=None,
        help="harness: paced as the files were written (a generated sample's default) or as fast as possible (the default on other logs)",
    )
    p_run.add_argument(
        "--pipeline",
        default=None,
        help="this pipeline's name in the IdRegistry; required with a shared --registry (default: the run directory's, else dc1)",
    )
    p_run.add_argument(
        "--registry",
        default=None,
        help="URL of the shared IdRegistry (default: in memory / one started for the run)",
    )
    p_run.add_argument(
        "--secret-file",
        default=None,
        help="the registry's secret (default: $MILLWHEEL_REGISTRY_SECRET, ...)",
    )
    p_run.add_argument(
        "--checkpoint",
        default=None,
        help="spark: the pipeline's run directory (a restart resumes it)",
    )
    p_run.add_argument(
        "--follow",
        action="store_true",
        help="spark: keep running once drained, serving re-injections",
    )
    p_run.add_argument(
        "--dashboard",
        action="store_true",
        help="spark: report watermarks to an authority of this run's own (RUN/authority) and print its lag dashboard's address, with the IdRegistry's panel",
    )
    p_run.add_argument(
        "--live", action="store_true", help="spark: the logs keep growing (never drained)"
    )
    p_run.add_argument(
        "--master", default="local[2]", help="spark: the Spark master (default local[2])"
    )
    p_run.add_argument(
        "--intervals",
        type=int,
        default=8,
        help="spark: key intervals, pinned by the run directory's first start (default 8)",
    )
    p_run.add_argument(
        "--trigger-ms",
        type=int,
        default=0,
        help="spark: the micro-batch trigger interval (default 0: as soon as possible)",
    )
    p_run.add_argument(
        "--max-files-per-trigger",
        type=int,
        default=None,
        help="spark: stream files per computation batch",
    )
    p_run.add_argument(
        "--max-restarts",
        type=int,
        default=20,
        help="spark: restarts of a failed query (from its checkpoint) before giving up (default 20)",
    )
    p_run.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="spark: give up a finite run not drained after this many seconds (default none)",
    )
    p_run.add_argument(
        "--registry-patience-s",
        type=float,
        default=PATIENCE_S,
        help=f"spark: how long registry calls keep waiting while the registry is out (a restart, a failover) before the run stops (default {PATIENCE_S:g})",
    )
    _options(p_run, PhotonConfig)
    p_ver = sub.add_parser(
        "verify", help="check registered clicks against the outputs; recover lost ones (§3.3.3)"
    )
    p_ver.add_argument("runs", nargs="+", help="the pipelines' run directories")
    p_ver.add_argument("--registry", default=None, help="default: the one the runs' manifests name")
    p_ver.add_argument(
        "--secret-file",
        default=None,
        help="the registry's secret (default: $MILLWHEEL_REGISTRY_SECRET, ...)",
    )
    p_ver.add_argument(
        "--dry-run", action="store_true", help="report only: clear nothing, re-inject nothing"
    )
    p_ver.add_argument(
        "--target",
        default=None,
        help="the run directory (one of RUN...) that takes re-injected clicks where more than one could (without it, verification asks)",
    )
    p_ver.add_argument(
        "--clear-tokens",
        action="store_true",
        help="drop the tokens of clicks safely in the output (saves registry space; a later verification of a subset then recovers less)",
    )
    p_ver.add_argument("--json", action="store_true", help="print the report as JSON")
    p_eval = sub.add_parser(
        "evaluate", help="evaluate the union of runs' outputs against a batch join of the logs"
    )
    p_eval.add_argument(
        "data_dir",
        help="the logs the runs read (a sample's ground truth is checked too if there is one)",
    )
    p_eval.add_argument(
        "runs", nargs="+", help="the pipelines' run directories, evaluated as one union"
    )
    p_eval.add_argument("--json", action="store_true", help="print the report as JSON")
    p_check = sub.add_parser(
        "check",
        help="a Jepsen-style check: two Spark pipelines under kills, restarts and verification; exit 1 on any lost or duplicated click",
    )
    p_check.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds to run, each with its own logs and faults (default 1)",
    )
    p_check.add_argument(
        "--seed",
        type=int,
        default=None,
        help="decides every round's logs, faults and their order (default: a fresh random seed, printed, so a failing round can be replayed)",
    )
    p_check.add_argument(
        "--workdir",
        default=".millwheel/photon-check",
        help="where the rounds' logs, run directories and check.json go (default .millwheel/photon-check)",
    )
    from .jepsen import CheckSettings

    _options(p_check, CheckSettings)
    return parser
