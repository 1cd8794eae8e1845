"""A rescale whose driver dies before its answer is final (``_requests.orphan_answer``), without
Spark: the next driver of the computation answers it from what ``run.json`` holds — ``failed``,
nothing changed, when its move never began or changed nothing; and ``--status`` says so as soon
as the driver is gone. Requests sent with and without ``--no-wait`` and the automatic policy's
decisions alike; and every answer names the computation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from millwheel.cli import main
from millwheel.runtime._autoscale import Decision
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import update_pin
from millwheel.runtime._lease import DriverEpoch, Lease
from millwheel.runtime._online import OnlineRescaler, _Job, read_answer, rescale

NAME = "Counter"


def _run(tmp_path) -> Location:
    root = Location.of(str(tmp_path / "run"))
    root.child("checkpoints", NAME).mkdirs()
    root.child("run.json").write_text(
        json.dumps({"intervals": 4, "state_layout": "intervals", "groups": [2, 0, 4, 1]})
    )
    return root


def _driver(root: Location) -> SimpleNamespace:
    """This process as a driver of ``Counter``: a new driver epoch, the computation's lease under it."""
    epoch = DriverEpoch(root.child("leases"))
    Lease(root.child("leases", NAME), NAME).acquire(epoch.get())
    logged: list[str] = []
    counter = SimpleNamespace(
        intervals=4,
        query=None,
        outbox=SimpleNamespace(published=3, on_summary=lambda *_: None),
        stop=lambda: None,
        start=lambda: None,
    )
    return SimpleNamespace(
        root=root,
        settings=SimpleNamespace(autoscale=None),
        computations={NAME: counter},
        driver_epoch=epoch,
        log=logged.append,
        logged=logged,
        layouts={},
        watermarks=SimpleNamespace(note=lambda *_: None),
    )


def _killed(root: Location, rt: SimpleNamespace) -> None:
    """Driver ``rt`` is killed -9: its ``_drivers`` entry names a process that is gone."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    root.child("leases", "_drivers", f"{rt.driver_epoch.value:012d}").write_text(
        f"{os.uname().nodename}:{p.pid}\n"
    )


def _status(root: Location, capsys) -> str:
    capsys.readouterr()
    assert main(["rescale", root.uri, "--status"]) == 0
    return capsys.readouterr().out


def _decision(rt: SimpleNamespace) -> _Job:
    d = Decision(
        NAME,
        "split",
        4,
        8,
        "interval 0 took 900 ms, 9.0x the median 100 ms, in each of the last 3 batches",
        {"step_ms": [900.0]},
    )
    return _Job(f"{rt.driver_epoch.value:012d}-auto-0123abcd", NAME, 8, d)


@pytest.mark.parametrize("how", ["no_wait_taken", "no_wait_never_taken", "autoscale_waiting"])
def test_a_rescale_whose_driver_died_before_its_move_began_is_answered_failed_nothing_changed(
    tmp_path, capsys, how
):
    root = _run(tmp_path)
    first = _driver(root)
    rescaler = OnlineRescaler(first)
    if how == "autoscale_waiting":
        job = _decision(first)
        rescaler._enqueue(job)
        rid = job.rid
    else:
        rid = rescale(root.uri, NAME, 8, wait=False)["id"]
        if how == "no_wait_taken":
            rescaler._take_requests()
    shown = _status(root, capsys)
    assert (
        f"{rid}: {NAME} -> 8 key intervals: {'sent' if how == 'no_wait_never_taken' else 'waiting'}"
        in shown
    ), shown
    _killed(root, first)
    # before any driver takes over, --status says what the run directory holds
    shown = _status(root, capsys)
    assert (
        f"{rid}: {NAME} -> 8 key intervals: failed (the driver (epoch {first.driver_epoch.value}) stopped before"
        in shown
    ), shown
    assert "nothing changed" in shown
    # the next driver of the computation answers it (it never carries it out)
    second = _driver(root)
    again = OnlineRescaler(second)
    again._take_requests()
    assert not again.jobs
    answer = read_answer(root, rid)
    assert (
        answer["state"] == "failed"
        and not answer["recorded"]
        and answer["answered_by"] == second.driver_epoch.value
    ), answer
    assert "nothing changed" in answer["detail"] and repr(NAME) in answer["detail"]
    assert (answer.get("decision") is not None) == (how == "autoscale_waiting")
    assert f"{rid}: {NAME} -> 8 key intervals: failed" in _status(root, capsys)
    assert (
        json.loads(root.child("run.json").read_text()).get("computations") is None
    )  # nothing changed indeed


@pytest.mark.parametrize("recorded", [False, True])
def test_a_rescale_whose_driver_died_in_its_move_is_answered_from_run_json(tmp_path, recorded):
    """``moving``: nothing changed while ``run.json`` still gives the computation the layout it
    had when the move began; a move ``run.json`` recorded took effect, and the next driver runs with it."""
    root = _run(tmp_path)
    first = _driver(root)
    rid = rescale(root.uri, NAME, 8, wait=False)["id"]
    rescaler = OnlineRescaler(first)
    rescaler._take_requests()
    job = rescaler.jobs[0]
    job.figures.update({"from": 4, "from_layout": "intervals"})
    rescaler._answer(job, "moving", "its query is stopped; moving the state")
    if recorded:
        own = {
            "intervals": 8,
            "groups": list(range(10, 18)),
            "migration": {"file": "000000000000.parquet", "from_intervals": 4},
        }
        update_pin(root, lambda pin: pin.setdefault("computations", {}).__setitem__(NAME, own))
    _killed(root, first)
    second = _driver(root)
    OnlineRescaler(second)._take_requests()
    answer = read_answer(root, rid)
    assert answer["recorded"] is recorded and repr(NAME) in answer["detail"], answer
    if recorded:
        assert (
            answer["state"] == "done"
            and f"driver epoch {second.driver_epoch.value} runs with it" in answer["detail"]
        ), answer
    else:
        assert answer["state"] == "failed" and "nothing changed" in answer["detail"], answer


def test_a_driver_leaves_requests_of_a_computation_it_does_not_run_to_their_driver(tmp_path):
    """Another driver of the run (``--only``) still runs the computation: its requests are its own."""
    root = _run(tmp_path)
    first = _driver(root)
    rid = rescale(root.uri, NAME, 8, wait=False)["id"]
    other = _driver(root)
    other.computations = {"Tally": other.computations.pop(NAME)}
    OnlineRescaler(other)._take_requests()
    assert read_answer(root, rid) is None
    mine = OnlineRescaler(first)  # the driver it was sent to still takes it
    mine._take_requests()
    assert [j.rid for j in mine.jobs] == [rid]


def test_the_answer_of_a_done_rescale_names_the_computation(tmp_path):
    root = _run(tmp_path)
    rt = _driver(root)
    rid = rescale(root.uri, NAME, 8, wait=False)["id"]
    rescaler = OnlineRescaler(rt)
    rescaler._take_requests()
    job = rescaler.jobs[0]
    job.state, job.result, job.at["restarted"] = (
        "restarted",
        {"file": "000000000000.parquet"},
        job.at["requested"],
    )
    job.figures.update({"keys": 12, "from": 4, "stopped_s": 0.5})
    own = {
        "intervals": 8,
        "groups": list(range(10, 18)),
        "migration": {"file": "000000000000.parquet", "from_intervals": 4, "moved": True},
    }
    update_pin(root, lambda pin: pin.setdefault("computations", {}).__setitem__(NAME, own))
    rescaler._advance(job)
    answer = read_answer(root, rid)
    assert answer["state"] == "done", answer
    assert (
        f"the query of {NAME!r} was down 0.5 s" in answer["detail"]
        and "C's" not in answer["detail"]
    ), answer
