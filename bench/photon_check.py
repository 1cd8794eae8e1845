"""The long form of Photon's Jepsen-style check over seeds nobody chose: the figures of ``docs/photon.md``.

    .venv/bin/python bench/photon_check.py --seeds 5 --rounds 10            # 50 rounds, 5 fresh seeds
    .venv/bin/python bench/photon_check.py --seeds 1 --rounds 1 --outage-min-s 3 --outage-max-s 8

Each seed is drawn at random (``topologies.photon.jepsen.fresh_seed``) and runs ``--rounds``
rounds of ``millwheel photon check``'s long form (registry outages of 30-60 s unless told
otherwise) against a registry of its own. After every round the results so far are written
to ``--out`` (default ``bench/results/photon_check_<date>.json``): each round's seed, plan,
counts (lost, twice per output stream, unseen, joined and unjoinable, unexpected), stops and
refusals, and the totals — so a run stopped early still leaves its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topologies.photon.jepsen import CheckSettings, PhotonCheck, check_registry, fresh_seed  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="fresh seeds to draw (default 5)")
    p.add_argument("--rounds", type=int, default=10, help="rounds per seed (default 10)")
    p.add_argument(
        "--workdir",
        default=".millwheel/photon-check-bench",
        help="where the rounds run (each seed its own directory)",
    )
    p.add_argument(
        "--out",
        default=str(ROOT / "bench" / "results" / f"photon_check_{time.strftime('%Y%m%d')}.json"),
    )
    p.add_argument("--outage-min-s", type=float, default=CheckSettings.outage_min_s)
    p.add_argument("--outage-max-s", type=float, default=CheckSettings.outage_max_s)
    args = p.parse_args(argv)
    settings = CheckSettings(outage_min_s=args.outage_min_s, outage_max_s=args.outage_max_s)
    doc: dict = {
        "what": "millwheel photon check, long form, over fresh random seeds (bench/photon_check.py)",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "settings": asdict(settings),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "seeds": [],
        "rounds": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for i in range(args.seeds):
        seed = fresh_seed()
        doc["seeds"].append(seed)
        print(f"seed {seed} ({i + 1}/{args.seeds}): {args.rounds} rounds", flush=True)
        workdir = Path(args.workdir) / f"seed-{seed}"
        workdir.mkdir(parents=True, exist_ok=True)
        with check_registry(workdir / "registry") as registry:
            check = PhotonCheck(
                workdir, registry, seed=seed, settings=settings, say=lambda m: print(m, flush=True)
            )
            for result in check.run(args.rounds):
                print(result.line(), flush=True)
                doc["rounds"].append({"check_seed": seed, **asdict(result), "ok": result.ok})
                totals = {
                    k: sum(r["counts"][k] for r in doc["rounds"])
                    for k in ("lost", "twice", "unseen", "both", "unexpected", "recovered")
                }
                totals["stops"] = sum(len(r["stops"]) for r in doc["rounds"])
                totals["not_refused"] = sum(len(r["not_refused"]) for r in doc["rounds"])
                doc["totals"] = {
                    "rounds": len(doc["rounds"]),
                    "rounds_ok": sum(r["ok"] for r in doc["rounds"]),
                    "seeds": len(doc["seeds"]),
                    **totals,
                }
                doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
                out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: {doc.get('totals')}")
    return 0 if doc.get("totals", {}).get("rounds_ok") == len(doc["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
