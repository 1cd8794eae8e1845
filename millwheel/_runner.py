"""What ``millwheel run`` does on every backend: load a topology module, report the end of a run.

Pure Python (no pyspark, no built-in topology): :mod:`millwheel.cli` and the Spark
runtime's CLI (``millwheel/runtime/_cli.py``) both import it.

A topology module is a ``.py`` file or a package directory (its ``__init__.py``, imported
as a package so its relative imports work). It exposes a :class:`~millwheel.Topology` as
``topology`` (or a function ``build()`` returning one) and may define
``on_finish(topology, streams, metrics) -> str``: ``millwheel run`` prints what it
returns once a run has drained its inputs (``streams`` maps each stream to its values,
``metrics`` each computation to its counters). Zeitgeist prints its evaluation this way.

>>> import os, tempfile
>>> d = os.path.join(tempfile.mkdtemp(), "demo")
>>> os.mkdir(d)
>>> with open(os.path.join(d, "__init__.py"), "w") as f:
...     _ = f.write("from .wiring import topology\\n")
>>> with open(os.path.join(d, "wiring.py"), "w") as f:
...     _ = f.write("from millwheel import Topology\\ntopology = Topology('demo')\\n")
>>> topology, module = load_topology_module(d)
>>> topology.name, module.__name__
('demo', '_millwheel_topology_demo')
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from millwheel._deadletter import DeadLetter
from millwheel._errors import MillwheelError
from millwheel._record import Record, duration_text, timestamp_text
from millwheel._topology import Topology


def load_topology(path: str) -> Topology:
    """Import a topology module (a ``.py`` file or a package directory) and return its topology."""
    return load_topology_module(path)[0]


def load_topology_module(path: str) -> tuple[Topology, ModuleType]:
    """Import a topology module by path: its ``topology`` (or ``build()``), and the module."""
    target = Path(path)
    if target.is_dir():
        file, search = target / "__init__.py", [str(target.resolve())]
        if not file.is_file():
            msg = f"{path!r} is a directory without __init__.py; give a topology .py file or a package directory"
            raise MillwheelError(msg)
    elif target.is_file():
        file, search = target, None
    else:
        msg = f"no topology file or package at {path!r}"
        if (target.with_suffix("") / "__init__.py").is_file():
            msg += f"; did you mean the package {str(target.with_suffix(''))!r}?"
        raise MillwheelError(msg)
    # the directory holding the file or package, and the working directory, for its imports
    for candidate in (str(target.resolve().parent), str(Path.cwd())):
        if candidate not in sys.path:
            sys.path.insert(0, candidate)
    name = f"_millwheel_topology_{target.resolve().name if search else file.stem}"
    spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=search)
    if spec is None or spec.loader is None:
        msg = f"cannot import {path!r} as a Python module"
        raise MillwheelError(msg)
    _forget(name)  # a package loaded before under this name must not lend its submodules
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickling and relative imports look it up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        _forget(name)
        raise
    topo = getattr(module, "topology", None)  # in a package, maybe its submodule topology.py
    if not isinstance(topo, Topology) and callable(getattr(module, "build", None)):
        topo = module.build()
    if not isinstance(topo, Topology):
        found = [n for n, v in vars(module).items() if isinstance(v, Topology)]
        if len(found) == 1:
            topo = getattr(module, found[0])
        else:
            msg = f"{path}: define `topology = Topology(...)` (or `def build() -> Topology`) at module level"
            raise MillwheelError(msg)
    return topo, module


def _forget(name: str) -> None:
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]


#: the share of a computation's records that may arrive late before a run warns about it
LATE_WARNING_SHARE = 0.001
#: the most disorder a run advises covering with ``LogFileSource(lateness_ms=...)``: beyond a
#: day the records are not late but wrong (a timestamp in another unit, a clock far off)
MAX_ADVISED_LATENESS_MS = 86_400_000


class LateNote(NamedTuple):
    """What a run says about one computation's late records (:func:`late_notes`)."""

    computation: str
    #: late records passed :data:`LATE_WARNING_SHARE` of the computation's input
    warning: bool
    text: str

    def line(self) -> str:
        return ("warning: " if self.warning else "") + self.text


def late_lines(
    t: Topology,
    metrics: Mapping[str, Mapping[str, int]],
    disorder: Mapping[str, tuple[int, str] | None] | None = None,
) -> list[str]:
    """:func:`late_notes` as the lines a run summary prints.

    >>> from millwheel import Computation, Topology
    >>> class C(Computation):
    ...     def process_record(self, record): ...
    >>> t = Topology("t"); _ = t.injector("logs", stream="events"); _ = t.computation(C, inputs=["events"])
    >>> late_lines(t, {"C": {"records_in": 1_000, "late": 9, "late_dropped": 9}}, {"logs": (5_000, "part-0003.jsonl")})
    ['warning: C: 9 records late (0.90% of 1,000), 9 dropped; injector logs read records up to 5.0s out of order (part-0003.jsonl): LogFileSource(lateness_ms=5000) would have kept them']
    """
    return [note.line() for note in late_notes(t, metrics, disorder)]


def late_notes(
    t: Topology,
    metrics: Mapping[str, Mapping[str, int]],
    disorder: Mapping[str, tuple[int, str] | None] | None = None,
) -> list[LateNote]:
    """What a run says about late records (§4.5), whatever the backend: per computation with
    any, how many, which injectors feed it and how far out of order they read records, and
    the ``lateness_ms`` that would have kept them; a warning once late records pass
    :data:`LATE_WARNING_SHARE` of the computation's input."""
    out = []
    for name in t.order():
        m = metrics.get(name) or {}
        late = int(m.get("late", 0) or 0)
        if not late:
            continue
        n = max(int(m.get("records_in", 0) or 0), late)
        what = [f"{late:,} records late ({late / n:.2%} of {n:,})"]
        for action in ("dropped", "to_stream"):
            k = int(m.get(f"late_{action}", 0) or 0)
            if k:
                what.append(
                    f"{k:,} {'dropped' if action == 'dropped' else 'sent to the late stream'}"
                )
        spec = t.computations[name]
        sources = []
        for inj in t.injectors.values():
            if inj.stream not in spec.inputs:
                continue
            d = (disorder or {}).get(inj.name)
            if d is None:
                sources.append(f"from injector {inj.name}")
            elif (
                d[0] > MAX_ADVISED_LATENESS_MS
            ):  # no lateness bound fits: a unit mistake or a clock far off
                sources.append(
                    f"injector {inj.name} read records up to {duration_text(d[0])} out of order ({d[1]}): more than "
                    f"{duration_text(MAX_ADVISED_LATENESS_MS)}, which no lateness_ms should cover; look for timestamps in "
                    "another unit or from a clock far off (the dead letters with reason implausible_timestamp)"
                )
            else:
                sources.append(
                    f"injector {inj.name} read records up to {duration_text(d[0])} out of order ({d[1]}): "
                    f"LogFileSource(lateness_ms={d[0]}) would have kept them"
                )
        text = (
            f"{name}: "
            + ", ".join(what)
            + (
                "; " + "; ".join(sources)
                if sources
                else "; behind its input low watermark on arrival"
            )
        )
        out.append(LateNote(name, late / n > LATE_WARNING_SHARE, text))
    return out


def print_finish(
    t: Topology,
    values: Callable[[str], list[Any]],
    dead_letters: list[Record],
    metrics: dict[str, dict[str, int]],
    on_finish: Any = None,
    *,
    where: Mapping[str, str] | None = None,
    disorder: Mapping[str, tuple[int, str] | None] | None = None,
    counts: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """The end of a run, whatever the backend: sinks, dead letters, late records, the module's ``on_finish``.

    ``where`` maps a sink's name to where all of its output is (its target, a command);
    ``disorder`` an injector's name to how far out of order it read records (:func:`late_lines`);
    ``counts`` an injector's name to what it read that a user must hear of (:func:`injector_lines`).
    """
    for s in t.sinks.values():
        out = values(s.stream)
        hint = (where or {}).get(s.name)
        print(f"  sink {s.stream}: {len(out)} records" + (f"; {hint}" if hint else ""))
        if on_finish is None:
            for v in out[:20]:
                print(f"    {v}")
            if len(out) > 20:
                print(f"    ... and {len(out) - 20} more")
    for line in late_lines(t, metrics, disorder):
        print(f"  {line}")
    for line in injector_lines(t, counts or {}):
        print(f"  {line}")
    if dead_letters:
        print(f"  dead letters: {len(dead_letters)}")
        for r in dead_letters[:5]:
            print(f"    {_describe(r.value)}")
    if on_finish is not None:
        print(on_finish(t, _Streams(t.streams(), values), metrics))


def injector_lines(t: Topology, counts: Mapping[str, Mapping[str, int]]) -> list[str]:
    """What a run says about what its injectors read, whatever the backend: records that got
    their file and offset as id (no dedup of their copies) and rows cut off at ``end_ms``.

    >>> from millwheel import LogFileSource
    >>> t = Topology("t"); _ = t.injector("logs", LogFileSource("/tmp/none"), stream="events")
    >>> print(injector_lines(t, {"logs": {"positional_ids": 12}})[0])  # doctest: +ELLIPSIS
    warning: injector logs: 12 records had no 'id' field and got their file and byte offset as id ...
    """
    out = []
    for name, c in counts.items():
        spec = t.injectors.get(name)
        source = getattr(spec, "source", None)
        n = int(c.get("positional_ids", 0) or 0)
        if n:
            field = getattr(getattr(source, "read_options", None), "id_field", "id")
            out.append(
                f"warning: injector {name}: {n:,} records had no {field!r} field and got their file and byte offset as id "
                "(<file>:<offset>): a copy of one delivered again (another file, another offset) is not recognised as a "
                'duplicate and is counted twice; give every line an id to have re-deliveries deduplicated (docs/concepts.md, "Bad input")'
            )
        n = int(c.get("beyond_end", 0) or 0)
        if n:
            end = getattr(source, "end_ms", None)
            when = timestamp_text(end) if end is not None else "?"
            out.append(
                f"injector {name}: {n:,} rows at or after its end_ms={end}{'' if when == str(end) else f' ({when})'} left out: not part of the input"
            )
    return out


class _Streams(Mapping[str, list[Any]]):
    """``on_finish``'s streams: each read when it is first looked up, not all of them up front."""

    def __init__(self, names: list[str], values: Callable[[str], list[Any]]) -> None:
        self._names = list(names)
        self._values = values
        self._read: dict[str, list[Any]] = {}

    def __getitem__(self, stream: str) -> list[Any]:
        if stream not in self._names:
            raise KeyError(stream)
        if stream not in self._read:
            self._read[stream] = self._values(stream)
        return self._read[stream]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _describe(letter: Any) -> str:
    """One line for a dead letter: stage, where (computation or injector; file and offset), reason."""
    if not isinstance(letter, DeadLetter):  # a computation may produce anything to the stream
        return repr(letter)[:200]
    where = letter.computation or letter.injector or "?"
    if letter.file is not None:
        where += f" {letter.file}@{letter.offset}"
    return f"{letter.stage} ({where}): {letter.reason}"
