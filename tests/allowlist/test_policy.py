"""The safe-globals registry and the strict policy's guards."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest

import ptfile
from hostile import checkpoint, g, proto2, s
from ptfile.allowlist.rebuild import SAFE_GLOBALS


@dataclass
class Config:
    lr: float = 0.0


def _config_pickle() -> bytes:
    half = b"G?\xe0\x00\x00\x00\x00\x00\x00"  # BINFLOAT 0.5
    return checkpoint(proto2(g("mylib.config", "Config") + b")\x81}" + s("lr") + half + b"sb"))


@pytest.fixture(autouse=True)
def _clean_registry() -> None:
    ptfile.clear_safe_globals()


def test_policy_unknown_global_message_says_how() -> None:
    with pytest.raises(ptfile.UnsafeGlobalError) as info:
        ptfile.load(io.BytesIO(_config_pickle()))
    text = str(info.value)
    assert "ptfile.add_safe_globals({'mylib.config.Config': obj})" in text
    assert "ptfile.safe_globals(" in text
    assert "structural=True" in text
    assert (info.value.module, info.value.name) == ("mylib.config", "Config")


def test_policy_registry_maps_names_to_trusted_objects() -> None:
    ptfile.add_safe_globals({"mylib.config.Config": Config})
    obj = ptfile.load(io.BytesIO(_config_pickle()))
    assert obj == Config(lr=0.5)
    assert ptfile.get_safe_globals() == {"mylib.config.Config": Config}
    ptfile.clear_safe_globals()
    assert ptfile.get_safe_globals() == {}


def test_policy_context_manager_restores() -> None:
    ptfile.add_safe_globals([(dict, "keep.me")])
    with ptfile.safe_globals({"mylib.config.Config": Config}):
        assert ptfile.load(io.BytesIO(_config_pickle())) == Config(lr=0.5)
    assert ptfile.get_safe_globals() == {"keep.me": dict}
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load(io.BytesIO(_config_pickle()))


def test_policy_bare_objects_are_keyed_by_their_own_names() -> None:
    ptfile.add_safe_globals([Config])
    assert f"{Config.__module__}.{Config.__qualname__}" in ptfile.get_safe_globals()
    with pytest.raises(ValueError, match=r"module\.qualname"):
        ptfile.add_safe_globals({"nodot": Config})


def test_policy_blocked_modules_stay_blocked() -> None:
    ptfile.add_safe_globals({"os.getcwd": str})
    data = checkpoint(proto2(g("os", "getcwd") + b")R"))
    with pytest.raises(ptfile.UnsafeGlobalError, match="never allows"):
        ptfile.load(io.BytesIO(data))


@pytest.mark.parametrize(("module", "name", "attribute"), [
    ("collections", "OrderedDict", "__defaults__"),
    ("torch", "FloatStorage", "dtype"),
    ("torch", "float32", "itemsize"),
])
def test_policy_build_cannot_change_allowlisted_objects(module: str, name: str,
                                                        attribute: str) -> None:
    target = SAFE_GLOBALS[module, name]
    before = getattr(target, attribute)
    for state in (b"}" + s(attribute) + b"K\x07s", b"N}" + s(attribute) + b"K\x07s\x86"):
        data = checkpoint(proto2(g(module, name) + state + b"b"))
        with pytest.raises(ptfile.UnsafeGlobalError, match="read-only"):
            ptfile.load(io.BytesIO(data))
    assert getattr(target, attribute) == before


def test_policy_guards_leave_copies_and_pickling_alone() -> None:
    import copy
    import pickle

    dtype = SAFE_GLOBALS["torch", "float32"]
    assert copy.copy(dtype) == dtype
    assert pickle.loads(pickle.dumps(dtype)) == dtype
    storage_type = SAFE_GLOBALS["torch", "FloatStorage"]
    assert copy.deepcopy(storage_type) == storage_type
