"""Photon on local Spark: one pipeline equals the batch join and the harness; two pipelines survive kill -9.

The two-pipeline test is the user's path: ``millwheel photon run --backend spark`` driver
processes with their own run directories, the real IdRegistry service, ``millwheel photon
verify`` and ``millwheel photon evaluate``. ``dc1`` kills itself with SIGKILL right after
its joiner's first micro-batch wrote its output, before the batch committed
(``MILLWHEEL_CRASH=Joiner:after_output:data``): its click ids are registered, its joined
clicks are not visible. ``dc2`` then runs with no operator action and gets a conflict for
each of those clicks; verification clears them and re-injects them into ``dc2``; ``dc1``
restarts, catches up and writes nothing twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topologies.photon import PhotonConfig, evaluate, read_run, run_spark
from topologies.photon.registry import RegistryFactory

pytestmark = pytest.mark.spark

SMALL_BATCHES = PhotonConfig(max_bytes_per_batch=20_000)


@pytest.mark.timeout(
    1800
)  # about 1 min alone on 2 cores; much longer on a machine shared with other Spark jobs
@pytest.mark.parametrize("mapping", ["default", "arrow"])
def test_a_spark_pipeline_equals_the_batch_join_and_the_harness(
    tmp_path, spark_sample, registry_service, mapping
):
    """On either mapping of the columnar joiner (``PhotonConfig.joiner_mapping``)."""
    import dataclasses

    from millwheel.runtime import RuntimeSettings
    from topologies.photon import replay

    factory = RegistryFactory(registry_service.url, str(Path(registry_service.data_dir) / "secret"))
    result = run_spark(
        spark_sample,
        tmp_path / "run",
        config=dataclasses.replace(SMALL_BATCHES, joiner_mapping=mapping),
        pipeline=f"single-{mapping}",  # one registry for both: each its own pipeline
        registry=factory,
        registry_url=registry_service.url,
        settings=RuntimeSettings(intervals=4, max_restarts=500),
        timeout_s=1700,
    )
    report = evaluate(result, spark_sample)
    assert report["ok"], report
    harness = replay(spark_sample, mode="batch", config=SMALL_BATCHES)
    assert sorted(json.dumps(j, sort_keys=True) for j in result.joined) == sorted(
        json.dumps(j, sort_keys=True) for j in harness.joined
    )
    assert sorted(u["click"]["click_id"] for u in result.unjoinable) == sorted(
        u["click"]["click_id"] for u in harness.unjoinable
    )
    assert (
        result.metrics["Joiner"]["once_committed"]
        == report["joined"]["expected"] + report["orphans"]["expected"]
    )


def _photon(*args: str) -> list[str]:
    return [sys.executable, "-m", "millwheel.cli", "photon", *args]


def _start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    e = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            env=e,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _kill_family(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)


def _wait(
    predicate,
    what: str,
    timeout: float,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(
                f"{what}: the driver exited with {proc.returncode}:\n{log.read_text()[-3000:] if log else ''}"
            )
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout}s:\n{log.read_text()[-3000:] if log else ''}")


def _drained(run: Path) -> bool:
    with contextlib.suppress(FileNotFoundError, ValueError):
        return bool(json.loads((run / "photon-status.json").read_text())["drained"])
    return False


@pytest.mark.timeout(
    7200
)  # three Spark driver starts: a few minutes alone, far longer on a loaded machine
def test_two_pipelines_one_registry_kill_9_verify_restart(tmp_path, spark_sample, registry_service):
    secret = str(Path(registry_service.data_dir) / "secret")
    # a loaded machine: Python workers that fail to connect back are retried from the checkpoint
    common = [
        "--backend",
        "spark",
        "--registry",
        registry_service.url,
        "--secret-file",
        secret,
        "--intervals",
        "2",
        "--max-restarts",
        "500",
    ]
    run_a, run_b = tmp_path / "dc1", tmp_path / "dc2"
    log_a, log_b = tmp_path / "dc1.log", tmp_path / "dc2.log"
    a = _start(
        _photon("run", str(spark_sample), "--checkpoint", str(run_a), "--pipeline", "dc1", *common),
        log_a,
        env={"MILLWHEEL_CRASH": "Joiner:after_output:data"},
    )
    b = None
    try:
        assert a.wait(1800) == -signal.SIGKILL, log_a.read_text()[-3000:]
        _kill_family(a)  # its JVM and Python workers
        lost = read_run(run_a)
        assert lost.joined == [] and lost.unjoinable == []  # registered, never visible
        b = _start(
            _photon(
                "run",
                str(spark_sample),
                "--checkpoint",
                str(run_b),
                "--pipeline",
                "dc2",
                "--follow",
                *common,
            ),
            log_b,
        )
        _wait(lambda: _drained(run_b), "dc2 drains", 1800, b, log_b)
        before = evaluate(read_run(run_b), spark_sample)
        assert before["duplicates_in_output"] == 0 and before["joined"]["missing"] > 0, (
            before
        )  # at most once: dc1 holds them
        out = subprocess.run(
            _photon("verify", str(run_a), str(run_b), "--secret-file", secret, "--json"),
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        report = json.loads(out.stdout)
        assert report["missing"] == report["recovered"] > 0 and report["reinjected_into"] == {
            str(run_b): report["recovered"]
        }, report
        assert report["in_flight"] == report["holder_not_given"] == report["duplicated"] == 0, (
            report
        )

        def healed():
            r = evaluate(read_run(run_b), spark_sample)
            return r if r["ok"] else None

        _wait(healed, "dc2 writes the re-injected clicks", 900, b, log_b)
        restarted = subprocess.run(
            _photon(
                "run", str(spark_sample), "--checkpoint", str(run_a), "--pipeline", "dc1", *common
            ),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert restarted.returncode == 0, restarted.stderr[-3000:]
        final = subprocess.run(
            _photon("evaluate", str(spark_sample), str(run_b), str(run_a), "--json"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert final.returncode == 0, final.stdout[-3000:]
        assert json.loads(final.stdout)["duplicates_in_output"] == 0
        assert (
            read_run(run_a).metrics["Joiner"]["once_conflicts"] > 0
        )  # dc1 tried again; the registry said no
        b.send_signal(signal.SIGTERM)  # dc2 stops cleanly
        assert b.wait(120) == 0, log_b.read_text()[-3000:]
    finally:
        for p in (a, b):
            if p is not None:
                _kill_family(p)


@pytest.mark.timeout(900)
def test_a_registry_outage_in_the_middle_of_a_run_is_waited_out_and_loses_nothing(
    tmp_path, spark_sample
):
    """kill -9 of the registry service once the pipeline has joined its roster, restarted on the same
    port and store once a batch's commit has waited on it for 5 s: the commits wait inside their
    batches (the wait on the run's wait board, which the live status shows) and the run finishes
    equal to the batch join. Before: the worker's call failed after its five quick retries, twice, and the run
    stopped ("failed twice with the same error, so it is not retried again")."""
    import threading

    from id_registry.client import start_registry
    from millwheel.runtime import RuntimeSettings
    from millwheel.waits import read_waits

    data_dir = str(tmp_path / "registry")
    svc = start_registry(data_dir)
    port = int(svc.url.rsplit(":", 1)[1])
    run = tmp_path / "run"
    seen: list[str] = []
    services = [svc]

    def outage() -> None:
        while not (
            run / "photon.json"
        ).exists():  # the roster took the directory: the run has started
            time.sleep(0.1)
        services[0].kill()
        # down until a batch's commit is seen waiting on the board, and 5 s more (at most 5 min)
        until = time.monotonic() + 300
        while time.monotonic() < until:
            seen.extend(w.text() for w in read_waits(run / "waits"))
            if seen:
                until = min(until, time.monotonic() + 5)
            time.sleep(0.2)
        services.append(start_registry(data_dir, port=port))

    t = threading.Thread(target=outage, daemon=True)
    t.start()
    try:
        factory = RegistryFactory(
            svc.url, str(Path(data_dir) / "secret"), patience_s=120, waits=str(run / "waits")
        )
        logged: list[str] = []
        result = run_spark(
            spark_sample,
            run,
            config=SMALL_BATCHES,
            pipeline="single",
            registry=factory,
            registry_url=svc.url,
            settings=RuntimeSettings(intervals=2, max_restarts=20),
            timeout_s=800,
            log=logged.append,
        )
        t.join(30)
    finally:
        for s in services:
            s.stop()
    assert len(services) == 2  # the outage happened, and the run outlived it
    assert not [m for m in logged if "registry" in m.lower()], (
        logged
    )  # no query failed on it (none was restarted for it)
    report = evaluate(result, spark_sample)
    assert report["ok"], report
    assert any(f"waiting on the id registry at {svc.url} since" in text for text in seen), seen[:3]
    assert read_waits(run / "waits") == []
