"""How the suite's markers select tests, wherever pytest is started in the repository.

* ``slow`` (long soaks and crash loops) runs only when asked for: an ``-m`` expression that
  names ``slow`` (``-m slow``), ``--slow``, or ``MILLWHEEL_SLOW=1``. Otherwise a slow test
  is skipped whatever else ``-m`` says, so ``pytest`` (CI) and the fast loop
  ``pytest -m "not spark and not browser and not etcd"`` both leave the soaks out.
* A test that uses the ``spark`` fixture is marked ``spark``, and one that needs an etcd
  cluster (the ``etcd_cluster`` fixture, the ``etcd`` backend of ``store``) ``etcd``, even
  without the decorator: ``-m "not spark"`` never starts a Spark session by accident.
"""

from __future__ import annotations

import os

import pytest

SLOW_ENV = "MILLWHEEL_SLOW"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the tests marked slow (long soaks, crash loops)",
    )


def slow_wanted(config: pytest.Config) -> bool:
    """Whether this session runs ``slow`` tests: ``--slow``, ``MILLWHEEL_SLOW=1``, or ``-m`` naming them."""
    return (
        bool(config.getoption("--slow"))
        or os.environ.get(SLOW_ENV, "") not in ("", "0")
        or "slow" in (config.getoption("markexpr") or "")
    )


def _needs_etcd(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return "etcd_cluster" in getattr(item, "fixturenames", ()) or (
        callspec is not None and callspec.params.get("store") == "etcd"
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the marks added here count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = slow_wanted(config)
    skip_slow = pytest.mark.skip(reason=f"slow: run it with -m slow, --slow or {SLOW_ENV}=1")
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "spark" in names and item.get_closest_marker("spark") is None:
            item.add_marker(pytest.mark.spark)
        if _needs_etcd(item) and item.get_closest_marker("etcd") is None:
            item.add_marker(pytest.mark.etcd)
        if not run_slow and item.get_closest_marker("slow") is not None:
            item.add_marker(skip_slow)
