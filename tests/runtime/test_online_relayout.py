"""A running computation's state layout changes online, while records flow
(``millwheel rescale RUN --computation C --layout keys|intervals``: ``_online.py`` with
``_relayout.move_layout``; docs/runtime.md, "Changing a computation's state layout").

The ledger (``faults/ledger.py``) reads its input in chunks written while it runs, as in
``test_online_rescale.py`` (whose helpers these are): its output is compared with the plain
answer pandas computes from the input files, and in the kill tests ``millwheel check`` runs.
"""

from __future__ import annotations

import pytest

from faults.inject import kill_tree
from faults.ledger import build
from millwheel._errors import MillwheelError
from millwheel.runtime import SparkRuntime
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin
from millwheel.runtime._online import rescale

from .test_online_rescale import (
    C,
    Running,
    _settings,
    assert_exact_and_clean,
    chunk,
    plain_answer,
    published,
    start_ledger_driver,
)

pytestmark = pytest.mark.spark


def test_a_running_computation_moves_to_per_key_rows_and_back_while_records_flow(
    tmp_path, spark, capsys
):
    """intervals (4) -> keys (4) -> intervals (8) online, the other queries never stopping:
    the output is the plain answer, nothing published twice; ``--status`` lists both."""
    from millwheel.cli import main

    data, root = tmp_path / "data", tmp_path / "run"
    chunk(data, 0)
    run = Running(root, data, 4, spark)
    run.wait_for_batches(2)
    to_keys = rescale(str(root), C, layout="keys", timeout_s=300)  # chunk 0 is still being read
    assert to_keys["state"] == "done", to_keys
    assert (to_keys["from_layout"], to_keys["to_layout"], to_keys["to"]) == (
        "intervals",
        "keys",
        4,
    ), to_keys
    assert to_keys["keys"] > 0 and to_keys["stopped_s"] > 0, to_keys
    entry = read_pin(Location.of(str(root)))["computations"][C]
    assert (entry["state_layout"], entry["migration"]["relayout"]) == ("keys", "done")
    assert run.rt.computations[C].state_layout == "keys"
    assert "done" in run.rt.status()[C]["rescale"]
    chunk(data, 1)
    run.wait_for_batches(run.rt.computations[C].batches + 2)  # batches on the per-key store
    back = rescale(str(root), C, 8, layout="intervals", timeout_s=300)
    assert back["state"] == "done", back
    assert (back["from_layout"], back["to_layout"], back["from"], back["to"]) == (
        "keys",
        "intervals",
        4,
        8,
    ), back
    chunk(data, 2, last=True)
    run.join()
    got = published(root)
    assert max(got.values()) == 1, [k for k, n in got.items() if n > 1][
        :3
    ]  # nothing published twice
    assert got == plain_answer(data)
    capsys.readouterr()
    assert main(["rescale", str(root), "--status"]) == 0
    listed = capsys.readouterr().out
    assert f"{C} -> the 'keys' state layout: done" in listed, listed
    assert f"{C} -> the 'intervals' state layout with 8 key intervals: done" in listed, listed


def _online_layout_kill(tmp_path, spark, capsys, kill_at: str, chunks: int) -> None:
    """intervals -> keys online, the driver killed -9 at ``kill_at`` of the move; the next
    start refuses ("run the command again") if ``run.json`` recorded the change, the command
    finishes it, and the run resumes to the end: the plain answer, ``millwheel check`` clean."""
    from faults.inject import AuthorityProcess
    from watermark_authority.client import HttpWatermarkClient, client_secret

    data, root, log = tmp_path / "data", tmp_path / "run", tmp_path / "driver.log"
    authority = AuthorityProcess(tmp_path / "authority").start()
    try:
        proc = start_ledger_driver(root, data, log, authority, 4, f"{C}:{kill_at}:data")
        try:
            for k in range(1, chunks - 1):
                chunk(data, k)
            answer = rescale(str(root), C, layout="keys", timeout_s=300)
            assert answer["state"] == "failed", (
                answer,
                log.read_text()[-3000:],
            )  # killed during the move
            assert proc.wait(timeout=60) == -9, log.read_text()[-3000:]
        finally:
            kill_tree(proc)
        entry = (read_pin(Location.of(str(root))).get("computations") or {}).get(C) or {}
        assert answer["recorded"] == (
            kill_at in ("relayout_pinned", "relayout_swapping", "online_restarted")
        ), (answer, entry)
        with HttpWatermarkClient(
            authority.url,
            secret=client_secret(None, data_dir=authority.data_dir),
            retries=12,
            backoff=0.1,
        ) as wm:

            def runtime() -> SparkRuntime:
                return SparkRuntime(
                    build(str(data), max_bytes=60_000, finite=False),
                    str(root),
                    _settings(4),
                    spark=spark,
                    watermarks=wm,
                    log=lambda m: print(m, flush=True),
                )

            if kill_at in ("relayout_pinned", "relayout_swapping"):  # recorded, not in place yet
                assert entry["migration"]["relayout"] == "swapping", entry
                rt = runtime()
                try:
                    with pytest.raises(MillwheelError, match="again to finish it"):
                        rt.start()
                finally:
                    rt.stop()
                finished = rescale(
                    str(root), C, layout="keys", spark=spark
                )  # no driver runs: the command itself
                assert finished["finished"], finished
            elif answer["recorded"]:  # killed after C's query restarted: the change was in place
                assert (entry["state_layout"], entry["migration"]["relayout"]) == (
                    "keys",
                    "done",
                ), entry
            else:
                assert "state_layout" not in entry, (
                    entry
                )  # nothing changed: C resumes on interval rows
            chunk(data, chunks - 1, last=True)
            runtime().run(timeout_s=600)
    finally:
        authority.stop()
    want = "keys" if answer["recorded"] else "intervals"
    assert (
        read_pin(Location.of(str(root)))
        .get("computations", {})
        .get(C, {})
        .get("state_layout", "intervals")
        == want
    )
    assert_exact_and_clean(root, data, authority.data_dir, capsys)


def test_an_online_layout_change_killed_after_run_json_is_finished_by_the_command(
    tmp_path, spark, capsys
):
    _online_layout_kill(tmp_path, spark, capsys, "relayout_pinned", chunks=2)


@pytest.mark.slow  # the long form: every kill point of an online layout change, more input
@pytest.mark.parametrize(
    "kill_at",
    [
        "online_stopped",
        "relayout_built",
        "relayout_pinned",
        "relayout_swapping",
        "online_restarted",
    ],
)
def test_an_online_layout_change_survives_a_kill_at_every_point(tmp_path, spark, capsys, kill_at):
    _online_layout_kill(tmp_path, spark, capsys, kill_at, chunks=5)
