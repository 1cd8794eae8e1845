"""The one value codec, and state codecs: how values and per-key state become bytes (MillWheel §4.4).

:func:`encode_value` / :func:`decode_value` is the codec of every value the framework
moves or keeps: record values in stream logs, strong productions checkpointed in an
envelope, dead letters. It is pickle (protocol 5, fast) with a cloudpickle fallback for
what plain pickle refuses (lambdas, classes defined in a topology file), and raises
:class:`~millwheel.StateCodecError` naming the value's type when neither can encode it.

MillWheel treats state as an opaque byte string with user-chosen serialisation. The
default state codec is :class:`PickleCodec` (the value codec above: anything goes);
:class:`MsgpackCodec` is a faster typed codec for plain data (dicts, lists, numbers,
strings, bytes).

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

    def encode(self, value: Any) -> bytes:
        if type(value) is not self.cls:
            msg = (
                f"{self.name}: state must be a {self.cls.__qualname__}, got {type(value).__name__}"
            )
            raise StateCodecError(msg)
        return self._msgpack.encode({name: getattr(value, name) for name in self.fields})

    def decode(self, data: bytes) -> Any:
        stored = self._msgpack.decode(data)
        if not isinstance(stored, dict):
            msg = f"{self.name}: stored state is a {type(stored).__name__}, not a map of fields"
            raise StateCodecError(msg)
        if not self.renamed and stored.keys() <= self._names:
            return self.cls(**stored)  # the common case: stored under the class's own names
        values: dict[str, Any] = {str(self.renamed.get(k, k)): v for k, v in stored.items()}
        unknown = set(values) - set(self.fields)
        if unknown:
            msg = f"{self.name}: stored state has fields {sorted(unknown)} that {self.cls.__qualname__} does not (renamed=... maps old names)"
            raise StateCodecError(msg)
        return self.cls(**values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataclassCodec) and (self.cls, self.renamed) == (
            other.cls,
            other.renamed,
        )

    def __hash__(self) -> int:
        return hash((self.cls, tuple(sorted(self.renamed.items()))))
