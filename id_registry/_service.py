"""What every millwheel service does around its app, with nothing registry-specific in it.

The watermark authority has its own copy of each piece (``watermark_authority/_server.py``
``_bind`` and ``serve``, ``watermark_authority/client.py`` ``EmbeddedAuthority``,
``start_authority``, ``client_secret``, ``_message``); this module is written to move into
``servicekit`` as it is, so that both services (and the next) share one:

* :func:`bind` — a listening socket on ``host:port`` with a message naming the fix;
* :func:`run_app` — uvicorn on that socket, a ready file once it listens, exit 0 on SIGTERM;
* :class:`ServiceProcess` and :func:`start_process` — a service started as a subprocess of
  this one (``python -m MODULE serve``), waited for until its ``/healthz`` answers, killed or
  stopped at will (tests, embedded use);
* :func:`client_secret` — the secret a client sends, from an argument, the environment or a
  data directory;
* :func:`error_message` — the ``message`` of a JSON error answer, or a short description.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servicekit import ConfigurationError, Secret, describe, load_secret


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (``port=0``: any free one), inheritable by uvicorn."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections (else Nagle and delayed ACKs add 40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        msg = f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port (0 for any free one)"
        raise SystemExit(msg) from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, *, tls: bool) -> str:
    host, port = sock.getsockname()[:2]
    return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"


def run_app(
    app: Any,
    sock: socket.socket,
    *,
    banner: Callable[[], str],
    ready_file: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM; print ``banner()`` and write the URL to
    ``ready_file`` once listening."""
    import uvicorn

    url = url_of(sock, tls=bool(ssl_certfile))

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(banner(), flush=True)
                if ready_file:
                    with open(f"{ready_file}.tmp", "w", encoding="utf-8") as f:
                        f.write(url)
                    os.replace(f"{ready_file}.tmp", ready_file)

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)  # SIGTERM means exit 0: uvicorn would re-raise it
            if isinstance(captured, list):
                captured.clear()

    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="on", timeout_graceful_shutdown=5,
        ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, server_header=False,
    )  # fmt: skip
    _Server(config).run(sockets=[sock])


@dataclass
class ServiceProcess:
    """A service running as a subprocess of this one (see :func:`start_process`)."""

    url: str
    process: subprocess.Popen[bytes]
    data_dir: str
    log_path: str
    #: the service's bearer secret
    secret: Secret | None = None
    #: what to close when the service goes (its clients)
    closing: list[Any] = field(default_factory=list, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """kill -9: no shutdown of any kind (for crash tests)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM), or kill after ``timeout`` seconds."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._close()

    def log(self) -> str:
        """The service's output so far."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _close(self) -> None:
        while self.closing:
            self.closing.pop().close()


def start_process(
    module: str,
    data_dir: str,
    *,
    name: str,
    secret_file_name: str = "secret",
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = 30.0,
    extra_args: Sequence[str] = (),
    unavailable: type[Exception] = RuntimeError,
) -> ServiceProcess:
    """Start ``python -m MODULE serve`` on ``data_dir`` and wait until ``/healthz`` answers.

    The secret is ``DATA_DIR/SECRET_FILE_NAME``, generated (mode 0600) on the first start; the
    handle holds it. ``name`` is the service's name in messages; ``unavailable`` the error
    raised when it exits or stays unhealthy while starting.
    """
    import httpx

    os.makedirs(data_dir, exist_ok=True)
    secret_file = os.path.join(data_dir, secret_file_name)
    secret = load_secret(default_file=secret_file, create=True)
    ready_file = os.path.join(data_dir, f"ready-{os.getpid()}-{time.monotonic_ns()}.url")
    log_path = os.path.join(data_dir, f"{module.replace('_', '-')}.log")
    cmd = [
        sys.executable, "-m", module, "serve", "--host", host, "--port", str(port),
        "--data-dir", data_dir, "--ready-file", ready_file, "--secret-file", secret_file, *extra_args,
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    handle = ServiceProcess("", process, data_dir, log_path, secret)
    deadline = time.monotonic() + startup_timeout
    try:
        while not handle.url:
            if process.poll() is not None:
                msg = f"the {name} exited with code {process.returncode} while starting:\n{handle.log()[-2000:]}"
                raise unavailable(msg)
            with contextlib.suppress(OSError, httpx.HTTPError), open(ready_file, encoding="utf-8") as f:
                url = f.read().strip()
                if url and httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                    handle.url = url
                    break
            if time.monotonic() > deadline:
                msg = f"the {name} did not become healthy within {startup_timeout}s:\n{handle.log()[-2000:]}"
                raise unavailable(msg)
            time.sleep(0.02)
    except BaseException:
        handle.stop(timeout=2.0)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(ready_file)
    return handle


def client_secret(
    secret: str | Secret | None,
    *,
    env: str,
    env_file: str,
    data_dir: str | None = None,
    secret_file_name: str = "secret",
    error: type[Exception] = ConfigurationError,
) -> Secret | None:
    """``secret``, else ``$ENV``, else the file named by ``$ENV_FILE``, else ``DATA_DIR/SECRET_FILE_NAME``
    if it exists; ``None`` if there is none. A bad secret raises ``error``."""
    if isinstance(secret, Secret):
        return secret
    if secret is not None:
        return Secret(secret, source="secret= of the client")
    default = os.path.join(data_dir, secret_file_name) if data_dir else None
    try:
        return load_secret(env=env, env_file=env_file, default_file=default)
    except ConfigurationError as exc:
        raise error(str(exc)) from None


def error_message(response: Any) -> str:
    """The ``message`` of a JSON error answer (cut to 500 characters), else a short description."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])[:500]
    return f"HTTP {response.status_code}: {describe(response.text, 200)}"
