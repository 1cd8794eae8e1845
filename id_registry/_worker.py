"""The registry thread: server-side batching (Photon §2.2.1, Fig. 3) and throttling (§3.3.2).

Request handlers only check a request and put it on an in-memory queue; one background
thread (the *registry thread*) takes every commit request waiting there, up to
``max_group_items`` items, and applies them as **one** call of
:meth:`Registry.commit_many <id_registry.Registry.commit_many>`: one durable write (one
fsync'd RocksDB write batch; or etcd transactions sent together) for the whole group,
with conflicts between the group's requests resolved in order (the earlier request
wins). Every request of the group is answered once that write is durable. There is no
minimum group size and no waiting for one to fill: a lone request is applied at once, so
batching costs no latency; under load, requests that arrive while a write is in
progress form the next group (group commit).

Other operations (lookups, clears, GC, resharding, status) run on the same thread one at a
time, in arrival order with the commit groups, so a lookup sent after an acknowledged
commit sees it. Garbage collection deletes in chunks queued behind waiting commits.

**Throttling**: a commit is refused at once with :class:`~id_registry.ThrottledError`
(HTTP 429, nothing done) when ``max_inflight_requests`` requests or, counting its own,
more than ``max_inflight_items`` items are already queued or being written (a request is
always admitted when nothing is in flight, however large). The error says how long the
queue takes to drain (``retry_after_ms``), which the HTTP client waits before retrying.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from id_registry._core import GC_CHUNK, GcResult, Registry
from id_registry._errors import RegistryUnavailableError, ThrottledError
from id_registry._model import CommitResult, Item, check_items, split_results

#: a group holds at most this many items (one durable write)
DEFAULT_MAX_GROUP_ITEMS = 50_000
#: commits queued or being written, in items, before new ones are throttled
DEFAULT_MAX_INFLIGHT_ITEMS = 200_000
#: requests queued or being written before new ones are throttled
DEFAULT_MAX_INFLIGHT_REQUESTS = 256

T = TypeVar("T")


@dataclass(eq=False)
class _Commit:
    """A commit request, answered with its results."""

    items: list[Item]
    future: Future[list[CommitResult]] = field(default_factory=Future)
    requests = 1


@dataclass(eq=False)
class _Op:
    """An operation run alone; ``future`` None: it answers a future of its own (garbage collection)."""

    fn: Callable[[], Any]
    future: Future[Any] | None = field(default_factory=Future)
    requests: int = 1


_Job = _Commit | _Op


class RegistryWorker:
    """The registry thread in front of a :class:`~id_registry.Registry` (see the module docstring).

    Thread-safe: any thread may submit; every submission returns a
    :class:`concurrent.futures.Future`. ``writes`` (durable writes) and ``groups`` show how
    many requests were coalesced.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        max_group_items: int = DEFAULT_MAX_GROUP_ITEMS,
        max_inflight_items: int = DEFAULT_MAX_INFLIGHT_ITEMS,
        max_inflight_requests: int = DEFAULT_MAX_INFLIGHT_REQUESTS,
        gc_chunk: int = GC_CHUNK,
    ) -> None:
        self.registry = registry
        self.max_group_items = max_group_items
        self.max_inflight_items = max_inflight_items
        self.max_inflight_requests = max_inflight_requests
        self.gc_chunk = gc_chunk
        self.inflight_items = 0
        self.inflight_requests = 0
        self._seconds_per_item = 1e-5  # a moving average: how fast the queue drains
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="id-registry", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ submitting
    def commit(self, items: Sequence[Item]) -> Future[list[CommitResult]]:
        """Check ``items`` here (the caller's thread) and queue them for the next group."""
        return self.submit_commit(check_items(items))

    def submit_commit(self, items: list[Item]) -> Future[list[CommitResult]]:
        """Queue items already checked by :func:`~id_registry._model.check_items`; may raise :class:`ThrottledError`."""
        job = _Commit(items)
        with self._cond:
            self._admit(len(items))
            self._push(job, len(items))
        return job.future

    def call(self, fn: Callable[[], T], *, throttle: bool = True) -> Future[T]:
        """Run ``fn()`` on the registry thread, alone, after what is queued before it."""
        future: Future[T] = Future()
        with self._cond:
            self._admit(0, throttle=throttle)
            self._push(_Op(fn, future), 0)
        return future

    def advance_gc(self, boundary_ms: int) -> Future[GcResult]:
        """Move the GC boundary, then delete older entries a chunk at a time, behind waiting commits."""
        done: Future[GcResult] = Future()
        deleted = [0]

        def collect() -> None:
            try:
                n = self.registry.collect_garbage(self.gc_chunk)
            except BaseException as exc:
                done.set_exception(exc)
                return
            deleted[0] += n
            if n < self.gc_chunk:
                done.set_result(GcResult(self.registry.meta.gc_boundary_ms, deleted[0]))
            else:
                with self._cond:
                    self._push(_Op(collect, None, requests=0), 0)

        def start() -> None:
            try:
                self.registry.set_gc_boundary(boundary_ms)
            except BaseException as exc:
                done.set_exception(exc)
                return
            collect()

        with self._cond:
            self._admit(0)
            self._push(_Op(start, None), 0)
        return done

    def _admit(self, items: int, *, throttle: bool = True) -> None:
        if self._closed:
            msg = "the registry is shutting down; send the request to another registry server or retry later"
            raise RegistryUnavailableError(msg)
        if not throttle:
            return
        too_many = self.inflight_requests >= self.max_inflight_requests
        too_much = self.inflight_items > 0 and self.inflight_items + items > self.max_inflight_items
        if too_many or too_much:
            self.registry.stats.throttled += 1
            wait_ms = int(min(5_000, max(10, 1000 * self.inflight_items * self._seconds_per_item)))
            what = (
                f"{self.inflight_requests} requests"
                if too_many
                else f"{self.inflight_items:,} items"
            )
            msg = (
                f"the registry is busy ({what} in flight, limits {self.max_inflight_requests} requests and "
                f"{self.max_inflight_items:,} items): nothing was done; retry in about {wait_ms} ms"
            )
            raise ThrottledError(msg, wait_ms)

    def _push(self, job: _Job, items: int) -> None:
        self._queue.append(job)
        self.inflight_items += items
        self.inflight_requests += job.requests
        self._cond.notify()

    # ------------------------------------------------------------------ the registry thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                first = self._queue.popleft()
                group: list[_Commit] = []
                if isinstance(first, _Commit):
                    group.append(first)
                    size = len(first.items)
                    while self._queue:
                        nxt = self._queue[0]
                        if (
                            not isinstance(nxt, _Commit)
                            or size + len(nxt.items) > self.max_group_items
                        ):
                            break
                        group.append(self._queue.popleft())  # type: ignore[arg-type]
                        size += len(nxt.items)
            if isinstance(first, _Op):
                self._run_op(first)
            else:
                self._run_group(group)

    def _done(self, jobs: Sequence[_Job], items: int) -> None:
        with self._cond:
            self.inflight_items -= items
            self.inflight_requests -= sum(j.requests for j in jobs)

    def _run_op(self, job: _Op) -> None:
        try:
            result = job.fn()
        except BaseException as exc:
            self._done([job], 0)
            if job.future is not None:
                job.future.set_exception(exc)
            return
        self._done([job], 0)
        if job.future is not None:
            job.future.set_result(result)

    def _run_group(self, group: list[_Commit]) -> None:
        sizes = [len(j.items) for j in group]
        items = group[0].items if len(group) == 1 else [item for j in group for item in j.items]
        started = time.perf_counter()
        try:
            results = self.registry.commit_many(items, checked=True)
        except BaseException as exc:
            self._done(group, len(items))
            for job in group:
                job.future.set_exception(exc)
            return
        if items:
            per_item = (time.perf_counter() - started) / len(items)
            self._seconds_per_item = 0.8 * self._seconds_per_item + 0.2 * per_item
        self.registry.stats.record_requests(len(group))
        self._done(group, len(items))
        for job, answer in zip(group, split_results(results, sizes), strict=True):
            job.future.set_result(answer)

    # ------------------------------------------------------------------ status and shutdown
    def status(self) -> dict[str, Any]:
        """The registry's status (read on the registry thread) with what is in flight now."""
        out: dict[str, Any] = self.call(self.registry.status, throttle=False).result()
        return {**out, **self._load()}

    def stats(self, seconds: int) -> dict[str, Any]:
        """The figures of ``GET /v1/stats``: the counters, what is in flight, and the last ``seconds``
        seconds of them second by second (:meth:`Stats.history <id_registry._core.Stats.history>`).
        Read without the registry thread, so a poll never waits behind a durable write."""
        stats = self.registry.stats
        return {
            "now_ms": int(stats.clock() * 1000),
            "started_ms": stats.started_ms,
            "interval_ms": 1000,
            "totals": stats.snapshot(),
            **self._load(),
            "history": stats.history(seconds),
        }

    def _load(self) -> dict[str, Any]:
        """What is queued or being written now, and the limits (throttling, §3.3.2; group size, §2.2.1)."""
        with self._cond:
            in_flight = {"requests": self.inflight_requests, "items": self.inflight_items}
        limits = {
            "max_inflight_requests": self.max_inflight_requests,
            "max_inflight_items": self.max_inflight_items,
            "max_group_items": self.max_group_items,
        }
        return {"in_flight": in_flight, "limits": limits}

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new requests, answer those queued, stop the thread (the registry stays open)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
