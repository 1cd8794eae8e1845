"""The log-line parser (``millwheel/_logparse.py``): ``parse_chunk``'s one-decode scan gives
every line exactly what :func:`parse_line` gives it — the same records (ids, timestamps,
values with the same key order and the same int/float/bool types) and the same dead
letters (reason, byte offset, line) — whatever bytes the lines hold.
"""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from millwheel._deadletter import malformed_line
from millwheel._logparse import MalformedLine, parse_chunk, parse_line

T = 1_767_261_600_000

#: lines a log may hold: records, near-records, and what json.loads and the scan may treat differently
FRAGMENTS = [
    json.dumps({"id": "a1", "ts": T, "query": "cats"}),
    json.dumps({"ts": T + 1, "id": "a2", "query": "dogs", "n": [1, 2.5, True, None, {"k": "v"}]}),
    json.dumps({"ts": T + 2, "query": "no id"}),
    json.dumps({"id": "", "ts": T}),
    json.dumps({"id": 5, "ts": T}),
    json.dumps({"id": "f", "ts": T + 0.5}),
    json.dumps({"id": "b", "ts": True}),
    json.dumps({"id": "big", "ts": 2**70}),
    json.dumps({"id": "edge", "ts": 2**63 - 1}),
    json.dumps({"id": "neg", "ts": -T}),
    json.dumps({"id": "café ☕", "ts": T, "query": "thé"}, ensure_ascii=False),
    json.dumps({"id": "esc", "ts": T, "query": "\u00e9 \U0001f600 \n \t"}),
    '{"id": "dup", "ts": 1, "ts": 2}',
    '{"id": "nan", "ts": 3, "x": NaN, "y": -Infinity}',
    '{"id": "exp", "ts": 1E3}',
    '{"id": "e", "ts": 4, "f": 1.0, "g": -0.0, "h": 1e400}',
    '{"id": "lone", "ts": 5, "q": "\\ud800"}',
    "  " + json.dumps({"id": "pad", "ts": T}) + " \t\r",
    json.dumps({"id": "cr", "ts": T}).replace(", ", ",\r"),
    "\x0c" + json.dumps({"id": "ff", "ts": T}),
    json.dumps({"id": "x", "ts": T}) + " x",
    json.dumps({"id": "x", "ts": T}) * 2,
    "1, 2",
    "[3",
    "4]",
    "{oops",
    '{"id": "open", "ts": 6, "q": "unterminated',
    '"a string"',
    "null",
    "[" * 3000 + "]" * 3000,
    "",
    "   ",
    "\t\x0b",
]
#: bytes that change how json.loads decodes a line: a BOM, NULs, bytes that are not UTF-8
RAW = [
    b"\xef\xbb\xbf" + FRAGMENTS[0].encode(),
    b"\x00" + FRAGMENTS[0].encode(),
    b'{"id": "n\x00", "ts": 7}',
    b'{"id": "\xff", "ts": 8}',
    b"\xff\xfe{}",
    "é".encode(),
]


def reference(data: bytes, start: int, file: str = "f.jsonl") -> tuple[list[tuple], list[tuple]]:
    """What each line gives on its own: :func:`parse_line`, line by line."""
    records, dead = [], []
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        nl = len(data) if nl < 0 else nl
        line, offset, pos = data[pos:nl], start + pos, nl + 1
        if not line.strip():
            continue
        try:
            rid, ts, value = parse_line(line, "id", "ts", file, offset)
        except MalformedLine as exc:
            dead.append(_dead(malformed_line("inj", "s", file, offset, str(exc), line, 9)))
            continue
        records.append((rid, ts, repr(value), _types(value)))
    return records, dead


def _types(v: object) -> object:
    """The types inside a value (``==`` takes 1, 1.0 and True for one another)."""
    if isinstance(v, dict):
        return [(k, _types(x)) for k, x in v.items()]
    if isinstance(v, list):
        return [_types(x) for x in v]
    return type(v).__name__


def _dead(r: object) -> tuple:
    return (r.id, r.timestamp, r.value)  # type: ignore[attr-defined]


def parsed(data: bytes, start: int) -> tuple[list[tuple], list[tuple]]:
    chunk = parse_chunk(
        data,
        start=start,
        file="f.jsonl",
        file_time=9,
        injector="inj",
        stream="s",
        id_field="id",
        ts_field="ts",
    )
    assert all(r.key is None and r.stream == "s" for r in chunk.records)
    return [(r.id, r.timestamp, repr(r.value), _types(r.value)) for r in chunk.records], [
        _dead(r) for r in chunk.dead_letters
    ]


lines = st.one_of(
    st.sampled_from(FRAGMENTS).map(str.encode),
    st.sampled_from(RAW),
    st.text(max_size=12).map(lambda s: s.encode("utf-8", "surrogatepass")),
)


@given(
    st.lists(lines, max_size=25),
    st.sampled_from([b"\n", b"\r\n"]),
    st.booleans(),
    st.integers(min_value=0, max_value=10**9),
)
@example([f.encode() for f in FRAGMENTS], b"\n", True, 0)
@example([f.encode() for f in FRAGMENTS] + RAW, b"\n", False, 17)
def test_a_chunk_gives_every_line_what_parse_line_gives_it(chunk_lines, end, last_newline, start):
    data = end.join(chunk_lines) + (end if last_newline else b"")
    assert parsed(data, start) == reference(data, start)


def test_offsets_count_bytes_and_the_scan_never_reads_into_the_next_line():
    data = '{"id": "é", "ts": 1}\n{"id": "x",\n"ts": 2}\n{"ts": 3}\n'.encode()
    records, dead = parsed(data, 100)
    # "é" is two bytes: offsets (and the id of a line without one) count bytes, not characters
    no_id = 100 + data.index(b'{"ts": 3}')
    assert [r[0] for r in records] == ["é", f"f.jsonl:{no_id}"]
    # an object left open on its line is broken JSON there, not a record ending on the next
    assert [(d[2].offset, d[2].reason.split(":")[0]) for d in dead] == [
        (100 + data.index(b'{"id": "x"'), "broken JSON"),
        (100 + data.index(b'"ts": 2}'), "broken JSON"),
    ]
