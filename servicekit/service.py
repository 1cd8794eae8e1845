"""Running a service, and embedding one: what every millwheel service does around its app.

Both services (the watermark authority, the IdRegistry) and the next one share these:

* :class:`ServiceInfo` — who a service is: its name, module and command, where its secret is;
* :class:`ServeFlags` — what every ``serve`` command takes (:mod:`servicekit.cli` parses it);
* :func:`bind` — a listening socket on ``host:port``, with a message naming the fix when
  the port is taken; :func:`url_of` — its URL; :func:`listen` — both, and a warning when
  the secret would travel in plain HTTP beyond loopback;
* :func:`server_secret` — the secret a server checks, from ``--secret-file``, the
  environment or ``DATA_DIR/secret`` (generated with mode 0600 on the first start);
* :func:`run_app` — uvicorn on that socket, a banner and a ready file once it listens,
  exit 0 on SIGTERM;
* :class:`ServiceProcess` — a service started as a subprocess of this one
  (:meth:`ServiceProcess.start`: ``python -m MODULE serve``, waited for until its
  ``/healthz`` answers), killed or stopped at will, closing the clients it handed out;
  :func:`running` — one for a ``with`` block, in a temporary directory if none is given.

The client side (secret lookup, retries, error mapping) is :mod:`servicekit.client`.
Nothing here imports a web framework until :func:`run_app` runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from servicekit.errors import ConfigurationError
from servicekit.secret import Secret, load_secret

C = TypeVar("C")

#: default request body limit: 16 MiB (a report of 100k key intervals is about 4 MB)
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ServiceInfo:
    """Who a service is, for its messages, its secret, its subprocess and its command line.

    >>> info = ServiceInfo("id registry", "id_registry", "millwheel registry", "REG_URL", "REG_SECRET", "REG_SECRET_FILE")
    >>> info.the, info.serve_command
    ('the id registry', 'millwheel registry serve')
    """

    #: its name in messages, without an article ("watermark authority")
    name: str
    #: the module that runs it: ``python -m MODULE serve``
    module: str
    #: its command line ("millwheel authority")
    command: str
    #: the environment variable naming a running one (cluster runs)
    url_env: str
    #: the environment variable holding its secret, and the one naming a file that holds it
    secret_env: str
    secret_file_env: str
    #: the file in its data directory where its generated secret is kept
    secret_file_name: str = "secret"

    @property
    def the(self) -> str:
        return f"the {self.name}"

    @property
    def serve_command(self) -> str:
        return f"{self.command} serve"

    def secret_hint(self, who: str | None = None) -> str:
        """What a 401 says about where the secret comes from (``who``: the server's name in it)."""
        env, env_file = self.secret_env, self.secret_file_env
        return (
            f"{who or self.the} reads its secret from --secret-file, else ${env}, else ${env_file}, else DATA_DIR/{self.secret_file_name} "
            f"(generated on first start, mode 0600); clients take secret=..., ${env} or ${env_file}"
        )


@dataclass(frozen=True)
class ServeFlags:
    """What every service's ``serve`` takes, whatever else it takes (see :mod:`servicekit.cli`)."""

    #: where the service keeps its state and its generated secret
    data_dir: str
    host: str = "127.0.0.1"
    #: 0: any free port (the URL goes to ``ready_file``)
    port: int = 0
    secret_file: str | None = None
    #: other ``Host`` names it answers for, and other browser origins it lets call
    allow_hosts: Sequence[str] = ()
    allow_origins: Sequence[str] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: a file the service writes its URL to once it listens
    ready_file: str | None = None
    log_level: str = "warning"

    @property
    def tls(self) -> bool:
        return bool(self.ssl_certfile)

    def guard_options(self, sock: socket.socket) -> dict[str, Any]:
        """The keyword arguments of :meth:`servicekit.http.Guard.for_bind` for a service listening on ``sock``."""
        return {
            "bind_host": sock.getsockname()[0],
            "allow_hosts": self.allow_hosts,
            "allow_origins": self.allow_origins,
            "max_body_bytes": self.max_body_bytes,
        }

    def run_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`run_app` these flags give."""
        return {
            "ready_file": self.ready_file,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "log_level": self.log_level,
        }


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
    """The URL a client uses to reach a service listening on ``sock``."""
    host, port = sock.getsockname()[:2]
    return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"


def server_secret(info: ServiceInfo, flags: ServeFlags) -> Secret | None:
    """The secret a server checks: ``--secret-file``, else ``$ENV``, else the file named by
    ``$ENV_FILE``, else ``DATA_DIR/SECRET_FILE_NAME`` (generated, mode 0600, on the first start).
    ``None``, after printing ``NAME: why`` to stderr, when it cannot be had (the server exits 2)."""
    default_file = os.path.join(flags.data_dir, info.secret_file_name)
    try:
        secret = load_secret(
            file=flags.secret_file,
            env=info.secret_env,
            env_file=info.secret_file_env,
            default_file=default_file,
            create=True,
        )
    except (ConfigurationError, OSError) as exc:
        print(f"{info.name}: {exc}", file=sys.stderr)
        return None
    if secret is None:  # pragma: no cover - create=True always yields one
        print(f"{info.name}: no secret", file=sys.stderr)
    return secret


def listen(info: ServiceInfo, flags: ServeFlags) -> tuple[socket.socket, str]:
    """A socket bound as ``flags`` say, and its URL. Says on stderr (``NAME: ...``) that the
    secret travels unencrypted if it listens beyond loopback without TLS."""
    name = info.name
    sock = bind(flags.host, flags.port)
    host = sock.getsockname()[0]
    if host not in ("127.0.0.1", "::1") and not flags.tls:
        print(
            f"{name}: listening on {host}, beyond loopback, in plain HTTP: the secret travels unencrypted; "
            "put TLS in front (a reverse proxy, or --ssl-certfile/--ssl-keyfile)",
            file=sys.stderr,
        )
    return sock, url_of(sock, tls=flags.tls)


def run_app(
    app: Any,
    sock: socket.socket,
    *,
    banner: Callable[[], str],
    ready_file: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    log_level: str = "warning",
    graceful_timeout: int = 5,
) -> None:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM (both mean "shut down cleanly, exit 0");
    print ``banner()`` and write the URL to ``ready_file`` once listening."""
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
            captured = getattr(
                self, "_captured_signals", None
            )  # SIGTERM means exit 0: uvicorn would re-raise it
            if isinstance(captured, list):
                captured.clear()

    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=graceful_timeout,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        server_header=False,
    )
    _Server(config).run(sockets=[sock])


@dataclass
class ServiceProcess:
    """A service running as a subprocess of this one (see :meth:`start`): ``.url``, ``.secret``,
    ``.pid``, ``.kill()`` (kill -9), ``.stop()``, ``.log()``. A service's own subclass adds
    ``client()``, built with :meth:`_client` so that its clients close when the service goes."""

    url: str
    process: subprocess.Popen[bytes]
    data_dir: str
    log_path: str
    #: the service's bearer secret
    secret: Secret | None = None
    #: what to close when the service goes (its clients)
    closing: list[Any] = field(default_factory=list, repr=False)

    @classmethod
    def start(
        cls,
        info: ServiceInfo,
        data_dir: str,
        *,
        log_name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
        unavailable: type[Exception] = RuntimeError,
    ) -> Self:
        """Start ``python -m MODULE serve`` (``info.module``) on ``data_dir`` and wait until
        ``/healthz`` answers.

        ``port=0`` lets the service pick a free port and report it back (through a ready
        file). The secret is ``DATA_DIR/secret`` (``info.secret_file_name``), generated
        (mode 0600) on the first start and reused after; the handle holds it. The output goes
        to ``DATA_DIR/LOG_NAME`` (default ``MODULE.log``). ``unavailable`` is the error raised
        when the service exits or stays unhealthy while starting, with the end of its log.
        """
        import httpx

        os.makedirs(data_dir, exist_ok=True)
        module, name = info.module, info.the
        secret_file = os.path.join(data_dir, info.secret_file_name)
        secret = load_secret(default_file=secret_file, create=True)
        ready_file = os.path.join(data_dir, f"ready-{os.getpid()}-{time.monotonic_ns()}.url")
        log_path = os.path.join(data_dir, log_name or f"{module.replace('_', '-')}.log")
        cmd = [
            sys.executable,
            "-m",
            module,
            "serve",
            "--host",
            host,
            "--port",
            str(port),
            "--data-dir",
            data_dir,
            "--ready-file",
            ready_file,
            "--secret-file",
            secret_file,
            *extra_args,
        ]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        handle = cls("", process, data_dir, log_path, secret)
        deadline = time.monotonic() + startup_timeout
        try:
            while not handle.url:
                if process.poll() is not None:
                    msg = f"{name} exited with code {process.returncode} while starting:\n{handle.log()[-2000:]}"
                    raise unavailable(msg)
                with (
                    contextlib.suppress(OSError, httpx.HTTPError),
                    open(ready_file, encoding="utf-8") as f,
                ):
                    url = f.read().strip()
                    if url and httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                        handle.url = url
                        break
                if time.monotonic() > deadline:
                    msg = f"{name} did not become healthy within {startup_timeout}s:\n{handle.log()[-2000:]}"
                    raise unavailable(msg)
                time.sleep(0.02)
        except BaseException:
            handle.stop(timeout=2.0)
            raise
        finally:
            with contextlib.suppress(OSError):
                os.unlink(ready_file)
        return handle

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

    def http(self, *, with_secret: bool = True, timeout: float = 10.0) -> Any:
        """A raw ``httpx.Client`` of the service, with its secret (``Authorization: Bearer ...``)
        or, ``with_secret=False``, without: what anyone on the network has. The caller closes it."""
        import httpx

        headers = self.secret.header() if with_secret and self.secret is not None else {}
        return httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    def _client(self, cls: Callable[..., C], **options: Any) -> C:
        """``cls(self.url, secret=self.secret, **options)``, closed when the service stops."""
        options.setdefault("secret", self.secret)
        client = cls(self.url, **options)
        self.closing.append(client)
        return client

    def _close(self) -> None:
        while self.closing:
            self.closing.pop().close()


P = TypeVar("P", bound=ServiceProcess)


@contextlib.contextmanager
def running(
    start: Callable[[str], P], data_dir: str | None = None, *, temp_prefix: str = "service-"
) -> Iterator[P]:
    """``start(DATA_DIR)`` for the duration of a ``with`` block, stopped afterwards. With
    ``data_dir=None``, DATA_DIR is a new temporary directory, removed afterwards."""
    path = tempfile.mkdtemp(prefix=temp_prefix) if data_dir is None else data_dir
    try:
        service = start(path)
        try:
            yield service
        finally:
            service.stop()
    finally:
        if data_dir is None:
            shutil.rmtree(path, ignore_errors=True)
