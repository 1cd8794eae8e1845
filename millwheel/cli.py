"""The ``millwheel`` command.

    millwheel run TOPOLOGY.py [--backend spark|harness] [--until-drained] [--checkpoint DIR] ...
                                                     run a topology (default: Spark, local[*])
    millwheel validate TOPOLOGY.py                   check the wiring
    millwheel graph TOPOLOGY.py [--dot]              print the topology as text or Graphviz DOT
    millwheel authority serve [...]                  run the low-watermark authority service
    millwheel zeitgeist generate|run|evaluate ...    Zeitgeist sample data and its evaluation

A topology module exposes a :class:`~millwheel.Topology` as ``topology`` (or a function
``build()`` returning one).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from millwheel._errors import MillwheelError
from millwheel._record import Record
from millwheel._topology import Topology


def load_topology(path: str) -> Topology:
    """Import a topology module by path and return its ``topology`` (or ``build()``)."""
    return load_topology_module(path)[0]


def load_topology_module(path: str) -> tuple[Topology, ModuleType]:
    """Import a topology module by path: its ``topology`` (or ``build()``), and the module.

    Besides the topology, a module may define ``on_finish(topology, streams, metrics) ->
    str``: ``millwheel run`` prints what it returns once a run has drained its inputs
    (``streams`` maps each stream to its values, ``metrics`` each computation to its
    counters). Zeitgeist prints its evaluation this way.
    """
    file = Path(path)
    if not file.is_file():
        msg = f"no topology file at {path!r}"
        raise MillwheelError(msg)
    root = str(file.resolve().parent)
    for candidate in (root, str(Path.cwd())):
        if candidate not in sys.path:
            sys.path.insert(0, candidate)
    spec = importlib.util.spec_from_file_location(f"_millwheel_topology_{file.stem}", file)
    if spec is None or spec.loader is None:
        msg = f"cannot import {path!r} as a Python module"
        raise MillwheelError(msg)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(spec.name, None)
        raise
    topo = getattr(module, "topology", None)
    if topo is None and callable(getattr(module, "build", None)):
        topo = module.build()
    if not isinstance(topo, Topology):
        found = [n for n, v in vars(module).items() if isinstance(v, Topology)]
        if len(found) == 1:
            topo = getattr(module, found[0])
        else:
            msg = f"{path}: define `topology = Topology(...)` (or `def build() -> Topology`) at module level"
            raise MillwheelError(msg)
    return topo, module


def graph_text(t: Topology, dot: bool = False) -> str:
    lines: list[str] = []
    if dot:
        lines.append(f'digraph "{t.name}" {{')
        for i in t.injectors.values():
            lines.append(f'  "{i.name}" [shape=invhouse];')
        for s in t.sinks.values():
            lines.append(f'  "{s.name}" [shape=house];')
        for c in t.computations.values():
            lines.append(f'  "{c.name}" [shape=box];')
        for stream in t.streams():
            for p in t.producers(stream):
                for c in t.consumers(stream):
                    lines.append(f'  "{p}" -> "{c.name}" [label="{stream}"];')
                for s in t.sinks.values():
                    if s.stream == stream:
                        lines.append(f'  "{p}" -> "{s.name}" [label="{stream}"];')
        lines.append("}")
        return "\n".join(lines)
    lines.append(f"topology {t.name}")
    for i in t.injectors.values():
        lines.append(f"  injector {i.name} -> [{i.stream}]")
    for name in t.order():
        c = t.computations[name]
        ins = ", ".join(c.inputs)
        outs = ", ".join(c.all_outputs)
        lines.append(f"  computation {name} ({c.cls.__name__}): [{ins}] -> [{outs}]")
    for s in t.sinks.values():
        lines.append(f"  sink {s.name} <- [{s.stream}]")
    return "\n".join(lines)


def _run_harness(t: Topology, on_finish: Any = None) -> int:
    from millwheel.testing import Harness

    start = time.perf_counter()
    h = Harness(t, raise_errors=False)
    h.run_sources()
    elapsed = time.perf_counter() - start
    print(f"topology {t.name}: ran in memory (harness backend) in {elapsed:.2f}s")
    for name in t.order():
        m = h.metrics(name)
        print(
            f"  {name:<20} in={m.get('records_in', 0):>8} out={m.get('productions', 0):>7} "
            f"dup={m.get('duplicates', 0)} late={m.get('late', 0)} dead={m.get('dead_letters', 0)} "
            f"timers={m.get('timers_fired', 0)} lw={h.low_watermark(name)}"
        )
    print_finish(t, h.values, h.dead_letters(), {name: h.metrics(name) for name in t.order()}, on_finish)
    return 0


def print_finish(
    t: Topology,
    values: Callable[[str], list[Any]],
    dead_letters: list[Record],
    metrics: dict[str, dict[str, int]],
    on_finish: Any = None,
) -> None:
    """The end of a run, whatever the backend: sinks, dead letters, the module's ``on_finish``."""
    for s in t.sinks.values():
        out = values(s.stream)
        print(f"  sink {s.stream}: {len(out)} records")
        if on_finish is None:
            for v in out[:20]:
                print(f"    {v}")
    if dead_letters:
        print(f"  dead letters: {len(dead_letters)}")
        for r in dead_letters[:5]:
            v = r.value
            print(f"    {v.get('what') if isinstance(v, dict) else ''}: {v.get('reason') if isinstance(v, dict) else v}")
    if on_finish is not None:
        print(on_finish(t, {stream: values(stream) for stream in t.streams()}, metrics))


def _delegate(command: str, rest: list[str]) -> int:
    """Subcommands whose arguments belong to another module's own parser."""
    if command == "authority":
        from watermark_authority.cli import main as authority_main

        return authority_main(rest)
    from topologies.zeitgeist_tools import main as zeitgeist_main

    return zeitgeist_main(rest)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("authority", "zeitgeist"):
        return _delegate(argv[0], argv[1:])
    parser = argparse.ArgumentParser(prog="millwheel", description="MillWheel-style stream computations on Spark")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run a topology")
    p_run.add_argument("topology")
    p_run.add_argument("--backend", choices=["spark", "harness"], default="spark", help="where to run it (default: Spark)")
    from millwheel.runtime._cli import add_arguments as _spark_arguments

    _spark_arguments(p_run)
    p_val = sub.add_parser("validate", help="check a topology's wiring")
    p_val.add_argument("topology")
    p_graph = sub.add_parser("graph", help="print a topology")
    p_graph.add_argument("topology")
    p_graph.add_argument("--dot", action="store_true", help="Graphviz DOT instead of text")
    p_auth = sub.add_parser("authority", help="the low-watermark authority service", add_help=False)
    p_auth.add_argument("rest", nargs=argparse.REMAINDER)
    p_zg = sub.add_parser("zeitgeist", help="Zeitgeist sample data: generate, run, evaluate", add_help=False)
    p_zg.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command in ("authority", "zeitgeist"):
            return _delegate(args.command, args.rest)
        topo, module = load_topology_module(args.topology)
        if args.command == "validate":
            topo.validate()
            print(f"topology {topo.name!r} is valid: {len(topo.injectors)} injectors, {len(topo.computations)} computations, {len(topo.sinks)} sinks")
            return 0
        if args.command == "graph":
            topo.validate()
            print(graph_text(topo, dot=args.dot))
            return 0
        if args.backend == "spark":
            from millwheel.runtime._cli import run as _run_spark

            return _run_spark(topo.validate(), args, getattr(module, "on_finish", None))
        return _run_harness(topo.validate(), getattr(module, "on_finish", None))
    except MillwheelError as exc:
        print(f"millwheel: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("millwheel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
