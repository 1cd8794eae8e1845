"""Fixtures for fault tests: each fault of ``faults/inject.py`` as a pytest fixture.

* ``authority`` (in ``tests/conftest.py``: the runtime tests use it too) — ``millwheel
  authority serve`` in a subprocess (``.kill9()``, ``.restart()``, ``.url``, ``.env()`` for a
  driver), stopped after the test;
* ``small_disk`` — a 512 MB tmpfs (``.path``, ``.fill()``, ``.free()``), unmounted after the
  test; skipped with the reason where a tmpfs cannot be mounted;
* ``clock`` — a libfaketime offset file for a driver's JVM (``.jump(seconds)``); skipped
  where Debian's ``faketime`` is not installed;
* ``ledger_input`` — a factory: ``ledger_input(n, seed)`` writes the ledger's input and
  returns its directory;
* ``fault_seed`` — the seed of a randomised test: ``$MILLWHEEL_FAULT_SEED`` or a fresh
  one, printed either way so that a failure reproduces.
"""

from __future__ import annotations

import os
import random

import pytest

from faults import inject
from faults.ledger import write_input


@pytest.fixture
def fault_seed():
    seed = int(os.environ.get("MILLWHEEL_FAULT_SEED") or random.SystemRandom().randrange(1, 10**6))
    print(f"\nfault seed: {seed} (rerun with MILLWHEEL_FAULT_SEED={seed})")
    return seed


@pytest.fixture
def small_disk(tmp_path):
    why = inject.SmallDisk.available()
    if why:
        pytest.skip(why)
    disk = inject.SmallDisk(tmp_path / "disk", 512).mount()
    yield disk
    disk.unmount()


@pytest.fixture
def clock(tmp_path):
    why = inject.ClockJump.available()
    if why:
        pytest.skip(why)
    return inject.ClockJump(tmp_path / "faketimerc")


@pytest.fixture
def ledger_input(tmp_path):
    def make(n, seed=1, **options):
        data = tmp_path / "data"
        write_input(data, n, seed=seed, **options)
        return data

    return make
