"""``millwheel authority serve`` runs the service; ``millwheel authority watermarks`` reads it."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from watermark_authority.cli import main


@pytest.mark.timeout(60)
def test_millwheel_authority_serve_runs_the_service(tmp_path):
    ready = tmp_path / "url"
    cmd = [sys.executable, "-m", "millwheel.cli", "authority", "serve", "--port", "0", "--data-dir", str(tmp_path / "d"), "--ready-file", str(ready)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.05)
        url = ready.read_text()
        assert url.startswith("http://127.0.0.1:")  # loopback by default
        assert httpx.get(f"{url}/healthz").json() == {"ok": True}
        report = {"injector": "logs", "process": "p0", "low_watermark": 42}
        assert httpx.post(f"{url}/v1/injectors/report", json=report).status_code == 401  # writes need the secret
        secret_file = tmp_path / "d" / "secret"  # generated on the first start, readable by its owner only
        assert secret_file.stat().st_mode & 0o777 == 0o600
        headers = {"Authorization": f"Bearer {secret_file.read_text().strip()}"}
        assert httpx.post(f"{url}/v1/injectors/report", json=report, headers=headers).status_code == 200
        out = subprocess.run([sys.executable, "-m", "millwheel.cli", "authority", "watermarks", "--url", url], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == "logs=42"
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0
    out = proc.stdout.read()
    assert "listening on http://127.0.0.1:" in out and "secret from the file given with --secret-file" not in out
    assert secret_file.read_text().strip() not in out  # the secret is never printed


def test_a_second_service_on_the_same_data_dir_is_refused(service, capsys):
    assert main(["serve", "--port", "0", "--data-dir", service.data_dir]) == 2
    assert "is another authority using this --data-dir" in capsys.readouterr().err


def test_bad_arguments(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must be in 0..65535" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bogus"])
    assert main(["watermarks", "--url", "http://127.0.0.1:9"]) == 2
    assert "unreachable" in capsys.readouterr().err
