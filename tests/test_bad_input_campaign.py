"""The bad-input campaign (docs/concepts.md, "Bad input"): a table of the bad input real
logs carry, at the edges of bytes, time and ids, each class on both backends.

A user's path: their own topology file with its computations, over log files named like
``queries-2026-01-01.jsonl``, one file per class whose records are keyed by the class's
name, between good records of the same key. Each class is either read exactly or
dead-lettered with its reason, and every other key stays exact: the output is compared,
key by key, with a plain batch answer made from the table.

* the harness: ``millwheel run --backend harness`` on the user's file (the finished
  classes), and the tailed classes read live through the shared reading plan;
* Spark: one live run of the same file holding every class (the finished ones in one
  directory, the tailed ones appended while it runs), then the directories completed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from millwheel import MAX_TIMESTAMP, Stage
from millwheel._record import timestamp_text

T = 1_767_261_600_000  # 2026-01-01T10:00:00Z; the files are named 2026-01-01 (midnight)
MILLWHEEL = str(Path(sys.executable).with_name("millwheel"))
MALFORMED, IMPLAUSIBLE = Stage.MALFORMED, Stage.IMPLAUSIBLE_TIMESTAMP

USER_TOPOLOGY = '''
"""My query logs: what each key saw, and what could not be read."""
import json
import os

from millwheel import Computation, LogFileSource, Topology


class PerKey(Computation):
    def process_record(self, record):
        self.state.set((self.state.get(0) or 0) + 1)
        v = record.value
        self.produce("seen", {"key": self.key, "id": record.id, "ts": record.timestamp, "v": v.get("v"), "size": len(json.dumps(v))})


class Unreadable(Computation):
    def process_record(self, record):
        d = record.value
        ts = None if d.record is None else d.record.timestamp
        self.produce("bad", {"stage": d.stage, "reason": d.reason, "file": d.file, "offset": d.offset, "ts": ts})


topology = Topology("my_queries")
topology.injector("queries", LogFileSource(os.environ["QUERY_LOGS"]))
topology.injector("live", LogFileSource(os.environ["LIVE_LOGS"]), stream="queries_live")
by_key = lambda r: r.value["key"]
topology.computation(PerKey, inputs={"queries": by_key, "queries_live": by_key}, outputs=["seen"])
topology.computation(Unreadable, inputs={"dead_letters": lambda r: r.value.file or "-"}, outputs=["bad"])


def on_finish(topology, streams, metrics):
    with open(os.environ["RESULTS"], "w") as f:
        json.dump({"seen": streams["seen"], "bad": streams["bad"], "metrics": metrics}, f)
    return "results written"
'''


def line(cls: str, i: int, **fields) -> bytes:
    """A good line of class ``cls`` (id ``cls-i``, key ``cls``), with ``fields`` changed (``...``: removed)."""
    value = {"id": f"{cls}-{i}", "ts": T + i * 1_000, "key": cls, "v": i} | fields
    return json.dumps({k: v for k, v in value.items() if v is not ...}).encode() + b"\n"


@dataclass(frozen=True)
class BadInput:
    """One class: the bytes of its file, the ids read (in file order, after dedup) and the
    dead letters ``(stage, part of the reason)``, in file order."""

    name: str
    data: bytes
    read: tuple[str, ...]
    dead: tuple[tuple[str, str], ...] = ()

    @property
    def file(self) -> str:
        return f"{self.name}-queries-2026-01-01.jsonl"


def _around(
    cls: str, middle: bytes, *dead: tuple[str, str], read: tuple[str, ...] = ()
) -> BadInput:
    """Class ``cls``: ``middle`` between two good lines."""
    return BadInput(
        cls, line(cls, 0) + middle + line(cls, 9), (f"{cls}-0", *read, f"{cls}-9"), dead
    )


def _table() -> list[BadInput]:
    big = "x" * (10 << 20)
    deep = "[" * 100_000 + "]" * 100_000
    return [
        # ---- bytes
        BadInput(
            "no-final-newline",
            line("no-final-newline", 0) + line("no-final-newline", 1)[:-1],
            ("no-final-newline-0", "no-final-newline-1"),
        ),
        BadInput(
            "crlf",
            line("crlf", 0)[:-1] + b"\r\n" + line("crlf", 1)[:-1] + b"\r\n",
            ("crlf-0", "crlf-1"),
        ),
        BadInput("bom", b"\xef\xbb\xbf" + line("bom", 0) + line("bom", 1), ("bom-0", "bom-1")),
        _around(
            "nul-bytes",
            b"\x00" * 64 + b"\n" + line("nul-bytes", 1, id="nul\x00").replace(b"\\u0000", b"\x00"),
            (MALFORMED, "broken JSON"),
            (MALFORMED, "Invalid control character"),
        ),
        _around(
            "invalid-utf8",
            line("invalid-utf8", 1).replace(b"invalid-utf8-1", b"bad-\xff\xfe"),
            (MALFORMED, "codec can't decode"),
        ),
        _around("ten-mb-line", line("ten-mb-line", 1, blob=big), read=("ten-mb-line-1",)),
        BadInput("empty-file", b"", ()),
        BadInput(
            "only-malformed",
            b'{"id": "x", "ts": \n[1, 2]\n"text"\n',
            (),
            (
                (MALFORMED, "broken JSON"),
                (MALFORMED, "not a JSON object: list"),
                (MALFORMED, "not a JSON object: str"),
            ),
        ),
        BadInput(
            "half-line",
            line("half-line", 0) + line("half-line", 1)[:25],
            ("half-line-0",),
            ((MALFORMED, "broken JSON"),),
        ),
        _around("blank-lines", b"\n   \n\t\r\n"),
        _around(
            "deep-nesting",
            line("deep-nesting", 1, v=...)[:-2] + f', "v": {deep}}}\n'.encode(),
            (MALFORMED, "recursion"),
        ),
        # ---- time
        _around(
            "seconds", line("seconds", 1, ts=T // 1000), (IMPLAUSIBLE, f"'ts' is {T // 1000} ")
        ),
        _around(
            "microseconds",
            line("microseconds", 1, ts=T * 1000),
            (IMPLAUSIBLE, f"'ts' is {T * 1000} "),
        ),
        _around(
            "nanoseconds",
            line("nanoseconds", 1, ts=T * 10**6),
            (IMPLAUSIBLE, f"'ts' is {T * 10**6} "),
        ),
        _around("negative", line("negative", 1, ts=-1), (IMPLAUSIBLE, "'ts' is -1 ")),
        _around(
            "int64-min",
            line("int64-min", 1, ts=-(2**63)) + line("int64-min", 2, ts=-(2**63) + 1),
            (MALFORMED, "64-bit"),
            (IMPLAUSIBLE, f"'ts' is {-(2**63) + 1} "),
        ),
        _around(
            "int64-max",
            line("int64-max", 1, ts=2**63 - 1)
            + line("int64-max", 2, ts=2**63 - 2)
            + line("int64-max", 3, ts=2**64),
            (MALFORMED, "64-bit"),
            (IMPLAUSIBLE, f"'ts' is {2**63 - 2} "),
            (MALFORMED, "64-bit"),
        ),
        _around(
            "float-ts",
            line("float-ts", 1, ts=T + 0.5) + line("float-ts", 2, ts=float(T)),
            (MALFORMED, "not an integer"),
            (MALFORMED, "not an integer"),
        ),
        _around(
            "string-ts",
            line("string-ts", 1, ts=str(T)) + line("string-ts", 2, ts="2026-01-01T10:00:00Z"),
            (MALFORMED, "not an integer"),
            (MALFORMED, "not an integer"),
        ),
        _around(
            "missing-ts",
            line("missing-ts", 1, ts=...) + line("missing-ts", 2, ts=None),
            (MALFORMED, "missing timestamp"),
            (MALFORMED, "missing timestamp"),
        ),
        _around("bool-ts", line("bool-ts", 1, ts=True), (MALFORMED, "not an integer")),
        # ---- ids
        _around(
            "missing-id",
            line("missing-id", 1, id=...),
            read=("missing-id-queries-2026-01-01.jsonl:{offset}",),
        ),
        _around("empty-id", line("empty-id", 1, id=""), (MALFORMED, "non-empty string, got str")),
        _around(
            "non-string-id",
            line("non-string-id", 1, id=7)
            + line("non-string-id", 2, id=[1])
            + line("non-string-id", 3, id={"a": 1}),
            (MALFORMED, "got int"),
            (MALFORMED, "got list"),
            (MALFORMED, "got dict"),
        ),
        _around(
            "same-id-other-payload",
            line("same-id-other-payload", 1) + line("same-id-other-payload", 1, v=99),
            read=("same-id-other-payload-1",),
        ),
        _around(
            "lone-surrogate-id",
            line("lone-surrogate-id", 1).replace(b"lone-surrogate-id-1", b"a\\ud800b"),
            (MALFORMED, "lone surrogate"),
        ),
    ]


TABLE = _table()
#: classes read while their file is tailed (the Spark run's "live" injector)
TAILED = ("truncated-mid-line", "far-future-at-the-read-position")


def _expected_ids(c: BadInput) -> list[str]:
    """The ids class ``c`` reads: the table's, a positional id at its line's offset."""
    out = []
    for rid in c.read:
        if "{offset}" in rid:
            offset = c.data.index(b'{"ts"')  # the line without an id
            rid = rid.format(offset=offset)
        out.append(rid)
    return out


def _tailed_steps(logs: Path) -> list:
    """The writes of the tailed classes, one step each; the reader catches up after each.

    * ``truncated-mid-line``: a line cut in the middle, completed a step later;
    * ``far-future-at-the-read-position``: 200 records, then one in microseconds at the read
      position, then 200 more (the watermark once jumped to the year 57971 and the rest
      were dropped as late).
    """
    trunc, future = (
        logs / "truncated-mid-line-queries-2026-01-01.jsonl",
        logs / "far-future-at-the-read-position-queries-2026-01-01.jsonl",
    )
    cut = line("truncated-mid-line", 1)
    us = line("far-future-at-the-read-position", 200, ts=(T + 200_000) * 1000)

    def append(path, data):
        with open(path, "ab") as f:
            f.write(data)

    def first():
        append(trunc, line("truncated-mid-line", 0) + cut[:17])
        append(future, b"".join(line("far-future-at-the-read-position", i) for i in range(200)))

    def second():  # the tailed file is now the only one unfinished: it alone holds the watermark
        append(trunc, cut[17:] + line("truncated-mid-line", 2))
        Path(f"{trunc}.done").write_text("")
        append(future, us)

    def third():
        append(
            future, b"".join(line("far-future-at-the-read-position", i) for i in range(201, 401))
        )

    def done():
        (logs / "_DONE").write_text("")

    return [first, second, third, done]


def _tailed_expected() -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    return {
        "truncated-mid-line": ([f"truncated-mid-line-{i}" for i in range(3)], []),
        "far-future-at-the-read-position": (
            [f"far-future-at-the-read-position-{i}" for i in range(401) if i != 200],
            [(IMPLAUSIBLE, f"'ts' is {(T + 200_000) * 1000} ")],
        ),
    }


def test_the_table_covers_at_least_25_classes():
    names = [c.name for c in TABLE] + list(TAILED)
    assert len(set(names)) == len(names) >= 25


def _batch_answer(classes: dict[str, tuple[list[str], list[tuple[str, str]]]]) -> Counter:
    """The plain answer: each key's ids, each once."""
    return Counter((name, rid) for name, (ids, _) in classes.items() for rid in ids)


def _check(
    seen: list[dict],
    bad: list[dict],
    classes: dict[str, tuple[list[str], list[tuple[str, str]]]],
    backend: str,
) -> None:
    """Every class read exactly or dead-lettered with its reason; every key exact."""
    got = Counter((v["key"], v["id"]) for v in seen)
    assert got == _batch_answer(classes), backend  # every key at once: nothing lost, nothing twice
    for name, (ids, dead) in classes.items():
        assert sorted(rid for key, rid in got if key == name) == sorted(ids), (backend, name)
        letters = sorted(
            (b for b in bad if b["file"].startswith(f"{name}-queries")), key=lambda b: b["offset"]
        )
        assert [b["stage"] for b in letters] == [stage for stage, _ in dead], (
            backend,
            name,
            letters,
        )
        for b, (_, part) in zip(letters, dead, strict=True):
            assert part in b["reason"], (backend, name, b["reason"])
            if b["stage"] == IMPLAUSIBLE:
                assert str(b["ts"]) in b["reason"]  # the value is in the letter, and the record
    if "same-id-other-payload" in classes:
        same = [v for v in seen if v["id"] == "same-id-other-payload-1"]
        assert [v["v"] for v in same] == [
            1
        ]  # the first delivery of an id wins, the other is a duplicate
    if "ten-mb-line" in classes:
        (big,) = [v for v in seen if v["id"] == "ten-mb-line-1"]
        assert big["size"] > 10 << 20


@pytest.fixture
def user_path(tmp_path):
    """The user's topology file and directories: ``(topology file, env, finished logs, live logs)``."""
    topo = tmp_path / "my_queries.py"
    topo.write_text(textwrap.dedent(USER_TOPOLOGY))
    finished, live = tmp_path / "logs", tmp_path / "live"
    finished.mkdir()
    live.mkdir()
    for c in TABLE:
        (finished / c.file).write_bytes(c.data)
    (finished / "_DONE").write_text("")
    env = {
        **os.environ,
        "QUERY_LOGS": str(finished),
        "LIVE_LOGS": str(live),
        "RESULTS": str(tmp_path / "results.json"),
    }
    return topo, env, finished, live


def test_the_campaign_on_the_harness(user_path, tmp_path, tailed_logs, monkeypatch):
    from millwheel._runner import load_topology_module
    from millwheel.testing import Harness

    topo, env, _, live = user_path
    (live / "_DONE").write_text("")  # the tailed classes are read below
    done = subprocess.run(
        [MILLWHEEL, "run", str(topo), "--backend", "harness"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dead letters:" in done.stdout  # the summary names what was not read
    results = json.loads(Path(env["RESULTS"]).read_text())
    classes = {c.name: (_expected_ids(c), list(c.dead)) for c in TABLE}
    _check(results["seen"], results["bad"], classes, "harness")
    assert (
        results["metrics"]["PerKey"]["late"] == 0
        and results["metrics"]["PerKey"]["duplicates"] == 1
    )

    # the tailed classes: the same file, read live through the shared plan
    (live / "_DONE").unlink()
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "_DONE").write_text("")
    for name, value in {
        "QUERY_LOGS": str(nothing),
        "LIVE_LOGS": str(live),
        "RESULTS": env["RESULTS"],
    }.items():
        monkeypatch.setenv(name, value)
    t, _ = load_topology_module(str(topo))
    source = tailed_logs(t.injectors["live"].source, _tailed_steps(live))
    t.injectors["live"] = replace(t.injectors["live"], source=source)
    with Harness(t, raise_errors=False) as h:
        h.run_sources()
        _check(h.values("seen"), h.values("bad"), _tailed_expected(), "harness, tailed")
        assert h.metrics("PerKey")["late"] == 0
    after_us = source.offsets[1]["lw"]
    assert after_us < T + 1_000_000, timestamp_text(
        after_us
    )  # the record in microseconds moved no time
    assert source.offsets[-1]["lw"] == MAX_TIMESTAMP


def _caught_up(rt, injector: str, path: Path) -> bool:
    """The injector's published offset has read every complete line of ``path``."""
    offset = rt.injectors[injector].offset
    data = path.read_bytes()
    pos = (offset or {}).get("files", {}).get(path.name, {}).get("pos", -1)
    return pos == data.rfind(b"\n") + 1


def test_the_campaign_on_spark(user_path, spark, tmp_path, monkeypatch):
    """One live Spark run for every class (docs/concepts.md, "Bad input")."""
    from millwheel._runner import load_topology_module
    from millwheel.runtime import RuntimeSettings, SparkRuntime
    from millwheel.runtime._status import Sampler, compact_line, table_lines

    topo, env, _, live = user_path
    steps = _tailed_steps(live)
    for name in ("QUERY_LOGS", "LIVE_LOGS", "RESULTS"):
        monkeypatch.setenv(name, env[name])
    t, _ = load_topology_module(str(topo))
    rt = SparkRuntime(
        t, str(tmp_path / "run"), RuntimeSettings(intervals=2, poll_ms=50), spark=spark
    )
    rt.start()
    try:
        watched = [
            live / "truncated-mid-line-queries-2026-01-01.jsonl",
            live / "far-future-at-the-read-position-queries-2026-01-01.jsonl",
        ]
        for step in steps[:-1]:
            step()
            until = (
                time.monotonic() + 300
            )  # a bound, not a wait: seconds unless the machine is overloaded
            while not all(p.exists() and _caught_up(rt, "live", p) for p in watched):
                assert time.monotonic() < until, "the live injector did not catch up"
                rt.poll()
                time.sleep(0.05)
            lw = rt.injectors["live"].low_watermark
            assert lw < T + 1_000_000, timestamp_text(
                lw
            )  # the record in microseconds moved no time
            snapshot = Sampler(rt).sample()  # the status the driver once died formatting
            assert table_lines(snapshot) and compact_line(snapshot)
        steps[-1]()
        rt.run(timeout_s=300)  # until drained
    finally:
        rt.stop()
    classes = {c.name: (_expected_ids(c), list(c.dead)) for c in TABLE} | _tailed_expected()
    _check(rt.values("seen"), rt.values("bad"), classes, "spark")
    metrics = rt.computations["PerKey"].metrics
    assert metrics["late"] == 0 and metrics["duplicates"] == 1
