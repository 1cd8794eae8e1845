"""State versions (``millwheel/_versions.py``, ``millwheel/_colversions.py``; docs/concepts.md
"Schema evolution"): typed state declares its version and its upgrades; state an older
version stored is upgraded as it is read, on the per-record and the columnar path; state that
cannot be (a newer version, no upgrade path) is a :class:`StateVersionError` naming the
computation, the key and both versions, which the computation's ``ErrorPolicy`` dead-letters
(the key's state untouched, other keys going on) or raises.

The Spark side (a run directory written by a version-1 topology file, resumed by a version-2
one) is ``tests/runtime/test_state_versions_spark.py``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import msgpack
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from millwheel import (
    DEAD_LETTER_STREAM,
    ColumnarComputation,
    Computation,
    ComputationOptions,
    DataclassCodec,
    DeclarationError,
    ErrorPolicy,
    MsgpackCodec,
    PickleCodec,
    StateCodecError,
    StateVersionError,
    VersionedCodec,
)
from millwheel._colstore import ColumnarStore
from millwheel._versions import stored_version
from millwheel.testing import Harness


# ---- the state types, version by version -------------------------------------------------
@dataclass
class CountV1:
    n: int = 0
    total: int = 0


@dataclass
class CountV2:
    __version__ = 2
    n: int = 0
    cents: int = 0
    last: str = ""

    @staticmethod
    def upgrade_from_1(fields):
        return {"n": fields["n"], "cents": fields["total"] * 100, "last": ""}


@dataclass
class CountV3:
    __version__ = 3
    n: int = 0
    cents: int = 0
    last: str = ""
    mean: float = 0.0

    upgrade_from_1 = staticmethod(CountV2.upgrade_from_1)

    @staticmethod
    def upgrade_from_2(fields):
        return {**fields, "mean": fields["cents"] / max(1, fields["n"])}


@dataclass
class CountV3NoPath:
    """Version 3 that no longer reads version 1."""

    __version__ = 3
    n: int = 0
    cents: int = 0
    last: str = ""
    mean: float = 0.0

    upgrade_from_2 = staticmethod(CountV3.upgrade_from_2)


#: what ``DataclassCodec(CountV1)`` stored for ``CountV1(n=2, total=5)`` before versions existed
#: (a msgpack map of the fields), pinned as bytes: old runs' state must keep reading
TODAYS_BYTES = b"\x82\xa1n\x02\xa5total\x05"


# ---- the codecs ----------------------------------------------------------------------------
def test_version_1_stores_exactly_what_it_stored_before_versions():
    codec = DataclassCodec(CountV1)
    assert codec.version == 1
    assert codec.encode(CountV1(2, 5)) == TODAYS_BYTES
    assert msgpack.unpackb(TODAYS_BYTES) == {"n": 2, "total": 5}
    assert codec.stored_version(TODAYS_BYTES) == stored_version(TODAYS_BYTES) == 1


def test_bytes_written_before_versions_read_as_version_1_and_are_upgraded():
    assert DataclassCodec(CountV2).decode(TODAYS_BYTES) == CountV2(n=2, cents=500, last="")
    assert DataclassCodec(CountV3).decode(TODAYS_BYTES) == CountV3(2, 500, "", 250.0)  # 1->2->3
    v2 = DataclassCodec(CountV2).encode(CountV2(4, 100, "x"))
    assert v2[0] == 0xC1 and DataclassCodec(CountV2).stored_version(v2) == 2
    assert DataclassCodec(CountV3).decode(v2) == CountV3(4, 100, "x", 25.0)  # from 2 only
    # the stored version is in the bytes: the same bytes upgrade the same way (a replay)
    assert DataclassCodec(CountV3).decode(v2) == DataclassCodec(CountV3).decode(v2)


def test_a_newer_version_and_a_missing_upgrade_are_errors_naming_both_versions():
    v3 = DataclassCodec(CountV3).encode(CountV3(1, 2, "z", 2.0))
    with pytest.raises(StateVersionError) as newer:
        DataclassCodec(CountV2).decode(v3)
    assert (newer.value.stored, newer.value.current) == (3, 2)
    assert "version 3 of CountV2 cannot be read by version 2" in str(newer.value)
    assert "newer code" in str(newer.value)
    with pytest.raises(StateVersionError) as missing:
        DataclassCodec(CountV3NoPath).decode(TODAYS_BYTES)
    assert "version 1" in str(missing.value) and "version 3" in str(missing.value)
    assert "upgrade_from_1" in str(missing.value)
    located = missing.value.at("Tally", "cats")
    assert str(located).startswith("computation 'Tally', key 'cats': state written by version 1")
    assert isinstance(located, StateCodecError)
    again = pickle.loads(pickle.dumps(located))
    assert str(again) == str(located) and (again.stored, again.key) == (1, "cats")


def test_an_upgrade_that_raises_or_returns_no_map_is_a_version_error():
    @dataclass
    class Broken:
        __version__ = 2
        n: int = 0

        @staticmethod
        def upgrade_from_1(fields):
            return fields["missing"]

    with pytest.raises(StateVersionError, match=r"upgrade_from_1 raised KeyError") as e:
        DataclassCodec(Broken).decode(TODAYS_BYTES)
    assert isinstance(e.value.__cause__, KeyError)

    @dataclass
    class NoMap:
        __version__ = 2
        n: int = 0

        @staticmethod
        def upgrade_from_1(fields):
            return [fields]

    with pytest.raises(StateVersionError, match=r"must return a dict of fields, got list"):
        DataclassCodec(NoMap).decode(TODAYS_BYTES)


def test_declarations_that_cannot_be_right_are_refused_as_the_codec_is_made():
    @dataclass
    class Stale:
        __version__ = 2
        n: int = 0

        @staticmethod
        def upgrade_from_2(fields):
            return fields

    with pytest.raises(DeclarationError, match=r"upgrade_from_2 is not an upgrade of an older"):
        DataclassCodec(Stale)

    @dataclass
    class Zero:
        __version__ = 0
        n: int = 0

    with pytest.raises(DeclarationError, match=r"a state version is an int from 1"):
        DataclassCodec(Zero)

    @dataclass
    class Field:
        __version__: int = 2

    with pytest.raises(DeclarationError, match=r"not a field"):
        DataclassCodec(Field)
    with pytest.raises(DeclarationError, match=r"upgrade_from_1 is not an upgrade"):

        class Col(ColumnarComputation):
            def upgrade_from_1(self, state):
                return state


def test_a_versioned_codec_wraps_any_codec():
    old = PickleCodec().encode({"seen": {1, 2}})  # stored before the codec was versioned
    codec = VersionedCodec(
        PickleCodec(), version=3, upgrades={1: lambda v: sorted(v["seen"]), 2: tuple}
    )
    assert codec.decode(old) == (1, 2)
    assert codec.stored_version(old) == 1 and codec.stored_version(codec.encode((3,))) == 3
    assert codec.decode(codec.encode((3,))) == (3,)
    assert codec == VersionedCodec(
        codec.inner, version=3, upgrades={1: codec.upgrades[1], 2: tuple}
    )
    with pytest.raises(StateVersionError, match=r"no upgrade from version 1"):
        VersionedCodec(MsgpackCodec(), version=2).decode(MsgpackCodec().encode(1))
    with pytest.raises(DeclarationError):
        VersionedCodec(MsgpackCodec(), version=2, upgrades={2: tuple})

    class Marked:
        name = "marked"

        def encode(self, value):
            return b"\xc1" + value

        def decode(self, data):
            return data

    with pytest.raises(StateCodecError, match=r"0xC1"):
        VersionedCodec(Marked(), version=1).encode(b"x")


@given(
    current=st.integers(1, 6),
    stored=st.integers(1, 8),
    missing=st.sets(st.integers(1, 5), max_size=2),
    value=st.integers(-1000, 1000),
)
def test_any_chain_of_versions_upgrades_step_by_step_or_names_what_is_missing(
    current, stored, missing, value
):
    """A class of version ``current`` whose upgrade from ``n`` appends ``n``: state stored by
    version ``stored`` reads as the upgrades ``stored .. current-1`` applied in turn, or fails
    naming a missing one (the first), or a newer version. Random chains, a fresh seed each run
    (hypothesis prints the failing example)."""
    ns = {
        f"upgrade_from_{n}": staticmethod(
            lambda f, n=n: {**f, "steps": [*f["steps"], n], "v": f["v"]}
        )
        for n in range(1, current)
        if n not in missing
    }
    new = dataclass(
        type(
            "State",
            (),
            {"__version__": current, "__annotations__": {"v": int, "steps": list}, **ns},
        )
    )
    codec = DataclassCodec(new)
    raw = msgpack.packb({"v": value, "steps": []})
    data = raw if stored == 1 else b"\xc1" + stored.to_bytes(2, "big") + raw
    gaps = [n for n in range(stored, current) if n in missing]
    if stored > current:
        with pytest.raises(StateVersionError, match="newer code"):
            codec.decode(data)
    elif gaps:
        with pytest.raises(StateVersionError, match=f"no upgrade from version {gaps[0]} "):
            codec.decode(data)
    else:
        out = codec.decode(data)
        assert (out.v, out.steps) == (value, list(range(stored, current)))
        assert codec.stored_version(codec.encode(out)) == current


# ---- per-record computations on the harness --------------------------------------------------
class Tally(Computation):
    """A running count and total per key; version 1 of the code."""

    options = ComputationOptions(state_codec=DataclassCodec(CountV1))

    def process_record(self, record):
        s = self.state.get() or CountV1()
        s.n, s.total = s.n + 1, s.total + record.value
        self.state.set(s)
        self.produce("totals", (self.key, s.n, s.total))


class TallyV2(Computation):
    """Version 2: the total kept in cents, and the last record's id."""

    options = ComputationOptions(state_codec=DataclassCodec(CountV2))

    def process_record(self, record):
        s = self.state.get() or CountV2()
        s.n, s.cents, s.last = s.n + 1, s.cents + 100 * record.value, record.id
        self.state.set(s)
        self.produce("totals", (self.key, s.n, s.cents // 100))


class TallyNoPath(TallyV2):
    options = ComputationOptions(
        state_codec=DataclassCodec(CountV3NoPath), on_error=ErrorPolicy.DEAD_LETTER
    )

    def process_record(self, record):
        s = self.state.get() or CountV3NoPath()
        s.n, s.cents = s.n + 1, s.cents + 100 * record.value
        self.state.set(s)
        self.produce("totals", (self.key, s.n, s.cents // 100))


LOG = [(k, v) for v in range(1, 9) for k in ("cats", "dogs", ("tuple", 7)) if (v + len(str(k))) % 3]


def batch_answer(log):
    """The running (key, count, total) after every record, computed plainly."""
    seen: dict = {}
    out = []
    for k, v in log:
        n, t = seen.get(k, (0, 0))
        seen[k] = (n + 1, t + v)
        out.append((k, n + 1, t + v))
    return sorted(out, key=repr)


def _feed(h, part, start):
    h.inject(
        "q",
        [
            h.record(v, 1_000 + start + i, key=k, id=f"r{start + i}")
            for i, (k, v) in enumerate(part)
        ],
    )
    h.run()


def test_a_per_record_computation_resumed_by_version_2_upgrades_its_state():
    h = Harness.for_computation(Tally, inputs={"q": lambda r: r.key}, outputs=["totals"])
    half = len(LOG) // 2
    _feed(h, LOG[:half], 0)
    assert isinstance(h.state("Tally", "cats"), CountV1)
    h.restart("Tally", TallyV2)  # the next version of the code, on the same committed state
    upgraded = h.state("Tally", "cats")
    assert isinstance(upgraded, CountV2) and upgraded.last == ""
    assert h.state_version("Tally", "cats") == 1  # upgraded as read, stored as it was
    _feed(h, LOG[half:], half)
    assert sorted(h.values("totals"), key=repr) == batch_answer(LOG)
    assert h.state("Tally", "dogs").last.startswith("r")  # set by version 2 since
    assert {h.state_version("Tally", k) for k, _ in LOG} == {2}  # every key set since
    assert h.state_version("Tally", "mice") is None


def test_state_no_upgrade_reaches_is_dead_lettered_and_left_as_it_was():
    h = Harness.for_computation(
        Tally, inputs={"q": lambda r: r.key}, outputs=["totals"], raise_errors=False
    )
    _feed(h, [("cats", 1), ("cats", 2)], 0)
    before = h._envelope("Tally", "cats").state
    h.restart("Tally", TallyNoPath)
    _feed(h, [("cats", 3), ("mice", 4), ("cats", 5)], 10)
    letters = h.output(DEAD_LETTER_STREAM)
    assert len(letters) == 2 and {d.value.key for d in letters} == {"cats"}
    reason = letters[0].value.reason
    assert "computation 'Tally', key 'cats'" in reason, reason
    assert "version 1 of CountV3NoPath cannot be read by version 3" in reason, reason
    assert h._envelope("Tally", "cats").state == before  # untouched
    assert h.values("totals")[-1:] == [("mice", 1, 4)]  # other keys go on
    with pytest.raises(StateVersionError):
        h.state("Tally", "cats")


def test_under_raise_the_run_stops_with_the_message():
    h = Harness.for_computation(Tally, inputs={"q": lambda r: r.key}, outputs=["totals"])
    _feed(h, [("cats", 1)], 0)
    h.restart(
        "Tally", TallyNoPath, options=ComputationOptions(state_codec=DataclassCodec(CountV3NoPath))
    )
    with pytest.raises(
        StateVersionError, match=r"computation 'Tally', key 'cats': state written by version 1"
    ):
        _feed(h, [("cats", 3)], 10)


# ---- columnar computations on the harness ----------------------------------------------------
def _seen(old, totals):
    return {k: (int(n), int(t)) for k, n, t in zip(old["key"], old["n"], totals, strict=True)}


def _running(batch, seen):
    """The running (key, count, total) of each of the batch's records, from ``seen``."""
    out, keys = [], []
    for k, v in zip(batch.records["key"], batch.records["value"], strict=True):
        n, t = seen.get(k, (0, 0))
        seen[k] = (n + 1, t + int(v))
        out.append((k, n + 1, t + int(v)))
        keys.append(k)
    batch.produce("totals", out, keys=keys, timestamps=list(batch.records["timestamp"]))
    return seen


class ColTally(ColumnarComputation):
    """The per-record Tally, columnar: state columns ``n`` and ``total`` (version 1)."""

    record_columns = ("key", "id", "timestamp", "value")

    def process_batch(self, batch):
        old = batch.state
        seen = _seen(old, old["total"]) if len(old) else {}
        seen = _running(batch, seen)
        rows = {"n": [n for n, _ in seen.values()], "total": [t for _, t in seen.values()]}
        batch.set_state(pd.DataFrame({"key": list(seen), **rows}))


class ColTallyV2(ColumnarComputation):
    """Version 2: ``cents`` for ``total``, and a ``last`` column."""

    record_columns = ("key", "id", "timestamp", "value")
    state_version = 2

    def upgrade_from_1(self, state):
        return state.assign(cents=state["total"] * 100, last="").drop(columns=["total"])

    def process_batch(self, batch):
        old = batch.state
        assert list(old.columns) in (["key"], ["key", "n", "cents", "last"]), list(old.columns)
        seen = _seen(old, old["cents"] // 100) if len(old) else {}
        seen = _running(batch, seen)
        rows = {
            "n": [n for n, _ in seen.values()],
            "cents": [100 * t for _, t in seen.values()],
            "last": ["v2"] * len(seen),
        }
        batch.set_state(pd.DataFrame({"key": list(seen), **rows}))


class ColTallyNoPath(ColTally):
    state_version = 3
    options = ComputationOptions(on_error=ErrorPolicy.DEAD_LETTER)


def test_a_columnar_computation_resumed_by_version_2_upgrades_its_store():
    h = Harness.for_computation(ColTally, inputs={"q": lambda r: r.key}, outputs=["totals"])
    half = len(LOG) // 2
    _feed(h, LOG[:half], 0)
    assert list(h.state("ColTally", "cats").columns) == ["key", "n", "total"]
    h.restart("ColTally", ColTallyV2)
    assert h.state_version("ColTally", "cats") == 1
    _feed(h, LOG[half:], half)
    assert h.state_version("ColTally", "cats") == 2
    assert sorted(h.values("totals"), key=repr) == batch_answer(LOG)
    rows = h.state("ColTally", "cats")
    assert list(rows.columns) == ["key", "n", "cents", "last"] and rows["last"].tolist() == ["v2"]
    st_ = ColumnarStore.decode(h._columnar["ColTally"].store)
    assert st_.state_version == 2


def test_a_columnar_store_no_upgrade_reaches_dead_letters_its_keys_records():
    h = Harness.for_computation(
        ColTally, inputs={"q": lambda r: r.key}, outputs=["totals"], raise_errors=False
    )
    _feed(h, [("cats", 1), ("dogs", 2)], 0)
    before = h._columnar["ColTally"].store
    h.restart("ColTally", ColTallyNoPath)
    _feed(h, [("cats", 3), ("dogs", 5)], 10)
    letters = h.output(DEAD_LETTER_STREAM)
    assert sorted(d.value.key for d in letters) == ["cats", "dogs"]
    reason = letters[0].value.reason
    assert "computation 'ColTally', key" in reason, reason
    assert "version 1 of ColTallyNoPath cannot be read by version 3" in reason, reason
    after = ColumnarStore.decode(h._columnar["ColTally"].store)
    old = ColumnarStore.decode(before)
    assert after.state_version == 1 and after.state.equals(old.state)  # the rows untouched


def test_a_store_written_before_versions_reads_as_version_1():
    st_ = ColumnarStore(meta={b"k": [1, None]})
    wire = msgpack.unpackb(st_.encode(), raw=False)
    assert wire[1] == 4 and wire[-1] is None
    old = msgpack.packb([wire[0], 3, *wire[2:-1]], use_bin_type=True)  # a version-3 store
    assert ColumnarStore.decode(old).state_version == 1
    st_.state_version = 2
    assert ColumnarStore.decode(st_.encode()).state_version == 2


def test_a_rescales_pieces_of_two_versions_are_brought_to_the_codes_before_they_merge():
    """An interval not touched since the code changed still holds version 1 while another
    holds version 2: a rescale that merges pieces of both upgrades each first (``_move.py``),
    and without the upgrade the merge refuses to mix them."""
    import pyarrow as pa

    from millwheel._colrunner import ColumnarRunner
    from millwheel._colversions import upgrade_store
    from millwheel._record import encode_key
    from millwheel.runtime._move import RescaleMismatch, install_stores

    cats, dogs = encode_key("cats"), encode_key("dogs")
    old = ColumnarStore(state=pa.table({"_kb": [cats], "n": [2], "total": [5]}), state_version=1)
    new = ColumnarStore(
        state=pa.table({"_kb": [dogs], "n": [1], "cents": [300], "last": ["v2"]}),
        state_version=2,
    )
    pieces = [old.encode(), new.encode()]
    with pytest.raises(RescaleMismatch, match=r"versions \[1, 2\]"):
        install_stores("ColTally", 0, 1, pieces, None, None)
    runner = ColumnarRunner(ColTallyV2(), name="ColTally", outputs=["totals"])
    st_ = install_stores("ColTally", 0, 1, pieces, None, None, lambda s: upgrade_store(runner, s))
    assert st_.state_version == 2
    assert sorted(st_.state.to_pylist(), key=lambda r: r["n"]) == [
        {"_kb": dogs, "n": 1, "cents": 300, "last": "v2"},
        {"_kb": cats, "n": 2, "cents": 500, "last": ""},
    ]
