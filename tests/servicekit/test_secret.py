"""servicekit.secret: where the secret comes from, constant-time comparison, never printed."""

from __future__ import annotations

import os
import stat

import pytest

from servicekit import (
    ConfigurationError,
    Secret,
    generate_secret,
    load_secret,
    read_secret_file,
    write_secret_file,
)

GOOD = "correct-horse-battery-staple-42"


def test_a_secret_never_prints_its_value():
    s = Secret(GOOD, source="a test")
    assert GOOD not in repr(s) and GOOD not in str(s) and GOOD not in f"{s!r} {s}"
    assert s.reveal() == GOOD and s.header() == {"Authorization": f"Bearer {GOOD}"}


def test_matches_only_the_exact_secret():
    s = Secret(GOOD, source="a test")
    assert s.matches(GOOD) and s.matches(GOOD.encode())
    for wrong in (None, "", GOOD[:-1], GOOD + "x", GOOD.upper(), "é" * 30):
        assert not s.matches(wrong)


@pytest.mark.parametrize(
    "value",
    [
        "short",
        "with spaces in the secret value",
        "tab\tseparated-secret-value",
        "ünïcode-is-not-ascii-here",
    ],
)
def test_weak_or_unsendable_secrets_are_refused(value):
    with pytest.raises(ConfigurationError, match="secret from a test"):
        Secret(value, source="a test")


def test_generated_secrets_are_long_and_distinct():
    made = {generate_secret() for _ in range(100)}
    assert len(made) == 100 and all(len(s) >= 40 for s in made)
    Secret(next(iter(made)), source="generated")


def test_the_sources_in_order(tmp_path):
    flag, env_file, default = tmp_path / "flag", tmp_path / "envfile", tmp_path / "data" / "secret"
    for path, value in [(flag, "f" * 20), (env_file, "e" * 20)]:
        path.write_text(value + "\n")
        path.chmod(0o600)
    environ = {"SVC_SECRET": "v" * 20, "SVC_SECRET_FILE": str(env_file)}
    kw = {"env": "SVC_SECRET", "env_file": "SVC_SECRET_FILE", "default_file": default}
    s = load_secret(file=flag, environ=environ, **kw)
    assert s is not None and s.reveal() == "f" * 20 and "--secret-file" in s.source
    s = load_secret(environ=environ, **kw)
    assert s is not None and s.reveal() == "v" * 20 and s.source == "$SVC_SECRET"
    s = load_secret(environ={"SVC_SECRET_FILE": str(env_file)}, **kw)
    assert s is not None and s.reveal() == "e" * 20 and "$SVC_SECRET_FILE" in s.source
    assert load_secret(environ={}, **kw) is None and not default.exists()  # no create: nothing
    created = load_secret(environ={}, create=True, **kw)
    assert created is not None and stat.S_IMODE(os.stat(default).st_mode) == 0o600
    again = load_secret(environ={}, create=True, **kw)
    assert again == created  # reused, not regenerated


def test_a_missing_or_empty_file_says_how_to_make_one(tmp_path):
    with pytest.raises(ConfigurationError, match="cannot read the secret from .*chmod 600"):
        read_secret_file(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(ConfigurationError, match="0 characters; use at least 16"):
        read_secret_file(empty)


def test_a_file_others_can_read_is_warned_about(tmp_path):
    path = tmp_path / "secret"
    path.write_text(GOOD)
    path.chmod(0o644)
    with pytest.warns(UserWarning, match="may be read by other users.*chmod 600"):
        read_secret_file(path)


def test_write_never_overwrites(tmp_path):
    path = tmp_path / "secret"
    write_secret_file(path, GOOD)
    with pytest.raises(FileExistsError):
        write_secret_file(path)
    assert read_secret_file(path).reveal() == GOOD


def test_the_read_key_is_derived_and_reveals_nothing_of_the_secret():
    import base64
    import hashlib
    import hmac

    s = Secret(GOOD, source="a test")
    key = s.read_key()
    expected = (
        base64.urlsafe_b64encode(
            hmac.new(GOOD.encode(), b"servicekit read key v1", hashlib.sha256).digest()
        )
        .rstrip(b"=")
        .decode()
    )
    assert (
        key.reveal() == expected and len(expected) == 43
    )  # pinned: a client computes the same key
    assert GOOD not in key.reveal() and key != s and not s.matches(key.reveal())
    assert key == Secret(GOOD, source="elsewhere").read_key()  # the same secret, the same key
    assert key != Secret(GOOD + "x", source="a test").read_key()  # a new secret, a new key
    assert repr(key) == "Secret(from the read key of the secret from a test)"
