"""The ``millwheel`` command: validate, graph, run --backend harness, topology loading."""

from __future__ import annotations

import textwrap

import pytest

from millwheel.cli import load_topology, main

TOPOLOGY = textwrap.dedent(
    '''
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
    '''
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
    assert dot.startswith('digraph "cli_demo"') and '"numbers" -> "Double" [label="numbers"];' in dot


def test_run_in_the_harness(topology_file, capsys):
    assert main(["run", "--backend", "harness", str(topology_file)]) == 0
    out = capsys.readouterr().out
    assert "sink doubled: 5 records" in out


def test_clear_errors(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.py")]) == 2
    assert "no topology file" in capsys.readouterr().err
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert main(["validate", str(empty)]) == 2
    assert "define `topology = Topology(...)`" in capsys.readouterr().err
