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
>>> h.run()
>>> [(j["click_id"], j["advertiser_id"], j["query_ts"], j["click_ts"]) for j in h.values("joined_clicks")]
[('c1', 'a7', 1000, 1500)]
"""

from __future__ import annotations

from typing import Any

from millwheel import Computation, Record, TimeDomain, Timer

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


class Joiner(Computation):
    """Keyed by query id: the EventStore, the dispatcher's retries, the join (see the module docstring).

    State of a key: ``{"q": query or None, "qts": its time, "w": {click id: [click, attempts]}}``.
    Timers: ``evict`` (low watermark, ``qts + retention_ms``), ``r:<click id>`` (wall time,
    the next retry) and ``g:<click id>`` (low watermark, ``click ts + max_delay_ms``).
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
        """The LogsEventStore (§3.4.2), if the config asks for it and the query logs are known."""
        if self._store is None and self.cfg.log_store and self.queries_dir is not None:
            c = self.cfg
            self._store = LogsEventStore(
                self.queries_dir, id_field=c.query_id_field, ts_field=c.ts_field,
                window_ms=c.log_store_window_ms, lateness_ms=c.query_lateness_ms,
            )  # fmt: skip
        return self._store

    # ---- records -------------------------------------------------------------------
    def process_record(self, record: Record) -> None:
        if record.stream == self.query_stream:
            self._query(record)
        else:
            self._click(record, reinjected=record.stream == self.reinjected_stream)

    def _query(self, record: Record) -> None:
        st = self.state.get() or {}
        if st.get("q") is not None:
            return  # a duplicate delivery beyond the dedup horizon: the cache has it
        self._cache(st, record.value, record.timestamp)
        for cid, (click, _attempts) in list(st.get("w", {}).items()):
            self._finish(st, cid)
            self._join(record.value, click)
        self._save(st)

    def _click(self, record: Record, *, reinjected: bool) -> None:
        c = self.cfg
        click = {k: v for k, v in record.value.items() if k != REINJECT_ID} if reinjected else record.value
        cid = click.get(c.click_id_field)
        if type(cid) is not str or not cid:
            msg = f"click {record.id!r}: field {c.click_id_field!r} must be a non-empty string, got {cid!r}"
            raise ValueError(msg)
        st = self.state.get() or {}
        waiting = st.setdefault("w", {})
        if cid in waiting:
            return  # the same click again (a re-injection of a click still waiting)
        query = st.get("q") or self._look_up(st)
        if query is not None:
            self._join(query, click)
        else:
            waiting[cid] = [click, 0]
            if self.store is not None:
                self.set_timer(f"r:{cid}", self.now + c.backoff(0), TimeDomain.WALL_TIME)
            self.set_timer(f"g:{cid}", record.timestamp + c.max_delay_ms)
        self._save(st)

    # ---- timers --------------------------------------------------------------------
    def process_timer(self, timer: Timer) -> None:
        st = self.state.get() or {}
        tag = timer.tag
        if tag == "evict":
            st["q"] = None
            st.pop("qts", None)
            self._save(st)
            return
        cid = tag[2:]
        entry = st.get("w", {}).get(cid)
        if entry is None:
            return
        query = self._look_up(st)
        if query is not None:
            self._finish(st, cid)
            self._join(query, entry[0])
        elif tag.startswith("r:"):
            entry[1] += 1
            self.set_timer(tag, self.now + self.cfg.backoff(entry[1]), TimeDomain.WALL_TIME)
        else:
            self._finish(st, cid)
            click = entry[0]
            reason = (
                f"no query {self.key!r} by low watermark {timer.timestamp} (click ts + max_delay_ms="
                f"{self.cfg.max_delay_ms}) after {entry[1]} retries"
            )
            # a give-up is tentative: it yields the click to a pipeline that can join it
            self.produce(UNJOINABLE, _unjoinable(click, NO_QUERY, reason), timestamp=click[self.cfg.ts_field], once_id=cid, once_tentative=True)
        self._save(st)

    # ---- helpers -------------------------------------------------------------------
    def _look_up(self, st: dict[str, Any]) -> dict[str, Any] | None:
        """A cache miss goes to the LogsEventStore; a hit fills the cache (§3.4)."""
        store = self.store
        if store is None:
            return None
        query = store.lookup(self.key)
        if query is not None:
            self._cache(st, query, query[self.cfg.ts_field])
        return query

    def _cache(self, st: dict[str, Any], query: dict[str, Any], ts: int) -> None:
        st["q"], st["qts"] = query, ts
        self.set_timer("evict", ts + self.cfg.retention_ms)

    def _join(self, query: dict[str, Any], click: dict[str, Any]) -> None:
        c = self.cfg
        cid, ts = click[c.click_id_field], click[c.ts_field]
        joined = self.adapter.join(query, click)
        if joined is None:
            self.produce(UNJOINABLE, _unjoinable(click, ADAPTER_SKIPPED, "the adapter skipped it"), timestamp=ts, once_id=cid)
            return
        self.produce(JOINED, joined, timestamp=ts, once_id=cid)

    def _finish(self, st: dict[str, Any], cid: str) -> None:
        st["w"].pop(cid, None)
        self.delete_timer(f"r:{cid}")
        self.delete_timer(f"g:{cid}")

    def _save(self, st: dict[str, Any]) -> None:
        waiting = st.get("w")
        if not waiting:
            st.pop("w", None)
        # waiting clicks will be produced with their own (older) timestamps: hold the
        # output watermark at the oldest (§7.2 of MillWheel), so consumers never get them late
        self.hold_watermark(min((w[0][self.cfg.ts_field] for w in waiting.values()), default=None) if waiting else None)
        if st.get("q") is None and not waiting:
            self.state.clear()
        else:
            self.state.set(st)


def _unjoinable(click: dict[str, Any], code: str, reason: str) -> dict[str, Any]:
    return {"click": click, "reason_code": code, "reason": reason}
