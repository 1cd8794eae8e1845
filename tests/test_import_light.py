"""``import millwheel`` is light: numpy, pandas and pyarrow load when a columnar computation
runs, not before (a per-record job, the CLI's help, a topology file's import pay nothing for
them). Each check runs a fresh interpreter: this one has them loaded already."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HEAVY = ("numpy", "pandas", "pyarrow")


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_millwheel_loads_no_numpy_pandas_or_pyarrow():
    loaded = _run(
        f"""
        import sys
        import millwheel
        from millwheel import ColumnarComputation, Computation, Topology

        class Count(ColumnarComputation):  # declaring one loads nothing either
            record_columns = ("key",)

        t = Topology("t")
        t.injector("in")
        t.computation(Count, inputs={{"in": lambda r: r.value}}, outputs=["counts"])
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
        """
    )
    assert loaded == "[]", f"import millwheel loaded {loaded}"


def test_a_columnar_computation_still_runs_after_a_light_import():
    out = _run(
        f"""
        import sys
        import millwheel

        class Count(millwheel.ColumnarComputation):
            record_columns = ("key", "timestamp")

            def process_batch(self, batch: millwheel.Batch) -> None:
                n = batch.records.groupby("key", sort=False, observed=True).size()
                batch.produce("counts", n.tolist(), keys=n.index.tolist())

        from millwheel.testing import Harness

        h = Harness.for_computation(Count, inputs={{"q": lambda r: r.value}}, outputs=["counts"])
        h.inject("q", [h.record("cats", 10, id="a"), h.record("dogs", 20, id="b"),
                       h.record("cats", 30, id="c"), h.record("cats", 30, id="c")])
        h.finish("q")
        h.run()
        print(sorted(h.values("counts")), h.metrics("Count")["duplicates"],
              all(m in sys.modules for m in {HEAVY!r}), millwheel.Batch.__module__)
        """
    )
    assert out == "[1, 2] 1 True millwheel._colbatch"
