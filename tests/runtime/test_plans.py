"""The seam between a computation's query and its physical plan (``millwheel/runtime/plans/``):
one choice with every refusal in it, typed settings that still take their strings, and a
``_query.py`` that never branches on what the plans differ in."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from computations.columnar_windowing import ColumnarWindowCounter
from computations.windowing import WindowCounter
from millwheel import ComputationOptions, SampleSource, Topology
from millwheel._errors import RunError, TopologyError
from millwheel._options import MAPPINGS, Mapping
from millwheel.runtime._layout import Layout, computation_layouts
from millwheel.runtime._settings import STATE_LAYOUTS, RuntimeSettings, SettingsError, StateLayout
from millwheel.runtime.plans import STATE_STORE_CONF, PlanKind, choose_plan, plan_class

QUERY = Path(__file__).resolve().parents[2] / "millwheel" / "runtime" / "_query.py"


def _spec(cls, mapping="default"):
    t = Topology("t")
    t.injector("q", SampleSource([]))
    t.computation(cls, name="C", inputs={"q": lambda r: r.value}, options=ComputationOptions())
    spec = t.validate().computations["C"]
    # the Arrow mapping on a per-record class is refused by the topology already: the
    # options are replaced after it, to see the choice refuse it on its own too
    return dataclasses.replace(spec, options=ComputationOptions(mapping=mapping))


@pytest.mark.parametrize("mapping", [*MAPPINGS, *Mapping])
@pytest.mark.parametrize("layout", [*STATE_LAYOUTS, *StateLayout])
@pytest.mark.parametrize("columnar", [False, True])
def test_every_combination_is_one_plan_or_one_refusal(mapping, layout, columnar):
    spec = _spec(ColumnarWindowCounter if columnar else WindowCounter, mapping)
    arrow, keys = Mapping(mapping) is Mapping.ARROW, StateLayout(layout) is StateLayout.KEYS
    if arrow and not columnar:
        with pytest.raises(TopologyError, match="for columnar computations"):
            choose_plan(spec, layout)
    elif columnar and keys:
        with pytest.raises(SettingsError, match="state_layout='intervals'"):
            choose_plan(spec, layout)
    else:
        want = {
            (False, False): PlanKind.INTERVAL_ROWS,
            (False, True): PlanKind.KEY_ROWS,
            (True, False): PlanKind.ARROW if arrow else PlanKind.COLUMNAR,
        }[(columnar, keys)]
        kind = choose_plan(spec, layout)
        assert kind is want
        plan = plan_class(kind)
        assert plan.kind is kind
        assert plan.takes_markers == columnar  # only a columnar step reads the batch's files


def test_the_arrow_mapping_is_refused_after_a_rescale_and_under_speculation():
    spec = _spec(ColumnarWindowCounter, "arrow")
    with pytest.raises(RunError, match="rescaled"):
        choose_plan(spec, "intervals", rescaled=True)
    with pytest.raises(SettingsError, match=r"spark\.speculation=true"):
        choose_plan(spec, "intervals", speculation=True)
    # the default mapping keeps its state in Spark's store, which a rescale moves
    assert choose_plan(_spec(ColumnarWindowCounter), "intervals", rescaled=True, speculation=True)


def test_each_state_layouts_store_is_its_plans():
    assert STATE_STORE_CONF["intervals"] == plan_class(PlanKind.INTERVAL_ROWS).state_store_conf
    assert STATE_STORE_CONF["keys"] == plan_class(PlanKind.KEY_ROWS).state_store_conf
    assert "RocksDB" in STATE_STORE_CONF["keys"]["spark.sql.streaming.stateStore.providerClass"]


def test_settings_take_the_strings_and_give_the_enums():
    s = RuntimeSettings(state_layout="keys")
    assert s.state_layout is StateLayout.KEYS and s.state_layout == "keys"
    assert dataclasses.replace(s, state_layout="intervals").state_layout is StateLayout.INTERVALS
    assert ComputationOptions(mapping="arrow").mapping is Mapping.ARROW
    assert ComputationOptions(mapping=Mapping.ARROW).mapping == "arrow"
    # run.json keeps the words, and messages name them as a user writes them
    assert json.dumps({"state_layout": s.state_layout}) == '{"state_layout": "keys"}'
    assert f"{s.state_layout!r} {s.state_layout}" == "'keys' keys"
    with pytest.raises(SettingsError, match="state_layout must be one of 'intervals', 'keys'"):
        RuntimeSettings(state_layout="rows")
    with pytest.raises(SettingsError, match="outbox_writer must be one of"):
        RuntimeSettings(outbox_writer="disk")
    with pytest.raises(TopologyError, match="mapping must be one of 'default', 'arrow'"):
        ComputationOptions(mapping="pandas")


def test_run_json_layouts_are_read_as_enums_and_a_bad_one_is_refused():
    held = {
        "state_layout": "intervals",
        "computations": {"B": {"intervals": 2, "groups": [0, 1], "state_layout": "keys"}},
    }
    layouts = computation_layouts(held, ["A", "B"], 4, [0, 1, 2, 3])
    assert layouts["A"].state_layout is StateLayout.INTERVALS
    assert layouts["B"].state_layout is StateLayout.KEYS
    with pytest.raises(SettingsError, match="run.json's state_layout"):
        Layout(2, (0, 1), state_layout="rows")


def test_the_removed_columnar_input_is_refused_with_why():
    for value in ("rows", "scan"):
        with pytest.raises(SettingsError, match="columnar_input.*removed.*max_files_per_trigger"):
            RuntimeSettings(columnar_input=value)
        with pytest.raises(SettingsError, match="removed"):
            dataclasses.replace(RuntimeSettings(), columnar_input=value)
    assert "columnar_input" not in {f.name for f in dataclasses.fields(RuntimeSettings)}


def test_the_environment_sets_the_default_layout():
    """``$MILLWHEEL_STATE_LAYOUT``: how CI runs the suite on either layout (a fresh process:
    the default is read when settings are made)."""
    code = (
        "from millwheel.runtime._settings import RuntimeSettings as R; print(R().state_layout.name)"
    )
    for value, name in (("keys", "KEYS"), ("intervals", "INTERVALS")):
        env = {**os.environ, "MILLWHEEL_STATE_LAYOUT": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == name


# ---- _query.py asks its plan: it never branches on mapping, layout or kind ---------------------
#: what the plans differ in: a branch on any of these belongs in ``plans/``
PLAN_NAMES = {
    "mapping",
    "state_layout",
    "StateLayout",
    "Mapping",
    "is_columnar",
    "columnar_input",
    "ColumnarIntervalStep",
    "IntervalStep",
    "interval_step_class",
    "ArrowPlan",
    "PlanKind",
    "kind",
}


def plan_branches(source: str) -> list[str]:
    """Where ``source`` decides by a plan name: an ``if``/``while``/conditional expression,
    a comprehension's condition, a ``match``, a boolean operation or comparison, an
    ``isinstance`` call, or a lookup keyed by one (``CONF[self.state_layout]``)."""
    tree = ast.parse(source)
    found = []

    def names(node):
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in PLAN_NAMES:
                yield n.id
            elif isinstance(n, ast.Attribute) and n.attr in PLAN_NAMES:
                yield n.attr

    for node in ast.walk(tree):
        tests = []
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests += node.ifs
        elif isinstance(node, ast.Match):
            tests.append(node.subject)
        elif isinstance(node, (ast.BoolOp, ast.Compare)):
            tests.append(node)
        elif isinstance(node, ast.Subscript):
            tests.append(node.slice)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            tests.append(node)
        for t in tests:
            found += [f"line {t.lineno}: {n}" for n in names(t)]
    return found


@pytest.mark.parametrize(
    "bad",
    [
        "if self.state_layout == 'keys':\n    pass",
        "x = a if spec.options.mapping == 'arrow' else b",
        "while is_columnar(cls):\n    break",
        "x = [p for p in ps if p.kind is PlanKind.ARROW]",
        "ok = isinstance(step, ColumnarIntervalStep)",
        "conf = STATE_STORE_CONF[self.state_layout]",
        "match self.plan.kind:\n    case _:\n        pass",
        "go = ready and settings.columnar_input",
    ],
)
def test_the_branch_check_finds_a_branch(bad):
    assert plan_branches(bad)


def test_the_branch_check_lets_plain_use_through():
    assert not plan_branches(
        "self.state_layout = layout.state_layout\nmsg = f'{self.state_layout!r}'\n"
        "conf = {**plan.state_store_conf}\nbuilt = plan.build(inputs)"
    )


def test_the_query_asks_its_plan_and_never_branches_on_it():
    source = QUERY.read_text()
    assert plan_branches(source) == []
    assert "plan.build(" in source and "plan_for(" in source
