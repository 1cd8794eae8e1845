"""``millwheel run`` on a user's topology file with a ``SparkSource`` and ``SparkSink``s (issue 25):
the value parser defined in the file reaches the executors, ``--conf`` and the topology's
``spark_conf`` reach the session (the command line winning), the run ends once the source
says it is finished, and a Parquet sink holds every record once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def test_a_topology_file_with_a_spark_source_and_sinks(tmp_path):
    out = tmp_path / "out.parquet"
    seen = tmp_path / "conf.txt"
    (tmp_path / "io_topology.py").write_text(
        textwrap.dedent(f"""
        from examples.sequence_source import FORMAT, SequenceDataSource
        from millwheel import Computation, SparkSink, SparkSource, Topology

        class Echo(Computation):
            def process_record(self, record):
                self.produce("out", record.value)

        def parse(row):                       # runs on the executors: shipped by value
            return {{"key": row["key"], "n": row["seq"] * 10}}

        def note_conf(df, batch_id):
            conf = df.sparkSession.conf
            with open({str(seen)!r}, "a") as f:
                f.write(f"{{batch_id}} {{conf.get('spark.millwheel.cli', '-')}} {{conf.get('spark.millwheel.topology', '-')}}\\n")

        topology = Topology("io", spark_conf={{"spark.millwheel.topology": "from-topology", "spark.millwheel.cli": "overridden"}})
        topology.injector("seq", SparkSource(
            lambda spark: spark.readStream.format(FORMAT).option("count", 400).option("rows_per_batch", 200).load(),
            data_sources=[SequenceDataSource], id="seq", timestamp="ts", value=parse, offset_watermark="lw",
        ))
        topology.computation(Echo, inputs={{"seq": lambda r: r.value["key"]}}, outputs=["out"])
        topology.sink("out", spark_sink=SparkSink(format="parquet", options={{"path": {str(out)!r}}}))
        topology.sink("out", name="out.conf", spark_sink=SparkSink(foreach_batch=note_conf))
    """)
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "millwheel.cli",
        "run",
        "io_topology.py",
        "--checkpoint",
        "run",
        "--intervals",
        "2",
        "--quiet",
        "--no-metrics",
        "--master",
        "local[2]",
        "--conf",
        "spark.millwheel.cli=from-command-line",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sink out: 400 records; written through Spark (format 'parquet')" in proc.stdout
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 400 and len({r["id"] for r in rows}) == 400
    assert sorted(json.loads(r["value"])["n"] for r in rows) == [i * 10 for i in range(400)]
    lines = seen.read_text().split()
    assert lines[1:3] == ["from-command-line", "from-topology"]
