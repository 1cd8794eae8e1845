"""Checks of what the authority is sent: names, timestamps, percentiles, tokens and reports.

Every mutation of :class:`~watermark_authority.Authority` runs these over the whole request
before it journals anything (validate, then journal, then apply), so a malformed request
changes nothing, and its :class:`InvalidRequestError` says what was expected.

>>> check_name("computation", "counter")
'counter'
>>> check_percentile(99)
99.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servicekit import INT64_MAX, check_int, describe
from watermark_authority._errors import InvalidRequestError
from watermark_authority._time import MAX_TIMESTAMP, MIN_TIMESTAMP

#: one interval's report: ``(interval, token, oldest_work, pending)``; ``pending`` is the
#: amount of pending work (records, timers, productions) or ``None`` if not counted
Report = tuple[str, int, int, "int | None"]

MAX_NAME_LENGTH = 256


def check_name(what: str, name: Any) -> str:
    """Return ``name`` if it is a usable computation, interval, injector, process or owner name."""
    if not isinstance(name, str) or not name:
        msg = f"{what} must be a non-empty string, got {describe(name)}"
        raise InvalidRequestError(msg)
    if len(name) > MAX_NAME_LENGTH or not name.isprintable():
        msg = f"{what} {describe(name, 60)} must be at most {MAX_NAME_LENGTH} printable characters"
        raise InvalidRequestError(msg)
    return name


def check_timestamp(what: str, value: Any) -> int:
    """Return ``value`` if it is an int millisecond timestamp in [MIN_TIMESTAMP, MAX_TIMESTAMP]."""
    if type(value) is not int or not MIN_TIMESTAMP <= value <= MAX_TIMESTAMP:
        msg = (
            f"{what} must be an integer timestamp in milliseconds since the epoch, between "
            f"MIN_TIMESTAMP and MAX_TIMESTAMP (use MAX_TIMESTAMP for 'finished'), got {describe(value)}"
        )
        raise InvalidRequestError(msg)
    return value


def check_percentile(pct: Any) -> float:
    """Return ``pct`` as a float if it is a percentage in (0, 100]."""
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 100:
        msg = f"percentile must be a number in (0, 100], e.g. 99 for the 99% watermark, got {describe(pct)}"
        raise InvalidRequestError(msg)
    return float(pct)


def check_token_value(what: str, token: Any) -> int:
    return check_int(
        f"{what}: token",
        token,
        lo=1,
        hint=" (the token that acquire returned)",
        error=InvalidRequestError,
    )


def check_report(computation: str, i: int, item: Any) -> Report:
    """Report #``i`` of a batch for ``computation``, checked: ``(interval, token, oldest_work, pending)``."""
    try:
        iv, token, oldest, pending = item
    except (TypeError, ValueError):
        msg = f"computation {computation!r}: report #{i} must be (interval, token, oldest_work, pending), got {describe(item)}"
        raise InvalidRequestError(msg) from None
    if type(iv) is not str or not 0 < len(iv) <= MAX_NAME_LENGTH:
        check_name(f"computation {computation!r}: report #{i} interval", iv)
    if type(token) is not int or not 1 <= token <= INT64_MAX:
        check_token_value(f"computation {computation!r}: report #{i} ({iv!r})", token)
    if type(oldest) is not int or not MIN_TIMESTAMP <= oldest <= MAX_TIMESTAMP:
        check_timestamp(f"computation {computation!r}: report #{i} ({iv!r}) oldest_work", oldest)
    if pending is not None and (type(pending) is not int or not 0 <= pending <= INT64_MAX):
        what = f"computation {computation!r}: report #{i} ({iv!r}): pending"
        check_int(
            what,
            pending,
            lo=0,
            hint=" (a count of pending work) or null",
            error=InvalidRequestError,
        )
    return iv, token, oldest, pending


def name_list(owner: str, what: str, noun: str, items: Any) -> list[str]:
    """A non-empty list of distinct, valid names, or an :class:`InvalidRequestError` saying why."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        msg = f"{owner}: {what} must be a non-empty list of {noun} names, got {describe(items)}"
        raise InvalidRequestError(msg)
    names = [check_name(f"{owner} {noun}", item) for item in items]
    if len(set(names)) != len(names):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                msg = f"{owner}: {what} lists a {noun} twice: {name!r}"
                raise InvalidRequestError(msg)
            seen.add(name)
    return names
