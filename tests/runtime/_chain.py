"""A two-computation chain the runtime tests share: ``in -> Double -> doubled -> Sum -> sums``."""

from __future__ import annotations

from millwheel import Computation, Record, SampleSource, Topology


class Double(Computation):
    def process_record(self, record: Record) -> None:
        self.produce("doubled", record.value["n"] * 2)


class Sum(Computation):
    def process_record(self, record: Record) -> None:
        total = self.state.get(0) + record.value
        self.state.set(total)
        self.produce("sums", total)


def by_n(r: Record) -> int:
    return r.value["n"] % 3


def chain(name: str, records: list[Record], batch_size: int) -> Topology:
    """``records`` injected as ``in`` (``batch_size`` a file), doubled per ``n % 3``, summed under one key."""
    t = Topology(name)
    t.injector("in", SampleSource(records, batch_size=batch_size))
    t.computation(Double, inputs={"in": by_n}, outputs=["doubled"])
    t.computation(Sum, inputs={"doubled": lambda r: "all"}, outputs=["sums"])
    return t
