"""Productions that happen at most once across pipelines (Photon §2: the IdRegistry).

Exactly-once inside one pipeline comes from the per-key step (dedup, checkpoints). Two
pipelines reading the same logs in two datacenters (Photon, multi-homing) need more: an
event must be joined and emitted by one of them only. A computation asks for it with
``self.produce(stream, value, once_id=click_id)``; the backend commits every such id of a
step batch to a shared registry **in one call** (one round trip per micro-batch and key
interval, not per record), and keeps the production only if its commit succeeded:

* ``COMMITTED`` — this pipeline holds the id; the production goes out. A retry or a
  replayed batch commits the same id with the same token and succeeds again, so the
  replay still produces its output (the token is derived from the pipeline's identity,
  the computation, the key and the production's id — never reused within a pipeline
  epoch, reproduced by a replay (``_identity.py``) — never from wall time or randomness,
  see :func:`once_token`);
* ``CONFLICT`` — another pipeline (another token) holds it: the production is dropped
  and counted (``once_conflicts``): the event was joined elsewhere;
* ``TOO_OLD`` — the event is older than the registry's garbage-collection boundary
  (§2.3): it can no longer be deduplicated, so it goes to ``dead_letters`` with the
  reason (stage ``once_too_old``) instead of risking a duplicate.

:class:`MemoryOnceRegistry` is the in-process registry (tests, the harness, one
pipeline); ``id_registry`` is the service with durable, replicated backends.

>>> reg = MemoryOnceRegistry()
>>> reg.commit_many([("c1", "dc1", 10), ("c1", "dc1", 10), ("c1", "dc2", 10)])
[<OnceResult.COMMITTED: 'committed'>, <OnceResult.COMMITTED: 'committed'>, <OnceResult.CONFLICT: 'conflict'>]
"""

from __future__ import annotations

import enum
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import xxhash

from millwheel._deadletter import DEAD_LETTER_STREAM, DeadLetter, Stage, dead_letter_record
from millwheel._errors import ComputationError, MillwheelError, SettingsError
from millwheel._record import Key, Production


class OnceResult(str, enum.Enum):
    COMMITTED = "committed"
    CONFLICT = "conflict"
    TOO_OLD = "too_old"


class OnceRegistry(Protocol):
    """What the backends need from an IdRegistry: conditional commits, in bulk."""

    def commit_many(self, items: Sequence[tuple[str, str, int]]) -> list[OnceResult]:
        """Commit ``(id, token, event time)`` items; one result per item, in order."""
        ...


class MemoryOnceRegistry:
    """An in-process registry: first token wins; a garbage-collection boundary that only moves forward."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self._lock = threading.Lock()
        self.gc_boundary: int | None = None
        self.calls = 0

    def commit_many(self, items: Sequence[tuple[str, str, int]]) -> list[OnceResult]:
        out: list[OnceResult] = []
        with self._lock:
            self.calls += 1
            for rid, token, ts in items:
                if self.gc_boundary is not None and ts < self.gc_boundary:
                    out.append(OnceResult.TOO_OLD)
                    continue
                holder = self._held.setdefault(rid, token)
                out.append(OnceResult.COMMITTED if holder == token else OnceResult.CONFLICT)
        return out

    def holder(self, rid: str) -> str | None:
        return self._held.get(rid)

    def holders(self, ids: Sequence[str]) -> list[str | None]:
        """The token holding each id (``None``: not held)."""
        with self._lock:
            return [self._held.get(rid) for rid in ids]

    def clear_many(
        self, ids: Sequence[str], *, only_if_token: Sequence[str] | None = None
    ) -> list[str]:
        """Forget ids (only those still held by the given tokens): ``cleared``, ``not_found`` or ``token_mismatch`` each."""
        out = []
        with self._lock:
            for i, rid in enumerate(ids):
                held = self._held.get(rid)
                if held is None:
                    out.append("not_found")
                elif only_if_token is not None and held != only_if_token[i]:
                    out.append("token_mismatch")
                else:
                    del self._held[rid]
                    out.append("cleared")
        return out

    def clear(self, rid: str) -> None:
        """Forget an id (verification's recovery: a registered click missing from the output)."""
        with self._lock:
            self._held.pop(rid, None)


def once_token(
    pipeline: str, computation: str, key: Key | None, production: str | None = None
) -> str:
    """The token a pipeline commits a once-id with: the same on every replay, and only then.

    ``pipeline`` is the pipeline's identity, :func:`pipeline_id`: its name and the epoch of
    its run directory; ``production`` the production's id, which is never reused within a
    pipeline epoch and which a replay reproduces (``millwheel/_identity.py``: the key's
    life, fixed by the batch of its first production, and its committed sequence number) —
    a replay of a batch makes the same productions with the same ids (same token:
    ``COMMITTED`` again), while the same event delivered again later (a duplicate beyond
    the pipeline's dedup horizon, a click log shipped late, even after its key was
    collected and forgotten) is a new production (another token: ``CONFLICT``). So the
    registry, not a pipeline's in-memory horizon, judges old events until its
    garbage-collection boundary (Photon §2.3).

    A token of an identity with an epoch names it in clear (``dc1#3f2a…:<hash>``), so
    verification tells from the registry alone which pipeline and epoch hold an id
    (:func:`holder_of`); an identity without one (a run directory started before epochs)
    keeps the bare hash of (name, computation, key) its replays committed with.

    >>> t = once_token("dc1#e1", "Joiner", "q1", "Joiner:q1:7")
    >>> t.startswith("dc1#e1:"), t == once_token("dc1#e1", "Joiner", "q1", "Joiner:q1:7"), t == once_token("dc1#e1", "Joiner", "q1", "Joiner:q1:9")
    (True, True, False)
    """
    if "#" not in pipeline:
        return xxhash.xxh3_128_hexdigest(f"{pipeline}\x00{computation}\x00{key!r}".encode())
    digest = xxhash.xxh3_128_hexdigest(
        f"{pipeline}\x00{computation}\x00{key!r}\x00{production}".encode()
    )
    return f"{pipeline}:{digest}"


def pipeline_id(name: str, epoch: str) -> str:
    """A pipeline's identity in its once-tokens: ``name#epoch`` (``name`` alone without an epoch).

    The epoch is drawn when a run directory first starts and kept with its checkpoint, so a
    replay commits with the same tokens, and a second run directory — or the same one
    started again from a lost or deleted checkpoint — is a new epoch whose commits
    *conflict* with the old one's instead of repeating them.
    """
    if not name or "#" in name or ":" in name or len(name) > 64:
        msg = f"a pipeline name is 1 to 64 characters without '#' or ':', got {name!r}"
        raise SettingsError(msg)
    return f"{name}#{epoch}" if epoch else name


def new_epoch() -> str:
    return uuid.uuid4().hex[:16]


def holder_of(token: str | None) -> str | None:
    """The pipeline identity (``name#epoch``) a once-token names, or ``None`` (a bare or cleared token).

    >>> holder_of(once_token("dc1#e1", "Joiner", "q1")), holder_of("0f" * 16), holder_of(None)
    ('dc1#e1', None, None)
    """
    if not token or ":" not in token:
        return None
    head = token.rsplit(":", 1)[0]
    return head if "#" in head else None


# ---- the roster: which pipelines share a registry -----------------------------------------
#: roster entries are registry ids ``ROSTER_PREFIX + slot``, committed with the member as token
ROSTER_PREFIX = "millwheel.pipeline/"
#: their event time: never behind a registry's garbage-collection boundary
ROSTER_TIME = 2**62


@dataclass(frozen=True, slots=True)
class Member:
    """One pipeline identity that joined a registry, and where its run directory is."""

    pipeline: str
    epoch: str
    where: str

    @property
    def id(self) -> str:
        return pipeline_id(self.pipeline, self.epoch)

    def token(self) -> str:
        return f"{self.id}@{self.where}"[:256]

    @classmethod
    def parse(cls, token: str) -> Member | None:
        ident, _, where = token.partition("@")
        name, _, epoch = ident.partition("#")
        return cls(name, epoch, where) if name else None


class PipelineNameTaken(MillwheelError, RuntimeError):
    """Another run directory holds this pipeline name in the registry (also a ``RuntimeError``,
    as it was before it was a :class:`~millwheel.MillwheelError`)."""


def roster(registry: Any) -> list[Member]:
    """Every pipeline identity that joined ``registry`` (``[]`` when it cannot tell)."""
    holders = getattr(registry, "holders", None)
    if holders is None:
        return []
    out: list[Member] = []
    slot = 0
    while True:
        ids = [f"{ROSTER_PREFIX}{i}" for i in range(slot, slot + 32)]
        found = list(holders(ids))
        for token in found:
            if token is None:
                return out
            member = Member.parse(token)
            if member is not None:
                out.append(member)
        slot += 32


def join_roster(registry: Any, name: str, epoch: str, where: str) -> list[Member]:
    """Enter this pipeline identity in the registry's roster; the roster as it is then.

    Refused (:class:`PipelineNameTaken`) when another run directory (another ``where``)
    holds ``name``: two run directories under one name would be one pipeline to
    verification. The same directory under a new epoch (it lost its checkpoint) joins
    beside its old epoch, whose commits now conflict with its own.
    """
    if not hasattr(registry, "holders"):
        return []
    me = Member(name, epoch, where)
    while True:
        members = roster(registry)
        if any(m == me for m in members):
            return members
        other = next((m for m in members if m.pipeline == name and m.where != where), None)
        if other is not None:
            msg = (
                f"pipeline name {name!r} is held in this IdRegistry by the run directory {other.where} "
                f"(epoch {other.epoch or '-'}); two run directories under one name would emit a click twice. "
                f"Give this run its own name (--pipeline NAME), or resume that run directory"
            )
            raise PipelineNameTaken(msg)
        slot = f"{ROSTER_PREFIX}{len(members)}"
        (result,) = registry.commit_many([(slot, me.token(), ROSTER_TIME)])
        if OnceResult(getattr(result, "value", result)) is OnceResult.COMMITTED:
            return [*members, me]
        # another pipeline took the slot meanwhile: read the roster again


#: the end of a tentative production's token: the id yields to a production that is not tentative
TENTATIVE = "~"


def _take_over(
    registry: Any,
    items: list[tuple[str, str, int]],
    results: list[OnceResult],
    tentative: list[bool],
    outcome: OnceOutcome,
) -> None:
    """A production that is not tentative takes its id over from a tentative holder
    (conditionally: only if that token still holds it), and commits it; ``results`` updated in place."""
    want = [
        i
        for i, (r, t) in enumerate(zip(results, tentative, strict=True))
        if r is OnceResult.CONFLICT and not t
    ]
    holders_of = getattr(registry, "holders", None)
    clear_many = getattr(registry, "clear_many", None)
    if not want or holders_of is None or clear_many is None:
        return
    holders = holders_of([items[i][0] for i in want])
    steal = [
        (i, h)
        for i, h in zip(want, holders, strict=True)
        if h is not None and h.endswith(TENTATIVE)
    ]
    if not steal:
        return
    answers = clear_many([items[i][0] for i, _ in steal], only_if_token=[h for _, h in steal])
    cleared = [
        i
        for (i, _), a in zip(steal, answers, strict=True)
        if _answer(a) in ("cleared", "not_found")
    ]
    if not cleared:
        return
    again = registry.commit_many([items[i] for i in cleared])
    for i, r in zip(cleared, again, strict=True):
        results[i] = OnceResult(getattr(r, "value", r))
        if results[i] is OnceResult.COMMITTED:
            outcome.taken_over += 1


def _answer(a: Any) -> str:
    """A clear answer's status as text, from a registry client's result or a plain string."""
    status = getattr(a, "status", a)
    return str(getattr(status, "value", status))


@dataclass(slots=True)
class OnceOutcome:
    """What resolving a batch's once-productions decided."""

    #: ids of productions to drop (conflicts and too-old ones)
    dropped: set[str] = field(default_factory=set)
    #: dead letters for too-old ones
    dead_letters: list[Production] = field(default_factory=list)
    conflicts: int = 0
    committed: int = 0
    #: of the committed: ids taken over from a tentative holder
    taken_over: int = 0


def resolve_once(
    productions: Sequence[tuple[Key | None, Production]],
    registry: OnceRegistry | None,
    *,
    pipeline: str,
    computation: str,
) -> OnceOutcome:
    """Commit the once-ids of ``(key, production)`` pairs in one call; say which to drop."""
    outcome = OnceOutcome()
    todo = [(key, p) for key, p in productions if p.once_id is not None]
    if not todo:
        return outcome
    if registry is None:
        msg = (
            f"computation {computation!r} produced with once_id=..., which needs an IdRegistry shared by the "
            "pipelines: pass registry=... to the Harness or to the runtime (RuntimeSettings.registry_url)"
        )
        raise ComputationError(msg)
    items: list[tuple[str, str, int]] = [
        (
            str(p.once_id),
            once_token(pipeline, computation, key, p.record.id)
            + (TENTATIVE if p.once_tentative else ""),
            p.record.timestamp,
        )
        for key, p in todo
    ]
    results = [OnceResult(getattr(r, "value", r)) for r in registry.commit_many(items)]  # type: ignore[arg-type]
    if len(results) != len(items):
        msg = f"the IdRegistry answered {len(results)} results for {len(items)} commits"
        raise ComputationError(msg)
    _take_over(registry, items, results, [p.once_tentative for _, p in todo], outcome)
    for (key, p), status in zip(todo, results, strict=True):
        if status is OnceResult.COMMITTED:
            outcome.committed += 1
            continue
        outcome.dropped.add(p.record.id)
        if status is OnceResult.CONFLICT:
            outcome.conflicts += 1
            continue
        letter = DeadLetter(
            Stage.ONCE_TOO_OLD,
            f"once_id {p.once_id!r} (event time {p.record.timestamp}) is older than the IdRegistry's "
            "garbage-collection boundary: it can no longer be deduplicated across pipelines",
            computation=computation,
            stream=p.stream,
            key=key,
            record=p.record,
        )
        outcome.dead_letters.append(
            Production(
                DEAD_LETTER_STREAM, dead_letter_record(letter, p.record.timestamp, p.once_id)
            )
        )
    return outcome
