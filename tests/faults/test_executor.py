"""kill -9 of executor JVMs (and of their Python workers) on a real standalone cluster, mid-run,
then the checker (``docs/reliability.md``). Slow: a cluster and a driver on two cores.

The cluster is ``millwheel cluster``'s (``millwheel/runtime/_cluster.py``): a master and two
workers on loopback. Each fault kills the ``CoarseGrainedExecutorBackend`` of one worker (its
worker starts a new one) or the Python workers under the executors, after 1-3 more committed
batches of a random query; the seed is printed.
"""

from __future__ import annotations

import pytest

from faults.campaign import Campaign

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path):
    from millwheel.runtime._cluster import StandaloneCluster

    c = StandaloneCluster(str(tmp_path / "cluster")).up(
        workers=2, cores=1, memory="1g", port=0, ui_port=0
    )
    yield c
    c.down()


def test_executor_kills_on_a_cluster(tmp_path, cluster, fault_seed):
    result = Campaign(
        tmp_path / "work",
        records=50_000,
        faults=4,
        seed=fault_seed,
        classes=("workers",),
        cluster=cluster,
    ).run()
    print(result.line())
    print(result.report.text())
    assert result.report.clean, result.report.text()
    assert result.faults["executor"] >= 1, (
        f"no executor was killed before the run drained: {dict(result.faults)}"
    )
