"""Crash test of a columnar computation (``millwheel/_columnar.py``): ``tests/runtime/test_crash.py``'s two-stage
topology with ``ColumnarWindowCounter`` as its counter, over 100k records, through an injected
crash after the outbox is written, a kill -9 of the driver and one of a Python worker; the
final output equals the pandas answer, with no duplicate and no loss.
"""

from __future__ import annotations

import pytest

from .test_crash import SHORT_PACING, _crash_loop

pytestmark = pytest.mark.spark


@pytest.mark.slow  # ~90 s of Spark: the long form (-m slow), to keep CI under 25 minutes on 2 cores
def test_columnar_crash_short(tmp_path):
    plan = [
        ("inject:WindowCounter:after_output:data", None),
        ("driver", ("WindowCounter", 3)),
        ("worker", ("WindowCounter", 2)),
    ]
    kills = _crash_loop(
        tmp_path, plan, seed=26, extra=("--columnar",), pacing=SHORT_PACING, strict=True
    )
    assert kills == {"injected": 1, "driver": 1, "worker": 1}
