"""Exceptions raised by millwheel.

Every error derives from one root, so ``except MillwheelError`` catches them all::

    MillwheelError
    ├── TopologyError        a topology is wired wrong (raised when it is built)
    ├── ComputationError     user code broke a rule at run time (undeclared stream, bad timestamp)
    │   └── KeyExtractorError    a consumer's key extractor failed under ErrorPolicy.RAISE
    ├── StateCodecError      a state value could not be encoded or decoded
    ├── EnvelopeError        a stored per-key envelope is corrupt or of an unknown version
    ├── HarnessError         the in-memory harness was driven wrongly (e.g. time moved backwards)
    └── RunError             a run stopped: a Spark query failed in a way retrying will not fix
"""

from __future__ import annotations


class MillwheelError(Exception):
    """Root of every millwheel exception."""


class TopologyError(MillwheelError):
    """The topology is wired wrong; the message names the piece and says how to fix it."""


class ComputationError(MillwheelError):
    """User code did something the framework cannot honour (raised at run time)."""


class KeyExtractorError(ComputationError):
    """A consumer's key extractor failed under ``ErrorPolicy.RAISE`` (on both backends)."""


class StateCodecError(MillwheelError):
    """A state value could not be encoded or decoded by the computation's codec."""


class EnvelopeError(MillwheelError):
    """A stored per-key envelope could not be decoded."""


class HarnessError(MillwheelError):
    """The test harness was driven wrongly, e.g. a clock moved backwards."""


class RunError(MillwheelError):
    """A run stopped: a query failed deterministically or too often; the message has the Python traceback."""
