"""millwheel: exactly-once keyed stream computations in the style of Google's MillWheel.

The user API (this package) imports no pyspark; only ``millwheel.runtime`` does.
"""

from millwheel._codec import MsgpackCodec, PickleCodec, StateCodec
from millwheel._computation import Computation, State
from millwheel._errors import (
    ComputationError,
    EnvelopeError,
    HarnessError,
    MillwheelError,
    StateCodecError,
    TopologyError,
)
from millwheel._options import ComputationOptions, DedupOptions, ErrorPolicy, LateAction, LatePolicy
from millwheel._record import MAX_TIMESTAMP, MIN_TIMESTAMP, Production, Record, TimeDomain, Timer
from millwheel._sources import SampleSource, Source, SourceBatch
from millwheel._step import DEAD_LETTER_STREAM, StepResult, StepRunner
from millwheel._topology import ComputationSpec, InjectorSpec, SinkSpec, Topology

__version__ = "0.1.0"

__all__ = [
    "Computation",
    "ComputationError",
    "ComputationOptions",
    "ComputationSpec",
    "DEAD_LETTER_STREAM",
    "DedupOptions",
    "EnvelopeError",
    "ErrorPolicy",
    "HarnessError",
    "InjectorSpec",
    "LateAction",
    "LatePolicy",
    "MAX_TIMESTAMP",
    "MIN_TIMESTAMP",
    "MillwheelError",
    "MsgpackCodec",
    "PickleCodec",
    "Production",
    "Record",
    "SampleSource",
    "SinkSpec",
    "Source",
    "SourceBatch",
    "State",
    "StateCodec",
    "StateCodecError",
    "StepResult",
    "StepRunner",
    "TimeDomain",
    "Timer",
    "Topology",
    "TopologyError",
]
