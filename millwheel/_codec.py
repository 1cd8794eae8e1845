"""State codecs: how per-key persistent state becomes bytes (MillWheel §4.4).

MillWheel treats state as an opaque byte string with user-chosen serialisation. The
default here is :class:`PickleCodec` (cloudpickle: anything goes); :class:`MsgpackCodec`
is a faster typed codec for plain data (dicts, lists, numbers, strings, bytes).

>>> codec = MsgpackCodec()
>>> codec.decode(codec.encode({"a": [1, 2]}))
{'a': [1, 2]}
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol, runtime_checkable

import cloudpickle
import msgpack

from millwheel._errors import StateCodecError


@runtime_checkable
class StateCodec(Protocol):
    """Turns a state value into bytes and back."""

    name: str

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class PickleCodec:
    """cloudpickle out, pickle in: any Python object, including lambdas and local classes."""

    name = "pickle"

    def encode(self, value: Any) -> bytes:
        try:
            return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            msg = f"cannot pickle state value of type {type(value).__name__}: {exc}"
            raise StateCodecError(msg) from exc

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
