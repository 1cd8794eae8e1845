"""Zeitgeist's two settings objects: the topology's (:class:`ZeitgeistConfig`) and the generator's.

Both are frozen (style: configuration in a frozen settings object). The defaults are the
README's main job: the default sample and the settings it is evaluated with
(``docs/zeitgeist.md``).

>>> ZeitgeistConfig().window_ms, GeneratorConfig().seed, GeneratorConfig(seed=1).derived_name()[:12]
(1000, 42, 'zeitgeist-1-')
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from computations.anomalies import Thresholds

DEFAULT_SEED = 42


@dataclass(frozen=True)
class ZeitgeistConfig:
    """The topology's settings: bucket size, model, detector thresholds (Fig. 9), dedup horizon."""

    window_ms: int = 1_000
    #: the model's short "day" and its slots (the generator's default day is 60 s)
    day_ms: int = 60_000
    slot_ms: int = 3_000
    model_alpha: float = 0.1
    model_gamma: float = 0.3
    model_warmup_windows: int = 10
    thresholds: Thresholds = field(default_factory=Thresholds)
    #: empty buckets the window counter still emits (as zeros) after a query goes quiet
    trailing_empty: int = 10
    #: how long record ids are kept for exactly-once (§6.1.1): beyond any redelivery delay
    dedup_slack_ms: int = 30_000
    #: run the window counter on the columnar path (``computations.columnar_windowing``):
    #: the same productions, ids included; ``False``: the per-record ``WindowCounter``
    columnar_counter: bool = True
    #: run the spike and dip detectors on the columnar path (``computations.columnar_anomalies``):
    #: the same productions, ids included; ``False``: the per-record ``SpikeDetector`` and ``DipDetector``
    columnar_detector: bool = True
    #: run the model calculator on the columnar path (``computations.columnar_model``): the
    #: same productions, ids included; ``False``: the per-record ``ModelCalculator``
    columnar_model: bool = True
    #: the columnar computations' mapping (``ComputationOptions.mapping``): ``"arrow"`` keeps
    #: their state in versioned files, not Spark's state store (a dip is seen ~40% sooner,
    #: docs/performance.md, "Latency"), and ``millwheel rescale`` refuses them; ``"default"``
    #: for a run to rescale. The per-record forms always run on the default mapping
    mapping: str = "arrow"


@dataclass(frozen=True)
class GeneratorConfig:
    """Everything the generator does, seeded. Defaults: the README's "main job" sample."""

    seed: int = DEFAULT_SEED
    queries: int = 200
    zipf_s: float = 1.0
    #: mean events per second over all queries
    rate: float = 800.0
    duration_s: int = 240
    start_ms: int = 1_700_000_000_000
    #: the short "day" of the seasonality, and its amplitude (traffic x [1-a, 1+a])
    day_s: int = 60
    season_amplitude: float = 0.3
    spikes: int = 12
    dips: int = 12
    spike_factor: float = 5.0
    dip_factor: float = 0.1
    anomaly_min_s: int = 4
    anomaly_max_s: int = 8
    #: anomalies go to queries whose trough rate (base x (1 - amplitude)) is at least this
    anomaly_min_rate: float = 15.0
    #: no anomaly before this (the models learn a first "day")
    warmup_s: int = 70
    #: quiet time between two anomalies of the same query
    anomaly_gap_s: int = 10
    file_ms: int = 1_000
    max_delay_ms: int = 500
    window_ms: int = 1_000
    late_fraction: float = 5e-5
    duplicate_fraction: float = 0.002
    malformed: int = 6

    def derived_name(self) -> str:
        """A directory name that changes with every setting (for the cached default sample)."""
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"zeitgeist-{self.seed}-{digest}"
