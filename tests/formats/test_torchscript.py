"""TorchScript archives (torch.jit.save), read as data, against torch 2.13."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same, assert_sharing
from ptfile.formats.torchscript import ScriptObject, parse_classes

torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.bn = torch.nn.BatchNorm1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))


class Model(torch.nn.Module):
    __constants__ = ["scale"]  # noqa: RUF012 - torch's spelling

    def __init__(self) -> None:
        super().__init__()
        self.scale = 3
        self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        self.register_buffer("b", torch.tensor([3], dtype=torch.int64))
        self.register_buffer("nonpersistent", torch.ones(2), persistent=False)
        self.register_parameter("missing", None)
        self.block = Block()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2, 2))
        self.plain = torch.tensor([5.0, 6.0])  # an attribute, not in the state dict
        self.table = {"a": 1}
        self.ints = [1, 2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(self.block(x)) * self.scale + self.plain.sum() + self.table["a"]


def jit_bytes(module: torch.nn.Module, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(module, buf, **kwargs)
    return buf.getvalue()


@pytest.fixture(scope="module")
def model_file() -> bytes:
    model = Model()
    model.block.bn.running_mean.add_(0.5)
    model.block.bn.num_batches_tracked.add_(7)
    return jit_bytes(torch.jit.script(model), _extra_files={"meta.json": b'{"v": 1}'})


def test_torchscript_load_is_the_state_dict_of_jit_load(model_file: bytes) -> None:
    ours = ptfile.load(io.BytesIO(model_file))
    theirs = torch.jit.load(io.BytesIO(model_file)).state_dict()
    assert_same(ours, theirs)
    assert ours._metadata == theirs._metadata
    assert "block.bn.num_batches_tracked" in ours
    assert "plain" not in ours
    assert ours["block.bn.num_batches_tracked"].numpy() == 7
    assert ptfile.detect_format(io.BytesIO(model_file)) is ptfile.Format.TORCHSCRIPT


def test_torchscript_state_dict_matches_the_eager_model_keys() -> None:
    model = Block()
    ours = ptfile.load(io.BytesIO(jit_bytes(torch.jit.script(model))))
    theirs = model.state_dict()
    assert list(ours) == list(theirs)
    for name, value in theirs.items():
        assert np.array_equal(ours[name].numpy(), value.numpy())


def test_torchscript_archive_tree_code_and_extra_files(model_file: bytes) -> None:
    archive = ptfile.load_torchscript(io.BytesIO(model_file))
    root = archive.module
    assert isinstance(root, ScriptObject)
    assert root.qualified_name.endswith(".Model")
    assert root.training is True
    assert root.table == {"a": 1}
    assert root.ints == [1, 2]
    lin = root.block.lin
    # a mangled name (linear.___torch_mangle_N.Linear) when the process scripted a Linear before
    assert lin.qualified_name.startswith("__torch__.torch.nn.modules.linear.")
    assert lin.qualified_name.endswith(".Linear")
    assert lin.weight.requires_grad
    assert lin.weight.shape == (2, 3)
    assert np.array_equal(root.plain.numpy(), [5.0, 6.0])
    assert archive.extra == {"meta.json": b'{"v": 1}'}
    assert any("class Model(Module)" in text for text in archive.code.values())
    assert archive.classes[root.qualified_name].parameters == ("w", "missing")
    assert archive.version >= 1
    assert archive.byteorder == "little"
    assert archive.constants == ()
    with pytest.raises(AttributeError):
        _ = root.no_such_attribute


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_constants_of_a_traced_module() -> None:
    class Traced(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tensor([7.0, 8.0])

    with pytest.warns(torch.jit.TracerWarning):
        traced = torch.jit.trace(Traced(), torch.zeros(2))
    archive = ptfile.load_torchscript(io.BytesIO(jit_bytes(traced)))
    assert len(archive.constants) == 1
    assert archive.constants[0].numpy().tolist() == [7.0, 8.0]


DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.uint16,
          torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2]


def test_torchscript_every_dtype_and_shared_storages() -> None:
    module = torch.nn.Module()
    for i, dtype in enumerate(DTYPES):
        module.register_buffer(f"b{i}", (torch.arange(6.0) - 2).to(dtype))
    base = torch.arange(12.0)
    module.register_buffer("base", base)
    module.register_buffer("view", base[2:8].view(2, 3))
    module.register_buffer("t", base.view(3, 4).t())
    data = jit_bytes(torch.jit.script(module))
    ours = ptfile.load(io.BytesIO(data))
    theirs = torch.jit.load(io.BytesIO(data)).state_dict()
    assert_same(ours, theirs)
    assert_sharing(ours, theirs)


def test_torchscript_globals_outside_its_own_names_are_refused(model_file: bytes) -> None:
    src = zipfile.ZipFile(io.BytesIO(model_file))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl"):
                data = data.replace(b"ccollections\nOrderedDict\n", b"cos\nsystem\n")
            dst.writestr(info.filename, data)
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load(io.BytesIO(out.getvalue()))


def test_torchscript_load_torchscript_refuses_other_formats() -> None:
    buf = io.BytesIO()
    ptfile.save({"x": np.zeros(2)}, buf)
    with pytest.raises(ptfile.FormatError, match="not a TorchScript archive"):
        ptfile.load_torchscript(io.BytesIO(buf.getvalue()))


def test_torchscript_code_is_matched_not_evaluated() -> None:
    code = {"__torch__/a.py": 'class C(Module):\n  __parameters__ = ["w", ]\n'
                              '  __buffers__ = ["b", "c", ]\n  w : Tensor\n'
                              "class D(object):\n  x : int\n"
                              '__parameters__ = ["__import__(\'os\')"]\n'}
    classes = parse_classes(code)
    assert classes["__torch__.a.C"].parameters == ("w",)
    assert classes["__torch__.a.C"].buffers == ("b", "c")
    assert not classes["__torch__.a.D"].is_module
    assert classes["__torch__.a.D"].parameters == ()


def test_torchscript_cyclic_or_deep_module_trees_are_refused() -> None:
    from ptfile.formats.torchscript import ScriptClass, TorchScriptArchive

    def module(**attrs: Any) -> ScriptObject:
        obj = ScriptObject.__new__(ScriptObject)
        obj.__setstate__({"training": True, **attrs})
        return obj

    root = module()
    root.attributes["self"] = root
    archive = TorchScriptArchive(module=root, constants=(), code={}, extra={},
                                 classes={"__torch__": ScriptClass(is_module=True)})
    with pytest.raises(ptfile.FormatError, match="cyclic"):
        archive.state_dict()
    deep = module()
    for _ in range(500):
        deep = module(child=deep)
    with pytest.raises(ptfile.LimitExceededError, match="max_module_depth") as info:
        TorchScriptArchive(module=deep, constants=(), code={}, extra={},
                           classes={}).state_dict()
    assert (info.value.maximum, info.value.actual) == (200, 201)
