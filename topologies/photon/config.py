"""Photon's two settings objects: the topology's (:class:`PhotonConfig`) and the generator's.

Both are frozen. The defaults are the default sample and the settings it is evaluated
with (``docs/photon.md``): the generator delays a query's logging by at most
``max_query_delay_ms``, which :class:`PhotonConfig` declares as the query log's disorder
(``query_lateness_ms``), so a click's query has always arrived once the low watermark
passes the click (the unjoinable rule is exact on the default sample).

>>> PhotonConfig().retention_ms, GeneratorConfig().seed, GeneratorConfig(seed=1).derived_name()[:9]
(60000, 42, 'photon-1-')
>>> PhotonConfig().backoff(0), PhotonConfig().backoff(3), PhotonConfig().backoff(30)
(500, 4000, 8000)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

DEFAULT_SEED = 42


@dataclass(frozen=True)
class PhotonConfig:
    """The join's settings: field names, the EventStore's retention, retries, the unjoinable rule."""

    #: the query log's JSON key of a query's id
    query_id_field: str = "query_id"
    #: the click log's JSON key of a click's id
    click_id_field: str = "click_id"
    #: the click log's JSON key of the query a click refers to
    click_query_field: str = "query_id"
    #: both logs' JSON key of the event time (integer ms since the epoch)
    ts_field: str = "ts"
    #: how long a query stays in the EventStore's cache (the joiner's state) once the low
    #: watermark has passed its timestamp (§3.4.1: "several minutes worth of query events")
    retention_ms: int = 60_000
    #: a click still unjoined once the low watermark passes ``click ts + max_delay_ms`` is
    #: unjoinable (§3.2.1: "older than a threshold")
    max_delay_ms: int = 10_000
    #: the query log's declared disorder (the delayed primary stream, §1.2): how long after
    #: its timestamp a query may be logged and still not be late; it holds the low watermark
    query_lateness_ms: int = 30_000
    #: the click log's declared disorder (ms)
    click_lateness_ms: int = 0
    #: the dispatcher's first retry of a click whose query is not found (§3.2.1), then doubling
    backoff_initial_ms: int = 500
    #: the longest wait between two retries
    backoff_max_ms: int = 8_000
    #: how long a pipeline remembers click ids to drop duplicate deliveries (MillWheel §6.1.1);
    #: an older click is judged by the IdRegistry (Photon §2.3)
    dedup_slack_ms: int = 600_000
    #: on a cache miss, look the query up in the query logs (LogsEventStore, §3.4.2)
    log_store: bool = True
    #: how far around the time encoded in a query id the log store looks for its file
    log_store_window_ms: int = 120_000
    #: live runs: a log file that has not grown for this long is finished (rotation finishes the others)
    idle_finish_ms: int = 60_000
    #: log bytes an injector reads per batch (smaller: more, smaller micro-batches)
    max_bytes_per_batch: int = 64 << 20
    #: run the joiner on the columnar path (``columnar.py``: the same rules, a batch of
    #: query ids at once); ``False``: the per-record ``Joiner``. A run directory keeps the one it started with
    columnar_joiner: bool = True
    #: the columnar joiner's mapping (``ComputationOptions.mapping``): default, its state in
    #: Spark's state store; arrow, in versioned files: faster, but never rescaled. A run
    #: directory keeps the one it started with
    joiner_mapping: str = "default"

    def backoff(self, attempt: int) -> int:
        """The wait before retry ``attempt + 1`` (exponential, capped)."""
        return min(self.backoff_max_ms, self.backoff_initial_ms << min(attempt, 40))


@dataclass(frozen=True)
class GeneratorConfig:
    """Everything the generator does, seeded. Defaults: the default sample."""

    #: the random seed: the same seed, the same logs
    seed: int = DEFAULT_SEED
    #: queries per second (each shows one ad)
    rate: float = 400.0
    #: seconds of logs
    duration_s: int = 120
    #: the event time of the first query (ms since the epoch)
    start_ms: int = 1_700_000_000_000
    #: servers that log queries (in the query id, §3.1)
    servers: int = 8
    #: processes per server (in the query id, §3.1)
    processes: int = 4
    #: advertisers the ads belong to
    advertisers: int = 50
    #: share of queries clicked
    click_rate: float = 0.08
    #: the probability a clicked query has a second click
    second_click_rate: float = 0.1
    #: the mean delay of a click after its query (exponential)
    click_delay_mean_ms: int = 3_000
    #: the longest delay of a click after its query
    click_delay_max_ms: int = 40_000
    #: log shipping: a line is written up to this long after its event
    max_ship_delay_ms: int = 300
    #: the delayed primary stream: the share of queries logged late
    delayed_query_fraction: float = 0.03
    #: the shortest delay of a late-logged query
    min_query_delay_ms: int = 2_000
    #: the longest delay of a late-logged query
    max_query_delay_ms: int = 25_000
    #: share of clicks delivered again, up to 3 s later
    duplicate_click_fraction: float = 0.02
    #: share of queries delivered again, up to 3 s later
    duplicate_query_fraction: float = 0.002
    #: share of clicks whose query is never logged
    orphan_click_fraction: float = 0.01
    #: broken lines in the query log
    malformed_queries: int = 3
    #: broken lines in the click log
    malformed_clicks: int = 3
    #: clicks logged without a query id
    clicks_without_query_id: int = 2
    #: one log file per this many ms of writing (named with its opening time)
    file_ms: int = 1_000

    def derived_name(self) -> str:
        """A directory name that changes with every setting (for the cached default sample)."""
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"photon-{self.seed}-{digest}"
