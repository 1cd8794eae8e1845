"""The shared secret of a service: where it comes from, how it is compared, never printed.

A service has one secret; a client proves it holds it by sending
``Authorization: Bearer <secret>``. The service compares in constant time
(:func:`hmac.compare_digest`), so the time an answer takes says nothing about how much
of a guess was right. A :class:`Secret` prints as its *source* ("the file given with
--secret-file"), never as its value.

Sources, in the order :func:`load_secret` tries them:

1. a file named explicitly (``--secret-file PATH``);
2. an environment variable holding the secret itself (e.g. ``MILLWHEEL_AUTHORITY_SECRET``);
3. an environment variable naming a file (e.g. ``MILLWHEEL_AUTHORITY_SECRET_FILE``);
4. a default file (e.g. ``DATA_DIR/secret``), created with a fresh random secret and mode
   0600 if ``create=True`` and it does not exist.

>>> s = Secret("correct-horse-battery-staple", source="a test")
>>> s
Secret(from a test)
>>> s.matches("correct-horse-battery-staple"), s.matches("guess"), s.matches(None)
(True, False, False)
>>> s.read_key()                       # a read-only credential derived from it (see Secret.read_key)
Secret(from the read key of the secret from a test)
>>> Secret("short", source="a test")
Traceback (most recent call last):
...
servicekit.errors.ConfigurationError: the secret from a test is 5 characters; use at least 16 (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path

from servicekit.errors import ConfigurationError

#: a secret shorter than this is refused
MIN_SECRET_LENGTH = 16
_GENERATE_HINT = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
#: what a read key is derived for (changing it changes every service's read key)
_READ_KEY_LABEL = b"servicekit read key v1"


class Secret:
    """A bearer secret and a description of where it came from (for messages, not the value)."""

    __slots__ = ("_bytes", "_value", "source")

    def __init__(self, value: str, *, source: str) -> None:
        self.source = source
        if len(value) < MIN_SECRET_LENGTH:
            msg = f"the secret from {source} is {len(value)} characters; use at least {MIN_SECRET_LENGTH} (e.g. {_GENERATE_HINT})"
            raise ConfigurationError(msg)
        if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
            msg = f"the secret from {source} must be printable ASCII without spaces (it travels in an HTTP header); e.g. {_GENERATE_HINT}"
            raise ConfigurationError(msg)
        self._value = value
        self._bytes = value.encode("ascii")

    def matches(self, presented: str | bytes | None) -> bool:
        """True if ``presented`` is this secret; compared in constant time."""
        if presented is None:
            return False
        given = presented.encode("utf-8", "replace") if isinstance(presented, str) else presented
        return hmac.compare_digest(self._bytes, given)

    def reveal(self) -> str:
        """The secret itself: for a client's header or a child process, never for a log."""
        return self._value

    def read_key(self) -> Secret:
        """The read key of this secret: HMAC-SHA256 of a fixed label under it, URL-safe base64
        (43 characters). A guard accepts it in place of the secret for its keyed reads only
        (:attr:`servicekit.http.Guard.keyed_reads`: figures a browser page of another origin may
        read), never for a mutation; it reveals nothing of the secret, and a new secret gives a
        new read key."""
        digest = hmac.new(self._bytes, _READ_KEY_LABEL, hashlib.sha256).digest()
        return Secret(
            base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii"),
            source=f"the read key of the secret from {self.source}",
        )

    def header(self) -> dict[str, str]:
        """The ``Authorization`` header that proves a client holds this secret."""
        return {"Authorization": f"Bearer {self._value}"}

    def __repr__(self) -> str:
        return f"Secret(from {self.source})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._bytes, other._bytes)

    def __hash__(self) -> int:
        return hash(self._bytes)


def generate_secret() -> str:
    """A fresh random secret: 32 bytes from the operating system, URL-safe base64."""
    return secrets.token_urlsafe(32)


def read_secret_file(path: str | os.PathLike[str], *, source: str | None = None) -> Secret:
    """The secret in file ``path`` (surrounding whitespace ignored).

    Warns if other users may read the file; raises :class:`ConfigurationError` if it is
    missing, unreadable or empty.
    """
    where = source or f"the file {os.fspath(path)}"
    try:
        mode = os.stat(path).st_mode
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read the secret from {where} ({exc}); create it with e.g. {_GENERATE_HINT} > FILE; chmod 600 FILE"
        raise ConfigurationError(msg) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.warn(
            f"{where} may be read by other users (mode {stat.S_IMODE(mode):o}); chmod 600 it",
            stacklevel=2,
        )
    return Secret(text, source=where)


def write_secret_file(path: str | os.PathLike[str], value: str | None = None) -> Secret:
    """Create ``path`` (mode 0600, never overwriting) holding ``value`` or a fresh secret."""
    value = value if value is not None else generate_secret()
    secret = Secret(value, source=f"the file {os.fspath(path)}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(value + "\n")
    return secret


def load_secret(
    *,
    file: str | os.PathLike[str] | None = None,
    file_flag: str = "--secret-file",
    env: str | None = None,
    env_file: str | None = None,
    default_file: str | os.PathLike[str] | None = None,
    create: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Secret | None:
    """The first secret found among the sources in the module docstring, or ``None``.

    ``file_flag`` names the option that gave ``file`` (for messages). With ``create=True``
    a missing ``default_file`` is created with a fresh secret; if another process creates
    it at the same moment, its secret is read instead.
    """
    environ = os.environ if environ is None else environ
    if file is not None:
        return read_secret_file(file, source=f"the file given with {file_flag} ({os.fspath(file)})")
    if env and environ.get(env):
        return Secret(environ[env].strip(), source=f"${env}")
    if env_file and environ.get(env_file):
        return read_secret_file(
            environ[env_file], source=f"the file named by ${env_file} ({environ[env_file]})"
        )
    if default_file is None:
        return None
    if os.path.exists(default_file):
        return read_secret_file(default_file)
    if not create:
        return None
    try:
        return write_secret_file(default_file)
    except FileExistsError:
        return read_secret_file(default_file)
