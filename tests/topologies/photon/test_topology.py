"""The Photon topology (topologies/photon/topology.py): wiring, sources, ``millwheel run`` on the package."""

from __future__ import annotations

from pathlib import Path

import topologies.photon
from millwheel import LatePolicy, LogFileSource
from millwheel.cli import main as millwheel_main
from topologies.photon import PhotonConfig, build, make_sources


def test_one_joiner_reads_both_logs_keyed_by_query_id(sample):
    t = build(sample, reinject_dir=sample / "nowhere")
    assert t.order() == ["Joiner"] and sorted(t.injectors) == ["clicks", "queries", "reinjected"]
    spec = t.computations["Joiner"]
    assert (
        spec.options.late == LatePolicy.process()
    )  # delayed queries and re-injected clicks are late, and wanted
    from millwheel import Record

    assert spec.inputs["queries"](Record(None, {"query_id": "q1", "ts": 1}, 1, "q1")) == "q1"
    assert (
        spec.inputs["clicks"](Record(None, {"click_id": "c", "query_id": "q1", "ts": 1}, 1, "c"))
        == "q1"
    )


def test_the_sources_declare_the_delayed_primary_stream(sample):
    cfg = PhotonConfig(query_lateness_ms=12_345)
    src = make_sources(sample, cfg)
    assert all(isinstance(s, LogFileSource) for s in src.values())
    assert (
        src["queries"].read_options.lateness_ms == 12_345
        and src["clicks"].read_options.lateness_ms == 0
    )
    assert (
        src["queries"].read_options.id_field == "query_id"
        and src["clicks"].read_options.id_field == "click_id"
    )


def test_field_names_are_settings(tmp_path, query, click):
    from millwheel.testing import Harness
    from topologies.photon import join_topology

    cfg = PhotonConfig(
        query_id_field="qid",
        click_id_field="cid",
        click_query_field="ref",
        ts_field="t",
        log_store=False,
    )
    h = Harness(join_topology(cfg))
    from millwheel import Record

    h.inject("queries", [Record(None, {"qid": "q1", "t": 1_000, "ad": "x"}, 1_000, "q1")])
    h.inject("clicks", [Record(None, {"cid": "c1", "ref": "q1", "t": 1_100}, 1_100, "c1")])
    h.run()
    assert h.values("joined_clicks") == [
        {"qid": "q1", "ad": "x", "cid": "c1", "ref": "q1", "query_ts": 1_000, "click_ts": 1_100}
    ]


def test_millwheel_run_on_the_package_directory(sample, monkeypatch, capsys):
    monkeypatch.setenv("PHOTON_DATA", str(sample))
    package = Path(topologies.photon.__file__).parent
    assert millwheel_main(["run", "--backend", "harness", str(package)]) == 0
    out = capsys.readouterr().out
    assert "sink joined_clicks:" in out and "photon evaluation" in out and "all checks: PASS" in out
