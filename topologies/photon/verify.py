"""Verification and recovery (Photon §3.3.3): every registered click against the union of the outputs.

A pipeline commits a click id to the IdRegistry in its worker, then its micro-batch
commits and its output becomes visible. A pipeline killed in between — and never
restarted: its datacenter is gone — leaves the id registered under its token with no
joined event anywhere, and every other pipeline's commit of that click is a conflict.
(A restarted pipeline replays the batch with the same token and writes the output
itself: that case heals on its own.) :func:`verify`:

1. reads every click of the input logs and looks its id up in the registry (``lookup_many``,
   in chunks);
2. a registered click present in some pipeline's output (``joined_clicks``, or
   ``unjoinable`` with the click's once-id) is safe: its token is dropped (``clear_many(...,
   keep_id=True)``; the id keeps refusing every commit), so the registry keeps tokens only
   for clicks that may still need recovery (§3.3.3: "the IdRegistry will only store tokens
   for lost events");
3. a registered click missing from every output: its token names the pipeline that holds
   it (tokens are derived from the pipeline's name, the computation and the key). If that
   pipeline is *running* (its run lock is held), the click is in flight and left alone.
   If it is not, the id is cleared — only if that token still holds it — and the click is
   re-injected into *another* pipeline's ``reinject/`` directory, with a fresh record id;
4. it reports the counts.

Why it cannot duplicate: the holder is not running while it is cleared (verification
holds the lock of every stopped pipeline it reads, so none can start meanwhile); the
re-injected click goes to a different pipeline, whose token differs. If the holder comes
back later and replays its batch, it commits the click again: whichever of the two
commits first writes the click, the other gets a conflict.

>>> from id_registry import InProcessRegistryClient
>>> from topologies.photon.registry import OnceRegistryAdapter
>>> with InProcessRegistryClient() as client:
...     reg = OnceRegistryAdapter(client)
...     clicks = [{"click_id": "c1", "query_id": "q1", "ts": 5}, {"click_id": "c2", "query_id": "q2", "ts": 6}]
...     _ = reg.commit_many([("c1", token("dc1", "q1"), 5), ("c2", token("dc1", "q2"), 6)])  # dc1 then died
...     out = []
...     dc2 = Pipeline("dc2", output={"c1"}, running=True, reinject=out.extend)
...     report = verify(clicks, [Pipeline("dc1", output=set()), dc2], reg)
>>> report.missing, report.recovered, report.tokens_cleared, [c["click_id"] for c in out]
(1, 1, 1, ['c2'])
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from millwheel._once import once_token

from .config import PhotonConfig
from .drivers import LOCK, REINJECT, read_manifest, read_run
from .evaluation import read_records
from .joiner import ADAPTER_SKIPPED, NO_QUERY, REINJECT_ID

#: ids per registry call
CHUNK = 10_000
#: the joiner's name in the topology (part of every token)
JOINER = "Joiner"


def token(pipeline: str, query_id: str, computation: str = JOINER) -> str:
    """The token pipeline ``pipeline`` commits a click of query ``query_id`` with (``millwheel._once``)."""
    return once_token(pipeline, computation, query_id)


@dataclass
class Pipeline:
    """One pipeline as verification sees it: its visible output, whether it runs, how to re-inject into it."""

    name: str
    #: click ids in its ``joined_clicks``, and in its ``unjoinable`` with a once-id
    output: set[str] | Counter[str]
    running: bool = False
    reinject: Callable[[list[dict[str, Any]]], None] | None = None


@dataclass
class VerifyReport:
    clicks: int = 0
    in_output: int = 0
    #: clicks in more than one output (must be 0)
    duplicated: int = 0
    registered: int = 0
    #: registered, in no output
    missing: int = 0
    #: of which: cleared and re-injected (holder stopped), in flight (holder running), held by no known pipeline
    recovered: int = 0
    in_flight: int = 0
    unknown_holder: int = 0
    #: in no output and not registered: not joined yet (or re-injected, pending)
    not_registered: int = 0
    too_old: int = 0
    tokens_cleared: int = 0
    reinjected_into: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    def text(self) -> str:
        dry = self.dry_run
        return (
            f"photon verify{' (dry run: nothing changed)' if dry else ''}: {self.clicks} clicks in the input logs; "
            f"{self.in_output} in the outputs ({self.duplicated} in more than one); {self.registered} registered\n"
            f"  registered but in no output: {self.missing}; {'to recover' if dry else 'recovered'} (cleared, re-injected): "
            f"{self.recovered} {self.reinjected_into}; in flight (holder running): {self.in_flight}; "
            f"held by no known pipeline: {self.unknown_holder}\n"
            f"  not registered and in no output: {self.not_registered}; too old for the registry: {self.too_old}\n"
            f"  tokens of clicks safely in the output {'to clear' if dry else 'cleared'}: {self.tokens_cleared}"
        )


def verify(
    clicks: Sequence[dict[str, Any]],
    pipelines: Sequence[Pipeline],
    registry: Any,
    *,
    config: PhotonConfig | None = None,
    clear_tokens: bool = True,
    dry_run: bool = False,
    now_ms: int | None = None,
) -> VerifyReport:
    """Check every click of the input against the outputs and the registry; recover the lost ones."""
    c = config or PhotonConfig()
    cf, qf = c.click_id_field, c.click_query_field
    by_id: dict[str, dict[str, Any]] = {}
    for click in clicks:
        cid, qid = click.get(cf), click.get(qf)
        if isinstance(cid, str) and cid and qid is not None:
            by_id.setdefault(cid, click)
    seen: Counter[str] = Counter()
    for p in pipelines:
        seen.update(p.output if isinstance(p.output, Counter) else Counter(p.output))
    report = VerifyReport(clicks=len(by_id), dry_run=dry_run)
    report.in_output = sum(1 for cid in by_id if seen[cid])
    report.duplicated = sum(1 for cid in by_id if seen[cid] > 1)
    names = {p.name: p for p in pipelines}
    ids = list(by_id)
    safe: list[tuple[str, str]] = []
    lost: dict[str, list[tuple[str, str | None]]] = {}  # holder pipeline ("" for a cleared token) -> (id, token)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        for cid, found in zip(chunk, registry.lookup_many(chunk), strict=True):
            status = getattr(found.status, "value", found.status)
            if status == "too_old":
                report.too_old += 1
                continue
            if status != "found":
                report.not_registered += not seen[cid]
                continue
            report.registered += 1
            if seen[cid]:
                if found.token is not None:
                    safe.append((cid, found.token))
                continue
            report.missing += 1
            qid = by_id[cid][qf]
            holder = next((n for n in names if found.token is not None and token(n, qid) == found.token), None)
            if found.token is None:
                lost.setdefault("", []).append((cid, None))  # output lost after its token was cleared (§3.3.3 (b))
            elif holder is None:
                report.unknown_holder += 1
            elif names[holder].running:
                report.in_flight += 1
            else:
                lost.setdefault(holder, []).append((cid, found.token))
    for holder, items in lost.items():
        targets = [p for p in pipelines if p.name != holder and p.reinject is not None]
        if not targets:
            report.unknown_holder += len(items)  # nowhere to re-inject: left registered
            continue
        target = next((p for p in targets if p.running), targets[0])
        cleared = [cid for cid, _ in items]
        if not dry_run:
            tokens = [t for _, t in items]
            answers = registry.clear_many(cleared, only_if_token=None if holder == "" else tokens)
            cleared = [cid for cid, a in zip(cleared, answers, strict=True) if getattr(a.status, "value", a.status) in ("cleared", "not_found")]
            stamp = time.time_ns() if now_ms is None else now_ms
            target.reinject([{**by_id[cid], REINJECT_ID: f"{cid}@{stamp}"} for cid in cleared])  # type: ignore[misc]
        report.recovered += len(cleared)
        report.reinjected_into[target.name] = report.reinjected_into.get(target.name, 0) + len(cleared)
    if clear_tokens and safe:
        if not dry_run:
            for start in range(0, len(safe), CHUNK):
                part = safe[start : start + CHUNK]
                answers = registry.clear_many([cid for cid, _ in part], only_if_token=[t for _, t in part], keep_id=True)
                report.tokens_cleared += sum(1 for a in answers if getattr(a.status, "value", a.status) == "cleared")
        else:
            report.tokens_cleared = len(safe)
    return report


# ---------------------------------------------------------------------------------- run dirs
def output_ids(joined: Sequence[dict[str, Any]], unjoinable: Sequence[dict[str, Any]], config: PhotonConfig | None = None) -> Counter[str]:
    """Click ids a pipeline's visible output decides: joined, or unjoinable under the click's once-id."""
    cf = (config or PhotonConfig()).click_id_field
    out: Counter[str] = Counter(j[cf] for j in joined)
    out.update(u["click"][cf] for u in unjoinable if u.get("reason_code") in (NO_QUERY, ADAPTER_SKIPPED))
    return out


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


def verify_runs(runs: Sequence[str | os.PathLike[str]], registry: Any, *, clear_tokens: bool = True, dry_run: bool = False) -> VerifyReport:
    """:func:`verify` over pipelines' run directories (their manifests name the logs and the settings)."""
    manifests = []
    for run in runs:
        m = read_manifest(run)
        if m is None:
            msg = f"{run} is not a Photon run directory (no photon.json); run `millwheel photon run --checkpoint {run}` first"
            raise FileNotFoundError(msg)
        manifests.append(m)
    data = {m["data_dir"] for m in manifests}
    if len(data) != 1:
        msg = f"the runs read different logs: {sorted(data)}; verify pipelines of the same input"
        raise ValueError(msg)
    config = PhotonConfig(**manifests[0]["config"])
    clicks, _ = read_records(Path(data.pop()) / "clicks", config.click_id_field, config.ts_field)
    with contextlib.ExitStack() as stack:
        pipelines = []
        for run, m in zip(runs, manifests, strict=True):
            running = stack.enter_context(_stopped_or_running(Path(run)))
            out = read_run(run)
            pipelines.append(Pipeline(
                m["pipeline"], output_ids(out.joined, out.unjoinable, config), running=running,
                reinject=lambda cl, run=run: write_reinjection(run, cl),
            ))  # fmt: skip
        return verify(clicks, pipelines, registry, config=config, clear_tokens=clear_tokens, dry_run=dry_run)


def report_dict(report: VerifyReport) -> dict[str, Any]:
    return asdict(report)
