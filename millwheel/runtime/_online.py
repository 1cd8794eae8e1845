"""Rescaling a *running* computation: ``millwheel rescale`` asks the driver that runs it (§7.1).

MillWheel's master splits and merges key intervals while the system runs (§7.1). The
offline rescale (``_rescale.py``) needs the driver stopped; here the running driver does
the same steps itself, for one computation ``C``, while the others go on:

    millwheel rescale RUN --computation C --intervals N [--no-wait]
    millwheel rescale RUN --computation C --layout keys|intervals [--intervals N]

1. **The request** (:func:`request_rescale`). The command finds the driver that holds C's
   lease (the newest epoch of ``leases/C``, ``_lease.py``) and, if it runs, writes
   ``control/rescale/<epoch>-<id>.request`` into the run directory, addressed to that
   epoch. The run directory is the trust boundary, as for leases: a driver takes a request
   only for its own epoch, only from a file its own user owns (on a local disk), and only
   for a computation it runs; anything else is answered ``refused``. A request for an
   epoch that has died is never taken by the next driver (a rescale nobody waits for
   any more would surprise): it answers it instead, from what ``run.json`` holds
   (``_requests.py``, which has the command's side).
2. **A committed batch boundary** (:class:`OnlineRescaler`, polled by the driver loop).
   The driver waits until C's query is between two micro-batches (no trigger active; at
   most ``BOUNDARY_WAIT_S``), stops *only C's query* and waits until its Spark jobs are
   gone (a task of a stopped batch must not write a state file after the move read it).
3. **The move**, in a thread, through the offline path's own steps
   (``_rescale.target``, ``settled``, ``move_state``) with C's own outbox and lease: publish
   C's committed batches, drop a batch planned and not committed (its state files too),
   read the state at the last committed batch, write the move's heartbeat file and
   ``run.json``. A planned batch that published weak productions already is not dropped:
   C's query restarts with its old layout, commits it, and the rescale tries again at the
   next boundary. A layout change (``--layout``, or a per-key computation's ``--intervals``)
   moves through ``_relayout.plan`` and ``move_layout`` instead: the new store is built and
   grafted while C's query is down; ``done`` once a batch on it is published.
4. **C's query restarts** with the new layout (``ComputationQuery.start``: the authority's
   merge and split retire the old sequencer tokens, §7.1); its first batch installs the
   moved envelopes before anything else, as after an offline rescale. The answer is
   ``done`` once a published batch has read the move.

Meanwhile the driver loop goes on for every other query: upstream computations and
injectors keep producing (their files carry C's old ``interval:C`` column, which C's query
keys again on read: ``docs/runtime.md``), downstream ones keep consuming what C published
before; C's low watermark is not reported while its query is down, so it holds where it
was, and downstream timers wait for it. Exactly once under kill -9 at any point: before
``run.json`` changes nothing visible changed; after it, the next start finishes the
rename if it was lost (``_layout.finish_move``) and moves the state in its first batch —
the offline protocol's guarantees. The automatic policy (``_autoscale.py``, ``millwheel run
--autoscale``) sends the same requests from inside the driver.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from millwheel._errors import MillwheelError
from millwheel.runtime._autoscale import Figures, decide
from millwheel.runtime._fs import Location
from millwheel.runtime._layout import computation_layouts, read_pin
from millwheel.runtime._onlinejob import Job as _Job
from millwheel.runtime._outbox import crash_point
from millwheel.runtime._relayout import finish, move_layout, plan, relayout_wanted
from millwheel.runtime._requests import (
    FINAL,
    answers,
    control_dir,
    epoch_of,
    holder,
    orphan_answer,
    read_answer,
    request_rescale,
    rescale,
    rescale_main,
    what,
)
from millwheel.runtime._rescale import move_state, settled, target
from millwheel.runtime._session import quiet_while_stopping, wait_for_jobs
from millwheel.runtime._settings import STATE_LAYOUTS
from millwheel.runtime._settle import PlannedBatchPublished
from millwheel.runtime._state_files import release_state_stores
from millwheel.runtime._wire import IntervalSummary

__all__ = [
    "OnlineRescaler",
    "answers",
    "holder",
    "read_answer",
    "request_rescale",
    "rescale",
    "rescale_main",
]

#: the longest a rescale waits for C's query to be between batches before stopping it anyway
BOUNDARY_WAIT_S = 10.0
#: how often a driver lists the requests
LIST_EVERY_S = 0.5
#: how many times a rescale meets a planned batch with weak productions before it gives up
MAX_ATTEMPTS = 5


# ---- the driver's side ---------------------------------------------------------------------
class OnlineRescaler:
    """The driver's side (steps 2-4 of the module docstring), polled by ``SparkRuntime.poll``;
    with ``RuntimeSettings.autoscale``, also the automatic policy's figures and decisions."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.control = control_dir(rt.root)
        self.jobs: deque[_Job] = deque()
        self.finished: list[_Job] = []
        self._listed = 0.0
        self._seen: set[str] = set()
        self.policy = getattr(rt.settings, "autoscale", None)
        #: per computation: its last batches' figures (autoscale), and when it last changed
        self.history: dict[str, deque[dict[int, Figures]]] = {}
        self.changed_at: dict[str, float] = {}
        #: the automatic policy's decisions, newest last, with their figures and outcome
        self.decisions: list[dict[str, Any]] = []
        self._no_autoscale: set[str] = set()
        if self.policy is not None:
            for name, c in rt.computations.items():
                self.history[name] = deque(maxlen=max(8, self.policy.window))
                c.outbox.on_summary = self._observer(name, c.outbox.on_summary)

    def _observer(
        self, name: str, inner: Callable[[int, list[IntervalSummary]], None]
    ) -> Callable[[int, list[IntervalSummary]], None]:
        def on_summary(batch: int, summaries: list[IntervalSummary]) -> None:
            inner(batch, summaries)
            if summaries:
                self.history[name].append(
                    {s.interval: Figures(s.step_ms, s.keys) for s in summaries}
                )

        return on_summary

    # ---- the loop ------------------------------------------------------------------------
    def busy(self, name: str) -> bool:
        """C's query is stopped for a move: the loop leaves it alone."""
        return (
            bool(self.jobs) and self.jobs[0].computation == name and self.jobs[0].state == "moving"
        )

    def active(self) -> bool:
        return bool(self.jobs)

    def poll(self) -> None:
        if time.monotonic() - self._listed >= LIST_EVERY_S:
            self._listed = time.monotonic()
            self._take_requests()
            self._autoscale()
        if self.jobs:
            self._advance(self.jobs[0])

    def stop(self) -> None:
        """The driver stops: a move under way finishes writing (its state moves at the next start)."""
        for job in list(self.jobs):
            if job.thread is not None:
                job.thread.join()
            self._answer(
                job,
                "failed",
                "the driver stopped before the rescale was done; the next start carries it out if run.json has the new layout",
            )

    def _take_requests(self) -> None:
        names = [
            n
            for n in self.control.list()
            if n.endswith((".request", ".json")) and not n.startswith(".") and n not in self._seen
        ]
        epoch = self.rt.driver_epoch.value
        for name in sorted(names):
            self._seen.add(name)
            if not name.startswith(f"{epoch:012d}-"):
                self._orphan(
                    name.rsplit(".", 1)[0]
                )  # another driver's (or a dead one's): never taken
                continue
            if name.endswith(".json"):
                continue  # this driver's own answer
            loc = self.control.child(name)
            rid = name[: -len(".request")]
            try:
                body = json.loads(loc.read_text() or "")
                problem = self._refusal(loc, body)
            except ValueError as exc:
                body, problem = {}, f"not a rescale request ({exc})"
            job = _Job(
                rid, str(body.get("computation")), body.get("intervals"), layout=body.get("layout")
            )
            if problem is not None:
                self._answer(job, "refused", problem)
                continue
            self.rt.log(
                f"rescale request {rid}: {job.computation} -> {what(job.intervals, job.layout)}"
            )
            self._enqueue(job)

    def _orphan(self, rid: str) -> None:
        """A request or decision of an older driver that died before its answer was final,
        for a computation this driver runs (so that driver holds it no more): answer it from
        what the run directory holds (``_requests.orphan_answer``); never carry it out."""
        epoch = self.rt.driver_epoch.value
        old = epoch_of(rid)
        if old is None or old >= epoch:
            return  # a newer driver's (another driver of the run, started later)
        body = read_answer(self.rt.root, rid)
        if body is None:
            text = self.control.child(f"{rid}.request").read_text()
            try:
                body = {**json.loads(text or ""), "id": rid, "state": "sent"}
            except (ValueError, TypeError):
                return
        if body.get("state") in FINAL or body.get("computation") not in self.rt.computations:
            return  # answered; or a computation another driver may still run
        out = orphan_answer(self.rt.root, body, by=epoch)
        self.control.child(f"{rid}.json").write_text(json.dumps(out))
        self.rt.log(
            f"rescale {rid} of {out.get('computation')} -> {what(out.get('intervals'), out.get('layout'))}: {out['state']} ({out['detail']})"
        )

    def _refusal(self, loc: Location, body: dict[str, Any]) -> str | None:
        if loc.local and os.stat(loc.path).st_uid != os.getuid():
            return (
                f"the request file is not owned by the user running this driver (uid {os.getuid()})"
            )
        if body.get("epoch") != self.rt.driver_epoch.value:
            return f"addressed to driver epoch {body.get('epoch')}, not this one ({self.rt.driver_epoch.value})"
        if body.get("computation") not in self.rt.computations:
            return f"this driver does not run computation {body.get('computation')!r} (it runs {sorted(self.rt.computations)})"
        if body.get("layout") not in (None, *STATE_LAYOUTS):
            return f"layout must be one of {', '.join(STATE_LAYOUTS)}, got {body.get('layout')!r}"
        if (body.get("intervals") is not None or body.get("layout") is None) and (
            type(body.get("intervals")) is not int or body["intervals"] < 1
        ):
            return f"intervals must be a positive integer, got {body.get('intervals')!r}"
        return None

    def _enqueue(self, job: _Job) -> None:
        self.jobs.append(job)
        self._answer(job, "waiting", "queued" if len(self.jobs) > 1 else job.detail)

    def _answer(self, job: _Job, state: str, detail: str) -> None:
        job.state, job.detail = state, detail
        body = {
            "id": job.rid,
            "computation": job.computation,
            "intervals": job.intervals,
            "layout": job.layout,
            "state": state,
            "detail": detail,
            "at_ms": job.at_ms,
            **job.figures,
        }
        if job.decision is not None:
            body["decision"] = {
                "action": job.decision.action,
                "reason": job.decision.reason,
                "figures": job.decision.figures,
            }
        self.control.mkdirs()
        self.control.child(f"{job.rid}.json").write_text(json.dumps(body))
        if state in FINAL:
            self.rt.log(job.text())
            if state != "refused":
                self._note(job.computation, job.text())
            if self.jobs and self.jobs[0] is job:
                self.jobs.popleft()
            self.finished.append(job)
            for d in self.decisions:
                if d.get("id") == job.rid:
                    d["outcome"] = f"{state}: {detail}"
            if job.decision is not None and state != "done":
                self._no_autoscale.add(
                    job.computation
                )  # refused (a layout it cannot move): not tried again

    def _advance(self, job: _Job) -> None:
        c = self.rt.computations[job.computation]
        if job.state == "waiting":
            self._at_boundary(job, c)
        elif job.state == "moving" and job.thread is not None and not job.thread.is_alive():
            self._restart(job, c)
        elif job.state == "restarted":
            r = job.figures
            if job.relayout:  # done once a batch on the new store is published
                moved = c.outbox.published > int((job.result or {}).get("batch", -1))
                detail = f"{r.get('keys', 0)} keys moved from the {r.get('from_layout')!r} layout ({r.get('from')} intervals) to {what(r.get('to'), r.get('to_layout'))}"
            else:  # done once a published batch has read the move
                migration = (
                    (read_pin(self.rt.root).get("computations") or {}).get(job.computation) or {}
                ).get("migration") or {}
                moved = bool(
                    migration.get("moved")
                    or migration.get("file") != (job.result or {}).get("file")
                )
                detail = f"{r.get('keys', 0)} keys moved from {r.get('from')} to {job.intervals} key intervals"
            if moved:
                r["total_s"] = round(time.monotonic() - job.at["requested"], 3)
                r["restart_to_moved_s"] = round(time.monotonic() - job.at["restarted"], 3)
                self.changed_at[job.computation] = time.monotonic()
                self._answer(
                    job,
                    "done",
                    f"{detail}; the query of {job.computation!r} was down {r.get('stopped_s')} s",
                )

    def _at_boundary(self, job: _Job, c: Any) -> None:
        if job.attempts == 0 and "checked" not in job.at:
            job.at["checked"] = time.monotonic()
            try:
                # a layout change (``--layout``, a per-key computation) is checked here and moved at the boundary
                job.relayout = job.decision is None and relayout_wanted(
                    self.rt.root.uri, job.computation, job.layout
                )
                if job.relayout:
                    plan(self.rt.root, job.computation, job.layout, job.intervals)
                done = (
                    None
                    if job.relayout
                    else settled(
                        target(self.rt.root, job.computation, job.intervals),
                        lambda _m: None,
                        time.perf_counter(),
                    )
                )  # type: ignore[arg-type]
            except MillwheelError as exc:
                self._answer(job, "failed", str(exc))
                return
            if done is not None:
                why = (
                    "it has that many key intervals already"
                    if done.get("unchanged")
                    else f"its move to {done['to']} key intervals is written already and runs in its query's next micro-batch"
                    if done.get("pending")
                    else "an interrupted rescale was finished"
                )
                self._answer(job, "done", "nothing to do: " + why)
                return
        q = c.query
        waited = time.monotonic() - job.at.get("retry", job.at["requested"])
        if (
            q is not None
            and q.isActive
            and waited < BOUNDARY_WAIT_S
            and (q.status or {}).get("isTriggerActive", False)
        ):
            return
        if job.attempts and c.outbox.published <= job.at.get("published_then", -1):
            return  # after a retry: wait until the batch that stood in the way is published
        t0 = time.monotonic()
        run_id = str(q.runId) if q is not None else None
        with _quiet(self.rt.spark):
            c.stop()
            wait_for_jobs(self.rt.spark, run_id)
        # the stopped query's state-store providers: their maintenance writes now, into the
        # store the move reads and moves aside, not later into the one that replaces it
        release_state_stores(self.rt.spark, c.checkpoint.child("state"))
        job.figures["stopped_at_batch_boundary"] = waited < BOUNDARY_WAIT_S
        # what it had when the move began: a driver dying in the move changed nothing while run.json still gives these (``_requests.orphan_answer``)
        job.figures["from"] = getattr(c, "intervals", None)
        job.figures["from_layout"] = (
            getattr(self.rt.layouts.get(job.computation), "state_layout", "intervals")
            if hasattr(self.rt, "layouts")
            else None
        )
        job.at["stopped"] = t0
        crash_point(job.computation, "online_stopped", job.intervals)
        job.state, job.detail = "moving", "its query is stopped; moving the state"
        self._answer(job, "moving", job.detail)
        job.thread = threading.Thread(
            target=self._move,
            args=(job, c),
            name=f"millwheel-rescale-{job.computation}",
            daemon=True,
        )
        job.thread.start()

    def _move(self, job: _Job, c: Any) -> None:
        try:
            if job.relayout:
                job.result = self._move_layout(job, c)
                return
            tgt = target(self.rt.root, job.computation, job.intervals)  # type: ignore[arg-type]
            job.result = move_state(tgt, c.outbox, self.rt.spark, self.rt.log, time.perf_counter())
        except BaseException as exc:  # noqa: BLE001 - carried to the loop thread, which restarts the query
            job.error = exc

    def _move_layout(self, job: _Job, c: Any) -> dict[str, Any]:
        """A layout change's move (``_relayout.move_layout``) with this driver's session and C's
        outbox and lease; failed after ``run.json`` recorded it, the swap (which can be redone)
        is finished once more, so that C's query can start again (else its start refuses)."""
        t0 = time.perf_counter()
        change = plan(self.rt.root, job.computation, job.layout, job.intervals)
        if change.pending is not None:
            return finish(change, self.rt.log, t0)
        try:
            return move_layout(change, c.outbox, self.rt.spark, self.rt.log, t0)
        except Exception:
            entry = (read_pin(self.rt.root).get("computations") or {}).get(job.computation) or {}
            if (entry.get("migration") or {}).get("relayout") not in (None, "done"):
                finish(plan(self.rt.root, job.computation, None, None), self.rt.log, t0)
            raise

    def _restart(self, job: _Job, c: Any) -> None:
        """C's query again, with whatever layout ``run.json`` gives it now."""
        held = read_pin(self.rt.root)
        rt = self.rt
        layout = computation_layouts(held, [job.computation], rt.intervals, rt.groups)[
            job.computation
        ]
        rt.layouts[job.computation] = layout
        if layout.own:
            rt.keyer.own[job.computation] = (
                layout.intervals
            )  # producers of this driver key for it from now on
        c.start()
        job.at["restarted"] = time.monotonic()
        down = round(job.at["restarted"] - job.at["stopped"], 3)
        if isinstance(job.error, PlannedBatchPublished) and job.attempts + 1 < MAX_ATTEMPTS:
            job.attempts += 1
            job.at["retry"] = time.monotonic()
            job.at["published_then"] = c.outbox.published
            job.error = None
            self._answer(
                job,
                "waiting",
                f"a planned batch had published weak productions; it commits first, then attempt {job.attempts + 1}",
            )
            return
        if job.error is not None:
            self._answer(
                job,
                "failed",
                f"{job.error} (its query runs again with {what(layout.intervals, layout.state_layout)})",
            )
            return
        r = job.result or {}
        if job.relayout:
            job.figures.update(
                {
                    k: r.get(k)
                    for k in (
                        "keys",
                        "from",
                        "to",
                        "from_layout",
                        "to_layout",
                        "batch",
                        "dropped_planned",
                    )
                }
            )
            job.figures.update(
                {
                    "stopped_s": down,
                    **{k: round(r.get(k, 0.0), 3) for k in ("read_s", "build_s")},
                    "move_s": round(r.get("seconds", 0.0), 3),
                }
            )
            if r.get("finished"):
                self._answer(
                    job,
                    "done",
                    f"finished an interrupted change: its query runs with {what(layout.intervals, layout.state_layout)}",
                )
                return
            crash_point(job.computation, "online_restarted", layout.intervals)
            self._answer(
                job,
                "restarted",
                f"its query runs again with {what(layout.intervals, layout.state_layout)}; done once a batch on the new store is published",
            )
            return
        job.figures.update(
            {
                "keys": r.get("keys"),
                "from": r.get("from"),
                "to": r.get("to"),
                "stopped_s": down,
                "move_s": round(r.get("seconds", 0.0), 3),
                "read_s": round(r.get("read_s", 0.0), 3),
                "dropped_planned": r.get("dropped_planned"),
                "file": r.get("file"),
            }
        )
        if r.get("unchanged") or r.get("finished"):
            self._answer(job, "done", "nothing to move")
            return
        self.history.get(job.computation, deque()).clear()
        crash_point(job.computation, "online_restarted", job.intervals)
        self._answer(
            job,
            "restarted",
            f"its query runs again with {layout.intervals} key intervals; its next batch moves {r.get('keys')} keys",
        )

    # ---- the automatic policy --------------------------------------------------------------
    def _autoscale(self) -> None:
        if self.policy is None:
            return
        now = time.monotonic()
        for name, history in self.history.items():
            if name in self._no_autoscale or any(j.computation == name for j in self.jobs):
                continue
            if getattr(self.rt.layouts.get(name), "state_layout", "intervals") != "intervals":
                continue  # it splits and merges interval rows; a per-key store is rebuilt only on request
            intervals = self.rt.computations[name].intervals
            d = decide(
                name,
                intervals,
                list(history),
                self.policy,
                now_s=now,
                last_change_s=self.changed_at.get(name),
            )
            if d is None:
                continue
            job = _Job(
                f"{self.rt.driver_epoch.value:012d}-auto-{uuid.uuid4().hex[:8]}",
                name,
                d.to_intervals,
                d,
            )
            self.decisions.append(
                {
                    "id": job.rid,
                    "at_ms": int(time.time() * 1000),
                    "computation": name,
                    "action": d.action,
                    "from": d.from_intervals,
                    "to": d.to_intervals,
                    "reason": d.reason,
                    "figures": d.figures,
                }
            )
            del self.decisions[:-20]
            self.rt.log(
                f"autoscale: {d.action} {name} from {d.from_intervals} to {d.to_intervals} key intervals: {d.reason}"
            )
            self._note(
                name, f"autoscale: {d.action} {d.from_intervals} -> {d.to_intervals}: {d.reason}"
            )
            history.clear()
            self.changed_at[name] = now
            self._enqueue(job)

    def _note(self, computation: str, text: str) -> None:
        """Tell the watermark authority, whose dashboard shows it beside the key intervals."""
        try:
            self.rt.watermarks.note(computation, text)
        except Exception as exc:  # noqa: BLE001 - a note is for people: the rescale goes on without it
            self.rt.log(f"could not send the authority a note about {computation!r}: {exc}")

    def status(self, name: str) -> dict[str, Any]:
        """What the live status shows of ``name``'s rescales: the one under way, the last done, the last decision."""
        out: dict[str, Any] = {}
        live = next((j for j in self.jobs if j.computation == name), None)
        if live is not None:
            out["rescale"] = live.text()
        else:
            last = next((j for j in reversed(self.finished) if j.computation == name), None)
            if last is not None:
                out["rescale"] = last.text()
        mine = [d for d in self.decisions if d["computation"] == name]
        if mine:
            out["autoscale"] = mine[-1]
        return out


@contextlib.contextmanager
def _quiet(spark: Any) -> Iterator[None]:
    """Stopping one query interrupts its batch: Spark's errors and py4j's traceback of the
    interrupted ``foreachBatch`` callback are the stop itself, not news (as at a driver's stop)."""

    py4j = logging.getLogger("py4j.clientserver")
    level = py4j.level
    py4j.setLevel(logging.CRITICAL)
    try:
        with quiet_while_stopping(spark):
            yield
    finally:
        py4j.setLevel(level)
