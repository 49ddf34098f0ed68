"""ptfile.save_dcp against real torch 2.13: torch's dcp.load and dcp_to_torch_save read what
ptfile writes, the data file is byte-identical to torch's own single-process dcp.save, and
ptfile.load_dcp reads it back."""

from __future__ import annotations

import math
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import ptfile
from oracle import assert_same
from strategies import arrays, keys, scalars

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

from dcp_cases import trained  # noqa: E402

_DTYPES = ("float16", "float32", "float64", "bfloat16", "int8", "uint8", "int16", "int32",
           "int64", "bool", "complex64", "complex128", "uint16", "uint32", "uint64",
           "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def _state() -> dict[str, Any]:
    return {
        **trained(),
        "dtypes": {name: torch.arange(-3, 9).reshape(3, 4).to(getattr(torch, name))
                   for name in _DTYPES},
        "transposed": torch.arange(15.0).reshape(3, 5).t(),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "sliced": torch.arange(20.0).reshape(4, 5)[1:3, 1:4],
        "expanded": torch.ones(3, 1).expand(3, 4),
        "empty": torch.zeros(0, 3), "scalar": torch.tensor(7.5),
        "param": torch.nn.Parameter(torch.ones(2, 2)),
        "nested": {"deep": {"er": torch.ones(3), 7: torch.zeros(1)}, "dotted.key": torch.ones(1)},
        "lst": [torch.ones(2), {"a": 1}, [torch.zeros(1)]],
        "step": 5, "lr": 0.1, "name": "héllo", "blob": b"\x00\xff", "none": None,
        "ints": [1, 2, 3], "tup": (torch.ones(1), "x"), "gone": {},
    }


def _zeros_like(tree: Any) -> Any:
    """The tree with every tensor replaced by zeros of its shape and dtype (dcp.load fills
    pre-allocated tensors in place); values are kept (dcp.load replaces them)."""
    if isinstance(tree, torch.Tensor):
        return torch.zeros(tree.shape, dtype=tree.dtype)
    if isinstance(tree, np.ndarray):
        return torch.zeros(tree.shape, dtype=getattr(torch, ptfile.model.dtypes.from_numpy(
            tree.dtype).name))
    if isinstance(tree, dict):
        return type(tree)((k, _zeros_like(v)) for k, v in tree.items())
    if isinstance(tree, list):
        return [_zeros_like(v) for v in tree]
    return tree


def _torch_load(directory: Path, like: Any) -> Any:
    target = _zeros_like(like)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        dcp.load(target, checkpoint_id=directory)
    return target


def _bits(t: Any) -> bytes:
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t).tobytes()
    fresh = torch.empty(t.shape, dtype=t.dtype).copy_(t)  # strides torch's own, even size-1
    return bytes(fresh.reshape(-1).view(torch.uint8).numpy())


def _assert_loaded(got: Any, saved: Any, path: str = "") -> None:
    """``got`` (what torch read back) holds the values of ``saved``, bit for bit."""
    if isinstance(saved, (torch.Tensor, np.ndarray)):
        assert isinstance(got, torch.Tensor), path
        assert tuple(got.shape) == tuple(saved.shape), path
        assert _bits(got) == _bits(saved), path
    elif isinstance(saved, dict):
        assert list(got) == list(saved), path
        for key in saved:
            _assert_loaded(got[key], saved[key], f"{path}/{key}")
    elif isinstance(saved, (list, tuple)):
        assert type(got) is type(saved) and len(got) == len(saved), path
        for i, (a, b) in enumerate(zip(got, saved)):
            _assert_loaded(a, b, f"{path}[{i}]")
    elif isinstance(saved, float) and math.isnan(saved):
        assert math.isnan(got), path
    else:
        assert type(got) is type(saved) and got == saved, (path, got, saved)


def test_torch_dcp_load_reads_it(tmp_path: Path) -> None:
    ptfile.save_dcp(_state(), tmp_path / "ckpt")
    _assert_loaded(_torch_load(tmp_path / "ckpt", _state()), _state())


def test_dcp_to_torch_save_and_load_dcp_agree(tmp_path: Path) -> None:
    ptfile.save_dcp(_state(), tmp_path / "ckpt")
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "out.pt")
    expected = torch.load(tmp_path / "out.pt", weights_only=False)
    assert_same(ptfile.load_dcp(tmp_path / "ckpt"), expected)
    assert "gone" not in expected and expected["nested"]["deep"]["7"].tolist() == [0.0]
    assert torch.equal(expected["sliced"], _state()["sliced"])


def test_data_file_is_torchs_and_metadata_equal(tmp_path: Path) -> None:
    """The same state dict saved by torch's dcp.save: the same .distcp bytes, and a
    .metadata equal field by field but for the ids torch draws at random."""
    dcp.save(_state(), checkpoint_id=tmp_path / "torch")
    ptfile.save_dcp(_state(), tmp_path / "ptfile")
    assert sorted(os.listdir(tmp_path / "ptfile")) == sorted(os.listdir(tmp_path / "torch"))
    assert (tmp_path / "ptfile" / "__0_0.distcp").read_bytes() == \
        (tmp_path / "torch" / "__0_0.distcp").read_bytes()
    ours, theirs = (pickle.loads((tmp_path / name / ".metadata").read_bytes())
                    for name in ("ptfile", "torch"))
    assert list(ours.state_dict_metadata.items()) == list(theirs.state_dict_metadata.items())
    assert ours.planner_data == theirs.planner_data
    assert list(ours.storage_data.items()) == list(theirs.storage_data.items())
    assert [k.index for k in ours.storage_data] == [k.index for k in theirs.storage_data]
    assert ours.version == theirs.version
    assert str(ours.storage_meta.checkpoint_id) == str(tmp_path / "ptfile")
    assert (ours.storage_meta.load_id, ours.storage_meta.modules) == (None, [])
    assert ours.state_dict_metadata["param"].properties.requires_grad is True


def test_torch_free_inputs(tmp_path: Path) -> None:
    """numpy arrays and ptfile tensors (as ptfile.load returns them) are tensors."""
    ptfile.save(_state(), tmp_path / "state.pt")
    loaded = ptfile.load(tmp_path / "state.pt")
    arrays_in = {"a": np.arange(12, dtype=np.int16).reshape(3, 4).T, "b": np.ones(0),
                 "c": np.arange(10.0)[::3], "d": np.array(2.0, np.float32)}
    ptfile.save_dcp({"loaded": loaded, "np": arrays_in}, tmp_path / "ckpt")
    got = _torch_load(tmp_path / "ckpt", {"loaded": _state(), "np": arrays_in})
    _assert_loaded(got["loaded"], _state())
    _assert_loaded(got["np"], arrays_in)


def test_save_is_deterministic(tmp_path: Path) -> None:
    ptfile.save_dcp(_state(), tmp_path / "a")
    first = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    ptfile.save_dcp(_state(), tmp_path / "a")
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == first


class _Unwritable:
    pass


def test_failure_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ptfile.SaveError, match="late"):
        ptfile.save_dcp({"w": torch.ones(3), "late": _Unwritable()}, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []
    ptfile.save_dcp({"w": torch.ones(3)}, tmp_path / "ckpt")
    before = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    with pytest.raises(ptfile.SaveError):
        ptfile.save_dcp({"late": [_Unwritable()]}, tmp_path / "ckpt")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == before


def test_existing_checkpoint_is_replaced(tmp_path: Path) -> None:
    dcp.save({"old": torch.ones(2)}, checkpoint_id=tmp_path / "ckpt",
             storage_writer=dcp.FileSystemWriter(tmp_path / "ckpt", thread_count=2))
    ptfile.save_dcp({"new": torch.zeros(2)}, tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".metadata", "__0_0.distcp"]
    assert list(ptfile.load_dcp(tmp_path / "ckpt")) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_refusals(tmp_path: Path) -> None:
    with pytest.raises(ptfile.SaveError, match="duplicated"):
        ptfile.save_dcp({"a.b": 1, "a": {"b": 2}}, tmp_path / "dup")
    with pytest.raises(ptfile.SaveError, match="mapping"):
        ptfile.save_dcp([torch.ones(1)], tmp_path / "list")  # type: ignore[arg-type]
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(ptfile.SaveError, match="not a directory"):
        ptfile.save_dcp({"a": 1}, tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_empty_state_dict(tmp_path: Path) -> None:
    ptfile.save_dcp({}, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "__0_0.distcp").read_bytes() == b""
    assert ptfile.load_dcp(tmp_path / "ckpt") == {}


_leaves = arrays() | scalars
#: Nested dicts are never empty: torch cannot load its own checkpoint of ``[{}, ...]`` (the
#: empty dict leaves a hole in the list, spec §12.4).
_trees = st.recursive(_leaves, lambda children: st.lists(children, max_size=3)
                      | st.tuples(children, children)
                      | st.dictionaries(keys, children, min_size=1, max_size=3), max_leaves=8)


@given(st.dictionaries(keys, _trees, max_size=4))
def test_property_torch_reads_back_what_was_saved(state: dict[str, Any]) -> None:
    import copy
    import tempfile

    expected = copy.deepcopy(state)  # dcp.load may write into values the target shares
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ptfile.save_dcp(state, os.path.join(tmp, "ckpt"))
        except ptfile.SaveError as exc:
            assume("duplicated" not in str(exc))  # keys such as "a.b" beside {"a": {"b"}}
            raise
        _assert_loaded(_torch_load(Path(tmp) / "ckpt", state), expected)
        ptfile.load_dcp(os.path.join(tmp, "ckpt"))


def test_load_of_a_dcp_directory_is_load_dcp(tmp_path: Path) -> None:
    """ptfile.load on a DCP folder reads it as load_dcp does (every folder kind is a
    checkpoint for every front door); a folder of no checkpoint is named as such."""
    ptfile.save_dcp({"w": np.arange(4, dtype=np.float32)}, tmp_path / "ckpt")
    assert ptfile.load(tmp_path / "ckpt")["w"].numpy().tolist() == [0, 1, 2, 3]
    assert ptfile.load_dcp(tmp_path / "ckpt")["w"].numpy().tolist() == [0, 1, 2, 3]
    (tmp_path / "plain").mkdir()
    with pytest.raises(ptfile.FormatError, match="not one checkpoint"):
        ptfile.load(tmp_path / "plain")
