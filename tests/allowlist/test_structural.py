"""Structural loading: any pickle, nothing imported or called; whole models give their state dict."""

from __future__ import annotations

import io
import pickle
import sys
from collections import OrderedDict

import numpy as np
import pytest
import torch

import ptfile
from hostile import checkpoint, g, proto2, s
from ptfile.allowlist.structural import NO_STATE, StandIn


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),
                                            torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.head = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor(2.0))
        self.register_buffer("cache", torch.zeros(2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3))) * self.scale


def _models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "cnn": SmallCNN(),
        "transformer": torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1,
                                            num_decoder_layers=1, dim_feedforward=32,
                                            batch_first=True),
    }


@pytest.mark.parametrize("name", ["cnn", "transformer"])
@pytest.mark.parametrize("zipped", [True, False])
def test_structural_whole_model_state_dict_equals_torch(name: str, zipped: bool) -> None:
    model = _models()[name]
    buf = io.BytesIO()
    torch.save(model, buf, _use_new_zipfile_serialization=zipped)
    with pytest.raises(ptfile.UnsafeGlobalError, match="structural=True"):
        ptfile.load(io.BytesIO(buf.getvalue()))
    obj = ptfile.load(io.BytesIO(buf.getvalue()), structural=True)
    assert isinstance(obj, StandIn)
    assert obj.name == type(model).__name__
    got, expected = ptfile.state_dict(obj), model.state_dict()
    assert list(got) == list(expected)
    for key, tensor in expected.items():
        assert tuple(got[key].shape) == tuple(tensor.shape), key
        assert np.array_equal(got[key].numpy(), tensor.numpy()), key
        assert not got[key].requires_grad


def test_structural_records_without_running(tmp_path: object) -> None:
    data = proto2(g("evil_module_x", "Thing") + b"(" + s("a") + b"K\x01tR"  # REDUCE
                  + b"}" + s("k") + b"K\x02sb")                               # BUILD
    obj = ptfile.load(io.BytesIO(checkpoint(data)), structural=True)
    assert (obj.module, obj.name, obj.how, obj.args, obj.state) == (
        "evil_module_x", "Thing", "call", ("a", 1), {"k": 2})
    assert "evil_module_x" not in sys.modules


def test_structural_newobj_ex_items_and_calls() -> None:
    data = (b"\x80\x04" + g("m", "C") + b")}" + s("kw") + b"K\x01s\x92"   # NEWOBJ_EX
            + b"(K\x01K\x02e"                                              # APPENDS
            + b"(" + s("k") + b"K\x03u"                                    # SETITEMS
            + b")R.")                                                      # call the instance
    obj = ptfile.load(io.BytesIO(checkpoint(data)), structural=True)
    assert obj.how == "call-instance"
    assert obj.func is not None
    made = obj.func
    assert (made.how, made.kwargs, made.listitems, made.dictitems) == (
        "new", {"kw": 1}, [1, 2], [("k", 3)])
    assert obj.state is NO_STATE


def test_structural_os_system_is_inert(tmp_path: object) -> None:
    marker = f"{tmp_path}/marker"
    data = pickle.dumps(_Touch(marker), protocol=2)
    obj = ptfile.load(io.BytesIO(checkpoint(data)), structural=True)
    assert obj.module in ("posix", "os")
    assert obj.name == "system"
    assert obj.args == (f"touch {marker}",)
    import os

    assert not os.path.exists(marker)


class _Touch:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        import os

        return (os.system, (f"touch {self.path}",))


def test_structural_stand_in_classes_are_per_load() -> None:
    data = proto2(g("m", "C") + b")\x81")
    one = ptfile.load(io.BytesIO(checkpoint(data)), structural=True)
    two = ptfile.load(io.BytesIO(checkpoint(data)), structural=True)
    assert type(one) is not type(two)
    assert repr(type(one)) == "<stand-in class m.C>"


def test_structural_build_on_stand_in_class_is_refused() -> None:
    data = proto2(g("m", "C") + b"}" + s("x") + b"K\x01sb")
    with pytest.raises(ptfile.PickleStreamError):
        ptfile.load(io.BytesIO(checkpoint(data)), structural=True)


def test_structural_plain_state_dict_is_unchanged() -> None:
    sd = OrderedDict(w=torch.ones(2))
    buf = io.BytesIO()
    torch.save(sd, buf)
    strict = ptfile.load(io.BytesIO(buf.getvalue()))
    loose = ptfile.load(io.BytesIO(buf.getvalue()), structural=True)
    assert list(strict) == list(loose)
    assert np.array_equal(strict["w"].numpy(), loose["w"].numpy())


def test_state_dict_refuses_non_modules() -> None:
    with pytest.raises(TypeError, match="structurally loaded"):
        ptfile.state_dict({"a": 1})


class _Rich(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.lstm = torch.nn.LSTM(3, 4)
        self.cfg = {"lr": 0.1, "arr": np.arange(3), "dt": torch.float16,
                    "dev": torch.device("cpu"), "norm": __import__("functools").partial(
                        torch.nn.LayerNorm, eps=1e-6)}
        self.act = torch.nn.functional.gelu
        self.register_buffer("counter", torch.tensor(3))


def test_structural_real_objects_load_and_scan_without_false_alarms() -> None:
    model = _Rich()
    objects = {"model": model, "optimizer": torch.optim.Adam(model.parameters())}
    buf = io.BytesIO()
    torch.save(objects, buf)
    loaded = ptfile.load(io.BytesIO(buf.getvalue()), structural=True)
    assert list(ptfile.state_dict(loaded["model"])) == list(model.state_dict())
    result = ptfile.scan(buf.getvalue())
    assert not result.is_dangerous, [f for f in result.findings if f.verdict.value == "dangerous"]


def test_structural_keeps_calls_ptfile_cannot_rebuild() -> None:
    nested = torch.nested.nested_tensor([torch.ones(2), torch.zeros(3)])
    buf = io.BytesIO()
    torch.save({"nt": nested, "w": torch.ones(2)}, buf)
    with pytest.raises(ptfile.UnsupportedFeatureError):
        ptfile.load(io.BytesIO(buf.getvalue()))
    loaded = ptfile.load(io.BytesIO(buf.getvalue()), structural=True)
    assert isinstance(loaded["nt"], StandIn)
    assert loaded["nt"].name == "_rebuild_nested_tensor"
    assert isinstance(loaded["nt"].args[0], ptfile.Tensor)
    assert isinstance(loaded["w"], ptfile.Tensor)
