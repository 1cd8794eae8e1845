"""A log line that is valid JSON but not valid Unicode text: ``"\\ud800"`` parses to a str
with a lone surrogate, which pickles but has no UTF-8, Arrow or msgpack form.

Such a key is refused like any other invalid key (a dead letter of the key extractor);
such a value of a declared stream is stored pickled, not as columns; every other record
of the batch goes through, the same on the harness, on Spark and in a plain answer.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from millwheel import Computation, LogFileSource, Record, Topology
from millwheel._fields import StreamFields, rebuild_values
from millwheel._record import key_problem
from millwheel.runtime._logfiles import declared_columns
from millwheel.testing import Harness

T = 1_767_225_600_000  # 2026-01-01
LINES = [  # the JSON text of each line, as a log writer escapes it
    '{"query": "cats", "ts": T1, "note": "ok"}',
    '{"query": "a\\ud800b", "ts": T2, "note": "bad key"}',
    '{"query": "dogs", "ts": T3, "note": "x\\udfffy"}',
    '{"query": "caf\\u00e9", "ts": T4, "note": "\\u00e9t\\u00e9"}',
    '{"query": "cats", "ts": T5, "note": "ok2"}',
]
LINES = [line.replace(f"T{i}", str(T + 1_000 + 100 * i)) for i, line in enumerate(LINES, 1)]


class Notes(Computation):
    def process_record(self, record: Record) -> None:
        self.state.set(self.state.get(0) + 1)
        self.produce("notes", (self.key, self.state.get(), record.value["note"]))


def _topology(logs) -> Topology:
    t = Topology("surrogates")
    t.injector("queries", LogFileSource(logs, finite=True))
    t.stream("queries", fields={"query": str, "ts": int, "note": str})
    t.computation(Notes, inputs={"queries": lambda r: r.value["query"]}, outputs=["notes"])
    return t


def _answer() -> list[tuple]:
    """The plain answer: each line whose key is valid text, counted per key in file order."""
    counts: dict[str, int] = {}
    out = []
    for line in LINES:
        v = json.loads(line)
        try:
            v["query"].encode("utf-8")
        except UnicodeEncodeError:
            continue
        counts[v["query"]] = counts.get(v["query"], 0) + 1
        out.append((v["query"], counts[v["query"]], v["note"]))
    return sorted(out)


def test_a_key_with_a_lone_surrogate_is_not_a_key():
    assert "lone surrogate" in key_problem("a\ud800b")  # type: ignore[operator]
    assert "lone surrogate" in key_problem(("ok", "\udfff"))  # type: ignore[operator]
    assert key_problem("café") is None and key_problem("cats") is None


def test_a_value_with_a_lone_surrogate_is_stored_pickled_and_comes_back_the_same():
    fields = StreamFields.of({"q": str, "n": int})
    good, bad = {"q": "café", "n": 1}, {"q": "x\udfffy", "n": 2}
    assert fields.conforms(good) and not fields.conforms(bad)
    value, struct = declared_columns(fields, [good, bad])
    assert value.null_count == 1 and struct.is_valid().to_pylist() == [True, False]
    assert rebuild_values(value.to_pylist(), struct) == [good, bad]
    with pytest.raises(UnicodeEncodeError):  # why: Arrow has no form for it
        pa.array(["x\udfffy"], pa.string())


@pytest.mark.spark
def test_lone_surrogates_in_a_log_dead_letter_only_their_record_on_both_backends(tmp_path, spark):
    from millwheel.runtime import RuntimeSettings, SparkRuntime

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "queries-2026-01-01.jsonl").write_text("\n".join(LINES) + "\n")
    h = Harness(_topology(logs), raise_errors=False)  # as `millwheel run --backend harness` runs it
    h.run_sources()
    rt = SparkRuntime(
        _topology(logs),
        str(tmp_path / "run"),
        RuntimeSettings(drain=True, intervals=2),
        spark=spark,
    )
    rt.run(timeout_s=300)
    assert sorted(h.values("notes")) == sorted(rt.values("notes")) == _answer()
    for dead in (h.dead_letters(), rt.dead_letters()):
        (letter,) = dead
        assert letter.value.stage == "key_extractor" and "lone surrogate" in letter.value.reason
        assert letter.value.record.value == json.loads(LINES[1])
