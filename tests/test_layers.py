"""The layers of docs/architecture.md ("Layers"), checked on the source tree itself.

An AST scan of every package's imports (top-level and inside functions), so a rule
broken anywhere fails here with the module and the import:

* no import cycle between modules (counting imports inside functions: a lazy import is still
  a dependency);
* the user API (``millwheel/`` outside ``millwheel/runtime/`` and the CLI) imports neither
  ``millwheel.runtime`` nor pyspark, and nothing in ``millwheel/`` imports ``topologies``;
* the services (``watermark_authority``, ``id_registry``) and ``servicekit`` import nothing
  from ``millwheel``; ``servicekit`` imports neither service;
* no package imports another package's private ``_modules`` (benchmarks, which measure
  internals on purpose, excepted).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "millwheel",
    "watermark_authority",
    "id_registry",
    "servicekit",
    "faults",
    "topologies",
    "computations",
)
#: the modules of ``millwheel`` allowed to reach the Spark runtime: the command line
CLI_MODULES = ("millwheel.cli", "millwheel._cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _imports(name: str, path: Path) -> Iterator[tuple[str, int, bool]]:
    """``(imported module, line, at module level)`` of every import in a module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = {id(n) for n in tree.body}
    type_checking = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_checking |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        at_top = id(node) in top_level
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, at_top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            yield base, node.lineno, at_top
            for alias in node.names:  # ``from pkg import _module``
                yield f"{base}.{alias.name}", node.lineno, at_top


MODULES = _modules()
IMPORTS = {name: list(_imports(name, path)) for name, path in MODULES.items()}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _private_part(module: str) -> str | None:
    """The first private component (``_x``) of a dotted name, or ``None``."""
    for part in module.split("."):
        if part.startswith("_") and not part.startswith("__"):
            return part
    return None


def test_the_scan_sees_the_tree():
    assert (
        "millwheel._step" in MODULES
        and "millwheel.runtime._query" in MODULES
        and "faults.check" in MODULES
    )
    assert any(imp == "millwheel._delivery" for imp, _, _ in IMPORTS["millwheel.testing._harness"])


def test_no_import_cycles():
    graph = {
        name: {imp for imp, _, _top in IMPORTS[name] if imp in MODULES and imp != name}
        for name in MODULES
    }
    # a package's __init__ importing its own modules is not a cycle of behaviour: it is how
    # a package exposes its API; cycles are looked for among the other modules
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if MODULES[nxt].name == "__init__.py":
                continue
            if seen.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in seen:
                visit(nxt)
        stack.pop()
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            visit(name)
    assert cycles == []


def _violations(rule) -> list[str]:
    out = []
    for name, imports in IMPORTS.items():
        for imp, line, _ in imports:
            why = rule(name, imp)
            if why:
                out.append(f"{MODULES[name].relative_to(ROOT)}:{line}: {name} imports {imp}: {why}")
    return sorted(set(out))


def test_the_user_api_reaches_neither_spark_nor_the_runtime():
    def rule(name: str, imp: str) -> str | None:
        if (
            not _under(name, "millwheel")
            or _under(name, "millwheel.runtime")
            or name.startswith(CLI_MODULES)
        ):
            return None
        if _under(imp, "millwheel.runtime"):
            return "only the runtime and the CLI import the runtime"
        if _under(imp, "pyspark") or _under(imp, "py4j"):
            return "the user API imports no pyspark"
        return None

    assert _violations(rule) == []


def test_millwheel_does_not_import_the_topologies():
    assert (
        _violations(
            lambda name, imp: (
                "topologies are built on millwheel"
                if _under(name, "millwheel") and _under(imp, "topologies")
                else None
            )
        )
        == []
    )


@pytest.mark.parametrize("service", ["watermark_authority", "id_registry", "servicekit"])
def test_services_stand_alone(service):
    def rule(name: str, imp: str) -> str | None:
        if not _under(name, service):
            return None
        if _under(imp, "millwheel"):
            return "services import nothing from millwheel"
        if service == "servicekit" and (
            _under(imp, "watermark_authority") or _under(imp, "id_registry")
        ):
            return "servicekit is below the services"
        return None

    assert _violations(rule) == []


def test_no_package_imports_another_packages_private_modules():
    def rule(name: str, imp: str) -> str | None:
        own, other = name.split(".")[0], imp.split(".")[0]
        if own == other or other not in PACKAGES:
            return None
        private = _private_part(imp)
        return f"{private} is private to {other}: use its public API" if private else None

    assert _violations(rule) == []


def test_a_broken_rule_is_caught():
    """The scan is not vacuous: a private import and a cycle it is shown are found."""
    global MODULES, IMPORTS
    saved = MODULES, IMPORTS
    try:
        MODULES = {
            **saved[0],
            "faults.fake": ROOT / "faults" / "fake.py",
            "faults.fake2": ROOT / "faults" / "fake2.py",
        }
        IMPORTS = {
            **saved[1],
            "faults.fake": [("millwheel._step", 1, True), ("faults.fake2", 2, True)],
            "faults.fake2": [("faults.fake", 1, True)],
        }
        with pytest.raises(
            AssertionError,
            match=r"faults.fake imports millwheel._step: _step is private to millwheel",
        ):
            test_no_package_imports_another_packages_private_modules()
        with pytest.raises(AssertionError, match="faults.fake"):
            test_no_import_cycles()
    finally:
        MODULES, IMPORTS = saved
