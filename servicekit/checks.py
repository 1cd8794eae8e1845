"""Checks for what a client sends: bounded JSON, bounded numbers, messages that never echo much.

Every check raises ``error`` (default :class:`~servicekit.errors.BadRequestError`, HTTP 400)
with a message that names the field, what was expected, and what was sent, shortened by
:func:`describe` so a 10 MB value is never sent back. A service with its own error classes
passes its own ``error`` (a subclass of :class:`Exception` taking one message argument).

>>> check_int("pending", 17, lo=0)
17
>>> check_int("pending", 2**63, lo=0)
Traceback (most recent call last):
...
servicekit.errors.BadRequestError: pending must be an integer in [0, 9223372036854775807], got 9223372036854775808
>>> parse_number("seconds", "nan", lo=0, hi=86_400)
Traceback (most recent call last):
...
servicekit.errors.BadRequestError: seconds must be a finite number in [0, 86400], got 'nan'
>>> describe("x" * 10_000_000)
"'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' (10000000 characters)"
>>> parse_json(b'{"a": [1, {"b": 2}]}')
{'a': [1, {'b': 2}]}
>>> parse_json(b"[" * 40 + b"]" * 40)
Traceback (most recent call last):
...
servicekit.errors.BadRequestError: request body: JSON nested deeper than 32 levels; send a flatter document
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NoReturn

from servicekit.errors import BadRequestError

#: the range of a signed 64-bit integer (what the journal, numpy and every JVM client can hold)
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: at most this many characters of a value are quoted back in a message
DESCRIBE_LIMIT = 80
#: no message is longer than this
MESSAGE_LIMIT = 2_000
#: JSON documents may nest this deep by default
MAX_JSON_DEPTH = 32

ErrorClass = type[Exception]


def describe(value: Any, limit: int = DESCRIBE_LIMIT) -> str:
    """``repr(value)``, cut to about ``limit`` characters with the full length noted.

    For messages: the client sees what it sent, never all of it. Large containers are not
    rendered whole first (a list of a million items costs as much as its first few).
    """
    if isinstance(value, (str, bytes)) and len(value) > limit:
        head = repr(value[: limit - 20])
        return f"{head[:-1]}...{head[-1]} ({len(value)} characters)"
    if isinstance(value, (list, tuple, dict, set)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 20]}... ({len(text)} characters)"


def truncate(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text) - limit + 40} more characters)"


def _fail(error: ErrorClass, msg: str) -> NoReturn:
    raise error(msg)


def check_int(
    what: str,
    value: Any,
    *,
    lo: int = INT64_MIN,
    hi: int = INT64_MAX,
    hint: str = "",
    error: ErrorClass = BadRequestError,
) -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) in ``[lo, hi]``; else raise ``error``.

    The default range is a signed 64-bit integer: a value outside it cannot be journaled,
    summed in numpy or read by most clients, so it is refused at the door.
    """
    if type(value) is int and lo <= value <= hi:
        return value
    _fail(error, f"{what} must be an integer in [{lo}, {hi}]{hint}, got {describe(value)}")


def check_number(
    what: str,
    value: Any,
    *,
    lo: float,
    hi: float,
    hint: str = "",
    error: ErrorClass = BadRequestError,
) -> float:
    """Return ``value`` as a float if it is a finite ``int`` or ``float`` in ``[lo, hi]``."""
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        number = float(value) if not isinstance(value, int) or abs(value) < 2**63 else math.inf
        if math.isfinite(number) and lo <= number <= hi:
            return number
    _fail(error, f"{what} must be a finite number in [{lo:g}, {hi:g}]{hint}, got {describe(value)}")


def parse_number(
    what: str,
    text: str,
    *,
    lo: float,
    hi: float,
    hint: str = "",
    error: ErrorClass = BadRequestError,
) -> float:
    """A finite number in ``[lo, hi]`` from text (a query parameter); ``nan`` and ``inf`` are refused."""
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if math.isfinite(number) and lo <= number <= hi:
        return number
    _fail(error, f"{what} must be a finite number in [{lo:g}, {hi:g}]{hint}, got {describe(text)}")


def _no_constants(name: str) -> NoReturn:
    msg = f"request body: {name} is not JSON; send numbers as finite decimals"
    raise BadRequestError(msg)


def json_depth_exceeds(value: Any, max_depth: int) -> bool:
    """True if ``value`` (decoded JSON) nests lists and objects deeper than ``max_depth``."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        children = node.values() if type(node) is dict else node
        for child in children:
            t = type(child)
            if t is list or t is dict:
                stack.append((child, depth + 1))
    return False


def parse_json(
    raw: bytes | str, *, max_depth: int = MAX_JSON_DEPTH, error: ErrorClass = BadRequestError
) -> Any:
    """Decode a JSON document, refusing what a service should never have to hold.

    Refused with ``error``: text that is not JSON (or not UTF-8), ``NaN`` and
    ``Infinity`` (not JSON, though Python accepts them), integers of more than 4,300
    digits, and nesting deeper than ``max_depth`` (deep nesting would otherwise exhaust
    the interpreter's recursion limit and surface as an internal error).
    """
    try:
        value = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        _fail(
            error,
            f"request body: JSON nested deeper than {max_depth} levels; send a flatter document",
        )
    except BadRequestError as exc:
        _fail(error, str(exc))
    except (ValueError, UnicodeDecodeError) as exc:
        _fail(
            error,
            f"request body is not valid JSON ({truncate(str(exc), 200)}); send a JSON document encoded as UTF-8",
        )
    if type(value) in (list, dict) and json_depth_exceeds(value, max_depth):
        _fail(
            error,
            f"request body: JSON nested deeper than {max_depth} levels; send a flatter document",
        )
    return value


def check_fields(
    body: Any, fields: Mapping[str, bool], *, where: str, error: ErrorClass = BadRequestError
) -> dict[str, Any]:
    """Return ``body`` if it is a JSON object with every required field (``True``) and no
    field outside ``fields``; else raise ``error`` naming the missing and unexpected ones."""
    expected = sorted(fields)
    if type(body) is not dict:
        _fail(
            error,
            f"{where}: the body must be a JSON object with fields {expected}, got {type(body).__name__}",
        )
    missing = [f for f, required in fields.items() if required and f not in body]
    unexpected = [f for f in body if f not in fields]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing field(s) {missing}")
        if unexpected:
            shown = [describe(f, 40) for f in unexpected[:5]]
            more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
            parts.append(f"unexpected field(s) [{', '.join(shown)}{more}]")
        _fail(error, f"{where}: {' and '.join(parts)}; expected {expected}")
    return body
