"""The request side of an online rescale (``millwheel/runtime/_online.py``), without Spark:
who a request goes to, what a driver takes or refuses, and the answer when the driver dies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from millwheel._errors import MillwheelError
from millwheel.runtime._fs import Location
from millwheel.runtime._lease import DriverEpoch, Lease
from millwheel.runtime._online import OnlineRescaler, holder, read_answer, request_rescale, rescale


def _run(tmp_path, name: str = "C") -> Location:
    root = Location.of(str(tmp_path / "run"))
    root.child("checkpoints", name).mkdirs()
    root.child("run.json").write_text(
        json.dumps({"intervals": 4, "state_layout": "intervals", "groups": [2, 0, 4, 1]})
    )
    return root


def _driver(root: Location, name: str = "C") -> SimpleNamespace:
    """This process as the driver running computation ``name`` (its lease under a new epoch), as the rescaler sees it."""
    epoch = DriverEpoch(root.child("leases"))
    Lease(root.child("leases", name), name).acquire(epoch.get())
    logged: list[str] = []
    return SimpleNamespace(
        root=root,
        settings=SimpleNamespace(autoscale=None),
        computations={name: object()},
        driver_epoch=epoch,
        log=logged.append,
        logged=logged,
    )


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_request_goes_to_the_epoch_holding_the_computation_and_the_driver_takes_it(tmp_path):
    root = _run(tmp_path)
    rt = _driver(root)
    assert holder(root, "C")[0] == rt.driver_epoch.value
    sent = rescale(root.uri, "C", 8, wait=False)  # a driver runs C: online, not offline
    assert (
        sent["state"] == "sent"
        and sent["epoch"] == rt.driver_epoch.value
        and sent["by"].endswith(f":{os.getpid()}")
    )
    rescaler = OnlineRescaler(rt)
    rescaler._take_requests()
    assert [(j.computation, j.intervals, j.state) for j in rescaler.jobs] == [("C", 8, "waiting")]
    assert read_answer(root, sent["id"])["state"] == "waiting"
    assert rescaler.active() and not rescaler.busy("C")  # not stopped yet: the loop goes on with it
    assert "waiting" in rescaler.status("C")["rescale"]
    rescaler._take_requests()  # a request is taken once
    assert len(rescaler.jobs) == 1


def test_a_driver_refuses_requests_it_must_not_take_and_ignores_other_epochs(tmp_path):
    root = _run(tmp_path)
    rt = _driver(root)
    control = root.child("control", "rescale")
    control.mkdirs()
    mine = f"{rt.driver_epoch.value:012d}"
    control.child(f"{mine}-a.request").write_text(
        json.dumps({"computation": "D", "intervals": 8, "epoch": rt.driver_epoch.value})
    )
    control.child(f"{mine}-b.request").write_text(
        json.dumps({"computation": "C", "intervals": 0, "epoch": rt.driver_epoch.value})
    )
    control.child(f"{mine}-c.request").write_text(
        json.dumps({"computation": "C", "intervals": 8, "epoch": 99})
    )
    control.child(f"{mine}-d.request").write_text("not json")
    control.child("000000000099-e.request").write_text(
        json.dumps({"computation": "C", "intervals": 8, "epoch": 99})
    )
    rescaler = OnlineRescaler(rt)
    rescaler._take_requests()
    assert not rescaler.jobs
    answers = {rid: read_answer(root, f"{mine}-{rid}") for rid in "abcd"}
    assert all(a["state"] == "refused" for a in answers.values()), answers
    assert "does not run computation 'D'" in answers["a"]["detail"]
    assert "positive integer" in answers["b"]["detail"]
    assert "addressed to driver epoch 99" in answers["c"]["detail"]
    assert "not a rescale request" in answers["d"]["detail"]
    assert (
        read_answer(root, "000000000099-e") is None
    )  # another driver's: never answered by this one


def test_a_request_file_of_another_user_is_refused(tmp_path, monkeypatch):
    root = _run(tmp_path)
    rt = _driver(root)
    sent = request_rescale(root.uri, "C", 8, wait=False)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(root.path).st_uid + 1)
    rescaler = OnlineRescaler(rt)
    rescaler._take_requests()
    assert read_answer(root, sent["id"])["state"] == "refused"
    assert "not owned by the user running this driver" in read_answer(root, sent["id"])["detail"]


def test_the_command_says_what_happened_when_the_driver_dies_before_answering(tmp_path):
    root = _run(tmp_path)
    rt = _driver(root)
    epoch = f"{rt.driver_epoch.value:012d}"
    # the driver dies with the request unanswered: nothing changed
    root.child("leases", "_drivers", epoch).write_text(f"{os.uname().nodename}:{_dead_pid()}\n")
    assert holder(root, "C") is None
    with pytest.raises(MillwheelError, match="no running driver holds computation 'C'"):
        request_rescale(root.uri, "C", 8)
    with pytest.raises(MillwheelError, match="positive integer"):
        rescale(root.uri, "C", 0)  # no live driver: the offline path and its checks
    from millwheel.runtime._requests import gone_answer as _driver_gone

    assert not _driver_gone(root, "C", 8, "x", 1)["recorded"]
    held = json.loads(root.child("run.json").read_text())
    held["computations"] = {"C": {"intervals": 8, "groups": list(range(10, 18))}}
    root.child("run.json").write_text(json.dumps(held))
    gone = _driver_gone(root, "C", 8, "x", 1)
    assert gone["recorded"] and "next `millwheel run`" in gone["detail"]


def test_a_driver_killed_and_not_yet_reaped_is_not_running(tmp_path):
    """A driver killed -9 is a zombie until its parent reaps it (a supervisor, a test that
    waits on it later): it holds nothing, so the waiting command must not wait for it."""
    import time

    from millwheel.runtime._lease import live_drivers, process_running

    root = _run(tmp_path)
    rt = _driver(root)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(") ", 1)[1][:1] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not process_running(child.pid) and process_running(os.getpid())
        root.child("leases", "_drivers", f"{rt.driver_epoch.value:012d}").write_text(
            f"{os.uname().nodename}:{child.pid}\n"
        )
        assert holder(root, "C") is None
        assert live_drivers(root.child("leases")) == []
    finally:
        child.wait()


def test_the_live_status_shows_a_rescale_and_a_decision():
    from millwheel.runtime._status import _decision_text

    text = _decision_text(
        {
            "action": "split",
            "from": 4,
            "to": 8,
            "at_ms": 0,
            "reason": "interval 1 took 900 ms",
            "outcome": "done: 10 keys moved",
        }
    )
    assert text == "split 4 -> 8 at 00:00:00 UTC: interval 1 took 900 ms; done: 10 keys moved"


def test_the_command_lists_the_requests_and_their_answers(tmp_path, capsys):
    from millwheel.cli import main

    root = _run(tmp_path)
    rt = _driver(root)
    sent = rescale(root.uri, "C", 8, wait=False)
    OnlineRescaler(rt)._take_requests()
    assert main(["rescale", root.uri, "--status"]) == 0
    assert f"{sent['id']}: C -> 8 key intervals: waiting" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["rescale", root.uri, "--computation", "C"])


class _FakeQuery:
    """A computation's query as the rescaler drives it: stopped and started, its outbox's
    published batch, its checkpoint (whose state stores the stop releases)."""

    def __init__(self, checkpoint: Location) -> None:
        self.checkpoint = checkpoint
        self.query = None
        self.starts = 0
        self.stops = 0
        self.intervals = 4
        self.outbox = SimpleNamespace(published=7, on_summary=lambda *_: None)

    def stop(self) -> None:
        self.stops += 1

    def start(self) -> None:
        self.starts += 1


def test_a_planned_batch_with_weak_productions_is_committed_first_and_the_rescale_tried_again(
    tmp_path, monkeypatch
):
    import time

    from millwheel.runtime import _online
    from millwheel.runtime._layout import update_pin
    from millwheel.runtime._settle import PlannedBatchPublished

    root = _run(tmp_path)
    rt = _driver(root)
    c = _FakeQuery(root.child("checkpoints", "C"))
    rt.computations = {"C": c}
    rt.settings, rt.intervals = SimpleNamespace(autoscale=None), 4
    rt.groups, rt.layouts, rt.keyer, rt.spark = [2, 0, 4, 1], {}, SimpleNamespace(own={}), None
    rt.watermarks = SimpleNamespace(note=lambda *_: None)
    attempts = []

    def move_state(tgt, outbox, spark, say, t0):
        attempts.append(outbox.published)
        if len(attempts) == 1:
            msg = "batch 8 published weak productions"
            raise PlannedBatchPublished(msg)
        own = {
            "intervals": 8,
            "groups": list(range(10, 18)),
            "migration": {"file": "000000000003.parquet", "from_intervals": 4},
        }
        update_pin(root, lambda pin: pin.setdefault("computations", {}).__setitem__("C", own))
        return {
            "keys": 12,
            "from": 4,
            "to": 8,
            "file": "000000000003.parquet",
            "seconds": 0.1,
            "read_s": 0.05,
        }

    monkeypatch.setattr(_online, "move_state", move_state)
    monkeypatch.setattr(_online, "settled", lambda *_: None)
    rescaler = OnlineRescaler(rt)
    sent = rescale(root.uri, "C", 8, wait=False)

    def turn(until, what):
        deadline = time.monotonic() + 10
        while not until():
            assert time.monotonic() < deadline, (what, [j.text() for j in rescaler.jobs])
            rescaler.poll()
            time.sleep(0.01)

    turn(
        lambda: len(attempts) == 1 and rescaler.jobs[0].state == "waiting" and c.starts == 1,
        "the first attempt, then C again with its old layout",
    )
    assert (
        rescaler.jobs[0].attempts == 1
        and "weak productions" in read_answer(root, sent["id"])["detail"]
    )
    assert rt.layouts["C"].intervals == 4 and "C" not in rt.keyer.own
    rescaler.poll()
    assert len(attempts) == 1  # it waits for the batch in the way to be published
    c.outbox.published = 8
    turn(lambda: rescaler.jobs and rescaler.jobs[0].state == "restarted", "the second attempt")
    assert attempts == [7, 8] and c.stops == 2 and c.starts == 2
    assert rt.layouts["C"].intervals == 8 and rt.keyer.own == {
        "C": 8
    }  # the driver's writers key for 8 now
    assert not rescaler.busy("C")
    update_pin(
        root, lambda pin: pin["computations"]["C"]["migration"].__setitem__("moved", True)
    )  # a published batch read it
    turn(lambda: not rescaler.jobs, "done")
    answer = read_answer(root, sent["id"])
    assert (
        answer["state"] == "done"
        and answer["keys"] == 12
        and answer["from"] == 4
        and "stopped_s" in answer
    )


def test_a_layout_change_is_asked_of_the_running_driver_and_said_in_the_answers(tmp_path, capsys):
    """``--layout`` goes online too: the request carries it, the driver takes it (a bad layout
    is refused), ``--status`` says it; before sending, what the change would refuse is refused."""
    from millwheel.cli import main

    root = _run(tmp_path)
    rt = _driver(root)
    sent = rescale(root.uri, "C", layout="keys", wait=False)
    assert sent["state"] == "sent" and sent["layout"] == "keys" and sent["intervals"] is None
    both = rescale(root.uri, "C", 8, layout="keys", wait=False)
    control = root.child("control", "rescale")
    mine = f"{rt.driver_epoch.value:012d}"
    control.child(f"{mine}-x.request").write_text(
        json.dumps({"computation": "C", "layout": "rows", "epoch": rt.driver_epoch.value})
    )
    rescaler = OnlineRescaler(rt)
    rescaler._take_requests()
    assert sorted((j.intervals or 0, j.layout) for j in rescaler.jobs) == [(0, "keys"), (8, "keys")]
    assert "one of intervals, keys, got 'rows'" in read_answer(root, f"{mine}-x")["detail"]
    assert "the 'keys' state layout" in rescaler.status("C")["rescale"]
    with pytest.raises(
        MillwheelError, match="'intervals' layout with 4 key intervals already: nothing to change"
    ):
        rescale(root.uri, "C", layout="intervals", wait=False)
    with pytest.raises(
        MillwheelError, match="give --intervals N, --layout intervals|keys, or both"
    ):
        rescale(root.uri, "C", wait=False)
    capsys.readouterr()
    assert main(["rescale", root.uri, "--status"]) == 0
    out = capsys.readouterr().out
    assert f"{sent['id']}: C -> the 'keys' state layout: waiting" in out, out
    assert f"{both['id']}: C -> the 'keys' state layout with 8 key intervals: waiting" in out, out


def test_the_command_says_what_a_driver_killed_during_a_layout_change_left(tmp_path):
    from millwheel.runtime._requests import gone_answer as _driver_gone

    root = _run(tmp_path)
    assert not _driver_gone(root, "C", None, "x", 1, "keys")["recorded"]
    held = json.loads(root.child("run.json").read_text())
    entry = {
        "intervals": 4,
        "groups": [2, 0, 4, 1],
        "state_layout": "keys",
        "migration": {"relayout": "swapping", "batch": 3},
    }
    held["computations"] = {"C": entry}
    root.child("run.json").write_text(json.dumps(held))
    gone = _driver_gone(root, "C", None, "x", 1, "keys")
    assert gone["recorded"] and "--layout keys` runs again, which finishes it" in gone["detail"], (
        gone
    )
    assert not _driver_gone(root, "C", 8, "x", 1, "keys")["recorded"]  # another count was asked for
    entry["migration"]["relayout"] = "done"
    root.child("run.json").write_text(json.dumps(held))
    assert (
        "the next `millwheel run` resumes with it"
        in _driver_gone(root, "C", None, "x", 1, "keys")["detail"]
    )


def test_the_automatic_policy_leaves_a_computation_on_per_key_rows_alone(tmp_path):
    """It splits and merges interval rows only: a per-key computation's hot interval is not
    split (that would rebuild its store, a layout change), however hot."""
    from millwheel.runtime._autoscale import AutoscalePolicy, Figures
    from millwheel.runtime._layout import Layout

    policy = AutoscalePolicy(window=2, min_hot_ms=100.0)
    hot = {0: Figures(900.0, 10), 1: Figures(10.0, 10), 2: Figures(10.0, 10), 3: Figures(10.0, 10)}
    for state_layout, decided in (("keys", 0), ("intervals", 1)):
        c = SimpleNamespace(intervals=4, outbox=SimpleNamespace(on_summary=lambda *_: None))
        rt = SimpleNamespace(
            root=_run(tmp_path),
            settings=SimpleNamespace(autoscale=policy),
            computations={"C": c},
            driver_epoch=SimpleNamespace(value=1),
            layouts={"C": Layout(4, (2, 0, 4, 1), state_layout=state_layout)},
            log=lambda _m: None,
            watermarks=SimpleNamespace(note=lambda *_: None),
        )
        rescaler = OnlineRescaler(rt)
        rescaler.history["C"].extend([hot, hot, hot])
        rescaler._autoscale()
        assert len(rescaler.decisions) == decided, (state_layout, rescaler.decisions)
