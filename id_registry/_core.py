"""The IdRegistry's logic (Photon §2): conditional commits, lookups, clears, GC, resharding.

A :class:`Registry` is used by one thread at a time (the service's registry thread, see
:mod:`id_registry._worker`); it keeps the metadata it last read from its backend and
re-reads it when the backend says another server changed it.

>>> r = Registry(clock=lambda: 10_000)
>>> r.commit_many([("click-1", "joiner-a", 1_000), ("click-2", "joiner-a", 1_000)])
[CommitResult(status=Status.COMMITTED, holder=None), CommitResult(status=Status.COMMITTED, holder=None)]
>>> r.commit_many([("click-1", "joiner-a", 1_000), ("click-1", "joiner-b", 1_000)])   # a retry; another joiner
[CommitResult(status=Status.COMMITTED, holder=None), CommitResult(status=Status.CONFLICT, holder='joiner-a')]
>>> r.advance_gc(2_000)
GcResult(boundary_ms=2000, deleted=2)
>>> r.commit_many([("click-3", "joiner-a", 1_999)])
[CommitResult(status=Status.TOO_OLD, holder=None)]
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import msgpack  # type: ignore[import-untyped]
from xxhash import xxh3_64_intdigest

from id_registry._backend import Backend, MemoryBackend, MetaChangedError, Replace
from id_registry._errors import GcBackwardsError, InvalidRequestError, ReshardError
from id_registry._model import (
    COMMITTED,
    ENTRY_KEY,
    EVENT_ID,
    EVENT_TIME,
    INDEX_KEY,
    TIME_OFFSET,
    TOKEN,
    TOO_OLD,
    ClearResult,
    CommitResult,
    Item,
    LookupResult,
    Meta,
    ShardConfig,
    ShardMap,
    Status,
    check_ids,
    check_items,
    check_shard_count,
    check_time,
    check_tokens,
    entry_key,
    index_key,
    pack_entry,
    shard_hash,
    unpack_entry,
)
from servicekit import INT64_MIN

#: shards of a new registry (key prefixes: what a later scale-out can move as a unit)
DEFAULT_SHARD_COUNT = 16
#: a new shard configuration takes effect at least this far in the future (Photon's S, the clock-skew bound)
DEFAULT_RESHARD_LEAD_MS = 60_000
#: garbage collection deletes this many entries per durable write
GC_CHUNK = 10_000
#: how often an operation is retried when another server changed the metadata meanwhile
META_RETRIES = 20

T = TypeVar("T")
_unpackb = msgpack.unpackb


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class GcResult(NamedTuple):
    """What :meth:`Registry.advance_gc` did: the boundary now in force and how many entries it deleted."""

    boundary_ms: int
    deleted: int


class Stats:
    """Counters for the status page, and the last :attr:`HISTORY_SECONDS` seconds of them second by
    second for the stats page (``/v1/stats``); written by the registry thread only, read by anyone.

    A *group* is one call of :meth:`Registry.commit_many`: at most one durable write, carrying
    every request the registry thread coalesced (Photon §2.2.1).

    >>> now = [1_000.5]
    >>> st = Stats(clock=lambda: now[0])
    >>> st.record_group(3, new=2, repeated=0, conflicts=1, too_old=0)
    >>> st.record_requests(2)
    >>> now[0] = 1_002.0
    >>> h = st.history(3)
    >>> h["t"], h["commits"], h["conflicts"], h["requests"], h["groups"], h["group_items"], h["group_max"]
    ([999000, 1000000, 1001000], [0, 2, 0], [0, 1, 0], [0, 2, 0], [0, 1, 0], [0, 3, 0], [0, 3, 0])
    """

    #: the commits/s figure is averaged over this many seconds
    RATE_WINDOW = 10
    #: seconds of per-second figures kept
    HISTORY_SECONDS = 600
    #: the per-second figures: COMMITTED answers (first commits and same-token repeats), CONFLICT and
    #: TOO_OLD answers, commit requests answered, groups, their items, the largest group's items
    COLUMNS = ("commits", "conflicts", "too_old", "requests", "groups", "group_items", "group_max")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started_ms = int(clock() * 1000)
        self.committed = 0  # ids committed for the first time
        self.repeated = 0  # COMMITTED again with the holder's token: retries, replays
        self.conflicts = 0
        self.too_old = 0
        self.lookups = 0
        self.cleared = 0
        self.throttled = 0
        self.groups = 0  # commit groups, each at most one durable write
        self.group_items = 0  # items in them
        self.requests = 0  # commit requests answered
        #: groups by size: bucket k counts groups of 2**k .. 2**(k+1) - 1 items
        self.group_sizes = [0] * 24
        #: [second, *COLUMNS] per second with any commit, oldest first
        self._seconds: deque[list[int]] = deque(maxlen=self.HISTORY_SECONDS + 1)
        self._lock = threading.Lock()

    def _bucket(self) -> list[int]:
        second = int(self.clock())
        if not self._seconds or self._seconds[-1][0] != second:
            self._seconds.append([second] + [0] * len(self.COLUMNS))
        return self._seconds[-1]

    def record_group(
        self, items: int, new: int, repeated: int, conflicts: int, too_old: int
    ) -> None:
        self.groups += 1
        self.group_items += items
        self.committed += new
        self.repeated += repeated
        self.conflicts += conflicts
        self.too_old += too_old
        self.group_sizes[min(max(items, 1).bit_length() - 1, len(self.group_sizes) - 1)] += 1
        with self._lock:
            b = self._bucket()
            b[1] += new + repeated
            b[2] += conflicts
            b[3] += too_old
            b[5] += 1
            b[6] += items
            b[7] = max(b[7], items)

    def record_requests(self, requests: int) -> None:
        """``requests`` commit requests were answered (the registry thread, once per group)."""
        self.requests += requests
        with self._lock:
            self._bucket()[4] += requests

    def history(self, seconds: int) -> dict[str, list[int]]:
        """The last ``seconds`` full seconds (the current one is still counting), as columns: ``t``
        (each second's start, wall ms) and one list per name of :attr:`COLUMNS`, zeros included."""
        end = int(self.clock())
        start = end - seconds
        with self._lock:
            rows = [list(row) for row in self._seconds if start <= row[0] < end]
        out = {
            "t": [(start + i) * 1000 for i in range(seconds)],
            **{name: [0] * seconds for name in self.COLUMNS},
        }
        for second, *values in rows:
            for name, value in zip(self.COLUMNS, values, strict=True):
                out[name][second - start] = value
        return out

    def commits_per_second(self) -> float:
        """COMMITTED answers per second over the last :attr:`RATE_WINDOW` full seconds."""
        return sum(self.history(self.RATE_WINDOW)["commits"]) / self.RATE_WINDOW

    def snapshot(self) -> dict[str, Any]:
        sizes = {f"{2**k}-{2 ** (k + 1) - 1}": n for k, n in enumerate(self.group_sizes) if n}
        return {
            "commits_per_s": self.commits_per_second(),
            "committed": self.committed,
            "repeated": self.repeated,
            "conflicts": self.conflicts,
            "too_old": self.too_old,
            "lookups": self.lookups,
            "cleared": self.cleared,
            "throttled": self.throttled,
            "requests": self.requests,
            "groups": self.groups,
            "group_items": self.group_items,
            "group_sizes": sizes,
        }


class Registry:
    """The IdRegistry over a :class:`~id_registry._backend.Backend` (default: in memory).

    * ``shard_count`` — the shards of a new registry (ignored when the store has a map already);
    * ``reshard_lead_ms`` — how far in the future a new shard configuration must start at the
      earliest (Photon's clock-skew bound S, §2.2.2);
    * ``clock`` — wall time in ms (tests pass their own); the figures of :attr:`stats` are
      counted per second of it.

    Not thread-safe: one caller at a time (the service's registry thread).
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        shard_count: int = DEFAULT_SHARD_COUNT,
        reshard_lead_ms: int = DEFAULT_RESHARD_LEAD_MS,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        self.backend = backend if backend is not None else MemoryBackend()
        self.reshard_lead_ms = reshard_lead_ms
        self.clock = clock
        self.stats = Stats(
            clock=lambda: self.clock() / 1000
        )  # the same clock: tests never wait for a second to end
        meta = self.backend.read_meta()
        if meta is None:
            try:
                meta = self.backend.write_meta(
                    Meta(INT64_MIN, ShardMap.single(check_shard_count(shard_count))), expected=None
                )
            except MetaChangedError:  # another server created it first
                meta = self.backend.read_meta()
        if meta is None:  # pragma: no cover - a store that loses what it just wrote
            msg = "the registry's store did not keep its metadata"
            raise RuntimeError(msg)
        self.meta: Meta = meta
        self._pack = msgpack.Packer().pack  # one per registry: a Packer is not thread-safe

    def _retrying(self, fn: Callable[[Meta], T]) -> T:
        """``fn(meta)``, again with fresh metadata each time another server changed it meanwhile."""
        for _ in range(META_RETRIES):
            try:
                return fn(self.meta)
            except MetaChangedError:
                fresh = self.backend.read_meta()
                if fresh is not None:
                    self.meta = fresh
        msg = f"the registry's metadata changed {META_RETRIES} times in a row during one operation; is something rewriting it in a loop?"
        raise RuntimeError(msg)

    # ------------------------------------------------------------------ commits (§2.1, §2.2.1, §3.3.2)
    def commit_many(self, items: Sequence[Item], *, checked: bool = False) -> list[CommitResult]:
        """Commit each ``(event_id, token, event_time_ms)`` if its id is free; see :class:`~id_registry.Status`.

        The first item of an id wins inside one call too (application-level conflict
        resolution in a batch, §2.2.1); one call is at most one durable write.

        A call the store refuses part-way because another server changed the metadata (etcd
        applies a group as several transactions, some of which may be in before the change) is
        retried with the new metadata; an item the retry finds too old that its own token holds
        (an earlier transaction of this call stored it) is answered ``COMMITTED``: the entry is
        there, so the caller must write its event out.
        """
        checked_items = items if checked else check_items(items)
        attempts = [0]

        def attempt(meta: Meta) -> list[CommitResult]:
            attempts[0] += 1
            return self._commit(checked_items, meta, look_again=attempts[0] > 1)

        return self._retrying(attempt)

    def _commit(
        self, items: Sequence[Item], meta: Meta, *, look_again: bool = False
    ) -> list[CommitResult]:
        """One durable write for ``items``; the per-item work is done a column at a time (C loops).
        ``look_again``: a retry after the metadata changed: a too-old item its token holds is ``COMMITTED``."""
        gc = meta.gc_boundary_ms
        ids = list(map(EVENT_ID, items))
        times = list(map(EVENT_TIME, items))
        if not items or (min(times) >= gc and len(set(ids)) == len(ids)):
            deciding: Sequence[Item] = items  # the common case: every id once, every event in time
        else:
            first: dict[str, Item] = {}  # the first item of an id in time decides (§2.2.1)
            for item in items:
                if item[2] >= gc and item[0] not in first:
                    first[item[0]] = item
            deciding = list(first.values())
        if deciding is not items:
            ids, times = list(map(EVENT_ID, deciding)), list(map(EVENT_TIME, deciding))
        encoded = list(map(str.encode, ids))
        configs = meta.shards.configs
        if len(configs) == 1:
            count = configs[0].shard_count
            shards = [h % count for h in map(xxh3_64_intdigest, encoded)]
        else:
            config_at = meta.shards.config_at
            shards = [
                h % config_at(t).shard_count
                for h, t in zip(map(xxh3_64_intdigest, encoded), times, strict=True)
            ]
        keys = list(map(ENTRY_KEY, zip(shards, encoded, strict=True)))
        index = list(
            map(INDEX_KEY, zip([t + TIME_OFFSET for t in times], shards, encoded, strict=True))
        )
        values = list(map(self._pack, zip(map(TOKEN, deciding), times, strict=True)))
        stored = self.backend.insert_if_absent(keys, index, values, meta) if keys else []
        new = stored.count(None)
        if new == len(items):
            self.stats.record_group(len(items), new, 0, 0, 0)
            return [COMMITTED] * len(items)
        holders = {
            item[0]: item[1] if old is None else _unpackb(old)[0]
            for item, old in zip(deciding, stored, strict=True)
        }
        kept = self._held_too_old(items, meta) if look_again else set()
        results: list[CommitResult] = []
        conflicts = too_old = 0
        for event_id, token, t in items:
            if t < gc:
                if (event_id, token) in kept:
                    results.append(COMMITTED)
                    continue
                results.append(TOO_OLD)
                too_old += 1
            elif holders[event_id] == token:
                results.append(COMMITTED)
            else:
                results.append(CommitResult(Status.CONFLICT, holders[event_id]))
                conflicts += 1
        self.stats.record_group(
            len(items), new, len(items) - too_old - conflicts - new, conflicts, too_old
        )
        return results

    def _held_too_old(self, items: Sequence[Item], meta: Meta) -> set[tuple[str, str]]:
        """``(id, token)`` of the items before the GC boundary whose entry is stored under their own token."""
        old = [(event_id, token, t) for event_id, token, t in items if t < meta.gc_boundary_ms]
        if not old:
            return set()
        keys = [
            entry_key(meta.shards.shard_of(event_id, t), event_id.encode())
            for event_id, _, t in old
        ]
        values = self.backend.get_many(keys, meta)
        return {
            (event_id, token)
            for (event_id, token, _), raw in zip(old, values, strict=True)
            if raw is not None and unpack_entry(raw)[0] == token
        }

    # ------------------------------------------------------------------ lookups (§3.2, §3.3.3)
    def lookup_many(self, ids: Sequence[str]) -> list[LookupResult]:
        """For each id: ``FOUND`` with its token and event time, ``NOT_FOUND``, or ``TOO_OLD``."""
        checked = check_ids(ids)
        found = self._retrying(lambda meta: self._find(checked, meta))
        self.stats.lookups += len(checked)
        gc = self.meta.gc_boundary_ms
        out = []
        for hit in found:
            if hit is None:
                out.append(LookupResult(Status.NOT_FOUND))
                continue
            token, t = unpack_entry(hit[2])
            out.append(
                LookupResult(Status.TOO_OLD, token, t)
                if t < gc
                else LookupResult(Status.FOUND, token, t)
            )
        return out

    def _find(self, ids: Sequence[str], meta: Meta) -> list[tuple[int, bytes, bytes] | None]:
        """For each id, ``(shard, id bytes, stored value)`` of its entry, or ``None``: looked up in
        the shard of every configuration that may still hold it."""
        probes: list[tuple[int, int, bytes]] = []  # (position, shard, id bytes)
        for pos, event_id in enumerate(ids):
            b = event_id.encode()
            for shard in meta.shards.candidates(shard_hash(b), meta.gc_boundary_ms):
                probes.append((pos, shard, b))
        values = self.backend.get_many([entry_key(s, b) for _, s, b in probes], meta)
        out: list[tuple[int, bytes, bytes] | None] = [None] * len(ids)
        for (pos, shard, b), value in zip(probes, values, strict=True):
            if value is not None and out[pos] is None:
                out[pos] = (shard, b, value)
        return out

    # ------------------------------------------------------------------ clears (§3.3.3)
    def clear_many(
        self,
        ids: Sequence[str],
        *,
        only_if_token: str | Sequence[str | None] | None = None,
        keep_id: bool = False,
    ) -> list[ClearResult]:
        """Recovery (§3.3.3). ``keep_id=False``: delete the entries, so the events can be joined
        again (a registered click missing from the output, whose joiner is known to be dead).
        ``keep_id=True``: keep the ids committed and drop their tokens (clicks safely in the
        output: the id still refuses every commit). ``only_if_token``: one token, or one per id
        (or ``None``): clear only if the id is held by it, else ``TOKEN_MISMATCH``.
        """
        checked = check_ids(ids)
        tokens = check_tokens(only_if_token, len(checked))
        if type(keep_id) is not bool:
            msg = f"keep_id must be true or false, got {keep_id!r}"
            raise InvalidRequestError(msg)
        wanted: dict[str, str | None] = {}
        for event_id, token in zip(checked, tokens, strict=True):
            wanted.setdefault(event_id, token)  # the first of a repeated id decides
        answers = self._retrying(lambda meta: self._clear(wanted, keep_id, meta))
        return [answers[event_id] for event_id in checked]

    def _clear(
        self, wanted: dict[str, str | None], keep_id: bool, meta: Meta
    ) -> dict[str, ClearResult]:
        answers: dict[str, ClearResult] = {}
        pending = list(wanted)
        for _ in range(META_RETRIES):
            if not pending:
                return answers
            ops: list[Replace] = []
            op_ids: list[str] = []
            for event_id, hit in zip(pending, self._find(pending, meta), strict=True):
                if hit is None:
                    answers[event_id] = ClearResult(Status.NOT_FOUND)
                    continue
                shard, b, raw = hit
                holder, t = unpack_entry(raw)
                expected = wanted[event_id]
                if t < meta.gc_boundary_ms:
                    answers[event_id] = ClearResult(Status.TOO_OLD, holder)
                elif expected is not None and holder != expected:
                    answers[event_id] = ClearResult(Status.TOKEN_MISMATCH, holder)
                elif keep_id and holder is None:
                    answers[event_id] = ClearResult(Status.CLEARED)  # already
                else:
                    ops.append(
                        (
                            entry_key(shard, b),
                            index_key(t, shard, b),
                            raw,
                            pack_entry(None, t) if keep_id else None,
                        )
                    )
                    op_ids.append(event_id)
            done = self.backend.replace_if(ops, meta) if ops else []
            pending = []
            for event_id, ok in zip(op_ids, done, strict=True):
                if ok:
                    answers[event_id] = ClearResult(Status.CLEARED)
                    self.stats.cleared += 1
                else:  # changed since we read it (another server): look again
                    pending.append(event_id)
        msg = "clear_many: entries kept changing under this call; try again"
        raise RuntimeError(msg)

    # ------------------------------------------------------------------ garbage collection (§2.3)
    def set_gc_boundary(self, boundary_ms: int) -> int:
        """Move the GC boundary forward to ``boundary_ms`` (a repeat is harmless); commits of events
        before it get ``TOO_OLD`` from now on. Refused if it would go back or into the future."""
        check_time("boundary_ms", boundary_ms)

        def move(meta: Meta) -> int:
            if boundary_ms < meta.gc_boundary_ms:
                msg = (
                    f"the garbage-collection boundary only moves forward: it is {meta.gc_boundary_ms}, "
                    f"and {boundary_ms} is before it (entries older than the boundary may already be deleted; "
                    "moving it back would let their events be joined a second time)"
                )
                raise GcBackwardsError(msg, meta.gc_boundary_ms)
            if boundary_ms == meta.gc_boundary_ms:
                return boundary_ms
            now = self.clock()
            if boundary_ms > now:
                msg = f"boundary_ms {boundary_ms} is in the future (now is {now}): it would refuse every new event as too old; use a time in the past, e.g. now minus N days"
                raise InvalidRequestError(msg)
            self.meta = self.backend.write_meta(Meta(boundary_ms, meta.shards), expected=meta)
            return boundary_ms

        return self._retrying(move)

    def collect_garbage(self, limit: int = GC_CHUNK) -> int:
        """Delete up to ``limit`` entries older than the boundary (one durable write); returns how many."""
        keys = self.backend.index_below(self.meta.gc_boundary_ms, limit)
        return self.backend.delete_indexed(keys)

    def advance_gc(self, boundary_ms: int) -> GcResult:
        """:meth:`set_gc_boundary`, then delete every entry older than it."""
        boundary = self.set_gc_boundary(boundary_ms)
        deleted = 0
        while True:
            n = self.collect_garbage()
            deleted += n
            if n < GC_CHUNK:
                return GcResult(boundary, deleted)

    # ------------------------------------------------------------------ sharding (§2.2.2)
    def shard_configs(self) -> list[ShardConfig]:
        return list(self.meta.shards.configs)

    def reshard(self, effective_from_ms: int, shard_count: int) -> list[ShardConfig]:
        """Spread ids of events at or after ``effective_from_ms`` over ``shard_count`` shards.

        Refused (:class:`~id_registry.ReshardError`) unless ``effective_from_ms`` is later than
        every configuration's start, at least ``reshard_lead_ms`` in the future, and later
        than every event already committed: the shard of a decided id never changes. The
        same configuration again is a no-op.
        """
        check_time("effective_from_ms", effective_from_ms)
        check_shard_count(shard_count)

        def add(meta: Meta) -> list[ShardConfig]:
            last = meta.shards.configs[-1]
            if (last.effective_from_ms, last.shard_count) == (effective_from_ms, shard_count):
                return list(meta.shards.configs)
            if effective_from_ms <= last.effective_from_ms:
                msg = (
                    f"shard configurations only append: the latest takes effect from {last.effective_from_ms}, "
                    f"so {effective_from_ms} would re-shard events already decided; choose a later time"
                )
                raise ReshardError(msg)
            earliest = self.clock() + self.reshard_lead_ms
            if effective_from_ms < earliest:
                msg = (
                    f"a new shard configuration takes effect from a future time at least {self.reshard_lead_ms} ms ahead "
                    f"(the clock-skew bound, Photon §2.2.2), so that no event already in flight is moved: "
                    f"{effective_from_ms} is too early, the earliest is {earliest}"
                )
                raise ReshardError(msg)
            shards = ShardMap([*meta.shards.configs, ShardConfig(effective_from_ms, shard_count)])
            self.meta = self.backend.write_meta(
                Meta(meta.gc_boundary_ms, shards), expected=meta, no_entries_from=effective_from_ms
            )
            return list(shards.configs)

        return self._retrying(add)

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """The figures for a dashboard (no ids, no tokens)."""
        return {
            "backend": self.backend.describe(),
            "gc_boundary_ms": self.meta.gc_boundary_ms,
            "shards": self.meta.shards.to_json(),
            "stats": self.stats.snapshot(),
        }

    def close(self) -> None:
        self.backend.close()
