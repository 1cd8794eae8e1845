"""A computation's initial state: ``Topology.computation(..., initial_state=SOURCE)`` (docs/concepts.md, "Bootstrap").

A new computation over a stream that has run for a long time starts from a table of
per-key state (yesterday's aggregates, another run's state) instead of a replay of the
whole log, as Spark's ``initialState`` DataFrame or Flink's bootstrapped savepoints do.
``SOURCE`` is one of:

* an iterable (or a dict ``{key: state}``) of ``(key, state)`` or ``(key, state, timers)``;
* a pandas DataFrame with a ``key`` column;
* a path (``str`` or ``os.PathLike``) to a Parquet file, a JSON-lines file (``.jsonl``,
  ``.ndjson``), a ``.json`` file as ``millwheel state RUN C --json`` prints it, or a
  directory of such files (Spark's output directories: names starting with ``_`` or
  ``.`` are skipped);
* a Spark DataFrame (duck-typed: it has ``sparkSession`` and ``toPandas``; read on the
  Spark side, ``millwheel/runtime/_state_write.py``, or by the harness through ``toPandas``).

A **per-record** computation's state of a key is one value, encoded with the
computation's own ``state_codec`` as the key's first step would encode it. In a frame
(DataFrame, Parquet) it is the ``state`` column, or without one, the row's other columns
as a dict; a JSON line is ``{"key": ..., "state": ..., "timers": ...}`` (the objects of
``millwheel state --json``; a JSON list as key is a tuple key). A key may appear once.

A **columnar** computation's state of a key is its rows: in a frame, every row of the key
(the ``key`` column plus the state columns); in an iterable, ``(key, rows)`` with rows a
DataFrame, a list of dicts or one dict; a JSON line is either a flat row
``{"key": ..., "col": ...}`` or ``{"key": ..., "state": row-or-rows, "timers": ...}``.

``timers`` is ``{tag: timestamp}`` (a low-watermark timer), ``{tag: (timestamp, TimeDomain)}``,
``{tag: {"ts": ..., "domain": "low_watermark" | "wall_time"}}`` (as ``millwheel state
--json`` prints them) or a list of :class:`~millwheel.Timer`. A low-watermark timer holds
the computation's low watermark until it fires (§4.6), as one its code had set.

What is checked when the topology is built (:class:`InitialState`): the form of the
source, its ``key`` column (a path: the files exist and a Parquet footer has it), every
item of an iterable (which is read once, then kept). What only a load finds (a file's
rows, a state the codec refuses) is a :class:`~millwheel.TopologyError` naming the
computation and the key then. Nothing here imports pandas or pyarrow before a source is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from millwheel._envelope import Envelope
from millwheel._errors import TopologyError
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Key, TimeDomain, Timer, key_problem

__all__ = [
    "ColumnarSeeds",
    "InitialState",
    "Seed",
    "columnar_store",
    "envelope_bytes",
    "normalize_timers",
    "seed_envelope",
]

#: tag -> (timestamp, domain as int), the envelope's own form of a key's timers
Timers = dict[str, tuple[int, int]]

_PARQUET = (".parquet", ".pq")
_JSONL = (".jsonl", ".ndjson")
_JSON = (".json",)
#: fields of ``millwheel state --json``'s key objects that a load ignores (they are the run's, not the state's)
_READER_FIELDS = {"dedup_ids", "hold", "pending_productions", "state_bytes", "undecodable"}
_DOMAINS = {"low_watermark": 0, "wall_time": 1, "lw": 0, "wall": 1}


@dataclass(frozen=True, slots=True)
class Seed:
    """One key of a per-record computation's initial state."""

    key: Key
    state: Any
    #: tag -> (timestamp, domain)
    timers: Timers = field(default_factory=dict)


@dataclass
class ColumnarSeeds:
    """A columnar computation's initial state: its rows with the encoded key (``_kb``, first
    column; ``None``: no rows), and its timers as ``(encoded key, tag, timestamp, domain)``."""

    rows: Any = None
    timers: list[tuple[bytes, str, int, int]] = field(default_factory=list)

    def keys(self) -> set[bytes]:
        kbs = {t[0] for t in self.timers}
        if self.rows is not None:
            kbs |= set(self.rows.column("_kb").to_pylist())
        return kbs


def _fail(computation: str, what: str) -> TopologyError:
    return TopologyError(f"computation {computation!r}: initial_state {what}")


def is_spark_frame(source: Any) -> bool:
    """A Spark DataFrame, told without importing pyspark."""
    return hasattr(source, "sparkSession") and hasattr(source, "toPandas")


def _is_pandas(source: Any) -> bool:
    mod = type(source).__module__
    return mod.startswith("pandas") and type(source).__name__ == "DataFrame"


def _plain(v: Any) -> Any:
    """A numpy scalar as its Python value, a JSON list as a tuple (keys)."""
    if isinstance(v, list):
        return tuple(_plain(x) for x in v)
    item = getattr(v, "item", None)
    if item is not None and type(v).__module__ == "numpy":
        return item()
    return v


def _key(computation: str, raw: Any) -> Key:
    key = _plain(raw)
    why = key_problem(key)
    if why is not None:
        raise _fail(computation, f"has a bad key: {why}")
    return key  # type: ignore[no-any-return]


def normalize_timers(value: Any, where: str = "") -> Timers:
    """A key's timers in any accepted form (module docstring) as ``{tag: (timestamp, domain)}``;
    :class:`ValueError` saying what is wrong."""
    if value is None or (isinstance(value, float) and value != value):
        return {}
    if isinstance(value, (list, tuple)) and all(isinstance(t, Timer) for t in value):
        value = {t.tag: (t.timestamp, t.domain) for t in value}
    elif isinstance(value, (list, tuple)):  # a Parquet map column reads as (tag, value) pairs
        value = dict(value)
    if not isinstance(value, Mapping):
        msg = f"timers{where} must be a dict {{tag: timestamp or (timestamp, TimeDomain)}}, got {type(value).__name__}"
        raise ValueError(msg)
    out: Timers = {}
    for tag, spec in value.items():
        if not isinstance(tag, str):
            msg = f"timer tags{where} must be str, got {tag!r}"
            raise ValueError(msg)
        domain: Any = TimeDomain.LOW_WATERMARK
        if isinstance(spec, Mapping):
            ts, domain = spec.get("ts", spec.get("timestamp")), spec.get("domain", 0)
        elif isinstance(spec, (tuple, list)) and len(spec) == 2:
            ts, domain = spec
        else:
            ts = spec
        if isinstance(domain, str):
            d = _DOMAINS.get(domain.lower())
        elif isinstance(domain, int) and int(domain) in (0, 1):
            d = int(domain)
        else:
            d = None
        if d is None:
            msg = f"timer {tag!r}{where} has domain {domain!r}: use TimeDomain.LOW_WATERMARK or TimeDomain.WALL_TIME"
            raise ValueError(msg)
        ts = _plain(ts)
        if type(ts) is not int or not MIN_TIMESTAMP < ts <= MAX_TIMESTAMP:
            msg = f"timer {tag!r}{where} needs an int timestamp (ms since the epoch), got {ts!r}"
            raise ValueError(msg)
        out[tag] = (ts, d)
    return out


def seed_envelope(
    codec: Any, seed: Seed, base: bytes | None = None, *, computation: str = "?"
) -> Envelope | None:
    """The envelope of one key of a per-record computation holding ``seed``'s state (through
    ``codec``, the computation's ``state_codec``) and timers; ``base``: an envelope whose
    other contents (dedup ids, sequence, life, pending productions) are kept. ``None`` if
    the key keeps nothing. A new key has no life: its first production starts one in the
    batch that makes it (``_identity.py``), as a key made from nothing does."""
    env = Envelope() if base is None else Envelope.decode(base)
    try:
        env.state = None if seed.state is None else codec.encode(seed.state)
    except Exception as exc:
        raise _fail(
            computation,
            f"has a state for key {seed.key!r} that its state codec ({type(codec).__name__}) cannot encode: {type(exc).__name__}: {exc}",
        ) from None
    env.timers = dict(seed.timers)
    return None if env.is_empty() else env


def envelope_bytes(
    codec: Any, seed: Seed, base: bytes | None = None, *, computation: str = "?"
) -> bytes | None:
    """:func:`seed_envelope`, encoded."""
    env = seed_envelope(codec, seed, base, computation=computation)
    return None if env is None else env.encode()


class InitialState:
    """One computation's initial state source, checked as the topology is built (module docstring)."""

    def __init__(self, computation: str, source: Any, *, columnar: bool) -> None:
        self.computation = computation
        self.columnar = columnar
        self.source = source
        self.kind: str
        self.files: list[Path] = []
        if is_spark_frame(source):
            self.kind = "spark"
            if "key" not in list(source.columns):
                raise _fail(
                    computation, f"is a Spark DataFrame without a 'key' column ({source.columns})"
                )
        elif _is_pandas(source):
            self.kind = "frame"
            self._check_columns(list(source.columns), "a DataFrame")
            if columnar:  # a key has many rows: each distinct key checked once
                for k in source["key"].drop_duplicates().tolist():
                    _key(computation, k)
            else:
                self._unique([_key(computation, k) for k in source["key"].tolist()])
        elif isinstance(source, (str, os.PathLike)):
            self.kind = "path"
            self.files = self._paths(Path(source))
        elif isinstance(source, (bytes, bytearray)):
            raise _fail(computation, "must be a path, a DataFrame or an iterable, not bytes")
        elif isinstance(source, (Mapping, Iterable)):
            self.kind = "items"
            items = source.items() if isinstance(source, Mapping) else source
            self.items = [self._item(i, it) for i, it in enumerate(items)]
            self._unique([k for k, _, _ in self.items], always=True)
        else:
            raise _fail(
                computation,
                f"must be an iterable of (key, state[, timers]), a pandas or Spark DataFrame, or a Parquet/JSON-lines path; got {type(source).__name__}",
            )

    def describe(self) -> str:
        if self.kind == "path":
            return str(self.source)
        if self.kind == "items":
            return f"{len(self.items)} items"
        return f"a {'Spark' if self.kind == 'spark' else 'pandas'} DataFrame"

    # -- checks ----------------------------------------------------------------------
    def _check_columns(self, columns: list[str], what: str) -> None:
        if "key" not in columns:
            raise _fail(self.computation, f"is {what} without a 'key' column (columns: {columns})")
        if len(columns) < 2:
            raise _fail(self.computation, f"is {what} with a 'key' column and no state column")

    def _unique(self, keys: list[Key], *, always: bool = False) -> None:
        """A per-record key has one state; an iterable gives all of a key's rows at once."""
        if self.columnar and not always:
            return
        seen: set[Key] = set()
        for k in keys:
            if k in seen:
                raise _fail(self.computation, f"gives key {k!r} twice; a key has one state")
            seen.add(k)

    def _item(self, i: int, item: Any) -> tuple[Key, Any, Timers]:
        if not isinstance(item, tuple) or len(item) not in (2, 3):
            raise _fail(
                self.computation,
                f"item {i} is {type(item).__name__} {str(item)[:80]}; give (key, state) or (key, state, timers)",
            )
        key = _key(self.computation, item[0])
        try:
            timers = normalize_timers(item[2] if len(item) == 3 else None, f" of key {key!r}")
        except ValueError as exc:
            raise _fail(self.computation, str(exc)) from None
        return key, item[1], timers

    def _paths(self, path: Path) -> list[Path]:
        if not path.exists():
            raise _fail(self.computation, f"names {str(path)!r}, which does not exist")
        if path.is_dir():
            files = sorted(
                p
                for p in path.iterdir()
                if p.is_file()
                and not p.name.startswith((".", "_"))
                and p.suffix in (*_PARQUET, *_JSONL, *_JSON)
            )
            if not files:
                raise _fail(
                    self.computation,
                    f"names the directory {str(path)!r}, which holds no .parquet, .jsonl or .json file",
                )
        elif path.suffix in (*_PARQUET, *_JSONL, *_JSON):
            files = [path]
        else:
            raise _fail(
                self.computation,
                f"names {str(path)!r}: give a .parquet, .jsonl (.ndjson) or .json file, or a directory of them",
            )
        kinds = {_format(p) for p in files}
        if len(kinds) > 1:
            raise _fail(
                self.computation, f"directory {str(path)!r} mixes Parquet and JSON files; keep one"
            )
        if kinds == {"parquet"}:
            import pyarrow.parquet as pq

            for p in files:
                try:
                    names = pq.read_schema(p).names
                except Exception as exc:  # noqa: BLE001 - say which file and why
                    raise _fail(
                        self.computation, f"file {str(p)!r} is not Parquet: {exc}"
                    ) from None
                self._check_columns(names, f"the Parquet file {str(p)!r}")
        return files

    # -- reading ---------------------------------------------------------------------
    def seeds(self) -> Iterator[Seed]:
        """A per-record computation's keys, read from the source (a path: read now)."""
        if self.columnar:
            msg = "seeds() is for per-record computations; use columnar_seeds()"
            raise TypeError(msg)
        if self.kind == "items":
            for key, state, timers in self.items:
                yield Seed(key, state, timers)
            return
        seen: set[Key] = set()
        for key, state, timers in self._records():
            if key in seen:
                raise _fail(self.computation, f"gives key {key!r} twice; a key has one state")
            seen.add(key)
            yield Seed(key, state, timers)

    def _records(self) -> Iterator[tuple[Key, Any, Timers]]:
        """``(key, state, timers)`` of a frame or of files, per-record."""
        if self.kind in ("frame", "spark"):
            yield from self._frame_records(self._pandas())
            return
        for p in self.files:
            if _format(p) == "parquet":
                import pyarrow.parquet as pq

                yield from self._frame_records(pq.read_table(p))
            else:
                for obj in _json_objects(p, self.computation):
                    yield self._record(obj, str(p))

    def _pandas(self) -> Any:
        """The frame: pandas, or a Spark DataFrame's rows as Arrow (``toArrow``, Spark 4) or pandas."""
        if self.kind != "spark":
            return self.source
        to_arrow = getattr(self.source, "toArrow", None)
        return to_arrow() if to_arrow is not None else self.source.toPandas()

    def _frame_records(self, frame: Any) -> Iterator[tuple[Key, Any, Timers]]:
        """Rows of a pandas frame or Arrow table: ``key``, ``state`` (or the other columns
        as a dict), ``timers``."""
        cols = list(frame.columns) if _is_pandas(frame) else frame.column_names

        def column(name: str) -> list[Any]:
            return frame[name].tolist() if _is_pandas(frame) else frame.column(name).to_pylist()

        keys = column("key")
        if "state" in cols:
            states = column("state")
        else:
            rest = [c for c in cols if c not in ("key", "timers")]
            values = [column(c) for c in rest]
            states = [dict(zip(rest, row, strict=True)) for row in zip(*values, strict=True)]
        timers = column("timers") if "timers" in cols else [None] * len(keys)
        for k, s, t in zip(keys, states, timers, strict=True):
            key = _key(self.computation, k)
            try:
                yield key, _plain_state(s), normalize_timers(t, f" of key {key!r}")
            except ValueError as exc:
                raise _fail(self.computation, str(exc)) from None

    def _record(self, obj: Any, where: str) -> tuple[Key, Any, Timers]:
        if not isinstance(obj, Mapping) or "key" not in obj:
            raise _fail(self.computation, f"{where}: a line is not an object with a 'key'")
        key = _key(self.computation, obj["key"])
        if "state" in obj:
            state = obj["state"]
        else:
            state = {k: v for k, v in obj.items() if k not in ("key", "timers")}
        try:
            return key, state, normalize_timers(obj.get("timers"), f" of key {key!r}")
        except ValueError as exc:
            raise _fail(self.computation, f"{where}: {exc}") from None

    def columnar_seeds(self) -> ColumnarSeeds:
        """A columnar computation's rows and timers, read from the source."""
        import pyarrow as pa

        from millwheel._colbatch import to_arrow
        from millwheel._record import encode_key

        tables: list[Any] = []
        timers: list[tuple[bytes, str, int, int]] = []

        def add(keys: list[Any], rows: Any) -> None:
            if rows is None or rows.num_rows == 0:
                return
            kbs = [encode_key(_key(self.computation, k)) for k in keys]
            tables.append(rows.add_column(0, "_kb", pa.array(kbs, pa.binary())))

        def add_timers(key: Key, value: Any) -> None:
            try:
                t = normalize_timers(value, f" of key {key!r}")
            except ValueError as exc:
                raise _fail(self.computation, str(exc)) from None
            kb = encode_key(key)
            timers.extend((kb, tag, ts, d) for tag, (ts, d) in t.items())

        def add_objects(objs: list[tuple[Key, Any, Any]]) -> None:
            flat: list[dict[str, Any]] = []
            flat_keys: list[Key] = []
            for key, rows, t in objs:
                add_timers(key, t)
                if rows is None:
                    continue
                if _is_pandas(rows):
                    frame = rows.drop(columns=["key"]) if "key" in rows.columns else rows
                    add([key] * len(frame), to_arrow(frame) if len(frame) else None)
                    continue
                for row in [rows] if isinstance(rows, Mapping) else rows:
                    if not isinstance(row, Mapping):
                        raise _fail(
                            self.computation,
                            f"key {key!r}: a columnar computation's state is rows (a DataFrame, dicts), got {type(row).__name__}",
                        )
                    flat.append({c: v for c, v in row.items() if c != "key"})
                    flat_keys.append(key)
            if flat:
                add(flat_keys, pa.Table.from_pylist(flat))

        if self.kind == "items":
            add_objects(self.items)
        elif self.kind in ("frame", "spark"):
            frame = self._pandas()
            if _is_pandas(frame):
                add(frame["key"].tolist(), to_arrow(frame) if len(frame) else None)
            else:
                add(frame.column("key").to_pylist(), frame.drop_columns(["key"]))
        else:
            for p in self.files:
                if _format(p) == "parquet":
                    import pyarrow.parquet as pq

                    t = pq.read_table(p)
                    add(t.column("key").to_pylist(), t.drop_columns(["key"]))
                    continue
                objs: list[tuple[Key, Any, Any]] = []
                flat_rows: list[dict[str, Any]] = []
                for obj in _json_objects(p, self.computation):
                    if not isinstance(obj, Mapping) or "key" not in obj:
                        raise _fail(self.computation, f"{p}: a line is not an object with a 'key'")
                    key = _key(self.computation, obj["key"])
                    if "state" in obj and set(obj) - {"key", "state", "timers"} <= _READER_FIELDS:
                        objs.append((key, obj["state"], obj.get("timers")))
                    else:
                        flat_rows.append(dict(obj))
                add_objects(objs)
                if flat_rows:
                    add(
                        [r.pop("key") for r in flat_rows],
                        pa.Table.from_pylist(flat_rows),
                    )
        rows = None
        if tables:
            rows = (
                tables[0]
                if len(tables) == 1
                else pa.concat_tables(tables, promote_options="permissive")
            )
        return ColumnarSeeds(rows, timers)


def columnar_store(seeds: ColumnarSeeds, options: Any = None) -> Any:
    """The :class:`~millwheel._colstore.ColumnarStore` holding ``seeds`` (rows and timers;
    no sequence, life or dedup ids: each key's first production starts its life)."""
    from millwheel._colstore import ColumnarStore
    from millwheel._coltimers import TimerTable

    store = ColumnarStore.decode(None, options)
    store.state = seeds.rows
    if seeds.timers:
        kb, tag, ts, d = zip(*seeds.timers, strict=True)
        store.timers = TimerTable.of(list(kb), list(tag), list(ts), list(d))
    return store


def _plain_state(v: Any) -> Any:
    item = getattr(v, "item", None)
    if item is not None and type(v).__module__ == "numpy":
        return item()
    return v


def _format(p: Path) -> str:
    return "parquet" if p.suffix in _PARQUET else "json"


def _json_objects(p: Path, computation: str) -> Iterator[Any]:
    """The objects of a JSON-lines file, or of a ``.json`` file: ``millwheel state --json``'s
    document (its ``keys``), a list of objects, or one object per line."""
    text = p.read_text(encoding="utf-8")
    if p.suffix in _JSON:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, Mapping) and isinstance(doc.get("keys"), list):
            yield from doc["keys"]
            return
        if isinstance(doc, list):
            yield from doc
            return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            raise _fail(computation, f"{p}, line {n}: not JSON ({exc})") from None
