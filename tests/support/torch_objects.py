"""What people torch.save, one builder per case: state dicts of common modules, an optimizer,
a training checkpoint, views, every dtype, Parameters, tied weights, Python values, quantized,
sparse and meta tensors.

Shared by ``test_interop.py`` (ptfile against torch on each) and ``test_scan.py`` (no false
positives on them).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch


def _module_sd(make: Callable[[], torch.nn.Module]) -> Callable[[], Any]:
    def build() -> Any:
        torch.manual_seed(1)
        return make().state_dict()
    return build


def _adam() -> Any:
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return opt.state_dict()


def _checkpoint() -> Any:
    torch.manual_seed(3)
    model = torch.nn.Linear(3, 2)
    return {"epoch": 7, "model": model.state_dict(), "optimizer": _adam(), "loss": 0.125,
            "history": [1.5, 0.75, float("inf")], "name": "résumé ✓", "best": None,
            "flags": (True, False), "big": 2**70, "neg": -(2**40), "rng": torch.get_rng_state()}


def _views() -> Any:
    x = torch.arange(24.0)
    m = x.view(4, 6)
    return {"base": x, "slice": x[3:9], "t": m.t(), "step": m[:, ::2], "row": m[2],
            "expand": torch.tensor([7.0, 8.0]).expand(3, 2), "scalar": torch.tensor(5),
            "empty": torch.empty(0, 3), "empty_view": x[5:5],
            "cl": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
            "rank8": torch.randn(*([2] * 8)), "zero_stride": torch.zeros(1).expand(4, 4)}


def _dtypes() -> Any:
    base = torch.tensor([0.5, -1.5, 2.0, 0.0])
    out = {str(d): base.to(d) for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
        torch.complex128, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
        torch.float8_e5m2fnuz)}
    ints = torch.tensor([0, 1, 7, 100])
    out.update({str(d): ints.to(d) for d in (
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16,
        torch.uint32, torch.uint64, torch.bool)})
    out["e8m0"] = torch.tensor([1.0, 2.0, 0.5]).to(torch.float8_e8m0fnu)
    out["complex32"] = torch.tensor([1 + 2j, -0.5j]).to(torch.complex32)
    out["bits8"] = torch.tensor([1, 2], dtype=torch.uint8).view(torch.bits8)
    out["bits16"] = torch.tensor([1, 2], dtype=torch.int16).view(torch.bits16)
    out["fp4"] = torch.tensor([1, 2, 3], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    return out


def _bits() -> Any:
    c = torch.tensor([1 + 2j, 3 - 4j])
    return {"conj": c.conj(), "plain": c}


def _params() -> Any:
    p = torch.nn.Parameter(torch.randn(3))
    q = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    r = torch.randn(2).requires_grad_()
    return [p, q, r, p]


def _tied() -> Any:
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    return torch.nn.ModuleDict({"emb": emb, "head": head}).state_dict(keep_vars=True)


def _python_values() -> Any:
    return {"size": torch.Size([2, 3]), "device": torch.device("cpu"),
            "cuda": torch.device("cuda", 1), "dtype": torch.bfloat16, "bytes": b"ab\x00\xff",
            "set": {1, 2}, "complex": 1 + 2j, "counter": collections.Counter({"a": 2}),
            "od": collections.OrderedDict(a=1), "nan": float("nan"), "ü∂": "κλειδί",
            "nested": [[[]], {}, ()], "t": torch.tensor(1.0)}


CASES: dict[str, Callable[[], Any]] = {
    "tensor": lambda: torch.tensor([1.0, 2.0]),
    "views": _views,
    "dtypes": _dtypes,
    "conj": _bits,
    "neg": lambda: torch.tensor([1 + 2j, 3 - 4j]).conj().imag,
    "params": _params,
    "tied": _tied,
    "python_values": _python_values,
    "linear": _module_sd(lambda: torch.nn.Linear(5, 3)),
    "conv2d": _module_sd(lambda: torch.nn.Conv2d(3, 8, 3)),
    "batchnorm": _module_sd(lambda: torch.nn.BatchNorm2d(4)),
    "lstm": _module_sd(lambda: torch.nn.LSTM(4, 6, num_layers=2)),
    "embedding": _module_sd(lambda: torch.nn.Embedding(50, 8)),
    "transformer": _module_sd(lambda: torch.nn.Transformer(
        d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32)),
    "adam": _adam,
    "checkpoint": _checkpoint,
    "unicode_keys": lambda: {"вес": torch.ones(2), "重み": torch.zeros(1), "🙂": [torch.ones(1)]},
    "many": lambda: {f"layer.{i}.w": torch.full((2,), float(i)) for i in range(5000)},
    "dict_1000": lambda: {str(i): i for i in range(1000)},
    "quantized": lambda: {
        "pt": torch.quantize_per_tensor(torch.randn(4), 0.1, 3, torch.quint8),
        "pc": torch.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2]),
                                         torch.tensor([1, 2]), 0, torch.qint8)},
    "sparse": lambda: {
        "coo": torch.sparse_coo_tensor([[0, 1], [2, 0]], [3.0, 4.0], (2, 3)),
        "csr": torch.tensor([[0.0, 1.0], [2.0, 0.0]]).to_sparse_csr()},
    "meta": lambda: torch.empty(3, 4, device="meta"),
}
