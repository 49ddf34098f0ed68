"""The find_class policies of formats/policies.py: one home, each policy's resolution rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ptfile
from ptfile.allowlist.policy import find_strict_class
from ptfile.allowlist.rebuild import StorageType
from ptfile.allowlist.structural import StandInType
from ptfile.formats import policies
from ptfile.formats.script_model import JIT_GLOBALS, ScriptObject

SRC = Path(ptfile.__file__).parent


@pytest.mark.parametrize("make", [policies.strict, policies.fast])
def test_policies_strict_and_fast_refuse_alike(make: object) -> None:
    find = make()  # type: ignore[operator]
    with pytest.raises(ptfile.UnsafeGlobalError) as info:
        find("posix", "system")
    assert (info.value.module, info.value.name) == ("posix", "system")
    assert find("collections", "OrderedDict") is find_strict_class("collections", "OrderedDict")


def test_policies_fast_tensor_builders_are_fresh_per_load() -> None:
    a, b = policies.fast(), policies.fast()
    key = ("torch._utils", "_rebuild_tensor_v2")
    assert a(*key) is not b(*key)
    assert a(*key) is not find_strict_class(*key)


def test_policies_script_names_then_base() -> None:
    find = policies.script(policies.strict())
    cls = find("__torch__.m", "Net")
    assert issubclass(cls, ScriptObject) and cls.qualified_name == "__torch__.m.Net"
    assert find("__torch__.m", "Net") is cls  # one class per name within a load
    assert policies.script(policies.strict())("__torch__.m", "Net") is not cls  # fresh per load
    for key, helper in JIT_GLOBALS.items():
        assert find(*key) is helper
    storage = find("torch", "UInt16Storage")  # TorchScript names every dtype's storage
    assert isinstance(storage, StorageType) and storage.dtype is not None
    with pytest.raises(ptfile.UnsafeGlobalError):
        find("torch", "UntypedStorageX")
    with pytest.raises(ptfile.UnsafeGlobalError):
        find("__torch_not__", "x")


def test_policies_plain_and_structural() -> None:
    with pytest.raises(ptfile.FormatError, match="plain values"):
        policies.plain("os", "system")
    stand_in = policies.structural()("os", "system")
    assert isinstance(stand_in, StandInType)
    lenient = policies.structural()("collections", "OrderedDict")  # records odd calls
    assert isinstance(lenient, policies.Lenient)
    assert lenient.func is find_strict_class("collections", "OrderedDict").func


def _find_class_builders(tree: ast.AST) -> list[str]:
    """Functions named find_class and classes named *FindClass defined in a module."""
    return [node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and (node.name == "find_class" or node.name.endswith("FindClass"))]


def test_policies_are_built_in_one_place() -> None:
    # The unpickler's find_class method is the mechanism that calls a policy, and the
    # scanner records names without resolving them: neither is a policy.
    allowed = {"formats/policies.py", "picklevm/unpickler.py"}
    builders = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel in allowed or "scan" in rel:
            continue
        names = _find_class_builders(ast.parse(path.read_text(encoding="utf-8")))
        if names:
            builders[rel] = names
    assert builders == {}
