"""The torch.serialization names a user ports code with, against torch 2.13.

``skip_data``, ``get_unsafe_globals_in_checkpoint``, ``LoadEndianness`` and the
``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` / ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` variables
with ``weights_only``.
"""

from __future__ import annotations

import collections
import io
import pickle
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from hostile import with_data_pkl
from oracle import assert_same


class Custom:
    """A class torch's weights-only unpickler refuses (and ptfile's strict policy)."""

    def __init__(self) -> None:
        self.x = 1


def torch_saved(obj: Any, path: Path, **kwargs: Any) -> Path:
    torch.save(obj, path, **kwargs)
    return path


def file_with_data_pkl(path: Path, pkl: bytes, out: Path) -> Path:
    """``path`` with its ``data.pkl`` replaced by ``pkl``, written to ``out``."""
    out.write_bytes(with_data_pkl(path.read_bytes(), pkl))
    return out


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    clean = torch_saved({"w": w, "n": collections.Counter(a=1)}, tmp_path / "clean.pt")
    system = b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00echoq\x01\x85q\x02Rq\x03."
    return {
        "clean": clean,
        "custom": torch_saved({"w": w, "c": Custom(), "d": collections.OrderedDict()},
                              tmp_path / "custom.pt"),
        "system": file_with_data_pkl(clean, system, tmp_path / "system.pt"),
        "posix": file_with_data_pkl(clean, system.replace(b"cos\n", b"cposix\n"),
                               tmp_path / "posix.pt"),
    }


# ---------------------------------------------------------------------- skip_data


def test_skip_data_context_save_is_byte_identical_to_torch(tmp_path: Path) -> None:
    obj = {"w": torch.randn(3, 4), "v": torch.arange(5), "h": torch.ones(2, dtype=torch.half)}
    obj["view"] = obj["w"][1:]
    (tmp_path / "t").mkdir()
    (tmp_path / "p").mkdir()
    with torch.serialization.skip_data():
        torch.save(obj, tmp_path / "t" / "ckpt.pt")
    loaded = ptfile.load(torch_saved(obj, tmp_path / "full.pt"))
    with ptfile.skip_data():
        ptfile.save(loaded, tmp_path / "p" / "ckpt.pt")
        buf = io.BytesIO()
        ptfile.save(loaded, buf, archive_name="ckpt")
    expected = (tmp_path / "t" / "ckpt.pt").read_bytes()
    assert (tmp_path / "p" / "ckpt.pt").read_bytes() == expected
    assert buf.getvalue() == expected
    # outside the block, saves write data again
    ptfile.save(loaded, tmp_path / "p" / "ckpt.pt")
    assert (tmp_path / "p" / "ckpt.pt").read_bytes() != expected


@pytest.mark.parametrize("mmap", [False, True])
def test_skip_data_context_load_builds_tensors_without_data(files: dict[str, Path],
                                                            mmap: bool) -> None:
    with torch.serialization.skip_data():
        theirs = torch.load(files["clean"], mmap=mmap)
    with ptfile.skip_data():
        ours = ptfile.load(files["clean"], mmap=mmap)
    assert (ours["w"].shape, ours["w"].stride(), str(ours["w"].dtype)) == (
        theirs["w"].shape, theirs["w"].stride(), str(theirs["w"].dtype))
    assert ours["w"].storage.nbytes == theirs["w"].untyped_storage().nbytes()
    assert ours["n"] == theirs["n"]
    assert ours["w"].storage.data is None  # torch allocates uninitialised memory; ptfile none
    with pytest.raises(ptfile.UnsupportedFeatureError):
        ours["w"].numpy()
    assert ptfile.load(files["clean"])["w"].numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_skip_data_context_legacy_save_is_refused_as_torch_refuses(tmp_path: Path) -> None:
    with torch.serialization.skip_data(), pytest.raises(RuntimeError, match="skip_data"):
        torch.save({"w": torch.ones(2)}, tmp_path / "t.pt", _use_new_zipfile_serialization=False)
    with ptfile.skip_data(), pytest.raises(ptfile.SaveError, match="skip_data"):
        ptfile.save({"w": np.ones(2)}, tmp_path / "p.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(ptfile.SaveError, match="skip_data"):
        ptfile.save({"w": np.ones(2)}, tmp_path / "p.pt", _use_new_zipfile_serialization=False,
                    skip_data=True)


def test_skip_data_context_nests_restores_and_is_thread_local() -> None:
    seen: list[bool] = []

    def inside() -> None:
        with ptfile.skip_data(materialize_fake_tensors=True):
            assert ptfile.config.current().skip_data
            assert ptfile.config.current().materialize_fake_tensors
            with ptfile.skip_data():
                assert not ptfile.config.current().materialize_fake_tensors
            assert ptfile.config.current().materialize_fake_tensors
            other = threading.Thread(target=lambda: seen.append(ptfile.config.current().skip_data))
            other.start()
            other.join()
            raise KeyError("leaving by an exception restores the settings too")

    with pytest.raises(KeyError, match="restores"):
        inside()
    assert seen == [False]
    assert not ptfile.config.current().skip_data
    assert not ptfile.config.current().materialize_fake_tensors


def test_skip_data_context_applies_to_load_torchscript(tmp_path: Path) -> None:
    path = tmp_path / "ts.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 3)), path)
    with ptfile.skip_data():
        archive = ptfile.load_torchscript(path)
    weight = archive.state_dict()["weight"]
    assert weight.shape == (3, 2) and weight.storage.data is None


# ---------------------------------------------- get_unsafe_globals_in_checkpoint


@pytest.mark.parametrize("name", ["clean", "custom", "system", "posix"])
def test_unsafe_globals_equal_torch(files: dict[str, Path], name: str) -> None:
    expected = torch.serialization.get_unsafe_globals_in_checkpoint(files[name])
    ours = ptfile.get_unsafe_globals_in_checkpoint(files[name])
    assert sorted(ours) == sorted(expected)
    assert len(ours) == len(set(ours))
    assert ptfile.get_unsafe_globals_in_checkpoint(files[name].read_bytes()) == ours
    with files[name].open("rb") as fp:
        assert ptfile.get_unsafe_globals_in_checkpoint(fp) == ours


def test_unsafe_globals_values(files: dict[str, Path]) -> None:
    assert ptfile.get_unsafe_globals_in_checkpoint(files["clean"]) == []
    assert ptfile.get_unsafe_globals_in_checkpoint(files["custom"]) == \
        [f"{__name__}.Custom"]
    assert ptfile.get_unsafe_globals_in_checkpoint(files["system"]) == ["os.system"]


def test_unsafe_globals_follow_safe_globals(files: dict[str, Path]) -> None:
    qual = f"{__name__}.Custom"
    with torch.serialization.safe_globals([Custom]):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(files["custom"]) == []
    with ptfile.safe_globals({qual: Custom}):
        assert ptfile.get_unsafe_globals_in_checkpoint(files["custom"]) == []
    ptfile.add_safe_globals([Custom])
    try:
        assert ptfile.get_unsafe_globals_in_checkpoint(files["custom"]) == []
    finally:
        ptfile.clear_safe_globals()
    assert ptfile.get_unsafe_globals_in_checkpoint(files["custom"]) == [qual]


def test_unsafe_globals_of_a_blocked_module_stay_listed(files: dict[str, Path]) -> None:
    # ptfile's load refuses os.* even when registered, so the name stays unsafe
    # (torch's function leaves it out, yet torch's load refuses it too)
    import os

    with ptfile.safe_globals([(os.system, "os.system")]):
        assert ptfile.get_unsafe_globals_in_checkpoint(files["system"]) == ["os.system"]
        with pytest.raises(ptfile.UnsafeGlobalError):
            ptfile.load(files["system"])


def test_unsafe_globals_of_protocol_4_files(tmp_path: Path) -> None:
    # STACK_GLOBAL: torch's function cannot read it; ptfile resolves the names statically
    path = torch_saved({"w": torch.ones(2), "c": Custom()}, tmp_path / "p4.pt",
                       pickle_protocol=4)
    with pytest.raises(pickle.UnpicklingError):
        torch.serialization.get_unsafe_globals_in_checkpoint(path)
    assert ptfile.get_unsafe_globals_in_checkpoint(path) == [f"{__name__}.Custom"]


def test_unsafe_globals_of_other_formats(tmp_path: Path) -> None:
    legacy = torch_saved({"w": torch.ones(2), "c": Custom()}, tmp_path / "legacy.pt",
                         _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match=r"torch\.save"):
        torch.serialization.get_unsafe_globals_in_checkpoint(legacy)
    # ptfile answers for the legacy format: the names its load (and torch's) refuses
    assert ptfile.get_unsafe_globals_in_checkpoint(legacy) == [f"{__name__}.Custom"]
    with pytest.raises(pickle.UnpicklingError, match="Custom"):
        torch.load(legacy)
    tar = Path(__file__).parents[1] / "golden" / "tiny_tar.pt"
    assert ptfile.get_unsafe_globals_in_checkpoint(tar) == []
    script = tmp_path / "ts.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), script)
    with pytest.raises(ValueError, match="torchscript"):
        torch.serialization.get_unsafe_globals_in_checkpoint(script)
    with pytest.raises(ptfile.FormatError, match="TorchScript"):
        ptfile.get_unsafe_globals_in_checkpoint(script)
    with pytest.raises(ptfile.FormatError):
        ptfile.get_unsafe_globals_in_checkpoint(b"not a checkpoint at all")


# ------------------------------------------------------------------- LoadEndianness


def test_load_endianness_enum_matches_torch() -> None:
    assert [m.name for m in ptfile.LoadEndianness] == \
        [m.name for m in torch.serialization.LoadEndianness]
    assert ptfile.LoadEndianness.__module__ == "ptfile"
    assert ptfile.get_default_load_endianness() is None
    assert torch.serialization.get_default_load_endianness() is None
    try:
        for member in ptfile.LoadEndianness:
            ptfile.set_default_load_endianness(member)
            assert ptfile.get_default_load_endianness() is member
            ptfile.set_default_load_endianness(member.value)  # the string forms still work
            assert ptfile.get_default_load_endianness() is member
            assert ptfile.get_default_load_endianness() == member.value
        with pytest.raises(TypeError):
            torch.serialization.set_default_load_endianness(1)
        with pytest.raises(TypeError):
            ptfile.set_default_load_endianness(1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="middle"):
            ptfile.set_default_load_endianness("middle")
    finally:
        ptfile.set_default_load_endianness(None)
    assert ptfile.get_default_load_endianness() is None


@pytest.mark.parametrize("member", ["NATIVE", "LITTLE", "BIG", None])
def test_load_endianness_reads_files_without_record_as_torch(tmp_path: Path,
                                                             member: str | None) -> None:
    values = torch.tensor([1, 258, -3], dtype=torch.int32)
    path = tmp_path / "norecord.pt"
    torch.save({"v": values}, path, _disable_byteorder_record=True)
    theirs_member = None if member is None else torch.serialization.LoadEndianness[member]
    ours_member = None if member is None else ptfile.LoadEndianness[member]
    torch.serialization.set_default_load_endianness(theirs_member)
    try:
        theirs = torch.load(path)
    finally:
        torch.serialization.set_default_load_endianness(None)
    with ptfile.settings(load_endianness=ours_member):
        assert_same(ptfile.load(path), theirs)


# ------------------------------------------------ weights_only and the environment


def test_weights_only_false_loads_structurally(files: dict[str, Path]) -> None:
    ours = ptfile.load(files["custom"], weights_only=False)
    assert isinstance(ours["c"], ptfile.StandIn)
    assert_same(ours["w"], torch.load(files["custom"], weights_only=False)["w"])
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load(files["custom"])
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load(files["custom"], weights_only=True)


@pytest.mark.parametrize("value", ["1", "y", "YES", "true"])
def test_force_weights_only_load(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                 value: str) -> None:
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", value)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(files["custom"], weights_only=False)
    for kwargs in ({}, {"weights_only": False}, {"structural": True},
                   {"weights_only": False, "structural": True}):
        with pytest.raises(ptfile.UnsafeGlobalError):
            ptfile.load(files["custom"], **kwargs)
    assert_same(ptfile.load(files["clean"], weights_only=False), torch.load(files["clean"]))


def test_force_weights_only_unset_values(files: dict[str, Path],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0")
    torch.load(files["custom"], weights_only=False)
    assert isinstance(ptfile.load(files["custom"], weights_only=False)["c"], ptfile.StandIn)


def test_force_no_weights_only_load(files: dict[str, Path],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        theirs = torch.load(files["custom"])
    assert isinstance(theirs["c"], Custom)
    with pytest.warns(ptfile.PtfileWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        ours = ptfile.load(files["custom"])
    assert isinstance(ours["c"], ptfile.StandIn)  # structural: nothing was executed
    assert_same(ours["w"], theirs["w"])
    # an explicit weights_only=True wins, in both
    with pytest.raises(pickle.UnpicklingError):
        torch.load(files["custom"], weights_only=True)
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load(files["custom"], weights_only=True)


def test_force_both_is_an_error(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(RuntimeError, match="Only one of"):
        torch.load(files["clean"])
    with pytest.raises(ptfile.PtfileError, match="only one of"):
        ptfile.load(files["clean"])


# ------------------------------------------------------------ config.load.mmap


def test_mmap_setting_is_what_mmap_none_means(files: dict[str, Path]) -> None:
    from torch.utils.serialization import config as torch_config

    path = files["clean"]
    with ptfile.settings(mmap=True, mmap_flags=ptfile.MAP_SHARED):
        loaded = ptfile.load(path)
        loaded["w"].numpy()[0, 0] = 42.0  # a shared map: the write reaches the file
        with pytest.raises(ValueError, match="path"):
            ptfile.load(io.BytesIO(path.read_bytes()))
        assert ptfile.load(path, mmap=False)["w"].numpy()[0, 0] == 42.0
    del loaded
    assert torch.load(path)["w"][0, 0] == 42.0
    ptfile.load(io.BytesIO(path.read_bytes()))  # the setting is gone with the block
    torch_config.load.mmap = True
    try:
        with pytest.raises(ValueError, match="path"):
            torch.load(io.BytesIO(path.read_bytes()))
    finally:
        torch_config.load.mmap = False
