"""The driver loop's reads of published watermarks (``SparkRuntime.watermark_of``), and how
often its computation queries look at their inputs (``RuntimeSettings.computation_poll_ms``)."""

from __future__ import annotations

import pytest

from millwheel import Computation, LogFileSource, SampleSource, Topology
from millwheel._errors import SettingsError
from millwheel.runtime._audit import AuditLog
from millwheel.runtime._fs import Location
from millwheel.runtime._runtime import SparkRuntime
from millwheel.runtime._session import start_query
from millwheel.runtime._settings import RuntimeSettings
from watermark_authority.client import InProcessWatermarkClient


def test_a_round_reads_each_watermark_once_never_a_newer_one_than_published(tmp_path):
    client = InProcessWatermarkClient()
    client.expect_injector_processes("inj", ["p"])
    client.report_injector("inj", "p", 5_000)
    reads = []
    read = client.watermark
    client.watermark = lambda name: reads.append(name) or read(name)  # type: ignore[method-assign]
    rt = SparkRuntime.__new__(SparkRuntime)
    rt.watermarks, rt.audit, rt._read = client, AuditLog(Location.of(str(tmp_path))), {}
    assert [rt.watermark_of("inj"), rt.watermark_of("inj")] == [5_000, 5_000]
    assert reads == ["inj"]
    client.report_injector("inj", "p", 9_000)
    # later in the same round: the older value, a lower bound of what is published (it only moves forward)
    assert rt.watermark_of("inj") == 5_000
    # read again after reporting (a computation reads its own so: its consumers later in the round see it)
    assert rt.watermark_of("inj", fresh=True) == 9_000
    assert rt.watermark_of("inj") == 9_000
    rt._read.clear()  # the next round (``poll``)
    client.report_injector("inj", "p", 12_000)
    assert rt.watermark_of("inj") == 12_000
    assert reads == ["inj"] * 3


class PollCount(Computation):
    def process_record(self, record):
        self.state.set(self.state.get(0) + 1)


def _poll_topology(source) -> Topology:
    t = Topology("polls")
    t.injector("events", source)
    t.computation(PollCount, inputs={"events": lambda r: r.value["k"]})
    return t


def test_an_idle_computation_looks_at_finite_input_less_often_than_at_live_input(tmp_path):
    """``RuntimeSettings.computation_poll_ms``: resolved once per run, from the sources."""
    (tmp_path / "logs").mkdir()
    finite = _poll_topology(LogFileSource(str(tmp_path / "logs"), finite=True))
    live = _poll_topology(LogFileSource(str(tmp_path / "logs")))
    assert SparkRuntime(finite, str(tmp_path / "a")).settings.computation_poll_ms == 100
    assert SparkRuntime(live, str(tmp_path / "b")).settings.computation_poll_ms == 10
    # ``drain`` stops a run whose records may still come at their own pace: live all the same
    drained = SparkRuntime(live, str(tmp_path / "c"), RuntimeSettings(drain=True))
    assert drained.settings.computation_poll_ms == 10
    given = RuntimeSettings(computation_poll_ms=30)
    assert SparkRuntime(finite, str(tmp_path / "d"), given).settings.computation_poll_ms == 30
    with pytest.raises(SettingsError, match="computation_poll_ms"):
        RuntimeSettings(computation_poll_ms=-1)


@pytest.mark.spark
def test_each_computation_query_starts_with_the_runs_poll_interval(tmp_path, spark, monkeypatch):
    from millwheel.runtime import _query

    started: list[dict[str, str]] = []

    def recording(writer, session, conf):
        started.append(dict(conf))
        return start_query(writer, session, conf)

    monkeypatch.setattr(_query, "start_query", recording)
    events = [{"k": f"k{i % 3}", "ts": 1_000 + i} for i in range(6)]
    rt = SparkRuntime(
        _poll_topology(SampleSource(events, timestamp="ts")),
        str(tmp_path / "run"),
        RuntimeSettings(intervals=2),
        spark=spark,
    )
    rt.start()
    rt.stop()
    assert started and all(c.get("spark.sql.streaming.pollingDelay") == "100ms" for c in started), (
        started
    )
