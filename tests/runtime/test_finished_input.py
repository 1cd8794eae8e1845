"""A finished run directory run again after its log files changed (the user's path: a run
that drained its directory, a new day's file dropped in, ``millwheel run`` again).

A finished run's injectors promised that nothing more would come (low watermarks +inf,
§4.5), so the new records would all be late; the command must neither print the old
answer as if it were current nor read the new file into it, but say which files changed
and what to do. Unchanged input still answers from ``finished.json`` without Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from millwheel.runtime._cli import _save_finished, input_changed
from millwheel.runtime._status import Snapshot

MILLWHEEL = str(Path(sys.executable).with_name("millwheel"))

TOPOLOGY = """
from millwheel import Computation, LogFileSource, Record, Topology


class Totals(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + record.value["amount"])


topology = Topology("user-totals")
topology.injector("events", LogFileSource("logs", finite=True))
topology.computation(Totals, inputs={"events": lambda r: r.value["user"]}, outputs=["totals"])
"""


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _finished_run(tmp_path: Path):
    (tmp_path / "mytopo.py").write_text(TOPOLOGY)
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(logs / "events-2026-01-01.jsonl", [{"user": "u1", "amount": 3, "ts": 1767225600000}])
    _write(logs / "events-2026-01-02.jsonl", [{"user": "u2", "amount": 4, "ts": 1767312000000}])
    (logs / "notes.txt").write_text("not a log file\n")
    sys.path.insert(0, str(tmp_path))
    cwd = os.getcwd()
    try:
        os.chdir(
            tmp_path
        )  # the topology names its directory relative to where it runs, as a user's does
        import importlib

        module = importlib.import_module("mytopo")
        topology = module.topology
        root = tmp_path / "run"
        root.mkdir()
        _save_finished(str(root), topology, (), Snapshot(1.0, 0, ()), {}, 1.0)
    finally:
        os.chdir(cwd)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mytopo", None)
    return topology, root, logs


def _run_again(tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ""}
    return subprocess.run(
        [MILLWHEEL, "run", "mytopo.py", "--checkpoint", "run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_unchanged_input_answers_from_the_finished_run(tmp_path):
    _finished_run(tmp_path)
    (tmp_path / "logs" / "notes.txt").write_text("other files do not count\n")
    again = _run_again(tmp_path)
    assert again.returncode == 0, again.stderr
    assert "nothing is left to do" in again.stderr and "starting Spark" not in again.stderr


def test_a_new_or_grown_log_file_is_named_and_not_answered_with_the_old_result(tmp_path):
    topology, root, logs = _finished_run(tmp_path)
    _write(logs / "events-2026-01-03.jsonl", [{"user": "u1", "amount": 5, "ts": 1767398400000}])
    _write(logs / "events-2026-01-01.jsonl", [{"user": "u3", "amount": 1, "ts": 1767225600001}])
    saved = json.loads((root / "finished.json").read_text())
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert input_changed(saved, topology) == [
            "events: events-2026-01-01.jsonl (grew)",
            "events: events-2026-01-03.jsonl (new)",
        ]
    finally:
        os.chdir(cwd)
    again = _run_again(tmp_path)
    assert again.returncode == 2, (again.stdout, again.stderr)
    assert (
        "events-2026-01-03.jsonl (new)" in again.stderr
        and "events-2026-01-01.jsonl (grew)" in again.stderr
    )
    assert "--fresh" in again.stderr and "would all be late" in again.stderr
    assert "nothing is left to do" not in again.stderr and "starting Spark" not in again.stderr
    assert again.stdout == ""  # the old answer is not printed as if it were current


def test_a_finished_json_without_a_listing_compares_nothing(tmp_path):
    topology, root, logs = _finished_run(tmp_path)
    saved = json.loads((root / "finished.json").read_text())
    saved.pop("logs")
    _write(logs / "events-2026-01-03.jsonl", [{"user": "u1", "amount": 5, "ts": 1767398400000}])
    assert input_changed(saved, topology) == []
