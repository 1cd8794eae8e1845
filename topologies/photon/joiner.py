"""The joiner: clicks joined with their queries, at most once across pipelines (Photon §2, §3).

One computation, keyed by query id, reads both logs (a :class:`~millwheel.Record`
carries its input stream, so it tells a query from a click by ``record.stream``):

* **EventStore** (§3.4). A query is kept in its key's state — the CacheEventStore of
  §3.4.1 — until the low watermark passes ``query ts + retention_ms`` (a low-watermark
  timer). On a miss the click is looked up in the query logs (:class:`~.eventstore.
  LogsEventStore`, §3.4.2) and a hit fills the cache.
* **Dispatcher retries** (§3.2.1). A click whose query is not found waits in its key's
  state and is retried with exponential backoff on wall-time timers (``backoff_initial_ms``
  doubling up to ``backoff_max_ms``); the arrival of its query in the same key joins it at
  once, without waiting for the next retry (the keyed form of the dispatcher's retry: the
  query reader and the click meet at the key).
* **Unjoinable** (§3.2.1). A click still waiting once the *low watermark* passes
  ``click ts + max_delay_ms`` (a low-watermark timer) goes to ``unjoinable`` with its reason.
  With ``query_lateness_ms`` declared on the query log, every query logged within that
  bound has arrived by then, so the decision does not depend on processing speed.
* **IdRegistry** (§2, §3.3.1). A joined click is produced to ``joined_clicks`` as a strong
  production with ``once_id=click_id``: of all pipelines sharing the registry, one only
  writes it. A click given up (``no_query``) is produced with the same ``once_id``,
  *tentatively* (``once_tentative=True``): of the pipelines that give it up, one reports
  it, and a pipeline that can join it later takes the id over and joins it — Photon
  registers joined events and prefers to join; the give-up report is then superseded
  (verification and the evaluation count it so). An adapter's skip is a decision made
  with the query in hand, and takes the id like a join.
* **Adapter** (§3.3.1). :class:`Adapter` turns (query, click) into the joined event, or
  ``None`` to skip the click (it goes to ``unjoinable`` with reason ``adapter_skipped``).

Duplicate deliveries of a click are dropped by exactly-once dedup on the click id (the
record id). A click further behind the low watermark than ``dedup_slack_ms`` (a click log
shipped late) is beyond what the pipeline remembers, and is joined like any other: the
IdRegistry judges it (§2.3) — its once-token comes from the production, so the same
click delivered again is a ``CONFLICT`` and a replay of the batch is not — until the
registry's garbage-collection boundary, below which the commit is ``TOO_OLD`` and the
joined event a dead letter (``once_too_old``), never written. Re-injected clicks
(verification, §3.3.3) arrive on their own stream with their own record ids.

>>> from millwheel.testing import Harness
>>> from topologies.photon.topology import join_topology
>>> h = Harness(join_topology(PhotonConfig(log_store=False)))
>>> h.inject("clicks", [h.record({"click_id": "c1", "query_id": "q1", "ts": 1_500}, 1_500, id="c1")])
>>> h.inject("queries", [h.record({"query_id": "q1", "ts": 1_000, "advertiser_id": "a7"}, 1_000, id="q1")])
>>> [(j["click_id"], j["advertiser_id"], j["query_ts"], j["click_ts"]) for j in h.run().values("joined_clicks")]
[('c1', 'a7', 1000, 1500)]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from millwheel import Computation, DataclassCodec, Record, TimeDomain, Timer, TimerFamily

from .config import PhotonConfig
from .eventstore import LogsEventStore

JOINED = "joined_clicks"
UNJOINABLE = "unjoinable"
#: the field that gives a re-injected click its own record id (``verify.py``)
REINJECT_ID = "reinject_id"

#: reason codes of ``unjoinable`` records
NO_QUERY = "no_query"
ADAPTER_SKIPPED = "adapter_skipped"


class Adapter:
    """The business logic of the join (§3.3.1): a joined event from a query and a click, or ``None`` to skip it.

    The default keeps every field of both, the click's winning on a clash, with the two
    timestamps as ``query_ts`` and ``click_ts``. Subclass it (picklable: it travels to
    Spark's workers with the topology) to filter or reshape; an exception fails that click
    only (a dead letter with the traceback's last line).
    """

    def __init__(self, ts_field: str = "ts") -> None:
        self.ts_field = ts_field

    def join(self, query: dict[str, Any], click: dict[str, Any]) -> dict[str, Any] | None:
        ts = self.ts_field
        out = {k: v for k, v in query.items() if k != ts}
        out.update((k, v) for k, v in click.items() if k != ts)
        out["query_ts"] = query[ts]
        out["click_ts"] = click[ts]
        return out


@dataclass
class JoinKey:
    """What the Joiner keeps for one query id (its typed state)."""

    #: the cached query (the CacheEventStore, §3.4.1), or ``None``
    query: dict[str, Any] | None = None
    #: the cached query's time (its eviction timer is ``query_ts + retention_ms``)
    query_ts: int | None = None
    #: clicks waiting for their query: click id -> ``[click, retries so far]``
    waiting: dict[str, list[Any]] = field(default_factory=dict)


#: the Joiner's state codec; ``renamed`` reads state written before ``JoinKey`` had names
JOIN_STATE = DataclassCodec(JoinKey, renamed={"q": "query", "qts": "query_ts", "w": "waiting"})


_STORES: dict[tuple[str, str, str, int, int], LogsEventStore] = {}


def shared_store(
    queries_dir: str, id_field: str, ts_field: str, window_ms: int, lateness_ms: int
) -> LogsEventStore:
    """This process's LogsEventStore of a query log directory and settings: its index (query
    id -> file offset, a cache of immutable log bytes) is built once per process, not once
    per joiner instance (a Spark worker unpickles the joiner for every task)."""
    k = (os.path.realpath(queries_dir), id_field, ts_field, window_ms, lateness_ms)
    store = _STORES.get(k)
    if store is None:
        store = _STORES[k] = LogsEventStore(
            queries_dir,
            id_field=id_field,
            ts_field=ts_field,
            window_ms=window_ms,
            lateness_ms=lateness_ms,
        )
    return store


class KeyEffects(Protocol):
    """What the join rules of one key do to the world: the per-record :class:`Joiner` does
    it through ``self``, the columnar joiner (``columnar.py``) collects it as columns."""

    key: Any
    now: int

    def produce(
        self, stream: str, value: dict[str, Any], timestamp: int, once_id: str, once_tentative: bool
    ) -> None: ...

    def set_timer(self, family: str, name: str, timestamp: int) -> None: ...

    def delete_timer(self, family: str, name: str) -> None: ...


class JoinRules:
    """The joiner's settings and its rules for one key's :class:`JoinKey` (see the module
    docstring): the one definition both joiners run, per record or per batch.

    Timers, one family each (:class:`Joiner`'s): ``evict`` (low watermark,
    ``query_ts + retention_ms``: the cache entry goes), ``retry`` (wall time, per waiting
    click: the next LogsEventStore lookup) and ``give_up`` (low watermark, per waiting
    click: ``click ts + max_delay_ms``).
    """

    def __init__(
        self,
        config: PhotonConfig | None = None,
        adapter: Adapter | None = None,
        queries_dir: str | None = None,
        query_stream: str = "queries",
        reinjected_stream: str = "reinjected",
    ) -> None:
        self.cfg = config or PhotonConfig()
        self.adapter = adapter or Adapter(self.cfg.ts_field)
        self.queries_dir = queries_dir
        self.query_stream = query_stream
        self.reinjected_stream = reinjected_stream
        self._store: LogsEventStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}  # the log index is a per-process cache

    @property
    def store(self) -> LogsEventStore | None:
        """The LogsEventStore (§3.4.2), if the config asks for it and the query logs are known:
        one per process and setting (:func:`shared_store`), so its index outlives the
        joiner instances a Spark worker makes per task."""
        if self._store is None and self.cfg.log_store and self.queries_dir is not None:
            c = self.cfg
            self._store = shared_store(
                self.queries_dir,
                c.query_id_field,
                c.ts_field,
                c.log_store_window_ms,
                c.query_lateness_ms,
            )
        return self._store

    # ---- records -------------------------------------------------------------------
    def query_arrived(self, fx: KeyEffects, st: JoinKey, query: dict[str, Any], ts: int) -> None:
        if st.query is not None:
            return  # a duplicate delivery beyond the dedup horizon: the cache has it
        self._cache(fx, st, query, ts)
        for cid, (click, _attempts) in list(st.waiting.items()):
            self._finish(fx, st, cid)
            self.join(fx, query, click)

    def click_of(
        self, value: Any, stream: str | None, record_id: str
    ) -> tuple[dict[str, Any], str]:
        """A click record's click (without a re-injection's own id field) and its click id; raises on a click without one."""
        c = self.cfg
        click = (
            {k: v for k, v in value.items() if k != REINJECT_ID}
            if stream == self.reinjected_stream
            else value
        )
        cid = click.get(c.click_id_field)
        if type(cid) is not str or not cid:
            msg = f"click {record_id!r}: field {c.click_id_field!r} must be a non-empty string, got {cid!r}"
            raise ValueError(msg)
        return click, cid

    def click_arrived(
        self, fx: KeyEffects, st: JoinKey, click: dict[str, Any], cid: str, ts: int
    ) -> None:
        c = self.cfg
        if cid in st.waiting:
            return  # the same click again (a re-injection of a click still waiting)
        query = st.query or self._look_up(fx, st)
        if query is not None:
            self.join(fx, query, click)
        else:
            st.waiting[cid] = [click, 0]
            if self.store is not None:
                fx.set_timer("retry", cid, fx.now + c.backoff(0))
            fx.set_timer("give_up", cid, ts + c.max_delay_ms)

    # ---- timers --------------------------------------------------------------------
    def evicted(self, fx: KeyEffects, st: JoinKey) -> None:  # noqa: ARG002 - one signature for every rule
        st.query = st.query_ts = None

    def retried(self, fx: KeyEffects, st: JoinKey, cid: str) -> None:
        entry = st.waiting.get(cid)
        if entry is None:
            return
        query = self._look_up(fx, st)
        if query is not None:
            self._finish(fx, st, cid)
            self.join(fx, query, entry[0])
        else:
            entry[1] += 1
            fx.set_timer("retry", cid, fx.now + self.cfg.backoff(entry[1]))

    def gave_up(self, fx: KeyEffects, st: JoinKey, cid: str, timer_ts: int) -> None:
        entry = st.waiting.get(cid)
        if entry is None:
            return
        query = self._look_up(fx, st)
        self._finish(fx, st, cid)
        if query is not None:
            self.join(fx, query, entry[0])
        else:
            click = entry[0]
            reason = (
                f"no query {fx.key!r} by low watermark {timer_ts} (click ts + max_delay_ms="
                f"{self.cfg.max_delay_ms}) after {entry[1]} retries"
            )
            # a give-up is tentative: it yields the click to a pipeline that can join it
            fx.produce(
                UNJOINABLE,
                _unjoinable(click, NO_QUERY, reason),
                click[self.cfg.ts_field],
                click[self.cfg.click_id_field],
                True,
            )

    # ---- helpers -------------------------------------------------------------------
    def _look_up(self, fx: KeyEffects, st: JoinKey) -> dict[str, Any] | None:
        """A cache miss goes to the LogsEventStore; a hit fills the cache (§3.4)."""
        store = self.store
        if store is None:
            return None
        query = store.lookup(fx.key)
        if query is not None:
            self._cache(fx, st, query, query[self.cfg.ts_field])
        return query

    def _cache(self, fx: KeyEffects, st: JoinKey, query: dict[str, Any], ts: int) -> None:
        st.query, st.query_ts = query, ts
        fx.set_timer("evict", "", ts + self.cfg.retention_ms)

    def join(self, fx: KeyEffects, query: dict[str, Any], click: dict[str, Any]) -> None:
        """The joined event (or the adapter's skip), produced with ``once_id`` = the click id (§2)."""
        c = self.cfg
        cid, ts = click[c.click_id_field], click[c.ts_field]
        joined = self.adapter.join(query, click)
        if joined is None:
            fx.produce(
                UNJOINABLE,
                _unjoinable(click, ADAPTER_SKIPPED, "the adapter skipped it"),
                ts,
                cid,
                False,
            )
            return
        fx.produce(JOINED, joined, ts, cid, False)

    def _finish(self, fx: KeyEffects, st: JoinKey, cid: str) -> None:
        st.waiting.pop(cid, None)
        fx.delete_timer("retry", cid)
        fx.delete_timer("give_up", cid)

    def hold(self, st: JoinKey) -> int | None:
        """The key's hold: waiting clicks will be produced with their own (older)
        timestamps, so the output watermark is held at the oldest (§7.2 of MillWheel) and
        consumers never get them late."""
        ts = self.cfg.ts_field
        return min((w[0][ts] for w in st.waiting.values()), default=None)


class Joiner(JoinRules, Computation):
    """Keyed by query id: the EventStore, the dispatcher's retries, the join (see the module
    docstring), one record at a time; the rules are :class:`JoinRules`'.

    State of a key: a :class:`JoinKey`.
    """

    evict = TimerFamily()
    retry = TimerFamily(TimeDomain.WALL_TIME, tag="r")
    give_up = TimerFamily(tag="g")

    def process_record(self, record: Record) -> None:
        st: JoinKey = self.state.get() or JoinKey()
        if record.stream == self.query_stream:
            self.query_arrived(_Effects(self), st, record.value, record.timestamp)
        else:
            click, cid = self.click_of(record.value, record.stream, record.id)
            self.click_arrived(_Effects(self), st, click, cid, record.timestamp)
        self._save(st)

    @evict.on_fire
    def _evict(self, _name: str, _timer: Timer) -> None:
        st: JoinKey = self.state.get() or JoinKey()
        self.evicted(_Effects(self), st)
        self._save(st)

    @retry.on_fire
    def _retry(self, cid: str, _timer: Timer) -> None:
        st: JoinKey = self.state.get() or JoinKey()
        self.retried(_Effects(self), st, cid)
        self._save(st)

    @give_up.on_fire
    def _give_up(self, cid: str, timer: Timer) -> None:
        st: JoinKey = self.state.get() or JoinKey()
        self.gave_up(_Effects(self), st, cid, timer.timestamp)
        self._save(st)

    def _save(self, st: JoinKey) -> None:
        self.hold_watermark(self.hold(st))
        if st.query is None and not st.waiting:
            self.state.clear()
        else:
            self.state.set(st)


class _Effects:
    """:class:`KeyEffects` of the per-record :class:`Joiner`: its own calls."""

    __slots__ = ("j",)

    def __init__(self, joiner: Joiner) -> None:
        self.j = joiner

    @property
    def key(self) -> Any:
        return self.j.key

    @property
    def now(self) -> int:
        return self.j.now

    def produce(
        self, stream: str, value: dict[str, Any], timestamp: int, once_id: str, once_tentative: bool
    ) -> None:
        self.j.produce(
            stream, value, timestamp=timestamp, once_id=once_id, once_tentative=once_tentative
        )

    def set_timer(self, family: str, name: str, timestamp: int) -> None:
        getattr(self.j, family).set(timestamp, name=name)

    def delete_timer(self, family: str, name: str) -> None:
        getattr(self.j, family).delete(name)


def _unjoinable(click: dict[str, Any], code: str, reason: str) -> dict[str, Any]:
    return {"click": click, "reason_code": code, "reason": reason}
