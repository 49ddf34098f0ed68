"""TorchScript archives as the scanner reports them: class references and ``code/``.

A TorchScript archive (``torch.jit.save``; ``torch.load`` hands it to
``torch.jit.load``) pickles its modules as ``__torch__.<path>.<Class>``:
TorchScript class references, which ``torch.jit.load`` resolves against the
archive's own ``code/`` and never imports from Python.  In such an archive they
are ``torchscript-type`` findings, allowed (``ptfile.load`` reads the archive's
tensors and constants too); in any other file they stay globals, ``unknown``.

``code/**/*.py`` is TorchScript source that ``torch.jit.load`` compiles and its
methods run.  It can reach only TorchScript builtins and operators, so it is
reported (kind ``torchscript-code``) with its method names, and is dangerous when
it calls what can open files, load libraries or leave TorchScript
(:data:`DANGEROUS_CODE`): custom operator namespaces (``torch.ops.<ns>`` other
than :data:`STANDARD_OP_NAMESPACES`: registered by native libraries),
``torch._C``, ``from_file``, ``load_library``, ``open``/``eval``/``exec``
or ``os``/``subprocess``/``sys`` names.  Nothing is compiled or run.
"""

from __future__ import annotations

import re
from typing import Final

from .verdicts import Finding, Verdict

__all__ = ["DANGEROUS_CODE", "STANDARD_OP_NAMESPACES", "TORCHSCRIPT_PREFIX",
           "as_torchscript_type", "judge_code"]

#: The module prefix of TorchScript class references.
TORCHSCRIPT_PREFIX: Final = "__torch__"
#: Operator namespaces every torch build has.
STANDARD_OP_NAMESPACES: Final = frozenset({"aten", "prim", "quantized", "_quantized",
                                           "profiler", "_caffe2"})
#: What code may not call: file, library and process APIs, torch._C, nested loaders.
DANGEROUS_CODE: Final = re.compile(
    r"\btorch\._C\b|\b(?:from_file|load_library|_load_for_lite_interpreter)\b"
    r"|\b(?:open|eval|exec|compile|__import__|getattr\s*\(\s*torch)\s*\("
    r"|\b(?:os|subprocess|sys|posix|shutil|socket)\.\w+"
    r"|\bbuiltins\.(?:open|eval|exec|compile|__import__)\b"
    r"|\btorch\.(?:load|save|hub)\b")
_OPS: Final = re.compile(r"\bops\.(\w+)\.")
_METHOD: Final = re.compile(r"^\s*def\s+(\w+)\s*\(", re.MULTILINE)


def judge_code(text: str) -> tuple[Verdict, str]:
    """The verdict and message for one ``code/`` source file.

    Examples
    --------
    >>> judge_code("def forward(self, x):\\n  return torch.relu(x)\\n")[0]
    <Verdict.ALLOWED: 'allowed'>
    >>> judge_code("def forward(self):\\n  return torch.ops.evil.run()\\n")[0]
    <Verdict.DANGEROUS: 'dangerous'>
    """
    methods = ", ".join(dict.fromkeys(_METHOD.findall(text))) or "none"
    calls = sorted({m.group(0) for m in DANGEROUS_CODE.finditer(text)}
                   | {f"torch.ops.{ns}" for ns in _OPS.findall(text)
                      if ns not in STANDARD_OP_NAMESPACES})
    if calls:
        return Verdict.DANGEROUS, (f"TorchScript code that torch.jit.load compiles (methods: "
                                   f"{methods}) calls {', '.join(calls)[:300]}")
    return Verdict.ALLOWED, (f"TorchScript code that torch.jit.load compiles (methods: "
                             f"{methods[:300]}); it calls only TorchScript builtins")


def as_torchscript_type(f: Finding) -> Finding:
    """A ``__torch__.*`` global of a TorchScript archive: a class reference that
    torch.jit.load resolves against the archive's code, not a Python import
    (:mod:`ptfile.scanning.torchscript`)."""
    if f.kind != "global" or f.verdict is not Verdict.UNKNOWN or \
            f.module.split(".")[0] != TORCHSCRIPT_PREFIX:
        return f
    return Finding("torchscript-type", Verdict.ALLOWED, f.location, f.offset, f.module, f.name,
                   f.opcode, f"TorchScript class {f.module}.{f.name}: torch.jit.load resolves "
                   "it against the archive's code/, it imports nothing")
