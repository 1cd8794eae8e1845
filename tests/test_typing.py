"""mypy over the whole package, the Spark runtime included: strict tooling pays. Skipped where mypy is not installed.

Incremental, with its cache in ``.mypy_cache`` at the repository's root: a second run checks
only what changed (under a second instead of three)."""

from __future__ import annotations

import pytest

api = pytest.importorskip("mypy.api")


def test_package_type_checks(request):
    cache = request.config.rootpath / ".mypy_cache"
    stdout, stderr, status = api.run(
        [
            "-p",
            "millwheel",
            "--follow-imports=silent",
            "--ignore-missing-imports",
            f"--cache-dir={cache}",
        ]
    )
    assert status == 0, stdout + stderr
