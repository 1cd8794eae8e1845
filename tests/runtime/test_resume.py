"""A resumed run reports totals: counters are part of what a published batch commits (``tallies/``)."""

from __future__ import annotations

import json

import pytest

from millwheel import Computation, Record, SampleSource, Topology
from millwheel._errors import MillwheelError
from millwheel.runtime import RuntimeSettings, SparkRuntime, default_intervals
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin
from millwheel.runtime._runpin import resolve_intervals
from millwheel.runtime._runtime import pin_groups, pin_run_settings
from millwheel.runtime._wire import interval_groups, spark_hash_int

pytestmark = pytest.mark.spark


class Count(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)
        self.produce("counted", (self.key, self.state.get()))


def _topology(n: int) -> Topology:
    records = [Record(None, {"k": f"k{i % 5}"}, i, f"r{i}") for i in range(n)]
    records.append(records[3])  # delivered twice
    t = Topology("resume")
    t.injector("in", SampleSource(records, batch_size=40))
    t.computation(Count, inputs={"in": lambda r: r.value["k"]}, outputs=["counted"])
    return t


def test_counters_survive_a_restart_and_count_each_batch_once(spark, run_dir):
    settings = RuntimeSettings(
        drain=True
    )  # the intervals: the master's default, then the run's own
    first = SparkRuntime(_topology(200), run_dir, settings, spark=spark)
    intervals = default_intervals(spark.sparkContext.master)
    assert first.intervals == first.settings.intervals == intervals
    first.run(timeout_s=300)
    m1 = dict(first.computations["Count"].metrics)
    assert (m1["records_in"], m1["duplicates"], m1["processed"]) == (201, 1, 200)
    again = SparkRuntime(_topology(200), run_dir, settings, spark=spark)
    assert again.intervals == intervals
    again.run(timeout_s=300)
    m2 = again.computations["Count"].metrics
    assert (m2["records_in"], m2["duplicates"], m2["processed"], m2["productions"]) == (
        201,
        1,
        200,
        200,
    )
    assert again.injectors["in"].status()["records_out"] == 201
    assert len(again.output("counted")) == 200
    # the intervals were dealt over the shuffle partitions at the first start, and kept
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    with open(f"{run_dir}/run.json") as f:
        assert json.load(f)["groups"] == interval_groups(intervals, partitions)


def test_a_run_directory_refuses_other_intervals_or_layout(tmp_path):
    """``run.json`` pins the interval count and state layout on the first start (no Spark
    needed: the check comes before anything else is written)."""
    run = str(tmp_path / "run")
    pin_run_settings(Location.of(run), RuntimeSettings(intervals=4))  # what a first start records
    pin_run_settings(Location.of(run), RuntimeSettings(intervals=4))  # the same settings resume
    held = json.loads((tmp_path / "run" / "run.json").read_text())
    assert held == {"intervals": 4, "state_layout": "intervals"}
    with pytest.raises(
        MillwheelError, match=r"was started with intervals=4 \(this run: 8\).*new run directory"
    ):
        SparkRuntime(_topology(10), run, RuntimeSettings(intervals=8)).start()
    with pytest.raises(MillwheelError, match=r"state_layout='intervals' \(this run: 'keys'\)"):
        SparkRuntime(_topology(10), run, RuntimeSettings(intervals=4, state_layout="keys")).start()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "run.json"
    ]  # nothing else written


@pytest.mark.parametrize(
    ("master", "first"),
    [
        ("local[2]", 4),
        ("local[1]", 2),
        ("local", 2),
        ("local[3,2]", 6),
        ("spark://h:7077", 16),
        ("yarn", 16),
    ],
)
def test_intervals_not_given_are_the_runs_own_else_the_masters_default(tmp_path, master, first):
    """Without ``intervals`` a first start takes two per core of ``local[N]`` (16 elsewhere),
    pins them, and every later start takes the pinned count on any master; a count given
    is kept as given (and refused by the pin if it differs)."""
    root = Location.of(str(tmp_path / "run"))
    assert resolve_intervals(RuntimeSettings(), read_pin(root), master) == first
    pin_run_settings(root, RuntimeSettings(intervals=first))
    for other in ("local[1]", "local[*]", "spark://h:7077"):
        assert resolve_intervals(RuntimeSettings(), read_pin(root), other) == first
    assert resolve_intervals(RuntimeSettings(intervals=7), read_pin(root), master) == 7


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_intervals_must_be_a_whole_number(bad):
    with pytest.raises(MillwheelError, match="RuntimeSettings.intervals must be a whole number"):
        RuntimeSettings(intervals=bad)


def test_a_run_directory_from_before_the_pin_gets_one(tmp_path):
    (tmp_path / "run.json").write_text('{"intervals": 2}')
    pin_run_settings(Location.of(str(tmp_path)), RuntimeSettings(intervals=2))
    assert json.loads((tmp_path / "run.json").read_text()) == {
        "intervals": 2,
        "state_layout": "intervals",
    }
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(MillwheelError, match="is not JSON"):
        pin_run_settings(Location.of(str(tmp_path)), RuntimeSettings(intervals=2))


def test_a_new_run_directory_deals_its_intervals_over_the_partitions_and_keeps_them(tmp_path):
    root = Location.of(str(tmp_path))
    groups = pin_groups(root, 8, 2)
    assert groups == interval_groups(8, 2) and len(set(groups)) == 8 and min(groups) >= 0
    assert [spark_hash_int(g) % 2 for g in groups] == [0, 1] * 4  # 4 and 4, not 3 and 5
    assert json.loads((tmp_path / "run.json").read_text())["groups"] == groups
    # Spark keeps a checkpoint's partition count; the groups stay whatever the session says now
    assert pin_groups(root, 8, 5) == groups
    (tmp_path / "run.json").write_text(json.dumps({"groups": groups[:4]}))
    with pytest.raises(MillwheelError, match="pins 4 key-interval groups for 8 intervals"):
        pin_groups(root, 8, 2)


def test_a_run_directory_started_before_groups_keeps_grouping_by_interval(tmp_path):
    """Its state stores hold rows keyed by the interval number: a directory whose queries
    have checkpoints and whose ``run.json`` pins no groups keeps the identity."""
    (tmp_path / "checkpoints" / "Count" / "offsets").mkdir(parents=True)
    (tmp_path / "run.json").write_text('{"intervals": 8, "state_layout": "intervals"}')
    assert pin_groups(Location.of(str(tmp_path)), 8, 2) == list(range(8))
    assert json.loads((tmp_path / "run.json").read_text()) == {
        "intervals": 8,
        "state_layout": "intervals",
        "groups": list(range(8)),
    }


def test_the_groups_land_where_spark_puts_them(spark):
    """``spark_hash_int`` is Spark's own hash of an int, and a group's partition is its
    pmod: checked against Spark itself, not against our formula."""
    from pyspark.sql import functions as F

    rows = (
        spark.range(-50, 2_000)
        .select(F.col("id").cast("int").alias("v"), F.hash(F.col("id").cast("int")).alias("h"))
        .collect()
    )
    assert [spark_hash_int(r.v) for r in rows] == [r.h for r in rows]
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    groups = interval_groups(16, partitions)
    df = (
        spark.createDataFrame([(g,) for g in groups], "g int")
        .repartition(partitions, "g")
        .select("g", F.spark_partition_id().alias("p"))
    )
    placed = {r.g: r.p for r in df.collect()}
    assert [placed[g] for g in groups] == [i % partitions for i in range(16)]


@pytest.mark.parametrize("lost", ["checkpoints", "run directory"])
def test_a_run_directory_keeps_its_epoch_and_a_lost_checkpoint_starts_a_new_one(tmp_path, lost):
    import shutil

    from millwheel.runtime._runtime import pin_pipeline

    root = Location.of(str(tmp_path / "run"))
    root.mkdirs()
    name, first = pin_pipeline(root, "dc1")
    assert name == "dc1" and len(first) == 16
    root.child("checkpoints", "Joiner", "commits").mkdirs()  # the run made progress
    assert pin_pipeline(root, "dc1")[1] == first  # a restart: the same tokens
    with pytest.raises(MillwheelError, match="belongs to pipeline 'dc1', not 'dc2'"):
        pin_pipeline(root, "dc2")
    if lost == "checkpoints":
        root.child("tallies").mkdirs()
        root.child("tallies", "Joiner.json").write_text("{}")  # it had published output
        shutil.rmtree(tmp_path / "run" / "checkpoints")
        with pytest.raises(
            MillwheelError, match="lost its checkpoints but still holds published output"
        ):
            pin_pipeline(root, "dc1")
        return
    shutil.rmtree(tmp_path / "run")
    root.mkdirs()
    assert pin_pipeline(root, "dc1")[1] not in (
        "",
        first,
    )  # its commits now conflict with the old epoch's


def test_a_run_directory_from_before_epochs_keeps_its_bare_tokens(tmp_path):
    from millwheel.runtime._runtime import pin_pipeline

    root = Location.of(str(tmp_path / "run"))
    root.child("checkpoints", "Joiner", "commits").mkdirs()
    root.child("run.json").write_text(json.dumps({"intervals": 4}))
    assert pin_pipeline(root, "dc1") == ("dc1", "")
    assert json.loads(root.child("run.json").read_text())["pipeline"] == "dc1"
