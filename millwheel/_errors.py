"""Exceptions raised by millwheel.

Every error derives from one root, so ``except MillwheelError`` catches them all::

    MillwheelError
    ├── TopologyError        a topology is wired wrong (raised when it is built)
    │   └── DeclarationError     a computation class declares something wrong (also a TypeError)
    ├── SettingsError        a value given to millwheel is out of range (also a ValueError)
    ├── ComputationError     user code broke a rule at run time (undeclared stream, bad timestamp)
    │   └── KeyExtractorError    a consumer's key extractor failed under ErrorPolicy.RAISE
    ├── StateCodecError      a state value could not be encoded or decoded
    │   └── StateVersionError    stored state is of a version the code cannot read (no upgrade path)
    ├── EnvelopeError        a stored per-key envelope is corrupt or of an unknown version
    ├── HarnessError         the in-memory harness was driven wrongly (e.g. time moved backwards)
    ├── RunError             a run stopped: a Spark query failed in a way retrying will not fix
    ├── FencedError          (millwheel.runtime) a newer driver took this one's lease
    ├── RescaleMismatch      (millwheel.runtime) a state move does not fit (also a RuntimeError)
    ├── RewriteError         (millwheel.runtime) a state rewrite's function failed on a key or returned no state
    ├── PipelineNameTaken    (millwheel.once) another run directory holds the name (also a RuntimeError)
    └── MalformedLine        (millwheel.logfiles) a log line is not a record (also a ValueError)

``tests/test_errors.py`` pins this tree: a new public error is a deliberate edit there.

The rules:

* What millwheel raises for a mistake of its user (a topology, a setting, a call) or a
  failure of a run is a :class:`MillwheelError`.
* An error that was a built-in exception before keeps that built-in as a second base
  (``class PipelineNameTaken(MillwheelError, RuntimeError)``), so code that catches the
  built-in still does.
* Built-ins stay where they are the language's protocol or the signal of a bug in
  millwheel itself, never a user's mistake: ``NotImplementedError`` from a hook a subclass
  must override, ``AttributeError`` from a module's ``__getattr__``, ``KeyError`` from a
  ``Mapping``'s ``__getitem__``, an ``OSError`` that reports the operating system (a port
  that cannot be bound), an assertion inside a private helper about what its caller passed,
  and exceptions private to the framework that never reach its user (the step's wrapper of
  a user exception, unwrapped before it leaves the step).
* Errors raised inside Spark's Python workers reach the user through the driver's
  :class:`RunError`, which carries their message and traceback; their class is internal.
* A record that a computation cannot process is data, not a mistake: whatever user code
  (or a shipped computation in ``computations/``) raises for it is dead-lettered with its
  reason (``ErrorPolicy.DEAD_LETTER``) or propagates as it is (``ErrorPolicy.RAISE``).
"""

from __future__ import annotations


class MillwheelError(Exception):
    """Root of every millwheel exception."""


class TopologyError(MillwheelError):
    """The topology is wired wrong; the message names the piece and says how to fix it."""


class DeclarationError(TopologyError, TypeError):
    """A computation class declares something wrong: a ``DataclassCodec`` of a class that is
    not a dataclass, a ``TimerFamily`` tag with ``':'``. Raised as the class is defined."""


class SettingsError(MillwheelError, ValueError):
    """A value given to millwheel is out of its range: a pipeline name, an autoscale
    policy, a runtime setting. The message names the value and the range."""


class ComputationError(MillwheelError):
    """User code did something the framework cannot honour (raised at run time)."""


class KeyExtractorError(ComputationError):
    """A consumer's key extractor failed under ``ErrorPolicy.RAISE`` (on both backends)."""


class StateCodecError(MillwheelError):
    """A state value could not be encoded or decoded by the computation's codec."""


class StateVersionError(StateCodecError):
    """Stored state was written by a version of its type that this code cannot read: a newer
    one, or an older one with no upgrade to the current version (``millwheel/_versions.py``).

    The message names the computation, the key (a columnar store: its keys) and both
    versions; ``stored`` and ``current`` are the versions, ``computation`` and ``key`` are
    ``None`` until the step that met the state fills them in."""

    def __init__(
        self,
        what: str,
        stored: int,
        current: int,
        why: str,
        *,
        computation: str | None = None,
        key: object = None,
        keys: int = 1,
    ) -> None:
        self.what, self.stored, self.current, self.why = what, stored, current, why
        self.computation, self.key, self.keys = computation, key, keys
        where = ""
        if computation is not None:
            more = f" (and {keys - 1:,} more keys)" if keys > 1 else ""
            where = f"computation {computation!r}, key {key!r}{more}: "
        super().__init__(
            f"{where}state written by version {stored} of {what} cannot be read by version {current}: {why}"
        )

    def at(self, computation: str, key: object, keys: int = 1) -> StateVersionError:
        """This error, located: the computation and the key whose state it is."""
        if self.computation is not None:
            return self
        located = StateVersionError(
            self.what,
            self.stored,
            self.current,
            self.why,
            computation=computation,
            key=key,
            keys=keys,
        )
        located.__cause__ = self.__cause__
        return located

    def __reduce__(self) -> tuple[object, ...]:  # picklable with its fields (not its message alone)
        return (
            _state_version_error,
            (self.what, self.stored, self.current, self.why, self.computation, self.key, self.keys),
        )


def _state_version_error(
    what: str,
    stored: int,
    current: int,
    why: str,
    computation: str | None,
    key: object,
    keys: int,
) -> StateVersionError:
    """A :class:`StateVersionError` unpickled (``__reduce__``)."""
    return StateVersionError(
        what, stored, current, why, computation=computation, key=key, keys=keys
    )


class EnvelopeError(MillwheelError):
    """A stored per-key envelope could not be decoded."""


class HarnessError(MillwheelError):
    """The test harness was driven wrongly, e.g. a clock moved backwards."""


class RunError(MillwheelError):
    """A run stopped: a query failed deterministically or too often; the message has the Python traceback."""
