"""servicekit.checks: bounded JSON, bounded numbers, messages that never echo much."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servicekit import (
    INT64_MAX,
    INT64_MIN,
    BadRequestError,
    check_fields,
    check_int,
    check_number,
    describe,
    parse_json,
    parse_number,
    truncate,
)


class MyError(Exception):
    """A service's own error class, passed as ``error=``."""


@pytest.mark.parametrize(
    "value",
    [
        "x" * 10_000_000,
        b"y" * 5_000_000,
        list(range(1_000_000)),
        {str(k): k for k in range(100_000)},
        {"a": "z" * 100_000},
        ("t" * 1_000,),
    ],
)
def test_describe_is_short_whatever_it_is_given(value):
    text = describe(value)
    assert len(text) <= 120, text[:200]


def test_describe_keeps_small_values_whole_and_says_how_long_big_ones_were():
    assert describe("abc") == "'abc'" and describe(5) == "5" and describe(None) == "None"
    assert "(10000000 characters)" in describe("x" * 10_000_000)
    assert describe(list(range(1_000))) == "<list of 1000 items>"


def test_truncate_says_how_much_it_cut():
    assert truncate("short") == "short"
    cut = truncate("m" * 10_000, 100)
    assert len(cut) <= 100 and cut.endswith("(9940 more characters)")


def test_check_int_takes_int64_and_refuses_the_rest():
    assert (
        check_int("n", INT64_MAX) == INT64_MAX and check_int("n", INT64_MIN) == INT64_MIN
    )  # int64 by default
    for bad in (INT64_MAX + 1, INT64_MIN - 1, 10**30, 1.0, "1", True, None, float("nan")):
        with pytest.raises(
            BadRequestError,
            match=r"n must be an integer in \[-9223372036854775808, 9223372036854775807\], got",
        ):
            check_int("n", bad)
    with pytest.raises(
        MyError, match=r"pending must be an integer in \[0, 10\] \(a count\), got -1"
    ):
        check_int("pending", -1, lo=0, hi=10, hint=" (a count)", error=MyError)


def test_check_number_and_parse_number_refuse_what_is_not_finite():
    assert check_number("x", 3, lo=0, hi=5) == 3.0 and check_number("x", 2.5, lo=0, hi=5) == 2.5
    for bad in (float("nan"), float("inf"), 10**400, True, "3", 6):
        with pytest.raises(BadRequestError, match="finite number"):
            check_number("x", bad, lo=0, hi=5)
    assert parse_number("seconds", "60", lo=0, hi=100) == 60.0
    for bad in ("nan", "NaN", "inf", "-inf", "1e400", "abc", "", "101", "-1"):
        with pytest.raises(
            BadRequestError, match="seconds must be a finite number in \\[0, 100\\]"
        ):
            parse_number("seconds", bad, lo=0, hi=100)


def test_parse_json_refuses_what_is_not_json_or_too_deep():
    assert parse_json(b'{"a": [1, 2.5, null, true, "s"]}') == {"a": [1, 2.5, None, True, "s"]}
    for bad, reason in [
        (b"{not json", "not valid JSON"),
        (b'{"a": NaN}', "NaN is not JSON"),
        (b"[Infinity]", "Infinity is not JSON"),
        (b"[-Infinity]", "-Infinity is not JSON"),
        (b'"\xff\xfe"', "not valid JSON"),
        (b"[" + b"9" * 5_000 + b"]", "not valid JSON"),  # more digits than Python converts
        (
            b"[" * 100_000 + b"]" * 100_000,
            "nested deeper than 32 levels",
        ),  # past the recursion limit
    ]:
        with pytest.raises(BadRequestError, match=reason):
            parse_json(bad)
    parse_json(b"[" * 32 + b"]" * 32)  # exactly the limit
    with pytest.raises(MyError, match="nested deeper than 3 levels"):
        parse_json(b'{"a": [[1]]}'.replace(b"[[1]]", b"[[[1]]]"), max_depth=3, error=MyError)
    assert parse_json(b'{"a": [[1]]}', max_depth=3) == {"a": [[1]]}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


@given(json_values)
def test_parse_json_round_trips_every_json_value_within_the_depth(value):
    assert parse_json(json.dumps(value).encode()) == value


def test_check_fields_names_the_missing_and_the_unexpected():
    fields = {"computation": True, "reports": True, "owner": False}
    assert check_fields({"computation": "c", "reports": []}, fields, where="/v1/report") == {
        "computation": "c",
        "reports": [],
    }
    with pytest.raises(
        BadRequestError,
        match=r"/v1/report: missing field\(s\) \['reports'\] and unexpected field\(s\) \['extra'\]; expected \['computation', 'owner', 'reports'\]",
    ):
        check_fields({"computation": "c", "extra": 1}, fields, where="/v1/report")
    with pytest.raises(BadRequestError, match="must be a JSON object") as err:
        check_fields([1, 2], fields, where="/v1/report")
    many = {
        "computation": "c",
        "reports": [],
        "x" * 1_000_000: 0,
        **{f"k{i}": i for i in range(100_000)},
    }
    with pytest.raises(BadRequestError) as err:
        check_fields(many, fields, where="/v1/report")
    assert (
        "and 99996 more" in str(err.value)
        and "(1000000 characters)" in str(err.value)
        and len(str(err.value)) < 500
    )
