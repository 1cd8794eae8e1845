"""The checker of ``millwheel photon check``: the union of the runs' outputs against a batch join.

Per click, over every pipeline's published output:

* **lost** — joinable (in the batch join of the complete logs), in no ``joined_clicks``;
* **twice** — in one output stream more than once, whichever pipelines wrote it: in
  ``joined_clicks`` (billed twice) or in ``unjoinable`` (reported twice: every record of
  either stream is a once-production, so one is the most there may be); counted per stream;
* **unseen** — an orphan (no query in the logs) in no ``unjoinable``;
* **both** — joined, and *decided* unjoinable (an adapter's skip);
* **unexpected** — joined, and not in the batch join.

Any of them fails the round. A click one pipeline gave up (``no_query``, a tentative
decision) and another joined is a superseded give-up, reported and not a failure.

>>> Counts(joinable=3, orphans=1).ok, Counts(lost=1).ok, Counts(twice=1).ok
(True, False, False)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .config import PhotonConfig
from .drivers import read_run
from .evaluation import batch_join
from .joiner import JOINED, NO_QUERY, UNJOINABLE


@dataclass
class Counts:
    """What the checker counted over the union of the runs' outputs."""

    joinable: int = 0
    orphans: int = 0
    lost: int = 0
    #: clicks in one output stream more than once, over every stream (see ``twice_by_stream``)
    twice: int = 0
    unseen: int = 0
    both: int = 0
    unexpected: int = 0
    superseded_give_ups: int = 0
    recovered: int = 0
    #: clicks more than once, per output stream (``joined_clicks``, ``unjoinable``)
    twice_by_stream: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.lost == self.twice == self.unseen == self.both == self.unexpected == 0

    def line(self) -> str:
        per = ", ".join(f"{s} {n}" for s, n in sorted(self.twice_by_stream.items()))
        return (
            f"joinable {self.joinable}, orphans {self.orphans}: lost {self.lost}, twice {self.twice}{f' ({per})' if per else ''}, "
            f"unseen {self.unseen}, joined and unjoinable {self.both}, unexpected {self.unexpected}; "
            f"superseded give-ups {self.superseded_give_ups}, recovered by verification {self.recovered}"
        )


def check_outputs(data: Path, runs: list[Path], config: PhotonConfig) -> Counts:
    """The checker: the union of ``runs``' outputs against a batch join of the logs in ``data``."""
    answer = batch_join(data, config)
    cid = config.click_id_field
    joinable = {j[cid] for j in answer.joined}
    joined: Counter[str] = Counter()
    reported: Counter[str] = Counter()
    gave_up: set[str] = set()
    decided: set[str] = set()
    for run in runs:
        out = read_run(run)
        joined.update(j[cid] for j in out.joined)
        for u in out.unjoinable:
            reported[u["click"][cid]] += 1
            (gave_up if u.get("reason_code") == NO_QUERY else decided).add(u["click"][cid])
    twice = {
        JOINED: sum(1 for n in joined.values() if n > 1),
        UNJOINABLE: sum(1 for n in reported.values() if n > 1),
    }
    return Counts(
        joinable=len(joinable),
        orphans=len(answer.orphans),
        lost=len(joinable - set(joined)),
        twice=sum(twice.values()),
        twice_by_stream=twice,
        unseen=len(answer.orphans - gave_up),
        both=len(set(joined) & decided),
        unexpected=len(set(joined) - joinable),
        superseded_give_ups=len(set(joined) & gave_up),
    )
