"""State versions: typed state that declares its version and upgrades what older code stored.

A computation's state outlives the code that wrote it: a run resumed by a new version of the
code finds state that the old one stored. Typed state declares a *version* (an int, 1 when
undeclared) and, for each older version ``N`` it still reads, an upgrade from ``N`` to
``N + 1``; state stored by version ``N`` is upgraded through ``N -> N+1 -> ... -> current``
when it is read (per-record state: when ``self.state.get()`` decodes it; columnar state:
when the runner decodes a store, ``_colversions.py``).

* :class:`~millwheel.DataclassCodec`: the dataclass's ``__version__`` class attribute and its
  ``upgrade_from_N(fields: dict) -> dict`` static methods (the stored field map of version
  ``N`` to the map of ``N + 1``).
* :class:`VersionedCodec`: the same over any codec, ``VersionedCodec(inner, version=2,
  upgrades={1: fn})`` with ``fn(value_of_version_1) -> value_of_version_2``.
* :class:`~millwheel.ColumnarComputation`: ``state_version`` and ``upgrade_from_N(self,
  state: DataFrame) -> DataFrame`` methods.

**Stored bytes.** State of version 1 is stored as the codec stores it, with no header: the
bytes of every codec before versions existed read as version 1, and a class that never
declares a version stores exactly what it stored before. State of a later version ``v`` is
``0xC1`` + ``v`` (2 bytes, big-endian) + the codec's bytes. ``0xC1`` is a byte msgpack never
uses and no pickle opcode, so it cannot begin what :class:`~millwheel.MsgpackCodec`,
:class:`~millwheel.DataclassCodec` or :class:`~millwheel.PickleCodec` store; a
:class:`VersionedCodec` refuses an inner codec's bytes that begin with it.

**Errors.** State of a newer version than the code's, or of an older one with no upgrade
path (or whose upgrade raised), raises :class:`~millwheel.StateVersionError` naming both
versions; the step names the computation and the key (:func:`located`), and the error
follows the computation's ``ErrorPolicy`` as any failure of user code: dead-lettered with the
record or timer that read the state (the stored state left as it was), or raised.

Upgrades must be deterministic functions of the stored value: a replayed batch upgrades the
same bytes to the same value.

>>> from millwheel import MsgpackCodec
>>> codec = VersionedCodec(MsgpackCodec(), version=2, upgrades={1: lambda v: {"n": v, "sum": 0}})
>>> codec.decode(MsgpackCodec().encode(5))  # stored by version 1: upgraded
{'n': 5, 'sum': 0}
>>> codec.stored_version(codec.encode({"n": 1, "sum": 2})), codec.stored_version(b"\\x05")
(2, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from millwheel._errors import DeclarationError, StateCodecError, StateVersionError

#: the first byte of state stored with a version header (a byte msgpack never uses)
MARK = 0xC1
_HEAD = bytes([MARK])
MAX_VERSION = 0xFFFF
#: the name of a dataclass's (or columnar computation's) upgrade from version N: ``upgrade_from_N``
UPGRADE_PREFIX = "upgrade_from_"


def check_version(version: Any, what: str) -> int:
    """``version`` if it is a state version (an int from 1 to 65535), else a DeclarationError."""
    if type(version) is not int or not 1 <= version <= MAX_VERSION:
        msg = f"{what}: a state version is an int from 1 to {MAX_VERSION}, got {version!r}"
        raise DeclarationError(msg)
    return version


def check_upgrades(cls: type, version: int, what: str) -> None:
    """The ``upgrade_from_N`` attributes of ``cls`` are upgrades of older versions (N from 1
    to ``version - 1``): a misspelt or stale one is an error as the class is used."""
    for name in dir(cls):
        if not name.startswith(UPGRADE_PREFIX):
            continue
        n = name[len(UPGRADE_PREFIX) :]
        if not n.isdigit() or not 1 <= int(n) < version:
            hint = (
                f"its upgrades are upgrade_from_1 ... upgrade_from_{version - 1}"
                if version > 1
                else "declare the version it upgrades to"
            )
            msg = f"{what}: {name} is not an upgrade of an older version: the state is version {version} ({hint})"
            raise DeclarationError(msg)
        if not callable(getattr(cls, name)):
            msg = f"{what}: {name} must be a function"
            raise DeclarationError(msg)


def with_version(version: int, payload: bytes) -> bytes:
    """What is stored for ``payload`` (a codec's bytes) of state version ``version``."""
    if version == 1:
        return payload
    return _HEAD + version.to_bytes(2, "big") + payload


def split_version(data: bytes) -> tuple[int, bytes]:
    """``(version, the codec's bytes)`` of stored state (no header: version 1)."""
    if not data or data[0] != MARK:
        return 1, data
    if len(data) < 3:
        msg = f"stored state of {len(data)} bytes has a version mark but no version"
        raise StateCodecError(msg)
    return int.from_bytes(data[1:3], "big"), data[3:]


def stored_version(data: bytes | None) -> int | None:
    """The version of stored state (``None``: no state)."""
    return None if data is None else split_version(data)[0]


def upgrade(
    value: Any,
    stored: int,
    current: int,
    step: Callable[[int], Callable[[Any], Any] | None],
    what: str,
    check: Callable[[int, Any], None] | None = None,
) -> Any:
    """``value`` of version ``stored`` upgraded to ``current``: ``step(n)`` is the upgrade from
    ``n`` (``None``: none); ``check(n, result)`` raises if an upgrade's result is not state of
    version ``n + 1``. Raises :class:`StateVersionError` for a newer version, a missing
    upgrade, or an upgrade that raised."""
    if stored > current:
        why = "it was stored by newer code (run that code, or rewrite the state offline)"
        raise StateVersionError(what, stored, current, why)
    for n in range(stored, current):
        fn = step(n)
        if fn is None:
            why = f"{what} has no upgrade from version {n} ({UPGRADE_PREFIX}{n})"
            raise StateVersionError(what, stored, current, why)
        try:
            value = fn(value)
            if check is not None:
                check(n, value)
        except StateVersionError:
            raise
        except Exception as exc:
            why = f"{UPGRADE_PREFIX}{n} raised {type(exc).__name__}: {str(exc)[:200]}"
            raise StateVersionError(what, stored, current, why) from exc
    return value


def located(exc: BaseException, computation: str, key: Any) -> BaseException:
    """A :class:`StateVersionError` named by the computation and key whose state it is."""
    return exc.at(computation, key) if isinstance(exc, StateVersionError) else exc


class VersionedCodec:
    """Any codec with a state version and upgrades of older versions (see the module docstring).

    ``upgrades[n]`` turns a value of version ``n`` (as ``inner`` decodes it) into one of
    version ``n + 1``; state stored by version ``n`` is upgraded through each of them in turn
    when it is decoded. Bytes ``inner`` wrote before it was wrapped read as version 1.
    """

    def __init__(
        self,
        inner: Any,
        *,
        version: int,
        upgrades: Mapping[int, Callable[[Any], Any]] | None = None,
    ) -> None:
        self.inner = inner
        self.version = check_version(version, "VersionedCodec")
        self.upgrades = dict(upgrades or {})
        for n, fn in self.upgrades.items():
            if type(n) is not int or not 1 <= n < self.version or not callable(fn):
                msg = f"VersionedCodec(version={self.version}): upgrades maps a version from 1 to {self.version - 1} to a function, got {n!r}: {fn!r}"
                raise DeclarationError(msg)
        self.name = f"{getattr(inner, 'name', type(inner).__name__)}@v{self.version}"

    def encode(self, value: Any) -> bytes:
        data = self.inner.encode(value)
        if self.version == 1 and data[:1] == _HEAD:
            msg = f"{self.name}: the inner codec's bytes begin with 0xC1, the mark of a version header"
            raise StateCodecError(msg)
        return with_version(self.version, data)

    def decode(self, data: bytes) -> Any:
        stored, payload = split_version(data)
        value = self.inner.decode(payload)
        if stored != self.version:
            value = upgrade(value, stored, self.version, self.upgrades.get, self.name)
        return value

    def stored_version(self, data: bytes) -> int:
        return split_version(data)[0]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, VersionedCodec)
            and (self.inner, self.version) == (other.inner, other.version)
            and self.upgrades == other.upgrades
        )

    def __hash__(self) -> int:
        return hash((type(self.inner), self.version, tuple(sorted(self.upgrades))))
