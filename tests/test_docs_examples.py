"""Every ```python block of ``docs/`` runs (stale examples are bugs); the README's are
``tests/test_readme.py``'s.

A block written as a doctest (``>>>``) runs as one through pytest's ``--doctest-glob=*.md``
over ``docs/``; this file checks that the collection still covers it. Every other block runs
here, a page's blocks in order in one namespace and in a fresh directory, after what the
page's prose sets up before it (:data:`SETUP`: e.g. the topology whose sinks a block
declares). A block that uses a Spark session ``spark`` runs in the page's Spark test;
``test_*`` functions a block defines are called with their fixtures, as pytest would.
"""

from __future__ import annotations

import doctest
import re
import shlex
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each ```python block of ``page``."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def is_doctest(code: str) -> bool:
    return code.lstrip().startswith(">>>")


def uses_spark(code: str) -> bool:
    """Does the block use a name ``spark`` (``spark.read...``)? Not a string that says
    ``"spark.jars.packages"``: the code's tokens, not its text."""
    import io
    import tokenize

    try:
        toks = [
            t
            for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type in (tokenize.NAME, tokenize.OP)
        ]
    except (tokenize.TokenError, SyntaxError):
        return re.search(r"\bspark\.", code) is not None
    return any(
        a.type == tokenize.NAME and a.string == "spark" and b.string == "."
        for a, b in zip(toks, toks[1:], strict=False)
    )


def _anomalies_topology(ns: dict) -> None:
    """deployment.md, before its sinks: a topology with an ``anomalies`` stream."""
    from millwheel import SampleSource, Topology

    topology = Topology("anomalies")
    rows = [
        {"query": "cats", "ts": 1_000, "kind": "spike"},
        {"query": "dogs", "ts": 2_000, "kind": "dip"},
    ]
    topology.injector("detector", SampleSource(rows, timestamp="ts"), stream="anomalies")
    ns["topology"] = topology


def _anomalies_written(ns: dict) -> None:
    """deployment.md, before reading the outputs: the topology run on the harness backend."""
    from millwheel.runtime._sinks import write_harness_sinks
    from millwheel.testing import Harness

    h = Harness(ns["topology"])
    h.run_sources()
    write_harness_sinks(ns["topology"], h.output)


#: (page, the start of a block) -> what the page's prose has set up before that block
SETUP: dict[tuple[str, str], Callable[[dict], None]] = {
    ("deployment.md", 'topology.sink("anomalies"'): _anomalies_topology,
    ("deployment.md", "from pathlib import Path\nimport pandas"): _anomalies_written,
}

PAGES = sorted(p for p in DOCS.glob("*.md") if any(not is_doctest(code) for _, code in blocks(p)))
CASES = [
    pytest.param(
        page.name,
        spark,
        id=f"{page.name}{'-spark' if spark else ''}",
        marks=[pytest.mark.spark] if spark else [],
    )
    for page in PAGES
    for spark in (False, True)
    if not spark or any(uses_spark(code) for _, code in blocks(page))
]


@pytest.mark.parametrize(("page", "with_spark"), CASES)
def test_the_python_blocks_of_a_page_run(page, with_spark, request, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MILLWHEEL_AUTHORITY_URL", raising=False)  # open_authority() then embeds one
    module = types.ModuleType(
        f"docs_{page.removesuffix('.md')}"
    )  # a real module: dataclasses look theirs up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ns = module.__dict__
    if with_spark:
        ns["spark"] = request.getfixturevalue("spark")
    for line, code in blocks(DOCS / page):
        if is_doctest(code) or (uses_spark(code) and not with_spark):
            continue
        for (where, start), setup in SETUP.items():
            if where == page and code.startswith(start):
                setup(ns)
        exec(compile("\n" * (line - 1) + code, str(DOCS / page), "exec"), ns)  # noqa: S102
        for name, fn in list(ns.items()):
            if (
                name.startswith("test_")
                and callable(fn)
                and getattr(fn, "__code__", None) is not None
                and fn.__code__.co_filename == str(DOCS / page)
            ):
                fn(
                    *(
                        request.getfixturevalue(arg)
                        for arg in fn.__code__.co_varnames[: fn.__code__.co_argcount]
                    )
                )
                ns.pop(name)


def test_every_python_block_of_the_docs_is_run(request):
    """Plain blocks run above (every page that has one is a case); a doctest block runs only if
    pytest collects ``docs/*.md`` as doctests, and only the ``>>>`` examples in it: a block must
    be one or the other, never plain code with a few examples in it."""
    addopts = shlex.split(" ".join(request.config.getini("addopts")))
    assert "--doctest-glob=*.md" in addopts
    assert "docs" in request.config.getini("testpaths")
    parser = doctest.DocTestParser()
    for page in sorted(DOCS.glob("*.md")):
        for line, code in blocks(page):
            where = f"docs/{page.name}:{line}"
            if is_doctest(code):
                stray = [
                    ln.strip() for ln in parser.parse(code) if isinstance(ln, str) and ln.strip()
                ]
                assert parser.get_examples(code) and not stray, (
                    f"{where}: plain code in a doctest block would never run: {stray}"
                )
            else:
                assert ">>>" not in code, (
                    f"{where}: a '>>>' example in a plain block would never be checked"
                )
                assert page.name in {p.name for p in PAGES}
    for where, start in SETUP:
        assert any(code.startswith(start) for _, code in blocks(DOCS / where)), (
            f"docs/{where}: no block starts with {start!r} any more"
        )
