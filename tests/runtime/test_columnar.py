"""The default mapping's columnar interval function without Spark (``millwheel/runtime/_columnar.py``):
a worker reuses the store it wrote only for exactly the bytes it wrote."""

from __future__ import annotations

from millwheel import Record
from millwheel._codec import decode_value
from millwheel.runtime import _columnar
from millwheel.runtime._columnar import ColumnarIntervalStep
from millwheel.runtime._groupstate import MemoryGroupState
from millwheel.runtime._wire import SUMMARY_STREAM, to_spark

from .test_rescale_move import COLUMNAR, _records_frame


def _run(
    step, group: int, records: list[Record], state: MemoryGroupState
) -> list[tuple[str, str, dict]]:
    """The productions of one call: (stream, id, value)."""
    out = list(step((group,), iter([_records_frame(records)]), state))
    rows = [
        (s, i, v)
        for f in out
        for s, i, v in zip(f["stream"], f["id"], f["value"], strict=True)
        if s != SUMMARY_STREAM
    ]
    return sorted((s, i, decode_value(v)) for s, i, v in rows)


def test_a_worker_reuses_its_store_only_for_the_bytes_it_wrote():
    """Batch 2 run from the store batch 1 wrote (the cached object), then run again from
    the same bytes after the cache moved on (a replay of a batch that did not commit), then
    from a cold worker: the same productions and the same store bytes each time, and the
    re-sent record counted once."""
    step = ColumnarIntervalStep(COLUMNAR, groups=[7])
    first = [Record(None, {"k": "a"}, 1_000 + i, f"r{i}") for i in range(3)]
    second = [
        Record(None, {"k": "a"}, 1_100, "r3"),
        first[1],
        Record(None, {"k": "b"}, 1_200, "r4"),
    ]
    state = MemoryGroupState(watermark=to_spark(900))
    assert _run(step, 7, first, state) == []  # nothing due yet
    after_first = state.value
    assert (COLUMNAR.name, 0) in _columnar._STORES  # this worker kept what it wrote

    state.watermark = to_spark(
        1_050
    )  # the first window due; r3 and r4 on time, pending in the store
    out = _run(step, 7, second, state)
    written = state.value
    counts = {(v["key"], v["window_start"]): v["count"] for _, _, v in out}
    assert counts == {("a", 1_000): 3}  # r1 again: a duplicate
    state.value = after_first  # batch 2 again: the cache now holds batch 2's store, not these bytes
    assert _run(step, 7, second, state) == out and state.value == written
    _columnar._STORES.clear()  # a cold worker decodes the row
    state.value = after_first
    assert _run(step, 7, second, state) == out and state.value == written
