"""Outputs people can read: sink targets, and ``millwheel read``.

A stream log holds pickled values and msgpack keys (``_streams.py``); pandas and Spark SQL
read neither. This module turns records into plain rows — ``id``, ``ts``, ``key``,
``value`` — and writes them where a sink's target says (``Topology.sink(stream, target)``):

=============================================  ==========================================
target                                         written as
=============================================  ==========================================
``"out/anomalies.jsonl"`` or ``"jsonl:DIR"``   a directory of JSON-lines files: ``key`` and
                                               ``value`` as JSON
``"out/anomalies.parquet"`` or ``"parquet:DIR"``  a directory of Parquet files: ``id``
                                               string, ``ts`` int64, ``key`` string (a
                                               ``str`` key as is, any other as JSON),
                                               ``value`` string (JSON)
``"out/anomalies.csv"`` or ``"csv:DIR"``       a directory of CSV files, columns as Parquet
=============================================  ==========================================

``pd.read_json(f, lines=True)`` per file, ``pd.read_parquet(DIR)``,
``spark.read.json(DIR)`` / ``spark.read.parquet(DIR)`` read them. Values become JSON as
plain data: dataclasses (a :class:`~millwheel.DeadLetter` included) as objects, tuples
and sets as lists, bytes as base64 text, NaN and infinities as ``null``; anything else as
its ``repr``.

**Exactly once, from committed batches.** On Spark a :class:`SinkWriter` follows the
sink's stream log, where a file appears only once its batch has committed (the outbox,
``_outbox.py``): each stream-log file becomes one target file of the same name, written
to a hidden temporary name and renamed, so a crash before the rename writes it again
and a file is never written twice. The target directory remembers which run owns it
(``_millwheel.json``): a new run into the same directory replaces the output of an earlier
run of the same run directory (``--fresh``) and refuses one of another run directory.
On the harness backend the target gets the run's whole output at the end.

``millwheel read RUN [STREAM] [--format jsonl|csv|parquet] [--limit N] [--out FILE]``
prints any stream of a run directory — dead letters included — the same way; without a
stream it lists the run's streams.

>>> from millwheel import DeadLetter, Record
>>> row_of(Record(("cats", 3), {"n": float("nan"), "at": {1, 2}}, 1_000, "r1"))
{'id': 'r1', 'ts': 1000, 'key': ['cats', 3], 'value': {'n': None, 'at': [1, 2]}}
>>> row_of(Record(None, DeadLetter("key_extractor", "KeyError: 'q'"), 5, "d1"))["value"]["reason"]
"KeyError: 'q'"
>>> parse_target("out/anomalies.jsonl"), parse_target("parquet:/data/x")
(SinkTarget(format='jsonl', path='out/anomalies.jsonl'), SinkTarget(format='parquet', path='/data/x'))
"""

from __future__ import annotations

import argparse
import base64
import csv
import dataclasses
import io
import json
import math
import os
import sys
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from millwheel._errors import MillwheelError
from millwheel._record import Record
from millwheel._topology import SinkSpec, Topology
from millwheel.runtime._fs import Location
from millwheel.runtime._streams import FileStreamLog, read_log, table_records

FORMATS = ("jsonl", "parquet", "csv")
_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".csv": "csv",
}
OWNER_FILE = "_millwheel.json"
ROW_SCHEMA = pa.schema(
    [("id", pa.string()), ("ts", pa.int64()), ("key", pa.string()), ("value", pa.string())]
)


# ---- rows -----------------------------------------------------------------------------------
def jsonable(v: Any) -> Any:
    """``v`` as plain JSON data (see the module docstring)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {
            k if isinstance(k, str) else json.dumps(jsonable(k)): jsonable(x) for k, x in v.items()
        }
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (set, frozenset)):
        items = [jsonable(x) for x in v]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    item = getattr(v, "item", None)  # numpy scalars
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    return repr(v)


def row_of(record: Record) -> dict[str, Any]:
    """A record as a plain row: ``id``, ``ts``, ``key``, ``value``."""
    return {
        "id": record.id,
        "ts": record.timestamp,
        "key": jsonable(record.key),
        "value": jsonable(record.value),
    }


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row for tables (Parquet, CSV): a ``str`` key as is, other keys and values as JSON text."""
    key = row["key"]
    return {
        "id": row["id"],
        "ts": row["ts"],
        "key": key if isinstance(key, str) or key is None else json.dumps(key, ensure_ascii=False),
        "value": json.dumps(row["value"], ensure_ascii=False),
    }


def encode_rows(rows: list[dict[str, Any]], fmt: str) -> bytes:
    """Rows in one of :data:`FORMATS`, as the bytes of one file."""
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    flat = [_flat(r) for r in rows]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=["id", "ts", "key", "value"], lineterminator="\n")
        w.writeheader()
        w.writerows(flat)
        return buf.getvalue().encode()
    table = pa.Table.from_pylist(flat, schema=ROW_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


# ---- targets --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SinkTarget:
    """Where and how a sink writes: a directory of files of one format."""

    format: str
    path: str


def parse_target(target: Any, where: str = "sink") -> SinkTarget:
    """A sink's ``target`` (a path ending in ``.jsonl``/``.parquet``/``.csv``, or ``FORMAT:PATH``)."""
    text = os.fspath(target) if isinstance(target, (str, os.PathLike)) else None
    if not text:
        msg = (
            f"{where}: target {target!r} is not a path; give a directory path ending in .jsonl, .parquet or .csv, "
            f"or 'FORMAT:PATH' with FORMAT one of {', '.join(FORMATS)}"
        )
        raise MillwheelError(msg)
    head, sep, rest = text.partition(":")
    if sep and head in FORMATS and rest:
        return SinkTarget(head, rest)
    fmt = _SUFFIXES.get(os.path.splitext(text.rstrip("/"))[1].lower())
    if fmt is None:
        msg = (
            f"{where}: cannot tell the format of target {text!r}; end it in .jsonl, .parquet or .csv "
            f"(e.g. 'out/{os.path.basename(text.rstrip('/')) or 'stream'}.jsonl') or write 'jsonl:{text}'"
        )
        raise MillwheelError(msg)
    return SinkTarget(fmt, text)


def sink_targets(topology: Topology) -> dict[str, tuple[SinkSpec, SinkTarget]]:
    """The sinks of ``topology`` that have a target, checked: name -> (spec, target)."""
    return {
        s.name: (s, parse_target(s.target, f"sink {s.name!r} of stream {s.stream!r}"))
        for s in topology.sinks.values()
        if s.target is not None
    }


def _write(loc: Location, data: bytes) -> None:
    parent, name = loc.path.rsplit("/", 1)
    tmp = f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    with loc.fs.open_output_stream(tmp) as f:
        f.write(data)
    loc.fs.move(tmp, loc.path)


class SinkWriter:
    """Follows one sink's stream log and writes each committed file to the target once."""

    def __init__(
        self, spec: SinkSpec, target: SinkTarget, streams: FileStreamLog, run_dir: Location
    ) -> None:
        self.spec = spec
        self.target = target
        self.streams = streams
        self.run_dir = run_dir
        self.loc = Location.of(target.path)
        self.done: set[str] = set()
        self.written = 0

    def start(self) -> None:
        """Claim the target directory for this run (see the module docstring)."""
        self.loc.mkdirs()
        run_id = run_identity(self.run_dir)
        owner_loc = self.loc.child(OWNER_FILE)
        text = owner_loc.read_text()
        owner = json.loads(text) if text else None
        if owner is not None and owner.get("run") != run_id:
            if owner.get("run_dir") != self.run_dir.uri:
                msg = (
                    f"sink {self.spec.name!r}: {self.target.path} holds the output of another run "
                    f"(run directory {owner.get('run_dir')}); delete it or give the sink another target"
                )
                raise MillwheelError(msg)
            for (
                name
            ) in self.loc.list():  # an earlier run of this run directory (--fresh): replace it
                if name != OWNER_FILE:
                    self.loc.child(name).delete()
        if owner is None or owner.get("run") != run_id:
            owner_loc.write_text(
                json.dumps(
                    {
                        "run": run_id,
                        "run_dir": self.run_dir.uri,
                        "stream": self.spec.stream,
                        "format": self.target.format,
                    }
                )
            )
        self.done = {n for n in self.loc.list() if not n.startswith((".", "_"))}

    def poll(self) -> int:
        """Write the stream-log files not written yet; returns how many."""
        n = 0
        ext = f".{self.target.format}"
        for producer in self.streams.producers(self.spec.stream):
            src = self.streams.location(self.spec.stream, producer)
            for name in sorted(self.streams.files(self.spec.stream, producer)):
                out = f"{producer}-{name[: -len('.parquet')]}{ext}"
                if out in self.done:
                    continue
                rows = [row_of(r) for r in table_records(read_log(src.child(name)))]
                _write(self.loc.child(out), encode_rows(rows, self.target.format))
                self.done.add(out)
                self.written += len(rows)
                n += 1
        return n


def run_identity(run_dir: Location) -> str:
    """The id of the run in ``run_dir`` (created with the run directory; ``--fresh`` makes a new one)."""
    loc = run_dir.child("run_id")
    text = loc.read_text()
    if text:
        return text.strip()
    run_dir.mkdirs()
    loc.write_text(uuid.uuid4().hex)
    return (loc.read_text() or "").strip()


def sink_writers(topology: Topology, streams: FileStreamLog, run_dir: Location) -> list[SinkWriter]:
    return [
        SinkWriter(spec, target, streams, run_dir)
        for spec, target in sink_targets(topology).values()
    ]


def write_harness_sinks(topology: Topology, output: Any) -> dict[str, str]:
    """The harness backend: each sink's whole output to its target (replacing what was there).

    Returns, per sink name, where its output went.
    """
    done = {}
    for spec, target in sink_targets(topology).values():
        loc = Location.of(target.path)
        loc.mkdirs()
        for name in loc.list():
            if not name.startswith("."):
                loc.child(name).delete()
        rows = [row_of(r) for r in output(spec.stream)]
        _write(loc.child(f"harness-part-0.{target.format}"), encode_rows(rows, target.format))
        done[spec.name] = f"written to {target.path} ({target.format})"
    for spec in topology.sinks.values():
        if (
            spec.spark is not None
        ):  # a SparkSink: written through Spark, so on the Spark backend only
            done[spec.name] = (
                "a Spark sink: not written by the harness backend (run it with --backend spark)"
            )
    return done


# ---- millwheel read --------------------------------------------------------------------------
def stream_records(
    streams: FileStreamLog, stream: str, limit: int | None = None
) -> Iterator[Record]:
    """The records of ``stream`` by producer and file, at most ``limit``."""
    n = 0
    for producer in streams.producers(stream):
        loc = streams.location(stream, producer)
        for name in sorted(streams.files(stream, producer)):
            for r in table_records(read_log(loc.child(name))):
                if limit is not None and n >= limit:
                    return
                yield r
                n += 1


def stream_counts(streams: FileStreamLog) -> dict[str, int]:
    """Records per stream of a run (from the Parquet footers: nothing decoded)."""
    out: dict[str, int] = {}
    for stream in sorted(n for n in streams.root.list() if not n.startswith((".", "_"))):
        total = 0
        for producer in streams.producers(stream):
            loc = streams.location(stream, producer)
            for name in streams.files(stream, producer):
                with loc.fs.open_input_file(loc.child(name).path) as f:
                    total += pq.ParquetFile(f).metadata.num_rows
        out[stream] = total
    return out


def _write_out(rows: Iterable[dict[str, Any]], fmt: str, out: str | None) -> None:
    """JSON lines and CSV row by row; Parquet as one table."""
    to_stdout = out is None or out == "-"
    if fmt == "parquet" and to_stdout and sys.stdout.isatty():
        msg = "Parquet is binary: pass --out FILE (or redirect the output to a file)"
        raise MillwheelError(msg)
    f = sys.stdout.buffer if to_stdout else open(out, "wb")  # type: ignore[arg-type]  # noqa: SIM115
    try:
        if fmt == "parquet":
            f.write(encode_rows(list(rows), fmt))
            return
        first = True
        for row in rows:
            data = encode_rows([row], fmt)
            if fmt == "csv" and not first:
                data = data.split(b"\n", 1)[1]  # the header once
            f.write(data)
            first = False
        if first and fmt == "csv":
            f.write(encode_rows([], fmt))
    finally:
        f.flush()
        if not to_stdout:
            f.close()


def run_argument(p: argparse.ArgumentParser) -> None:
    """The ``RUN`` argument of ``millwheel read`` and ``millwheel state``."""
    p.add_argument(
        "run",
        help="the run directory (millwheel run --checkpoint DIR; default .millwheel/runs/<topology>)",
    )


def run_directory(run: str, inside: str) -> Location:
    """The run directory ``run``, which must hold ``inside`` (``streams``, ``checkpoints``)."""
    root = Location.of(run)
    if not root.child(inside).exists():
        msg = f"{run} is not a millwheel run directory (no {inside}/ in it); give the --checkpoint of a run, e.g. .millwheel/runs/<topology>"
        raise MillwheelError(msg)
    return root


def read_main(argv: list[str]) -> int:
    """``millwheel read``: print a stream of a run directory as JSON lines, CSV or Parquet."""
    p = argparse.ArgumentParser(
        prog="millwheel read",
        description="print a stream of a run directory as plain rows (id, ts, key, value)",
    )
    run_argument(p)
    p.add_argument(
        "stream",
        nargs="?",
        help="the stream, e.g. anomalies or dead_letters (without it: list the streams)",
    )
    p.add_argument(
        "--format", choices=FORMATS, default="jsonl", help="output format (default jsonl)"
    )
    p.add_argument("--limit", type=int, default=None, help="at most this many records")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    args = p.parse_args(argv)
    try:
        streams = FileStreamLog(run_directory(args.run, "streams"))
        counts = stream_counts(streams)
        if args.stream is None:
            for name, n in counts.items():
                print(f"{name:<24} {n:>12,} records")
            return 0
        if args.stream not in counts:
            msg = f"run {args.run} has no stream {args.stream!r}; its streams: {', '.join(counts) or 'none yet'}"
            raise MillwheelError(msg)
        if args.limit is not None and args.limit < 0:
            msg = f"--limit must be >= 0, got {args.limit}"
            raise MillwheelError(msg)
        _write_out(
            (row_of(r) for r in stream_records(streams, args.stream, args.limit)),
            args.format,
            args.out,
        )
    except MillwheelError as exc:
        print(f"millwheel read: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
