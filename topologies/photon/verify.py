"""Verification and recovery (Photon §3.3.3): every registered click against the union of the outputs.

A pipeline commits a click id to the IdRegistry in its worker, then its micro-batch
commits and its output becomes visible. A pipeline killed in between — and never
restarted: its datacenter is gone — leaves the id registered under its token with no
joined event anywhere, and every other pipeline's commit of that click is a conflict.
(A restarted pipeline replays the batch with the same token and writes the output
itself: that case heals on its own.) :func:`verify`:

1. learns every pipeline of the registry from the registry itself (its roster,
   ``millwheel/_once.py``: each run directory's name, epoch and place) — not only the
   runs it is given;
2. reads every click of the input logs and looks its id up in the registry (``lookup_many``,
   in chunks); a click's token names the pipeline identity (``name#epoch``) that holds it;
3. a registered click in some given pipeline's output — ``joined_clicks``, ``unjoinable``
   with the click's once-id, or a batch a stopped pipeline committed but did not publish
   yet (its restart publishes it) — is safe and left alone;
4. a registered click in no given output: if its holder is a given pipeline that is
   *running* (its run lock is held), it is in flight and left alone. If the holder is a
   given pipeline that is stopped, or an earlier epoch of a given run directory (it lost
   its checkpoint: that epoch can never run again), the id is cleared — only if that
   token still holds it — and the click is re-injected, with a fresh record id, into a
   given pipeline (another one if there is one). If the holder is a pipeline whose run
   is *not* given, or no pipeline the roster knows, it is reported and left alone;
5. a click given up (a tentative token holds it) and joined nowhere is *offered* — the
   registry left as it is — to each member that has not decided it, was not offered it
   before, and has its query: a member whose own commit of the click was refused by a
   holder that verification cleared later (step 4) never decides it otherwise, and the
   pipeline that took the re-injection may lack the query. The member's join takes the id
   over from the give-up (§3.3.2, ``millwheel/_once.py``); its give-up conflicts and is
   dropped;
6. it reports the counts.

Why it cannot duplicate, whatever subset of runs it is given and whenever it runs: it
acts only on holders whose whole output it has read (published and staged) and that
cannot write meanwhile (it holds the lock of every stopped pipeline it reads, so none can
start); it never clears the token of a click that is safe, so a later verification of
other runs still knows who holds it; a re-injected click is committed under the target's
own token, so if the holder came back it would conflict. Tokens of safe clicks are
cleared only on request (``clear_tokens=True``, Photon's space saving; never a give-up's
tentative token, which lets a join take the id over), and an id whose token was cleared
is recovered only when every pipeline of the roster is given.

>>> from id_registry import InProcessRegistryClient
>>> from millwheel.once import join_roster
>>> from topologies.photon.registry import OnceRegistryAdapter
>>> with InProcessRegistryClient() as client:
...     reg = OnceRegistryAdapter(client)
...     clicks = [{"click_id": "c1", "query_id": "q1", "ts": 5}, {"click_id": "c2", "query_id": "q2", "ts": 6}]
...     for name, epoch in (("dc1", "e1"), ("dc2", "e2")):  # their starts join the registry's roster
...         _ = join_roster(reg, name, epoch, f"host:/runs/{name}")
...     _ = reg.commit_many([("c1", token("dc1#e1", "q1"), 5), ("c2", token("dc1#e1", "q2"), 6)])  # dc1 then died
...     out = []
...     dc2 = Pipeline("dc2", output={"c1"}, running=True, reinject=out.extend, epoch="e2")
...     report = verify(clicks, [Pipeline("dc1", output=set(), epoch="e1"), dc2], reg)
>>> report.missing, report.recovered, report.holder_not_given, [c["click_id"] for c in out]
(1, 1, 0, ['c2'])
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from millwheel.once import TENTATIVE, holder_of, once_token, pipeline_id, roster

from .config import PhotonConfig
from .joiner import REINJECT_ID

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
    #: click ids in its ``joined_clicks``, and in its ``unjoinable`` with a once-id (with
    #: what a stopped pipeline committed and has not published yet)
    output: set[str] | Counter[str]
    running: bool = False
    reinject: Callable[[list[dict[str, Any]]], None] | None = None
    #: click ids it gave up (``unjoinable``, ``no_query``): tentative, a join elsewhere supersedes them
    gave_up: set[str] = field(default_factory=set)
    #: its run directory's epoch (``""``: a run directory from before epochs)
    epoch: str = ""
    #: where its run directory is, as the registry's roster says (``None``: unknown)
    where: str | None = None
    #: its run directory, as reports name it (``None``: a pipeline without one, e.g. in the harness)
    run: str | None = None
    #: click ids re-injected into it before (its ``reinject/`` files): a given-up click is offered once
    offered: set[str] = field(default_factory=set)
    #: whether its query log holds a query id (``None``: cannot tell; offers go ahead)
    has_query: Callable[[Any], bool] | None = None

    @property
    def identity(self) -> str:
        return pipeline_id(self.name, self.epoch)

    @property
    def place(self) -> str:
        """What a report calls it: its run directory, else its name."""
        return self.run or self.name

    def decided(self, cid: str) -> bool:
        """It has ``cid`` in its output already: joined, skipped or given up."""
        return bool(self.output and cid in self.output) or cid in self.gave_up

    def may_join(self, cid: str, query_id: Any) -> bool:
        """A given-up click may be offered to it: undecided here, never offered, its query at hand."""
        return (
            not self.decided(cid)
            and cid not in self.offered
            and (self.has_query is None or self.has_query(query_id))
        )


class AmbiguousTargetError(ValueError):
    """More than one given run directory could take a re-injection: the caller names one."""


@dataclass
class VerifyReport:
    clicks: int = 0
    in_output: int = 0
    #: clicks in more than one output (must be 0)
    duplicated: int = 0
    #: clicks one pipeline gave up and another joined: the give-up report is superseded
    superseded_give_ups: int = 0
    registered: int = 0
    #: registered, in no output
    missing: int = 0
    #: of which: cleared and re-injected (holder stopped), in flight (holder running), held by a
    #: pipeline whose run was not given (or one the roster does not know): left alone
    recovered: int = 0
    in_flight: int = 0
    holder_not_given: int = 0
    #: registered with a cleared token and in no given output: left alone unless every
    #: pipeline of the roster is given
    cleared_elsewhere: int = 0
    #: pipelines of the registry's roster whose runs were not given
    pipelines_not_given: list[str] = field(default_factory=list)
    #: in no output and not registered: not joined yet (or re-injected, pending)
    not_registered: int = 0
    too_old: int = 0
    tokens_cleared: int = 0
    #: re-injected clicks per run directory (a pipeline's name when it has none)
    reinjected_into: dict[str, int] = field(default_factory=dict)
    #: registered to a stopped holder, in no output, and no member of the roster that has not
    #: decided it already could take it: left registered (re-injecting it would decide it twice)
    no_target: int = 0
    #: given run directories the registry's roster does not know (a start refused under a taken
    #: name): read, never written into
    not_members: list[str] = field(default_factory=list)
    #: clicks given up (tentatively) and joined nowhere, offered to members that have their
    #: query and never decided them (the registry unchanged: a join takes the id over)
    offered: int = 0
    offered_into: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    def text(self) -> str:
        dry = self.dry_run
        return (
            f"photon verify{' (dry run: nothing changed)' if dry else ''}: {self.clicks} clicks in the input logs; "
            f"{self.in_output} in the outputs ({self.duplicated} in more than one; {self.superseded_give_ups} given up in one "
            f"pipeline and joined in another); {self.registered} registered\n"
            f"  registered but in no output: {self.missing}; {'to recover' if dry else 'recovered'} (cleared, re-injected): "
            f"{self.recovered}{''.join(f'; {n} into {place}' for place, n in sorted(self.reinjected_into.items()))}; "
            f"in flight (holder running): {self.in_flight}; "
            f"held by a pipeline whose run was not given: {self.holder_not_given}; token cleared, maybe in a "
            f"run not given: {self.cleared_elsewhere}; no member left to take it (every one decided it): {self.no_target}\n"
            + (
                f"  pipelines of the registry not given (verify them too): {', '.join(self.pipelines_not_given)}\n"
                if self.pipelines_not_given
                else ""
            )
            + (
                f"  given but not members of the registry's roster (never written into): {', '.join(self.not_members)}\n"
                if self.not_members
                else ""
            )
            + (
                f"  given up, joined nowhere, {'to offer' if dry else 'offered'} to a member with the query: "
                f"{self.offered}{''.join(f'; {n} into {place}' for place, n in sorted(self.offered_into.items()))}\n"
                if self.offered
                else ""
            )
            + f"  not registered and in no output: {self.not_registered}; too old for the registry: {self.too_old}\n"
            f"  tokens of clicks safely in the output {'to clear' if dry else 'cleared'}: {self.tokens_cleared}"
        )


def verify(
    clicks: Sequence[dict[str, Any]],
    pipelines: Sequence[Pipeline],
    registry: Any,
    *,
    config: PhotonConfig | None = None,
    clear_tokens: bool = False,
    dry_run: bool = False,
    now_ms: int | None = None,
    target: str | None = None,
) -> VerifyReport:
    """Check every click of the input against the outputs and the registry; recover the lost ones.

    ``target``: the pipeline (its run directory, or its name) that takes re-injections where
    more than one could (:class:`AmbiguousTargetError` without it, before anything changes).
    """
    c = config or PhotonConfig()
    cf, qf = c.click_id_field, c.click_query_field
    by_id: dict[str, dict[str, Any]] = {}
    for click in clicks:
        cid, qid = click.get(cf), click.get(qf)
        if isinstance(cid, str) and cid and qid is not None:
            by_id.setdefault(cid, click)
    seen: Counter[str] = Counter()
    gave_up: set[str] = set()
    for p in pipelines:
        seen.update(p.output if isinstance(p.output, Counter) else Counter(p.output))
        gave_up |= p.gave_up
    report = VerifyReport(clicks=len(by_id), dry_run=dry_run)
    report.in_output = sum(1 for cid in by_id if seen[cid] or cid in gave_up)
    report.duplicated = sum(1 for cid in by_id if seen[cid] > 1)
    report.superseded_give_ups = sum(1 for cid in by_id if seen[cid] and cid in gave_up)
    given = {p.identity: p for p in pipelines}
    # the registry's own list of pipelines: an earlier epoch of a given run directory is
    # dead for good (its checkpoint is gone); any other member not given is left alone
    members = roster(registry)
    # a dead epoch -> the give-ups its directory shows: those of every given pipeline of that
    # directory (whichever of them comes first, so the answer does not depend on their order)
    dead: dict[str, set[str]] = {}
    for m in members:
        if m.id not in given:
            for p in pipelines:
                if p.where is not None and p.where == m.where and p.name == m.pipeline:
                    dead.setdefault(m.id, set()).update(p.gave_up)
    report.pipelines_not_given = sorted({m.id for m in members} - set(given) - set(dead))
    # only a member of the roster takes re-injections: a directory whose start was refused
    # (its name held by another) never runs, and what went there would be stranded
    known = {m.id: m.where for m in members}
    member = [
        p.identity in known and (p.where is None or known[p.identity] == p.where) for p in pipelines
    ]
    takers = [p for p, ok in zip(pipelines, member, strict=True) if ok and p.reinject is not None]
    report.not_members = sorted(p.place for p, ok in zip(pipelines, member, strict=True) if not ok)
    chosen = _chosen(target, pipelines)
    everyone = bool(members) and not report.pipelines_not_given
    ids = list(by_id)
    safe: list[tuple[str, str]] = []
    given_up_only: list[str] = []
    lost: dict[
        str, list[tuple[str, str | None]]
    ] = {}  # holder identity ("" for a cleared token) -> (id, token)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        for cid, found in zip(chunk, registry.lookup_many(chunk), strict=True):
            status = getattr(found.status, "value", found.status)
            if status == "too_old":
                report.too_old += 1
                continue
            if status != "found":
                report.not_registered += not seen[cid] and cid not in gave_up
                continue
            report.registered += 1
            # safe: in an output; or given up, and the id still held by a give-up (a tentative
            # token: a join would have taken it over)
            if seen[cid] or (
                cid in gave_up and (found.token is None or found.token.endswith(TENTATIVE))
            ):
                if found.token is not None and seen[cid]:
                    # a give-up's tentative token stays: it is what lets a join take the id over
                    safe.append((cid, found.token))
                if not seen[cid] and found.token is not None:
                    # offered on only once its holder's give-up is visible (else: in flight)
                    holder = _holder(found.token, by_id[cid][qf], pipelines)
                    owner = given.get(holder or "")
                    shows = owner.gave_up if owner is not None else dead.get(holder or "", set())
                    if cid in shows:
                        given_up_only.append(cid)
                continue
            report.missing += 1
            if (
                found.token is None
            ):  # output lost after its token was cleared (§3.3.3 (b)), or in a run not given
                if everyone:
                    lost.setdefault("", []).append((cid, None))
                else:
                    report.cleared_elsewhere += 1
                continue
            holder = _holder(found.token, by_id[cid][qf], pipelines)
            if holder in given and given[holder].running:
                report.in_flight += 1
            elif holder in given or holder in dead:
                lost.setdefault(holder, []).append((cid, found.token))
            else:
                report.holder_not_given += 1
    plan = _plan(lost, takers, chosen, report)
    for ident, items in plan.items():
        tp = given[ident]
        cleared = [cid for cid, _ in items]
        if not dry_run:
            cleared = _clear(registry, items)
            stamp = time.time_ns() if now_ms is None else now_ms
            tp.reinject([{**by_id[cid], REINJECT_ID: f"{cid}@{stamp}"} for cid in cleared])  # type: ignore[misc]
        report.recovered += len(cleared)
        report.reinjected_into[tp.place] = report.reinjected_into.get(tp.place, 0) + len(cleared)
    _offer(given_up_only, by_id, qf, takers, report, now_ms=now_ms)
    if clear_tokens and safe:
        if not dry_run:
            for start in range(0, len(safe), CHUNK):
                part = safe[start : start + CHUNK]
                answers = registry.clear_many(
                    [cid for cid, _ in part], only_if_token=[t for _, t in part], keep_id=True
                )
                report.tokens_cleared += sum(
                    1 for a in answers if getattr(a.status, "value", a.status) == "cleared"
                )
        else:
            report.tokens_cleared = len(safe)
    return report


def _plan(
    lost: dict[str, list[tuple[str, str | None]]],
    takers: Sequence[Pipeline],
    chosen: Pipeline | None,
    report: VerifyReport,
) -> dict[str, list[tuple[str, str | None]]]:
    """Each lost click's target (identity -> (id, token)), decided before anything changes;
    :class:`AmbiguousTargetError` where more than one could take a click and none was chosen.
    Lost clicks of a cleared token (holder ``""``) are cleared unconditionally."""
    plan: dict[str, list[tuple[str, str | None]]] = {}
    ambiguous: dict[tuple[str, ...], int] = {}
    for holder, items in lost.items():
        for cid, tok in items:
            tier = _candidates(holder, cid, takers)
            if chosen is not None and chosen in tier:
                tier = [chosen]
            if not tier:
                report.no_target += 1
            elif len(tier) > 1:
                key = tuple(f"{p.place} ({p.name}{', running' if p.running else ''})" for p in tier)
                ambiguous[key] = ambiguous.get(key, 0) + 1
            else:
                plan.setdefault(tier[0].identity, []).append((cid, tok))
    if ambiguous:
        lines = "; ".join(
            f"{n} clicks lost by their holder could go to any of {', '.join(k)}"
            for k, n in ambiguous.items()
        )
        msg = (
            f"verification would re-inject lost clicks, and more than one run directory could take them: {lines}. "
            f"Name the one that takes them (photon verify RUN... --target RUN); nothing was changed"
        )
        raise AmbiguousTargetError(msg)
    return plan


def _offer(
    cids: Sequence[str],
    by_id: dict[str, dict[str, Any]],
    qf: str,
    takers: Sequence[Pipeline],
    report: VerifyReport,
    *,
    now_ms: int | None,
) -> None:
    """Offer clicks given up and joined nowhere to every member that may join them
    (:meth:`Pipeline.may_join`); the registry is not touched: the give-up's tentative token
    holds each id until a join takes it over. Each member is offered a click once (its
    ``reinject/`` files remember), so a click nobody can join is offered a bounded number
    of times."""
    into: dict[int, list[str]] = {}
    for cid in cids:
        for i, p in enumerate(takers):
            if p.may_join(cid, by_id[cid][qf]):
                into.setdefault(i, []).append(cid)
    for i, chosen in sorted(into.items()):
        tp = takers[i]
        if not report.dry_run:
            stamp = time.time_ns() if now_ms is None else now_ms
            tp.reinject([{**by_id[cid], REINJECT_ID: f"{cid}@{stamp}"} for cid in chosen])  # type: ignore[misc]
            tp.offered.update(chosen)
        report.offered += len(chosen)
        report.offered_into[tp.place] = report.offered_into.get(tp.place, 0) + len(chosen)


def _clear(registry: Any, items: list[tuple[str, str | None]]) -> list[str]:
    """Clear lost ids — each only while its holder's token still holds it; an id whose token
    was cleared (``None``) unconditionally — and return those cleared (or already gone)."""
    out: list[str] = []
    for conditional in (True, False):
        part = [(cid, t) for cid, t in items if (t is not None) == conditional]
        if part:
            ids = [cid for cid, _ in part]
            answers = registry.clear_many(
                ids, only_if_token=[t for _, t in part] if conditional else None
            )
            out += [
                cid
                for cid, a in zip(ids, answers, strict=True)
                if getattr(a.status, "value", a.status) in ("cleared", "not_found")
            ]
    return out


def _chosen(target: str | None, pipelines: Sequence[Pipeline]) -> Pipeline | None:
    """The given pipeline ``target`` names (its run directory, or its name)."""
    if target is None:
        return None
    real = os.path.realpath(target)
    found = [
        p
        for p in pipelines
        if (p.run is not None and os.path.realpath(p.run) == real) or p.name == target
    ]
    if len(found) != 1:
        msg = f"--target {target} is not one of the run directories given ({', '.join(p.place for p in pipelines)})"
        raise ValueError(msg)
    return found[0]


def _candidates(holder: str, cid: str, takers: Sequence[Pipeline]) -> list[Pipeline]:
    """Who may take a lost click of ``holder``: members that have not decided it already —
    other pipelines, the running ones first, else the holder's own run directory (its restart
    consumes it). A pipeline that joined or gave the click up never gets it again: it would
    decide it twice."""
    free = [p for p in takers if not p.decided(cid)]
    others = [p for p in free if p.identity != holder]
    running = [p for p in others if p.running]
    return running or others or [p for p in free if p.identity == holder]


def _holder(found_token: str, query_id: str, pipelines: Sequence[Pipeline]) -> str | None:
    """The pipeline identity a token names; a bare token (a run directory from before epochs)
    is matched against the given pipelines' names."""
    named = holder_of(found_token)
    if named is not None:
        return named
    return next(
        (p.identity for p in pipelines if not p.epoch and token(p.name, query_id) == found_token),
        None,
    )
