"""The scan as a CI gate: no file that would run code in torch or in CPython passes.

Each hostile file is built by a generator here; CPython's C unpickler (in a
child process, with an inert ``find_class``: :mod:`gate_oracle`) and real
torch say what would really be resolved or read.
"""

from __future__ import annotations

import functools
import importlib
import io
import pickle
import pickletools
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import ptfile
from gate_oracle import c_unpickler, resolved
from hostile import checkpoint, raw_zip, tar
from ptfile.errors import ArchiveError, PtfileError
from ptfile.scanning import Verdict

# --------------------------------------------------------------------------- framing


def frame_straddle(command: str = "echo pwned") -> bytes:
    """Protocol 5: a FRAME of 2 bytes holding ``BINBYTES`` and one byte of its length.

    Static readers take the length across the frame's end (0x107: a string that
    hides the payload); the C unpickler over a BytesIO takes it from the four
    bytes after the frame (1), then runs ``GLOBAL os system`` and ``REDUCE``.
    """
    payload = b"cos\nsystem\n(S'" + command.encode() + b"'\ntR."
    low = 7
    after = (b"\x01\x00\x00" + b"\x00" + b"X" + payload).ljust(3 + 256 + low, b"X") + b"."
    return b"\x80\x05\x95" + (2).to_bytes(8, "little") + b"B" + bytes([low]) + after


def test_frame_straddle_runs_a_hidden_global_in_cpython() -> None:
    data = frame_straddle()
    seen = c_unpickler(data)
    assert seen["calls"] == [["os", "system"]], seen
    assert "GLOBAL" not in {op.name for op, _, _ in pickletools.genops(data)}


@pytest.mark.parametrize("zipped", [False, True])
def test_scan_flags_an_opcode_that_straddles_a_frame(zipped: bool) -> None:
    data = checkpoint(frame_straddle()) if zipped else frame_straddle()
    result = ptfile.scan(data)
    assert result.is_dangerous
    assert any(f.kind == "frame" and f.verdict is Verdict.DANGEROUS for f in result.findings)


def test_load_refuses_an_opcode_that_straddles_a_frame() -> None:
    with pytest.raises(PtfileError, match="straddles the end of its frame"):
        ptfile.load(checkpoint(frame_straddle()))


def test_real_protocol_5_frames_stay_clean() -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(3), "names": ["x" * 70_000, b"y" * 200_000]}, buf,
               pickle_protocol=5)
    result = ptfile.scan(buf.getvalue())
    assert result.is_clean, result.findings
    assert ptfile.load(buf.getvalue())["names"][1] == b"y" * 200_000


# --------------------------------------------------------------------------- ZIP names by case

EVIL = b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00hi\x85R."


def case_colliding(payload_name: str, payload_first: bool = True) -> bytes:
    """A payload record whose name equals ``archive/data.pkl`` but for case, and the real one."""
    records = [(payload_name, EVIL), ("archive/data.pkl", pickle.dumps({"w": 1}, protocol=2))]
    rest = [("archive/version", b"3\n"), ("archive/byteorder", b"little")]
    return raw_zip([*(records if payload_first else records[::-1]), *rest])


@pytest.mark.parametrize("name", ["archive/Data.pkl", "archive/DATA.PKL"])
def test_torch_reads_the_first_record_whose_name_matches_ignoring_case(name: str) -> None:
    with pytest.raises(pickle.UnpicklingError, match="system"):
        torch.load(io.BytesIO(case_colliding(name)), weights_only=True)


@pytest.mark.parametrize("name", ["archive/Data.pkl", "archive/DATA.PKL"])
def test_scan_reads_the_record_torch_reads_and_calls_the_collision_dangerous(name: str) -> None:
    result = ptfile.scan(case_colliding(name))
    assert {f.location for f in result.findings if f.qualname == "posix.system"} == {name}
    collisions = [f for f in result.findings if f.name == "case-colliding-names"]
    assert collisions and all(f.verdict is Verdict.DANGEROUS for f in collisions)


@pytest.mark.parametrize("payload_first", [True, False])
def test_load_refuses_names_that_collide_by_case(payload_first: bool) -> None:
    with pytest.raises(ArchiveError, match="only in case"):
        ptfile.load(case_colliding("archive/Data.pkl", payload_first))


def test_names_that_differ_otherwise_still_load() -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    renamed = buf.getvalue().replace(b"archive/", b"Model_V/")
    assert ptfile.load(renamed)["w"].numpy().tolist() == [1.0, 1.0]
    assert ptfile.scan(renamed).is_clean


# --------------------------------------------------------------------------- bare protocol 0/1

CALL = b"cos\nsystem\n(S'echo pwned'\ntR"
#: Protocol 0/1 pickles by their first opcode: each pushes something, pops it, then calls.
BARE = {"V": b"Vhello\n0", "S": b"S'x'\n0", "I": b"I1\n0", "]": b"]0", "N": b"N0",
        "K": b"K\x010", "}": b"}0", "F": b"F1.5\n0", "L": b"L7L\n0", "(": b"(l0"}


@pytest.mark.parametrize("opener", sorted(BARE))
def test_scan_reads_a_bare_pickle_whatever_its_first_opcode(opener: str) -> None:
    data = BARE[opener] + CALL + b"."
    assert c_unpickler(data)["calls"] == [["os", "system"]]
    result = ptfile.scan(data)
    assert result.is_dangerous and result.format == "pickle"
    assert "os.system" in result.unsafe_globals
    with pytest.raises(PtfileError):
        ptfile.load(data)


def test_a_file_that_is_no_pickle_is_an_unknown_format_error() -> None:
    with pytest.raises(ptfile.UnknownFormatError, match="not a known checkpoint format"):
        ptfile.scan(b'{"a": 1}')


# --------------------------------------------------------------------------- dotted names


def stack_global(module: str, name: str) -> bytes:
    """Protocol 4: SHORT_BINUNICODE module, name, STACK_GLOBAL."""
    return b"".join(b"\x8c" + bytes([len(p)]) + p.encode() for p in (module, name)) + b"\x93"


DOTTED = [("pathlib", "os.system"), ("typing", "sys.modules"),
          ("torch", "serialization.load"), ("shlex", "os.system")]


@pytest.mark.parametrize(("module", "name"), DOTTED)
def test_scan_classifies_a_dotted_name_by_what_it_resolves_to(module: str, name: str) -> None:
    first = name.split(".")[0]
    if hasattr(importlib.import_module(module), first):  # pathlib.os: gone in Python 3.13
        fetched = pickle.loads(b"\x80\x04" + stack_global(module, name) + b".")  # no call
        owner = getattr(importlib.import_module(module), first)
        assert fetched is functools.reduce(getattr, name.split(".")[1:], owner)
    # dangerous on every Python: the file may be loaded on one where the chain resolves
    data = b"\x80\x04" + stack_global(module, name) + b"\x8c\x02hi\x85R."
    result = ptfile.scan(data)
    assert result.is_dangerous, result.findings
    assert f"{module}.{name}" in result.unsafe_globals


# --------------------------------------------------------------------------- names by capability

#: Globals of peer scanners' malicious samples that used to be only 'unknown', and more of
#: each family (run commands, import by name, open files or sockets, load modules).
CAPABLE = ["torch.utils.collect_env.run", "torch._C.import_ir_module_from_buffer",
           "torch._C._load_for_lite_interpreter", "torch._C._jit_pass_inline",
           "uuid._get_command_stdout", "pkgutil.resolve_name", "logging.FileHandler",
           "_pyrepl.pager.pipe_pager", "_interpreters.create", "imaplib.IMAP4_stream",
           "poplib.POP3", "httplib.HTTPSConnection", "http.client.HTTPSConnection",
           "nntplib.NNTP", "socketserver.TCPServer", "zipfile.ZipFile", "torch.ops.load_library",
           "numpy.lib._npyio_impl.load", "torch.multiprocessing.spawn",
           "torch.testing._internal.common_utils.shell", "sqlite3.connect",
           "xmlrpc.client.ServerProxy"]


def reduce_call(qualname: str) -> bytes:
    module, name = qualname.rsplit(".", 1)
    return b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\nX\x02\x00\x00\x00hi\x85R."


@pytest.mark.parametrize("qualname", CAPABLE)
def test_scan_calls_capable_names_dangerous(qualname: str) -> None:
    data = reduce_call(qualname)
    assert resolved(data) == {qualname}  # CPython would import it, then call it
    result = ptfile.scan(data)
    assert result.is_dangerous, result.findings


def codec_pickle(codec: str) -> bytes:
    """``_codecs.encode('x', codec)``, as picklers write bytes (with latin1)."""
    return (b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00x" + b"X" + len(codec).to_bytes(4, "little")
            + codec.encode() + b"\x86R.")


@pytest.mark.parametrize("codec", ["rot13", "hex", "zlib", "idna", "punycode", "undefined"])
def test_scan_calls_encode_with_a_codec_outside_the_standard_set_dangerous(codec: str) -> None:
    data = codec_pickle(codec)
    assert c_unpickler(data)["calls"] == [["_codecs", "encode"]]
    result = ptfile.scan(data)
    assert result.is_dangerous and any(f.kind == "codec" for f in result.findings)


@pytest.mark.parametrize("codec", ["latin1", "latin-1", "utf-8", "ascii"])
def test_encode_with_a_standard_codec_stays_clean(codec: str) -> None:
    assert ptfile.scan(codec_pickle(codec)).is_clean
    assert ptfile.scan(pickle.dumps({"b": b"\x00\xff" * 3}, protocol=2)).is_clean


# --------------------------------------------------------------------------- bounded inflation


def deflate_bomb(path: Path, inflated: int = 256 << 20, declared: int | None = None) -> Path:
    """A ZIP whose deflated data.pkl is a BINBYTES of ``inflated`` zero bytes (~1000x)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("archive/data.pkl", "w", force_zip64=True) as f:
            f.write(b"\x80\x02B" + (inflated).to_bytes(4, "little"))
            chunk = bytes(1 << 20)
            for _ in range(inflated >> 20):
                f.write(chunk)
            f.write(b".")
        zf.writestr("archive/version", "3\n")
    if declared is not None:  # the central directory lies about the size
        data = bytearray(path.read_bytes())
        at = data.rfind(b"PK\x01\x02")
        at = data.rfind(b"PK\x01\x02", 0, at)  # data.pkl's entry, the first one
        data[at + 24:at + 28] = declared.to_bytes(4, "little")
        path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("declared", [None, 1000])
def test_scan_of_a_deflate_bomb_stays_within_max_inflate_ratio(tmp_path: Path,
                                                                 declared: int | None) -> None:
    bomb = deflate_bomb(tmp_path / "bomb.pt", declared=declared)
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        result = ptfile.scan(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 80 << 20, peak
    found = [f for f in result.findings if f.kind == "limit"]
    assert found and found[0].name == "max_inflate_ratio" and result.is_dangerous
    with pytest.raises(PtfileError):
        ptfile.load(bomb)


# --------------------------------------------------------------------------- false positives


class _Scripted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)).sum(dim=-1)

    @torch.jit.export
    def scale(self, x: torch.Tensor, k: float) -> torch.Tensor:
        return x * k


@pytest.mark.parametrize("how", ["script", "trace"])
def test_a_benign_torchscript_model_scans_clean(how: str) -> None:
    model = _Scripted()
    jitted = torch.jit.script(model) if how == "script" else \
        torch.jit.trace(model, torch.ones(1, 3))
    buf = io.BytesIO()
    torch.jit.save(jitted, buf)
    result = ptfile.scan(buf.getvalue())
    assert (result.format, result.verdict) == ("torchscript", Verdict.ALLOWED), [
        f for f in result.findings if f.verdict is not Verdict.ALLOWED]
    kinds = {f.kind for f in result.findings}
    assert {"torchscript-type", "torchscript-code"} <= kinds
    assert any("forward" in f.message for f in result.findings if f.kind == "torchscript-code")
    ptfile.load(buf.getvalue())  # the message agrees with load: it loads


CONSTANTS = pickle.dumps((), protocol=2)
MODEL = b"\x80\x02c__torch__.m\nNet\n)\x81}b."


@pytest.mark.parametrize("call", ["torch.from_file(\"/etc/passwd\", False, 10)",
                                  "torch.ops.evil.run(x)", "torch._C._jit_pass_inline(x)",
                                  "ops.custom.launch(x)"])
def test_torchscript_code_that_reaches_files_or_native_ops_is_dangerous(call: str) -> None:
    code = (f"class Net(Module):\n  __parameters__ = []\n  def forward(self, x: Tensor) -> "
            f"Tensor:\n    return {call}\n").encode()
    data = checkpoint(MODEL, {"constants.pkl": CONSTANTS, "code/__torch__/m.py": code})
    result = ptfile.scan(data)
    assert result.is_dangerous
    assert [f.kind for f in result.findings if f.verdict is Verdict.DANGEROUS] == \
        ["torchscript-code"]


def test_torch_classes_outside_a_torchscript_archive_stay_unknown() -> None:
    result = ptfile.scan(checkpoint(MODEL))
    assert result.verdict is Verdict.UNKNOWN
    assert "__torch__.m.Net" in result.unsafe_globals


EXT_CHILD = ("import copyreg, pickle, sys\n"
             "assert copyreg._extension_registry == {}, copyreg._extension_registry\n"
             "try:\n    pickle.loads(sys.stdin.buffer.read())\n"
             "except ValueError as e:\n    print('raises', e)\n")


@pytest.mark.parametrize("ext", [b"\x82\x01", b"\x83\x01\x02", b"\x84\x01\x00\x00\x00"])
def test_ext_codes_are_unknown_not_dangerous(ext: bytes) -> None:
    data = b"\x80\x02" + ext + b")R."
    out = subprocess.run([sys.executable, "-I", "-c", EXT_CHILD], input=data,
                         capture_output=True, check=True).stdout
    assert out.startswith(b"raises")  # empty registry: CPython raises, torch too
    with pytest.raises(pickle.UnpicklingError):
        torch.load(io.BytesIO(checkpoint(data)), weights_only=True)
    result = ptfile.scan(data)
    assert result.verdict is Verdict.UNKNOWN
    assert [f.kind for f in result.findings if f.verdict is not Verdict.ALLOWED] == ["ext"]


def test_an_object_npy_in_a_tar_is_not_dangerous() -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([1, "a", None], dtype=object), allow_pickle=True)
    data = tar({"x.npy": buf.getvalue()})
    with pytest.raises(pickle.UnpicklingError, match="invalid load key"):
        torch.load(io.BytesIO(data), weights_only=False)  # tarfile path fails; byte 0 is no pickle
    result = ptfile.scan(data)
    assert (result.format, result.verdict) == ("tar", Verdict.UNKNOWN), result.findings
    assert any(f.kind == "numpy-object-array" for f in result.findings)


def test_a_payload_in_a_member_torch_unpickles_stays_dangerous() -> None:
    assert ptfile.scan(tar({"pickle": EVIL, "x.npy": EVIL})).is_dangerous
    assert not ptfile.scan(tar({"x.npy": EVIL})).is_dangerous
