"""The error tree (``millwheel/_errors.py``): every public error is a ``MillwheelError``, the
tree is the one listed here, and built-in exceptions are raised only where its rules allow.

Adding an error, or a raise of a built-in, takes a deliberate edit of the listings below.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import millwheel
from millwheel import (
    Computation,
    ComputationError,
    DataclassCodec,
    MillwheelError,
    TimerFamily,
)
from millwheel.testing import Harness

ROOT = Path(millwheel.__file__).parent

#: every exception class millwheel defines, by name: its bases, by name. The public ones
#: (reachable from a public module) and the internal ones alike; classes are named, not
#: placed, so a module split moves them without an edit here.
TREE = {
    "MillwheelError": ("Exception",),
    "TopologyError": ("MillwheelError",),
    "DeclarationError": ("TopologyError", "TypeError"),
    "SettingsError": ("MillwheelError", "ValueError"),
    "ComputationError": ("MillwheelError",),
    "KeyExtractorError": ("ComputationError",),
    "StateCodecError": ("MillwheelError",),
    "StateVersionError": ("StateCodecError",),
    "EnvelopeError": ("MillwheelError",),
    "HarnessError": ("MillwheelError",),
    "RunError": ("MillwheelError",),
    "PipelineNameTaken": ("MillwheelError", "RuntimeError"),
    "MalformedLine": ("MillwheelError", "ValueError"),
    "FencedError": ("MillwheelError",),
    "RescaleMismatch": ("MillwheelError", "RuntimeError"),
    "RewriteError": ("MillwheelError",),
    "PlannedBatchPublished": ("MillwheelError",),
    # internal: never leave the module that raises them (see INTERNAL)
    "Failure": ("Exception",),
    "_CallFailed": ("Exception",),
    "QueryInterrupted": ("Exception",),
    "KeyingStageNeeded": ("RuntimeError",),
}

#: the classes of TREE that are not MillwheelErrors, and why that is right
INTERNAL = {
    "Failure": "the step's wrapper of a user exception, unwrapped before it leaves the step",
    "_CallFailed": "the columnar step's wrapper of a user exception, unwrapped in _columnar",
    "QueryInterrupted": "handed to Spark from a foreachBatch function: Spark's stop, not an error",
    "KeyingStageNeeded": "raised in a Spark task; the driver reads its message and re-plans",
}

#: the errors a user can name, from the module that exports them
PUBLIC = {
    "millwheel": {
        "ComputationError",
        "DeclarationError",
        "EnvelopeError",
        "HarnessError",
        "KeyExtractorError",
        "MillwheelError",
        "RunError",
        "SettingsError",
        "StateCodecError",
        "StateVersionError",
        "TopologyError",
    },
    "millwheel.once": {"PipelineNameTaken"},
    "millwheel.logfiles": {"MalformedLine"},
    "millwheel.runtime": {"FencedError"},
}

#: ``(function, built-in)``: the raises of a built-in exception left in millwheel/, each
#: under one of the rules of ``millwheel/_errors.py``. A function is named without its
#: module, so a module split needs no edit; a raise that goes away needs none either.
BUILTIN_RAISES = {
    # the language's protocols
    ("__getattr__", "AttributeError"): "a module's lazy or deprecated names",
    ("_Streams.__getitem__", "KeyError"): "a Mapping",
    ("Computation.process_record", "NotImplementedError"): "a hook to override",
    ("ColumnarComputation.process_batch", "NotImplementedError"): "a hook to override",
    ("Source.batches", "NotImplementedError"): "a hook to override",
    ("QueryInjector.start", "NotImplementedError"): "a hook to override",
    ("QueryInjector._published", "NotImplementedError"): "a hook to override",
    # the operating system
    ("MetricsServer.__init__", "OSError"): "the metrics port cannot be bound",
    # a private helper's check of what its caller passed
    ("StepMetrics.of", "ValueError"): "counter names from millwheel's own summaries",
    ("rebuild_values", "ValueError"): "a stream-log reader that left out the fields column",
    (
        "normalize_timers",
        "ValueError",
    ): "an initial state's timers: every caller re-raises it as a TopologyError naming the computation and key",
    ("InitialState.seeds", "TypeError"): "a per-record reader called for a columnar computation",
    ("install_rows", "ValueError"): "a layout whose group list does not match its interval count",
    # inside Spark's Python workers: the user sees the driver's RunError
    ("MapStatePipeline._answers", "RuntimeError"): "Spark's state server answered an error",
    ("IntervalBatch._key_here", "RuntimeError"): "a step built without its key intervals",
    ("task_batch", "RuntimeError"): "a Spark task outside a micro-batch",
    ("log_entries", "RuntimeError"): "a damaged offset log, read in a task",
    ("batch_files", "RuntimeError"): "a damaged file-source log, read in a task",
    # to become millwheel errors (issue 37): files under restructuring when this was written
    ("ColumnarDedup.from_wire", "ValueError"): "an unknown dedup index version",
    ("ColumnarDedup.merge", "ValueError"): "dedup indexes of overlapping key intervals",
    ("read_segment", "FileNotFoundError"): "a columnar store's id segment file is gone",
}


def _modules() -> list[str]:
    names = ["millwheel"]
    for info in pkgutil.walk_packages(millwheel.__path__, "millwheel."):
        names.append(info.name)
    return names


def _is_public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


def _exceptions_defined() -> dict[str, type[BaseException]]:
    """Every exception class defined at the top level of a millwheel module, by name."""
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == name
            ):
                assert value.__name__ not in found or found[value.__name__] is value, (
                    f"two exception classes named {value.__name__}: name them apart"
                )
                found[value.__name__] = value
    return found


def _exported_errors(name: str) -> set[str]:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:  # no __all__: what the module defines, not what it imports
        exported = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == name
        ]
    return {
        n
        for n in exported
        if isinstance(getattr(module, n), type) and issubclass(getattr(module, n), BaseException)
    }


def test_every_exception_class_is_in_the_listed_tree():
    defined = _exceptions_defined()
    got = {n: tuple(b.__name__ for b in cls.__bases__) for n, cls in defined.items()}
    assert got == TREE


def test_every_error_but_the_internal_ones_is_a_millwheel_error():
    defined = _exceptions_defined()
    outside = {n for n, cls in defined.items() if not issubclass(cls, MillwheelError)}
    assert outside == set(INTERNAL)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_modules_export_the_listed_errors(module):
    assert _exported_errors(module) == PUBLIC[module]


def test_no_other_public_module_exports_an_error():
    for name in _modules():
        if _is_public(name) and name not in PUBLIC:
            assert _exported_errors(name) == set(), name


def test_errors_that_were_built_ins_still_are():
    """Code that caught the built-in before an error joined the tree still catches it."""
    from millwheel._errors import DeclarationError, SettingsError
    from millwheel.logfiles import MalformedLine
    from millwheel.once import PipelineNameTaken
    from millwheel.runtime._move import RescaleMismatch

    for cls, builtin in [
        (PipelineNameTaken, RuntimeError),
        (RescaleMismatch, RuntimeError),
        (MalformedLine, ValueError),
        (SettingsError, ValueError),
        (DeclarationError, TypeError),
    ]:
        assert issubclass(cls, MillwheelError) and issubclass(cls, builtin)
        with pytest.raises(builtin):
            msg = "x"
            raise cls(msg)


def test_the_tree_is_the_one_the_module_docstring_draws():
    from millwheel import _errors

    lines = _errors.__doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    drawn = {re.search(r"[A-Za-z]\w*", line).group() for line in lines}
    assert drawn == {n for n, cls in _exceptions_defined().items() if n not in INTERNAL} - {
        "PlannedBatchPublished"  # the online rescale's own retry signal
    }


def _builtin_raises() -> set[tuple[str, str, str]]:
    """``(function, built-in, file)`` of every ``raise <built-in>`` in millwheel/."""
    names = {
        n
        for n in dir(builtins)
        if isinstance(getattr(builtins, n), type)
        and issubclass(getattr(builtins, n), BaseException)
    }
    out: set[tuple[str, str, str]] = set()

    def visit(node: ast.AST, scope: list[str], path: Path) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*scope, child.name], path)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in names:
                    out.add((".".join(scope) or "<module>", exc.id, str(path.relative_to(ROOT))))
            visit(child, scope, path)

    for path in sorted(ROOT.rglob("*.py")):
        visit(ast.parse(path.read_text()), [], path)
    return out


def test_built_in_exceptions_are_raised_only_where_the_rules_allow():
    found = _builtin_raises()
    assert ("Computation.process_record", "NotImplementedError", "_computation.py") in found
    unlisted = sorted(r for r in found if r[:2] not in BUILTIN_RAISES)
    assert unlisted == [], (
        "raise a MillwheelError (keeping the built-in as a second base if callers catch it), "
        "or list the raise in BUILTIN_RAISES under a rule of millwheel/_errors.py"
    )


class OnceEcho(Computation):
    def process_record(self, record):
        self.produce("out", record.value, once_id=record.id)


class ForgetfulRegistry:
    """An IdRegistry that answers nothing: a bug of its own."""

    def commit_many(self, items):
        return []


def test_the_raises_that_joined_the_tree():
    from millwheel._errors import DeclarationError, SettingsError
    from millwheel._once import pipeline_id
    from millwheel.runtime._autoscale import AutoscalePolicy

    with pytest.raises(SettingsError, match="a pipeline name is 1 to 64 characters"):
        pipeline_id("a#b", "")
    with pytest.raises(SettingsError, match="hot_ratio > 1"):
        AutoscalePolicy(hot_ratio=1)
    with pytest.raises(DeclarationError, match="DataclassCodec takes a dataclass"):
        DataclassCodec(int)
    with pytest.raises(DeclarationError, match="a family's tag is a str without ':'"):
        TimerFamily(tag="a:b")
    h = Harness.for_computation(
        OnceEcho, inputs={"in": lambda r: r.value}, outputs=["out"], registry=ForgetfulRegistry()
    )
    h.inject("in", [h.record("x", 1)])
    with pytest.raises(ComputationError, match="answered 0 results for 1 commits"):
        h.run()
