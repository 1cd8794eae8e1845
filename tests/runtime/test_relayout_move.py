"""The envelope move of a layout change (``millwheel/runtime/_relayout.py``, ``_install.py``) without Spark.

A layout change reads every key's envelope, makes one install row per key for the group
of its interval in the new layout (``install_table``), and a one-batch query of the new
layout's operator installs each group's rows (``IntervalInstaller`` for interval rows,
the processor of ``make_installer`` for per-key rows). Here the groups are called as
Spark would, on :class:`MemoryGroupState` and on in-memory state variables.

The property, for random interval counts, keys and records, in both directions
(intervals -> keys -> intervals): every envelope lands exactly once, in the group of its
key's interval, with its timer index and the interval's timer; and a run that goes on
from the moved state (records delivered again included) produces the output and states
of a run that had the new layout's count from the start.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from millwheel.runtime import _install
from millwheel.runtime._install import IntervalInstaller, make_installer
from millwheel.runtime._interval import KeyMeta, MemoryGroupState, earliest, unpack_meta
from millwheel.runtime._keying import interval_of
from millwheel.runtime._move import RescaleMismatch, envelope_meta
from millwheel.runtime._relayout import install_table
from millwheel.runtime._wire import interval_groups, to_spark

from .test_rescale_move import PARTITIONS, Cluster, _records


class _Value:
    def __init__(self) -> None:
        self.value: tuple | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self):
        return self.value

    def update(self, v) -> None:
        self.value = v

    def clear(self) -> None:
        self.value = None


class _Handle:
    """The state variables of one Spark group of the per-key layout, in memory."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[bytes, bytes]] = {}
        self.values: dict[str, _Value] = {}
        self.timers: set[int] = set()

    def getMapState(self, name, *_schemas):  # noqa: N802 - Spark's names
        return self.maps.setdefault(name, {})

    def getValueState(self, name, *_schema):  # noqa: N802
        return self.values.setdefault(name, _Value())

    def registerTimer(self, ts: int) -> None:  # noqa: N802
        self.timers.add(ts)

    def deleteTimer(self, ts: int) -> None:  # noqa: N802
        self.timers.discard(ts)


class _Pipeline:
    """``MapStatePipeline`` on an in-memory map."""

    def __init__(self, m: dict[bytes, bytes]) -> None:
        self.m = m

    def write_many(self, updates, removals) -> None:
        self.m.update(updates)
        for k in removals:
            self.m.pop(k, None)


class _TimerValues:
    def __init__(self, watermark: int) -> None:
        self.watermark = watermark

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self.watermark


def _frames(table) -> dict[int, pd.DataFrame]:
    d = table.to_pandas()
    return {int(g): d[d["group"] == g].reset_index(drop=True) for g in d["group"].unique()}


def install_intervals(table, groups: list[int]) -> tuple[dict[int, MemoryGroupState], int]:
    """The install query into the interval-row layout: each group's function on its rows."""
    installer = IntervalInstaller("CountThenFlush", groups)
    states: dict[int, MemoryGroupState] = {}
    installed = 0
    for g, frame in _frames(table).items():
        states[g] = MemoryGroupState(watermark=0)
        for out in installer((g,), iter([frame]), states[g]):
            installed += int(out["keys"].sum())
    return states, installed


def install_keys(table, groups: list[int], monkeypatch) -> tuple[dict[int, _Handle], int]:
    """The install query into the per-key layout: its processor, one handle per group."""
    monkeypatch.setattr(_install, "MapStatePipeline", _Pipeline)
    handles: dict[int, _Handle] = {}
    installed = 0
    for g, frame in _frames(table).items():
        p = make_installer("CountThenFlush", groups)
        handles[g] = _Handle()
        p.init(handles[g])
        for out in p.handleInputRows((g,), iter([frame]), _TimerValues(0)):
            installed += int(out["keys"].sum())
    return handles, installed


def _check_placed(
    placed: dict[int, dict[bytes, bytes]], envs: dict[bytes, bytes], groups: list[int]
) -> None:
    seen = Counter(kb for held in placed.values() for kb in held)
    assert set(seen) == set(envs) and all(c == 1 for c in seen.values()), (
        "a key was lost or installed twice"
    )
    for g, held in placed.items():
        assert all(groups[interval_of(kb, len(groups))] == g for kb in held), (
            "a key is not in its interval's group"
        )
        assert all(held[kb] == envs[kb] for kb in held), "an envelope changed on the way"


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    old=st.integers(1, 9),
    mid=st.integers(1, 9),
    new=st.integers(1, 12),
    keys=st.lists(st.integers(0, 500), min_size=1, max_size=40, unique=True),
    n=st.integers(1, 120),
    seed=st.integers(0, 1_000),
)
def test_every_envelope_moves_once_between_the_layouts_and_the_run_goes_on_as_if_it_had_the_new_layout(
    monkeypatch, old, mid, new, keys, n, seed
):
    first, second = _records(keys, n, seed), _records(keys, n // 2 + 1, seed + 1)
    again = first[
        : len(first) // 3
    ]  # delivered again after the moves: dropped by the moved dedup ids
    ref = Cluster(new, interval_groups(new, PARTITIONS))
    ref.batch(first, low_watermark=1_000 + n // 2)
    ref.batch(second + again, low_watermark=2_000 + n)

    run = Cluster(old, interval_groups(old, PARTITIONS))
    run.batch(first, low_watermark=1_000 + n // 2)
    envs = {kb: env for held in run.envelopes().values() for kb, env in held.items()}

    # intervals -> keys (with `mid` intervals): one map entry per key, the timer index, the timer
    mid_groups = interval_groups(mid, PARTITIONS)
    handles, installed = install_keys(install_table(envs, mid_groups), mid_groups, monkeypatch)
    assert installed == len(envs)
    _check_placed({g: h.maps["envs"] for g, h in handles.items()}, envs, mid_groups)
    for h in handles.values():
        count, meta = unpack_meta(h.values["meta"].get()[0])
        want = {
            kb: KeyMeta.make(*m)
            for kb in h.maps["envs"]
            if (m := envelope_meta(h.maps["envs"][kb])) is not None
        }
        assert count == len(h.maps["envs"]) and dict(meta) == want
        _, nlw, _ = earliest(want.values())
        assert h.timers == (set() if nlw is None else {max(to_spark(nlw), 1)})
        assert h.values["timer"].get() == (None if nlw is None else (max(to_spark(nlw), 1),))

    # keys -> intervals (with `new` intervals), read back from the per-key store
    back = {kb: env for h in handles.values() for kb, env in h.maps["envs"].items()}
    new_groups = interval_groups(new, PARTITIONS)
    states, installed = install_intervals(install_table(back, new_groups), new_groups)
    assert installed == len(envs)
    after = Cluster(new, new_groups)
    after.states = states
    after.out = list(run.out)
    _check_placed(after.envelopes(), envs, new_groups)
    # rows written anew carry no Spark timeout: their query runs without (``plans/intervals.py``)
    assert all(s.timeout is None for s in states.values())
    after.batch(second + again, low_watermark=2_000 + n)
    by_interval = {new_groups.index(g): e for g, e in after.envelopes().items()}
    assert by_interval == {ref.groups.index(g): e for g, e in ref.envelopes().items()}
    assert sorted(after.out) == sorted(ref.out)


def test_no_keys_still_makes_one_row_so_the_store_gets_its_first_version():
    table = install_table({}, [5, 3])
    assert table.num_rows == 1 and table.column("key")[0].as_py() is None
    states, installed = install_intervals(table, [5, 3])
    assert installed == 0 and all(s.value is None for s in states.values())


def test_an_install_row_for_another_interval_or_group_fails_the_build(monkeypatch):
    import pyarrow as pa

    c = Cluster(2, interval_groups(2, PARTITIONS))
    c.batch(_records([1, 2, 3, 4, 5, 6], 12, 0), low_watermark=0)
    envs = {kb: env for held in c.envelopes().values() for kb, env in held.items()}
    assert {interval_of(kb, 2) for kb in envs} == {0, 1}  # keys in both intervals
    table = install_table(envs, [10, 11])
    with pytest.raises(RescaleMismatch, match="not one of the new layout's"):
        install_intervals(table, [10, 12])
    wrong = table.to_pandas()
    wrong["group"] = 10  # every key to the first interval: some are not its own
    with pytest.raises(RescaleMismatch, match="not its own"):
        install_keys(pa.Table.from_pandas(wrong, preserve_index=False), [10, 11], monkeypatch)
