"""``millwheel zeitgeist generate|run|evaluate`` (topologies/zeitgeist/cli.py)."""

from __future__ import annotations

import json

from millwheel.cli import main as millwheel_main
from topologies.zeitgeist.cli import main


def test_generate_and_evaluate_an_empty_output(tmp_path, capsys):
    d = tmp_path / "data"
    assert (
        main(
            [
                "generate",
                str(d),
                "--seed",
                "5",
                "--duration-s",
                "30",
                "--rate",
                "200",
                "--queries",
                "20",
                "--spikes",
                "0",
                "--dips",
                "0",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    (tmp_path / "anomalies.jsonl").write_text("")
    assert main(["evaluate", str(d), str(tmp_path / "anomalies.jsonl"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["anomalies"] == 0 and report["events"] == 0


def test_run_writes_what_evaluate_reads_back(small, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(small), "--mode", "batch", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "precision" in printed and "all accounted for: True" in printed
    assert (
        main(
            [
                "evaluate",
                str(small),
                str(out / "anomalies.jsonl"),
                "--metrics",
                str(out / "metrics.json"),
            ]
        )
        == 0
    )
    again = capsys.readouterr().out
    assert again.splitlines()[:8] == printed.splitlines()[:8]  # all but the run time


def test_registered_with_the_millwheel_command(tmp_path, capsys):
    """The entry point in pyproject.toml: ``millwheel zeitgeist ...`` reaches this CLI."""
    d = tmp_path / "data"
    assert (
        millwheel_main(
            [
                "zeitgeist",
                "generate",
                str(d),
                "--duration-s",
                "20",
                "--rate",
                "100",
                "--queries",
                "10",
                "--spikes",
                "0",
                "--dips",
                "0",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    assert (d / "ground_truth.json").is_file()
