"""The identity of productions: never reused within a pipeline epoch, reproduced by a replay.

A production's id is ``production_id(computation, key, seq, life)`` (docs/concepts.md,
"The identity of a production"). ``seq`` counts the key's productions within one *life*
of the key. A life starts with the key's first production since the key was made from
nothing (its envelope; a columnar computation: its entry in the store's ``meta``), and
ends when the key keeps nothing and is forgotten (its dedup ids collected by event time,
every key of a drained run). ``life`` is fixed by the batch of that first production — on
Spark the query's id (kept in its checkpoint) and the micro-batch's id, in the harness
the computation's committed round — so:

* a replay of the batch (a crash before its commit) starts the same lives and numbers the
  same productions alike: same ids, same once-tokens (MillWheel §6.1.1, Photon §2);
* a key forgotten and made again later is a new life, whose ids no earlier life of the key
  had: a click delivered again after its key was collected is a *new* production, which a
  consumer's dedup keeps and the IdRegistry answers ``CONFLICT`` (another token).

A key forgotten by one step call and made again by a later call of the same batch
(``plan_steps`` cuts a key's input into calls) starts another life there
(:func:`call_life`). A key of an envelope or store written before lives that has produced
keeps its numbering, the id of ``(computation, key, seq)`` alone, which no id with a life
equals, until it is forgotten.

>>> production_id("Joiner", "q1", 0) == production_id("Joiner", "q1", 0, None)
True
>>> production_id("Joiner", "q1", 0, batch_life("query-a", 7)) == production_id("Joiner", "q1", 0, batch_life("query-a", 8))
False
>>> call_life(batch_life("query-a", 7), 0) == batch_life("query-a", 7) != call_life(batch_life("query-a", 7), 1)
True
"""

from __future__ import annotations

import xxhash

from millwheel._record import Key

_hexdigest = xxhash.xxh3_128_hexdigest
_intdigest = xxhash.xxh3_64_intdigest


def id_prefix(computation: str, key: Key | None, life: int | None) -> str:
    """What a production id hashes before its sequence number (computed once per key and step)."""
    if life is None:
        return f"{computation}\x00{key!r}\x00"
    return f"{computation}\x00{key!r}\x00{life}\x00"


def production_id(computation: str, key: Key | None, seq: int, life: int | None = None) -> str:
    """Deterministic id of the ``seq``-th production of ``key``'s life ``life`` (see the module docstring).

    Determinism matters: a step replayed from the same committed envelope in the same batch
    assigns the same ids, so consumers' dedup drops re-deliveries (§6.1.1, §6.1.3).
    """
    return _hexdigest(f"{id_prefix(computation, key, life)}{seq}".encode())


def batch_life(scope: str, batch: int) -> int:
    """The life a key whose first production is in batch ``batch`` of ``scope`` starts: a 64-bit
    number (``scope``: the Spark query's id, or the harness's name for its rounds)."""
    return _intdigest(f"{scope}\x00{batch}".encode())


def call_life(life: int | None, forgotten: int) -> int | None:
    """The life a key starts in batch life ``life`` after it was forgotten ``forgotten`` times
    in that batch already (0: the batch's life itself); ``None`` stays ``None`` (no batch identity)."""
    if life is None or forgotten == 0:
        return life
    return _intdigest(f"{life}\x00{forgotten}".encode())
