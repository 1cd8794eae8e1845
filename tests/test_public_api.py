"""The public surface: pinned exports, and no pyspark in the user API."""

from __future__ import annotations

import subprocess
import sys

import millwheel
import millwheel.testing


def test_exported_members_are_pinned():
    assert millwheel.__all__ == sorted(millwheel.__all__)
    assert set(millwheel.__all__) == {
        "Batch",
        "ColumnarComputation",
        "DEAD_LETTER_STREAM",
        "MAX_TIMESTAMP",
        "MIN_TIMESTAMP",
        "Computation",
        "ComputationError",
        "DeclarationError",
        "SettingsError",
        "DeadLetter",
        "KeyContext",
        "KeyExtractorError",
        "LogFileSource",
        "RunError",
        "Stage",
        "file_time",
        "ComputationOptions",
        "DataclassCodec",
        "DedupOptions",
        "EnvelopeError",
        "ErrorPolicy",
        "HarnessError",
        "InjectorSpec",
        "LateAction",
        "LatePolicy",
        "MillwheelError",
        "MsgpackCodec",
        "PickleCodec",
        "Production",
        "Record",
        "SampleSource",
        "SinkSpec",
        "Source",
        "SourceBatch",
        "SparkSink",
        "SparkSource",
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
    }
    assert millwheel.testing.__all__ == ["Crash", "Harness", "RunResult"]
    for name in millwheel.__all__:
        assert getattr(millwheel, name) is not None


def test_internals_left_the_public_surface_with_a_deprecation_path():
    import pytest

    for name in ("StepRunner", "StepResult", "ComputationSpec"):
        assert name not in millwheel.__all__
        with pytest.warns(DeprecationWarning, match=f"millwheel.{name} is internal"):
            assert getattr(millwheel, name).__name__ == name


def test_every_error_derives_from_the_root():
    for name in (
        "ComputationError",
        "EnvelopeError",
        "HarnessError",
        "StateCodecError",
        "StateVersionError",
        "TopologyError",
    ):
        assert issubclass(getattr(millwheel, name), millwheel.MillwheelError)


def test_user_api_imports_no_pyspark():
    code = (
        "import sys, millwheel, millwheel.testing, computations.windowing, computations.anomalies, computations.columnar_windowing\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
