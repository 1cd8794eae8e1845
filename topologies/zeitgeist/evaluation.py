"""The Zeitgeist evaluation: a run's anomalies and counters against the sample's ground truth.

The rules (fixed before any tuning; ``docs/zeitgeist.md``): an anomaly record *matches* an
injected event of the same query and kind if its bucket overlaps the event widened by the
tolerance; precision counts matching records, recall matched events; detection delays
only with a wall clock; late records, duplicates and dead letters next to the numbers
injected. Every malformed line must be on the ``dead_letters`` stream (stage
``malformed_line``), found by its file and byte offset.

>>> truth = {"anomalies": [{"query": "cats", "kind": "dip", "start_ms": 10_000, "end_ms": 14_000}],
...          "malformed": [{"file": "queries_1.jsonl", "offset": 40}], "malformed_injected": 1}
>>> dip = {"query": "cats", "kind": "dip", "window_start": 12_000, "window_end": 13_000, "detected_at": 14_100}
>>> dead = [{"stage": "malformed_line", "file": "queries_1.jsonl", "offset": 40}]
>>> report = evaluate(RunResult([dip], {}, dead, wall_clock=False), truth)
>>> report["by_kind"]["dip"]["precision"], report["by_kind"]["dip"]["recall"]
(1.0, 1.0)
>>> report["dead_letters"]["every_malformed_line_dead_lettered"]
True
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from millwheel import Stage


@dataclass
class RunResult:
    """What a run leaves for the evaluation, on any backend: anomalies, counters, dead letters.

    ``dead_letters`` are plain dicts (:meth:`millwheel.DeadLetter.as_dict`), so a result
    read back from ``metrics.json`` evaluates the same.
    """

    anomalies: list[dict[str, Any]]
    metrics: dict[str, dict[str, int]]
    dead_letters: list[dict[str, Any]]
    #: the run had a (simulated) wall clock: ``detected_at`` means something
    wall_clock: bool
    elapsed_s: float = 0.0


def truth_file(directory: str | os.PathLike[str]) -> Path:
    """``ground_truth.json`` of a sample, given the sample or its ``logs`` directory."""
    p = Path(directory)
    for d in (p, p.parent):
        if (d / "ground_truth.json").is_file():
            return d / "ground_truth.json"
    msg = f"no ground_truth.json in {p} or {p.parent}; generate the sample with `millwheel zeitgeist generate`"
    raise FileNotFoundError(msg)


def load_truth(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ground truth of a sample (see :mod:`.generator`), given the sample or its ``logs``."""
    return json.loads(truth_file(directory).read_text(encoding="utf-8"))


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile; ``None`` for no values.

    >>> percentile([5, 1, 3, 2, 4], 50), percentile([5, 1, 3, 2, 4], 95), percentile([], 50)
    (3, 5, None)
    """
    if not values:
        return None
    s = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(s)))
    return s[rank - 1]


def matches(anomaly: Mapping[str, Any], event: Mapping[str, Any], tolerance_ms: int) -> bool:
    """The matching rule: same query and kind, and the anomaly's bucket overlaps the event ± tolerance.

    >>> ev = {"query": "cats", "kind": "dip", "start_ms": 10_000, "end_ms": 15_000}
    >>> a = {"query": "cats", "kind": "dip", "window_start": 15_000, "window_end": 16_000}
    >>> matches(a, ev, 1_000), matches(a, ev, 0), matches({**a, "kind": "spike"}, ev, 1_000)
    (True, False, False)
    """
    return (
        anomaly["query"] == event["query"]
        and anomaly["kind"] == event["kind"]
        and anomaly["window_start"] < event["end_ms"] + tolerance_ms
        and anomaly["window_end"] > event["start_ms"] - tolerance_ms
    )


def evaluate(
    result: RunResult,
    truth: Mapping[str, Any],
    *,
    tolerance_ms: int = 1_000,
    counter: str = "WindowCounter",
) -> dict[str, Any]:
    """Compare a run's anomalies with the ground truth; see ``docs/zeitgeist.md`` for every rule."""
    events = list(truth["anomalies"])
    anomalies = result.anomalies
    report: dict[str, Any] = {
        "tolerance_ms": tolerance_ms,
        "anomalies": len(anomalies),
        "events": len(events),
    }
    matched_anomaly = [False] * len(anomalies)
    by_query: dict[str, list[int]] = {}
    for i, ev in enumerate(events):
        by_query.setdefault(ev["query"], []).append(i)
    first_detection: dict[int, int] = {}
    delays: dict[str, list[int]] = {"spike": [], "dip": []}
    for j, a in enumerate(anomalies):
        for i in by_query.get(a["query"], []):
            if matches(a, events[i], tolerance_ms):
                matched_anomaly[j] = True
                t = a.get("detected_at")
                if t is not None and (i not in first_detection or t < first_detection[i]):
                    first_detection[i] = t
        if matched_anomaly[j] and result.wall_clock:
            delays[a["kind"]].append(a["detected_at"] - a["window_end"])
    per_kind: dict[str, Any] = {}
    for kind in ("spike", "dip", "all"):
        idx_a = [j for j, a in enumerate(anomalies) if kind in ("all", a["kind"])]
        idx_e = [i for i, e in enumerate(events) if kind in ("all", e["kind"])]
        tp_a = sum(matched_anomaly[j] for j in idx_a)
        detected = [i for i in idx_e if i in first_detection]
        entry: dict[str, Any] = {
            "anomalies": len(idx_a),
            "matched_anomalies": tp_a,
            "events": len(idx_e),
            "detected_events": len(detected),
            "precision": tp_a / len(idx_a) if idx_a else None,
            "recall": len(detected) / len(idx_e) if idx_e else None,
        }
        if result.wall_clock:
            d = delays["spike"] + delays["dip"] if kind == "all" else delays[kind]
            first = [first_detection[i] - events[i]["start_ms"] for i in detected]
            entry["delay_beyond_bucket_end_ms"] = {
                "p50": percentile(d, 50),
                "p95": percentile(d, 95),
                "max": max(d) if d else None,
                "n": len(d),
            }
            entry["first_detection_after_start_ms"] = {
                "p50": percentile(first, 50),
                "p95": percentile(first, 95),
            }
        per_kind[kind] = entry
    report["by_kind"] = per_kind
    report["missed"] = [events[i] for i in range(len(events)) if i not in first_detection]
    report["false_positives"] = [
        anomalies[j] for j in range(len(anomalies)) if not matched_anomaly[j]
    ]

    m = result.metrics.get(counter, {})
    delivered = m.get("records_in", 0)
    unique = delivered - m.get("duplicates", 0)
    report["records"] = {
        "delivered": delivered,
        "unique": unique,
        "events_generated": truth.get("events"),
    }
    report["late"] = {
        "dropped": m.get("late_dropped", 0),
        "injected": truth.get("late_injected"),
        "fraction": m.get("late_dropped", 0) / unique if unique else None,
        "millwheel_reported_fraction": 1e-5,
    }
    report["duplicates"] = {
        "injected": truth.get("duplicates_injected"),
        "seen_and_removed": {
            name: mm.get("duplicates", 0)
            for name, mm in result.metrics.items()
            if mm.get("duplicates", 0) or name == counter
        },
    }
    malformed_dead = [d for d in result.dead_letters if d.get("stage") == Stage.MALFORMED]
    seen_at = {(d.get("file"), d.get("offset")) for d in malformed_dead}
    found = [(x["file"], x.get("offset")) in seen_at for x in truth.get("malformed", [])]
    report["dead_letters"] = {
        "total": len(result.dead_letters),
        "malformed_lines": len(malformed_dead),
        "malformed_injected": truth.get("malformed_injected"),
        "every_malformed_line_dead_lettered": all(found),
        "other": len(result.dead_letters) - len(malformed_dead),
    }
    report["elapsed_s"] = round(result.elapsed_s, 2)
    report["wall_clock"] = (
        "continuous simulation" if result.wall_clock else "none (batch): no delay figures"
    )
    return report


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    if pct:
        return f"{x:.3f}"
    return str(x)


def render(report: Mapping[str, Any]) -> str:
    """The evaluation as text, as ``run`` prints it."""
    lines = [
        f"zeitgeist evaluation (match: same query+kind, bucket overlaps event ± {report['tolerance_ms']} ms; wall clock: {report['wall_clock']})"
    ]
    for kind in ("spike", "dip", "all"):
        e = report["by_kind"][kind]
        line = (
            f"  {kind:<5} precision {_fmt(e['precision'], True)} ({e['matched_anomalies']}/{e['anomalies']} anomalies)  "
            f"recall {_fmt(e['recall'], True)} ({e['detected_events']}/{e['events']} events)"
        )
        if "delay_beyond_bucket_end_ms" in e:
            d, f = e["delay_beyond_bucket_end_ms"], e["first_detection_after_start_ms"]
            line += (
                f"  delay beyond bucket end p50 {_fmt(d['p50'])} ms p95 {_fmt(d['p95'])} ms max {_fmt(d['max'])} ms"
                f"; first detection after start p50 {_fmt(f['p50'])} ms p95 {_fmt(f['p95'])} ms"
            )
        lines.append(line)
    late, dup, dl, rec = (
        report["late"],
        report["duplicates"],
        report["dead_letters"],
        report["records"],
    )
    frac = late["fraction"]
    lines.append(
        f"  records: {rec['delivered']} delivered, {rec['unique']} unique ({rec['events_generated']} generated)"
    )
    lines.append(
        f"  late records dropped: {late['dropped']} (injected {late['injected']}), "
        f"{'n/a' if frac is None else f'{frac * 100:.4f}%'} of records (MillWheel reports about 0.001%)"
    )
    seen = ", ".join(f"{k} {v}" for k, v in dup["seen_and_removed"].items())
    lines.append(f"  duplicates injected {dup['injected']}; seen and removed: {seen}")
    lines.append(
        f"  dead letters: {dl['total']} ({dl['malformed_lines']} malformed lines, injected {dl['malformed_injected']}, "
        f"all accounted for: {dl['every_malformed_line_dead_lettered']}; other {dl['other']})"
    )
    if report["missed"]:
        lines.append(
            "  missed: "
            + "; ".join(
                f"{m['kind']} {m['query']!r} [{m['start_ms']}, {m['end_ms']})"
                for m in report["missed"][:10]
            )
        )
    if report["false_positives"]:
        lines.append(
            "  false positives: "
            + "; ".join(
                f"{a['kind']} {a['query']!r} @{a['window_start']} ({a['actual']} vs {a['expected']})"
                for a in report["false_positives"][:10]
            )
        )
    if report["elapsed_s"]:  # `millwheel run` prints its own run time
        lines.append(f"  ran in {report['elapsed_s']} s")
    return "\n".join(lines)
