"""millwheel: exactly-once keyed stream computations in the style of Google's MillWheel.

The user API (this package) imports no pyspark; only ``millwheel.runtime`` does.
"""

from millwheel._codec import DataclassCodec, MsgpackCodec, PickleCodec, StateCodec
from millwheel._columnar import ColumnarComputation
from millwheel._computation import Computation, KeyContext, State, TimerFamily
from millwheel._deadletter import DEAD_LETTER_STREAM, DeadLetter, Stage
from millwheel._errors import (
    ComputationError,
    DeclarationError,
    EnvelopeError,
    HarnessError,
    KeyExtractorError,
    MillwheelError,
    RunError,
    SettingsError,
    StateCodecError,
    StateVersionError,
    TopologyError,
)
from millwheel._logfile import LogFileSource, file_time
from millwheel._options import ComputationOptions, DedupOptions, ErrorPolicy, LateAction, LatePolicy
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Production, Record, TimeDomain, Timer
from millwheel._sources import SampleSource, Source, SourceBatch
from millwheel._sparkio import SparkSink, SparkSource
from millwheel._topology import InjectorSpec, SinkSpec, Topology
from millwheel._versions import VersionedCodec

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "ColumnarComputation",
    "Computation",
    "ComputationError",
    "ComputationOptions",
    "DEAD_LETTER_STREAM",
    "DataclassCodec",
    "DeadLetter",
    "DeclarationError",
    "DedupOptions",
    "EnvelopeError",
    "ErrorPolicy",
    "HarnessError",
    "InjectorSpec",
    "KeyContext",
    "KeyExtractorError",
    "LateAction",
    "LatePolicy",
    "LogFileSource",
    "MAX_TIMESTAMP",
    "MIN_TIMESTAMP",
    "MillwheelError",
    "MsgpackCodec",
    "PickleCodec",
    "Production",
    "Record",
    "RunError",
    "SampleSource",
    "SettingsError",
    "SinkSpec",
    "Source",
    "SourceBatch",
    "SparkSink",
    "SparkSource",
    "Stage",
    "State",
    "StateCodec",
    "StateCodecError",
    "StateVersionError",
    "TimeDomain",
    "Timer",
    "TimerFamily",
    "Topology",
    "TopologyError",
    "VersionedCodec",
    "file_time",
]

#: internals that used to be exported: still importable, with a warning, until they go
_DEPRECATED = {
    "ComputationSpec": (
        "millwheel._topology",
        "Topology.computations[name] gives a computation's spec",
    ),
    "StepResult": (
        "millwheel._step",
        "the per-key step is internal; test computations with millwheel.testing.Harness",
    ),
    "StepRunner": (
        "millwheel._step",
        "the per-key step is internal; test computations with millwheel.testing.Harness",
    ),
}


def __getattr__(name: str) -> object:
    if name == "Batch":  # with pandas and pyarrow, loaded when a columnar computation needs them
        from millwheel._colbatch import Batch

        return Batch
    if name in _DEPRECATED:
        import importlib
        import warnings

        module, instead = _DEPRECATED[name]
        warnings.warn(
            f"millwheel.{name} is internal and will be removed from the public API: {instead}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)
    msg = f"module 'millwheel' has no attribute {name!r}"
    raise AttributeError(msg)
