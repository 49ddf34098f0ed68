"""``.pt2`` (torch.export) archives: the scanner reads the records torch unpickles.

Real archives are written by ``torch.export.save`` here: a plain module, one
with a uint8 buffer whose raw bytes start like a pickle, and one holding an
opaque-object constant (a Python class pickled into ``opaque_obj_0``).  The
malicious ones are those archives with one record changed; one child process
running ``torch.export.load`` on each under an audit hook shows that torch
really reaches the payload.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import ptfile
from hostile import checkpoint
from ptfile.scanning import Verdict


class _Payload:
    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, ("echo pwned",))


EVIL = pickle.dumps(_Payload(), protocol=2)


class _Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("c", torch.ones(2), persistent=False)
        self.register_buffer("u", torch.tensor(list(b"\x80\x02\xff\xfe not a pickle."),
                                                       dtype=torch.uint8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.c + self.u.sum()


def exported(module: torch.nn.Module, *inputs: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.export.save(torch.export.export(module, inputs), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def plain() -> bytes:
    return exported(_Plain(), torch.ones(1, 3))


_OPAQUE = r'''
import io, sys, torch
from torch._opaque_base import OpaqueBase
from torch._library.opaque_object import register_opaque_type

class Counter(OpaqueBase):
    def __init__(self, k):
        self.k = k

register_opaque_type(Counter, typ="reference")

@torch.library.custom_op("ptfiletest::scale", mutates_args=())
def scale(x: torch.Tensor, c: Counter) -> torch.Tensor:
    return x * c.k

@scale.register_fake
def _(x, c):
    return torch.empty_like(x)

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = Counter(3)
    def forward(self, x):
        return torch.ops.ptfiletest.scale(x, self.c)

buf = io.BytesIO()
torch.export.save(torch.export.export(M(), (torch.ones(2),)), buf)
sys.stdout.buffer.write(buf.getvalue())
'''


def opaque_pt2() -> bytes:
    """A real .pt2 with an opaque-object constant (written in a child: the custom op and
    the opaque type register process-wide)."""
    return subprocess.run([sys.executable, "-c", _OPAQUE], capture_output=True, check=True,
                          timeout=300).stdout


@pytest.fixture(scope="module")
def opaque() -> bytes:
    return opaque_pt2()


def rewrite(data: bytes, change: Callable[[str, bytes], bytes | None],
            add: dict[str, bytes] | None = None) -> bytes:
    """The archive with each record's bytes passed through ``change`` (None drops it)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            new = change(info.filename, zin.read(info))
            if new is not None:
                zout.writestr(info.filename, new)
        for name, value in (add or {}).items():
            zout.writestr(name, value)
    return out.getvalue()


def _use_pickle(text: bytes) -> bytes:
    doc = json.loads(text)
    for meta in doc["config"].values():
        if meta["path_name"] == "weight_0":
            meta["use_pickle"], meta["tensor_meta"] = True, None
    return json.dumps(doc).encode()


def evil_weight(plain: bytes) -> bytes:
    """weight_0 is a whole torch.save archive of the payload, with ``use_pickle``."""
    def change(name: str, value: bytes) -> bytes:
        if name.endswith("/weight_0"):
            return checkpoint(EVIL)
        return _use_pickle(value) if name.endswith("weights_config.json") else value
    return rewrite(plain, change)


def evil_opaque(opaque: bytes) -> bytes:
    return rewrite(opaque, lambda n, v: EVIL if n.endswith("/opaque_obj_0") else v)


_TORCH_LOADS = r'''
import io, struct, sys, torch
class Reached(BaseException):
    pass
def hook(event, args):
    global reached
    if event == "os.system":
        reached = True
        raise Reached()
sys.addaudithook(hook)
raw = sys.stdin.buffer.read()
while raw:
    n = struct.unpack("<Q", raw[:8])[0]
    data, raw = raw[8:8 + n], raw[8 + n:]
    reached = False
    try:
        torch.export.load(io.BytesIO(data))
    except BaseException:
        pass
    print("os.system reached" if reached else "not reached", flush=True)
'''


def torch_reaches_system(files: dict[str, bytes]) -> dict[str, bool]:
    """Per file: whether ``torch.export.load`` calls ``os.system`` (the audit hook stops
    it there); one child loads them all in turn."""
    out = subprocess.run([sys.executable, "-c", _TORCH_LOADS], capture_output=True, check=True,
                         input=b"".join(len(d).to_bytes(8, "little") + d for d in files.values()),
                         timeout=300).stdout.decode().splitlines()
    assert len(out) == len(files), out
    return {name: line == "os.system reached" for name, line in zip(files, out, strict=True)}


#: The archives with a pickled record that calls ``os.system``, by what was changed.
EVIL_FILES: dict[str, Callable[[bytes, bytes], bytes]] = {
    "weight": lambda plain, opaque: evil_weight(plain),
    "opaque": lambda plain, opaque: evil_opaque(opaque)}


@pytest.fixture(scope="module")
def evil(plain: bytes, opaque: bytes) -> dict[str, tuple[bytes, bool]]:
    """Each evil archive, and whether real torch reaches its payload."""
    files = {which: make(plain, opaque) for which, make in EVIL_FILES.items()}
    reached = torch_reaches_system(files)
    return {which: (data, reached[which]) for which, data in files.items()}


def test_a_real_pt2_scans_clean_and_its_sample_inputs_are_read(plain: bytes) -> None:
    result = ptfile.scan(plain)
    assert (result.format, result.verdict) == ("pt2", Verdict.ALLOWED), [
        f for f in result.findings if f.verdict is not Verdict.ALLOWED]
    assert any("sample_inputs" in f.location for f in result.findings)
    assert not any(f.kind == "nested" for f in result.findings)  # u's bytes are data
    assert set(ptfile.load(plain)) >= {"lin.weight", "u"}


def test_a_real_pt2_with_an_opaque_object_is_unknown(opaque: bytes) -> None:
    assert "/data/constants/opaque_obj_0" in str(zipfile.ZipFile(io.BytesIO(opaque)).namelist())
    result = ptfile.scan(opaque)
    assert result.verdict is Verdict.UNKNOWN, result.findings
    names = {f.qualname for f in result.findings if f.verdict is Verdict.UNKNOWN}
    assert any(n.endswith("Counter") for n in names), names
    with pytest.raises(ptfile.PtfileError):
        ptfile.load(opaque)


@pytest.mark.parametrize("which", sorted(EVIL_FILES))
def test_a_pt2_whose_pickled_record_calls_system_is_dangerous(
        which: str, evil: dict[str, tuple[bytes, bool]]) -> None:
    data, reached = evil[which]
    assert reached
    result = ptfile.scan(data)
    assert result.is_dangerous
    found = [f for f in result.findings if f.qualname in {"posix.system", "os.system"}]
    assert found and all("/data/" in f.location for f in found), found
    with pytest.raises(ptfile.PtfileError):
        ptfile.load(data)


def test_aotinductor_native_code_is_dangerous(plain: bytes) -> None:
    data = rewrite(plain, lambda n, v: v, add={"archive/data/aotinductor/model/model.so": b"\x7fELF"})
    result = ptfile.scan(data)
    assert [f.kind for f in result.findings if f.verdict is Verdict.DANGEROUS] == ["native-code"]


def test_the_cli_exit_codes_of_pt2_files(tmp_path: Path, plain: bytes, opaque: bytes) -> None:
    from ptfile import cli, outcomes

    for name, data, code in [("plain", plain, outcomes.EXIT_OK), ("evil", evil_opaque(opaque),
                                                             outcomes.EXIT_UNSAFE)]:
        path = tmp_path / f"{name}.pt2"
        path.write_bytes(data)
        assert cli.main(["scan", str(path)]) == code
