"""The outbox's driver-side writer (``RuntimeSettings.outbox_writer="driver"``), without Spark:
it stages a batch as Spark's ``partitionBy("stream")`` would, so publication is the same."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from millwheel._codec import encode_value
from millwheel._record import encode_key
from millwheel.runtime._fs import Location
from millwheel.runtime._outbox import part_stats, stage_arrow
from millwheel.runtime._streams import FileStreamLog


def _rows(streams, ids):
    """Output rows as Arrow collection may type them (the large string/binary variants)."""
    n = len(ids)
    return pa.table(
        {
            "stream": pa.array(streams, pa.large_string()),
            "id": pa.array(ids, pa.large_string()),
            "ts": pa.array([1_000 + i for i in range(n)], pa.int64()),
            "key": pa.array([encode_key("k")] * n, pa.large_binary()),
            "value": pa.array([encode_value(i) for i in ids], pa.large_binary()),
            "wm": pa.nulls(n, pa.int64()),
        }
    )


def test_one_file_per_stream_without_the_stream_column(tmp_path):
    target = Location.of(str(tmp_path)).child("outbox", "C", "7", "e1")
    stage_arrow(_rows(["out", "_summary", "out", "dead_letters"], ["a", "s", "b", "d"]), target)
    dirs = sorted(p.name for p in (tmp_path / "outbox" / "C" / "7" / "e1").iterdir())
    assert dirs == ["stream=_summary", "stream=dead_letters", "stream=out"]
    (part,) = (tmp_path / "outbox" / "C" / "7" / "e1" / "stream=out").iterdir()
    table = pq.read_table(part)
    assert table.column_names == ["id", "ts", "key", "value", "wm"]
    assert (
        table.schema.field("id").type == pa.string()
        and table.schema.field("key").type == pa.binary()
    )
    assert table.column("id").to_pylist() == ["a", "b"]  # in the batch's row order
    assert part_stats(target.child("stream=out", part.name)) == (2, 1_000)


def test_a_rerun_replaces_the_version_and_an_empty_batch_is_staged(tmp_path):
    target = Location.of(str(tmp_path)).child("7", "e1")
    stage_arrow(_rows(["out", "out"], ["a", "b"]), target)
    stage_arrow(
        _rows(["out"], ["a"]), target
    )  # what the outbox's sink does on a re-run: delete, then stage
    assert (
        len(list((tmp_path / "7" / "e1" / "stream=out").iterdir())) == 2
    )  # stage_arrow alone adds a file
    target.delete()
    stage_arrow(_rows([], []), target)
    assert (tmp_path / "7" / "e1").is_dir() and not list((tmp_path / "7" / "e1").iterdir())


def test_published_files_read_back_as_the_records(tmp_path):
    root = Location.of(str(tmp_path))
    target = root.child("outbox", "C", "0", "e1")
    stage_arrow(_rows(["out", "out"], ["a", "b"]), target)
    log = FileStreamLog(root)
    log.ensure("out", "C")
    (part,) = (tmp_path / "outbox" / "C" / "0" / "e1" / "stream=out").iterdir()
    log.publish(target.child("stream=out", part.name), "out", "C", "b0000000000-p", 1_000)
    assert [(r.id, r.key, r.value, r.timestamp) for r in log.read("out")] == [
        ("a", "k", "a", 1_000),
        ("b", "k", "b", 1_001),
    ]


def test_files_gone_under_a_driver_that_was_taken_over_mean_fenced_not_failed(
    tmp_path, monkeypatch
):
    """The race the fault campaign's zombie driver met: it checked its lease, a newer driver
    took the query over and published (and deleted) the batch's files, then the zombie read
    them. It must stop as fenced (a clean exit), not fail with FileNotFoundError; with its
    lease still its own, a missing file stays an error."""
    import pytest

    from millwheel.runtime._lease import FencedError, Lease
    from millwheel.runtime._outbox import Outbox

    root = Location.of(str(tmp_path))
    lease = Lease(root.child("leases", "C"), "computation 'C'")
    lease.acquire(1)
    outbox = Outbox(
        "C",
        root.child("outbox", "C"),
        root.child("checkpoint"),
        FileStreamLog(root),
        strong=True,
        on_summary=lambda n, s: None,
        lease=lease,
    )
    root.child("outbox", "C", "0").mkdirs()
    monkeypatch.setattr(outbox, "committed", lambda: {0})

    def gone(n):
        msg = f"batch {n}'s part file"
        raise FileNotFoundError(msg)

    monkeypatch.setattr(outbox, "_publish", gone)
    with pytest.raises(FileNotFoundError):
        outbox.publish_committed()  # still the owner: a real error
    takeover = Lease(root.child("leases", "C"), "computation 'C'")
    real_check = lease.check
    calls = []

    def check():
        calls.append(1)
        if (
            len(calls) == 2
        ):  # between the check before publishing and the read: another driver takes over
            takeover.acquire(2)
        real_check()

    monkeypatch.setattr(lease, "check", check)
    with pytest.raises(FencedError):
        outbox.publish_committed()


def test_what_a_batch_tells_its_consumers_before_publication_shows_after_its_files(
    tmp_path, monkeypatch
):
    """``before_publish`` runs with the batch's summaries before any of its files is in the
    stream log, and what it returns once every one is: a consumer's heartbeat that counts
    those files becomes visible only after them (``HeartbeatWriter.stage_heartbeat``)."""
    from millwheel.runtime._outbox import Outbox
    from millwheel.runtime._wire import SUMMARY_STREAM, IntervalSummary

    root = Location.of(str(tmp_path))
    log = FileStreamLog(root)
    summary = IntervalSummary(0, 1_500, 2_000, None, 1, {}, 1_000, 0, 0).encode()
    rows = _rows(["out", "out", SUMMARY_STREAM], ["a", "b", "s"])
    rows = rows.set_column(
        rows.schema.get_field_index("value"),
        "value",
        pa.array([encode_value("a"), encode_value("b"), summary], pa.large_binary()),
    )
    stage_arrow(rows, root.child("outbox", "C", "0", "e0"))
    seen = []

    def before(n, summaries):
        seen.append(("before", n, [s.hold for s in summaries], len(log.read("out"))))
        return lambda: seen.append(("shown", len(log.read("out"))))

    outbox = Outbox(
        "C",
        root.child("outbox", "C"),
        root.child("checkpoint"),
        log,
        strong=True,
        on_summary=lambda n, s: seen.append(("summary", n)),
        before_publish=before,
    )
    monkeypatch.setattr(outbox, "committed", lambda: {0})
    assert outbox.publish_committed() == 1
    assert seen == [("before", 0, [1_500], 0), ("shown", 2), ("summary", 0)]
