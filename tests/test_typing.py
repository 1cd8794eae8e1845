"""mypy on the user API (style.md: strict tooling pays). Skipped where mypy is not installed."""

from __future__ import annotations

import pytest

api = pytest.importorskip("mypy.api")


def test_user_api_type_checks():
    stdout, stderr, status = api.run([
        "-p", "millwheel", "--exclude", "millwheel/runtime", "--follow-imports=silent",
        "--ignore-missing-imports", "--no-incremental", "--cache-dir=/dev/null",
    ])
    assert status == 0, stdout + stderr
