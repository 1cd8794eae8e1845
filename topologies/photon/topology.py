"""The Photon topology (§3, Fig. 5): :func:`build`, its sources, its ``on_finish``.

::

    queries ──┐                                            ┌─► joined_clicks  (once_id = click id)
    clicks ───┼─► Joiner (key: query id; EventStore cache, ┤
    reinjected┘    retries, unjoinable rule, adapter)      └─► unjoinable     (with its reason)

``millwheel run topologies/photon`` imports the package, calls :func:`build` on the
default generated sample and prints :func:`on_finish` (the evaluation) once drained.

>>> t = join_topology()
>>> t.order(), sorted(t.injectors), sorted(s.stream for s in t.sinks.values())
(['Joiner'], ['clicks', 'queries'], ['joined_clicks', 'unjoinable'])
>>> on_finish(t, {}, {})
'photon: no ground truth for this source; nothing to evaluate'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from millwheel import (
    DEAD_LETTER_STREAM,
    ComputationOptions,
    DedupOptions,
    LatePolicy,
    LogFileSource,
    Source,
    Topology,
)

from .columnar import ColumnarJoiner
from .config import PhotonConfig
from .evaluation import RunResult, evaluate, render
from .generator import load_truth, resolve_data_dir
from .joiner import JOIN_STATE, JOINED, REINJECT_ID, UNJOINABLE, Adapter, Joiner

__all__ = ["build", "join_topology", "make_sources", "on_finish"]


def make_sources(
    data_dir: str | os.PathLike[str], config: PhotonConfig | None = None, *, finite: bool = True
) -> dict[str, LogFileSource]:
    """The two log injectors' sources, for both backends: the one place that names them.

    Queries declare ``query_lateness_ms`` of disorder (the delayed primary stream): a
    query logged that late is not late, and holds the low watermark until it may arrive.
    Malformed lines go to ``dead_letters`` with file and offset. ``finite``: the logs are
    complete (a finished sample); a live run reads growing files (``idle_finish_ms``).
    """
    c = config or PhotonConfig()
    root = Path(data_dir)
    common = {
        "ts_field": c.ts_field,
        "finite": finite,
        "idle_finish_ms": c.idle_finish_ms,
        "max_bytes_per_batch": c.max_bytes_per_batch,
    }
    return {
        "queries": LogFileSource(
            root / "queries", id_field=c.query_id_field, lateness_ms=c.query_lateness_ms, **common
        ),
        "clicks": LogFileSource(
            root / "clicks", id_field=c.click_id_field, lateness_ms=c.click_lateness_ms, **common
        ),
    }


def reinject_source(
    directory: str | os.PathLike[str], config: PhotonConfig | None = None
) -> LogFileSource:
    """Where verification re-injects clicks for this pipeline (§3.3.3); see ``verify.py``.

    The directory carries a ``_DONE`` marker from the start (``drivers.prepare_reinject``),
    so the injector's low watermark is +inf and holds nothing; re-injected clicks are
    late by construction and the joiner processes late records.
    """
    c = config or PhotonConfig()
    return LogFileSource(directory, id_field=REINJECT_ID, ts_field=c.ts_field, finite=True)


def join_topology(
    config: PhotonConfig | None = None,
    *,
    sources: Mapping[str, Source | None] | None = None,
    queries_dir: str | os.PathLike[str] | None = None,
    adapter: Adapter | None = None,
) -> Topology:
    """The topology around :class:`~.joiner.Joiner`; ``sources`` maps ``queries``, ``clicks``
    (and optionally ``reinjected``) to their sources (default: none, for the harness)."""
    c = config or PhotonConfig()
    sources = dict(sources or {"queries": None, "clicks": None})
    t = Topology("photon")
    for name in ("queries", "clicks", "reinjected"):
        if name in sources:
            t.injector(name, sources[name])
    qf, cq = c.query_id_field, c.click_query_field
    inputs: dict[str, Any] = {"queries": lambda r: r.value[qf], "clicks": lambda r: r.value[cq]}
    if "reinjected" in sources:
        inputs["reinjected"] = lambda r: r.value[cq]
    options = ComputationOptions(
        late=LatePolicy.process(),  # delayed queries, re-injected clicks: late, and wanted
        dedup=DedupOptions(
            slack_ms=c.dedup_slack_ms, gc_interval_ms=max(1_000, c.dedup_slack_ms // 6)
        ),
        state_codec=JOIN_STATE,
        mapping=c.joiner_mapping,
    )
    t.computation(
        ColumnarJoiner if c.columnar_joiner else Joiner,
        name="Joiner",
        inputs=inputs,
        outputs=[JOINED, UNJOINABLE],
        options=options,
        params={
            "config": c,
            "adapter": adapter,
            "queries_dir": None if queries_dir is None else os.fspath(queries_dir),
        },
    )
    t.sink(JOINED)
    t.sink(UNJOINABLE)
    return t


def build(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    config: PhotonConfig | None = None,
    adapter: Adapter | None = None,
    reinject_dir: str | os.PathLike[str] | None = None,
    finite: bool = True,
) -> Topology:
    """The Photon topology reading ``data_dir`` (default: the default sample, generated if missing;
    any other directory is read, never written).

    ``reinject_dir``: this pipeline's re-injection directory (``verify.py``); ``finite``:
    the logs are complete (``False`` for a live run over growing logs).
    """
    c = config or PhotonConfig()
    root = resolve_data_dir(
        data_dir
    )  # the default sample (generated if missing), or logs read as they are
    sources: dict[str, Source | None] = dict(make_sources(root, c, finite=finite))
    if reinject_dir is not None:
        sources["reinjected"] = reinject_source(reinject_dir, c)
    return join_topology(c, sources=sources, queries_dir=root / "queries", adapter=adapter)


def on_finish(
    topology: Topology, streams: Mapping[str, list[Any]], metrics: Mapping[str, Mapping[str, int]]
) -> str:
    """The evaluation of a finished run, as text (for ``millwheel run`` to print)."""
    path = getattr(topology.injectors["queries"].source, "path", None)
    if path is None or not (Path(path).parent / "ground_truth.json").is_file():
        return "photon: no ground truth for this source; nothing to evaluate"
    root = Path(path).parent
    dead = [v.as_dict() for v in streams.get(DEAD_LETTER_STREAM, [])]
    result = RunResult(
        list(streams.get(JOINED, [])),
        list(streams.get(UNJOINABLE, [])),
        dead,
        {k: dict(v) for k, v in metrics.items()},
    )
    return render(evaluate(result, root, load_truth(root)))
