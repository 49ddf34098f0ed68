"""The documentation's remote example (docs/guide/remote.md) against a checkpoint served on loopback.

tests/test_docs.py runs every other example of README.md and docs/; this block needs an HTTP
server, so it carries a ``skip-test`` marker there and runs here, with ``url`` pointing at one.
"""

from __future__ import annotations

import doctest
from pathlib import Path

import fsspec
import torch

REMOTE_PAGE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "remote.md"

from rangeserver import RangeServer  # noqa: E402 - the tests' loopback server


def test_readme_remote_example_runs(tmp_path: Path) -> None:
    torch.save({"w": torch.arange(6.0).reshape(2, 3)}, tmp_path / "model.pt")
    try:
        with RangeServer(tmp_path) as server:
            failures, tried = doctest.testfile(
                str(REMOTE_PAGE), module_relative=False, globs={"url": server.url("model.pt")},
                optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    finally:
        memory = fsspec.filesystem("memory")  # the example's memory:// copy
        if memory.exists("/demo"):
            memory.rm("/demo", recursive=True)
    assert tried >= 6
    assert failures == 0
