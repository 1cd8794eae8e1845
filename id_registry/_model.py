"""The IdRegistry's vocabulary: results, the shard map (Photon §2.2.2), keys and checks.

An *entry* is one committed event id with the token of the joiner that committed it and
the event's timestamp. It is stored under ``e/<shard>/<id>`` (the shard is a key prefix)
with a time-index key ``g/<time>/<shard>/<id>`` beside it, so that garbage collection
(§2.3) reads only what it deletes. Values are msgpack arrays ``[token, event_time_ms]``;
``token`` is ``None`` once cleared (§3.3.3: the id stays joined, its token is dropped).

>>> m = ShardMap([ShardConfig(INT64_MIN, 4), ShardConfig(5_200, 6)])
>>> m.config_at(5_199), m.config_at(5_200)
(ShardConfig(effective_from_ms=-9223372036854775808, shard_count=4), ShardConfig(effective_from_ms=5200, shard_count=6))
>>> m.shard_of("click-1", 1_000) == shard_hash("click-1".encode()) % 4
True
>>> check_items([("click-1", "joiner-a", 1_000), ("", "joiner-a", 1_000)])
Traceback (most recent call last):
...
id_registry._errors.InvalidRequestError: items[1]: an event id must be a non-empty string of at most 256 characters, got ''
"""

from __future__ import annotations

import bisect
import enum
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import msgpack  # type: ignore[import-untyped]
import xxhash

from id_registry._errors import InvalidRequestError
from servicekit import INT64_MAX, INT64_MIN, check_int, describe

#: at most this many items in one call (commit, lookup, clear): about 1 MB of JSON per 10,000
MAX_ITEMS_PER_CALL = 100_000
#: the longest event id and token, in characters
MAX_ID_CHARS = 256
MAX_TOKEN_CHARS = 256
#: the most shards a configuration may have (shards are key prefixes: a shard costs nothing until it moves)
MAX_SHARDS = 65_536

#: the key of the registry's metadata (GC boundary and shard configurations)
META_KEY = b"m/meta"
ENTRY_PREFIX = b"e/"
INDEX_PREFIX = b"g/"
#: the first key after every index key
INDEX_END = b"g0"
#: event times are stored as ``time + TIME_OFFSET`` in 16 hex digits, so that they sort as numbers
TIME_OFFSET = 2**63


class Status(str, enum.Enum):
    """What happened to one item of a call."""

    #: commit: the id is now held by this token (the first commit, or a retry with the same token)
    COMMITTED = "committed"
    #: commit: another token holds the id ("already joined elsewhere"); see ``holder``
    CONFLICT = "conflict"
    #: commit, lookup, clear: the event time is below the garbage-collection boundary (§2.3): skip the event
    TOO_OLD = "too_old"
    #: lookup: the id is committed
    FOUND = "found"
    #: lookup, clear: the id is not committed (never, or cleared, or collected)
    NOT_FOUND = "not_found"
    #: clear: done
    CLEARED = "cleared"
    #: clear: ``only_if_token`` did not match the holder; nothing changed
    TOKEN_MISMATCH = "token_mismatch"

    def __repr__(self) -> str:
        return f"Status.{self.name}"

    __str__ = str.__str__


class CommitResult(NamedTuple):
    """The answer for one item of :meth:`~id_registry.RegistryClient.commit_many`."""

    status: Status
    #: on ``CONFLICT``: the token holding the id (``None`` if it was cleared)
    holder: str | None = None

    @property
    def committed(self) -> bool:
        """True if this caller may write the joined event out (it holds the id)."""
        return self.status is Status.COMMITTED

    @property
    def value(self) -> str:
        """The status as a string (``"committed"``, ...), for callers that read results as bare statuses."""
        return self.status.value


class LookupResult(NamedTuple):
    """The answer for one id of :meth:`~id_registry.RegistryClient.lookup_many`."""

    status: Status
    token: str | None = None
    event_time_ms: int | None = None


class ClearResult(NamedTuple):
    """The answer for one id of :meth:`~id_registry.RegistryClient.clear_many`."""

    status: Status
    #: on ``TOKEN_MISMATCH``: the token holding the id
    holder: str | None = None


COMMITTED = CommitResult(Status.COMMITTED)
TOO_OLD = CommitResult(Status.TOO_OLD)


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """From ``effective_from_ms`` (an event time) on, ids are spread over ``shard_count`` shards."""

    effective_from_ms: int
    shard_count: int


def shard_hash(event_id: bytes) -> int:
    """The deterministic 64-bit hash behind every shard number (xxh3; the same in every process)."""
    return xxhash.xxh3_64_intdigest(event_id)


class ShardMap:
    """Timestamp-based sharding (Photon §2.2.2): a list of configurations, each in force from its
    ``effective_from_ms`` until the next one's. An id's shard is ``hash(id) % shard_count`` of
    the configuration in force at the event's time, so adding a configuration that starts
    after every event already decided never moves an id."""

    __slots__ = ("_starts", "configs")

    def __init__(self, configs: Iterable[ShardConfig]) -> None:
        self.configs: tuple[ShardConfig, ...] = tuple(configs)
        if not self.configs or self.configs[0].effective_from_ms != INT64_MIN:
            msg = "a shard map starts with a configuration effective from INT64_MIN (all time)"
            raise InvalidRequestError(msg)
        starts = [c.effective_from_ms for c in self.configs]
        if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
            msg = f"shard configurations must start at increasing times, got {describe(starts)}"
            raise InvalidRequestError(msg)
        self._starts = starts

    @classmethod
    def single(cls, shard_count: int) -> ShardMap:
        return cls([ShardConfig(INT64_MIN, shard_count)])

    def config_at(self, event_time_ms: int) -> ShardConfig:
        """The configuration in force at ``event_time_ms``."""
        return self.configs[bisect.bisect_right(self._starts, event_time_ms) - 1]

    def shard_of(self, event_id: str, event_time_ms: int) -> int:
        """The shard of ``event_id`` for an event at ``event_time_ms``."""
        return shard_hash(event_id.encode()) % self.config_at(event_time_ms).shard_count

    def candidates(self, id_hash: int, gc_boundary_ms: int) -> list[int]:
        """The shards an id may live in, whatever its time, among configurations not wholly collected."""
        shards: list[int] = []
        ends = [*self._starts[1:], None]
        for config, end in zip(self.configs, ends, strict=True):
            if end is not None and end <= gc_boundary_ms:
                continue
            shard = id_hash % config.shard_count
            if shard not in shards:
                shards.append(shard)
        return shards

    def to_json(self) -> list[list[int]]:
        return [[c.effective_from_ms, c.shard_count] for c in self.configs]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardMap) and self.configs == other.configs

    def __hash__(self) -> int:
        return hash(self.configs)

    def __repr__(self) -> str:
        return f"ShardMap({list(self.configs)!r})"


@dataclass(frozen=True, slots=True)
class Meta:
    """What every registry server and client of one store agrees on: the GC boundary (§2.3) and the
    shard map (§2.2.2), stored with the entries. ``revision`` is the store's version of it."""

    gc_boundary_ms: int
    shards: ShardMap
    revision: int = 0

    def encode(self) -> bytes:
        return msgpack.packb(
            {"format": 1, "gc": self.gc_boundary_ms, "shards": self.shards.to_json()}
        )

    @classmethod
    def decode(cls, raw: bytes, revision: int = 0) -> Meta:
        value = msgpack.unpackb(raw)
        if value.get("format") != 1:
            msg = f"the registry's store has metadata of format {value.get('format')!r}; this code reads format 1: was it written by a newer version?"
            raise InvalidRequestError(msg)
        shards = ShardMap(ShardConfig(int(a), int(b)) for a, b in value["shards"])
        return cls(int(value["gc"]), shards, revision)


# ---------------------------------------------------------------------------- keys and values


#: ``e/<shard>/<id>`` from ``(shard, id bytes)``, and ``g/<time + 2**63>/<shard>/<id>`` from
#: ``(time + 2**63, shard, id bytes)`` (``map`` them over columns of a batch)
ENTRY_KEY = b"e/%d/%s".__mod__
INDEX_KEY = b"g/%016x/%d/%s".__mod__


def entry_key(shard: int, id_bytes: bytes) -> bytes:
    return ENTRY_KEY((shard, id_bytes))


def index_key(event_time_ms: int, shard: int, id_bytes: bytes) -> bytes:
    return INDEX_KEY((event_time_ms + TIME_OFFSET, shard, id_bytes))


def index_time_key(event_time_ms: int) -> bytes:
    """The first index key of events at ``event_time_ms`` (every earlier event sorts before it)."""
    return b"g/%016x/" % (event_time_ms + TIME_OFFSET)


def entry_of_index(key: bytes) -> tuple[bytes, int]:
    """``(entry key, event time)`` of a time-index key."""
    _, time_hex, shard, id_bytes = key.split(b"/", 3)
    return b"e/%s/%s" % (shard, id_bytes), int(time_hex, 16) - TIME_OFFSET


def pack_entry(token: str | None, event_time_ms: int) -> bytes:
    return msgpack.packb((token, event_time_ms))


def unpack_entry(raw: bytes) -> tuple[str | None, int]:
    token, event_time_ms = msgpack.unpackb(raw)
    return token, event_time_ms


# ---------------------------------------------------------------------------- checks

#: an item of :meth:`commit_many`: ``(event_id, token, event_time_ms)``
Item = tuple[str, str, int]
#: the columns of items: ``list(map(EVENT_ID, items))``
EVENT_ID, TOKEN, EVENT_TIME = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


def _text_ok(value: Any, limit: int) -> bool:
    if type(value) is not str or not 0 < len(value) <= limit:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate, which JSON can carry and no store can hold
        return False
    return True


def _bad_text(where: str, what: str, value: Any, limit: int) -> NoReturn:
    msg = f"{where}: {what} must be a non-empty string of at most {limit} characters, got {describe(value)}"
    if type(value) is str and 0 < len(value) <= limit:
        msg = f"{where}: {what} must be valid Unicode (no lone surrogates), got {describe(value)}"
    raise InvalidRequestError(msg)


def check_count(what: str, items: Any) -> None:
    if not isinstance(items, (list, tuple)):
        msg = f"{what} must be a list, got {type(items).__name__}"
        raise InvalidRequestError(msg)
    if len(items) > MAX_ITEMS_PER_CALL:
        msg = f"{what} has {len(items):,} entries; send at most {MAX_ITEMS_PER_CALL:,} per call (split the batch)"
        raise InvalidRequestError(msg)


def check_items(items: Any, what: str = "items") -> list[Item]:
    """``items`` as a list of ``(event_id, token, event_time_ms)``; refused with a message naming the first bad one."""
    check_count(what, items)
    fast = _check_items_fast(items)
    if fast is not None:
        return fast
    out: list[Item] = []
    for i, item in enumerate(items):
        where = f"{what}[{i}]"
        if not (type(item) is tuple or type(item) is list) or len(item) != 3:
            msg = f"{where} must be [event_id, token, event_time_ms], got {describe(item)}"
            raise InvalidRequestError(msg)
        event_id, token, t = item
        if not _text_ok(event_id, MAX_ID_CHARS):
            _bad_text(where, "an event id", event_id, MAX_ID_CHARS)
        if not _text_ok(token, MAX_TOKEN_CHARS):
            _bad_text(where, "a token", token, MAX_TOKEN_CHARS)
        out.append((event_id, token, check_time(f"{where}: event_time_ms", t)))
    return out


def _check_items_fast(items: Sequence[Any]) -> list[Item] | None:
    """The items as tuples if every one is plainly valid (ASCII ids and tokens), checked a column at
    a time in C loops; ``None`` to fall back on the item-by-item check (which names the culprit)."""
    if not items:
        return []
    if not set(map(type, items)) <= {list, tuple} or set(map(len, items)) != {3}:
        return None
    ids, tokens, times = (
        list(map(EVENT_ID, items)),
        list(map(TOKEN, items)),
        list(map(EVENT_TIME, items)),
    )
    if (
        set(map(type, ids)) != {str}
        or set(map(type, tokens)) != {str}
        or set(map(type, times)) != {int}
    ):
        return None
    id_lengths, token_lengths = set(map(len, ids)), set(map(len, tokens))
    if (
        min(id_lengths) < 1
        or max(id_lengths) > MAX_ID_CHARS
        or min(token_lengths) < 1
        or max(token_lengths) > MAX_TOKEN_CHARS
    ):
        return None
    if not (
        all(map(str.isascii, ids))
        and all(map(str.isascii, tokens))
        and min(times) >= INT64_MIN
        and max(times) <= INT64_MAX
    ):
        return None
    return list(map(tuple, items))


def check_ids(ids: Any, what: str = "ids") -> list[str]:
    """``ids`` as a list of event ids."""
    check_count(what, ids)
    for i, event_id in enumerate(ids):
        if not _text_ok(event_id, MAX_ID_CHARS):
            _bad_text(f"{what}[{i}]", "an event id", event_id, MAX_ID_CHARS)
    return list(ids)


def check_tokens(only_if_token: Any, count: int) -> list[str | None]:
    """``only_if_token`` of :meth:`clear_many` (``None``, one token, or one per id) as one per id."""
    if only_if_token is None or type(only_if_token) is str:
        if only_if_token is not None and not _text_ok(only_if_token, MAX_TOKEN_CHARS):
            _bad_text("only_if_token", "a token", only_if_token, MAX_TOKEN_CHARS)
        return [only_if_token] * count
    if not isinstance(only_if_token, (list, tuple)) or len(only_if_token) != count:
        msg = f"only_if_token must be null, a token, or a list of one token (or null) per id ({count}), got {describe(only_if_token)}"
        raise InvalidRequestError(msg)
    for i, token in enumerate(only_if_token):
        if token is not None and not _text_ok(token, MAX_TOKEN_CHARS):
            _bad_text(f"only_if_token[{i}]", "a token", token, MAX_TOKEN_CHARS)
    return list(only_if_token)


def check_shard_count(value: Any) -> int:
    return check_int("shard_count", value, lo=1, hi=MAX_SHARDS, error=InvalidRequestError)


def check_time(what: str, value: Any) -> int:
    return check_int(what, value, hint=" (milliseconds since the epoch)", error=InvalidRequestError)


def split_results(results: Sequence[Any], sizes: Sequence[int]) -> list[list[Any]]:
    """``results`` cut into consecutive runs of ``sizes``."""
    out, start = [], 0
    for n in sizes:
        out.append(list(results[start : start + n]))
        start += n
    return out
