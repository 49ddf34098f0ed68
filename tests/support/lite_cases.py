"""Lite interpreter files (``_save_for_lite_interpreter``), benign and hostile, for the scan tests.

Hostile ones carry a payload only the lite interpreter runs: a ``__setstate__`` whose
bytecode calls ``aten::save`` on a path from the module's state (its sentinel), with the
archive's ``code/`` rewritten harmless (``torch.jit.load`` compiles that, the lite
interpreter runs ``bytecode.pkl``), and variants of the archive's layout.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from typing import Final

import torch


def lite_bytes(module: torch.nn.Module) -> bytes:
    """``module`` scripted and saved for the lite interpreter."""
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the lite interpreter (and quantization) deprecated
        path = os.path.join(folder, "model.ptl")  # it saves to a path only
        torch.jit.script(module)._save_for_lite_interpreter(path)
        with open(path, "rb") as f:
            return f.read()


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
        self.scale = torch.tensor([0.5, 2.0])  # a tensor constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).flatten(1) * self.scale.sum()


class _Stateful(torch.nn.Module):
    """A benign ``__getstate__``/``__setstate__`` the lite interpreter runs while loading."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.ones(2)
        self.names = {"a": 1}

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, dict[str, int], bool]:
        return (self.w, self.names, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, dict[str, int], bool]) -> None:
        self.w = state[0] * 2
        self.names = state[1]
        self.training = state[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w


class _Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 5, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


def _quantized() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear},
                                                      dtype=torch.qint8)


#: Benign lite files, by name: what torch writes.
BENIGN: Final[dict[str, Callable[[], torch.nn.Module]]] = {
    "linear": _Linear, "conv": _Conv, "stateful": _Stateful, "lstm": _Recurrent,
    "quantized-dynamic": _quantized,
}


class Payload(torch.nn.Module):
    """Its ``__setstate__`` writes its state's path (``aten::save``) while loading."""

    def __init__(self, sentinel: str) -> None:
        super().__init__()
        self.w = torch.ones(2)
        self.path = sentinel

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, str, bool]:
        return (self.w, self.path, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, str, bool]) -> None:
        self.w = state[0]
        self.path = state[1]
        self.training = state[2]
        torch.save(self.w, self.path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w


_SAVE_LINE: Final = re.compile(rb"\n *torch\.save\([^\n]*\)\n")


def _rewrite(data: bytes, edit: Callable[[str, bytes], tuple[str, bytes] | None]) -> bytes:
    """The archive with each record passed through ``edit`` (None drops it)."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            kept = edit(info.filename, src.read(info))
            if kept is not None:
                info.filename = kept[0]
                dst.writestr(info, kept[1])
    return out.getvalue()


def _harmless_code(name: str, data: bytes) -> tuple[str, bytes] | None:
    if name.endswith(".debug_pkl"):
        return None  # source ranges of the code as written
    if "/code/" in name and name.endswith(".py"):
        data = _SAVE_LINE.sub(b"\n", data)
    return name, data


def _layout(name: str, data: bytes, layout: str) -> tuple[str, bytes] | None:
    kept = _harmless_code(name, data)
    if kept is None:
        return None
    if layout == "folded" and name.endswith("/bytecode.pkl"):
        return name[:-len("bytecode.pkl")] + "ByteCode.PKL", data
    if layout == "no-code" and ("/code/" in name or name.endswith("/constants.pkl")):
        return None
    return kept


#: Hostile layouts: code/ harmless (every one), ``bytecode.pkl`` named in other case,
#: no code/ and no constants.pkl at all (``torch.jit.load`` refuses it).
LAYOUTS: Final = ("harmless-code", "folded", "no-code")


def hostile(sentinel: str, layout: str) -> bytes:
    """A lite file whose payload only the lite interpreter runs (module docstring)."""
    data = lite_bytes(Payload(sentinel))
    assert _SAVE_LINE.search(data) is None  # the code records are deflated
    return _rewrite(data, lambda name, record: _layout(name, record, layout))
