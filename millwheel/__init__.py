"""millwheel: exactly-once keyed stream computations in the style of Google's MillWheel.

The user API (this package) imports no pyspark; only ``millwheel.runtime`` does.
"""

from millwheel._codec import MsgpackCodec, PickleCodec, StateCodec
from millwheel._computation import Computation, KeyContext, State
from millwheel._deadletter import DEAD_LETTER_STREAM, DeadLetter, Stage
from millwheel._errors import (
    ComputationError,
    EnvelopeError,
    HarnessError,
    MillwheelError,
    RunError,
    StateCodecError,
    TopologyError,
)
from millwheel._logfile import LogFileSource, file_time
from millwheel._options import ComputationOptions, DedupOptions, ErrorPolicy, LateAction, LatePolicy
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Production, Record, TimeDomain, Timer
from millwheel._sources import SampleSource, Source, SourceBatch
from millwheel._step import StepResult, StepRunner
from millwheel._topology import ComputationSpec, InjectorSpec, SinkSpec, Topology

__version__ = "0.1.0"

__all__ = [
    "Computation",
    "ComputationError",
    "ComputationOptions",
    "ComputationSpec",
    "DEAD_LETTER_STREAM",
    "DeadLetter",
    "DedupOptions",
    "EnvelopeError",
    "ErrorPolicy",
    "HarnessError",
    "InjectorSpec",
    "KeyContext",
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
    "SinkSpec",
    "Source",
    "SourceBatch",
    "Stage",
    "State",
    "StateCodec",
    "StateCodecError",
    "StepResult",
    "StepRunner",
    "TimeDomain",
    "Timer",
    "Topology",
    "TopologyError",
    "file_time",
]
