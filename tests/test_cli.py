"""The ``millwheel`` command: validate, graph, run --backend harness, topology loading, registered commands."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from millwheel import DEAD_LETTER_STREAM, DeadLetter, Record, SampleSource, Topology
from millwheel._runner import print_finish
from millwheel.cli import load_topology, main, registered_commands

TOPOLOGY = textwrap.dedent(
    """
    from dataclasses import dataclass

    from millwheel import Computation, Record, SampleSource, Topology


    @dataclass(frozen=True)
    class Settings:  # a dataclass in a topology module needs it registered in sys.modules
        factor: int = 2


    class Double(Computation):
        def process_record(self, record):
            self.produce("doubled", record.value * Settings().factor)


    topology = Topology("cli_demo")
    topology.injector("numbers", SampleSource([Record("k", i, i * 10, f"n{i}") for i in range(5)]))
    topology.computation(Double, inputs=["numbers"], outputs=["doubled"])
    topology.sink("doubled")
    """
)


@pytest.fixture
def topology_file(tmp_path):
    path = tmp_path / "demo_topology.py"
    path.write_text(TOPOLOGY)
    return path


def test_load_topology_with_a_dataclass(topology_file):
    assert load_topology(str(topology_file)).name == "cli_demo"


def test_validate_and_graph(topology_file, capsys):
    assert main(["validate", str(topology_file)]) == 0
    assert "is valid: 1 injectors, 1 computations, 1 sinks" in capsys.readouterr().out
    assert main(["graph", str(topology_file)]) == 0
    assert "computation Double (Double): [numbers] -> [doubled]" in capsys.readouterr().out
    assert main(["graph", "--dot", str(topology_file)]) == 0
    dot = capsys.readouterr().out
    assert (
        dot.startswith('digraph "cli_demo"') and '"numbers" -> "Double" [label="numbers"];' in dot
    )


def test_run_in_the_harness(topology_file, capsys):
    assert main(["run", "--backend", "harness", str(topology_file)]) == 0
    out = capsys.readouterr().out
    assert "sink doubled: 5 records" in out


def test_clear_errors(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.py")]) == 2
    assert "no topology file or package" in capsys.readouterr().err
    assert main(["validate", str(tmp_path)]) == 2
    assert "a directory without __init__.py" in capsys.readouterr().err
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert main(["validate", str(empty)]) == 2
    assert "define `topology = Topology(...)`" in capsys.readouterr().err


def _package(root, name, wiring):
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .wiring import topology\n")
    (pkg / "wiring.py").write_text(textwrap.dedent(wiring))
    return pkg


def test_a_package_directory_is_a_topology_module_with_relative_imports(tmp_path, capsys):
    """``millwheel run topologies/zeitgeist``: the package's ``__init__.py``, its submodules relative to it."""
    one = _package(tmp_path, "demo", TOPOLOGY)
    assert load_topology(str(one)).name == "cli_demo"
    assert main(["validate", str(one) + ".py"]) == 2
    assert f"did you mean the package {str(one)!r}?" in capsys.readouterr().err
    assert main(["run", "--backend", "harness", str(one)]) == 0
    assert "sink doubled: 5 records" in capsys.readouterr().out
    # another package of the same name gets its own submodules, not the first one's
    (tmp_path / "other").mkdir()
    two = _package(
        tmp_path / "other",
        "demo",
        "from millwheel import Topology\ntopology = Topology('second')\n",
    )
    assert load_topology(str(two)).name == "second"


def test_a_package_with_a_topology_submodule_and_build(tmp_path):
    """Like ``topologies/zeitgeist``: ``topology`` names the submodule topology.py, ``build()`` the topology."""
    pkg = tmp_path / "built"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .topology import build\n")
    (pkg / "topology.py").write_text(
        "from millwheel import Topology\n\ndef build():\n    return Topology('built')\n"
    )
    assert load_topology(str(pkg)).name == "built"


def test_print_finish_names_each_dead_letters_stage_and_reason(capsys):
    t = Topology("t")
    t.injector("numbers", SampleSource([]))
    malformed = DeadLetter(
        "malformed_line",
        "broken JSON: oops",
        injector="numbers",
        stream="numbers",
        file="q_1.jsonl",
        offset=40,
    )
    failed = DeadLetter(
        "process_record", "KeyError: 'query'", computation="Counter", stream="numbers"
    )
    letters = [
        Record(None, v, 0, f"d{i}", DEAD_LETTER_STREAM)
        for i, v in enumerate([malformed, failed, "not a DeadLetter"])
    ]
    print_finish(t, lambda stream: [], letters, {})
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "  dead letters: 3",
        "    malformed_line (numbers q_1.jsonl@40): broken JSON: oops",
        "    process_record (Counter): KeyError: 'query'",
        "    'not a DeadLetter'",
    ]


def test_registered_commands_are_listed_and_delegated(monkeypatch, capsys):
    """Packages add commands through entry points (group ``millwheel.commands``); built-in names stay."""
    calls = []
    fake = {
        "hello": EntryPoint("hello", "tests_fake:main", "millwheel.commands"),
        "run": EntryPoint("run", "tests_fake:main", "millwheel.commands"),
    }

    def load(ep):
        def command(argv):
            """Say hello."""
            calls.append((ep.name, argv))
            return 7

        return command

    monkeypatch.setattr(
        "millwheel.cli.entry_points",
        lambda group: [ep for ep in fake.values() if group == "millwheel.commands"],
    )
    monkeypatch.setattr(EntryPoint, "load", load)
    assert set(registered_commands()) == {"hello"}
    assert main(["hello", "--x", "1"]) == 7 and calls == [("hello", ["--x", "1"])]
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "Say hello." in capsys.readouterr().out


def test_the_installed_zeitgeist_command_is_registered(capsys):
    assert registered_commands()["zeitgeist"].value == "topologies.zeitgeist.cli:main"
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    assert (
        "zeitgeist" in help_text and "Zeitgeist sample data: generate, run, evaluate." in help_text
    )


def test_the_command_imports_no_topology():
    code = "import sys, millwheel.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'topologies'))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_run_says_how_many_records_were_late_and_the_lateness_that_keeps_them(
    late_log_topology, capsys, monkeypatch
):
    path, _ = late_log_topology
    assert main(["run", "--backend", "harness", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: Count: 30 records late (5.00% of 600), 30 dropped; injector logs read records up to 3.0s out of order "
        "(events-2026-01-01T10-00-30.jsonl): LogFileSource(lateness_ms=3000) would have kept them"
    ) in out
    monkeypatch.setenv("LATENESS_MS", "3000")
    assert main(["run", "--backend", "harness", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "late=0" in out and "records late" not in out and "lw=+inf (done)" in out
    )  # one spelling of "finished"


def test_the_harness_refuses_the_spark_backends_options(topology_file, tmp_path, capsys):
    """``--backend harness --checkpoint DIR`` would write nothing there and resume nothing
    from it: refused, naming each Spark option given, before anything runs."""
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--backend",
                "harness",
                "--checkpoint",
                str(run_dir),
                "--intervals",
                "4",
                str(topology_file),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "--checkpoint, --intervals: options of the Spark backend" in err
        and "keeps no run directory" in err
    ), err
    assert not run_dir.exists()
    assert main(["run", "--backend", "harness", "--master", "local[2]", str(topology_file)]) == 2
    assert "--master: option of the Spark backend" in capsys.readouterr().err
    # what the harness does anyway is no contradiction: it reads every input to its end, shows no live status
    assert (
        main(["run", "--backend", "harness", "--until-drained", "--quiet", str(topology_file)]) == 0
    )


def test_the_harness_summary_counts_records_without_an_id_and_rows_past_end_ms(tmp_path, capsys):
    """Lines without an id field get ``<file>:<offset>`` as id, so a copy of one delivered
    again is no duplicate: the summary counts them per injector and says what it means;
    a ``SparkSource``'s rows at or after ``end_ms`` are said too."""
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        '{"id": "a", "ts": 1000, "q": "x"}',
        '{"ts": 2000, "q": "x"}',
        '{"ts": 2000, "q": "x"}',
        '{"id": "b", "ts": 3000, "q": "y"}',
    ]
    (logs / "part-0001.jsonl").write_text("\n".join(lines) + "\n")
    path = tmp_path / "edges.py"
    path.write_text(
        textwrap.dedent(
            f"""
        from millwheel import Computation, LogFileSource, SparkSource, Topology

        class Count(Computation):
            def process_record(self, record):
                self.state.set((self.state.get(0) or 0) + 1)

        topology = Topology("edges")
        topology.injector("logs", LogFileSource({str(logs)!r}, finite=True), stream="events")
        topology.injector("clicks", SparkSource(rows=[{{"q": "x", "ts": t}} for t in (1, 2, 5000, 6000)], timestamp="ts", end_ms=5000), stream="clicks")
        topology.computation(Count, inputs={{"events": lambda r: r.value["q"], "clicks": lambda r: r.value["q"]}})
        """
        )
    )
    assert main(["run", "--backend", "harness", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: injector logs: 2 records had no 'id' field and got their file and byte offset as id"
        in out
    ), out
    assert "is not recognised as a duplicate" in out
    assert (
        "injector clicks: 2 rows at or after its end_ms=5000 left out: not part of the input" in out
    ), out
    assert "in=       6" in out  # the two id-less copies both counted: what the warning says
