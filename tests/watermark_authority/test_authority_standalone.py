"""The authority is a separate service: it loads nothing of the user API (``millwheel``)."""

from __future__ import annotations

import subprocess
import sys

import millwheel
import watermark_authority


def test_the_service_and_its_client_import_no_millwheel():
    code = (
        "import sys, watermark_authority, watermark_authority._server, watermark_authority.cli; "
        "print(sorted(m for m in sys.modules if m == 'millwheel' or m.startswith('millwheel.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_its_ends_of_time_are_the_user_apis():
    assert watermark_authority.MIN_TIMESTAMP == millwheel.MIN_TIMESTAMP == -(2**63)
    assert watermark_authority.MAX_TIMESTAMP == millwheel.MAX_TIMESTAMP == 2**63 - 1
