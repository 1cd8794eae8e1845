"""At most once across pipelines (Photon §2): what a registry, a verifier or a topology needs.

``produce(stream, value, once_id=...)`` makes a production conditional on a shared
IdRegistry; the backends resolve it (``millwheel/_once.py``). This module is the public
side of that contract, for code outside the framework — a registry of one's own, a
verification tool (``topologies/photon/verify.py``):

* :class:`OnceRegistry` — ``commit_many([(id, token, event time)])`` answering
  :class:`OnceResult` per item; optionally ``holders(ids)`` and ``clear_many(ids,
  only_if_token=...)``, which the roster and tentative take-overs use;
* :func:`once_token`, :func:`pipeline_id`, :func:`holder_of` — how tokens are made, and
  which pipeline identity (``name#epoch``) a token names; :data:`TENTATIVE` ends the
  token of a tentative production;
* :func:`roster`, :func:`join_roster` — the pipelines that share a registry.
"""

from __future__ import annotations

from millwheel._once import (
    TENTATIVE,
    Member,
    MemoryOnceRegistry,
    OnceRegistry,
    OnceResult,
    PipelineNameTaken,
    holder_of,
    join_roster,
    once_token,
    pipeline_id,
    roster,
)

__all__ = [
    "TENTATIVE",
    "Member",
    "MemoryOnceRegistry",
    "OnceRegistry",
    "OnceResult",
    "PipelineNameTaken",
    "holder_of",
    "join_roster",
    "once_token",
    "pipeline_id",
    "roster",
]
