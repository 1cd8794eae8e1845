"""Every option of every ``millwheel`` subcommand has a one-line help, and ``millwheel run``
passes Spark settings through (``--conf``, ``--packages``, ``--jars``, ``Topology(spark_conf=...)``)."""

from __future__ import annotations

import argparse

import pytest

from millwheel import Topology, cli

COMMANDS = [
    "run",
    "validate",
    "graph",
    "authority",
    "read",
    "state",
    "cluster",
    *sorted(cli.registered_commands()),
]


class _Parsed(Exception):  # noqa: N818 - a signal, not an error
    pass


def _parser_of(command, monkeypatch):
    """The parser that ``millwheel COMMAND`` parses its arguments with (its own, for a delegated command)."""
    seen = []

    def capture(self, args=None, namespace=None):
        seen.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(_Parsed):
        cli.main([command, "x"])
    return seen[0]


def _options(parser, prog):
    """``(where, flags, help)`` of every argument of ``parser`` and of its subcommands."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from _options(sub, f"{prog} {name}")
            continue
        yield prog, ", ".join(action.option_strings) or action.dest, action.help


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_a_one_line_help(command, monkeypatch):
    parser = _parser_of(command, monkeypatch)
    options = list(_options(parser, parser.prog))
    assert options
    missing = [
        f"{where} {flag}"
        for where, flag, text in options
        if text != argparse.SUPPRESS and not (text or "").strip()
    ]
    assert missing == []
    long = [
        f"{where} {flag}"
        for where, flag, text in options
        if text and len(" ".join(text.split())) > 240
    ]
    assert long == []


def test_options_reference_lists_the_spark_pass_through():
    lines = cli.options_reference(cli.build_parser({}), "millwheel")
    for flag in ("--conf", "--packages", "--jars"):
        assert any(line.startswith(f"  * `{flag}`: ") and len(line) > 20 for line in lines), flag


def test_spark_conf_merges_topology_then_command_line():
    from millwheel import MillwheelError
    from millwheel.runtime._cli import spark_conf

    p = cli.build_parser({})
    args = p.parse_args(
        [
            "run",
            "t.py",
            "--conf",
            "spark.sql.shuffle.partitions=3",
            "--conf",
            "spark.executor.memory=2g",
            "--packages",
            "org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0",
            "--jars",
            "/opt/a.jar",
        ]
    )
    t = Topology("t", spark_conf={"spark.executor.memory": "1g", "spark.task.cpus": 1})
    assert spark_conf(t, args) == {
        "spark.executor.memory": "2g",
        "spark.task.cpus": "1",
        "spark.sql.shuffle.partitions": "3",
        "spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0",
        "spark.jars": "/opt/a.jar",
    }
    with pytest.raises(MillwheelError, match="--conf takes KEY=VALUE"):
        spark_conf(t, p.parse_args(["run", "t.py", "--conf", "spark.executor.memory"]))


@pytest.mark.parametrize("command", COMMANDS)
def test_every_default_is_in_the_help(command, monkeypatch):
    """An option that has a value unless given says what it is (``--intervals`` ... ``(default 16)``)."""
    parser = _parser_of(command, monkeypatch)
    unsaid = []
    for where, flag, action in _actions(parser, parser.prog):
        if (
            not action.option_strings
            or action.help in (None, argparse.SUPPRESS)
            or action.nargs == 0
        ):
            continue  # a positional argument, or a flag (store_true/false: off unless given)
        if (
            action.default not in (None, [], "")
            and "default" not in action.help
            and "%(default)" not in action.help
        ):
            unsaid.append(f"{where} {flag} (default {action.default!r}): {action.help!r}")
    assert unsaid == []


def _actions(parser, prog):
    """``(where, flags, action)`` of every option of ``parser`` and of its subcommands."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{prog} {name}")
            continue
        yield prog, ", ".join(action.option_strings) or action.dest, action


def test_rescale_help_says_arrow_mapped_computations_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["rescale", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Arrow mapping" in text and "refuse" in text
