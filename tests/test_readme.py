"""The README's runnable examples: the remote block runs against a checkpoint served on loopback."""

from __future__ import annotations

import doctest
import sys
import tempfile
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parent.parent / "README.md"
#: The README's .pt2 example reads this golden file (made by its make_tiny_export.py).
TINY_EXPORT = Path(__file__).resolve().parent / "golden" / "tiny_export.pt2"
sys.path.insert(0, str(Path(__file__).parent / "remote"))

from rangeserver import RangeServer  # noqa: E402 - the tests' loopback server


def test_readme_remote_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.checkpoint as dcp

    scratch = tmp_path / "scratch"  # the examples' tempfile.mkdtemp() folders, not left in /tmp
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    torch.save({"w": torch.arange(6.0).reshape(2, 3)}, tmp_path / "model.pt")
    model = {"weight": torch.arange(12.0).reshape(4, 3), "bias": torch.zeros(3)}
    dcp.save({"model": model, "step": 3}, checkpoint_id=tmp_path / "dcp")
    with RangeServer(tmp_path) as server:
        failures, tried = doctest.testfile(
            str(README), module_relative=False,
            globs={"url": server.url("model.pt"), "pt2": str(TINY_EXPORT),
                   "dcp_dir": str(tmp_path / "dcp")},
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert tried >= 6
    assert failures == 0
