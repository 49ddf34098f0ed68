"""DeepSpeed ZeRO folders read without torch, against real DeepSpeed (tests/support/zero_fixtures.py).

Every case of :data:`zero_fixtures.CASES` (ZeRO 1/2/3; fp32, bf16, fp16; 1 and 2 ranks;
sub-groups, parameter alignment, round robin, frozen parameters excluded at save time) is
trained and saved by DeepSpeed into a temporary folder once per session, with
``get_fp32_state_dict_from_zero_checkpoint``'s output saved beside it: ``ptfile.load``,
``ptfile.open``, ``convert`` (``.pt``, ``.safetensors``, a folder), ``inspect``, ``verify`` and
``scan`` are checked against it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ptfile
import zero_fixtures
from ptfile.cli import main
from ptfile.errors import FormatError, UnsafeGlobalError, UnsupportedFeatureError
from ptfile.export.convert import convert
from ptfile.zero import open_zero

pytestmark = pytest.mark.slow  # DeepSpeed trains and saves every case first (gloo ranks)

torch = pytest.importorskip("torch")
if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("DeepSpeed is not installed (pyproject's test extra pins it)",
                allow_module_level=True)

CASES = [c.name for c in zero_fixtures.CASES if not zero_fixtures.is_bf16_optimizer(c)]
BF16_OPTIMIZER = next(c.name for c in zero_fixtures.CASES if zero_fixtures.is_bf16_optimizer(c))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case, made by DeepSpeed (one launch per world size)."""
    return zero_fixtures.generate(tmp_path_factory.mktemp("zero"))


def as_torch(t: Any) -> Any:
    """A ptfile tensor as torch (bfloat16 through its bits)."""
    values = np.array(t.numpy())
    if t.dtype.name == "bfloat16":
        return torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(values)


def assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """Same names in the same order, dtypes, shapes and bits."""
    assert list(got) == list(expected)
    for name, want in expected.items():
        assert got[name].requires_grad == want.requires_grad, name
        have = as_torch(got[name]) if not isinstance(got[name], torch.Tensor) else got[name]
        assert have.dtype == want.dtype, name
        assert have.shape == want.shape, name
        assert torch.equal(have.view(-1).view(torch.uint8) if have.numel() else have,
                           want.contiguous().view(-1).view(torch.uint8) if want.numel()
                           else want), name


def expected(made: Path, case: str, suffix: str = ".expected.pt") -> dict[str, Any]:
    return torch.load(made / (case + suffix), weights_only=True)


def ties(state: dict[str, Any]) -> set[tuple[str, str]]:
    """Pairs of names holding the same tensor (ptfile: one object; torch: the same view)."""
    out = set()
    names = list(state)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            x, y = state[a], state[b]
            same = x is y if not isinstance(x, torch.Tensor) else \
                x.data_ptr() == y.data_ptr() and x.shape == y.shape
            if same:
                out.add((a, b))
    return out


# --------------------------------------------------------------------------- load


@pytest.mark.parametrize("case", CASES)
def test_load_equals_deepspeed(made: Path, case: str) -> None:
    want = expected(made, case)
    got = ptfile.load(made / case)
    assert_same(got, want)
    assert ties(got) == ties(want) and ties(want)  # the tied head shares the embedding
    assert_same(ptfile.load_zero(made / case, exclude_frozen=True),
                expected(made, case, ".excl.pt"))


def test_the_tag_folder_and_tags(made: Path, tmp_path: Path) -> None:
    case = "z2_bf16_ws2"
    assert_same(ptfile.load(made / case / "global_step2"), expected(made, case))
    # another tag beside it, chosen by tag=; without 'latest' the tag must be given
    run = tmp_path / "run"
    shutil.copytree(made / case, run)
    shutil.copytree(made / "z2_fp32_ws2" / "global_step2", run / "global_step9")
    assert_same(ptfile.load_zero(run, tag="global_step9"), expected(made, "z2_fp32_ws2"))
    (run / "latest").unlink()
    with pytest.raises(FormatError, match="tag"):
        ptfile.load(run)
    assert_same(ptfile.load_zero(run, tag="global_step2"), expected(made, case))


def test_bf16_optimizer_folder(made: Path) -> None:
    """zero_to_fp32 refuses BF16_Optimizer folders; ptfile reads their fp32 masters, which
    round to the live model's bf16 parameters."""
    live = torch.load(made / (BF16_OPTIMIZER + ".live.pt"), weights_only=True)
    with ptfile.open(made / BF16_OPTIMIZER) as ck:
        assert ck.layout.optimizer == "bf16_optimizer"
        for name, param in live.items():
            if param.requires_grad is False or name not in ck:
                continue
            assert torch.equal(as_torch(ck[name]).to(torch.bfloat16), param), name
    assert "frozen.weight" not in ck  # ZeRO-1 saves no frozen parameters, as DeepSpeed's tool


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_dtype_option(made: Path, dtype: str) -> None:
    want = {k: v.to(getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype]))
            if v.is_floating_point() else v for k, v in expected(made, "z3_bf16_ws2").items()}
    assert_same(ptfile.load_zero(made / "z3_bf16_ws2", dtype=dtype), want)


# --------------------------------------------------------------------------- convert


@pytest.mark.parametrize("case", CASES)
def test_convert_pt_is_zero_to_fp32s_file(made: Path, case: str, tmp_path: Path) -> None:
    """The .pt is zero_to_fp32.py's pytorch_model.bin, byte for byte (its storage layout:
    ZeRO-1/2 groups, ZeRO-3 padding), and loads as it does: floating tensors as fp32."""
    out = tmp_path / "pytorch_model.bin"
    assert main(["convert", str(made / case), str(out), "--no-progress"]) == 0
    assert out.read_bytes() == (made / (case + ".cli") / "pytorch_model.bin").read_bytes()
    got = torch.load(out, weights_only=True)
    want = {k: v.float() if v.is_floating_point() else v
            for k, v in expected(made, case).items()}
    assert_same(got, want)
    assert ("embed.weight", "head.weight") in ties(got)


def test_convert_options(made: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.pt"
    args = ["convert", str(made / "z2_fp16_ws2"), str(out), "--no-progress",
            "--exclude-frozen", "--dtype", "bf16", "--tag", "global_step2"]
    assert main(args) == 0
    want = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
            for k, v in expected(made, "z2_fp16_ws2", ".excl.pt").items()}
    assert_same(torch.load(out, weights_only=True), want)
    with pytest.raises(UnsupportedFeatureError, match="ZeRO"):
        convert(str(out), str(tmp_path / "y.pt"), to="pt",
                                      zero={"tag": "global_step2"})


def test_convert_safetensors_with_tied_weights(made: Path, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    case = "z3_fp16_ws2"
    want = {k: v.float() if v.is_floating_point() else v for k, v in expected(made, case).items()}
    out = tmp_path / "m.safetensors"
    assert main(["convert", str(made / case), str(out), "--no-progress"]) == 0
    got = load_file(out)
    assert sorted(got) == sorted(k for k in want if k != "head.weight")
    assert all(torch.equal(got[k], want[k]) for k in got)
    with safe_open(out, "pt") as f:
        assert json.loads(f.metadata()["ptfile.aliases"]) == {"head.weight": "embed.weight"}
    copied = tmp_path / "c.safetensors"
    convert(str(made / case), str(copied), to="safetensors", shared="copy")
    got = load_file(copied)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in got)
    with pytest.raises(ptfile.SaveError, match="tied"):
        convert(str(made / case), str(tmp_path / "e.safetensors"),
                                      to="safetensors", shared="error")


def test_convert_hf_folder_in_shards(made: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from ptfile.zero.convert import convert_zero

    case = "z2_fp32_ws2"
    want = expected(made, case)
    summary = convert_zero(made / case, tmp_path / "hf", to="hf", shard_bytes=1500)
    assert summary["shards"] > 1
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    got: dict[str, Any] = {}
    for shard in sorted(set(index["weight_map"].values())):
        got.update(load_file(tmp_path / "hf" / shard))
    assert set(got) == set(want) - {"head.weight"}
    assert all(torch.equal(got[k], want[k]) for k in got)


# --------------------------------------------------------------------------- open, inspect


def test_open_reads_only_the_pieces_a_slice_meets(made: Path) -> None:
    case = "z3_fp32_ws2"
    want = expected(made, case)
    with ptfile.open(made / case) as ck:
        assert list(ck) == list(want) and ck.assembler.bytes_read == 0
        assert ck.info("lin1.weight").shape == (19, 12)
        rows = ck.get_slice("lin1.weight")[2:5, 3:]
        assert np.array_equal(rows, want["lin1.weight"][2:5, 3:].detach().numpy())
        assert ck.assembler.bytes_read == 3 * 12 * 4  # three rows, from the ranks holding them
        # lin1.weight's 228 elements: rank 0 holds the first 114, rank 1 the rest
        assert [p.file for p in ck.pieces("lin1.weight")] == [
            "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
        assert np.array_equal(ck.get_slice("lin1.weight")[-1], want["lin1.weight"][-1].detach().numpy())
        assert np.array_equal(ck.get_tensor("scale"), want["scale"].detach().numpy())


def test_inspect_verify_scan(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = "z3_fp32_ws2_sub_group_size"
    ins = ptfile.inspect(made / case)
    assert ins.format == "zero" and ins.metadata["stage"] == "3"
    zero = ins.zero
    assert zero["world_size"] == 2 and zero["tied"] == {"head.weight": "embed.weight"}
    assert zero["frozen"] == ["frozen.weight"] and zero["buffers"] == ["ema", "counter", "mask"]
    # sub_group_size 100: one flat group per large matrix, then the small ones together
    assert [g["params"] for g in zero["groups"]][:3] == [["embed.weight"], ["lin1.weight"],
                                                          ["lin2.weight"]]
    report = ptfile.verify(made / case)
    assert report.ok and report.records_checked > 0 and report.tensors_checked == 13
    result = ptfile.scan(made / case)
    assert result.is_clean and any("ZeroStageEnum" in f.name for f in result.findings)
    for command in ("inspect", "verify", "scan"):
        assert main([command, str(made / case)]) == 0, command
    assert "ZeRO-3 flat groups" in capsys.readouterr().out


# --------------------------------------------------------------------------- damage, limits


def copy_case(made: Path, tmp_path: Path, case: str = "z2_fp32_ws2") -> Path:
    run = tmp_path / case
    shutil.copytree(made / case, run)
    return run


def test_missing_rank_file(made: Path, tmp_path: Path) -> None:
    run = copy_case(made, tmp_path)
    (run / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(FormatError, match="partition_count is 2 but there are 1"):
        ptfile.load(run)
    assert not ptfile.verify(run).ok


def test_truncated_rank_file(made: Path, tmp_path: Path) -> None:
    run = copy_case(made, tmp_path)
    path = run / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(path.read_bytes())
    key = data.find(b"data/0") + 200  # flip a byte of a storage record: the CRC tells
    data[key] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not ptfile.verify(run).ok
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(FormatError):
        ptfile.load(run)


@pytest.mark.parametrize(("name", "what"), [
    ("zero_pp_rank_0_mp_rank_01_optim_states.pt", "tensor-parallel"),
    ("layer_01-model_states.pt", "pipeline"),
])
def test_unsupported_layouts_say_so(made: Path, tmp_path: Path, name: str, what: str) -> None:
    run = copy_case(made, tmp_path)
    shutil.copy(run / "global_step2" / "mp_rank_00_model_states.pt", run / "global_step2" / name)
    with pytest.raises(UnsupportedFeatureError, match=what):
        ptfile.load(run)


def test_client_state_global_is_refused_not_run(made: Path, tmp_path: Path) -> None:
    """A model file's client_state can hold anything: an unknown global is refused by
    load (structural reads it as a stand-in) and reported by scan."""
    run = copy_case(made, tmp_path)
    path = run / "global_step2" / "mp_rank_00_model_states.pt"
    state = torch.load(path, weights_only=False)
    state["args"] = Path("x")  # a global outside torch's allowlist, as Megatron's args are
    torch.save(state, path)
    with pytest.raises(UnsafeGlobalError):
        ptfile.load(run)
    assert_same(ptfile.load_zero(run, structural=True), expected(made, "z2_fp32_ws2"))
    result = ptfile.scan(run)
    pickled = f"{type(Path()).__module__}.{type(Path()).__qualname__}"  # pathlib._local on 3.13
    assert not result.is_clean and pickled in set(result.unsafe_globals) | {
        f"{f.module}.{f.name}" for f in result.findings if f.verdict.name != "ALLOWED"}


def test_folder_kind(made: Path) -> None:
    from ptfile.formats.inputs import InputKind, resolve_input

    assert resolve_input(str(made / "z1_fp32_ws1")).kind is InputKind.ZERO
    assert resolve_input(str(made / "z1_fp32_ws1" / "global_step2")).kind is InputKind.ZERO
    assert ptfile.detect_format(str(made / "z3_fp32_ws2")) is ptfile.Format.ZERO
    assert os.path.exists(made / "z1_fp32_ws1" / "latest")


def test_zero1_frozen_from_module(made: Path) -> None:
    """ZeRO-1 records no frozen parameters (DeepSpeed's tool drops them); asked, ptfile takes
    them from the model file in bit16: the same dict the ZeRO-2 run of the same model gives."""
    got = ptfile.load_zero(made / "z1_bf16_ws2", frozen_from_module=True)
    want = expected(made, "z2_bf16_ws2")
    assert list(got) == list(want)
    assert_same({"frozen.weight": got["frozen.weight"]}, {"frozen.weight": want["frozen.weight"]})
    with open_zero(made / "z1_bf16_ws2", frozen_from_module=True) as ck:
        assert ck.summary()["frozen_bit16"] == ["frozen.weight"]


def test_a_url(made: Path) -> None:
    """A ZeRO folder behind a URL: listed, and read by ranges."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    case = "z3_bf16_ws2"
    for path in (made / case).rglob("*"):
        if path.is_file():
            fs.pipe(f"/zero-url/{path.relative_to(made / case)}", path.read_bytes())
    try:
        assert_same(ptfile.load("memory://zero-url"), expected(made, case))
        assert ptfile.scan("memory://zero-url").is_clean
        with ptfile.open("memory://zero-url") as ck:
            rows = ck.get_slice("embed.weight")[:2]
            assert ck.assembler.bytes_read == rows.nbytes
    finally:
        fs.rm("/zero-url", recursive=True)
