"""Declared stream fields (``millwheel/_fields.py``): which values are stored as columns,
the exact round trip, the ``value.<field>`` columns of columnar computations, and the
pinning of declarations in the run directory."""

from __future__ import annotations

import math

import pandas as pd
import pyarrow.parquet as pq
import pytest

from millwheel import ColumnarComputation, Computation, Record, Topology
from millwheel._errors import MillwheelError, TopologyError
from millwheel._fields import StreamFields, field_column, rebuild_values
from millwheel.runtime._fieldcols import pin_fields, with_values
from millwheel.runtime._fs import Location
from millwheel.runtime._keying import Keyer
from millwheel.runtime._streams import FileStreamLog, read_log
from millwheel.testing import Harness

Q = StreamFields.of({"query": str, "ts": int, "ms": float, "ok": bool, "raw": bytes})
GOOD = {"query": "cats", "ts": 5, "ms": 1.5, "ok": True, "raw": b"\x00"}


@pytest.mark.parametrize(
    ("value", "conforms"),
    [
        (GOOD, True),
        (dict.fromkeys(GOOD), True),  # None in any field
        (dict.fromkeys(["query", "ts", "ms", "ok", "other"]), False),  # None in an undeclared field
        ({**GOOD, "ts": True}, False),  # bool is not int
        ({**GOOD, "ok": 1}, False),  # nor int bool
        ({**GOOD, "ts": 2**63}, False),  # beyond int64
        ({**GOOD, "ts": 2**63 - 1}, True),
        ({**GOOD, "ts": -(2**63)}, True),
        ({**GOOD, "ms": 2}, False),  # an int is not a float: it would come back 2.0
        ({**GOOD, "extra": 1}, False),
        ({k: v for k, v in GOOD.items() if k != "raw"}, False),
        (dict(reversed(list(GOOD.items()))), False),  # the declared order
        ({**GOOD, "query": ["nested"]}, False),
        ({**GOOD, "ts": "5"}, False),
        ({**GOOD, "raw": bytearray(b"x")}, False),
        ("cats", False),
        (None, False),
        (pd.Series(GOOD).to_dict() | {}, True),
    ],
)
def test_which_values_conform(value, conforms):
    assert Q.conforms(value) is conforms


def test_a_dict_subclass_is_pickled_and_comes_back_as_itself():
    class D(dict):
        pass

    v = D(GOOD)
    assert not Q.conforms(v)
    arr, enc = Q.split([v])
    back = rebuild_values(enc, arr)[0]
    assert type(back) is D and back == GOOD


def test_the_round_trip_is_exact_through_a_stream_log_file(tmp_path):
    """Every value comes back the same — type, key order, plain Python scalars — whether it
    was stored as columns or pickled; the file really holds the conforming ones as columns."""
    values = [
        GOOD,
        dict.fromkeys(GOOD),
        {**GOOD, "ms": -0.0},
        {**GOOD, "ms": math.inf},
        {**GOOD, "ts": 2**63 - 1},
        {**GOOD, "ts": True},
        {**GOOD, "extra": 1},
        {"query": "x"},
        7,
        None,
        ("a", 1),
        {**GOOD, "query": {"nested": 1}},
    ]
    keyer = Keyer({}, intervals=4, fields={"q": Q})
    log = FileStreamLog(Location.of(str(tmp_path)), keyer)
    log.ensure("q", "inj")
    log.append("q", "inj", "t0", [Record(None, v, i, f"r{i}") for i, v in enumerate(values)])
    back = [r.value for r in log.read("q")]
    assert back == values
    assert [type(v) for v in back] == [type(v) for v in values]
    for v, b in zip(values, back, strict=True):
        if isinstance(v, dict):
            assert list(b) == list(v)
            assert [type(x) for x in b.values()] == [
                type(x) for x in v.values()
            ]  # not numpy scalars
    assert math.copysign(1, back[2]["ms"]) == -1
    (name,) = log.files("q", "inj")
    t = read_log(log.location("q", "inj").child(name))
    stored = [f is not None for f in t.column("fields").to_pylist()]
    assert stored == [True] * 5 + [False] * 7
    assert [v is None for v in t.column("value").to_pylist()] == stored
    assert (
        pq.read_schema(log.location("q", "inj").child(name).path)
        .field("fields")
        .type.field("ts")
        .type
        == "int64"
    )


def test_an_undeclared_stream_is_written_as_before(tmp_path):
    log = FileStreamLog(Location.of(str(tmp_path)), Keyer({}, intervals=4, fields={"other": Q}))
    log.ensure("q", "inj")
    log.append("q", "inj", "t0", [Record(None, GOOD, 1, "a")])
    (name,) = log.files("q", "inj")
    t = read_log(log.location("q", "inj").child(name))
    assert "fields" not in t.column_names and [r.value for r in log.read("q")] == [GOOD]


def test_the_step_puts_values_back_together():
    pdf = pd.DataFrame(
        {"value": [None, b"x", None], "mw_fields_0": [{"a": 1}, None, None], "kind": [0, 0, 0]}
    )
    out = with_values(pdf)
    assert list(out.columns) == ["value", "kind"] and out["value"].tolist() == [
        {"a": 1},
        b"x",
        None,
    ]
    plain = pd.DataFrame({"value": [b"x"]})
    assert with_values(plain) is plain


def test_declarations_are_checked():
    t = Topology("t")
    with pytest.raises(TopologyError, match="field 'n' has type <class 'list'>"):
        t.stream("q", fields={"n": list})
    with pytest.raises(TopologyError, match="non-empty dict"):
        t.stream("q", fields={})
    with pytest.raises(TopologyError, match="field name 'a.b' is not valid"):
        t.stream("q", fields={"a.b": int})
    with pytest.raises(TopologyError, match="cannot declare fields"):
        t.stream("dead_letters", fields={"a": int})
    t.stream("q", fields={"a": int})
    with pytest.raises(TopologyError, match="twice"):
        t.stream("q", fields={"a": int})
    with pytest.raises(TopologyError, match="stream 'q' declares fields, but nothing produces it"):
        t.validate()


def test_a_run_directory_refuses_other_declarations(tmp_path):
    root = Location.of(str(tmp_path))
    pin_fields(root, {"q": StreamFields.of({"query": str, "ms": float})})
    pin_fields(root, {"q": StreamFields.of({"query": str, "ms": float})})  # the same: resumed
    pin_fields(
        root,
        {"q": StreamFields.of({"query": str, "ms": float}), "new": StreamFields.of({"a": int})},
    )  # a new stream declared
    with pytest.raises(
        MillwheelError,
        match=r"stream 'q' was declared with fields \{query: str, ms: float\}; this run declares \{query: str, ms: int\}",
    ):
        pin_fields(
            root,
            {"q": StreamFields.of({"query": str, "ms": int}), "new": StreamFields.of({"a": int})},
        )
    with pytest.raises(
        MillwheelError,
        match=r"stream 'q' was declared .*; this run declares \{ms: float, query: str\}",
    ):
        pin_fields(
            root,
            {"q": StreamFields.of({"ms": float, "query": str}), "new": StreamFields.of({"a": int})},
        )
    with pytest.raises(
        MillwheelError,
        match="stream 'new' was declared with fields \\{a: int\\}; this run does not declare them",
    ):
        pin_fields(root, {"q": StreamFields.of({"query": str, "ms": float})})


class FieldReader(ColumnarComputation):
    record_columns = ("key", "id", "value.ms", "value.query", "value.n")
    seen: list[pd.DataFrame] = []

    def process_batch(self, batch):
        type(self).seen.append(batch.records.copy())


def _frame(fields):
    FieldReader.seen = []
    h = Harness.for_computation(FieldReader, inputs={"q": lambda r: "k"}, fields=fields)
    values = [
        {"query": "a", "ms": 1.5, "n": 3},
        {"query": "b", "ms": 2, "n": None},
        {"query": "c", "ms": "x", "n": True, "extra": 1},
        5,
        {"ms": None},
    ]
    h.inject("q", [h.record(v, i, id=f"r{i}") for i, v in enumerate(values)])
    h.run()
    (frame,) = FieldReader.seen
    return frame


def test_value_field_columns_are_typed_by_the_declaration():
    f = _frame({"q": {"query": str, "ms": float, "n": int}})
    assert list(f.columns) == ["key", "id", "value.ms", "value.query", "value.n"]
    assert f.dtypes.astype(str).tolist()[2:] == ["float64", "object", "Int64"]
    assert f["value.ms"].tolist()[:2] == [1.5, 2.0] and all(
        math.isnan(x) for x in f["value.ms"].tolist()[2:]
    )  # an int is taken into a float field
    assert f["value.query"].tolist() == ["a", "b", "c", None, None]
    assert f["value.n"].tolist() == [3, pd.NA, pd.NA, pd.NA, pd.NA]  # a bool in an int field: null


def test_value_field_columns_of_an_undeclared_stream_hold_the_values_as_they_are():
    f = _frame(None)
    assert f.dtypes.astype(str).tolist()[2:] == ["object", "object", "object"]
    assert f["value.ms"].tolist() == [1.5, 2, "x", None, None] and f["value.n"].tolist() == [
        3,
        None,
        True,
        None,
        None,
    ]


def test_one_function_builds_the_column_for_every_backend():
    """The Spark workers hand it values decoded or rebuilt from the fields, the harness the
    objects themselves: the same list gives the same column."""
    vals = [{"ms": 1.0}, {"ms": None}, None]
    assert field_column(vals, "ms", float).equals(
        field_column(
            rebuild_values([None, None, b"\x80\x04N."], [{"ms": 1.0}, {"ms": None}, None]),
            "ms",
            float,
        )
    )


def test_a_field_declared_with_two_types_is_refused():
    t = Topology("t")
    t.injector("a")
    t.injector("b")
    t.stream("a", fields={"ms": float})
    t.stream("b", fields={"ms": int})
    t.computation(FieldReader, inputs=["a", "b"])
    with pytest.raises(
        TopologyError,
        match=r"field 'ms' is declared with different types on its input streams \(\['float', 'int'\]\)",
    ):
        Harness(t)


class Echo(Computation):
    def process_record(self, record):
        self.produce("out", record.value)


def test_a_per_record_computation_sees_the_same_values_on_a_declared_stream():
    values = [GOOD, {**GOOD, "ts": True}, "x"]
    got = []
    for fields in (None, {"q": {k: type(v) for k, v in GOOD.items()}}):
        h = Harness.for_computation(
            Echo, inputs={"q": lambda r: "k"}, outputs=["out"], fields=fields
        )
        h.inject("q", [h.record(v, i, id=f"r{i}") for i, v in enumerate(values)])
        h.run()
        got.append(h.values("out"))
    assert got[0] == got[1] == values


def test_the_arrow_mapping_frame_keeps_int_fields_exact():
    """pyarrow's own pandas conversion of a struct turns an int child with nulls into floats
    (2**62 + 1 would lose its last bit): the Arrow mapping's tasks read the carried fields as Python values."""
    import pyarrow as pa

    from millwheel.runtime._fieldcols import table_frame

    t = pa.table(
        {
            "value": pa.array([None, b"x", None], pa.binary()),
            "mw_fields_0": pa.array(
                [{"n": 2**62 + 1}, None, {"n": None}], pa.struct([("n", pa.int64())])
            ),
        }
    )
    assert type(t.to_pandas()["mw_fields_0"][0]["n"]) is float  # what it guards against
    got = with_values(table_frame(t))["value"].tolist()
    assert got == [{"n": 2**62 + 1}, b"x", {"n": None}] and type(got[0]["n"]) is int


def test_a_query_carries_only_the_fields_its_computation_reads():
    from computations.columnar_windowing import ColumnarWindowAggregate
    from millwheel import ComputationOptions, LatePolicy
    from millwheel.runtime._fieldcols import needed_fields

    t = Topology("t")
    t.injector("q")
    t.stream("q", fields={"query": str, "ms": float, "n": int})
    t.injector("u")
    specs = [
        t.computation(Echo, inputs=["q"], outputs=["out"]),
        t.computation(FieldReader, inputs=["q"]),
        t.computation(
            ColumnarWindowAggregate,
            inputs=["q"],
            name="Sum",
            params={"aggregate": "sum", "field": "ms"},
        ),
        t.computation(ColumnarWindowAggregate, inputs=["q", "u"], name="Count"),
        t.computation(
            ColumnarWindowAggregate,
            inputs=["q"],
            name="Late",
            params={"aggregate": "sum", "field": "ms"},
            options=ComputationOptions(late=LatePolicy.to_stream("late")),
        ),
    ]
    keyer = Keyer.of(t, 4)
    assert [needed_fields(s, keyer, "q") for s in specs] == [
        ("query", "ms", "n"),
        ("query", "ms", "n"),
        ("ms",),
        (),
        ("query", "ms", "n"),
    ]
    assert needed_fields(specs[3], keyer, "u") == ()


def test_a_reader_that_leaves_the_fields_out_is_told_so():
    with pytest.raises(ValueError, match="stored as columns, read its 'fields' column too"):
        rebuild_values([None], None)


@pytest.mark.parametrize("typ", [int, float])
def test_a_value_not_of_its_declared_type_is_dead_lettered_saying_so(typ):
    """The typed ``value.ms`` column holds null for a string in an int (or float) field: the
    dead letter keeps the whole value and says the field is missing or not of its type,
    not "got None"."""
    from computations.columnar_windowing import ColumnarWindowAggregate

    h = Harness.for_computation(
        ColumnarWindowAggregate,
        inputs={"clicks": lambda r: r.value["page"]},
        outputs=["window_aggregates"],
        fields={"clicks": {"page": str, "ms": typ}},
        params={"aggregate": "sum", "field": "ms", "window_ms": 1000},
        raise_errors=False,
    )
    h.inject(
        "clicks",
        [h.record({"page": "a", "ms": "12"}, 200), h.record({"page": "b", "ms": typ(4)}, 300)],
    )
    h.advance_watermark("clicks", 5000)
    h.run()
    assert [(v["key"], v["sum"]) for v in h.values("window_aggregates")] == [("b", 4.0)]
    (dead,) = h.dead_letters()
    assert dead.value.record.value == {"page": "a", "ms": "12"}
    assert (
        "not of the type its stream declares" in dead.value.reason
        and "NoneType" not in dead.value.reason
    )
