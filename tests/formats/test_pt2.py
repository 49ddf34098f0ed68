"""torch.export .pt2 archives: weights and constants read as data, against torch 2.13."""

from __future__ import annotations

import io
import json
import logging
import random
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch._opaque_base import OpaqueBase

import ptfile
from oracle import assert_tensor_equal
from ptfile.export.convert import convert
from ptfile.formats import Format
from ptfile.formats.pt2 import SCALAR_TYPES

torch.manual_seed(0)


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.bn.running_mean.uniform_()
        self.bn.running_var.uniform_(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class Constants(torch.nn.Module):
    """A lifted tensor constant and a non-persistent buffer: both are constants."""

    def __init__(self) -> None:
        super().__init__()
        self.k = torch.arange(6.0).reshape(2, 3) * 7
        self.register_buffer("scratch", torch.full((3,), 2, dtype=torch.int32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.k + self.scratch


class HalfWeights(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bf = torch.nn.Linear(4, 3).to(torch.bfloat16)
        self.f16 = torch.nn.Linear(3, 2).to(torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f16(self.bf(x.to(torch.bfloat16)).to(torch.float16))


class Tied(torch.nn.Module):
    """Tied weights (one parameter, two names) and buffers that are views of one base."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)
        self.b.weight = self.a.weight
        base = torch.arange(20.0)
        self.register_buffer("window", base[2:8].view(2, 3))
        self.register_buffer("every_other", base[::2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + self.window.sum() + self.every_other.sum()


MODELS: dict[str, tuple[Callable[[], torch.nn.Module], tuple[torch.Tensor, ...]]] = {
    "linear": (Linear, (torch.randn(2, 3),)),
    "conv_bn": (ConvBN, (torch.randn(1, 3, 6, 6),)),
    "constants": (Constants, (torch.randn(2, 3),)),
    "half": (HalfWeights, (torch.randn(2, 4),)),
    "tied": (Tied, (torch.randn(2, 3),)),
}


def _export(module: torch.nn.Module, args: tuple[Any, ...]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():  # tied weights make torch warn about their storage
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(module, args), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def archives() -> dict[str, bytes]:
    return {name: _export(make(), args) for name, (make, args) in MODELS.items()}


def _expected(data: bytes) -> dict[str, torch.Tensor]:
    # torch 2.13 logs a warning with a broken format string when the sample inputs need
    # its weights_only=False fallback (protocol 4/5, fake tensors): pytest's handler raises.
    serde_log = logging.getLogger("torch._export.serde.serialize")
    level = serde_log.level
    serde_log.setLevel(logging.ERROR)
    try:
        ep = torch.export.load(io.BytesIO(data))
    finally:
        serde_log.setLevel(level)
    return {**ep.state_dict, **ep.constants}


def _assert_matches_torch(got: Any, data: bytes) -> None:
    expected = _expected(data)
    assert isinstance(got, dict)
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert_tensor_equal(got[name], tensor)


@pytest.mark.parametrize("name", list(MODELS))
def test_load_equals_torch_export_load(archives: dict[str, bytes], name: str) -> None:
    data = archives[name]
    assert ptfile.detect_format(io.BytesIO(data)) is Format.PT2
    _assert_matches_torch(ptfile.load(io.BytesIO(data)), data)


@pytest.mark.parametrize("name", list(MODELS))
def test_load_of_a_mapped_path(archives: dict[str, bytes], name: str, tmp_path: Path) -> None:
    path = tmp_path / "m.pt2"
    path.write_bytes(archives[name])
    _assert_matches_torch(ptfile.load(path, mmap=True), archives[name])


def test_constants_and_non_persistent_buffers_follow_the_state_dict(
        archives: dict[str, bytes]) -> None:
    got = ptfile.load(io.BytesIO(archives["constants"]))
    ep = torch.export.load(io.BytesIO(archives["constants"]))
    assert set(ep.constants) == {"k", "scratch"} and not ep.state_dict
    assert list(got) == list(ep.constants)


def test_tied_weights_and_views_share_one_storage(archives: dict[str, bytes]) -> None:
    got = ptfile.load(io.BytesIO(archives["tied"]))
    assert got["a.weight"].storage is got["b.weight"].storage
    assert got["window"].storage is got["every_other"].storage
    assert got["window"].storage_offset() == 2
    assert got["every_other"].stride() == (2,)


def test_half_weights_keep_their_dtypes(archives: dict[str, bytes]) -> None:
    got = ptfile.load(io.BytesIO(archives["half"]))
    assert {repr(t.dtype) for t in got.values()} == {"torch.bfloat16", "torch.float16"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                   torch.uint8, torch.int16, torch.int32, torch.int64,
                                   torch.bool, torch.complex64, torch.complex128, torch.uint16,
                                   torch.uint32, torch.uint64, torch.float8_e4m3fn,
                                   torch.float8_e5m2, torch.float8_e4m3fnuz,
                                   torch.float8_e5m2fnuz, torch.float8_e8m0fnu])
def test_every_scalar_type(dtype: torch.dtype) -> None:
    module = torch.nn.Module()
    module.register_buffer("x", torch.arange(5).to(dtype))
    module.forward = lambda y: y + 1  # type: ignore[method-assign]
    data = _export(module, (torch.ones(1),))
    _assert_matches_torch(ptfile.load(io.BytesIO(data)), data)
    assert str(dtype).removeprefix("torch.") in SCALAR_TYPES.values()


def test_an_empty_tensor() -> None:
    module = torch.nn.Module()
    module.register_buffer("empty", torch.zeros(0, 3))
    module.forward = lambda y: y + 1  # type: ignore[method-assign]
    data = _export(module, (torch.ones(1),))
    _assert_matches_torch(ptfile.load(io.BytesIO(data)), data)


def test_map_location_applies_to_every_record(archives: dict[str, bytes]) -> None:
    got = ptfile.load(io.BytesIO(archives["tied"]), map_location={"cpu": "cuda:1"})
    assert {t.storage.location for t in got.values()} == {"cuda:1"}
    assert str(got["a.weight"].device) == "cuda:1"
    assert got["a.weight"].storage is got["b.weight"].storage


def test_open_reads_metadata_then_data(archives: dict[str, bytes], tmp_path: Path) -> None:
    path = tmp_path / "m.pt2"
    path.write_bytes(archives["conv_bn"])
    expected = _expected(archives["conv_bn"])
    with ptfile.open(path) as ck:
        assert ck.format is Format.PT2
        assert list(ck.keys()) == list(expected)
        info = ck.info("conv.weight")
        assert info.shape == (4, 3, 3, 3) and info.is_parameter
        assert info.storage_key == "weights/weight_0"  # its record's path under data/
        meta = ck.metadata()
        assert meta["format"] == "pt2" and meta["prefix"] == "archive" and meta["version"] == "6"
        for name, tensor in expected.items():
            assert np.array_equal(ck.get_tensor(name), tensor.detach().numpy())
            assert np.array_equal(ck[name].numpy(), tensor.detach().numpy())
        sliced = ck.get_slice("conv.weight")[1:3, :, 0]
        assert np.array_equal(sliced, expected["conv.weight"].detach().numpy()[1:3, :, 0])


def _data_offsets(data: bytes) -> dict[str, tuple[int, int]]:
    """Each record's data span, from zipfile's reading of the local headers."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            start = info.header_offset + 30 + len(info.filename.encode()) + \
                int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
            out[info.filename] = (start, start + info.file_size)
    return out


class _Recording(io.BytesIO):
    """A file object that records the spans read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.spans: list[tuple[int, int]] = []

    def read(self, n: int | None = -1) -> bytes:
        start = self.tell()
        out = super().read(n)
        self.spans.append((start, start + len(out)))
        return out

    def readinto(self, b: Any) -> int:
        start = self.tell()
        n = super().readinto(b)
        self.spans.append((start, start + n))
        return n


@pytest.mark.parametrize("mmap", [True, False])
def test_open_reads_no_weight_bytes_until_asked(archives: dict[str, bytes], tmp_path: Path,
                                                mmap: bool) -> None:
    data = archives["linear"]
    path = tmp_path / "m.pt2"
    path.write_bytes(data)
    spans = _data_offsets(data)
    with ptfile.open(path, mmap=mmap) as ck:
        storage = ck.object["lin.weight"].storage
        assert storage.data is None and storage.nbytes == 24
        start, _ = spans["archive/data/weights/weight_0"]
        assert ck.info("lin.weight").data_offset == start
        assert np.array_equal(ck.get_tensor("lin.weight"),
                              _expected(data)["lin.weight"].detach().numpy())


def test_open_of_a_file_object_reads_no_weight_bytes(tmp_path: Path) -> None:
    """A weight away from the head (sniffed) and the tail (end records) is not read."""
    model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(3)))
    data = _export(model, (torch.randn(1, 256),))
    spans = _data_offsets(data)
    weights = {name: spans[f"archive/data/weights/weight_{i}"]
               for i, name in enumerate(["0.weight", "0.bias", "1.weight"])}
    low, high = weights["1.weight"]
    assert low > 512 and high < len(data) - (1 << 16)
    recording = _Recording(data)
    expected = _expected(data)
    with ptfile.open(recording) as ck:
        assert ck.info("1.weight").data_offset == low
        assert len(list(ck.infos())) == 6
        assert not [s for s in recording.spans if s[0] < high and low < s[1]]
        assert np.array_equal(ck.get_tensor("1.weight"), expected["1.weight"].detach().numpy())
        assert np.array_equal(ck.get_slice("1.weight")[3], expected["1.weight"].detach()[3])
        assert [s for s in recording.spans if s[0] < high and low < s[1]]


def test_verify_checks_every_record(archives: dict[str, bytes], tmp_path: Path) -> None:
    from ptfile.inspection import verify
    path = tmp_path / "m.pt2"
    path.write_bytes(archives["conv_bn"])
    report = verify(path)
    assert report.ok and not report.problems
    assert report.records_checked == len(_data_offsets(archives["conv_bn"]))
    damaged = bytearray(archives["conv_bn"])
    start, _ = _data_offsets(archives["conv_bn"])["archive/data/weights/weight_0"]
    damaged[start] ^= 0xFF
    path.write_bytes(bytes(damaged))
    assert not verify(path).ok  # the CRC-32 of the weight record


def test_inspect_and_convert(archives: dict[str, bytes], tmp_path: Path) -> None:
    path = tmp_path / "m.pt2"
    path.write_bytes(archives["tied"])
    report = ptfile.inspect(path)
    assert report.format == "pt2"
    assert {t["name"] if isinstance(t, dict) else t.name for t in report.tensors} \
        == set(_expected(archives["tied"]))
    out = tmp_path / "m.safetensors"
    summary = convert(str(path), str(out), to="safetensors")
    loaded = load_file(out)
    expected = _expected(archives["tied"])
    assert set(loaded) | set(summary["aliases"]) == set(expected)
    assert "b.weight" in summary["aliases"] or "a.weight" in summary["aliases"]
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name].detach())


def test_cli_convert(archives: dict[str, bytes], tmp_path: Path) -> None:
    from ptfile.cli import main
    path = tmp_path / "m.pt2"
    path.write_bytes(archives["half"])
    assert main(["convert", str(path), str(tmp_path / "out.safetensors")]) == 0
    loaded = load_file(tmp_path / "out.safetensors")
    for name, tensor in _expected(archives["half"]).items():
        assert torch.equal(loaded[name], tensor.detach())


# --------------------------------------------------------------------------- edited archives

def _rewrite(data: bytes, edit: Callable[[str, bytes], bytes | None],
             compression: int = zipfile.ZIP_STORED) -> bytes:
    """The archive with each record's bytes replaced by ``edit(name, bytes)`` (None drops it)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, \
            zipfile.ZipFile(out, "w", compression=compression) as dst:
        for info in src.infolist():
            new = edit(info.filename, src.read(info))
            if new is not None:
                dst.writestr(info.filename, new)
    return out.getvalue()


def test_a_repacked_deflated_archive_is_inflated(archives: dict[str, bytes],
                                                 tmp_path: Path) -> None:
    data = _rewrite(archives["conv_bn"], lambda n, b: b, zipfile.ZIP_DEFLATED)
    path = tmp_path / "z.pt2"
    path.write_bytes(data)
    _assert_matches_torch(ptfile.load(io.BytesIO(data)), archives["conv_bn"])
    _assert_matches_torch(ptfile.load(path, mmap=True), archives["conv_bn"])


def _edit_config(data: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    def edit(name: str, raw: bytes) -> bytes:
        if name.endswith("_weights_config.json"):
            doc = json.loads(raw)
            change(doc["config"])
            return json.dumps(doc).encode()
        return raw
    return _rewrite(data, edit)


def _with_pickled_weight(data: bytes, payload: bytes) -> bytes:
    def edit(name: str, raw: bytes) -> bytes:
        if name.endswith("data/weights/weight_0"):
            return payload
        if name.endswith("_weights_config.json"):
            doc = json.loads(raw)
            doc["config"]["lin.weight"]["use_pickle"] = True
            return json.dumps(doc).encode()
        return raw
    return _rewrite(data, edit)


def test_a_pickled_tensor_is_read_with_the_strict_policy(archives: dict[str, bytes]) -> None:
    """``use_pickle`` records (tensor subclasses) are nested torch.save archives."""
    replacement = torch.arange(6.0).reshape(2, 3)
    buf = io.BytesIO()
    torch.save(torch.nn.Parameter(replacement), buf)
    data = _with_pickled_weight(archives["linear"], buf.getvalue())
    _assert_matches_torch(ptfile.load(io.BytesIO(data)), data)


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("ran",))


def test_a_pickled_payload_outside_the_allowlist_or_not_a_zip_is_refused(
        archives: dict[str, bytes]) -> None:
    buf = io.BytesIO()
    torch.save(_Evil(), buf)
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load(io.BytesIO(_with_pickled_weight(archives["linear"], buf.getvalue())))
    with pytest.raises(ptfile.FormatError, match=r"must be a torch\.save archive"):
        ptfile.load(io.BytesIO(_with_pickled_weight(archives["linear"], b"\x80\x02K\x01.")))


def test_a_view_past_its_record_is_refused(archives: dict[str, bytes]) -> None:
    def change(config: dict[str, Any]) -> None:
        config["lin.bias"]["tensor_meta"]["storage_offset"] = {"as_int": 5}
    with pytest.raises(ptfile.FormatError, match="needs 7 elements"):
        ptfile.load(io.BytesIO(_edit_config(archives["linear"], change)))


@pytest.mark.parametrize(("change", "error", "match"), [
    (lambda c: c["lin.bias"]["tensor_meta"].update(dtype=99), ptfile.FormatError,
     "ScalarType 99"),
    (lambda c: c["lin.bias"]["tensor_meta"].update(layout=1), ptfile.UnsupportedFeatureError,
     "layout 1"),
    (lambda c: c["lin.bias"]["tensor_meta"]["sizes"].__setitem__(0, {"as_expr": "s0"}),
     ptfile.UnsupportedFeatureError, "symbolic"),
    (lambda c: c["lin.bias"].update(path_name="weight_9"), ptfile.FormatError, "weight_9"),
    (lambda c: c["lin.bias"].update(path_name="custom_obj_0", use_pickle=True),
     ptfile.UnsupportedFeatureError, "TorchBind"),
    (lambda c: c["lin.bias"].pop("tensor_meta"), ptfile.FormatError, "tensor_meta"),
    (lambda c: c["lin.bias"]["tensor_meta"].update(sizes=[{"as_int": -1}]), ptfile.FormatError,
     "negative"),
])
def test_malformed_configs_raise_ptfile_errors(archives: dict[str, bytes],
                                               change: Callable[[dict[str, Any]], Any],
                                               error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ptfile.load(io.BytesIO(_edit_config(archives["linear"], change)))


def test_missing_and_unreadable_records(archives: dict[str, bytes]) -> None:
    no_config = _rewrite(archives["linear"],
                         lambda n, b: None if n.endswith("weights_config.json") else b)
    with pytest.raises(ptfile.FormatError, match=r"weights_config\.json"):
        ptfile.load(io.BytesIO(no_config))
    not_json = _rewrite(archives["linear"],
                        lambda n, b: b"{" if n.endswith("weights_config.json") else b)
    with pytest.raises(ptfile.FormatError, match="not JSON"):
        ptfile.load(io.BytesIO(not_json))
    two_models = _rewrite(archives["linear"], lambda n, b: b)
    with zipfile.ZipFile(buf := io.BytesIO(two_models), "a") as z:
        z.writestr(f"{z.namelist()[0].split('/')[0]}/models/other.json", b"{}")
    with pytest.raises(ptfile.UnsupportedFeatureError, match="2 models"):
        ptfile.load(io.BytesIO(buf.getvalue()))


def test_damaged_archives_raise_only_ptfile_errors(archives: dict[str, bytes],
                                                   tmp_path: Path) -> None:
    rng = random.Random(14)
    data = archives["conv_bn"]
    cases = [data[:n] for n in range(0, len(data), max(1, len(data) // 60))]
    for _ in range(300):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        cases.append(bytes(damaged))
    path = tmp_path / "d.pt2"
    for case in cases:
        path.write_bytes(case)
        for source in (io.BytesIO(case), path):
            try:
                obj = ptfile.load(source)
                for tensor in obj.values():
                    tensor.numpy()
            except ptfile.PtfileError:
                pass
        try:  # the lazy open and the program's signature
            ptfile.inspect(path)
        except ptfile.PtfileError:
            pass


# --------------------------------------------------------------------------- weight layouts

def test_a_real_tensor_subclass_is_pickled_and_refused_like_weights_only() -> None:
    """torch.export.save pickles a tensor subclass (use_pickle); torch.load(weights_only=True)
    refuses its class, and so does ptfile; structurally it opens, and its program inspects."""
    from torch.testing._internal.two_tensor import TwoTensor

    class Sub(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.Parameter(TwoTensor(torch.ones(2), torch.zeros(2)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.p

    data = _export(Sub(), (torch.randn(2),))
    config = json.loads(next(zipfile.ZipFile(io.BytesIO(data)).read(n) for n in
                             zipfile.ZipFile(io.BytesIO(data)).namelist()
                             if n.endswith("weights_config.json")))
    assert config["config"]["p"]["use_pickle"] is True
    with pytest.raises(ptfile.UnsafeGlobalError, match="TwoTensor"):
        ptfile.load(io.BytesIO(data))
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.inspect(io.BytesIO(data))
    report = ptfile.inspect(io.BytesIO(data), structural=True)
    assert report.program is not None and report.program.parameters == ["p"]
    assert [t.name for t in report.tensors] == ["p"]


def test_fake_weights_are_empty_records_read_as_zeros() -> None:
    """Exported under FakeTensorMode, every weight is an empty record (torch: zeros)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FakeTensorMode(allow_non_fake_inputs=True):
            ep = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(2, 3),))
        buf = io.BytesIO()
        torch.export.save(ep, buf)
    data = buf.getvalue()
    sizes = {i.filename.rsplit("/", 1)[-1]: i.file_size
             for i in zipfile.ZipFile(io.BytesIO(data)).infolist()}
    assert sizes["weight_0"] == 0
    _assert_matches_torch(ptfile.load(io.BytesIO(data)), data)
    with ptfile.open(io.BytesIO(data)) as ck:
        assert not ck.get_tensor("weight").any() and ck.info("bias").shape == (2,)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_every_pickle_protocol_and_extra_files(protocol: int) -> None:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(ConvBN(), (torch.randn(1, 3, 6, 6),)), buf,
                          pickle_protocol=protocol, extra_files={"note.txt": "hello"})
    data = buf.getvalue()
    assert any(n.endswith("extra/note.txt") for n in zipfile.ZipFile(buf).namelist())
    _assert_matches_torch(ptfile.load(io.BytesIO(data)), data)
    report = ptfile.inspect(io.BytesIO(data))
    assert report.program is not None and "bn.running_mean" in report.program.buffers


class Scale(OpaqueBase):  # type: ignore[misc]
    """An opaque object (torch names it by its qualified name: module level)."""

    def __init__(self, k: float) -> None:
        self.k = k


@pytest.fixture(scope="module")
def opaque_archive() -> bytes:
    """A program holding an opaque-object constant (a custom op's argument)."""
    from torch._library.opaque_object import register_opaque_type
    register_opaque_type(Scale, typ="reference")

    def run(x: torch.Tensor, s: Scale) -> torch.Tensor:
        return x * s.k

    # The annotations as objects: custom_op reads them, and this module's are strings.
    run.__annotations__ = {"x": torch.Tensor, "s": Scale, "return": torch.Tensor}
    scale = torch.library.custom_op("ptfile_test::scale", run, mutates_args=())
    scale.register_fake(lambda x, s: torch.empty_like(x))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s, self.lin = Scale(3.0), torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.ptfile_test.scale(self.lin(x), self.s)  # type: ignore[no-any-return]

    return _export(Model(), (torch.randn(2, 2),))


def test_an_opaque_object_constant_is_listed_not_loaded(opaque_archive: bytes) -> None:
    ep = torch.export.load(io.BytesIO(opaque_archive))
    assert list(ep.constants) == ["lifted_custom_0"]
    with pytest.raises(ptfile.UnsupportedFeatureError, match="opaque object"):
        ptfile.load(io.BytesIO(opaque_archive))
    with ptfile.open(io.BytesIO(opaque_archive)) as ck:
        assert list(ck) == list(ep.state_dict)
        assert np.array_equal(ck.get_tensor("lin.weight"),
                              ep.state_dict["lin.weight"].detach().numpy())
    program = ptfile.inspect(io.BytesIO(opaque_archive)).program
    assert program is not None and program.custom_objects == ["lifted_custom_0"]
    (obj,) = [v for v in program.inputs if v.kind == "custom_obj"]
    spec = next(s for s in ep.graph_signature.input_specs if s.target == "lifted_custom_0")
    assert (obj.name, obj.class_fqn) == (spec.arg.name, spec.arg.class_fqn)
