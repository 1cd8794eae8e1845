"""What the harness's rounds pass around: crash points, queued input, outgoing productions."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from millwheel._record import Key, Production, Record


class Crash(enum.Enum):
    """Where :meth:`Harness.process` simulates a process crash (§6.1)."""

    #: after user code ran and weak productions went out, before the checkpoint
    BEFORE_COMMIT = "before_commit"
    #: after the checkpoint and the input ACK, before strong productions are sent
    AFTER_COMMIT = "after_commit"
    #: after strong productions were delivered, before they were acknowledged in the envelope
    AFTER_DELIVER = "after_deliver"


@dataclass(slots=True)
class _Queued:
    record: Record  # already carries the consumer's key
    arrival_watermark: int


@dataclass(slots=True)
class _Outgoing:
    computation: str
    key: Key | None
    production: Production
    strong: bool
