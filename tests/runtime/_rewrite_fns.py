"""Rewrite functions for ``tests/runtime/test_state_rewrite.py`` (``millwheel state rewrite --with``).

Every key whose number is a multiple of 3 is deleted; every other key's count is multiplied
by 10, its timers kept. ``times_ten`` is for a per-record computation (its state is the
count), ``columnar_times_ten`` for a columnar one (its state is the key's rows)."""

from __future__ import annotations

FACTOR = 10


def deleted(key) -> bool:
    return int(str(key)[1:]) % 3 == 0


def times_ten(key, state, timers):
    if deleted(key):
        return None
    return state * FACTOR, timers


def columnar_times_ten(key, rows, timers):
    if deleted(key):
        return None
    return [{**r, "n": r["n"] * FACTOR} for r in rows or []], timers
