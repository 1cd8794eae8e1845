"""What an operator does to a running pipeline, as campaign classes (``faults/campaign.py``).

Jepsen mixes faults with the operations a system must survive; these are ours, opt-in
(``Campaign(classes=CLASSES + OPERATIONS)``), each applied to the running ledger driver:

* ``rescale`` — ``millwheel rescale RUN --computation C --intervals N`` while the driver
  runs (online, ``millwheel/runtime/_online.py``): a random computation, a random new
  count; the answer must be ``done``;
* ``relayout`` — ``millwheel rescale RUN --computation C --layout keys|intervals`` online:
  the other state layout; the answer must be ``done``;
* ``rescale_killed`` — either request, and the driver killed -9 a random 0-4 s later,
  wherever the move is (before, during or after it). The operator then does what the
  docs say (docs/runtime.md): either runs the command again first, or starts the driver
  and, if it refuses with "run ... again to finish it", runs the command and starts again
  (the seed picks which);
* ``restart`` — Ctrl-C (SIGINT: the driver stops its queries) and a new driver.

The checker (``faults/check.py``) then counts what was lost, duplicated or never seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import Any

from faults import inject

OPERATIONS = ("rescale", "relayout", "rescale_killed", "restart")
#: the ledger's computations an operation picks from
COMPUTATIONS = ("LedgerWindow", "LedgerTally")
COUNTS = (2, 3, 5, 8, 16)


def _entry(campaign: Any, computation: str) -> dict[str, Any]:
    """``computation``'s key intervals and state layout now, from the run's ``run.json`` (docs/runtime.md)."""
    held = json.loads((campaign.root / "run.json").read_text())
    own = (held.get("computations") or {}).get(computation) or {}
    return {
        "intervals": int(own.get("intervals", held.get("intervals", 4))),
        "state_layout": own.get("state_layout", held.get("state_layout", "intervals")),
    }


def operate(campaign: Any, what: str, proc: Any) -> Any:
    """Apply operation ``what`` to the running driver ``proc``; return the driver running afterwards."""
    from millwheel.runtime import rescale

    rng, root = campaign.rng, str(campaign.root)
    if what == "restart":
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)
        with contextlib.suppress(Exception):
            proc.wait(timeout=300)
        inject.kill_tree(proc)
        campaign.log(f"    stopped with Ctrl-C (exit {proc.returncode}); a new driver resumes")
        return campaign._start()
    c = rng.choice(COMPUTATIONS)
    now = _entry(campaign, c)
    if what == "relayout" or (what == "rescale_killed" and rng.random() < 0.5):
        request: dict[str, Any] = {
            "layout": "keys" if now["state_layout"] == "intervals" else "intervals"
        }
    else:
        request = {"intervals": rng.choice([n for n in COUNTS if n != now["intervals"]])}
    said = f"{c}: {now['intervals']} intervals, {now['state_layout']} -> {request}"
    if what in ("rescale", "relayout"):
        answer = rescale(root, c, timeout_s=900, **request)
        campaign.log(f"    {said}: {answer.get('state')} {answer.get('detail', '')}")
        if answer.get("state") != "done":
            msg = f"an online {what} of {c} answered {answer}:\n{campaign._tail(proc)}"
            raise AssertionError(msg)
        return proc
    if what != "rescale_killed":
        msg = f"unknown operation {what!r}; known: {', '.join(OPERATIONS)}"
        raise ValueError(msg)
    rescale(root, c, wait=False, **request)
    time.sleep(rng.uniform(0, 4))
    inject.kill_tree(proc)
    command_first = rng.random() < 0.5
    campaign.log(
        f"    {said}: driver killed -9 during the request; the operator {'runs the command again, then starts' if command_first else 'starts a driver'}"
    )
    if command_first:
        _again(campaign, c, request)
    new = campaign._start()
    if inject.wait_for_progress(new, root, c, 1, timeout=600) or new.wait() == 0:
        return new
    log = campaign._log(new)
    text = log.read_text(errors="replace") if log is not None else ""
    if "again to finish it" not in text:
        msg = f"the driver after a killed {request} of {c} stopped with exit {new.returncode}, not asking to finish it:\n{campaign._tail(new)}"
        raise AssertionError(msg)
    inject.kill_tree(new)
    campaign.log(
        "    the driver refused to start before the change is finished; the operator runs the command again"
    )
    _again(campaign, c, request)
    return campaign._start()


def _again(campaign: Any, computation: str, request: dict[str, Any]) -> None:
    """The operator runs the interrupted command again (no driver runs: offline)."""
    from millwheel.runtime import rescale

    answer = rescale(str(campaign.root), computation, **request)
    campaign.log(
        f"    again: { ({k: v for k, v in answer.items() if k in ('from', 'to', 'keys', 'finished', 'unchanged', 'pending', 'state')}) }"
    )


__all__ = ["OPERATIONS", "operate"]
