"""The one value codec, and state codecs: how values and per-key state become bytes (MillWheel §4.4).

:func:`encode_value` / :func:`decode_value` is the codec of every value the framework
moves or keeps: record values in stream logs, strong productions checkpointed in an
envelope, dead letters. It is pickle (protocol 5, fast) with a cloudpickle fallback for
what plain pickle refuses (lambdas, classes defined in a topology file), and raises
:class:`~millwheel.StateCodecError` naming the value's type when neither can encode it.

MillWheel treats state as an opaque byte string with user-chosen serialisation. The
default state codec is :class:`PickleCodec` (the value codec above: anything goes);
:class:`MsgpackCodec` is a faster typed codec for plain data (dicts, lists, numbers,
strings, bytes). :class:`DataclassCodec` and :class:`VersionedCodec` (``_versions.py``)
carry a state version, and upgrade state older code stored.

>>> decode_value(encode_value({"q": (1, 2)}))
{'q': (1, 2)}
>>> codec = MsgpackCodec()
>>> codec.decode(codec.encode({"a": [1, 2]}))
{'a': [1, 2]}
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Protocol, runtime_checkable

import cloudpickle
import msgpack

from millwheel._errors import DeclarationError, StateCodecError
from millwheel._versions import (
    UPGRADE_PREFIX,
    check_upgrades,
    check_version,
    split_version,
    upgrade,
    with_version,
)

_dumps = pickle.dumps
_HIGHEST = pickle.HIGHEST_PROTOCOL


def encode_value(value: Any) -> bytes:
    """Bytes of any picklable value: pickle first (fast), cloudpickle for what it refuses."""
    try:
        return _dumps(value, _HIGHEST)
    except Exception:
        try:
            return cloudpickle.dumps(value, protocol=_HIGHEST)
        except Exception as exc:
            msg = f"cannot pickle a value of type {type(value).__name__}: {type(exc).__name__}: {str(exc)[:200]}"
            raise StateCodecError(msg) from exc


#: the inverse of :func:`encode_value` (plain ``pickle.loads``: cloudpickle output is pickle)
decode_value = pickle.loads


@runtime_checkable
class StateCodec(Protocol):
    """Turns a state value into bytes and back."""

    name: str

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class PickleCodec:
    """The value codec (:func:`encode_value`): any Python object, including lambdas and local classes."""

    name = "pickle"

    def encode(self, value: Any) -> bytes:
        return encode_value(value)

    def decode(self, data: bytes) -> Any:
        try:
            return pickle.loads(data)
        except Exception as exc:
            msg = f"cannot unpickle state ({len(data)} bytes): {exc}"
            raise StateCodecError(msg) from exc


class MsgpackCodec:
    """msgpack: fast and compact for plain data; int keys in dicts are kept."""

    name = "msgpack"

    def encode(self, value: Any) -> bytes:
        try:
            return msgpack.packb(value, use_bin_type=True)
        except Exception as exc:
            msg = (
                f"MsgpackCodec cannot encode a {type(value).__name__} ({exc}); "
                "use PickleCodec for arbitrary objects"
            )
            raise StateCodecError(msg) from exc

    def decode(self, data: bytes) -> Any:
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            msg = f"cannot decode msgpack state ({len(data)} bytes): {exc}"
            raise StateCodecError(msg) from exc


class DataclassCodec:
    """Typed state: a dataclass stored as a msgpack map of its fields (``ComputationOptions(state_codec=...)``).

    ``self.state.get()`` returns an instance of ``cls`` (decoded once per step), and
    ``self.state.set(instance)`` stores its fields, so user code names its state's parts
    instead of indexing a dict. Field values are plain data (what msgpack stores: numbers,
    strings, bytes, lists, dicts, ``None``). ``renamed`` reads state stored under older
    field names (``{"old": "new"}``), so a class can rename a field and keep its runs.

    **Versions** (``millwheel/_versions.py``): a class attribute ``__version__ = N`` (default
    1) is the version of the state it stores, and a static method ``upgrade_from_K(fields:
    dict) -> dict`` for an older version ``K`` turns the field map version ``K`` stored into
    the map of version ``K + 1``. State stored by version ``K`` is upgraded through each
    upgrade up to ``N`` when it is decoded (then ``renamed`` applies); state of a newer
    version, or of an older one without the upgrades, raises
    :class:`~millwheel.StateVersionError`. Version 1 stores the bare map, as before versions.

    >>> from dataclasses import dataclass, field
    >>> @dataclass
    ... class Window:
    ...     count: int = 0
    ...     ids: list = field(default_factory=list)
    >>> codec = DataclassCodec(Window)
    >>> codec.decode(codec.encode(Window(2, ["a", "b"])))
    Window(count=2, ids=['a', 'b'])
    >>> DataclassCodec(Window, renamed={"n": "count"}).decode(MsgpackCodec().encode({"n": 5}))
    Window(count=5, ids=[])
    >>> @dataclass
    ... class Window2:
    ...     __version__ = 2
    ...     count: int = 0
    ...     first: str = ""
    ...     @staticmethod
    ...     def upgrade_from_1(fields):
    ...         ids = fields.pop("ids")
    ...         return {**fields, "first": ids[0] if ids else ""}
    >>> DataclassCodec(Window2).decode(codec.encode(Window(2, ["a", "b"])))
    Window2(count=2, first='a')
    """

    def __init__(self, cls: type, *, renamed: dict[str, str] | None = None) -> None:
        if not dataclasses.is_dataclass(cls):
            msg = f"DataclassCodec takes a dataclass, got {cls!r}"
            raise DeclarationError(msg)
        self.cls = cls
        self.renamed = dict(renamed or {})
        self.fields = tuple(f.name for f in dataclasses.fields(cls))
        self._names = frozenset(self.fields)
        self.name = f"dataclass:{cls.__qualname__}"
        self._msgpack = MsgpackCodec()
        what = f"DataclassCodec({cls.__qualname__})"
        if "__version__" in self._names:
            msg = f"{what}: __version__ is the state's version, a class attribute, not a field (declare it without a type annotation)"
            raise DeclarationError(msg)
        #: the version of the state this class stores (``__version__``, default 1)
        self.version = check_version(getattr(cls, "__version__", 1), what)
        check_upgrades(cls, self.version, what)

    def encode(self, value: Any) -> bytes:
        if type(value) is not self.cls:
            msg = (
                f"{self.name}: state must be a {self.cls.__qualname__}, got {type(value).__name__}"
            )
            raise StateCodecError(msg)
        data = self._msgpack.encode({name: getattr(value, name) for name in self.fields})
        return data if self.version == 1 else with_version(self.version, data)

    def decode(self, data: bytes) -> Any:
        stored, payload = split_version(data)
        fields = self._msgpack.decode(payload)
        if not isinstance(fields, dict):
            msg = f"{self.name}: stored state is a {type(fields).__name__}, not a map of fields"
            raise StateCodecError(msg)
        if stored != self.version:
            fields = upgrade(
                fields, stored, self.version, self._upgrade, self.cls.__qualname__, _a_map
            )
        if not self.renamed and fields.keys() <= self._names:
            return self.cls(**fields)  # the common case: stored under the class's own names
        values: dict[str, Any] = {str(self.renamed.get(k, k)): v for k, v in fields.items()}
        unknown = set(values) - set(self.fields)
        if unknown:
            msg = f"{self.name}: stored state has fields {sorted(unknown)} that {self.cls.__qualname__} does not (renamed=... maps old names)"
            raise StateCodecError(msg)
        return self.cls(**values)

    def stored_version(self, data: bytes) -> int:
        """The version of the class that stored ``data``."""
        return split_version(data)[0]

    def _upgrade(self, n: int) -> Any:
        return getattr(self.cls, f"{UPGRADE_PREFIX}{n}", None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataclassCodec) and (self.cls, self.renamed) == (
            other.cls,
            other.renamed,
        )

    def __hash__(self) -> int:
        return hash((self.cls, tuple(sorted(self.renamed.items()))))


def _a_map(n: int, fields: Any) -> None:
    """An upgrade's result must be a field map (``DataclassCodec``)."""
    if not isinstance(fields, dict):
        msg = f"{UPGRADE_PREFIX}{n} must return a dict of fields, got {type(fields).__name__}"
        raise StateCodecError(msg)
