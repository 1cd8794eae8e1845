"""The zombie-driver fence without Spark: leases, and what the outbox publishes (``millwheel/runtime/_lease.py``).

A paused driver that resumes after a second driver took over must not make anything visible:
its staged copy of a batch is never the one published, a batch already published is never
published again, and every write path raises :class:`FencedError` once a newer epoch exists.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from millwheel import Record
from millwheel.runtime._fs import Location
from millwheel.runtime._lease import DriverEpoch, FencedError, Lease
from millwheel.runtime._outbox import Outbox
from millwheel.runtime._streams import FileStreamLog, records_table


def _stage(root, batch, epoch, job, ids):
    """What a sink attempt of driver ``epoch`` writes for ``batch``: one Parquet part under ``stream=out``."""
    d = root / "outbox" / "C" / str(batch) / f"e{epoch}" / "stream=out"
    d.mkdir(parents=True, exist_ok=True)
    table = records_table([Record(None, {"v": i}, 1_000 + k, i) for k, i in enumerate(ids)])
    pq.write_table(table, d / f"part-00000-{job}.c000.snappy.parquet")


def _outbox(root, lease):
    (root / "checkpoints" / "C" / "commits").mkdir(parents=True, exist_ok=True)
    loc = Location.of(str(root))
    return Outbox(
        "C",
        loc.child("outbox", "C"),
        loc.child("checkpoints", "C"),
        FileStreamLog(loc),
        strong=True,
        on_summary=lambda _n, _s: None,
        lease=lease,
    )


def _commit(root, n):
    (root / "checkpoints" / "C" / "commits" / str(n)).write_text("v1\n{}\n")


def _published(root):
    return sorted(r.id for r in FileStreamLog(Location.of(str(root))).read("out"))


def test_a_newer_epoch_fences_the_older(tmp_path):
    leases = Location.of(str(tmp_path)).child("leases")
    first, second = (
        Lease(leases.child("C"), "computation 'C'"),
        Lease(leases.child("C"), "computation 'C'"),
    )
    assert first.acquire(DriverEpoch(leases).get()) == 1
    first.check()
    assert second.acquire(DriverEpoch(leases).get()) == 2
    second.check()
    with pytest.raises(
        FencedError, match=r"computation 'C': another driver .* epoch 2\) took over .* \(epoch 1\)"
    ):
        first.check()


def test_publication_takes_the_newest_epoch_and_never_republishes(tmp_path):
    leases = Location.of(str(tmp_path)).child("leases")
    zombie_lease = Lease(leases.child("C"), "computation 'C'")
    zombie_lease.acquire(DriverEpoch(leases).get())
    lease = Lease(leases.child("C"), "computation 'C'")
    lease.acquire(DriverEpoch(leases).get())
    box = _outbox(tmp_path, lease)
    # the zombie staged batch 0 (a different version) after the new driver staged its own
    _stage(tmp_path, 0, 2, "a" * 8 + "-0000-4000-8000-000000000001", ["x1", "x2"])
    _stage(tmp_path, 0, 1, "b" * 8 + "-0000-4000-8000-000000000002", ["z1", "z2", "z3"])
    _commit(tmp_path, 0)
    assert box.publish_committed() == 1
    assert _published(tmp_path) == ["x1", "x2"]
    # the zombie resumes and stages batch 0 again, after it was published and deleted
    _stage(tmp_path, 0, 1, "c" * 8 + "-0000-4000-8000-000000000003", ["z1", "z2", "z3"])
    assert box.publish_committed() == 0
    assert _published(tmp_path) == ["x1", "x2"]
    assert not (tmp_path / "outbox" / "C" / "0").exists()


def test_a_fenced_outbox_publishes_nothing(tmp_path):
    leases = Location.of(str(tmp_path)).child("leases")
    zombie = Lease(leases.child("C"), "computation 'C'")
    zombie.acquire(DriverEpoch(leases).get())
    box = _outbox(tmp_path, zombie)
    _stage(tmp_path, 0, 1, "d" * 8 + "-0000-4000-8000-000000000004", ["z1"])
    _commit(tmp_path, 0)
    Lease(leases.child("C"), "computation 'C'").acquire(
        DriverEpoch(leases).get()
    )  # a second driver starts
    with pytest.raises(FencedError):
        box.publish_committed()
    with pytest.raises(FencedError):
        box.sink(None, 1)  # the sink stages nothing once fenced
    assert _published(tmp_path) == []


def _driver(root):
    """A driver's injector on ``root``, without Spark: a SampleSource read in the driver."""
    from millwheel import Computation, SampleSource, Topology
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    class Sink(Computation):
        def process_record(self, record):
            pass

    t = Topology("zombie")
    t.injector(
        "in", SampleSource([Record(None, i, 1_000 + i, f"r{i}") for i in range(40)], batch_size=5)
    )
    t.computation(Sink, inputs={"in": lambda r: "k"})
    rt = SparkRuntime(t, str(root), RuntimeSettings(injector_batches_per_poll=1))
    rt.streams.ensure("in", "in")
    inj = rt.injectors["in"]
    inj.start()
    return inj


def test_a_fenced_source_injector_stops_and_its_position_is_never_read(tmp_path):
    zombie = _driver(tmp_path)
    zombie.poll()
    zombie.poll()
    assert zombie.position == 2
    taken_over = _driver(tmp_path)  # resumes from the zombie's position
    assert taken_over.position == 2
    for _ in range(3):
        taken_over.poll()
    with pytest.raises(FencedError):
        zombie.poll()  # checked before the batch's writes
    zombie._save_position()  # a zombie paused between the check and its write: an older epoch's file
    assert _driver(tmp_path).position == 5
    assert len(list((tmp_path / "streams" / "in" / "in").glob("s*.parquet"))) == 5


def test_a_driver_paused_while_starting_fences_nobody_when_it_resumes(tmp_path):
    """Epochs are per driver start: a zombie that resumes in the middle of taking its
    queries finds the newer driver's epoch there and stops, instead of fencing it."""
    leases = Location.of(str(tmp_path)).child("leases")
    zombie_epoch = DriverEpoch(leases).get()
    Lease(leases.child("injector.in"), "injector 'in'").acquire(zombie_epoch)
    # ... paused here; another driver starts and takes every query
    epoch = DriverEpoch(leases).get()
    assert epoch > zombie_epoch
    live = [Lease(leases.child(q), q) for q in ("injector.in", "C")]
    for lease in live:
        lease.acquire(epoch)
    # the zombie resumes and goes on to its next query
    with pytest.raises(FencedError, match=r"another driver .* took over"):
        Lease(leases.child("C"), "computation 'C'").acquire(zombie_epoch)
    for lease in live:
        lease.check()  # still the owner
    # a run directory whose queries took epochs per query before: the next driver is above them all
    (tmp_path / "leases" / "D").mkdir()
    for e in (1, 2, 3):
        (tmp_path / "leases" / "D" / f"{e:012d}").write_text("vm:1\n")
    assert DriverEpoch(leases).get() == 4
