"""TorchScript ``code/`` records judged as a language (:mod:`ptfile.scanning.torchscript`).

Benign archives are written by ``torch.jit.save``; hostile ones are those archives
with one code record rewritten (the other records, names and layout as torch wrote
them).  What torch 2.13 does with each hostile record is observed, not assumed: one
child process ``torch.jit.load``\\ s every archive in a fresh folder, calls
``forward`` and reports whether loading raised and which files appeared.
"""

from __future__ import annotations

import enum
import io
import json
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import ptfile
from ptfile import cli, outcomes
from ptfile.limits import Limits
from ptfile.scanning import Verdict
from ptfile.scanning.torchscript import judge_code

# --------------------------------------------------------------------------- benign archives


class _Sub(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


class _Named(torch.nn.Module):
    """Methods named like Python's dangerous builtins, strings that look like calls."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = _Sub()
        self.notes = ["os.system('rm -rf /')", "__import__('os')", "torch.save(x, 'f')"]

    @torch.jit.export
    def compile(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @torch.jit.export
    def open(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @torch.jit.export
    def eval_(self, x: torch.Tensor) -> torch.Tensor:
        return x - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("open('/etc/passwd')", "eval(1)", x.shape)
        y = self.compile(self.sub(x)) + self.open(x) + self.eval_(x)
        assert y.numel() > 0, "subprocess.run"
        return y


class _Pair(NamedTuple):
    a: torch.Tensor
    b: int


class _Color(enum.Enum):
    RED = 1


@torch.jit.script
class _Box:
    def __init__(self, v: int) -> None:
        self.v = v

    def get(self) -> int:
        return self.v


@torch.jit.script
def _negate(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.neg(x)


class _Features(torch.nn.Module):
    """NamedTuple, Enum, a TorchScript class, fork/wait, with, autograd, ops.aten."""

    def __init__(self) -> None:
        super().__init__()
        self.color = _Color.RED

    def forward(self, x: torch.Tensor) -> _Pair:
        fut = torch.jit.fork(_negate, x)
        with torch.no_grad():
            y = torch.jit.wait(fut) * _Box(2).get()
        if x.requires_grad:
            g = torch.autograd.grad([x.sum()], [x])[0]
            if g is not None:
                y = y + g
        warnings.warn("careful", stacklevel=2)
        return _Pair(torch.nn.functional.softmax(y, dim=0), self.color.value)


def _jit_bytes(module: torch.jit.ScriptModule) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(module, buf)
    return buf.getvalue()


def _benign() -> dict[str, bytes]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), {torch.nn.Linear},
            dtype=torch.qint8)
        encoder = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
        return {
            "named-like-builtins": _jit_bytes(torch.jit.script(_Named())),
            "features": _jit_bytes(torch.jit.script(_Features())),
            "lstm": _jit_bytes(torch.jit.script(torch.nn.LSTM(3, 3, bidirectional=True))),
            "transformer": _jit_bytes(torch.jit.script(torch.nn.Transformer(8, 2, 1, 1, 16))),
            "quantized-dynamic": _jit_bytes(torch.jit.script(quantized)),
            "traced": _jit_bytes(torch.jit.trace(
                torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.LayerNorm(4)),
                torch.randn(2, 3))),
            "traced-encoder": _jit_bytes(torch.jit.trace(encoder, torch.randn(1, 3, 8),
                                                         check_trace=False)),
        }


BENIGN = _benign()


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_torch_written_torchscript_scans_clean(name: str) -> None:
    result = ptfile.scan(BENIGN[name])
    assert (result.format, result.verdict) == ("torchscript", Verdict.ALLOWED), [
        f.message for f in result.findings if f.verdict is not Verdict.ALLOWED]
    assert any(f.kind == "torchscript-code" for f in result.findings)


def test_methods_named_like_builtins_are_listed_not_flagged(tmp_path: Path) -> None:
    path = tmp_path / "named.pt"
    path.write_bytes(BENIGN["named-like-builtins"])
    assert cli.main(["scan", str(path)]) == outcomes.EXIT_OK
    messages = [f.message for f in ptfile.scan(path).findings if f.kind == "torchscript-code"]
    assert any("compile" in m and "open" in m and "eval_" in m for m in messages), messages


def test_standard_custom_classes_are_allowed_and_others_are_dangerous() -> None:
    # A quantized model pickles __torch__.torch.classes.quantized.LinearPackedParamsBase.
    data = BENIGN["quantized-dynamic"]
    assert b"torch.classes.quantized" in data
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info).replace(b"torch.classes.quantized\n",
                                                      b"torch.classes.evilpack\n"))
    result = ptfile.scan(out.getvalue())
    assert result.is_dangerous
    assert any(f.kind == "torchscript-type" and f.verdict is Verdict.DANGEROUS and
               "evilpack" in f.module for f in result.findings)


# --------------------------------------------------------------------------- hostile records


class _Net(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


BASE = _jit_bytes(torch.jit.script(_Net()))
#: The code record of _Net (``<archive>/code/__torch__/<this module>.py``) and its text.
RECORD = next(n for n in zipfile.ZipFile(io.BytesIO(BASE)).namelist()
              if "/code/" in n and n.endswith(".py"))
HEAD = zipfile.ZipFile(io.BytesIO(BASE)).read(RECORD)
#: The forward's body as torch writes it; each case replaces it.
BODY = b"    return x\n"
assert HEAD.endswith(BODY), HEAD


def with_code(code: bytes) -> bytes:
    """BASE with its one code record replaced (its debug record dropped: it maps
    source ranges of the original code)."""
    src = zipfile.ZipFile(io.BytesIO(BASE))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if info.filename.endswith(".debug_pkl"):
                continue
            data = code if info.filename == RECORD else src.read(info)
            dst.writestr(info, data)
    return out.getvalue()


def with_body(body: str) -> bytes:
    return with_code(HEAD[:-len(BODY)] + body.encode())


#: What torch 2.13 does with each forward body, observed by TORCH below:
#: "writes" (the file "sentinel" appears), "runs" (it loads, forward is called, no
#: file), "refused" (torch.jit.load raises: nothing runs) or "crashes" (the process dies).
HOSTILE = {
    "save": ('    torch.save(x, "sentinel")\n    return x\n', "writes"),
    "ops-aten-save": ('    ops.aten.save(x, "sentinel")\n    return x\n', "writes"),
    "alias-save": ('    _0 = torch.save\n    _0(x, "sentinel")\n    return x\n', "writes"),
    "torch-as-value": ('    t = torch\n    t.save(x, "sentinel")\n    return x\n', "writes"),
    "ops-ns-as-value": ('    a = ops.aten\n    a.save(x, "sentinel")\n    return x\n', "writes"),
    "getattr-torch": ('    _0 = getattr(torch, "save")\n    _0(x, "sentinel")\n    return x\n',
                      "writes"),
    "autograd-save": ('    torch.autograd.save(x, "sentinel")\n    return x\n', "writes"),
    "from-file": ('    y = torch.from_file("/etc/hostname", False, 4, dtype=0)\n    return x\n',
                  "runs"),
    "custom-op": ("    return ops.evil.run(x)\n", "refused"),
    "torch-ops-custom": ("    return torch.ops.evil.run(x)\n", "refused"),
    "load-library": ('    torch.ops.load_library("/nonexistent.so")\n    return x\n', "refused"),
    "ops-load-library": ('    ops.load_library("/nonexistent.so")\n    return x\n', "refused"),
    "torch-load": ('    y = torch.load("sentinel")\n    return x\n', "refused"),
    "torch-C": ("    y = torch._C._get_tracing_state()\n    return x\n", "refused"),
    "open": ('    f = open("sentinel", "w")\n    return x\n', "refused"),
    "eval": ('    y = eval("1")\n    return x\n', "refused"),
    "import": ('    y = __import__("os")\n    return x\n', "refused"),
    "os-system": ('    y = os.system("touch sentinel")\n    return x\n', "refused"),
    "import-statement": ("    import os\n    return x\n", "refused"),
    "custom-class": ("    y = __torch__.torch.classes.evil.X()\n    return x\n", "refused"),
    "rpc": ('    y = rpc_async("w", torch.add, (x, 1))\n    return x\n', "refused"),
}
#: Records ptfile cannot read (unparsable or deeply nested): torch refuses them too,
#: or dies on them.
UNREADABLE = {
    "syntax-error": ("    return x +* 2\n", "refused"),
    "nul-byte": ("    y = 1\x00\n    return x\n", "refused"),
    # torch's recursive parser overflows the C stack: the process dies (SIGSEGV).
    "deep-unary": ("    return " + "-" * 100_000 + "x\n", "crashes"),
    "deep-sum": ("    return x" + "+x" * 100_000 + "\n", "crashes"),
}
BENIGN_BODIES = {
    "print": ("    print(\"os.system('touch sentinel')\")\n    return x\n", "runs"),
    "string-call": ('    s = "torch.save(x, \\"sentinel\\")"\n    return x\n', "runs"),
    "getattr-self": ('    _0 = getattr(self, "training")\n    return x\n', "runs"),
}

#: Where Python reads more code than torch (a lone CR ends a line for Python; for
#: torch's lexer it is a space, so the comment runs to the LF): a false positive.
OVER_READ = {
    "comment-cr": ('    y = 1 # c\r    torch.save(x, "sentinel")\n    return x\n', "runs"),
}

CHILD = r"""
import json, os, sys, tempfile, torch
for name, path in json.loads(sys.argv[1]).items():
    os.chdir(tempfile.mkdtemp())
    try:
        module = torch.jit.load(path)
    except Exception:
        print(json.dumps([name, "refused"]), flush=True)
        continue
    try:
        module(torch.ones(2))
    except Exception:
        pass
    print(json.dumps([name, "writes" if os.listdir(".") else "runs"]), flush=True)
"""


def _torch_loads(paths: dict[str, str]) -> dict[str, str]:
    """Each archive's fate in torch.jit.load; "crashes" for the one a child died on."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(paths)], capture_output=True,
                          text=True, timeout=600, check=False)
    seen = dict(json.loads(line) for line in done.stdout.splitlines() if line.startswith("["))
    if done.returncode != 0:
        seen[next(name for name in paths if name not in seen)] = "crashes"
    return seen


@pytest.fixture(scope="module")
def torch_does(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What torch 2.13 does with each case (one child process for all of them)."""
    folder = tmp_path_factory.mktemp("torchscript-code")
    paths = {}
    for name, (body, _) in {**HOSTILE, **UNREADABLE, **BENIGN_BODIES, **OVER_READ}.items():
        paths[name] = str(folder / f"{name}.pt")
        Path(paths[name]).write_bytes(with_body(body))
    for name, (head, _) in OLD_HEADERS.items():
        paths[f"old-header-{name}"] = str(folder / f"old-header-{name}.pt")
        Path(paths[f"old-header-{name}"]).write_bytes(with_code(head + HEAD))
    deep = {name: paths.pop(name) for name in list(paths) if name.startswith("deep")}
    result = _torch_loads(paths)
    for name, path in deep.items():  # each in its own child: torch may die on them
        result.update(_torch_loads({name: path}))
    return result


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_code_that_reaches_files_native_code_or_python_is_dangerous(
        name: str, torch_does: dict[str, str]) -> None:
    body, observed = HOSTILE[name]
    assert torch_does[name] == observed  # the ground truth this verdict answers
    result = ptfile.scan(with_body(body))
    assert result.is_dangerous
    assert [f.kind for f in result.findings if f.verdict is Verdict.DANGEROUS] == \
        ["torchscript-code"]


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_unreadable_code_is_dangerous_and_torch_cannot_run_it(
        name: str, torch_does: dict[str, str]) -> None:
    body, observed = UNREADABLE[name]
    assert torch_does[name] == observed
    result = ptfile.scan(with_body(body))
    assert result.is_dangerous
    assert any("cannot parse" in f.message for f in result.findings
               if f.kind == "torchscript-code"), [f.message for f in result.findings]


@pytest.mark.parametrize("name", sorted(BENIGN_BODIES))
def test_strings_comments_and_own_attributes_are_not_calls(
        name: str, torch_does: dict[str, str]) -> None:
    body, observed = BENIGN_BODIES[name]
    assert torch_does[name] == observed
    assert ptfile.scan(with_body(body)).verdict is Verdict.ALLOWED


@pytest.mark.parametrize("name", sorted(OVER_READ))
def test_where_python_reads_more_code_than_torch_the_verdict_errs_on_danger(
        name: str, torch_does: dict[str, str]) -> None:
    body, observed = OVER_READ[name]
    assert torch_does[name] == observed
    assert ptfile.scan(with_body(body)).is_dangerous


def test_code_over_the_limit_is_dangerous_and_not_parsed() -> None:
    data = with_body("    return x\n" + "    # padding\n" * 100)
    assert ptfile.scan(data).verdict is Verdict.ALLOWED
    result = ptfile.scan(data, limits=Limits(max_torchscript_code_bytes=200))
    assert result.is_dangerous
    assert any("max_torchscript_code_bytes" in f.message for f in result.findings)


# --------------------------------------------------------------------------- judge_code


@pytest.mark.parametrize(("code", "verdict"), [
    ("def f(self, x):\n  return (self).compile(x, )\n", Verdict.ALLOWED),
    ("def f(x):\n  open = x\n  return open(1)\n", Verdict.ALLOWED),  # a local shadows
    ("def f(x):\n  return torch.autograd.grad([x], [x])\n", Verdict.ALLOWED),
    ("def f(x):\n  return ops.quantized.linear_dynamic(x, x)\n", Verdict.ALLOWED),
    ("class C(Module):\n  p : __torch__.torch.classes.quantized.LinearPackedParamsBase\n",
     Verdict.ALLOWED),
    ("def f(x):\n  return CONSTANTS.c0\n", Verdict.ALLOWED),
    ("class C(Module):\n  p : __torch__.torch.classes.evil.Runner\n", Verdict.DANGEROUS),
    ("def f(x):\n  return [torch][0].save(x, 'f')\n", Verdict.DANGEROUS),
    ("def f(x):\n  c = __torch__.torch.classes\n  return c.evil.X()\n", Verdict.DANGEROUS),
    ("def f(x):\n  return getattr(torch, x)\n", Verdict.DANGEROUS),
    ("def f(x):\n  return ops.prim.rpc_async(x)\n", Verdict.DANGEROUS),
    ("def f(x):\n  return f'{torch.save(x, 1)}'\n", Verdict.DANGEROUS),
    ("def f(x):\n  return (lambda: sys)().exit()\n", Verdict.DANGEROUS),
    ("def f(x):\n  return frobnicate(x)\n", Verdict.UNKNOWN),  # undefined in TorchScript
    ("def f(x):\n  return torch.nn.functional.relu(x)\n", Verdict.UNKNOWN),
])
def test_judge_code(code: str, verdict: Verdict) -> None:
    assert judge_code(code)[0] is verdict, judge_code(code)


@pytest.mark.parametrize("code", [
    "x = " + "(" * 10_000 + ")" * 10_000 + "\n",
    "x = " + "[" * 300 + "]" * 300 + "\n",
    "if x:\n" + "".join(" " * (i + 1) + "if x:\n" for i in range(200)),
    "x = a" + ".b" * 200_000 + "\n",
    "x = a" + "(1)" * 200_000 + "\n",
    "\ufeff\ud800 = 1\n",
    "def f(:\n",
])
def test_hostile_source_is_a_verdict_never_a_crash(code: str) -> None:
    verdict, message = judge_code(code)
    assert verdict is not Verdict.ALLOWED or "calls only" in message


# --------------------------------------------------------------------------- old and mobile writers

#: The import lines torch 1.3-1.4's printer wrote at the top of each code file (no such torch
#: here: the records are crafted from what it wrote), and imports nothing torch-written has.
OLD_HEADERS = {
    "import-torch": (b"import __torch__\n", Verdict.ALLOWED),
    "import-module-path": (b"import __torch__.torch.nn.modules.linear\n", Verdict.ALLOWED),
    "op-version-and-imports": ((b"op_version_set = 2\nimport __torch__\n"
                                b"import __torch__.torch.nn.modules.conv\n"), Verdict.ALLOWED),
    "import-packed-class": (b"import __torch__.torch.classes.xnnpack\n", Verdict.ALLOWED),
    "import-os": (b"import os\n", Verdict.DANGEROUS),
    "import-alias": (b"import __torch__ as os\n", Verdict.DANGEROUS),
    "import-custom-class": (b"import __torch__.torch.classes.evil\n", Verdict.DANGEROUS),
    "from-import": (b"from __torch__ import x\n", Verdict.DANGEROUS),
}


def test_old_import_headers_are_skipped_by_torch_and_judged_by_name(
        torch_does: dict[str, str]) -> None:
    # torch's importer skips import lines unread (a "from" line it cannot parse).
    assert {name: torch_does[f"old-header-{name}"] for name in OLD_HEADERS} == {
        name: "refused" if name == "from-import" else "runs" for name in OLD_HEADERS}
    for name, (head, verdict) in OLD_HEADERS.items():
        assert ptfile.scan(with_code(head + HEAD)).verdict is verdict, name


#: torch's own kernel namespaces that this build of torch does not register (no XNNPACK,
#: Vulkan or Metal); every other standard namespace must be one torch registers.
_MOBILE_ONLY = {"prepacked", "vulkan_prepack", "metal_prepack"}


def test_standard_op_namespaces_are_torchs_own() -> None:
    from ptfile.scanning.torchscript import STANDARD_OP_NAMESPACES
    registered = {s.name.split("::")[0] for s in torch._C._jit_get_all_schemas()}
    assert not STANDARD_OP_NAMESPACES - _MOBILE_ONLY - registered


@pytest.mark.parametrize("call", [
    "ops.prepacked.linear_clamp_run(x, self.packed)",
    "ops.prepacked.conv2d_clamp_run(x, self.packed)",
    "ops.mkldnn_prepacked.conv2d_run(x, self.packed)",
    "ops.quantized.linear(x, self.packed, 1.0, 0)",
])
def test_mobile_optimized_code_is_allowed(call: str) -> None:
    # what optimize_for_mobile writes (this torch has no XNNPACK to run it: judged by name)
    assert ptfile.scan(with_body(f"    return {call}\n")).verdict is Verdict.ALLOWED
