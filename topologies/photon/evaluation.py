"""The Photon evaluation: a run's output against a plain batch join (pandas) of the same logs.

The answer is computed from the log files alone, independently of the joiner: every
line parsed, malformed ones set aside, queries and clicks deduplicated by id, then one
inner join on the query id (:func:`batch_join`). The rules:

* **exact match** — the set of ``joined_clicks`` records equals the batch join's, field
  for field (the default :class:`~.joiner.Adapter`'s shape: both events' fields, with
  ``query_ts`` and ``click_ts``);
* **no click twice** — no click id appears twice in ``joined_clicks``, nor twice in
  ``unjoinable`` (every record of either is a once-production), nor in
  ``joined_clicks`` and ``unjoinable`` with a decided reason; a click one pipeline gave
  up (``no_query``, a tentative decision) and another joined is counted as a superseded
  give-up, not an error;
* **orphans** — every click whose query is never logged is in ``unjoinable`` with reason
  ``no_query``, and nothing else is;
* **dead letters = malformed lines** — each malformed line is on ``dead_letters``, at its
  file and byte offset (stage ``malformed_line``) or by its record id (a click without a
  query id: stage ``key_extractor``);
* **latency** (paced runs only) — click logged → joined output visible, in wall time,
  p50 / p90 / p99 (nearest rank).

>>> import tempfile
>>> from topologies.photon.generator import generate
>>> from topologies.photon.config import GeneratorConfig
>>> d = tempfile.mkdtemp()
>>> truth = generate(d, GeneratorConfig(duration_s=5, rate=50))
>>> answer = batch_join(d)
>>> len(answer.joined) + len(answer.orphans) == truth["clicks"], answer.malformed_lines == truth["malformed_injected"]
(True, True)
>>> report = evaluate(RunResult(answer.joined, [], [], {}), d, truth)
>>> report["exact_match"], report["orphans"]["all_in_unjoinable"]
(True, False)
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .config import PhotonConfig
from .joiner import NO_QUERY


@dataclass
class RunResult:
    """What a run leaves for the evaluation, on any backend."""

    joined: list[dict[str, Any]]
    unjoinable: list[dict[str, Any]]
    #: plain dicts (:meth:`millwheel.DeadLetter.as_dict`)
    dead_letters: list[dict[str, Any]]
    metrics: dict[str, dict[str, int]]
    #: click logged -> joined output visible, wall-time ms, per joined click (paced runs)
    latencies_ms: list[int] | None = None
    elapsed_s: float = 0.0


@dataclass
class BatchAnswer:
    """The batch join of a sample's logs."""

    joined: list[dict[str, Any]]
    orphans: set[str]
    malformed_lines: int
    duplicate_clicks: int
    queries: int = 0
    clicks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def read_records(directory: Path, id_field: str, ts_field: str) -> tuple[list[dict[str, Any]], int]:
    """Valid records of a log directory (what ``LogFileSource`` accepts) and the count of malformed lines."""
    good: list[dict[str, Any]] = []
    bad = 0
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                v = json.loads(line)
            except ValueError:
                bad += 1
                continue
            rid = v.get(id_field) if isinstance(v, dict) else None
            if (
                not isinstance(v, dict)
                or type(v.get(ts_field)) is not int
                or (rid is not None and (type(rid) is not str or not rid))
            ):
                bad += 1
                continue
            good.append(v)
    return good, bad


def batch_join(data_dir: str | os.PathLike[str], config: PhotonConfig | None = None) -> BatchAnswer:
    """The join as a batch job in pandas: dedup by id, one inner join on the query id."""
    c = config or PhotonConfig()
    root = Path(data_dir)
    qs, bad_q = read_records(root / "queries", c.query_id_field, c.ts_field)
    cs, bad_c = read_records(root / "clicks", c.click_id_field, c.ts_field)
    queries = pd.DataFrame(qs).drop_duplicates(subset=[c.query_id_field])
    clicks_all = pd.DataFrame(cs)
    no_query = (
        clicks_all[c.click_query_field].isna()
        if c.click_query_field in clicks_all
        else pd.Series(True, index=clicks_all.index)
    )
    clicks = clicks_all[~no_query].drop_duplicates(subset=[c.click_id_field])
    q = queries.rename(columns={c.ts_field: "query_ts"})
    k = clicks.rename(columns={c.ts_field: "click_ts"})
    if c.click_query_field != c.query_id_field:
        k = k.rename(columns={c.click_query_field: c.query_id_field})
    both = k.merge(q, on=c.query_id_field, how="inner", suffixes=("", "_query"))
    joined = []
    for row in both.to_dict("records"):
        out = {
            key: _plain(v)
            for key, v in row.items()
            if not key.endswith("_query") and not _missing(v)
        }
        if c.click_query_field != c.query_id_field:
            out[c.click_query_field] = out[c.query_id_field]
        joined.append(out)
    orphans = set(k.loc[~k[c.query_id_field].isin(q[c.query_id_field]), c.click_id_field])
    return BatchAnswer(
        joined,
        orphans,
        bad_q + bad_c + int(no_query.sum()),
        len(clicks_all) - int(no_query.sum()) - len(clicks),
        queries=len(queries),
        clicks=len(clicks),
    )


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _canon(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, default=str)


def percentiles(values: list[int]) -> dict[str, float | None]:
    """p50 / p90 / p99 by nearest rank (``None`` for no values)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(values)
    return {f"p{p}": float(np.percentile(a, p, method="inverted_cdf")) for p in (50, 90, 99)} | {
        "max": float(a.max())
    }


def evaluate(
    result: RunResult,
    data_dir: str | os.PathLike[str],
    truth: dict[str, Any] | None = None,
    config: PhotonConfig | None = None,
) -> dict[str, Any]:
    """The report of a run (see the module docstring)."""
    c = config or PhotonConfig()
    answer = batch_join(data_dir, c)
    cid = c.click_id_field
    got = Counter(_canon(r) for r in result.joined)
    want = Counter(_canon(r) for r in answer.joined)
    ids = Counter(r[cid] for r in result.joined)
    unjoinable_ids = Counter(u["click"].get(cid) for u in result.unjoinable)
    no_query = {u["click"].get(cid) for u in result.unjoinable if u.get("reason_code") == NO_QUERY}
    report: dict[str, Any] = {
        "joined": {
            "output": len(result.joined),
            "expected": len(answer.joined),
            "missing": len(set(want) - set(got)),
            "unexpected": len(set(got) - set(want)),
        },
        "exact_match": set(got) == set(want),
        "duplicates_in_output": sum(n - 1 for n in ids.values() if n > 1),
        # every decision goes out once, across pipelines: a click given up twice (a re-injection into
        # a pipeline that had already given it up) is a duplicate as much as one joined twice
        "duplicates_in_unjoinable": sum(n - 1 for n in unjoinable_ids.values() if n > 1),
        # a click given up (``no_query``) by one pipeline and joined by another: the give-up
        # yielded (``once_tentative``) and is superseded; joined and *decided* unjoinable is an error
        "joined_and_unjoinable": len(set(ids) & (set(unjoinable_ids) - no_query)),
        "superseded_give_ups": len(set(ids) & no_query),
        "orphans": {
            "expected": len(answer.orphans),
            "in_unjoinable": len(answer.orphans & no_query),
            "all_in_unjoinable": answer.orphans <= no_query,
            "other_unjoinable": len(set(unjoinable_ids) - answer.orphans - set(ids)),
        },
        "dead_letters": _dead_letters(result.dead_letters, truth, answer),
        "input": {
            "queries": answer.queries,
            "clicks": answer.clicks,
            "duplicate_clicks": answer.duplicate_clicks,
        },
    }
    if truth is not None:
        report["input"].update(
            delayed_queries=truth.get("delayed_queries"),
            clicks_before_query=truth.get("clicks_before_query"),
        )
    report["ok"] = (
        report["exact_match"]
        and report["duplicates_in_output"] == 0
        and report["duplicates_in_unjoinable"] == 0
        and report["joined_and_unjoinable"] == 0
        and report["orphans"]["all_in_unjoinable"]
        and report["orphans"]["other_unjoinable"] == 0
        and report["dead_letters"]["match"]
    )
    if result.latencies_ms is not None:
        report["latency_ms"] = {
            "clicks": len(result.latencies_ms),
            **percentiles(result.latencies_ms),
        }
    joiner = result.metrics.get("Joiner", {})
    report["counters"] = {
        k: joiner.get(k, 0)
        for k in (
            "records_in",
            "duplicates",
            "late",
            "once_committed",
            "once_conflicts",
            "dead_letters",
        )
    }
    report["elapsed_s"] = round(result.elapsed_s, 2)
    return report


def _dead_letters(
    dead: list[dict[str, Any]], truth: dict[str, Any] | None, answer: BatchAnswer
) -> dict[str, Any]:
    stages = Counter(d.get("stage") for d in dead)
    out: dict[str, Any] = {
        "total": len(dead),
        "by_stage": dict(stages),
        "malformed_lines": answer.malformed_lines,
    }
    match = len(dead) == answer.malformed_lines
    if truth is not None:
        at = {(d.get("file"), d.get("offset")) for d in dead if d.get("stage") == "malformed_line"}
        ids = {(d.get("record") or {}).get("id") for d in dead if d.get("stage") == "key_extractor"}
        found = sum(
            1
            for m in truth["malformed"]
            if (
                (m["file"], m["offset"]) in at if m["stage"] == "malformed_line" else m["id"] in ids
            )
        )
        out["injected"] = truth["malformed_injected"]
        out["found"] = found
        match = match and found == truth["malformed_injected"]
    out["match"] = match
    return out


def render(report: dict[str, Any]) -> str:
    """The report as text."""
    j, o, d = report["joined"], report["orphans"], report["dead_letters"]
    lines = [
        "photon evaluation (against a batch join of the same logs in pandas)",
        f"  joined clicks: {j['output']} output, {j['expected']} expected; missing {j['missing']}, unexpected {j['unexpected']}; "
        f"exact match: {report['exact_match']}",
        f"  no click twice: {report['duplicates_in_output'] == report['duplicates_in_unjoinable'] == 0} (duplicates {report['duplicates_in_output']}, "
        f"duplicates in unjoinable {report['duplicates_in_unjoinable']}, joined and unjoinable {report['joined_and_unjoinable']})",
        f"  orphans: {o['in_unjoinable']}/{o['expected']} in unjoinable (all: {o['all_in_unjoinable']}); other unjoinable {o['other_unjoinable']}",
        f"  dead letters: {d['total']} ({d['by_stage']}), malformed lines {d['malformed_lines']}"
        + (f", injected {d['injected']}, found {d['found']}" if "injected" in d else "")
        + f"; match: {d['match']}",
        f"  input: {report['input']}",
        f"  joiner: {report['counters']}",
    ]
    if "latency_ms" in report:
        lat = report["latency_ms"]
        lines.append(
            f"  latency click logged -> joined output visible: p50 {lat['p50']} ms, p90 {lat['p90']} ms, p99 {lat['p99']} ms, max {lat['max']} ms ({lat['clicks']} clicks)"
        )
    lines.append(f"  all checks: {'PASS' if report['ok'] else 'FAIL'}")
    return "\n".join(lines)
