"""The harness's side of initial state (``Topology.computation(..., initial_state=...)``,
``millwheel/_initial_state.py``): each key's state loaded through the computation's own
codec, with its timers, before anything runs — as the Spark runtime installs it before its
first batch (``millwheel/runtime/_state_load.py``)."""

from __future__ import annotations

from typing import Any

from millwheel._errors import HarnessError
from millwheel._initial_state import InitialState, columnar_store, seed_envelope
from millwheel._record import decode_key


def load_initial(h: Any, name: str, initial: InitialState) -> int:
    """Load ``initial`` into computation ``name`` of harness ``h``, which keeps nothing yet;
    returns how many keys it holds."""
    runner = h._runner(name)
    if h.keys(name):
        msg = (
            f"computation {name!r} keeps state already: an initial state loads before anything runs"
        )
        raise HarnessError(msg)
    side = h._columnar.get(name)
    if side is not None:
        store = columnar_store(initial.columnar_seeds(), runner.options)
        side.live = store
        kbs = store.keys_held()
        for kb, (hold, nlw, nwall) in store.key_summary(kbs).items():
            h._store(name, decode_key(kb), None, hold, (nlw, nwall))
        return len(kbs)
    keys = 0
    for seed in initial.seeds():
        env = seed_envelope(runner.codec, seed, computation=name)
        if env is None:
            continue
        hold, nlw, nwall = env.schedule()
        h._store(name, seed.key, env.encode(), hold, (nlw, nwall))
        keys += 1
    return keys
