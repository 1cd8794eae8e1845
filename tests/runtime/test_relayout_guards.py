"""What guards ``millwheel rescale --layout`` (``millwheel/runtime/_relayout.py``), without Spark:
the refusals, a layout change interrupted after ``run.json`` (a start refuses, the command
finishes it), and the checkpoint surgery of ``_spark_internals`` (``graft_state``,
``set_offset_log_conf``) on files shaped like Spark's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from millwheel._errors import MillwheelError, RunError
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin
from millwheel.runtime._lease import DriverEpoch, Lease
from millwheel.runtime._query import ComputationQuery
from millwheel.runtime._rescale import rescale
from millwheel.runtime._spark_internals import (
    offset_log_metadata,
    set_offset_log_conf,
)
from millwheel.runtime._state_files import (
    drop_planned_batch,
    graft_state,
)

OFFSETS_3 = 'v1\n{"batchWatermarkMs":1500,"batchTimestampMs":9,"conf":{"spark.sql.streaming.stateStore.providerClass":"org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider","spark.sql.shuffle.partitions":"2"}}\n{"logOffset":3}\n{"logOffset":7}'


def _run(tmp_path, **pin) -> Location:
    root = Location.of(str(tmp_path / "run"))
    root.child("checkpoints", "C").mkdirs()
    root.child("run.json").write_text(
        json.dumps({"intervals": 4, "state_layout": "intervals", "groups": [2, 0, 4, 1], **pin})
    )
    return root


def test_a_layout_change_refuses_a_running_driver_an_unknown_computation_and_nothing_to_change(
    tmp_path,
):
    root = _run(tmp_path)
    Lease(root.child("leases", "C"), "C").acquire(
        DriverEpoch(root.child("leases")).get()
    )  # this process "runs" it
    with pytest.raises(
        MillwheelError, match="cannot rescale: a driver may still be running .* stop it first"
    ):
        rescale(root.uri, "C", layout="keys")
    with pytest.raises(MillwheelError, match=r"no computation 'D' \(its computations: \['C'\]\)"):
        rescale(root.uri, "D", layout="keys", force=True)
    with pytest.raises(
        MillwheelError, match="'intervals' layout with 4 key intervals already: nothing to change"
    ):
        rescale(root.uri, "C", layout="intervals", force=True)
    with pytest.raises(MillwheelError, match="--layout must be one of intervals, keys, got 'rows'"):
        rescale(root.uri, "C", layout="rows", force=True)
    with pytest.raises(MillwheelError, match="--intervals must be a positive integer"):
        rescale(root.uri, "C", 0, layout="keys", force=True)
    with pytest.raises(
        MillwheelError, match="give --intervals N, --layout intervals|keys, or both"
    ):
        rescale(root.uri, "C", force=True)
    with pytest.raises(MillwheelError, match="no run.json"):
        rescale(str(tmp_path / "nothing"), "C", layout="keys")


def test_a_layout_change_waits_for_an_interval_rescale_to_move_its_state(tmp_path):
    migration = {
        "file": "000000000007.parquet",
        "from_intervals": 2,
        "authority": "done",
        "batch": 3,
    }
    root = _run(
        tmp_path,
        computations={
            "C": {"intervals": 8, "groups": list(range(100, 108)), "migration": migration}
        },
    )
    with pytest.raises(MillwheelError, match="has not moved its state yet; resume the run"):
        rescale(root.uri, "C", layout="keys")


def test_a_computation_without_a_committed_batch_just_gets_the_layout(tmp_path):
    root = _run(tmp_path)
    root.child(
        "checkpoints", "C", "state", "0"
    ).mkdirs()  # metadata of a batch planned and dropped: of the old operator
    out = rescale(root.uri, "C", 2, layout="keys")
    assert out["keys"] == 0 and out["to_layout"] == "keys" and out["batch"] == -1
    entry = read_pin(root)["computations"]["C"]
    assert entry["state_layout"] == "keys" and entry["intervals"] == 2 and len(entry["groups"]) == 2
    assert (
        entry["migration"]["relayout"] == "done"
        and entry["migration"]["moved"]
        and entry["migration"]["authority"] == "pending"
    )
    assert not root.child("checkpoints", "C", "state").exists()
    # a per-key computation is re-intervaled the same way (its store rebuilt), and back to interval rows
    assert rescale(root.uri, "C", 3)["to_layout"] == "keys"
    assert read_pin(root)["computations"]["C"]["intervals"] == 3
    assert rescale(root.uri, "C", layout="intervals")["to_layout"] == "intervals"
    assert read_pin(root)["computations"]["C"]["state_layout"] == "intervals"
    # no start in between: the authority still holds the run's 4 intervals, and the next start retires those
    assert read_pin(root)["computations"]["C"]["migration"]["from_intervals"] == 4
    assert (
        rescale(root.uri, "C", 5)["to"] == 5
    )  # an authority move pending: through the layout change's path
    assert read_pin(root)["computations"]["C"]["migration"]["from_intervals"] == 4


def _swapping(tmp_path) -> tuple[Location, dict]:
    """A run whose layout change of C was killed after ``run.json``, before the swap."""
    migration = {
        "relayout": "swapping",
        "from_layout": "intervals",
        "from_intervals": 4,
        "authority": "pending",
        "batch": 3,
        "conf": {
            "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
            "spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
        },
    }
    root = _run(
        tmp_path,
        computations={
            "C": {
                "intervals": 4,
                "groups": [2, 0, 4, 1],
                "state_layout": "keys",
                "migration": migration,
            }
        },
    )
    ckpt = root.child("checkpoints", "C")
    ckpt.child("offsets").mkdirs()
    ckpt.child("offsets", "3").write_text(OFFSETS_3)
    ckpt.child("offsets", ".3.crc").write_text("crc of the old text")
    ckpt.child("state", "0", "0").mkdirs()
    ckpt.child("state", "0", "0", "4.delta").write_text("old")
    ckpt.child(".state.relayout", "0", "0").mkdirs()
    ckpt.child(".state.relayout", "0", "0", "4.zip").write_text("new")
    return root, migration


def test_an_interrupted_layout_change_refuses_to_start_and_the_command_finishes_it(tmp_path):
    root, migration = _swapping(tmp_path)
    q = ComputationQuery.__new__(ComputationQuery)
    q.name, q.state_layout = "C", "keys"
    q.rt = SimpleNamespace(root=root)
    with pytest.raises(
        MillwheelError,
        match="interrupted before its state was in place.*millwheel rescale .* --layout keys",
    ):
        q._check_migration(migration)
    with pytest.raises(
        MillwheelError, match="was interrupted; finish it first \\(--layout keys --intervals 4\\)"
    ):
        rescale(root.uri, "C", layout="intervals")
    # killed after the old state was set aside: the command goes on from there
    ckpt = root.child("checkpoints", "C")
    ckpt.child("state").move_to(ckpt.child(".state.old"))
    out = rescale(root.uri, "C", layout="keys")
    assert out["finished"]
    assert ckpt.child("state", "0", "0", "4.zip").read_text() == "new"
    assert not ckpt.child(".state.old").exists() and not ckpt.child(".state.relayout").exists()
    assert not ckpt.child("offsets", ".3.crc").exists()
    conf = offset_log_metadata(ckpt.child("offsets", "3").read_text())["conf"]
    assert conf["spark.sql.streaming.stateStore.providerClass"].endswith(
        "RocksDBStateStoreProvider"
    )
    assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert conf["spark.sql.streaming.stateStore.encodingFormat"] == "unsaferow"
    assert conf["spark.sql.shuffle.partitions"] == "2"  # the rest as it was
    done = read_pin(root)["computations"]["C"]["migration"]
    assert done["relayout"] == "done" and done["moved"]
    q._check_migration(done)  # a start goes on
    # and again: nothing left to do, nothing to change
    with pytest.raises(MillwheelError, match="nothing to change"):
        rescale(root.uri, "C", layout="keys")


def test_set_offset_log_conf_keeps_the_sources_and_drops_the_checksum(tmp_path):
    ckpt = Location.of(str(tmp_path))
    ckpt.child("offsets").mkdirs()
    ckpt.child("offsets", "3").write_text(OFFSETS_3)
    ckpt.child("offsets", ".3.crc").write_text("x")
    set_offset_log_conf(ckpt, 3, {"a": "b"})
    text = ckpt.child("offsets", "3").read_text()
    assert text.splitlines()[0] == "v1" and text.splitlines()[2:] == [
        '{"logOffset":3}',
        '{"logOffset":7}',
    ]
    assert (
        offset_log_metadata(text)["batchWatermarkMs"] == 1500
        and offset_log_metadata(text)["conf"]["a"] == "b"
    )
    assert not ckpt.child("offsets", ".3.crc").exists()
    ckpt.child("offsets", "4").write_text("v1")
    with pytest.raises(RunError, match="not an offset-log entry"):
        set_offset_log_conf(ckpt, 4, {})


def test_graft_state_renames_the_first_version_and_copies_the_rest(tmp_path):
    scratch = Location.of(str(tmp_path / "scratch"))
    files = {
        "0/_metadata/v2/0": f'v2\n{{"stateSchemaFilePaths":["file:{tmp_path}/scratch/0/_stateSchema/default/0_u"]}}',
        "0/_metadata/v2/.0.crc": "crc",
        "0/_stateSchema/default/0_u": "schema",
        "0/0/1.zip": "snap",
        "0/0/.1.zip.crc": "crc",
        "0/0/SSTs/000008-x.sst": "sst",
        "0/1/1.delta": "delta",
        "0/1/.1.delta.crc": "crc",
    }
    for path, text in files.items():
        loc = scratch.child(*path.split("/"))
        Location.of(loc.path.rsplit("/", 1)[0]).mkdirs()
        loc.write_text(text)
    staging = Location.of(str(tmp_path / "staging"))
    final = Location.of(str(tmp_path / "checkpoint" / "state"))
    assert graft_state(scratch, staging, 42, final=final) == 5
    got = {
        str(p.relative_to(tmp_path / "staging"))
        for p in (tmp_path / "staging").rglob("*")
        if p.is_file()
    }
    assert got == {
        "0/_metadata/v2/0",
        "0/_stateSchema/default/0_u",
        "0/0/42.zip",
        "0/0/SSTs/000008-x.sst",
        "0/1/42.snapshot",
    }
    # the operator metadata names its schema files where the store will be, not in the scratch checkpoint
    assert (
        f"file:{tmp_path}/checkpoint/state/0/_stateSchema/default/0_u"
        in staging.child("0", "_metadata", "v2", "0").read_text()
    )
    assert staging.child("0", "1", "42.snapshot").read_text() == "delta"
    scratch.child("0", "1", "1.changelog").write_text("?")
    with pytest.raises(RunError, match="of no kind a graft knows"):
        graft_state(scratch, Location.of(str(tmp_path / "again")), 42)


def test_dropping_a_planned_batch_of_a_per_key_computation_skips_its_schema_files(tmp_path):
    """``transformWithState`` keeps schema files named ``<batch>_<uuid>`` (no dot): not directories."""
    ckpt = Location.of(str(tmp_path))
    for path, text in {
        "offsets/5": OFFSETS_3,
        "state/0/_stateSchema/default/0_b599c411-906e": "schema",
        "state/0/0/6.changelog": "c",
        "state/0/0/5.zip": "z",
        "state/0/_metadata/v2/0": "m",
    }.items():
        loc = ckpt.child(*path.split("/"))
        Location.of(loc.path.rsplit("/", 1)[0]).mkdirs()
        loc.write_text(text)
    dropped = drop_planned_batch(ckpt, 5)
    assert [d.rsplit("/", 1)[1] for d in dropped] == ["6.changelog"]
    assert ckpt.child("state", "0", "_stateSchema", "default", "0_b599c411-906e").exists()
    assert (
        not ckpt.child("offsets", "5").exists() and ckpt.child("state", "0", "0", "5.zip").exists()
    )
