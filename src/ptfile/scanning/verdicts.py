"""Verdicts of :func:`ptfile.scan`: the tables that decide them and the result records.

Each :class:`Finding` has a :class:`Verdict`: ``allowed`` (on torch's
weights-only allowlist or in :func:`ptfile.add_safe_globals`), ``dangerous``
(the tables :data:`DANGEROUS_MODULES`, :data:`DANGEROUS_NAMES` and
:data:`DANGEROUS_PREFIXES`, by capability: run processes, evaluate or import
by name, open files or sockets, load another pickle, archive or TorchScript
module, reach interpreter internals; ``_codecs.encode`` with a codec outside
:data:`STANDARD_CODECS`, which imports an ``encodings`` module; plus
unresolvable ``STACK_GLOBAL`` names, numpy object arrays and hash-flooding or
deeply nested keys), or ``unknown`` (anything else: ``ptfile.load`` refuses it
by default, ``torch.load(weights_only=False)`` would import and run it).  EXT
codes are ``unknown``: copyreg's registry is empty in a fresh interpreter, so
torch and CPython raise on them.  Ambiguities that make readers read different
bytes (names that collide exactly or by case, opcodes that straddle a frame,
a central directory that ends before the end records, a ZIP that starts
otherwise, local headers the directory never names or that disagree with it:
:data:`ptfile.scanning.zip.DIVERGENT_ANOMALIES`) are ``dangerous``; other
anomalies (data after ``STOP``, archive oddities every reader reads alike) are
``unknown``.  Nested payloads (:mod:`ptfile.scanning.nested`) are judged by
what they hold.
"""

from __future__ import annotations

import _compat_pickle
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Final

__all__ = ["DANGEROUS_MODULES", "DANGEROUS_NAMES", "DANGEROUS_PREFIXES", "STANDARD_CODECS",
           "TORCHSCRIPT_NAMES", "Finding", "ScanResult", "Verdict", "codec_is_standard",
           "iter_dangerous", "verdict_of"]


class Verdict(str, Enum):
    """How much to worry about a finding, in increasing order."""

    ALLOWED = "allowed"
    UNKNOWN = "unknown"
    DANGEROUS = "dangerous"


#: Modules whose every global is dangerous (prefix match on dotted names).
DANGEROUS_MODULES: Final = frozenset({
    "sys", "os", "posix", "nt",  # torch's blocklist (ptfile.allowlist.policy.BLOCKED_MODULES)
    "subprocess", "_posixsubprocess", "runpy", "importlib", "imp",
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
    # import by name, or run a REPL, a pager or a subinterpreter
    "pkgutil", "_pyrepl", "pyrepl", "_interpreters", "interpreters", "_xxsubinterpreters",
    "_interpqueues", "_interpchannels", "concurrent.interpreters", "site", "_thread",
    # open files, databases or memory maps
    "logging.config", "logging.handlers", "zipfile", "tarfile", "fileinput", "linecache",
    "mmap", "sqlite3", "_sqlite3", "dbm", "_winapi", "msvcrt", "winreg",
    # open sockets (network clients and servers)
    "httplib", "imaplib", "poplib", "nntplib", "xmlrpc", "xmlrpclib", "socketserver",
    "SocketServer", "ssl", "_ssl", "_socket", "asyncore", "asynchat", "smtpd", "select",
    "selectors",
    # torch's and numpy's loaders, compilers and helpers that run commands
    "torch.utils.collect_env", "torch.utils.model_zoo", "torch.utils.hipify",
    "torch.utils.data.datapipes", "torch.testing", "torch.multiprocessing",
    "torch.distributed.elastic", "torch.distributed.launch", "torch.distributed.run",
    "torch.jit._serialization", "torch.jit.mobile", "torch._export", "torch.export",
    "numpy.lib.npyio", "numpy.lib._npyio_impl", "numpy.lib.format", "numpy.core._internal",
    "numpy._core._internal",
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
    *(("uuid", n) for n in ("_get_command_stdout", "_popen", "_find_mac",
                            "_find_mac_near_keyword", "_find_mac_under_heading",
                            "_ifconfig_getnode", "_ip_getnode", "_arp_getnode",
                            "_lanscan_getnode", "_netstat_getnode", "_unix_getnode", "getnode")),
    *(("logging", n) for n in ("FileHandler", "basicConfig", "config", "handlers")),
    ("torch.ops", "load_library"), ("torch._ops", "load_library"),
    ("torch.classes", "load_library"), ("torch._classes", "load_library"),
    ("torch.jit", "_load_for_lite_interpreter"),
    *(("numpy", n) for n in ("genfromtxt", "fromregex", "save", "savez", "savez_compressed",
                             "savetxt", "DataSource")),
})

#: Name prefixes that are dangerous in a module whose other names need not be: torch._C's
#: loaders of TorchScript and mobile modules, JIT internals and global state setters
#: (whole-model pickles hold plain functions of torch._C, such as ``torch._C._nn.gelu``).
DANGEROUS_PREFIXES: Final = {
    "torch._C": ("import_ir_module", "_import_ir_module", "_load_for_lite_interpreter",
                 "_load_mobile", "_jit_", "_set_", "_save", "_load", "CompilationUnit",
                 "_get_model_bytecode", "_backport", "_get_mobile_model", "_dlopen"),
}

#: Codec names ``_codecs.encode`` resolves without importing an ``encodings`` module
#: (normalised: lower case, ``-`` and spaces as ``_``): what picklers write for bytes.
STANDARD_CODECS: Final = frozenset({"latin1", "latin_1", "iso_8859_1", "iso8859_1", "l1",
                                    "utf_8", "utf8", "ascii", "us_ascii"})


def codec_is_standard(args: object) -> bool:
    """True when ``_codecs.encode(*args)`` names a standard codec (or none: UTF-8)."""
    if not isinstance(args, tuple) or len(args) < 2:
        return isinstance(args, tuple)
    codec = args[1]
    return isinstance(codec, str) and \
        codec.lower().replace("-", "_").replace(" ", "_") in STANDARD_CODECS

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
        inside bytes), ``numpy-object-array``, ``codec`` (``_codecs.encode`` with
        a codec outside the standard set), ``limit`` (a record not scanned
        because a :class:`~ptfile.Limits` ceiling was hit: dangerous, as what it
        holds is unknown), ``hazard`` (hash flooding, deep
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
    loaders : tuple of str
        The real loaders that would read what the finding is about
        (:data:`ptfile.scanning.loaders.LOADERS`); empty when it is about the file as
        a whole (its format, an archive anomaly every reader meets).
    file_offset : int or None
        The byte of the file that ``offset`` names, where the file holds it as it is:
        an opcode of a bare or legacy stream, of a *stored* ZIP record (the record's data
        offset plus ``offset``) or of a tar member; an archive header.  None where no
        byte of the file is it: a record that is compressed, a payload nested in a
        constant or a window, a file of a folder scanned as one checkpoint.  SARIF's
        ``region.byteOffset`` is this (:mod:`ptfile.scanning.sarif`).
    """

    kind: str
    verdict: Verdict
    location: str
    offset: int | None
    module: str = ""
    name: str = ""
    opcode: str = ""
    message: str = ""
    loaders: tuple[str, ...] = ()
    file_offset: int | None = None

    @property
    def qualname(self) -> str:
        """``module.name`` for globals, else the name."""
        return f"{self.module}.{self.name}" if self.module else self.name

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the verdict as its string value)."""
        out = asdict(self)
        out["verdict"] = self.verdict.value
        out["loaders"] = list(self.loaders)
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
        return {"path": self.source, "format": self.format, "verdict": self.verdict.value,
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
        or (module, name.split(".")[0]) in DANGEROUS_NAMES \
        or name.startswith(DANGEROUS_PREFIXES.get(module, ()))


def python3_name(module: str, name: str) -> tuple[str, str]:
    """The name CPython's unpickler imports for a Python 2 name (protocols 0-2, as
    ``fix_imports`` does through :mod:`_compat_pickle`); other names unchanged.

    Examples
    --------
    >>> python3_name("__builtin__", "long"), python3_name("copy_reg", "_reconstructor")
    (('builtins', 'int'), ('copyreg', '_reconstructor'))
    """
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[module, name]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


#: The names ``torch.save`` writes into every state dict (tensors, parameters, storages,
#: the common dtypes, ``OrderedDict``): a subset of torch's weights-only allowlist
#: (:data:`ptfile.allowlist.rebuild.SAFE_GLOBALS`; the tests check it is one), answered
#: without importing the allowlist, whose stand-ins import numpy.  :func:`_allowed` asks
#: the allowlist itself about every other name.
COMMON_ALLOWED: Final = frozenset({
    ("collections", "OrderedDict"), ("torch", "Size"), ("torch", "device"),
    ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"),
    ("torch._tensor", "_rebuild_from_type_v2"), ("torch.storage", "UntypedStorage"),
    *(("torch._utils", f"_rebuild_{n}") for n in ("tensor", "tensor_v2", "tensor_v3",
                                                   "parameter", "parameter_with_state")),
    *(("torch", f"{n}Storage") for n in ("Float", "Double", "Half", "BFloat16", "Long", "Int",
                                         "Short", "Char", "Byte", "Bool")),
    *(("torch", n) for n in ("float32", "float64", "float16", "bfloat16", "int64", "int32",
                             "int16", "int8", "uint8", "bool")),
})  # fmt: skip


def _allowed(module: str, name: str) -> bool:
    """``module.name`` is on torch's allowlist or in the registry of
    :func:`ptfile.add_safe_globals` (:func:`ptfile.allowlist.policy.find_allowed`).

    The registry only adds names to the allowlist, so a name of :data:`COMMON_ALLOWED`
    is allowed without importing it (a scan of a plain checkpoint starts without numpy);
    any other name imports the allowlist.
    """
    if (module, name) in COMMON_ALLOWED:
        return True
    from ..allowlist.policy import find_allowed  # the allowlist's stand-ins: numpy

    return find_allowed(module, name) is not None


def verdict_of(module: str, name: str) -> Verdict:
    """The verdict for a global ``module.name`` (tables first, then the allowlist).

    A dotted ``name`` is dangerous when any object along its attribute chain may
    be (:func:`_readings`): ``pathlib`` + ``os.system`` is ``os.system``.  A Python 2
    name is judged as written and as CPython (and torch) translate it
    (:func:`python3_name`): ``__builtin__.reduce`` is ``functools.reduce``.

    Examples
    --------
    >>> verdict_of("posix", "system"), verdict_of("torch", "FloatStorage")
    (<Verdict.DANGEROUS: 'dangerous'>, <Verdict.ALLOWED: 'allowed'>)
    >>> verdict_of("pathlib", "os.system")
    <Verdict.DANGEROUS: 'dangerous'>
    """
    names = {(module, name), python3_name(module, name)}
    if any(_dangerous(m, n) for pair in names for m, n in _readings(*pair)):
        return Verdict.DANGEROUS
    if _allowed(module, name) or (module, name) in TORCHSCRIPT_NAMES:
        return Verdict.ALLOWED
    return Verdict.UNKNOWN


def iter_dangerous(result: ScanResult) -> Iterator[Finding]:
    """The dangerous findings of ``result``, in order."""
    return (f for f in result.findings if f.verdict is Verdict.DANGEROUS)
