"""The ``python`` examples of docs/deployment.md's "Sources and sinks" run (stale examples are bugs).

They declare Kafka, table and database sources and sinks (no broker or database is
reached: a declaration does not connect) and run one topology on the harness; then the
declarations are checked for what the text says they do.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Sources and sinks\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_examples_run_and_do_what_the_text_says():
    blocks = re.findall(r"```python\n(.*?)```", _section(), re.S)
    assert len(blocks) >= 6, "the section lost its examples"
    ns: dict = {}
    exec(compile("\n".join(blocks), f"{DOC}#sources-and-sinks", "exec"), ns)  # noqa: S102
    topology = ns["topology"].validate()
    assert topology.spark_conf == {
        "spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0"
    }
    assert {s.name: (s.spark.format or "foreach_batch") for s in topology.sinks.values()} == {
        "clicks.kafka": "kafka",
        "clicks.parquet": "parquet",
        "clicks.db": "foreach_batch",
    }
    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rec, problem = ns["clicks"].record_of(
        {
            "topic": "clicks",
            "partition": 3,
            "offset": 42,
            "timestamp": at,
            "value": b'{"q": "cats"}',
        },
        (),
    )
    assert problem is None and (rec.id, rec.timestamp, rec.value) == (
        "clicks/3/42",
        1_767_225_600_000,
        {"q": "cats"},
    )
    _, problem = ns["clicks"].record_of(
        {"topic": "clicks", "partition": 3, "offset": 43, "timestamp": at, "value": b"{oops"}, ()
    )
    assert problem.startswith(
        "value function <lambda> raised json.decoder.JSONDecodeError: Expecting property name"
    )
    assert ns["table_events"].value == ("user", "url") and ns["sequence"].offset_watermark == "lw"


def test_the_kafka_message_quoted_is_the_one_raised():
    from millwheel.runtime._sparksource import missing_connector

    quoted = re.search(
        r"\(`(injector 'clicks': Spark has no 'kafka'.*?) \.\.\.`\)", _section(), re.S
    ).group(1)
    err = missing_connector(
        Exception("[DATA_SOURCE_NOT_FOUND] Failed to find the data source: kafka."),
        "4.3.0",
        "injector 'clicks'",
    )
    assert str(err).startswith(" ".join(quoted.split()))
