"""``millwheel photon generate|run|verify|evaluate`` (topologies/photon/cli.py) through the ``millwheel`` command."""

from __future__ import annotations

import json

from millwheel.cli import main as millwheel_main


def test_generate_then_run_on_the_harness_then_evaluate(tmp_path, capsys):
    data = tmp_path / "sample"
    assert millwheel_main(["photon", "generate", str(data), "--duration-s", "8", "--rate", "80", "--seed", "4"]) == 0
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
    assert millwheel_main(["photon", "run", str(data), "--mode", "batch", "--retention-ms", "1", "--query-lateness-ms", "0", "--log-store", "false"]) == 0
    out = capsys.readouterr().out
    assert "all checks: FAIL" in out


def test_evaluate_and_verify_report_errors_clearly(tmp_path, capsys):
    assert millwheel_main(["photon", "verify", str(tmp_path / "nowhere"), "--registry", "http://127.0.0.1:9"]) == 2
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
    code = millwheel_main(["photon", "verify", str(tmp_path / "dc1"), str(tmp_path / "dc2"), "--secret-file", secret, "--json", "--dry-run"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["clicks"] > 0 and report["in_output"] == report["missing"] == 0 and report["dry_run"]


def test_a_second_driver_on_a_running_pipelines_directory_is_refused(tmp_path, capsys, sample):
    from topologies.photon.drivers import run_lock

    run = tmp_path / "dc1"
    with run_lock(run):  # the pipeline runs (or is being verified)
        code = millwheel_main(["photon", "run", str(sample), "--backend", "spark", "--checkpoint", str(run), "--registry", "http://127.0.0.1:9"])
        code_with_dashboard = millwheel_main(["photon", "run", str(sample), "--backend", "spark", "--checkpoint", str(run), "--dashboard"])
    assert code == 2 and code_with_dashboard == 2
    err = capsys.readouterr().err
    assert err.count("is running, or being verified") == 2
    assert not (run / "authority").exists() and not (run / "registry").exists()  # refused before its services start


def test_a_spark_run_with_a_dashboard_prints_its_address_with_the_registry_panel(tmp_path, capsys, monkeypatch, sample, registry_service):
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
    code = millwheel_main(["photon", "run", str(sample), "--backend", "spark", "--checkpoint", str(run), "--registry", registry_service.url, "--secret-file", secret, "--dashboard"])
    assert code == 0
    err = capsys.readouterr().err
    m = re.search(r"lag dashboard, with the IdRegistry panel, at (http://127\.0\.0\.1:\d+)/#registry=(\S+)&registry_key=(\S+)", err)
    assert m, err
    assert handed["healthy"] and handed["url"] == m.group(1)  # the runtime reports to the authority whose dashboard is printed
    assert (run / "authority" / "secret").is_file()  # the run's own authority
    assert m.group(2) == registry_service.url and m.group(3) == registry_service.secret.read_key().reveal()
    assert registry_service.secret.reveal() not in err
    key = {"Authorization": f"Bearer {m.group(3)}"}
    assert httpx.get(f"{registry_service.url}/v1/stats", headers=key).status_code == 200
    assert httpx.post(f"{registry_service.url}/v1/lookup", json={"ids": ["a"]}, headers=key).status_code == 401

    assert millwheel_main(["photon", "run", str(sample), "--dashboard"]) == 2
    assert "--dashboard needs --backend spark" in capsys.readouterr().err
