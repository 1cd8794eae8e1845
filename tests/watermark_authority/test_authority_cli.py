"""``millwheel authority serve`` runs the service; ``millwheel authority watermarks`` reads it."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys

import httpx
import pytest

from servicekit.testing import start_serve
from watermark_authority.cli import main


def start(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    """``millwheel authority serve --port 0 ARGS`` on ``tmp_path/d``; returns the process and its URL."""
    return start_serve(
        [sys.executable, "-m", "millwheel.cli", "authority", "serve"], tmp_path, *args
    )


@pytest.mark.timeout(60)
def test_millwheel_authority_serve_runs_the_service(tmp_path):
    proc, url = start(tmp_path)
    try:
        assert url.startswith("http://127.0.0.1:")  # loopback by default
        assert httpx.get(f"{url}/healthz").json() == {"ok": True}
        report = {"injector": "logs", "process": "p0", "low_watermark": 42}
        assert (
            httpx.post(f"{url}/v1/injectors/report", json=report).status_code == 401
        )  # writes need the secret
        secret_file = (
            tmp_path / "d" / "secret"
        )  # generated on the first start, readable by its owner only
        assert secret_file.stat().st_mode & 0o777 == 0o600
        headers = {"Authorization": f"Bearer {secret_file.read_text().strip()}"}
        assert (
            httpx.post(f"{url}/v1/injectors/report", json=report, headers=headers).status_code
            == 200
        )
        out = subprocess.run(
            [sys.executable, "-m", "millwheel.cli", "authority", "watermarks", "--url", url],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0 and out.stdout.strip() == "logs=42"  # reading needs no secret
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0
    out = proc.stdout.read()
    assert (
        "listening on http://127.0.0.1:" in out
        and f"secret from the file {tmp_path / 'd' / 'secret'}" in out
    )
    assert secret_file.read_text().strip() not in out  # the secret is never printed


@pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl command to make a certificate"
)
@pytest.mark.timeout(60)
def test_serve_https_and_answer_for_an_allowed_host_name(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    proc, url = start(
        tmp_path,
        "--ssl-certfile",
        str(cert),
        "--ssl-keyfile",
        str(key),
        "--allow-host",
        "authority.example",
    )
    try:
        assert url.startswith("https://127.0.0.1:")
        with httpx.Client(
            base_url=url, verify=ssl.create_default_context(cafile=str(cert)), timeout=10
        ) as https:
            assert https.get("/healthz").json() == {"ok": True}
            assert (
                https.get("/v1/watermarks", headers={"Host": "authority.example"}).status_code
                == 200
            )
            assert https.get("/v1/watermarks", headers={"Host": "other.example"}).status_code == 421
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
            httpx.get(url.replace("https://", "http://") + "/healthz", timeout=5)
    finally:
        proc.terminate()
        proc.wait(10)
    assert "beyond loopback" not in proc.stdout.read()


@pytest.mark.timeout(60)
def test_the_dashboard_may_read_loopback_services_and_the_origins_given(tmp_path):
    """Its page's Content-Security-Policy: ``connect-src`` is this origin, loopback (an IdRegistry's
    /v1/stats for the registry panel) and ``--dashboard-source`` origins; nothing else."""
    proc, url = start(tmp_path, "--dashboard-source", "https://Registry.example.com:7310/")
    try:
        csp = dict(
            d.strip().split(" ", 1)
            for d in httpx.get(f"{url}/").headers["content-security-policy"].split(";")
        )
    finally:
        proc.terminate()
        proc.wait(10)
    connect = csp["connect-src"].split()
    assert connect == [
        "'self'",
        "http://127.0.0.1:*",
        "http://localhost:*",
        "https://127.0.0.1:*",
        "https://localhost:*",
        "https://registry.example.com:7310",
    ]
    assert csp["default-src"] == "'self'" and csp["frame-ancestors"] == "'none'"


def test_a_second_service_on_the_same_data_dir_is_refused(service, capsys):
    assert main(["serve", "--port", "0", "--data-dir", service.data_dir]) == 2
    assert "is another authority using this --data-dir" in capsys.readouterr().err


def test_a_bad_secret_file_stops_the_service_with_a_reason(tmp_path, capsys):
    weak = tmp_path / "weak"
    weak.write_text("short\n")
    weak.chmod(0o600)
    assert (
        main(
            ["serve", "--port", "0", "--data-dir", str(tmp_path / "d"), "--secret-file", str(weak)]
        )
        == 2
    )
    assert "is 5 characters; use at least 16" in capsys.readouterr().err
    assert (
        main(
            [
                "serve",
                "--port",
                "0",
                "--data-dir",
                str(tmp_path / "d"),
                "--secret-file",
                str(tmp_path / "missing"),
            ]
        )
        == 2
    )
    assert (
        "cannot read the secret from the file given with --secret-file" in capsys.readouterr().err
    )


def test_bad_arguments(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must be in 0..65535" in capsys.readouterr().err
    assert main(["serve", "--ssl-certfile", "cert.pem"]) == 2
    assert "--ssl-certfile and --ssl-keyfile go together" in capsys.readouterr().err
    assert main(["serve", "--max-body-bytes", "10"]) == 2
    assert "--max-body-bytes must be at least 1024" in capsys.readouterr().err
    for bad in (
        "https://a.example; script-src *",
        "*",
        "javascript:x",
        "https://a.example/path",
        "http://[::1]:7310",
    ):
        assert main(["serve", "--dashboard-source", bad]) == 2, bad
        assert (
            "--dashboard-source takes an origin such as https://registry.example.com:7310"
            in capsys.readouterr().err
        )
    with pytest.raises(SystemExit):
        main(["bogus"])
    assert main(["watermarks", "--url", "http://127.0.0.1:9"]) == 2
    assert "unreachable" in capsys.readouterr().err
