"""``millwheel photon generate|run|verify|evaluate`` (topologies/photon/cli.py) through the ``millwheel`` command."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from millwheel.cli import main as millwheel_main


def test_generate_then_run_on_the_harness_then_evaluate(tmp_path, capsys):
    data = tmp_path / "sample"
    assert (
        millwheel_main(
            ["photon", "generate", str(data), "--duration-s", "8", "--rate", "80", "--seed", "4"]
        )
        == 0
    )
    assert "wrote 640 queries" in capsys.readouterr().out
    for mode in ("batch", "continuous"):
        assert millwheel_main(["photon", "run", str(data), "--mode", mode]) == 0
        out = capsys.readouterr().out
        assert "exact match: True" in out and "all checks: PASS" in out
        assert ("latency click logged" in out) == (mode == "continuous")


def test_settings_are_options(tmp_path, capsys):
    data = tmp_path / "sample"
    millwheel_main(["photon", "generate", str(data), "--duration-s", "8", "--rate", "80"])
    capsys.readouterr()
    # a tiny retention and no log store: clicks that come after their query was evicted are lost to the
    # join, and the evaluation says so (it can fail)
    assert (
        millwheel_main(
            [
                "photon",
                "run",
                str(data),
                "--mode",
                "batch",
                "--retention-ms",
                "1",
                "--query-lateness-ms",
                "0",
                "--log-store",
                "false",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "all checks: FAIL" in out


def test_evaluate_and_verify_report_errors_clearly(tmp_path, capsys):
    assert (
        millwheel_main(
            ["photon", "verify", str(tmp_path / "nowhere"), "--registry", "http://127.0.0.1:9"]
        )
        == 2
    )
    assert "not a Photon run directory" in capsys.readouterr().err
    assert millwheel_main(["photon", "run", str(tmp_path), "--backend", "spark"]) == 2
    assert "--checkpoint" in capsys.readouterr().err


def test_verify_json_on_run_directories(tmp_path, capsys, spark_sample, registry_service):
    """A pipeline's run directory as ``verify`` reads it, without Spark: the manifest and no output yet."""
    from topologies.photon import PhotonConfig
    from topologies.photon.drivers import prepare_run

    secret = str(registry_service.data_dir) + "/secret"
    for name in ("dc1", "dc2"):
        prepare_run(tmp_path / name, spark_sample, PhotonConfig(), name, registry_service.url)
    code = millwheel_main(
        [
            "photon",
            "verify",
            str(tmp_path / "dc1"),
            str(tmp_path / "dc2"),
            "--secret-file",
            secret,
            "--json",
            "--dry-run",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert (
        report["clicks"] > 0 and report["in_output"] == report["missing"] == 0 and report["dry_run"]
    )


def test_a_shared_registry_needs_a_pipeline_name(tmp_path, capsys, sample):
    # before: two run directories left at the default name were one pipeline to the registry
    code = millwheel_main(
        [
            "photon",
            "run",
            str(sample),
            "--backend",
            "spark",
            "--checkpoint",
            str(tmp_path / "a"),
            "--registry",
            "http://127.0.0.1:9",
        ]
    )
    assert code == 2
    assert (
        "is shared between pipelines: name this one with --pipeline NAME" in capsys.readouterr().err
    )
    assert not (tmp_path / "a").exists()


def test_a_second_run_directory_under_a_name_another_holds_is_refused(tmp_path, sample):
    from millwheel._errors import MillwheelError
    from millwheel._once import MemoryOnceRegistry, join_roster
    from millwheel.runtime import RuntimeSettings, SparkRuntime
    from millwheel.runtime._runtime import pin_pipeline, where_of
    from topologies.photon import PhotonConfig
    from topologies.photon.topology import build

    shared = MemoryOnceRegistry()
    t = build(sample, config=PhotonConfig())
    settings = RuntimeSettings(pipeline="dc1", registry=lambda: shared)
    first = SparkRuntime(t, str(tmp_path / "a"), settings)
    first.root.mkdirs()
    join_roster(
        shared, *pin_pipeline(first.root, "dc1"), where_of(first.root)
    )  # what dc1's start does
    with pytest.raises(
        MillwheelError,
        match=r"pipeline name 'dc1' is held in this IdRegistry by the run directory .*/a ",
    ):
        SparkRuntime(t, str(tmp_path / "b"), settings).start()  # refused before Spark starts


def test_a_second_driver_on_a_running_pipelines_directory_is_refused(tmp_path, capsys, sample):
    from topologies.photon.drivers import run_lock

    run = tmp_path / "dc1"
    with run_lock(run):  # the pipeline runs (or is being verified)
        code = millwheel_main(
            [
                "photon",
                "run",
                str(sample),
                "--backend",
                "spark",
                "--checkpoint",
                str(run),
                "--registry",
                "http://127.0.0.1:9",
                "--pipeline",
                "dc1",
            ]
        )
        code_with_dashboard = millwheel_main(
            [
                "photon",
                "run",
                str(sample),
                "--backend",
                "spark",
                "--checkpoint",
                str(run),
                "--dashboard",
            ]
        )
    assert code == 2 and code_with_dashboard == 2
    err = capsys.readouterr().err
    assert err.count("is running, or being verified") == 2
    assert (
        not (run / "authority").exists() and not (run / "registry").exists()
    )  # refused before its services start


def test_a_spark_run_with_a_dashboard_prints_its_address_with_the_registry_panel(
    tmp_path, capsys, monkeypatch, sample, registry_service
):
    """``--dashboard``: an authority of the run's own, its dashboard's address with ``#registry=URL&registry_key=KEY``
    (KEY reads the registry's figures, nothing else). Spark itself is replaced: what is checked is what the
    command starts, prints and hands the runtime."""
    import re

    import httpx

    from topologies.photon import cli
    from topologies.photon.evaluation import RunResult

    handed: dict = {}

    def run_spark(data, root, **options):
        wm = options["watermarks"]
        handed.update(options, healthy=wm.healthy(), url=wm.url)
        return RunResult([], [], [], {})

    monkeypatch.setattr(cli, "run_spark", run_spark)
    secret = registry_service.data_dir + "/secret"
    run = tmp_path / "dc1"
    code = millwheel_main(
        [
            "photon",
            "run",
            str(sample),
            "--backend",
            "spark",
            "--checkpoint",
            str(run),
            "--registry",
            registry_service.url,
            "--pipeline",
            "dc1",
            "--secret-file",
            secret,
            "--dashboard",
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    m = re.search(
        r"lag dashboard, with the IdRegistry panel, at (http://127\.0\.0\.1:\d+)/#registry=(\S+)&registry_key=(\S+)",
        err,
    )
    assert m, err
    assert handed["healthy"] and handed["url"] == m.group(
        1
    )  # the runtime reports to the authority whose dashboard is printed
    assert (run / "authority" / "secret").is_file()  # the run's own authority
    assert (
        m.group(2) == registry_service.url
        and m.group(3) == registry_service.secret.read_key().reveal()
    )
    assert registry_service.secret.reveal() not in err
    key = {"Authorization": f"Bearer {m.group(3)}"}
    assert httpx.get(f"{registry_service.url}/v1/stats", headers=key).status_code == 200
    assert (
        httpx.post(
            f"{registry_service.url}/v1/lookup", json={"ids": ["a"]}, headers=key
        ).status_code
        == 401
    )

    assert millwheel_main(["photon", "run", str(sample), "--dashboard"]) == 2
    assert "--dashboard needs --backend spark" in capsys.readouterr().err


#: a user's logs, written by hand: a duplicate query and click, an orphan click, a click without a
#: query id, two malformed lines; file names carry a date, as rotated logs' do
USER_LOGS = {
    "queries/queries-2026-01-01.jsonl": [
        {"query_id": "q1", "ts": 1767225601000, "advertiser_id": "adv-1", "terms": ["tea"]},
        {"query_id": "q2", "ts": 1767225602000, "advertiser_id": "adv-2", "terms": ["chess"]},
        {"query_id": "q2", "ts": 1767225602000, "advertiser_id": "adv-2", "terms": ["chess"]},
        '{"query_id": "q3", "ts"',
    ],
    "queries/queries-2026-01-02.jsonl": [
        {"query_id": "q4", "ts": 1767312001000, "advertiser_id": "adv-1", "terms": ["tent"]}
    ],
    "clicks/clicks-2026-01-01.jsonl": [
        {"click_id": "c1", "query_id": "q1", "ts": 1767225601500, "ad_slot": 1},
        {"click_id": "c2", "query_id": "q2", "ts": 1767225603000, "ad_slot": 2},
        {"click_id": "c2", "query_id": "q2", "ts": 1767225603000, "ad_slot": 2},
        {"click_id": "c3", "query_id": "q-never-logged", "ts": 1767225604000, "ad_slot": 1},
        {"click_id": "c4", "ts": 1767225605000, "ad_slot": 1},
        "not json",
    ],
    "clicks/clicks-2026-01-02.jsonl": [
        {"click_id": "c5", "query_id": "q4", "ts": 1767312002000, "ad_slot": 3}
    ],
}


def _write_logs(root: Path, logs: dict) -> Path:
    for name, lines in logs.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(
            "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
        )
    return root


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for a directory)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


def test_a_run_on_a_users_logs_joins_them_writes_nothing_there_and_evaluates_against_their_batch_join(
    tmp_path, capsys, monkeypatch
):
    """``photon run DATA`` on a user's logs without ``ground_truth.json``
    generated the built-in sample into DATA (48,000 queries and ``_DONE`` markers beside the user's
    logs) and joined the mixture. Now it joins what is there and writes nothing there; ``evaluate``
    compares a run with a batch join of those logs, without a ground truth file."""
    from topologies.photon import cli, replay

    data = _write_logs(tmp_path / "logs", USER_LOGS)
    before = _tree(data)
    code = millwheel_main(
        ["photon", "run", str(data)]
    )  # the harness; --mode batch is the default on such logs
    assert _tree(data) == before
    assert code == 0
    out = capsys.readouterr().out
    assert (
        "joined 3 clicks" in out
        and "query files: 2, click files: 2" in out
        and "unjoinable: 1 (no_query: 1)" in out
    ), out
    assert "dead letters (malformed lines, clicks without a query id): 3" in out
    assert _tree(data) == before
    assert not [p for p in data.rglob("*") if p.name in ("ground_truth.json", "_DONE")]

    result = replay(
        data, mode="batch"
    )  # what a pipeline's run directory would hold (Spark: test below)
    monkeypatch.setattr(cli, "read_run", lambda run: result)
    assert millwheel_main(["photon", "evaluate", str(data), str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert (
        "3 output, 3 expected; missing 0, unexpected 0; exact match: True" in out
        and "all checks: PASS" in out
    ), out
    monkeypatch.setattr(
        cli, "read_run", lambda run: dataclasses.replace(result, joined=result.joined[1:])
    )
    assert millwheel_main(["photon", "evaluate", str(data), str(tmp_path / "run")]) == 1
    assert "missing 1" in capsys.readouterr().out
    assert _tree(data) == before

    assert (
        millwheel_main(["photon", "run", str(data), "--mode", "continuous"]) == 2
    )  # pacing needs a sample's record of its files
    assert "--mode batch" in capsys.readouterr().err
    assert _tree(data) == before


@pytest.mark.parametrize("layout", ["empty", "flat"])
def test_a_directory_not_laid_out_as_photon_reads_logs_is_refused_and_left_alone(
    tmp_path, capsys, layout
):
    """An empty directory, or logs not in ``queries/`` and ``clicks/``: a clear error, nothing generated there."""
    data = tmp_path / "logs"
    data.mkdir()
    if layout == "flat":
        _write_logs(data, {Path(name).name: lines for name, lines in USER_LOGS.items()})
    before = _tree(data)
    assert millwheel_main(["photon", "run", str(data)]) == 2
    err = capsys.readouterr().err
    assert (
        "has no queries/ and no clicks/ directory" in err
        and "DATA/queries/queries-2026-01-01.jsonl" in err
    )
    assert millwheel_main(["photon", "evaluate", str(data), str(tmp_path / "run")]) == 2
    assert "has no queries/" in capsys.readouterr().err
    assert _tree(data) == before


@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_a_spark_run_on_a_users_logs_writes_only_its_run_directory_and_evaluates_against_their_batch_join(
    tmp_path, capsys, registry_service
):
    """The same on Spark, the user's path: ``run DATA --backend spark --checkpoint RUN``, then ``evaluate DATA RUN``."""
    data = _write_logs(tmp_path / "logs", USER_LOGS)
    before = _tree(data)
    run = tmp_path / "run"
    secret = str(Path(registry_service.data_dir) / "secret")
    code = millwheel_main(
        [
            "photon",
            "run",
            str(data),
            "--backend",
            "spark",
            "--checkpoint",
            str(run),
            "--registry",
            registry_service.url,
            "--secret-file",
            secret,
            "--intervals",
            "2",
            "--pipeline",
            "mine",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "joined 3 clicks" in out and f"millwheel photon evaluate {data} {run}" in out, out
    assert _tree(data) == before
    assert millwheel_main(["photon", "evaluate", str(data), str(run)]) == 0
    assert "exact match: True" in capsys.readouterr().out
    assert _tree(data) == before


def test_every_photon_and_registry_option_is_in_the_docs_with_its_help():
    from id_registry.cli import _parser as registry_parser
    from millwheel.cli import options_reference
    from topologies.photon.cli import _parser as photon_parser

    docs = (Path(__file__).resolve().parents[3] / "docs" / "photon.md").read_text()
    lines = options_reference(photon_parser(), "millwheel photon") + options_reference(
        registry_parser(), "millwheel registry"
    )
    assert len(lines) > 100
    missing = [line for line in lines if line not in docs]
    assert missing == [], "docs/photon.md's command-line reference is out of date:\n" + "\n".join(
        missing
    )
    assert all(not line.endswith(": ") for line in lines)  # every option says what it does
