"""The driver loop's reads of published watermarks (``SparkRuntime.watermark_of``)."""

from __future__ import annotations

from millwheel.runtime._audit import AuditLog
from millwheel.runtime._fs import Location
from millwheel.runtime._runtime import SparkRuntime
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
