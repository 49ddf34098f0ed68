"""The find_class policies of formats/policies.py: one home, each policy's resolution rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ptfile
from ptfile import formats
from ptfile._io.local import BytesSource
from ptfile.allowlist.policy import find_strict_class
from ptfile.allowlist.rebuild import StorageType
from ptfile.allowlist.structural import StandInType
from ptfile.formats import ReadOptions, policies
from ptfile.formats.options import Policy
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


def test_policies_make_by_name() -> None:
    """A read names its policy; make() gives each name its find_class (and the strict
    policy's fast form for the ZIP bulk path), fresh for each read."""
    assert policies.make(Policy.STRICT) is find_strict_class
    key = ("torch._utils", "_rebuild_tensor_v2")
    bulk = policies.make(Policy.STRICT, bulk=True)
    assert bulk(*key) is not find_strict_class(*key)
    assert bulk(*key) is not policies.make(Policy.STRICT, bulk=True)(*key)
    for bulk_form in (False, True):
        find = policies.make(Policy.STRUCTURAL, bulk=bulk_form)
        assert isinstance(find("os", "system"), StandInType)
        assert find is not policies.make(Policy.STRUCTURAL, bulk=bulk_form)


@pytest.mark.parametrize("new_zip", [True, False])
def test_policies_read_options_choose_the_policy(tmp_path: Path, new_zip: bool) -> None:
    """ReadOptions.policy alone decides: the strict read refuses a global outside the
    allowlist, the structural read of the same file keeps it as a stand-in (ZIP and legacy
    readers alike)."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "a.pt"
    torch.save({"w": torch.ones(2), "f": Path}, path,
               _use_new_zipfile_serialization=new_zip)
    source = BytesSource(path.read_bytes())
    with pytest.raises(ptfile.UnsafeGlobalError):
        formats.read(source, ReadOptions())
    obj = formats.read(source, ReadOptions(policy=Policy.STRUCTURAL))
    assert isinstance(obj["f"], StandInType) and obj["w"].numpy().tolist() == [1.0, 1.0]


def test_policies_are_never_told_apart_by_identity() -> None:
    """No module compares a find_class with ``is``: the policy is chosen by its name."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(
                    isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                names = [n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")
                         for n in (node.left, *node.comparators)]
                if any("find_class" in name or name == "find_strict_class" for name in names):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []
