"""Verdicts of :func:`ptfile.scan`: the tables that decide them and the result records.

Each :class:`Finding` has a :class:`Verdict`: ``allowed`` (on torch's
weights-only allowlist or in :func:`ptfile.add_safe_globals`), ``dangerous``
(the tables :data:`DANGEROUS_MODULES` and :data:`DANGEROUS_NAMES`: code
execution, file or network access, a nested unpickler; plus EXT codes,
unresolvable ``STACK_GLOBAL`` names, numpy object arrays and hash-flooding or
deeply nested keys), or ``unknown`` (anything else: ``ptfile.load`` refuses it
by default, ``torch.load(weights_only=False)`` would import and run it).
Ambiguities (archive anomalies, data after ``STOP``) are ``unknown``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Final

from ..policy import BLOCKED_MODULES, find_allowed

__all__ = ["DANGEROUS_MODULES", "DANGEROUS_NAMES", "TORCHSCRIPT_NAMES", "Finding", "ScanResult",
           "Verdict", "iter_dangerous", "verdict_of"]


class Verdict(str, Enum):
    """How much to worry about a finding, in increasing order."""

    ALLOWED = "allowed"
    UNKNOWN = "unknown"
    DANGEROUS = "dangerous"


#: Modules whose every global is dangerous (prefix match on dotted names).
DANGEROUS_MODULES: Final = frozenset({
    *BLOCKED_MODULES, "subprocess", "_posixsubprocess", "runpy", "importlib", "imp",
    "pty", "shutil", "socket", "ctypes", "_ctypes", "pickle", "_pickle", "cPickle",
    "marshal", "code", "codeop", "commands", "webbrowser", "multiprocessing", "signal",
    "asyncio", "bdb", "pdb", "timeit", "pydoc", "ensurepip", "venv", "distutils",
    "setuptools", "pip", "zipimport", "http", "urllib", "urllib2", "requests", "ftplib",
    "smtplib", "telnetlib", "shelve", "dill", "cloudpickle", "joblib", "builtins.open",
    "torch.hub", "torch.package", "torch.utils.cpp_extension", "torch._inductor",
    "torch._dynamo", "torch.distributed.rpc", "numpy.f2py", "numpy.distutils",
    "numpy.ctypeslib", "numpy.testing", "sysconfig", "ntpath", "posixpath", "glob",
    "tempfile", "io", "_io", "types", "gc", "inspect", "operator", "profile", "cProfile",
    "trace", "doctest", "idlelib", "lib2to3", "pickletools",
})

#: Single globals that are dangerous: evaluation, attribute access, nested loaders, exits.
#: Constructors that only build objects (``functools.partial``, ``collections.defaultdict``,
#: ``copyreg._reconstructor``, ``builtins.type``) are ``unknown``: real whole-model and
#: optimizer pickles use them, and what they would call is flagged on its own.
DANGEROUS_NAMES: Final = frozenset({
    *((m, n) for m in ("builtins", "__builtin__") for n in (
        "eval", "exec", "execfile", "compile", "open", "file", "__import__", "getattr",
        "setattr", "delattr", "globals", "locals", "vars", "input", "breakpoint", "apply",
        "reload", "help", "exit", "quit", "__build_class__")),
    ("torch", "load"), ("torch.serialization", "load"), ("torch.serialization", "_load"),
    ("torch.serialization", "_legacy_load"), ("torch.storage", "_load_from_bytes"),
    ("torch.jit", "load"), ("torch.jit._serialization", "load"), ("torch", "save"),
    ("torch.fx.graph_module", "_forward_from_src"), ("torch.fx.graph_module", "reduce_graph_module"),
    ("torch.fx.graph_module", "_deserialize_graph_module"), ("functools", "reduce"),
    ("numpy", "load"), ("numpy.lib.npyio", "load"), ("numpy.lib.format", "read_array"),
    ("numpy", "fromfile"), ("numpy", "memmap"), ("numpy", "loadtxt"),
    ("_operator", "attrgetter"), ("_operator", "methodcaller"),
})

#: TorchScript's typed-container constructors (``constants.pkl``/``data.pkl``): data only.
TORCHSCRIPT_NAMES: Final = frozenset(("torch.jit._pickle", n) for n in (
    "build_intlist", "build_doublelist", "build_boollist", "build_tensorlist",
    "build_tensor_from_id", "restore_type_tag"))


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the scanner saw.

    Attributes
    ----------
    kind : str
        ``global`` (a name a pickle imports), ``ext``, ``nested`` (a pickle
        inside bytes), ``numpy-object-array``, ``hazard`` (hash flooding, deep
        keys), ``frame`` (an opcode straddles a frame's end: unpicklers read it
        differently), ``stream`` (malformed pickle, data after ``STOP``), ``archive``
        (a container anomaly; ``name`` holds its code) or ``format``.
    verdict : Verdict
    location : str
        Where: the record or member, ``stream#N`` for the N-th pickle of a
        stream, with `` > nested@0x..`` for nested pickles.
    offset : int or None
        Byte offset within that location (a pickle opcode, a header).
    module, name : str
        The global (empty for other kinds; ``name`` is the anomaly code for archive ones).
    opcode : str
        ``GLOBAL``, ``STACK_GLOBAL``, ``INST``, ``EXT1``…, or empty.
    message : str
        A sentence for humans.
    """

    kind: str
    verdict: Verdict
    location: str
    offset: int | None
    module: str = ""
    name: str = ""
    opcode: str = ""
    message: str = ""

    @property
    def qualname(self) -> str:
        """``module.name`` for globals, else the name."""
        return f"{self.module}.{self.name}" if self.module else self.name

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the verdict as its string value)."""
        out = asdict(self)
        out["verdict"] = self.verdict.value
        return out


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What :func:`scan` found in one file.

    Attributes
    ----------
    source : str or None
        The path, when scanning a path.
    format : str
        ``zip``, ``torchscript``, ``legacy``, ``tar``, ``pickle`` or ``unknown``.
    findings : tuple of Finding
        In file order per location.
    """

    source: str | None
    format: str
    findings: tuple[Finding, ...] = field(default=())

    @property
    def is_dangerous(self) -> bool:
        """True when any finding is dangerous."""
        return any(f.verdict is Verdict.DANGEROUS for f in self.findings)

    @property
    def is_clean(self) -> bool:
        """True when every finding is allowed: ``ptfile.load`` would load it as is."""
        return all(f.verdict is Verdict.ALLOWED for f in self.findings)

    @property
    def globals(self) -> frozenset[str]:
        """Every ``module.name`` the file's pickles import."""
        return frozenset(f.qualname for f in self.findings if f.kind == "global")

    @property
    def unsafe_globals(self) -> frozenset[str]:
        """Globals outside the allowlist (torch's ``get_unsafe_globals_in_checkpoint``)."""
        return frozenset(f.qualname for f in self.findings
                         if f.kind == "global" and f.verdict is not Verdict.ALLOWED)

    @property
    def verdict(self) -> Verdict:
        """The worst verdict of any finding (``allowed`` when there are none)."""
        order = list(Verdict)
        return max((f.verdict for f in self.findings), key=order.index, default=Verdict.ALLOWED)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary: source, format, verdict, findings.

        Examples
        --------
        >>> ScanResult(None, "zip").to_dict()["verdict"]
        'allowed'
        """
        return {"source": self.source, "format": self.format, "verdict": self.verdict.value,
                "is_dangerous": self.is_dangerous,
                "findings": [f.to_dict() for f in self.findings]}


def _module_dangerous(module: str) -> bool:
    parts = module.split(".")
    return any(".".join(parts[:i]) in DANGEROUS_MODULES for i in range(1, len(parts) + 1))


def _readings(module: str, name: str) -> Iterator[tuple[str, str]]:
    """Every ``(module, name)`` a dotted name may resolve as.

    Protocol 4+ resolves ``name`` through its attribute chain, and an
    attribute may be a module: ``pathlib`` + ``os.system`` is ``os.system``,
    ``torch`` + ``hub.load`` is ``torch.hub.load``.  So the name is read with
    each run of its leading attributes appended to the module, and with each
    run of attributes standing for a module of that name.
    """
    yield module, name
    attrs = name.split(".")
    for j in range(1, len(attrs)):
        rest = ".".join(attrs[j:])
        yield ".".join((module, *attrs[:j])), rest
        for i in range(j):
            yield ".".join(attrs[i:j]), rest


def _dangerous(module: str, name: str) -> bool:
    return _module_dangerous(module) or (module, name) in DANGEROUS_NAMES \
        or (module, name.split(".")[0]) in DANGEROUS_NAMES


def verdict_of(module: str, name: str) -> Verdict:
    """The verdict for a global ``module.name`` (tables first, then the allowlist).

    A dotted ``name`` is dangerous when any object along its attribute chain may
    be (:func:`_readings`): ``pathlib`` + ``os.system`` is ``os.system``.

    Examples
    --------
    >>> verdict_of("posix", "system"), verdict_of("torch", "FloatStorage")
    (<Verdict.DANGEROUS: 'dangerous'>, <Verdict.ALLOWED: 'allowed'>)
    >>> verdict_of("pathlib", "os.system")
    <Verdict.DANGEROUS: 'dangerous'>
    """
    if any(_dangerous(m, n) for m, n in _readings(module, name)):
        return Verdict.DANGEROUS
    if find_allowed(module, name) is not None or (module, name) in TORCHSCRIPT_NAMES:
        return Verdict.ALLOWED
    return Verdict.UNKNOWN


def iter_dangerous(result: ScanResult) -> Iterator[Finding]:
    """The dangerous findings of ``result``, in order."""
    return (f for f in result.findings if f.verdict is Verdict.DANGEROUS)
