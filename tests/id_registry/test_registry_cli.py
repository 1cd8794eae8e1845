"""``millwheel registry serve`` runs the service (loopback, a generated secret, fsync'd RocksDB);
``status``, ``stats``, ``dashboard-link``, ``gc`` and ``reshard`` talk to it; bad flags are refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from id_registry.cli import main
from servicekit.testing import start_serve


def start(tmp_path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``millwheel registry serve --port 0 ARGS`` through the ``millwheel`` command's entry point."""
    return start_serve(
        [sys.executable, "-m", "millwheel.cli", "registry", "serve"], tmp_path, *args, env=env
    )


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    return out


@pytest.mark.timeout(60)
def test_millwheel_registry_serve_runs_the_service(tmp_path, capsys):
    proc, url = start(tmp_path)
    try:
        assert url.startswith("http://127.0.0.1:")  # loopback by default
        assert httpx.get(f"{url}/healthz").json() == {"ok": True}
        assert httpx.post(f"{url}/v1/commit", json={"items": [["a", "t", 1]]}).status_code == 401
        secret_file = (
            tmp_path / "d" / "secret"
        )  # generated on the first start, readable by its owner only
        assert secret_file.stat().st_mode & 0o777 == 0o600
        auth = {"Authorization": f"Bearer {secret_file.read_text().strip()}"}
        assert httpx.post(
            f"{url}/v1/commit", json={"items": [["a", "t", 1]]}, headers=auth
        ).json() == {"results": [["committed", None]]}
        data_dir = str(tmp_path / "d")
        assert main(["gc", "--url", url, "--data-dir", data_dir, "--boundary-ms", "2"]) == 0
        assert json.loads(capsys.readouterr().out) == {"boundary_ms": 2, "deleted": 1}
        assert main(["gc", "--url", url, "--data-dir", data_dir, "--boundary-ms", "1"]) == 2
        assert "only moves forward" in capsys.readouterr().err
        far = int(time.time() * 1000) + 3_600_000
        assert (
            main(
                [
                    "reshard",
                    "--url",
                    url,
                    "--data-dir",
                    data_dir,
                    "--effective-from-ms",
                    str(far),
                    "--shards",
                    "32",
                ]
            )
            == 0
        )
        assert json.loads(capsys.readouterr().out)["shards"][-1] == [far, 32]
        assert main(["status", "--url", url]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["backend"] == {
            "kind": "rocksdb",
            "durable_writes": status["backend"]["durable_writes"],
            "sync": True,
            "estimated_keys": status["backend"]["estimated_keys"],
        }
        assert status["gc_boundary_ms"] == 2 and status["stats"]["committed"] == 1
        assert main(["stats", "--url", url, "--data-dir", data_dir, "--seconds", "5"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["totals"]["committed"] == 1 and len(stats["history"]["t"]) == 5
        assert main(["stats", "--url", url]) == 2  # no secret at hand: refused, by name
        assert "needs the id registry's secret or its read key" in capsys.readouterr().err
        assert (
            main(
                [
                    "dashboard-link",
                    "--url",
                    url,
                    "--data-dir",
                    data_dir,
                    "--authority",
                    "http://127.0.0.1:7300",
                ]
            )
            == 0
        )
        link = capsys.readouterr().out.strip()
        assert link.startswith(f"http://127.0.0.1:7300/#registry={url}&registry_key=")
        key = link.rsplit("registry_key=", 1)[1]
        assert (
            key not in auth["Authorization"]
            and httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )
    finally:
        out = stop(proc)
    assert "id registry listening on http://127.0.0.1:" in out and "rocksdb store" in out
    assert secret_file.read_text().strip() not in out  # never printed


@pytest.mark.timeout(60)
def test_the_secret_can_come_from_the_environment(tmp_path):
    secret = "from-the-environment-0123456789"
    proc, url = start(tmp_path, env={"MILLWHEEL_REGISTRY_SECRET": secret})
    try:
        r = httpx.post(
            f"{url}/v1/lookup", json={"ids": ["a"]}, headers={"Authorization": f"Bearer {secret}"}
        )
        assert r.status_code == 200, r.text
        assert not (tmp_path / "d" / "secret").exists()
    finally:
        out = stop(proc)
    assert "secret from $MILLWHEEL_REGISTRY_SECRET" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "70000"], "--port must be in 0..65535"),
        (["--backend", "etcd"], "--backend etcd needs --etcd-endpoint URL"),
        (["--max-inflight-items", "0"], "--max-inflight-items must be at least 1"),
        (["--ssl-certfile", "x.pem"], "--ssl-certfile and --ssl-keyfile go together"),
    ],
)
def test_bad_flags_are_refused_by_name(args, says, capsys):
    assert main(["serve", *args]) == 2
    assert says in capsys.readouterr().err


def test_the_command_is_registered_with_millwheel():
    out = subprocess.run(
        [sys.executable, "-m", "millwheel.cli", "registry", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "serve" in out.stdout and "reshard" in out.stdout
    assert (
        main.__doc__ and "IdRegistry" in main.__doc__.splitlines()[0]
    )  # what `millwheel --help` shows


def test_status_of_nothing_says_so(capsys):
    assert main(["status", "--url", "http://127.0.0.1:9"]) == 2
    assert "unreachable" in capsys.readouterr().err
