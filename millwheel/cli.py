"""The ``millwheel`` command.

    millwheel run TOPOLOGY.py [--backend spark|harness] [--until-drained] [--checkpoint DIR] ...
                                                     run a topology (default: Spark, local[*])
    millwheel validate TOPOLOGY.py                   check the wiring
    millwheel graph TOPOLOGY.py [--dot]              print the topology as text or Graphviz DOT
    millwheel authority serve [...]                  run the low-watermark authority service
    millwheel read RUN [STREAM] [--format F]         print a stream of a run directory (JSON lines, CSV, Parquet)
    millwheel state RUN COMPUTATION [--key K]        a computation's committed per-key state and timers
    millwheel state load RUN C SOURCE --topology T   a computation's initial state, before its first batch
    millwheel state rewrite RUN C --with M:F [--undo] a function over every key of a stopped run's state
    millwheel cluster up|down|status|launcher        a Spark standalone cluster on this machine
    millwheel NAME ...                               a registered command, e.g. zeitgeist

``TOPOLOGY`` is a ``.py`` file or a package directory exposing a
:class:`~millwheel.Topology` as ``topology`` (or a function ``build()`` returning one);
see :mod:`millwheel._runner`. Built-in topologies bring their own commands by
registering them as entry points in the group ``millwheel.commands``
(``zeitgeist = "topologies.zeitgeist.cli:main"`` in ``pyproject.toml``): a command is a
function ``main(argv) -> int`` that gets the arguments after its name. This module
imports no topology.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from millwheel import _logfile
from millwheel._errors import MillwheelError
from millwheel._record import timestamp_text
from millwheel._runner import load_topology, load_topology_module, print_finish
from millwheel._topology import Topology

__all__ = [
    "COMMAND_GROUP",
    "build_parser",
    "graph_text",
    "load_topology",
    "load_topology_module",
    "main",
    "registered_commands",
]

#: the entry-point group of the commands that packages add to ``millwheel``
COMMAND_GROUP = "millwheel.commands"

_BUILT_IN = ("run", "validate", "graph", "authority", "read", "state", "cluster", "rescale")
#: built-in commands whose arguments belong to a runtime module's own parser: name -> (module, function, help)
_RUNTIME_COMMANDS = {
    "read": (
        "millwheel.runtime._sinks",
        "read_main",
        "print a stream of a run directory as JSON lines, CSV or Parquet",
    ),
    "state": (
        "millwheel.runtime._state_reader",
        "state_main",
        "a computation's committed per-key state, timers and dedup ids",
    ),
    "cluster": (
        "millwheel.runtime._cluster",
        "cluster_main",
        "a Spark standalone cluster on this machine (up, down, status); the file to give spark-submit (launcher)",
    ),
    "rescale": (
        "millwheel.runtime._online",
        "rescale_main",
        "give a computation another number of key intervals or another state layout (--layout): online by its running driver, or in a stopped run",
    ),
}


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
    with Harness(t, raise_errors=False) as h:
        h.run_sources()
    elapsed = time.perf_counter() - start
    print(f"topology {t.name}: ran in memory (harness backend) in {elapsed:.2f}s")
    for name in t.order():
        m = h.metrics(name)
        print(
            f"  {name:<20} in={m.get('records_in', 0):>8} out={m.get('productions', 0):>7} "
            f"dup={m.get('duplicates', 0)} late={m.get('late', 0)} dead={m.get('dead_letters', 0)} "
            f"timers={m.get('timers_fired', 0)} lw={timestamp_text(h.low_watermark(name))}"
        )
    from millwheel.runtime._sinks import write_harness_sinks

    where = write_harness_sinks(t, h.output)
    disorder = {
        name: _logfile.disorder(i.source.last_offset)
        for name, i in t.injectors.items()
        if isinstance(i.source, _logfile.LogFileSource) and i.source.last_offset is not None
    }
    metrics = {name: h.metrics(name) for name in t.order()}
    counts = {
        name: dict(c) for name, i in t.injectors.items() if (c := getattr(i.source, "counts", None))
    }
    print_finish(
        t,
        h.values,
        h.dead_letters(),
        metrics,
        on_finish,
        where=where,
        disorder=disorder,
        counts=counts,
    )
    return 0


#: options of the Spark backend that ask for what the harness does anyway: it reads every
#: input to its end (``--until-drained``) and shows no live status (``--quiet``, ``--status-every``)
_HARNESS_DOES_ANYWAY = ("drain", "quiet", "status_every")


def _refuse_spark_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--backend harness`` with an option of the Spark backend (``--checkpoint DIR``,
    ``--intervals``, ``--master``...): refused, naming them (but those in
    :data:`_HARNESS_DOES_ANYWAY`). The harness runs in memory and
    keeps no run directory, so a ``--checkpoint`` would stay empty and a second run would
    not resume from it; the user asked for something it cannot do (docs/runtime.md)."""
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "run"
    ]  # noqa: SLF001 - argparse has no public walk
    group = next(g for g in run._action_groups if g.title == "spark backend")  # noqa: SLF001
    defaults: dict[str, Any] = {}
    for a in run._actions:  # noqa: SLF001 - what parse_args sets when an option is not given: the first default of its dest
        defaults.setdefault(a.dest, a.default)
    for same in _HARNESS_DOES_ANYWAY:
        defaults.pop(same, None)
    given = [
        a.option_strings[-1]
        for a in group._group_actions
        if a.dest in defaults and getattr(args, a.dest) != defaults.pop(a.dest)
    ]  # noqa: SLF001
    if given:
        msg = (
            f"{', '.join(given)}: option{'s' if len(given) > 1 else ''} of the Spark backend, and --backend harness runs the topology in "
            "memory: it keeps no run directory (nothing is written to a --checkpoint, a second run does not resume) and has no "
            "Spark settings; its sinks with a target are written as on Spark. Drop them, or run with --backend spark"
        )
        raise MillwheelError(msg)


def registered_commands() -> dict[str, EntryPoint]:
    """The commands other packages register (entry points in :data:`COMMAND_GROUP`), by name.

    A name of a built-in command is not taken over.
    """
    return {ep.name: ep for ep in entry_points(group=COMMAND_GROUP) if ep.name not in _BUILT_IN}


def _command_help(ep: EntryPoint, load: bool) -> str:
    """The first line of the command's docstring when ``load`` (top-level ``--help``), else its target."""
    if load:
        try:
            doc = (ep.load().__doc__ or "").strip()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break `millwheel --help`
            return f"{ep.value} (cannot be loaded: {type(exc).__name__}: {exc})"
        if doc:
            return doc.splitlines()[0]
    return ep.value


def _delegate(command: str, rest: list[str], commands: dict[str, EntryPoint]) -> int:
    """Subcommands whose arguments belong to another module's own parser."""
    if command == "authority":
        from watermark_authority.cli import main as authority_main

        return authority_main(rest)
    if command in _RUNTIME_COMMANDS:
        import importlib

        module, function, _ = _RUNTIME_COMMANDS[command]
        runtime_main: Callable[[list[str]], int] = getattr(
            importlib.import_module(module), function
        )
        return runtime_main(rest)
    command_main: Callable[[list[str]], int] = commands[command].load()
    return command_main(rest)


#: the help of every ``TOPOLOGY`` argument
_TOPOLOGY_HELP = "a topology: a .py file or a package directory exposing `topology` (or `build()`)"


def build_parser(
    commands: dict[str, EntryPoint] | None = None, *, top_help: bool = False
) -> argparse.ArgumentParser:
    """The ``millwheel`` command line (``commands``: the registered ones, loaded for their
    help only when ``top_help``); :func:`options_reference` lists every option of it."""
    commands = registered_commands() if commands is None else commands
    parser = argparse.ArgumentParser(
        prog="millwheel", description="MillWheel-style stream computations on Spark"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run a topology")
    p_run.add_argument("topology", help=_TOPOLOGY_HELP)
    p_run.add_argument(
        "--backend",
        choices=["spark", "harness"],
        default="spark",
        help="where to run it (default: Spark)",
    )
    from millwheel.runtime._cli import add_arguments as _spark_arguments

    _spark_arguments(p_run)
    p_val = sub.add_parser("validate", help="check a topology's wiring")
    p_val.add_argument("topology", help=_TOPOLOGY_HELP)
    p_graph = sub.add_parser("graph", help="print a topology")
    p_graph.add_argument("topology", help=_TOPOLOGY_HELP)
    p_graph.add_argument("--dot", action="store_true", help="Graphviz DOT instead of text")
    p_auth = sub.add_parser("authority", help="the low-watermark authority service", add_help=False)
    p_auth.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        help="the command's own arguments (millwheel authority --help)",
    )
    for name, (_, _, text) in _RUNTIME_COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False).add_argument(
            "rest",
            nargs=argparse.REMAINDER,
            help=f"the command's own arguments (millwheel {name} --help)",
        )
    for name, ep in sorted(commands.items()):
        p_cmd = sub.add_parser(name, help=_command_help(ep, load=top_help), add_help=False)
        p_cmd.add_argument(
            "rest",
            nargs=argparse.REMAINDER,
            help=f"the command's own arguments (millwheel {name} --help)",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = registered_commands()
    if argv and (argv[0] == "authority" or argv[0] in _RUNTIME_COMMANDS or argv[0] in commands):
        return _delegate(argv[0], argv[1:], commands)
    parser = build_parser(commands, top_help=not argv or argv[0] in ("-h", "--help"))
    args = parser.parse_args(argv)
    try:
        if args.command == "run" and args.backend == "harness":
            _refuse_spark_options(parser, args)
        topo, module = load_topology_module(args.topology)
        if args.command == "validate":
            topo.validate()
            print(
                f"topology {topo.name!r} is valid: {len(topo.injectors)} injectors, {len(topo.computations)} computations, {len(topo.sinks)} sinks"
            )
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


def options_reference(parser: argparse.ArgumentParser, prog: str) -> list[str]:
    """Every subcommand and option of ``parser`` with its one-line help, as Markdown list
    lines (the docs' command-line references are these lines; a test keeps them in step)."""
    out: list[str] = []
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001 - argparse has no public walk
    for sub in subs:
        helps = {c.dest: c.help for c in sub._choices_actions}  # noqa: SLF001
        for name, p in sub.choices.items():
            out.append(f"* `{prog} {name}` — {helps.get(name) or ''}".rstrip(" —"))
            for action in p._actions:  # noqa: SLF001
                if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):  # noqa: SLF001
                    continue
                flag = ", ".join(action.option_strings) or action.dest.upper()
                out.append(f"  * `{flag}`: {' '.join(str(action.help or '').split())}")
    return out
