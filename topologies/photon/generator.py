"""The seeded sample: query and click logs with every difficulty of Photon §1.2, and its ground truth.

``generate(out_dir, GeneratorConfig(...))`` writes

* ``out_dir/queries/queries_<time_ms>.jsonl``: one query a line, ``{"query_id", "ts",
  "advertiser_id", "ad_text", "terms"}``; the query id encodes the server, the process and
  the timestamp, ``"10.0.3.7:4242:1700000000123:17"`` (§3.1), which the log store uses;
* ``out_dir/clicks/clicks_<time_ms>.jsonl``: ``{"click_id", "query_id", "ts", "ad_slot"}``;
* a ``_DONE`` marker in each directory, and ``out_dir/ground_truth.json``.

What makes it hard, all seeded: a share of queries is logged seconds after their clicks
(the delayed primary stream, §1.2: "it is not uncommon for a subset of query logs to be
delayed relative to the corresponding click logs"), the same click or query is delivered
twice, orphan clicks name a query that is never logged, malformed lines in both logs
(broken JSON, a missing or non-integer timestamp) and clicks without a query id.

Files rotate every ``file_ms`` of *arrival* time, like logs; a file's time (in its name)
is its rotation time minus ``max_ship_delay_ms``, a lower bound on its on-time events.

>>> import tempfile
>>> truth = generate(tempfile.mkdtemp(), GeneratorConfig(duration_s=10, rate=100))
>>> truth["clicks"] > 0, truth["orphan_clicks"] > 0, truth["clicks_before_query"] > 0
(True, True, True)
>>> sorted(m["stage"] for m in truth["malformed"])[:2]
['key_extractor', 'key_extractor']
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .config import GeneratorConfig

WORDS = [
    "flowers",
    "shoes",
    "pizza",
    "flights",
    "hotel",
    "guitar",
    "laptop",
    "coffee",
    "tickets",
    "camera",
    "yoga",
    "bike",
    "tent",
    "watch",
    "piano",
    "paint",
    "books",
    "tea",
    "garden",
    "chess",
]
#: the environment variable that points at the default sample's directory
DATA_ENV = "PHOTON_DATA"


def query_time(query_id: str) -> int | None:
    """The timestamp encoded in a Photon query id (``server:process:time:seq``, §3.1), or ``None``.

    >>> query_time("10.0.3.7:4242:1700000000123:17"), query_time("q-1")
    (1700000000123, None)
    """
    parts = query_id.split(":")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return int(parts[2])


class _Log:
    """Lines of one log, by arrival time, cut into files."""

    def __init__(self, kind: str, cfg: GeneratorConfig) -> None:
        self.kind = kind
        self.cfg = cfg
        self.lines: list[tuple[int, int, str]] = []  # (arrival, order, line)

    def add(self, arrival: int, line: str) -> None:
        self.lines.append((arrival, len(self.lines), line))

    def file_of(self, arrival: int) -> int:
        return (arrival - self.cfg.start_ms) // self.cfg.file_ms

    def file_time(self, k: int) -> int:
        return self.cfg.start_ms + k * self.cfg.file_ms - self.cfg.max_ship_delay_ms

    def files(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for arrival, _, line in sorted(self.lines):
            out.setdefault(self.file_of(arrival), []).append(line)
        return out

    def write(self, directory: Path) -> list[dict[str, Any]]:
        directory.mkdir(parents=True, exist_ok=True)
        for old in [*directory.glob(f"{self.kind}_*.jsonl"), directory / "_DONE"]:
            old.unlink(missing_ok=True)
        written = []
        for k, lines in sorted(self.files().items()):
            path = directory / f"{self.kind}_{self.file_time(k)}.jsonl"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            t = self.file_time(k) / 1_000
            os.utime(path, (t, t))
            written.append(
                {
                    "name": path.name,
                    "time_ms": self.file_time(k),
                    "lines": len(lines),
                    "written_from_ms": self.cfg.start_ms + k * self.cfg.file_ms,
                    "written_to_ms": self.cfg.start_ms + (k + 1) * self.cfg.file_ms,
                }
            )
        (directory / "_DONE").write_text("")
        return written


def generate(out_dir: str | os.PathLike[str], cfg: GeneratorConfig | None = None) -> dict[str, Any]:
    """Write a sample to ``out_dir`` (see the module docstring); return the ground truth."""
    cfg = cfg or GeneratorConfig()
    rng = random.Random(cfg.seed)
    root = Path(out_dir)
    queries, clicks = _Log("queries", cfg), _Log("clicks", cfg)
    end_ms = cfg.start_ms + cfg.duration_s * 1_000
    n_queries = int(cfg.rate * cfg.duration_s)
    seq: dict[tuple[int, int], int] = {}

    def ship(ts: int) -> int:
        return ts + rng.randint(0, cfg.max_ship_delay_ms)

    def new_query_id(ts: int) -> str:
        server, process = rng.randrange(cfg.servers), rng.randrange(cfg.processes)
        n = seq[(server, process)] = seq.get((server, process), 0) + 1
        return f"10.0.{server}.{1 + server % 250}:{4000 + process}:{ts}:{n}"

    query_ts: dict[str, int] = {}
    query_logged: dict[str, int] = {}
    delayed = dup_queries = 0
    for ts in sorted(rng.randrange(cfg.start_ms, end_ms) for _ in range(n_queries)):
        qid = new_query_id(ts)
        adv = f"adv-{min(int(rng.paretovariate(1.2)), cfg.advertisers)}"
        terms = rng.sample(WORDS, rng.randint(1, 3))
        line = json.dumps(
            {
                "query_id": qid,
                "ts": ts,
                "advertiser_id": adv,
                "ad_text": f"best {terms[0]} deals",
                "terms": terms,
            }
        )
        if rng.random() < cfg.delayed_query_fraction:
            arrival = ts + rng.randint(cfg.min_query_delay_ms, cfg.max_query_delay_ms)
            delayed += 1
        else:
            arrival = ship(ts)
        queries.add(arrival, line)
        query_ts[qid], query_logged[qid] = ts, arrival
        if rng.random() < cfg.duplicate_query_fraction:
            queries.add(arrival + rng.randint(1, 3_000), line)
            dup_queries += 1

    click_logged: dict[str, int] = {}
    click_lines: list[tuple[str, str, int, str]] = []  # (click id, line, arrival, query id)
    n_click = 0

    def add_click(qid: str, ts: int) -> None:
        nonlocal n_click
        n_click += 1
        cid = f"c{cfg.seed}-{n_click:07d}"
        line = json.dumps(
            {"click_id": cid, "query_id": qid, "ts": ts, "ad_slot": rng.randint(1, 4)}
        )
        arrival = ship(ts)
        clicks.add(arrival, line)
        click_logged[cid] = arrival
        click_lines.append((cid, line, arrival, qid))

    for qid, ts in query_ts.items():
        if rng.random() >= cfg.click_rate:
            continue
        for _ in range(2 if rng.random() < cfg.second_click_rate else 1):
            delay = min(cfg.click_delay_max_ms, int(rng.expovariate(1 / cfg.click_delay_mean_ms)))
            add_click(qid, ts + 1 + delay)
    n_orphans = max(1, round(cfg.orphan_click_fraction * n_click)) if n_click else 0
    orphans = []
    for _ in range(n_orphans):
        ts = rng.randrange(cfg.start_ms, end_ms)
        add_click(new_query_id(ts - rng.randint(1, 5_000)), ts)  # never logged
        orphans.append(click_lines[-1][0])
    n_dup = round(cfg.duplicate_click_fraction * len(click_lines))
    for _, line, arrival, _ in rng.sample(click_lines, n_dup):
        clicks.add(arrival + rng.randint(1, 3_000), line)
    before = sum(
        1
        for _, _, arrival, qid in click_lines
        if qid in query_logged and arrival < query_logged[qid]
    )

    malformed = _malformed(queries, cfg.malformed_queries, rng, cfg) + _malformed(
        clicks, cfg.malformed_clicks, rng, cfg
    )
    for j in range(cfg.clicks_without_query_id):
        cid = f"bad-click-{j}"
        ts = rng.randrange(cfg.start_ms, end_ms)
        clicks.add(ship(ts), json.dumps({"click_id": cid, "ts": ts, "ad_slot": 1}))
        malformed.append(
            {"log": "clicks", "kind": "no_query_id", "stage": "key_extractor", "id": cid}
        )

    files = {"queries": queries.write(root / "queries"), "clicks": clicks.write(root / "clicks")}
    _locate(root, malformed)
    truth = {
        "generator": asdict(cfg),
        "queries": len(query_ts),
        "clicks": len(click_lines),
        "orphan_clicks": len(orphans),
        "orphans": sorted(orphans),
        "delayed_queries": delayed,
        "clicks_before_query": before,
        "duplicate_clicks": n_dup,
        "duplicate_queries": dup_queries,
        "malformed_injected": len(malformed),
        "malformed": malformed,
        "click_logged_ms": click_logged,
        "files": files,
    }
    (root / "ground_truth.json").write_text(json.dumps(truth, indent=1), encoding="utf-8")
    return truth


_BAD = [
    ("broken_json", '{"ts": 17000'),
    ("missing_ts", '{"note": "no timestamp"}'),
    ("non_integer_ts", '{"ts": "soon"}'),
]


def _malformed(log: _Log, n: int, rng: random.Random, cfg: GeneratorConfig) -> list[dict[str, Any]]:
    out = []
    for j in range(n):
        kind, text = _BAD[j % len(_BAD)]
        marker = f"bad-{log.kind}-{j}"
        arrival = rng.randrange(cfg.start_ms, cfg.start_ms + cfg.duration_s * 1_000)
        log.add(arrival, text.replace('{"', '{"marker": "' + marker + '", "', 1))
        out.append({"log": log.kind, "kind": kind, "stage": "malformed_line", "marker": marker})
    return out


def _locate(root: Path, malformed: list[dict[str, Any]]) -> None:
    """File and byte offset of each malformed line (what its dead letter names)."""
    for m in malformed:
        needle = m.get("marker") or m["id"]
        for path in sorted((root / m["log"]).glob("*.jsonl")):
            data = path.read_bytes()
            i = data.find(f'"{needle}"'.encode())
            if i >= 0:
                m["file"], m["offset"] = path.name, data.rfind(b"\n", 0, i) + 1
                break


def default_sample_dir() -> Path:
    """Where the default sample lives (generated on first use; ``PHOTON_DATA`` overrides)."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[2]
    return root / ".millwheel" / "data" / GeneratorConfig().derived_name()


def is_default_sample_dir(directory: str | os.PathLike[str]) -> bool:
    """True if ``directory`` is the default sample's location (the only one a run generates into)."""
    return Path(directory).resolve() == default_sample_dir().resolve()


def ensure_sample(
    directory: str | os.PathLike[str] | None = None, cfg: GeneratorConfig | None = None
) -> Path:
    """The default sample's directory, generating it (seeded, so always the same) if it is missing.

    ``directory`` may name that location (``None``: :func:`default_sample_dir`); any other
    directory is returned only if it already holds a sample (``ground_truth.json``), and is
    never written: it may be a user's logs. ``millwheel photon
    generate DIR`` (:func:`generate`) writes a sample anywhere it is told to.
    """
    path = Path(directory) if directory is not None else default_sample_dir()
    if (path / "ground_truth.json").is_file():
        return path
    if not is_default_sample_dir(path):
        msg = (
            f"{path} holds no generated sample (no ground_truth.json), and photon generates one only at the "
            f"default sample's location ({default_sample_dir()}); `millwheel photon generate {path}` writes one there"
        )
        raise ValueError(msg)
    started = time.perf_counter()
    truth = generate(path, cfg)
    print(
        f"photon: generated {truth['queries']} queries and {truth['clicks']} clicks at {path} "
        f"in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    return path


def check_logs(directory: str | os.PathLike[str]) -> Path:
    """``directory`` if it is laid out as Photon reads logs: ``queries/`` and ``clicks/``
    directories of JSON-lines files (e.g. ``queries/queries-2026-01-01.jsonl``); else
    :class:`FileNotFoundError` saying what is missing."""
    path = Path(directory)
    if not path.is_dir():
        msg = f"{path}: no such directory"
        raise FileNotFoundError(msg)
    missing = [name for name in ("queries", "clicks") if not (path / name).is_dir()]
    if missing:
        msg = (
            f"{path} has no {' and no '.join(f'{m}/' for m in missing)} directory: Photon reads query logs from "
            f"DATA/queries/ and click logs from DATA/clicks/, one JSON object a line (e.g. DATA/queries/queries-2026-01-01.jsonl, "
            f"DATA/clicks/clicks-2026-01-01.jsonl); run without DATA for the default sample, or `millwheel photon generate DIR` for a sample"
        )
        raise FileNotFoundError(msg)
    return path


def resolve_data_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """The logs a run reads: the default sample when ``directory`` is ``None`` or its location
    (generated there if missing); else ``directory`` as it is, a sample or a user's logs, read and
    never written (:func:`check_logs`)."""
    if directory is None or is_default_sample_dir(directory):
        return ensure_sample(directory)
    return check_logs(directory)


def has_truth(directory: str | os.PathLike[str]) -> bool:
    """True if ``directory`` is a generated sample (it has the ground truth); a user's logs do not."""
    return (Path(directory) / "ground_truth.json").is_file()


def load_truth(directory: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads((Path(directory) / "ground_truth.json").read_text(encoding="utf-8"))
