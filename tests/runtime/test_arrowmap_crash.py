"""Crash test of the Arrow mapping (``millwheel/runtime/plans/arrow.py``): ``tests/runtime/test_crash.py``'s
two-stage topology with ``ColumnarWindowCounter`` on ``ComputationOptions(mapping="arrow")`` as its
counter, through a kill after a batch's manifest is written and before Spark commits the batch
(the replay must read the previous version, not that manifest), a kill -9 of the driver and, in
the long form, of Python workers; the final output equals the pandas answer, with no
duplicate and no loss.
"""

from __future__ import annotations

import pytest

from .test_crash import SHORT_PACING, _crash_loop

pytestmark = pytest.mark.spark


def test_arrow_mapping_crash_short(tmp_path):
    # one SIGKILL, at the point only this mapping has; the long form kills by progress too
    plan = [("inject:WindowCounter:after_manifest:data", None)]
    kills = _crash_loop(tmp_path, plan, seed=31, extra=("--arrow",), records=20_000)
    assert kills["injected"] == 1


@pytest.mark.slow  # several minutes of Spark: the long form (-m slow)
def test_arrow_mapping_crash_long(tmp_path):
    # the injected kills first: each fires at the first batch with data of its process (and
    # needs a driver of its own); then each kill must land while input is left
    plan = [
        ("inject:WindowCounter:after_manifest:data", None),
        ("inject:WindowCounter:after_output:data", None),
        ("inject:WindowCounter:mid_publish:data", None),
        ("driver", ("WindowCounter", 1)),
        ("worker", ("WindowCounter", 1)),
        ("driver", ("Tally", 1)),
    ]
    kills = _crash_loop(
        tmp_path, plan, seed=32, extra=("--arrow",), pacing=SHORT_PACING, strict=True
    )
    assert kills == {"injected": 3, "driver": 2, "worker": 1}
