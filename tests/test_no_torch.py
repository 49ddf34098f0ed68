"""ptfile's runtime needs no torch: every front door works in a process where importing torch
fails (torch is the oracle of the other tests, so this one blocks it in a child process)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

CHILD = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # any `import torch` now raises ImportError
    sys.modules["safetensors"] = None  # nor is the safetensors package needed
    import numpy as np
    import ptfile
    from ptfile.export import dump

    folder = sys.argv[1]
    for name in ("zip.pt", "legacy.pt", "script.pt"):
        path = f"{folder}/{name}"
        for mmap in (False, True):
            sd = ptfile.load(path, mmap=mmap)
            assert np.array_equal(np.asarray(sd["w"].numpy()), np.arange(6.0).reshape(2, 3))
        with ptfile.open(path) as ck:
            assert list(ck.keys()) == ["w"], list(ck.keys())
        assert not ptfile.scan(path).is_dangerous
        ptfile.inspect(path)
        ptfile.detect_format(path)
    ptfile.load_torchscript(f"{folder}/script.pt")
    ptfile.save(ptfile.load(f"{folder}/zip.pt"), f"{folder}/resaved.pt")
    dump(ptfile.load(f"{folder}/zip.pt"), f"{folder}/out.safetensors")
    from ptfile.export.convert import convert
    ptfile.save({"model": ptfile.load(f"{folder}/zip.pt"), "epoch": 3}, f"{folder}/nested.pt")
    convert(f"{folder}/nested.pt", f"{folder}/nested.safetensors", to="safetensors")
    assert ptfile.load(f"{folder}/nested.safetensors")["epoch"] == 3
    assert ptfile.diff(f"{folder}/nested.pt", f"{folder}/nested.safetensors").identical
    ptfile.save_dcp(ptfile.load(f"{folder}/zip.pt"), f"{folder}/dcp")
    assert np.array_equal(ptfile.load_dcp(f"{folder}/dcp")["w"].numpy(), np.arange(6.0).reshape(2, 3))
    from ptfile.dcp.consolidate import convert_dcp
    convert_dcp(f"{folder}/dcp", f"{folder}/from_dcp.pt", to="pt")
    convert_dcp(f"{folder}/dcp", f"{folder}/from_dcp.safetensors", to="safetensors")
    assert list(ptfile.load(f"{folder}/from_dcp.safetensors")) == ["w"]
    assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
    print("ok")
""")


class _Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w", torch.arange(6.0).reshape(2, 3))


def test_no_torch_every_front_door(tmp_path: Path) -> None:
    w = torch.arange(6.0).reshape(2, 3)
    torch.save({"w": w}, tmp_path / "zip.pt")
    torch.save({"w": w}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(_Holder()), buf)
    (tmp_path / "script.pt").write_bytes(buf.getvalue())
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert torch.equal(torch.load(tmp_path / "resaved.pt", weights_only=True)["w"], w)
    assert torch.equal(torch.load(tmp_path / "from_dcp.pt", weights_only=True)["w"], w)
