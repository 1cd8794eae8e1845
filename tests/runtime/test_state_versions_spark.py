"""State versions on Spark (docs/concepts.md "Schema evolution"): a run directory written by
version 1 of a topology file, stopped, then resumed by version 2 of the file.

The user's path: two topology files written here, ``evolve_v1.py`` and ``evolve_v2.py``, each
loaded as ``millwheel run`` loads one (``load_topology``) and run on the same run directory.
Version 2 changes the state of a per-record computation (a dataclass, ``__version__ = 2``
with ``upgrade_from_1``) and of a columnar one on each mapping (``state_version = 2`` with
``upgrade_from_1``): the output over the whole log equals the batch answer computed here, and
``millwheel state`` shows the keys' versions. Two computations of version 2 declare a version
3 that has no upgrade from 1: records of keys whose state version 1 stored are dead-lettered
with the reason, their state left as it was, and keys without such state go on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from millwheel import DEAD_LETTER_STREAM
from millwheel._record import encode_key
from millwheel._runner import load_topology
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._keying import interval_of
from millwheel.runtime._state_reader import read_state, render

pytestmark = pytest.mark.spark

INTERVALS = 2
T = 1_767_261_600_000

COMMON = """
from dataclasses import dataclass

import pandas as pd

from millwheel import (
    ColumnarComputation, Computation, ComputationOptions, DataclassCodec, ErrorPolicy,
    LatePolicy, LogFileSource, Topology,
)

LATE = LatePolicy.process()  # the second file lands after the first run finished: all late


def running(batch, seen, out_stream):
    out, keys = [], []
    for k, v in zip(batch.records["key"], batch.records["value"], strict=True):
        n, t = seen.get(k, (0, 0))
        seen[k] = (n + 1, t + int(v["amount"]))
        out.append((k, n + 1, t + int(v["amount"])))
        keys.append(k)
    batch.produce(out_stream, out, keys=keys, timestamps=list(batch.records["timestamp"]))
    return seen


def seen_of(old, totals):
    return {k: (int(n), int(t)) for k, n, t in zip(old["key"], old["n"], totals, strict=True)}
"""

V1 = """
@dataclass
class Count:
    n: int = 0
    total: int = 0


class Tally(Computation):
    def process_record(self, record):
        s = self.state.get() or Count()
        s.n, s.total = s.n + 1, s.total + record.value["amount"]
        self.state.set(s)
        self.produce(self.name + "_out", (self.key, s.n, s.total))


class ColTally(ColumnarComputation):
    record_columns = ("key", "timestamp", "value")

    def process_batch(self, batch):
        old = batch.state
        seen = running(batch, seen_of(old, old["total"]) if len(old) else {}, self.name + "_out")
        batch.set_state(pd.DataFrame({"key": list(seen), "n": [n for n, _ in seen.values()],
                                      "total": [t for _, t in seen.values()]}))


def per_record(cls):
    return ComputationOptions(state_codec=DataclassCodec(Count), late=LATE)


def columnar(mapping):
    return ComputationOptions(late=LATE, mapping=mapping)


Doomed, ColDoomed = Tally, ColTally
"""

V2 = '''
@dataclass
class Count:
    __version__ = 2
    n: int = 0
    cents: int = 0
    last: str = ""

    @staticmethod
    def upgrade_from_1(fields):
        return {"n": fields["n"], "cents": 100 * fields["total"], "last": ""}


@dataclass
class CountNoPath:
    """Version 3, which no longer reads version 1."""
    __version__ = 3
    n: int = 0
    cents: int = 0

    @staticmethod
    def upgrade_from_2(fields):
        return {"n": fields["n"], "cents": fields["cents"]}


class Tally(Computation):
    state_type = Count

    def process_record(self, record):
        s = self.state.get() or self.state_type()
        s.n, s.cents = s.n + 1, s.cents + 100 * record.value["amount"]
        if hasattr(s, "last"):
            s.last = record.id
        self.state.set(s)
        self.produce(self.name + "_out", (self.key, s.n, s.cents // 100))


class Doomed(Tally):
    state_type = CountNoPath


class ColTally(ColumnarComputation):
    record_columns = ("key", "timestamp", "value")
    state_version = 2

    def upgrade_from_1(self, state):
        return state.assign(cents=100 * state["total"], last="").drop(columns=["total"])

    def process_batch(self, batch):
        old = batch.state
        seen = running(batch, seen_of(old, old["cents"] // 100) if len(old) else {}, self.name + "_out")
        batch.set_state(pd.DataFrame({"key": list(seen), "n": [n for n, _ in seen.values()],
                                      "cents": [100 * t for _, t in seen.values()],
                                      "last": ["v2"] * len(seen)}))


class ColDoomed(ColTally):
    state_version = 3  # no upgrade_from_1, no upgrade_from_2


def per_record(cls):
    codec = DataclassCodec(cls.state_type)
    return ComputationOptions(state_codec=codec, late=LATE, on_error=ErrorPolicy.DEAD_LETTER)


def columnar(mapping):
    return ComputationOptions(late=LATE, mapping=mapping, on_error=ErrorPolicy.DEAD_LETTER)

'''

WIRING = """
topology = Topology("evolve")
topology.injector("events", LogFileSource({logs!r}))
key = lambda r: r.value["user"]
for name, cls, options in [
    ("Tally", Tally, per_record(Tally)),
    ("Doomed", Doomed, per_record(Doomed)),
    ("ColTally", ColTally, columnar("default")),
    ("ColArrow", ColTally, columnar("arrow")),
    ("ColDoomed", ColDoomed, columnar("default")),
]:
    topology.computation(cls, name=name, inputs={{"events": key}}, outputs=[name + "_out"], options=options)
"""


def _users() -> tuple[list[str], str]:
    """Users whose keys all fall in key interval 0, and one (new in the second file) in 1:
    a columnar store holds one version for its interval, so the new user's store has none."""
    old = [u for u in (f"u{i}" for i in range(40)) if interval_of(encode_key(u), INTERVALS) == 0]
    new = next(
        u for u in (f"n{i}" for i in range(40)) if interval_of(encode_key(u), INTERVALS) == 1
    )
    return old[:3], new


def _write(path: Path, rows: list[tuple[str, int]], start: int) -> None:
    path.write_text(
        "".join(
            json.dumps({"id": f"e{start + i}", "ts": T + start + i, "user": u, "amount": a}) + "\n"
            for i, (u, a) in enumerate(rows)
        )
    )


def _run(tmp_path: Path, version: str) -> SparkRuntime:
    path = tmp_path / f"evolve_{version}.py"
    body = {"v1": V1, "v2": V2, "v2-raise": V2.replace("DEAD_LETTER", "RAISE")}[version]
    path.write_text(COMMON + body + WIRING.format(logs=str(tmp_path / "logs")))
    return load_topology(str(path))


def _answer(rows: list[tuple[str, int]]) -> dict[str, tuple[list[int], int]]:
    """Per user: the counts each record ends at (1..n, each once) and the final total."""
    out: dict[str, tuple[list[int], int]] = {}
    for u, a in rows:
        ns, t = out.get(u, ([], 0))
        out[u] = ([*ns, len(ns) + 1], t + a)
    return out


def _produced(rt: SparkRuntime, name: str) -> dict[str, tuple[list[int], int]]:
    by_id = {r.id: r.value for r in rt.output(name + "_out")}  # once per id
    out: dict[str, tuple[list[int], int]] = {}
    for k, n, t in sorted(by_id.values(), key=lambda v: (v[0], v[1])):
        ns, _ = out.get(k, ([], 0))
        out[k] = ([*ns, n], t)
    return out


def test_a_run_of_version_1_resumed_by_version_2_upgrades_its_state(spark, tmp_path):
    old, new = _users()
    first = [(old[i % 3], i + 1) for i in range(9)]
    second = [(old[i % 3], 10 * i) for i in range(6)] + [(new, 7), (new, 8)]
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "_DONE").write_text("")
    _write(logs / "part-1.jsonl", first, 0)
    run = str(tmp_path / "run")
    settings = RuntimeSettings(drain=True, intervals=INTERVALS)
    SparkRuntime(_run(tmp_path, "v1"), run, settings, spark=spark).run(timeout_s=600)
    before = {c: read_state(spark, run, c) for c in ("Doomed", "ColDoomed")}
    assert {k.version for c in before.values() for k in c.keys} == {1}

    _write(logs / "part-2.jsonl", second, 100)  # a stopped run, its next file, new code
    rt = SparkRuntime(_run(tmp_path, "v2"), run, settings, spark=spark)
    rt.run(timeout_s=600)

    want = _answer(first + second)
    for name in ("Tally", "ColTally", "ColArrow"):
        assert _produced(rt, name) == want, name
    tally = read_state(spark, run, "Tally")
    assert {k.key: k.version for k in tally.keys} == dict.fromkeys(want, 2)
    col = read_state(spark, run, "ColTally")
    assert {k.key: k.version for k in col.keys} == dict.fromkeys(want, 2)
    assert {k.key: k.state["last"] for k in col.keys} == dict.fromkeys(want, "v2")
    assert "state versions: v2 4 keys" in render(tally, run, detail=False, limit=20)

    # version 3 without an upgrade from 1: the old users' records are dead-lettered, their
    # state left as it was; the new user goes on
    letters = [d.value for d in rt.output(DEAD_LETTER_STREAM)]
    for name in ("Doomed", "ColDoomed"):
        mine = [d for d in letters if d.computation == name]
        assert sorted(d.record.id for d in mine) == [f"e{100 + i}" for i in range(6)], name
        assert all("cannot be read by version 3" in d.reason for d in mine), mine[0].reason
        assert f"computation {name!r}, key" in mine[0].reason
        assert _produced(rt, name)[new] == ([1, 2], 15), name
        after = {k.key: k for k in read_state(spark, run, name).keys}
        for k in before[name].keys:
            assert (after[k.key].version, after[k.key].state) == (1, k.state), (name, k.key)
        assert after[new].version == 3  # stored by version 3


def test_the_state_command_shows_each_keys_version(spark, tmp_path, capsys):
    """``millwheel state RUN C`` (table and --json) says which version stored each key."""
    from millwheel.runtime._state_reader import state_main

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "_DONE").write_text("")
    _write(logs / "part-1.jsonl", [("a", 1), ("b", 2)], 0)
    run = str(tmp_path / "run")
    settings = RuntimeSettings(drain=True, intervals=INTERVALS)
    SparkRuntime(_run(tmp_path, "v1"), run, settings, spark=spark).run(timeout_s=600)
    assert state_main([run, "Tally"]) == 0
    out = capsys.readouterr().out
    assert "state versions: v1 2 keys" in out and " v1 state " in out, out
    assert state_main([run, "ColTally", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {k["key"]: k["version"] for k in data["keys"]} == {"a": 1, "b": 1}
    assert state_main([run, "Tally", "--key", "a"]) == 0
    assert "version 1" in capsys.readouterr().out


def test_under_raise_the_resumed_run_stops_with_the_message(spark, tmp_path):
    """``ErrorPolicy.RAISE``: state no upgrade reaches stops the run, the message naming the
    computation, the key and both versions."""
    from millwheel import RunError

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "_DONE").write_text("")
    _write(logs / "part-1.jsonl", [("a", 1)], 0)
    run = str(tmp_path / "run")
    settings = RuntimeSettings(drain=True, intervals=INTERVALS)
    SparkRuntime(_run(tmp_path, "v1"), run, settings, spark=spark).run(timeout_s=600)
    _write(logs / "part-2.jsonl", [("a", 2)], 100)
    with pytest.raises(RunError) as stopped:
        SparkRuntime(_run(tmp_path, "v2-raise"), run, settings, spark=spark).run(timeout_s=600)
    text = str(stopped.value)
    assert "StateVersionError" in text, text[-2000:]
    assert "key 'a'" in text and "state written by version 1 of" in text, text[-2000:]
    assert "cannot be read by version 3" in text, text[-2000:]
