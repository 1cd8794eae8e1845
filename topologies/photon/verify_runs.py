"""Verification over pipelines' run directories (``millwheel photon verify RUN...``, Photon §3.3.3).

:func:`verify_runs` reads each run directory — its manifest (``photon.json``: the logs
and settings), its published output and, for a stopped pipeline, the batches it
committed and has not published yet, its ``reinject/`` files, its query log — and hands
them to :func:`~.verify.verify` as :class:`~.verify.Pipeline` values. A stopped
pipeline's lock is held meanwhile, so it cannot start while verification reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .config import PhotonConfig
from .drivers import LOCK, REINJECT, read_manifest, read_run
from .evaluation import read_records
from .eventstore import LogsEventStore
from .joiner import ADAPTER_SKIPPED, JOINED, NO_QUERY, UNJOINABLE
from .verify import Pipeline, VerifyReport, verify

__all__ = [
    "gave_up_ids",
    "output_ids",
    "query_finder",
    "reinjected_ids",
    "report_dict",
    "verify_runs",
    "write_reinjection",
]


def output_ids(
    joined: Sequence[dict[str, Any]],
    unjoinable: Sequence[dict[str, Any]],
    config: PhotonConfig | None = None,
) -> Counter[str]:
    """Click ids a pipeline's visible output decides: joined, or skipped by the adapter (a
    decision made with the query, under the click's once-id)."""
    cf = (config or PhotonConfig()).click_id_field
    out: Counter[str] = Counter(j[cf] for j in joined)
    out.update(u["click"][cf] for u in unjoinable if u.get("reason_code") == ADAPTER_SKIPPED)
    return out


def gave_up_ids(
    unjoinable: Sequence[dict[str, Any]], config: PhotonConfig | None = None
) -> set[str]:
    """Click ids a pipeline gave up (``no_query``): tentative decisions, which a join supersedes."""
    cf = (config or PhotonConfig()).click_id_field
    return {u["click"][cf] for u in unjoinable if u.get("reason_code") == NO_QUERY}


def reinjected_ids(run: str | os.PathLike[str], config: PhotonConfig | None = None) -> set[str]:
    """Click ids ever re-injected into a run directory (its ``reinject/`` files, which stay)."""
    cf = (config or PhotonConfig()).click_id_field
    out: set[str] = set()
    for path in sorted((Path(run) / REINJECT).glob("reinject_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                cid = value.get(cf) if isinstance(value, dict) else None
                if isinstance(cid, str):
                    out.add(cid)
    return out


def query_finder(data_dir: str | os.PathLike[str], config: PhotonConfig) -> Callable[[Any], bool]:
    """Whether a pipeline's query log (``DATA/queries``) holds a query id, as its joiner's
    LogsEventStore finds it (§3.4.2); an id without a time in it cannot be looked up: ``True``."""
    store = LogsEventStore(
        Path(data_dir) / "queries",
        id_field=config.query_id_field,
        ts_field=config.ts_field,
        window_ms=config.log_store_window_ms,
        lateness_ms=config.query_lateness_ms,
    )

    def has(query_id: Any) -> bool:
        if not isinstance(query_id, str) or store.time_of(query_id) is None:
            return True
        return store.lookup(query_id) is not None

    return has


def write_reinjection(run: str | os.PathLike[str], clicks: list[dict[str, Any]]) -> Path | None:
    """Write clicks into a pipeline's ``reinject/`` directory, atomically (hidden name, then rename)."""
    if not clicks:
        return None
    d = Path(run) / REINJECT
    d.mkdir(parents=True, exist_ok=True)
    name = f"reinject_{int(time.time() * 1000)}_{os.getpid()}.jsonl"
    tmp = d / f".{name}"
    tmp.write_text("".join(json.dumps(c) + "\n" for c in clicks), encoding="utf-8")
    os.replace(tmp, d / name)
    return d / name


@contextlib.contextmanager
def _stopped_or_running(run: Path) -> Iterator[bool]:
    """Yields whether the pipeline of ``run`` is running; if it is not, holds its lock meanwhile."""
    fd = os.open(run / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield True
            return
        yield False
    finally:
        os.close(fd)


def verify_runs(
    runs: Sequence[str | os.PathLike[str]],
    registry: Any,
    *,
    clear_tokens: bool = False,
    dry_run: bool = False,
    target: str | os.PathLike[str] | None = None,
) -> VerifyReport:
    """:func:`verify` over pipelines' run directories (their manifests name the logs and the settings).

    A stopped pipeline's output includes what it committed and has not published yet
    (``millwheel.runtime.committed_unpublished``): its next start publishes that. ``target``:
    the run directory (one of ``runs``) that takes re-injections where more than one could.
    """
    from millwheel.runtime import committed_unpublished, run_identity

    manifests = []
    for run in runs:
        m = read_manifest(run)
        if m is None:
            msg = f"{run} is not a Photon run directory (no photon.json); run `millwheel photon run --checkpoint {run}` first"
            raise FileNotFoundError(msg)
        manifests.append(m)
    # the same click log (a pipeline may read its own copy of the query log, e.g. delayed)
    logs = {os.path.realpath(Path(m["data_dir"]) / "clicks") for m in manifests}
    if len(logs) != 1:
        msg = f"the runs read different click logs: {sorted(logs)}; verify pipelines of the same input"
        raise ValueError(msg)
    config = PhotonConfig(**manifests[0]["config"])
    clicks, _ = read_records(Path(logs.pop()), config.click_id_field, config.ts_field)
    with contextlib.ExitStack() as stack:
        pipelines = []
        for run, m in zip(runs, manifests, strict=True):
            running = stack.enter_context(_stopped_or_running(Path(run)))
            out = read_run(run)
            joined, unjoinable = list(out.joined), list(out.unjoinable)
            if not running:
                joined += committed_unpublished(os.fspath(run), JOINED)
                unjoinable += committed_unpublished(os.fspath(run), UNJOINABLE)
            ident = run_identity(os.fspath(run))
            epoch, where = (ident[1], ident[2]) if ident is not None else ("", None)
            pipelines.append(
                Pipeline(
                    m["pipeline"],
                    output_ids(joined, unjoinable, config),
                    running=running,
                    reinject=lambda cl, run=run: write_reinjection(run, cl),
                    gave_up=gave_up_ids(unjoinable, config),
                    epoch=epoch,
                    where=where,
                    run=os.fspath(run),
                    offered=reinjected_ids(run, config),
                    has_query=query_finder(m["data_dir"], config),
                )
            )
        chosen = None if target is None else os.fspath(target)
        return verify(
            clicks,
            pipelines,
            registry,
            config=config,
            clear_tokens=clear_tokens,
            dry_run=dry_run,
            target=chosen,
        )


def report_dict(report: VerifyReport) -> dict[str, Any]:
    return asdict(report)
