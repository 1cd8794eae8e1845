"""Every command-line option the docs name exists in its command's ``--help``.

Scanned: ``README.md``, ``docs/*.md`` and the module docstrings of ``millwheel/`` and
``topologies/``. An option written after a command in the same code span, code line or
docstring line (``millwheel run T.py --checkpoint DIR``, ``bench/runtime_bench.py --reps 2``,
``python -m faults.driver --injector spark``) must be in that command's ``--help``; an
option named on its own (``--intervals N``) must be in some command's. Options of other
tools (``spark-submit``, ``pytest``, ``pip``...) are theirs, not ours.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from millwheel import cli

ROOT = Path(__file__).resolve().parents[1]

#: a long option
_OPTION = re.compile(r"(?<![\w/.=-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
#: a ``millwheel`` command and up to two words after it (subcommands, when they are ones)
_MILLWHEEL = re.compile(r"(?<![\w/.-])millwheel((?:\s+[a-z][a-z-]*){0,2})(?![\w.:-])")
#: ``spark-submit ... "$(millwheel cluster launcher)" run ...``: the launcher runs ``millwheel run``
_LAUNCHER = re.compile(r"millwheel cluster launcher\)\"?\s+([a-z][a-z-]*)")
#: a script of this repository, or a module run with ``python -m``
_SCRIPT = re.compile(
    r"(?<![\w/])((?:bench|faults|scripts)/[\w/]+\.py|[a-z_]+_bench\.py)|python3? -m ([a-z_][\w.]*)"
)
#: other tools: an option after one of these on the same line is the tool's
_OTHER = re.compile(
    r"\b(spark-submit|pytest|pip3?|uv|git|docker|java|etcd|curl|ruff|mypy|setup\.sh|spark-class|start-worker\.sh|asciinema)\b"
)
#: options of other tools that the docs name on their own, in prose
_OTHER_OPTIONS = {
    "--py-files",
    "--archives",
    "--deploy-mode",
    "--driver-java-options",
    "--files",  # spark-submit
    "--doctest-modules",
    "--doctest-glob",
    "--dist",
    "--maxprocesses",  # pytest, pytest-xdist
    "--test",  # scripts/setup.sh
    "--slow",  # pytest, from conftest.py
    "--help",
}


def _sources() -> list[tuple[str, str]]:
    """``(where, text)`` of every doc and module docstring scanned."""
    out = [
        (str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
        for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    ]
    for package in ("millwheel", "topologies"):
        for p in sorted((ROOT / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")), clean=False)
            if doc:
                out.append((str(p.relative_to(ROOT)), doc))
    return out


def _segments(text: str) -> list[str]:
    """The pieces of ``text`` an option belongs to the command of: each line of a code block
    (continued by a trailing backslash), each inline code span of a paragraph, and the prose
    around them."""
    out: list[str] = []
    fenced = False
    lines = text.splitlines()
    paragraph: list[str] = []

    def prose() -> None:
        if paragraph:
            out.extend(s for s in re.split(r"``?", " ".join(paragraph)) if s.strip())
            paragraph.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        while fenced and line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        if line.lstrip().startswith("```"):
            prose()
            fenced = not fenced
            continue
        if fenced:
            out.append(line)
        elif line.strip():
            paragraph.append(line.strip())
        else:
            prose()
    prose()
    return out


def mentions() -> list[tuple[str, tuple[str, ...] | None, str, str]]:
    """``(where, command, option, segment)`` of every option the docs name: ``command`` is
    ``("millwheel", sub, ...)`` or ``("script", path)``, or ``None`` for an option on its own."""
    out = []
    for where, text in _sources():
        for seg in _segments(text):
            for m in _OPTION.finditer(seg):
                before = seg[: m.start()]
                last: tuple[int, tuple[str, ...] | None] = (-1, None)
                for c in _MILLWHEEL.finditer(before):
                    last = max(
                        last, (c.start(), ("millwheel", *c.group(1).split())), key=lambda x: x[0]
                    )
                for c in _LAUNCHER.finditer(before):
                    last = max(last, (c.start() + 1, ("millwheel", c.group(1))), key=lambda x: x[0])
                for c in _SCRIPT.finditer(before):
                    last = max(
                        last,
                        (c.start(), ("script", c.group(1) or f"-m {c.group(2)}")),
                        key=lambda x: x[0],
                    )
                for c in _OTHER.finditer(before):
                    last = max(last, (c.start(), ("other", c.group(1))), key=lambda x: x[0])
                if re.search(r"[;|]|&&", before[last[0] :] if last[0] >= 0 else ""):
                    last = (-1, None)  # another command on the line
                command = last[1]
                if command is not None and command[0] == "other":
                    continue
                out.append((where, command, m.group(0), seg.strip()[:160]))
    return out


def _help_text(argv: list[str]) -> str:
    """What ``millwheel ARGV --help`` prints."""
    out = io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.suppress(SystemExit),
    ):
        cli.main([*argv, "--help"])
    return out.getvalue()


@functools.cache
def millwheel_options(words: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    """The deepest ``millwheel`` command that ``words`` names (its subcommands, as far as
    they are ones) and the options its ``--help`` lists."""
    path: list[str] = []
    text = _help_text([])
    for word in words:
        choices = re.search(r"\{([a-z,-]+)\}", text)
        if not choices or word not in choices.group(1).split(","):
            break
        path.append(word)
        text = _help_text(path)
    return tuple(path), frozenset(_OPTION.findall(text))


def _script_path(script: str) -> Path | None:
    """The file of a script (``bench/x.py``, ``x_bench.py``) or ``-m`` module of this repository."""
    if script.startswith("-m "):
        found = [
            ROOT / (script[3:].replace(".", "/") + ".py"),
            ROOT / script[3:].replace(".", "/") / "__main__.py",
        ]
    else:
        found = [ROOT / script] if "/" in script else sorted(ROOT.glob(f"*/{script}"))
    return next((f for f in found if f.is_file()), None)


@functools.cache
def _declared(path: Path) -> frozenset[str]:
    """The long options ``path`` declares (``add_argument("--x", ...)``), its own and those of
    the scripts' helper modules beside it that it imports (a benchmark's ``_spark_bench.data_args``):
    what its ``--help`` lists, read without running it (a benchmark's imports start Spark's client)."""
    out = {"--help"}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            out |= {
                a.value
                for a in node.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.startswith("--")
            }
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            helper = path.parent / (node.module + ".py")
            if node.module.startswith("_") and helper.is_file() and helper != path:
                out |= _declared(helper)
    return frozenset(out)


@functools.cache
def script_options(script: str) -> frozenset[str]:
    """The options of a script's (or ``-m`` module's) command line (a module that parses
    none of its own, e.g. one that hands its arguments to a parser elsewhere: its ``--help``)."""
    path = _script_path(script)
    if path is None:
        return frozenset()
    declared = _declared(path)
    if len(declared) > 1:
        return declared
    argv = (
        [sys.executable, "-m", script[3:]]
        if script.startswith("-m ")
        else [sys.executable, str(path)]
    )
    done = subprocess.run(
        [*argv, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    return frozenset(_OPTION.findall(done.stdout)) | declared


def _all_script_options() -> set[str]:
    """Every option any script of ``bench/``, ``faults/`` or ``scripts/`` declares."""
    return {
        o
        for d in ("bench", "faults", "scripts")
        for p in sorted((ROOT / d).glob("*.py"))
        for o in _declared(p)
    }


def _all_millwheel_options() -> set[str]:
    """Every option of every ``millwheel`` command and subcommand."""
    out: set[str] = set()
    top = _help_text([])
    for name in re.search(r"\{([a-z,-]+)\}", top).group(1).split(","):  # type: ignore[union-attr]
        _, opts = millwheel_options((name,))
        out |= opts
        sub = re.search(r"\{([a-z,-]+)\}", _help_text([name]))
        for word in sub.group(1).split(",") if sub else []:
            out |= millwheel_options((name, word))[1]
    return out


def test_the_scan_finds_options_of_commands_and_on_their_own():
    found = mentions()
    assert any(
        c == ("millwheel", "run", "T.py") or (c and c[:2] == ("millwheel", "run"))
        for _, c, _, _ in found
    )
    assert any(c is None for _, c, _, _ in found)
    assert any(c and c[0] == "script" for _, c, _, _ in found)
    seg = _segments(
        "run `millwheel run T.py --checkpoint DIR`, then ``pytest --dist loadgroup`` and\n```\nmillwheel rescale RUN \\\n  --intervals 8\n```\n"
    )
    assert seg == [
        "run ",
        "millwheel run T.py --checkpoint DIR",
        ", then ",
        "pytest --dist loadgroup",
        " and",
        "millwheel rescale RUN  --intervals 8",
    ]


def test_every_option_the_docs_name_is_in_its_commands_help():
    everything = _all_millwheel_options()
    missing = []
    scripts: set[str] = set()
    for where, command, option, seg in mentions():
        if command is None:
            continue
        if command[0] == "millwheel":
            path, opts = millwheel_options(tuple(command[1:]))
            if option not in opts:
                missing.append(f"{where}: `millwheel {' '.join(path)}` has no {option} ({seg!r})")
        else:
            scripts.add(command[1])
            if option not in script_options(command[1]):
                missing.append(f"{where}: {command[1]} has no {option} ({seg!r})")
    known = (
        everything
        | _OTHER_OPTIONS
        | _all_script_options()
        | {o for s in scripts for o in script_options(s)}
    )
    for where, command, option, seg in mentions():
        if command is None and option not in known:
            missing.append(f"{where}: no command has {option} ({seg!r})")
    assert missing == [], "\n".join(missing)


@pytest.mark.parametrize("option", ["--run-dir", "--no-such-option"])
def test_a_made_up_option_is_found(option, monkeypatch):
    import tests.test_doc_options as me

    monkeypatch.setattr(me, "_sources", lambda: [("x.md", f"`millwheel run T.py {option} RUN`")])
    found = me.mentions()
    assert found == [("x.md", ("millwheel", "run"), option, f"millwheel run T.py {option} RUN")]
    assert option not in me.millwheel_options(("run",))[1]
