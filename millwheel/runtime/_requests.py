"""``millwheel rescale``'s side of an online rescale: the request, the answers, the command.

The driver's side is ``_online.py`` (its module docstring has the whole protocol):

1. **The request** (:func:`request_rescale`). The command finds the driver that holds C's
   lease (the newest epoch of ``leases/C``, ``_lease.py``) and, if it runs, writes
   ``control/rescale/<epoch>-<id>.request`` into the run directory, addressed to that
   epoch, then waits for ``<epoch>-<id>.json``, the driver's answer (``waiting``,
   ``moving``, ``restarted``, then ``done``, ``failed`` or ``refused``). The automatic
   policy's decisions (``_autoscale.py``) are answered the same way, with ids
   ``<epoch>-auto-<id>``.
2. **A driver that dies before its answer is final** (killed, or stopped on another
   host) leaves it where it was. The request is never carried out by another driver (a
   rescale nobody waits for any more would surprise); the next driver that runs the
   computation answers it (:func:`orphan_answer`) from what the run directory holds: a
   request or decision that was ``sent`` or ``waiting`` never began its move (a move
   starts only after ``moving`` is written), so *nothing changed*; one that was
   ``moving`` changed nothing unless ``run.json`` gives the computation another layout
   than the one it had when the move began (the answer's ``from``, ``from_layout``);
   one that ``run.json`` recorded took effect, and the next driver runs with it.
   ``millwheel rescale RUN --status`` says the same of a request whose driver is gone
   before any driver took over, and a waiting command says it when its driver dies.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

from millwheel._errors import MillwheelError
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import read_pin
from millwheel.runtime._lease import DriverEpoch, Lease, process_running
from millwheel.runtime._relayout import plan, relayout_wanted
from millwheel.runtime._rescale import rescale as offline_rescale
from millwheel.runtime._rescale import target
from millwheel.runtime._settings import STATE_LAYOUTS

__all__ = [
    "CONTROL",
    "FINAL",
    "answers",
    "epoch_of",
    "gone_answer",
    "holder",
    "orphan_answer",
    "pending",
    "read_answer",
    "request_rescale",
    "rescale",
    "rescale_main",
    "what",
]

#: where requests and answers live, under the run directory
CONTROL = ("control", "rescale")
#: answers that end a request
FINAL = ("done", "failed", "refused")


def control_dir(root: Location) -> Location:
    return root.child(*CONTROL)


def holder(root: Location, computation: str) -> tuple[int, str] | None:
    """The driver epoch holding ``computation``'s lease and its ``_drivers`` entry, if that
    driver may be running (not marked stopped, and on this host its process is alive)."""
    leases = root.child("leases")
    epoch = Lease(leases.child(computation), computation).newest() if leases.exists() else 0
    if not epoch:
        return None
    name = f"{epoch:012d}"
    text = (
        leases.child(DriverEpoch.DIR, name).read_text()
        or leases.child(computation, name).read_text()
        or ""
    ).strip()
    if not text or text.endswith(" stopped"):
        return None
    host, _, pid = text.rpartition(":")
    if host == os.uname().nodename and pid.isdigit() and not process_running(int(pid)):
        return None  # killed (a zombie too: its parent has not reaped it yet)
    return epoch, text


def rescale(
    run_dir: str,
    computation: str,
    intervals: int | None = None,
    *,
    layout: str | None = None,
    spark: Any = None,
    force: bool = False,
    wait: bool = True,
    timeout_s: float | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Give ``computation`` of the run in ``run_dir`` ``intervals`` key intervals and/or the
    state layout ``layout`` (``_relayout.py``): online, by the driver that runs it (the
    module docstring), or offline if none does (``_rescale.rescale``). ``wait=False``
    returns once the request is written (online)."""
    root = Location.of(run_dir)
    if not force and holder(root, computation) is not None:
        if intervals is None and layout is None:
            msg = "give --intervals N, --layout intervals|keys, or both"
            raise MillwheelError(msg)
        return request_rescale(
            run_dir, computation, intervals, layout=layout, wait=wait, timeout_s=timeout_s, log=log
        )
    return offline_rescale(
        run_dir, computation, intervals, layout=layout, spark=spark, force=force, log=log
    )


def request_rescale(
    run_dir: str,
    computation: str,
    intervals: int | None,
    *,
    layout: str | None = None,
    wait: bool = True,
    timeout_s: float | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Ask the driver running ``computation`` to rescale it (step 1) — ``intervals`` key
    intervals, or the state layout ``layout`` (``None``: its own) — and wait for its answer
    (unless ``wait`` is false); returns the answer, with ``"state"`` one of ``done``,
    ``failed``, ``refused``, or ``sent`` without waiting."""
    say = log or (lambda _m: None)
    root = Location.of(run_dir)
    # what can be refused here is, before anything is sent
    if relayout_wanted(run_dir, computation, layout):
        plan(root, computation, layout, intervals)
    else:
        target(root, computation, intervals)  # type: ignore[arg-type]
    held = holder(root, computation)
    if held is None:
        msg = f"cannot rescale online: no running driver holds computation {computation!r} of {root.uri}"
        raise MillwheelError(msg)
    epoch, who = held
    rid = f"{epoch:012d}-{uuid.uuid4().hex[:12]}"
    control = control_dir(root)
    control.mkdirs()
    body = {
        "id": rid,
        "computation": computation,
        "intervals": intervals,
        "layout": layout,
        "epoch": epoch,
        "by": f"{os.uname().nodename}:{os.getpid()}",
        "at_ms": int(time.time() * 1000),
    }
    control.child(f"{rid}.request").write_text(json.dumps(body))
    say(
        f"asked the driver running {computation!r} ({who}, epoch {epoch}) to move it to {what(intervals, layout)} (request {rid})"
    )
    if not wait:
        return {**body, "state": "sent"}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    shown = None
    while True:
        answer = read_answer(root, rid)
        if answer is not None:
            if answer.get("state") != shown:
                shown = answer.get("state")
                say(f"{computation!r}: {answer.get('state')}: {answer.get('detail', '')}")
            if answer.get("state") in FINAL:
                return answer
        if holder(root, computation) is None or (holder(root, computation) or (0, ""))[0] != epoch:
            answer = read_answer(root, rid)  # it may have answered just before it stopped
            if answer is not None and answer.get("state") in FINAL:
                return answer
            return orphan_answer(root, answer or {**body, "state": "sent"})
        if deadline is not None and time.monotonic() > deadline:
            msg = f"no answer to rescale request {rid} within {timeout_s}s; it goes on (see `millwheel rescale {root.uri} --status`)"
            raise MillwheelError(msg)
        time.sleep(0.2)


def read_answer(root: Location, rid: str) -> dict[str, Any] | None:
    text = control_dir(root).child(f"{rid}.json").read_text()
    return None if text is None else json.loads(text)


def what(intervals: int | None, layout: str | None) -> str:
    """What a request asks for, in words: ``8 key intervals``, ``the 'keys' state layout (with 8 key intervals)``."""
    if layout is None:
        return f"{intervals} key intervals"
    return f"the {layout!r} state layout" + (
        "" if intervals is None else f" with {intervals} key intervals"
    )


def epoch_of(rid: str) -> int | None:
    """The driver epoch a request or decision id is addressed to (``<epoch>-...``)."""
    head = str(rid).split("-", 1)[0]
    return int(head) if head.isdigit() else None


def orphan_answer(root: Location, body: dict[str, Any], by: int | None = None) -> dict[str, Any]:
    """The final answer to a request or decision (``body``: its last answer, or the request
    with ``state`` ``sent``) whose driver stopped before it was final (the module
    docstring, 2.), checked against ``run.json``; ``by``: the epoch of the driver that
    answers it (it runs the computation now, with whatever ``run.json`` gives it)."""
    rid, computation, intervals, layout = (
        str(body.get("id")),
        str(body.get("computation")),
        body.get("intervals"),
        body.get("layout"),
    )
    epoch = epoch_of(rid)
    kind = (
        f"the automatic {body['decision']['action']}"
        if isinstance(body.get("decision"), dict)
        else "the rescale"
    )
    if body.get("state", "sent") in ("sent", "waiting"):
        again = (
            "the policy decides again from new figures"
            if body.get("decision")
            else "rescale again (offline, or once a driver runs it)"
        )
        out: dict[str, Any] = {
            "state": "failed",
            "recorded": False,
            "detail": f"the driver (epoch {epoch}) stopped before {kind} of {computation!r} to {what(intervals, layout)} began its move: nothing changed; {again}",
        }
    else:
        out = gone_answer(
            root,
            computation,
            intervals,
            rid,
            epoch or 0,
            layout,
            before=body.get("from"),
            before_layout=body.get("from_layout"),
        )
        if out["recorded"] and by is not None and "refuses" not in out["detail"]:
            out = {
                **out,
                "state": "done",
                "detail": f"{out['detail'].split(':', 1)[0]}; driver epoch {by} runs with it (it moves the state in its first batch, if not moved yet)",
            }
    kept = {k: v for k, v in body.items() if k not in ("state", "detail", "recorded")}
    return {**kept, **out, "id": rid, **({"answered_by": by} if by is not None else {})}


def gone_answer(
    root: Location,
    computation: str,
    intervals: int | None,
    rid: str,
    epoch: int,
    layout: str | None = None,
    *,
    before: int | None = None,
    before_layout: str | None = None,
) -> dict[str, Any]:
    """The driver stopped (or was killed) during a move, before it answered: say what the run
    directory holds. ``before``, ``before_layout``: the computation's key intervals and state
    layout when the move began; ``run.json`` still giving it those means nothing changed."""
    held = read_pin(root)
    entry = (held.get("computations") or {}).get(computation) or {}
    own, step = entry.get("intervals"), (entry.get("migration") or {}).get("relayout")
    now_layout = entry.get("state_layout") or held.get("state_layout") or "intervals"
    unchanged = (
        before is not None
        and entry.get("intervals", held.get("intervals")) == before
        and before_layout in (None, now_layout)
    )
    if (
        not unchanged
        and step is not None
        and layout in (None, entry.get("state_layout"))
        and intervals in (None, own)
    ):
        # a layout change (``_relayout.py``) recorded in run.json
        if step != "done":
            detail = (
                f"the driver (epoch {epoch}) stopped during the change of {computation!r} to {what(own, entry.get('state_layout'))}, after run.json recorded it: "
                f"the next start refuses until `millwheel rescale {root.uri} --computation {computation} --layout {entry.get('state_layout')}` runs again, which finishes it"
            )
        else:
            detail = f"the driver (epoch {epoch}) stopped after the change of {computation!r} to {what(own, entry.get('state_layout'))} was in place: the next `millwheel run` resumes with it"
        return {"id": rid, "state": "failed", "recorded": True, "detail": detail}
    if not unchanged and layout is None and own == intervals:
        detail = (
            f"the driver (epoch {epoch}) stopped during the rescale, after run.json gave {computation!r} {intervals} key intervals: "
            "the next `millwheel run` on this run directory resumes with them and moves the state in its first batch"
        )
        return {"id": rid, "state": "failed", "recorded": True, "detail": detail}
    detail = f"the driver (epoch {epoch}) stopped before the rescale of {computation!r} took effect: nothing changed; rescale again (offline, or once it runs again)"
    return {"id": rid, "state": "failed", "recorded": False, "detail": detail}


def pending(root: Location) -> list[dict[str, Any]]:
    """Requests and decisions without a final answer: their last answer, or (a request
    no driver answered) the request with ``state`` ``sent``."""
    control = control_dir(root)
    names = set(control.list()) if control.exists() else set()
    out = []
    for name in sorted(names):
        if name.startswith(".") or not name.endswith((".json", ".request")):
            continue
        rid = name.rsplit(".", 1)[0]
        if name.endswith(".request") and f"{rid}.json" in names:
            continue
        try:
            body = json.loads(control.child(name).read_text() or "")
        except ValueError:
            continue
        if not isinstance(body, dict):
            continue
        if name.endswith(".request"):
            body = {**body, "id": rid, "state": "sent"}
        if body.get("state") not in FINAL:
            out.append(body)
    return out


def answers(run_dir: str) -> list[dict[str, Any]]:
    """Every rescale request of the run directory with its latest answer (``sent``: none yet),
    oldest first (the automatic policy's too: their ids say ``auto``, their answers carry the decision)."""
    root = Location.of(run_dir)
    control = control_dir(root)
    out = [b for b in pending(root) if b.get("state") == "sent"]  # requests no driver answered
    for name in control.list():
        if name.endswith(".json") and not name.startswith("."):
            text = control.child(name).read_text()
            if text:
                out.append(json.loads(text))
    return sorted(out, key=lambda a: (a.get("at_ms", 0), a.get("id", "")))


def rescale_main(argv: list[str]) -> int:
    """``millwheel rescale RUN --computation C --intervals N [--no-wait] [--force]``, or ``RUN --status``."""
    p = argparse.ArgumentParser(
        prog="millwheel rescale",
        description="give a computation another number of key intervals or another state layout: online if a driver runs it, else in the stopped run "
        "directory. A computation on the Arrow mapping (ComputationOptions(mapping='arrow')) is refused before anything changes: its state "
        "is in that mapping's own files, which a rescale does not move (docs/runtime.md, 'The Arrow mapping').",
    )
    p.add_argument("run", help="the run directory (--checkpoint of millwheel run)")
    p.add_argument("--computation", help="the computation to rescale")
    p.add_argument("--intervals", type=int, help="its new number of key intervals")
    p.add_argument(
        "--layout",
        choices=STATE_LAYOUTS,
        default=None,
        help="its new state layout (with --intervals: and that many key intervals); online too (docs/runtime.md)",
    )
    p.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="online: return once the driver has the request (its progress shows in its live status)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="online: give up waiting for the answer after this many seconds",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="rescale offline without checking that no driver runs (one on another host that you know has stopped)",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="list the run's online rescales and layout changes and the automatic policy's decisions, with their outcome",
    )
    args = p.parse_args(argv)
    if args.status:
        root = Location.of(args.run)
        for a in answers(args.run):
            if a.get("state") not in FINAL:
                held = holder(root, str(a.get("computation")))
                if held is None or held[0] != epoch_of(
                    str(a.get("id"))
                ):  # its driver is gone: what the run directory says
                    a = orphan_answer(root, a)  # noqa: PLW2901
            why = f" — {a['decision']['reason']}" if a.get("decision") else ""
            print(
                f"{a.get('id')}: {a.get('computation')} -> {what(a.get('intervals'), a.get('layout'))}: {a.get('state')} ({a.get('detail', '')}){why}"
            )
        return 0
    if args.computation is None or (args.intervals is None and args.layout is None):
        p.error("--computation and --intervals or --layout are required (or --status)")
    say = lambda m: print(f"millwheel: {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        out = rescale(
            args.run,
            args.computation,
            args.intervals,
            layout=args.layout,
            force=args.force,
            wait=args.wait,
            timeout_s=args.timeout,
            log=say,
        )
    except MillwheelError as exc:
        print(f"millwheel: {exc}", file=sys.stderr)
        return 2
    state = out.get("state")
    if state == "sent":
        print(
            f"asked the running driver to move {args.computation!r} to {what(args.intervals, args.layout)} (request {out['id']}); its live status shows the progress"
        )
    elif state is not None:
        print(
            f"rescale of {args.computation!r} to {what(args.intervals, args.layout)}: {state}: {out.get('detail', '')}"
        )
        return 0 if state == "done" else 1
    elif out.get("to_layout") is not None and out.get("keys") is not None:
        print(
            f"moved {out['computation']!r} to the {out['to_layout']!r} state layout with {out['to']} key intervals: {out['keys']} keys ({out['seconds']:.1f}s)"
        )
    elif out.get("pending"):
        print(
            f"the rescale of {out['computation']!r} to {out['to']} key intervals is written already: start the run, whose next micro-batch moves the state"
        )
    elif out.get("keys") is not None and not out.get("unchanged"):
        print(
            f"rescaled {out['computation']!r} from {out['from']} to {out['to']} key intervals: {out['keys']} keys move in its next micro-batch ({out['seconds']:.1f}s)"
        )
    return 0
