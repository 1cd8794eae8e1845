"""The CI fault campaign: >= 10 randomised faults and operator actions, every class and
every operation at least once, over 60k Zeitgeist-like records, then the checker, which
must find nothing (``docs/reliability.md``).

The seed is printed first (``MILLWHEEL_FAULT_SEED=<seed>`` reruns that campaign: the same
input, the same faults in the same order at the same progress points; how many files are
appended while faults are pending follows the run's speed). Every planned fault lands:
the input stays open until the last one did (``faults/campaign.py``). Faults:
kill -9 of the driver, of Spark's Python workers and of the watermark authority, a zombie
driver, a full disk, a wall clock that jumps an hour (see ``faults/campaign.py``).
Operations (``faults/operate.py``): online rescales and layout changes, one killed -9
mid-request and finished as the docs say, a Ctrl-C restart. One campaign mixes both (two
separate ones cost CI twice the drivers' start-ups); the long form is ``-m slow``.
"""

from __future__ import annotations

import pytest

from faults.campaign import CLASSES, Campaign
from faults.operate import OPERATIONS

pytestmark = pytest.mark.spark


def _campaign(tmp_path, seed, records, faults, classes):
    # small injector batches: many micro-batches for the faults to land between (the input
    # stays open until the last one landed in any case: faults/campaign.py)
    result = Campaign(
        tmp_path, records=records, faults=faults, seed=seed, classes=classes, max_bytes=40_000
    ).run()
    report = result.report
    print(result.line())
    print(report.text())
    assert report.clean, report.text()
    assert sum(result.faults.values()) >= faults, (
        f"only {dict(result.faults)} landed before the run drained (seed {seed})"
    )
    missing = set(classes) - set(result.faults) - set(result.skipped)
    assert not missing, (
        f"fault classes or operations that never landed: {missing} (seed {seed}): {dict(result.faults)}"
    )
    assert report.inputs >= records and report.outputs > 0


@pytest.mark.timeout(1800)
def test_every_planned_fault_lands_however_fast_the_run_reads(tmp_path, fault_seed):
    """One file of input (5,000 records, a few batches) and more faults than it has batches
    for: the directory stays open and the campaign appends files until the last fault
    landed, then closes it; the checker reads the appended files too."""
    result = Campaign(
        tmp_path, records=5_000, faults=6, seed=fault_seed, classes=("authority", "workers")
    ).run()
    print(result.line())
    assert result.report.clean, result.report.text()
    assert sum(result.faults.values()) == 6, result.line()
    assert result.appended > 0, result.line()  # without the open directory it drains first
    assert result.report.inputs == 5_000 + result.appended, result.report.text()


# about 5 minutes on a 2-core machine shared with the rest of the suite (each fault
# class and operation once: the long form below draws more of them, over more records)
@pytest.mark.timeout(3600)
def test_fault_campaign(tmp_path, fault_seed):
    _campaign(tmp_path, fault_seed, records=60_000, faults=10, classes=(*CLASSES, *OPERATIONS))


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_operations_campaign_long(tmp_path, fault_seed):
    _campaign(tmp_path, fault_seed, records=200_000, faults=20, classes=(*OPERATIONS, *CLASSES))
