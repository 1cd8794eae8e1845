"""The CI fault campaign: >= 10 randomised faults of every class over 100k Zeitgeist-like records,
then the checker, which must find nothing (``docs/reliability.md``).

The seed is printed first (``MILLWHEEL_FAULT_SEED=<seed>`` reruns exactly that campaign:
the same input, the same faults in the same order at the same progress points). Faults:
kill -9 of the driver, of Spark's Python workers and of the watermark authority, a zombie
driver, a full disk, a wall clock that jumps an hour (see ``faults/campaign.py``).
"""

from __future__ import annotations

import pytest

from faults.campaign import CLASSES, Campaign
from faults.operate import OPERATIONS

pytestmark = pytest.mark.spark


# about 5 minutes on an idle 2-core machine; a driver start takes minutes when other Spark runs share it
@pytest.mark.timeout(3600)
def test_fault_campaign(tmp_path, fault_seed):
    result = Campaign(tmp_path, records=100_000, faults=10, seed=fault_seed).run()
    report = result.report
    print(result.line())
    print(report.text())
    assert report.clean, report.text()
    assert sum(result.faults.values()) >= 10, f"only {dict(result.faults)} landed before the run drained (seed {fault_seed})"
    landed = set(result.faults)
    missing = set(CLASSES) - landed - set(result.skipped)
    assert not missing, f"fault classes that never landed: {missing} (seed {fault_seed})"
    assert report.inputs >= 100_000 and report.outputs > 0


def _operations_campaign(tmp_path, seed, records, faults, classes):
    """An operator's actions (``faults/operate.py``: online rescales and layout changes, one
    killed -9 mid-request and finished as the docs say, a Ctrl-C restart), in the long form
    mixed with every fault class; the checker must find nothing."""
    # small injector batches: many micro-batches, so the operations (each waits for progress) land before the run drains
    result = Campaign(tmp_path, records=records, faults=faults, seed=seed, classes=classes, max_bytes=60_000).run()
    report = result.report
    print(result.line())
    print(report.text())
    assert report.clean, report.text()
    missing = set(OPERATIONS) - set(result.faults)
    assert not missing, f"operations that never landed: {missing} (seed {seed}): {dict(result.faults)}"
    assert report.inputs >= records and report.outputs > 0


@pytest.mark.timeout(3600)
def test_operations_campaign(tmp_path, fault_seed):
    _operations_campaign(tmp_path, fault_seed, records=80_000, faults=len(OPERATIONS), classes=OPERATIONS)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_operations_campaign_long(tmp_path, fault_seed):
    _operations_campaign(tmp_path, fault_seed, records=200_000, faults=20, classes=(*OPERATIONS, *CLASSES))
