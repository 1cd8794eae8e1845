"""What a computation's query and an injector see of the driver: a narrow interface.

The :class:`~millwheel.runtime.SparkRuntime` implements it; queries and injectors get it
at construction instead of the whole runtime, so they cannot reach into each other and
a test can drive one with a small fake.
"""

from __future__ import annotations

from typing import Any, Protocol

from millwheel.runtime._fs import Location
from millwheel.runtime._keying import Keyer
from millwheel.runtime._settings import RuntimeSettings
from millwheel.runtime._streams import FileStreamLog


class DriverContext(Protocol):
    """The driver's services, as its queries and injectors use them."""

    settings: RuntimeSettings
    #: the run directory
    root: Location
    streams: FileStreamLog
    #: every consumer's key extractor (``_keying.py``): what producers key their rows with
    keyer: Keyer
    #: a watermark-authority client (``watermark_authority.client``)
    watermarks: Any
    #: the run's audit trail (``_audit.AuditLog``)
    audit: Any
    #: the epoch this driver's queries take their leases under (``_lease.DriverEpoch``)
    driver_epoch: Any
    #: the Spark grouping value of each key interval (``_runtime.pin_groups``)
    groups: list[int]

    def layout(self, computation: str) -> Any:
        """A computation's key intervals and their Spark groups (``_layout.Layout``)."""
        ...

    @property
    def spark(self) -> Any: ...

    @property
    def master(self) -> str | None:
        """The session's master once it is up, else the settings' (``None``: spark-submit's)."""
        ...

    def log(self, msg: str) -> None: ...

    def producers(self, stream: str) -> list[str]:
        """Who writes ``stream``: one stream-log directory each."""
        ...

    def upstream(self, name: str) -> list[str]:
        """Whose low watermarks bound computation ``name``'s (``Topology.upstream``)."""
        ...

    def watermark_of(self, name: str, *, fresh: bool = False) -> int:
        """The published low watermark of an injector or computation: read once per round of
        the driver loop, or again with ``fresh`` (after reporting it)."""
        ...

    def heartbeat_consumers(self, producer: str) -> list[Any]:
        """The computations of this driver whose queries run and read ``producer``'s
        output (``ComputationQuery``): a producer asks them to stage a heartbeat before it
        publishes (``HeartbeatWriter.stage_heartbeat``)."""
        ...

    def caught_up(self, low_watermark: int) -> bool:
        """Every computation's low watermark has reached ``low_watermark`` (lockstep)."""
        ...
