"""A query's input (``millwheel/runtime/plans/_inputs.py``): one file source over its
heartbeats and every input directory for a new checkpoint; a checkpoint written with a
source per directory keeps them; one that can no longer be read with one source stops with why."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from millwheel import Computation, Record, SampleSource, Topology
from millwheel._errors import RunError
from millwheel.runtime import RuntimeSettings, SparkRuntime
from millwheel.runtime._fs import Location
from millwheel.runtime._spark_internals import checkpoint_sources
from millwheel.runtime.plans import _inputs
from millwheel.runtime.plans._inputs import one_source

pytestmark = pytest.mark.spark


class Count(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)
        self.produce("counted", (self.key, self.state.get()))


class Relay(Computation):
    def process_record(self, record: Record) -> None:
        self.produce("relayed", record.value)


def _topology(n: int) -> Topology:
    """``n`` records over 5 keys, through a relay (a computation reading another's
    productions) into a count; the first records are the same for every ``n``."""
    records = [Record(None, {"k": f"k{i % 5}"}, i, f"r{i}") for i in range(n)]
    t = Topology("inputs")
    t.injector("in", SampleSource(records, batch_size=40))
    t.computation(Relay, inputs={"in": lambda r: r.value["k"]}, outputs=["relayed"])
    t.computation(Count, inputs={"relayed": lambda r: r.value["k"]}, outputs=["counted"])
    return t


def _answer(rt: SparkRuntime) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rt.output("counted"):
        key, n = r.value
        out[key] = max(out.get(key, 0), n)
    return out


def _sources(rt: SparkRuntime) -> dict[str, int | None]:
    return {name: checkpoint_sources(q.checkpoint) for name, q in rt.computations.items()}


def test_a_new_query_reads_its_heartbeats_and_inputs_with_one_file_source(spark, tmp_path):
    settings = RuntimeSettings(drain=True, intervals=2)
    rt = SparkRuntime(_topology(200), str(tmp_path / "run"), settings, spark=spark)
    rt.run(timeout_s=300)
    assert _sources(rt) == {"Relay": 1, "Count": 1}
    assert all(q.listed_first for q in rt.computations.values())
    assert _answer(rt) == {f"k{i}": 40 for i in range(5)}


def test_a_checkpoint_written_with_a_source_per_directory_resumes_with_them(
    spark, tmp_path, monkeypatch
):
    """A run started by the code before one source (here: ``one_source`` answering
    ``None``) and stopped part way resumes under the new code with its sources, and
    finishes exactly once."""
    run = str(tmp_path / "run")
    settings = RuntimeSettings(drain=True, intervals=2)
    with monkeypatch.context() as m:
        m.setattr(_inputs, "one_source", lambda query: None)
        first = SparkRuntime(_topology(240), run, settings, spark=spark)
        first.start()
        try:
            deadline = time.monotonic() + 240
            while first.computations["Count"].metrics["records_in"] == 0:
                assert time.monotonic() < deadline, first.status()
                first.poll()
                time.sleep(0.05)
        finally:
            first.stop()
    assert _sources(first) == {"Relay": 2, "Count": 2}  # heartbeats and one producer each
    again = SparkRuntime(_topology(240), run, settings, spark=spark)
    again.run(timeout_s=300)
    assert _sources(again) == {"Relay": 2, "Count": 2}
    assert _answer(again) == {f"k{i}": 48 for i in range(5)}
    assert len(again.output("counted")) == 240


def _query(spark, tmp_path, root: str, sources: int | None, fields=None, per_trigger=None):
    """What ``one_source`` reads of a query: its runtime's root, streams and keyer, its
    checkpoint (with ``sources`` source logs), its heartbeat directory."""
    checkpoint = Location.of(str(tmp_path / "cp"))
    for i in range(sources or 0):
        checkpoint.child("sources", str(i)).mkdirs()
    rt = SimpleNamespace(
        spark=spark,
        settings=SimpleNamespace(max_files_per_trigger=per_trigger),
        root=SimpleNamespace(uri=root),
        streams=SimpleNamespace(
            location=lambda s, p: SimpleNamespace(uri=f"{root}/streams/{s}/{p}")
        ),
        producers=lambda s: ["P1", "P2"] if s == "a" else ["P3"],
        keyer=SimpleNamespace(
            fields=fields or {}, ddl=lambda names: "`key:C` binary, `interval:C` int"
        ),
    )
    return SimpleNamespace(
        rt=rt,
        spec=SimpleNamespace(inputs={"a": None, "b": None}),
        name="C",
        checkpoint=checkpoint,
        heartbeats=SimpleNamespace(uri=f"{root}/heartbeats/C"),
    )


def test_one_source_is_a_glob_of_every_directory_heartbeats_first(spark, tmp_path):
    one = one_source(_query(spark, tmp_path, "/data/run-1", None))
    assert one is not None
    assert one.path == ("/data/run-1/{heartbeats/C,streams/a/P1,streams/a/P2,streams/b/P3}")
    assert one.dirs == 4
    names = one.schema.fieldNames()
    assert {"interval", "wm", "now", "upto", "id", "ts", "key", "value", "key:C"} <= set(names)
    assert len(names) == len(set(names))  # a column both kinds of file have, once


@pytest.mark.parametrize(
    "root",
    ["/data/my run", "/data/run[1]", "/data/{run}"],
    ids=["space", "brackets", "braces"],
)
def test_a_path_one_glob_cannot_name_keeps_a_source_per_directory_or_stops_a_one_source_checkpoint(
    spark, tmp_path, root
):
    assert one_source(_query(spark, tmp_path / "new", root, None)) is None
    assert one_source(_query(spark, tmp_path / "old", root, 3)) is None
    with pytest.raises(
        RunError,
        match=r"reads every input with one file source, and now cannot: .* not a plain path",
    ):
        one_source(_query(spark, tmp_path / "one", root, 1))


def test_a_cap_per_input_keeps_a_source_per_directory_in_a_new_checkpoint(spark, tmp_path):
    """``max_files_per_trigger`` caps each input's files per batch: one source would cap all
    of them, heartbeats included. A checkpoint written with one source keeps it under a cap."""
    assert one_source(_query(spark, tmp_path / "new", "/data/run", None, per_trigger=2)) is None
    assert one_source(_query(spark, tmp_path / "one", "/data/run", 1, per_trigger=2)) is not None


def test_inputs_declaring_different_fields_keep_a_source_per_directory(spark, tmp_path):
    fields = {
        "a": SimpleNamespace(spark_ddl=lambda: "struct<x: bigint>"),
        "b": SimpleNamespace(spark_ddl=lambda: "struct<x: string>"),
    }
    assert one_source(_query(spark, tmp_path / "new", "/data/run", None, fields)) is None
    with pytest.raises(RunError, match="declare different fields"):
        one_source(_query(spark, tmp_path / "one", "/data/run", 1, fields))
