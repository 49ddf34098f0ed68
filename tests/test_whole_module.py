"""A whole pickled module (``torch.save(model)``) through open, inspect, verify and convert.

Its pickle names the model's classes, which torch's weights-only load refuses: ptfile's
strict default refuses it too, ``structural=True`` (``--structural``) reads it with inert
stand-ins, naming its tensors as ``model.state_dict()`` does, and ``verify`` reports an
intact file as intact with a warning, not as damage.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ptfile
from ptfile.inspection import verify


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.bn = torch.nn.BatchNorm2d(2)
        self.head = torch.nn.Linear(8, 3)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(5)
    model = Net()
    path = tmp_path_factory.mktemp("whole") / "net.pt"
    torch.save(model, path)
    return path, model.state_dict()


def test_whole_module_open_structural_names_the_state_dict(model_file: tuple[Path, dict[
        str, torch.Tensor]]) -> None:
    path, ref = model_file
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.open(path)
    for mmap in (True, False):
        with ptfile.open(path, structural=True, mmap=mmap) as ck:
            assert list(ck.keys()) == list(ref)
            for name, tensor in ref.items():
                np.testing.assert_array_equal(ck.get_tensor(name), tensor.numpy())
                assert ck.info(name).shape == tuple(tensor.shape)


def test_whole_module_verify_is_intact_with_a_warning(model_file: tuple[Path, dict[
        str, torch.Tensor]]) -> None:
    path, ref = model_file
    report = verify(path)
    assert report.ok and report.tensors_checked == len(ref)
    assert [p.severity for p in report.problems] == ["warning"]
    assert "weights_only" in report.problems[0].message
    with path.open("rb") as fp:  # a file object is re-read from its position
        assert verify(fp).ok


def test_whole_module_cli_inspect_and_convert(model_file: tuple[Path, dict[str, torch.Tensor]],
                                              tmp_path: Path) -> None:
    path, ref = model_file

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ptfile", *args], capture_output=True,
                              text=True, timeout=120, check=False)

    assert cli("inspect", str(path)).returncode == 2  # refused, with the way forward
    done = cli("inspect", str(path), "--structural", "--json")
    assert done.returncode == 0, done.stderr
    assert [t["name"] for t in json.loads(done.stdout)["tensors"]] == list(ref)
    assert cli("verify", str(path)).returncode == 0
    out = tmp_path / "net.safetensors"
    done = cli("convert", str(path), str(out), "--structural")
    assert done.returncode == 0, done.stderr
    from safetensors.numpy import load_file

    loaded = load_file(out)
    assert set(loaded) == set(ref)
    for name, tensor in ref.items():
        np.testing.assert_array_equal(loaded[name], tensor.numpy())
    pt_out = tmp_path / "net_sd.pt"
    assert cli("convert", str(path), str(pt_out), "--structural").returncode == 0
    back = torch.load(pt_out, weights_only=True)
    assert list(back) == list(ref) and all(torch.equal(back[k], ref[k]) for k in ref)


# --------------------------------------------------------------------------- stand-ins holding tensors


class AttributeDict(dict):  # type: ignore[type-arg]
    """Lightning's ``AttributeDict``: a plain ``dict`` subclass (``hyper_parameters``)."""


class Holder(torch.nn.Module):
    """A module with a parameter, a persistent and a non-persistent buffer, and a child."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("running_mean", torch.randn(3))
        self.register_buffer("scratch", torch.randn(2), persistent=False)
        self.bn = torch.nn.BatchNorm1d(3)


class Config:
    """An object keeping a tensor as an attribute (pickled as NEWOBJ + BUILD of __dict__)."""

    def __init__(self) -> None:
        self.mask = torch.tensor([True, False])


class Window:
    """An object rebuilt from a call with a tensor argument (pickled as REDUCE)."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights

    def __reduce__(self) -> tuple[type[Window], tuple[torch.Tensor]]:
        return Window, (self.weights,)


@pytest.fixture(scope="module")
def lightning_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A checkpoint whose tensors are reached only through objects ptfile stands in for,
    and the names ``open(structural=True)`` gives them, by the rule of ``model/tree.py``."""
    torch.manual_seed(11)
    net, config, window = Holder(), Config(), Window(torch.arange(4.0))
    path = tmp_path_factory.mktemp("lightning") / "epoch=0.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "config": config, "window": window,
                "hyper_parameters": AttributeDict(net=net, lr=0.1)}, path)
    expected = {"state_dict.w": torch.ones(2), "config.mask": config.mask,
                "window.0": window.weights,
                **{f"hyper_parameters.net.{k}": v for k, v in net.state_dict().items()}}
    return path, expected


def test_tensors_inside_stand_ins_are_listed_by_open_and_inspect(
        lightning_file: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, expected = lightning_file
    with ptfile.open(path, structural=True) as ck:
        assert set(ck.keys()) == set(expected)
        assert "hyper_parameters.net.scratch" not in ck  # non-persistent: as state_dict()
        for name, tensor in expected.items():
            np.testing.assert_array_equal(ck.get_tensor(name), tensor.numpy())
    done = subprocess.run([sys.executable, "-m", "ptfile", "inspect", str(path), "--structural",
                           "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert {t["name"] for t in json.loads(done.stdout)["tensors"]} == set(expected)


def test_tensors_inside_stand_ins_are_converted_and_the_rest_named_as_dropped(
        lightning_file: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from ptfile.export.convert import convert

    path, expected = lightning_file
    out = tmp_path / "model.safetensors"
    summary = convert(str(path), str(out), to="safetensors", structural=True)
    loaded = load_file(out)
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        np.testing.assert_array_equal(loaded[name], tensor.numpy())
    dropped = {d["name"] for d in summary["dropped"]}
    assert dropped == {"config", "window", "hyper_parameters"}  # the objects, not their tensors
    assert summary["tensors"] == len(expected)


def test_stand_ins_holding_tensors_scan_as_unknown(
        lightning_file: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, _ = lightning_file
    result = ptfile.scan(path)
    unknown = {(f.module, f.name) for f in result.findings if f.verdict.value == "unknown"}
    assert result.verdict.value == "unknown" and not result.is_dangerous
    assert unknown == {(__name__, "AttributeDict"), (__name__, "Holder"), (__name__, "Config"),
                       (__name__, "Window"), ("torch.nn.modules.batchnorm", "BatchNorm1d")}
