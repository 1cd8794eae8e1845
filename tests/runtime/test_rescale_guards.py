"""What guards ``millwheel rescale`` (``millwheel/runtime/_rescale.py``), without Spark: the
watermark authority's move of the key intervals, the check that no driver runs, the
refusals, and a rescale interrupted between ``run.json`` and its heartbeat file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from millwheel._errors import MillwheelError
from millwheel.runtime._consumed import ConsumedFiles
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import Layout, read_pin
from millwheel.runtime._lease import DriverEpoch, Lease, live_drivers
from millwheel.runtime._query import ComputationQuery
from millwheel.runtime._relayout import plan
from millwheel.runtime._rescale import rescale, target
from millwheel.runtime._wire import interval_name
from watermark_authority import Authority, StaleTokenError
from watermark_authority.client import InProcessWatermarkClient


def _query(root: Location, wm, intervals: int) -> ComputationQuery:
    q = ComputationQuery.__new__(ComputationQuery)
    q.name, q.intervals = "C", intervals
    q.rt = SimpleNamespace(watermarks=wm, root=root)
    q.heartbeats = root.child("heartbeats", "C")
    q.consumed = ConsumedFiles(root.child("checkpoints", "C"))
    return q


def _pin(root: Location, old: int, new: int, file: str = "000000000007.parquet") -> dict:
    migration = {"file": file, "from_intervals": old, "authority": "pending", "batch": 3}
    held = {
        "intervals": old,
        "state_layout": "intervals",
        "groups": list(range(old)),
        "computations": {
            "C": {"intervals": new, "groups": list(range(100, 100 + new)), "migration": migration}
        },
    }
    root.mkdirs()
    root.child("run.json").write_text(json.dumps(held))
    return migration


@pytest.mark.parametrize(("old", "new"), [(4, 8), (8, 2), (3, 3)])
def test_the_authority_retires_the_old_intervals_and_the_new_ones_start_at_their_minimum(
    tmp_path, old, new
):
    root = Location.of(str(tmp_path))
    wm = InProcessWatermarkClient(Authority())
    old_tokens = wm.acquire_many("C", [interval_name(i) for i in range(old)])
    wm.report_batch("C", [(n, t, 5_000 + 10 * i) for i, (n, t) in enumerate(old_tokens.items())])
    assert wm.watermark("C") == 5_000
    migration = _pin(root, old, new)
    tokens = _query(root, wm, new)._acquire(
        Layout(new, tuple(range(100, 100 + new)), own=True, migration=migration)
    )
    assert sorted(tokens) == sorted(interval_name(i) for i in range(new))
    held = wm.authority.intervals("C")
    assert sorted(held) == sorted(tokens), "an old interval is left to hold the watermark"
    assert {v["value"] for v in held.values()} == {
        5_000
    }  # the minimum of the old values: held, not advanced
    assert wm.watermark("C") == 5_000
    with pytest.raises(StaleTokenError):  # a zombie of the old layout is fenced
        wm.report_batch("C", [(interval_name(old - 1), old_tokens[interval_name(old - 1)], 9_000)])
    wm.report_batch("C", [(n, t, 6_000) for n, t in tokens.items()])
    assert wm.watermark("C") == 6_000
    assert read_pin(root)["computations"]["C"]["migration"]["authority"] == "done"
    # a later start acquires the new intervals; one that redoes the move (killed before run.json said
    # it was done) finds the old intervals retired or taken, and acquires: nothing is left behind
    again = _query(root, wm, new)._acquire(
        Layout(new, tuple(range(100, 100 + new)), own=True, migration=dict(migration))
    )
    assert sorted(again) == sorted(tokens) and sorted(wm.authority.intervals("C")) == sorted(tokens)
    assert wm.watermark("C") == 6_000


def test_an_authority_that_never_saw_the_computation_just_has_the_new_intervals_acquired(tmp_path):
    root = Location.of(str(tmp_path))
    wm = InProcessWatermarkClient(Authority())
    migration = _pin(root, 4, 8)
    tokens = _query(root, wm, 8)._acquire(
        Layout(8, tuple(range(100, 108)), own=True, migration=migration)
    )
    assert sorted(tokens) == sorted(interval_name(i) for i in range(8))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_live_drivers_lists_a_running_or_unknown_driver_and_not_a_stopped_or_dead_one(tmp_path):
    leases = Location.of(str(tmp_path / "leases"))
    epoch = DriverEpoch(leases)
    Lease(leases.child("C"), "C").acquire(epoch.get())
    assert live_drivers(leases) == [f"epoch 1: process {os.getpid()} on this host"]
    epoch.mark(stopped=True)
    assert live_drivers(leases) == []
    epoch.mark(stopped=False)
    assert len(live_drivers(leases)) == 1
    leases.child("_drivers", "000000000001").write_text(
        f"{os.uname().nodename}:{_dead_pid()}\n"
    )  # killed
    assert live_drivers(leases) == []
    leases.child("_drivers", "000000000001").write_text("elsewhere:42\n")
    assert "not on this host" in live_drivers(leases)[0]


def _run(tmp_path, **pin) -> Location:
    root = Location.of(str(tmp_path / "run"))
    root.child("checkpoints", "C").mkdirs()
    root.child("run.json").write_text(
        json.dumps({"intervals": 4, "state_layout": "intervals", "groups": [2, 0, 4, 1], **pin})
    )
    return root


def test_rescale_refuses_a_running_driver_the_per_key_layout_and_bad_counts(tmp_path):
    root = _run(tmp_path)
    Lease(root.child("leases", "C"), "C").acquire(
        DriverEpoch(root.child("leases")).get()
    )  # this process "runs" it
    with pytest.raises(MillwheelError, match="a driver may still be running .* stop it first"):
        rescale(root.uri, "C", 8)
    with pytest.raises(MillwheelError, match="no computation 'D'"):
        rescale(root.uri, "D", 8, force=True)
    with pytest.raises(MillwheelError, match="positive integer"):
        rescale(root.uri, "C", 0, force=True)
    with pytest.raises(MillwheelError, match="no run.json"):
        rescale(str(tmp_path / "nothing"), "C", 8)


@pytest.mark.parametrize("layout", [None, "keys"])
def test_rescale_refuses_a_computation_on_the_arrow_mapping_before_it_changes_anything(
    tmp_path, layout
):
    """Its state is in the mapping's own files (``colstate/``), which no move reads: moving
    "nothing" would start the new layout empty. Refused offline, with a layout change, and
    (through ``_rescale.target`` and ``_relayout.plan``) by a running driver's online rescale."""
    root = _run(tmp_path, mappings={"C": {"mapping": "arrow", "partitions": 2}})
    before = root.child("run.json").read_text()
    with pytest.raises(MillwheelError, match="runs on the 'arrow' mapping .* does not move"):
        rescale(root.uri, "C", 8, layout=layout, force=True)
    with pytest.raises(MillwheelError, match="runs on the 'arrow' mapping"):
        target(root, "C", 8)
    with pytest.raises(MillwheelError, match="runs on the 'arrow' mapping"):
        plan(
            root, "C", "keys", None
        )  # what an online layout change checks, before its request is sent
    assert root.child("run.json").read_text() == before
    assert not root.child("leases").exists()  # not even fenced: nothing was started


def test_an_interrupted_rescale_is_finished_by_the_next_start_or_a_second_rescale(tmp_path):
    root = _run(tmp_path)
    migration = _pin(root, 4, 8)
    held = read_pin(root)
    held["groups"] = [2, 0, 4, 1]
    root.child("run.json").write_text(json.dumps(held))
    heartbeats = root.child("heartbeats", "C")
    heartbeats.mkdirs()
    hidden = heartbeats.child(f".{migration['file']}.rescale")
    hidden.write_text("the move")
    with pytest.raises(MillwheelError, match="interrupted; finish it first \\(--intervals 8\\)"):
        rescale(root.uri, "C", 2)
    done = rescale(root.uri, "C", 8)
    assert done["finished"] and heartbeats.child(migration["file"]).exists() and not hidden.exists()
    q = _query(root, None, 8)
    q._check_migration(migration)  # the move waits for the query now
    with pytest.raises(MillwheelError, match="has not run yet"):
        rescale(root.uri, "C", 2)
    # the same command again (an operator whose first one was killed after run.json): nothing
    # to do but start the run, which moves the state; the file and run.json stay as they are
    pin = root.child("run.json").read_text()
    again = rescale(root.uri, "C", 8)
    assert (
        again["pending"]
        and again["file"] == migration["file"]
        and heartbeats.child(migration["file"]).exists()
    )
    assert root.child("run.json").read_text() == pin
    # killed between run.json and the rename (the command, or a driver rescaling online):
    # the next start renames the file itself (run.json names it, so it was written whole)
    heartbeats.child(migration["file"]).move_to(hidden)
    q.rt.log = lambda _m: None
    q._check_migration(migration)
    assert heartbeats.child(migration["file"]).exists() and not hidden.exists()
    # with neither the file nor its hidden copy, the start refuses
    heartbeats.child(migration["file"]).delete()
    with pytest.raises(
        MillwheelError, match="the rescale was interrupted.*millwheel rescale .* --intervals 8"
    ):
        q._check_migration(migration)


def test_the_command_line_says_why_it_refuses(tmp_path, capsys):
    from millwheel.cli import main

    root = _run(tmp_path)
    assert main(["rescale", root.uri, "--computation", "D", "--intervals", "8"]) == 2
    assert "cannot rescale: run directory" in capsys.readouterr().err


@pytest.mark.spark
def test_the_command_prints_only_its_own_lines(tmp_path):
    """``millwheel rescale`` offline starts a Spark session of its own: the JVM's start-up
    warnings (``WARNING: Using incubator modules``), its log and what its Python workers
    print go to a file, as in ``millwheel run``; the terminal gets the command's lines only."""
    root = _run(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "millwheel.cli",
            "rescale",
            root.uri,
            "--computation",
            "C",
            "--intervals",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("rescaled 'C' from 4 to 8 key intervals"), done.stdout
    noise = [
        line
        for line in done.stderr.splitlines()
        if line.strip() and not line.startswith("millwheel: ")
    ]
    assert noise == [], done.stderr
