"""Photon replayed in the harness (topologies/photon/drivers.py): paced and batch, against the batch join."""

from __future__ import annotations

import pytest

from topologies.photon import evaluate, replay
from topologies.photon.drivers import PipelineBusyError, prepare_run, read_manifest, run_lock


@pytest.mark.parametrize("mode", ["batch", "continuous"])
def test_a_replay_equals_the_batch_join_exactly(mode, batch, continuous, sample, truth):
    report = evaluate(batch if mode == "batch" else continuous, sample, truth)
    assert report["ok"], report
    assert report["joined"]["output"] == report["joined"]["expected"] > 200
    assert report["orphans"]["in_unjoinable"] == truth["orphan_clicks"] > 0
    assert report["dead_letters"]["found"] == truth["malformed_injected"]


def test_the_paced_replay_measures_latency_click_logged_to_output_visible(continuous, truth):
    """Processing is instantaneous in the harness: a click waits only for its query and the
    100 ms delivery tick, so most clicks are visible within a tick or two; the clicks logged
    before their (delayed) query wait for it, seconds."""
    lat = sorted(continuous.latencies_ms)
    assert len(lat) == len(continuous.joined)
    assert lat[len(lat) // 2] <= 200
    assert truth["clicks_before_query"] > 0 and lat[-1] >= 1_000


def test_the_batch_replay_has_no_wall_clock(batch):
    assert batch.latencies_ms is None


def test_a_bad_mode_is_refused(sample):
    with pytest.raises(ValueError, match="mode must be"):
        replay(sample, mode="fast")


def test_the_run_lock_is_exclusive_and_released_with_its_holder(tmp_path):
    with (
        run_lock(tmp_path),
        pytest.raises(PipelineBusyError, match="is running, or being verified"),
        run_lock(tmp_path),
    ):
        pass
    with run_lock(tmp_path):  # released
        pass


def test_a_run_directory_belongs_to_one_pipeline(tmp_path, sample):
    from topologies.photon import PhotonConfig

    prepare_run(tmp_path / "run", sample, PhotonConfig(), "dc1", "http://127.0.0.1:1")
    assert read_manifest(tmp_path / "run")["pipeline"] == "dc1"
    assert (tmp_path / "run" / "reinject" / "_DONE").is_file()
    with pytest.raises(ValueError, match="belongs to pipeline 'dc1'"):
        prepare_run(tmp_path / "run", sample, PhotonConfig(), "dc2", None)


def test_a_refused_start_leaves_nothing_that_makes_its_directory_a_run(tmp_path, sample):
    # before: photon.json (and run.json's identity) were written before the roster refused the
    # name, so verification took the directory for a pipeline and re-injected clicks into it
    from millwheel._errors import MillwheelError
    from millwheel._once import MemoryOnceRegistry, join_roster
    from millwheel.runtime import run_identity
    from millwheel.runtime._fs import Location
    from millwheel.runtime._runtime import where_of
    from topologies.photon.drivers import run_spark
    from topologies.photon.verify_runs import verify_runs

    shared = MemoryOnceRegistry()
    join_roster(
        shared, "dc1", "eA", where_of(Location.of(str(tmp_path / "a")))
    )  # run directory A holds dc1
    y = tmp_path / "y"
    with pytest.raises(
        MillwheelError,
        match=r"pipeline name 'dc1' is held in this IdRegistry by the run directory .*/a ",
    ):
        run_spark(sample, y, pipeline="dc1", registry=lambda: shared)
    assert read_manifest(y) is None and run_identity(str(y)) is None
    assert not (y / "run.json").exists() and not (y / "reinject").exists()
    with pytest.raises(FileNotFoundError, match="is not a Photon run directory"):
        verify_runs([y], shared)
