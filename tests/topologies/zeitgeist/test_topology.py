"""The Zeitgeist topology (topologies/zeitgeist/topology.py): wiring, source, ``on_finish``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import topologies.zeitgeist
from millwheel import DeadLetter, LatePolicy, LogFileSource, Record
from millwheel.cli import main as millwheel_main
from topologies.zeitgeist import build, evaluate, make_source, on_finish, render


def test_wiring_follows_fig_1(sample, config):
    t = build(sample, config=config)
    assert t.order() == ["WindowCounter", "ModelCalculator", "SpikeDetector", "DipDetector"]
    assert set(t.computations["SpikeDetector"].inputs) == {"queries", "window_models"}
    assert set(t.computations["DipDetector"].inputs) == {"window_models"}
    assert [s.stream for s in t.sinks.values()] == ["anomalies"]
    for spec in t.computations.values():
        assert (
            spec.options.late == LatePolicy.drop()
        )  # §4.5: Zeitgeist drops late data and counts it
        assert spec.options.dedup.slack_ms == config.dedup_slack_ms
    event = Record(None, {"id": "e1", "ts": 1, "query": "cat videos"}, 1, "e1")
    assert t.computations["WindowCounter"].inputs["queries"](event) == "cat videos"


def test_the_source_is_the_log_file_injector_of_the_samples_logs(sample):
    source = make_source(sample)
    assert isinstance(source, LogFileSource)
    assert source.path == str(sample / "logs") and source.options()["finite"] == "1"
    assert build(sample).injectors["queries"].source.path == source.path


def test_only_the_bundled_sample_run_gets_the_short_run_jvm_options(small, monkeypatch):
    # build() without a directory is the bundled sample (ZEITGEIST_DATA: its place, here the small one)
    monkeypatch.setenv("ZEITGEIST_DATA", str(small))
    assert build().spark_conf == topologies.zeitgeist.SAMPLE_SPARK_CONF
    assert "-XX:TieredStopAtLevel=1" in build().spark_conf["spark.driver.extraJavaOptions"]
    assert build(small).spark_conf == {} and build(source=make_source(small)).spark_conf == {}


def test_on_finish_renders_the_evaluation_of_the_runs_streams(sample, config, batch, truth):
    """What ``millwheel run`` prints: the streams' values, dead letters as typed DeadLetters."""
    streams = {
        "anomalies": batch.anomalies,
        "dead_letters": [DeadLetter(**d) for d in batch.dead_letters],
    }
    text = on_finish(build(sample, config=config), streams, batch.metrics)
    assert text == render(evaluate(dataclasses.replace(batch, elapsed_s=0.0), truth))
    assert "all accounted for: True" in text


def test_millwheel_run_on_the_package_directory(small, monkeypatch, capsys):
    """The README's main command on the harness, on the small sample instead of the default one."""
    monkeypatch.setenv("ZEITGEIST_DATA", str(small))
    package = Path(topologies.zeitgeist.__file__).parent
    assert millwheel_main(["run", "--backend", "harness", str(package)]) == 0
    out = capsys.readouterr().out
    assert "sink anomalies:" in out and "zeitgeist evaluation" in out
    assert (
        "dead letters: 6 (6 malformed lines, injected 6, all accounted for: True; other 0)" in out
    )
