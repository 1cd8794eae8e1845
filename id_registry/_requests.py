"""Cutting a registry call of any size into requests the service accepts.

``commit_many``, ``lookup_many`` and ``clear_many`` take any number of items; the service
takes at most :data:`~id_registry._model.MAX_ITEMS_PER_CALL` items a request (the bound it
enforces) and, over HTTP, a JSON body under its ``--max-body-bytes``. Both clients
(``client.py``) send a call as consecutive requests within those bounds, the answers
joined in the order of the items, so a backlog never becomes a request the service refuses
on every replay (Photon §3.3.2: a joiner retries until it is answered).

The body's size is measured without encoding it: ids and tokens are almost always plain
ASCII (:func:`plain_size`, at C speed); other strings are measured as JSON writes them
(:func:`json_lengths`).
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Callable, Sequence
from typing import TypeVar

from id_registry._model import ClearResult

R = TypeVar("R")

#: JSON around one item beyond its strings: brackets, quotes, commas, a 20-character time or null
ITEM_JSON_OVERHEAD = 40
#: JSON around the items of a request (the other fields, the braces)
BODY_JSON_OVERHEAD = 4096
#: the ASCII characters JSON writes as they are
_UNESCAPED = bytes(c for c in range(0x20, 0x80) if c not in b'"\\')


def plain_size(texts: Sequence[str]) -> int | None:
    """The JSON size of ``texts`` (each string, quoted) if none needs escaping, as the usual ids and
    tokens do (measured at C speed); else ``None``.

    >>> plain_size(["click-1", "dc1/b7"]), plain_size(['a"b']), plain_size(["\u00e9"])
    (17, None, None)
    """
    joined = "".join(texts)
    if joined.isascii() and not joined.encode("ascii").translate(None, _UNESCAPED):
        return len(joined) + 2 * len(texts)
    return None


def json_lengths(texts: Sequence[str]) -> list[int]:
    """The length of each string as this client's JSON encodes it (``ensure_ascii``).

    >>> json_lengths(["click-1", 'a"b', "\u00e9"])
    [9, 6, 8]
    """
    if plain_size(texts) is not None:
        return [n + 2 for n in map(len, texts)]
    return [len(json.dumps(t)) for t in texts]


def spans(
    count: int,
    max_items: int,
    costs: Callable[[], list[int]] | None = None,
    budget: int | None = None,
) -> list[tuple[int, int]]:
    """``[start, end)`` ranges cutting ``count`` items into consecutive runs of at most ``max_items``
    items and, when ``costs`` (each item's bytes, computed only if needed) and ``budget`` are given,
    at most ``budget`` bytes (an item larger than the budget alone goes alone).

    >>> spans(5, 2)
    [(0, 2), (2, 4), (4, 5)]
    >>> spans(4, 10, lambda: [3, 3, 3, 3], budget=7)
    [(0, 2), (2, 4)]
    """
    if count == 0:
        return []
    if costs is None or budget is None:
        return [(i, min(i + max_items, count)) for i in range(0, count, max_items)]
    cumulative = list(itertools.accumulate(costs()))
    if count <= max_items and cumulative[-1] <= budget:
        return [(0, count)]
    out, start = [], 0
    while start < count:
        before = cumulative[start - 1] if start else 0
        end = min(start + max_items, bisect.bisect_right(cumulative, before + budget, lo=start))
        end = max(end, start + 1)
        out.append((start, end))
        start = end
    return out


def in_spans(call: Callable[[int, int], list[R]], ranges: list[tuple[int, int]]) -> list[R]:
    """``call(start, end)`` for each range in turn, the answers joined in order."""
    if len(ranges) == 1:
        return call(*ranges[0])
    return [answer for start, end in ranges for answer in call(start, end)]


def split_clear(
    ids: Sequence[str],
    only_if_token: str | Sequence[str | None] | None,
    clear: Callable[[list[str], str | list[str | None] | None], list[ClearResult]],
    ranges: Callable[[list[str], list[str | None] | None], list[tuple[int, int]]],
) -> list[ClearResult]:
    """``clear_many`` cut into requests: the ids once each (the first of a repeated id decides, as
    in one call), each request ``clear(ids, tokens)``, the answers given back to every repeat."""
    ids = list(ids)
    per_id = list(only_if_token) if isinstance(only_if_token, (list, tuple)) else None
    if (per_id is None and only_if_token is not None and not isinstance(only_if_token, str)) or (
        per_id is not None and len(per_id) != len(ids)
    ):
        return clear(ids, only_if_token)  # type: ignore[arg-type]  # refused by the registry, with its message
    first: dict[str, int] = {}
    for i, event_id in enumerate(ids):
        first.setdefault(event_id, i)
    unique = list(first) if len(first) < len(ids) else ids
    tokens = (
        None
        if per_id is None
        else (per_id if unique is ids else [per_id[i] for i in first.values()])
    )
    cuts = ranges(unique, tokens)
    if len(cuts) == 1 and unique is ids:
        return clear(ids, only_if_token if per_id is None else per_id)

    def part(start: int, end: int) -> list[ClearResult]:
        return clear(unique[start:end], only_if_token if tokens is None else tokens[start:end])  # type: ignore[arg-type]

    answers = dict(zip(unique, in_spans(part, cuts), strict=True))
    return [answers[event_id] for event_id in ids]
