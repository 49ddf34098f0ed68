"""The documentation's examples run: every ```python block of README.md and docs/**/*.md,
and the ```console (and ```bash) command lines.

The blocks of one page run in order in one fresh temporary folder (the working directory
and ``tempfile``'s default folder; removed afterwards) and share one namespace, so a block
may use what an earlier one defined or wrote. A block written as a doctest (``>>>`` lines)
runs through :mod:`doctest` (``ELLIPSIS``, ``NORMALIZE_WHITESPACE``), its printed results
checked; any other python block is executed whole. A console block's ``$ command`` lines run
through bash with the installed ``ptfile`` script first on ``PATH``; each must exit with the
code its ``[exit N]`` line shows, 0 without one (their printed output is not compared).

A block that cannot run here (the network, a GPU, a command that runs the whole suite) is
marked right before its fence with ``<!-- skip-test: the reason -->``. Each marked block is
reported as one skipped test carrying its reason, so ``pytest -ra`` lists and counts them.
"""

from __future__ import annotations

import doctest
import linecache
import os
import re
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import ptfile

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUNNABLE = {"python", "console", "bash"}
SKIP_MARKER = re.compile(r"<!--\s*skip-test:\s*(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")
EXIT_LINE = re.compile(r"^\[exit (?P<code>\d+)\]$")
#: The installed console script (`ptfile`), found beside this interpreter.
BIN = Path(sys.executable).parent
COMMAND_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    skip_reason: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the skip marker on the line before it."""
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        start, lang = i, match["lang"]
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page}:{start + 1}: a fence that is never closed")
        before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        marker = SKIP_MARKER.fullmatch(before.strip())
        blocks.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:i]) + "\n",
                            marker["reason"] if marker else None))
        i += 1
    return blocks


BLOCKS = {page: parse_blocks(page) for page in PAGES}
RUN_PAGES = [p for p in PAGES
             if any(b.lang in RUNNABLE and b.skip_reason is None for b in BLOCKS[p])]
SKIPPED = [b for blocks in BLOCKS.values() for b in blocks if b.skip_reason is not None]


def run_python(block: Block, namespace: dict[str, Any]) -> None:
    if re.search(r"^\s*>>> ", block.text, re.MULTILINE):
        parser = doctest.DocTestParser()
        test = parser.get_doctest(block.text, namespace, block.where, str(block.page),
                                  block.line)
        runner = doctest.DocTestRunner(
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        report: list[str] = []
        runner.run(test, out=report.append, clear_globs=False)
        namespace.update(test.globs)
        assert runner.failures == 0, f"{block.where}: doctest failed\n" + "".join(report)
        return
    # Registered as source, so that torch (TorchScript, export) and tracebacks can read the
    # functions a block defines.
    filename = f"<{block.where}>"
    linecache.cache[filename] = (len(block.text), None, block.text.splitlines(True), filename)
    try:
        exec(compile(block.text, filename, "exec"), namespace)  # noqa: S102 - the test's purpose
    finally:
        linecache.cache.pop(filename, None)


def console_commands(block: Block) -> Iterator[tuple[str, int]]:
    """Each ``$ command`` of a console block with the exit code its ``[exit N]`` shows."""
    command: str | None = None
    code = 0
    for line in block.text.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, code
            command, code = line[2:], 0
        elif (match := EXIT_LINE.match(line.strip())) is not None:
            code = int(match["code"])
    if command is not None:
        yield command, code


def run_shell(block: Block, cwd: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "TMPDIR": str(cwd)}
    if block.lang == "bash":
        commands: list[tuple[str, int]] = [(block.text, 0)]
    else:
        commands = list(console_commands(block))
        assert commands, f"{block.where}: a console block without a `$ ` command"
    for command, expected in commands:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        assert done.returncode == expected, (
            f"{block.where}: `{command}` exited {done.returncode}, the page says {expected}\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")


@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
def test_docs_page_examples_run(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [b for b in BLOCKS[page] if b.lang in RUNNABLE and b.skip_reason is None]
    safe_before = ptfile.get_safe_globals()
    with tempfile.TemporaryDirectory(prefix="ptfile-docs-") as folder, ptfile.settings():
        cwd = Path(folder)
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(tempfile, "tempdir", folder)  # the examples' mkdtemp() folders
        # The page's namespace is a real __main__ module for the while, so that pickle (and
        # torch.save) find the classes an example defines by their module and name.
        main = types.ModuleType("__main__")
        monkeypatch.setitem(sys.modules, "__main__", main)
        namespace: dict[str, Any] = main.__dict__
        try:
            for block in blocks:
                if block.lang == "python":
                    run_python(block, namespace)
                else:
                    run_shell(block, cwd)
        finally:
            namespace.clear()
            ptfile.clear_safe_globals()
            ptfile.add_safe_globals(safe_before)


@pytest.mark.parametrize("block", SKIPPED, ids=[b.where for b in SKIPPED])
def test_docs_marked_block_is_reported(block: Block) -> None:
    """One skipped test per ``skip-test`` block: ``-ra`` lists each with its reason."""
    assert block.lang in RUNNABLE, f"{block.where}: a skip marker on a {block.lang!r} block"
    pytest.skip(f"{block.where} ({block.lang}): {block.skip_reason}")


def test_docs_every_skip_marker_precedes_a_block() -> None:
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        markers = sum(SKIP_MARKER.fullmatch(line.strip()) is not None for line in lines)
        marked = sum(b.skip_reason is not None for b in BLOCKS[page])
        assert markers == marked, f"{page}: a skip-test marker not right before a fence"


def test_docs_examples_are_found() -> None:
    runnable = [b for blocks in BLOCKS.values() for b in blocks if b.lang in RUNNABLE]
    assert sum(b.lang == "python" for b in BLOCKS[ROOT / "README.md"]) >= 1
    assert sum(b.lang == "console" and b.skip_reason is None for b in runnable) >= 5
    assert len(SKIPPED) < len(runnable) / 4, "most examples must run, not be skipped"
