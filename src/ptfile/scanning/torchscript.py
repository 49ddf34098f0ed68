"""TorchScript archives as the scanner reports them: class references and ``code/``.

A TorchScript archive (``torch.jit.save``; ``torch.load`` hands it to
``torch.jit.load``) pickles its modules as ``__torch__.<path>.<Class>``:
TorchScript class references, which ``torch.jit.load`` resolves against the
archive's own ``code/`` and never imports from Python.  In such an archive they
are ``torchscript-type`` findings, allowed (``ptfile.load`` reads the archive's
tensors and constants too); in any other file they stay globals, ``unknown``.
``__torch__.torch.classes.<ns>.<Class>`` is the exception: a custom class
registered by native code, whose ``__setstate__`` ``torch.jit.load`` runs.  Those
of :data:`STANDARD_CLASS_NAMESPACES` (torch's own packed parameters) are allowed,
any other namespace is ``dangerous``.

``code/**/*.py`` is TorchScript source that ``torch.jit.load`` compiles and its
methods run.  :func:`judge_code` reads it as a language, never running it: it
parses the source with Python's :mod:`ast` (TorchScript's serialized source is
Python syntax), resolves every name the code refers to (called or not: a
function is a value, ``_0 = torch.save`` then ``_0(x, "f")`` writes a file) as
a dotted name, and judges those.  String literals, comments, and the methods and
attributes of values (``self.compile(x)``, ``(lin).forward(x)``) are not names
of the global scope, so they are never judged: a module may have a method
called ``open`` and print ``"os.system"``.

What serialized code names (torch 2.13's importer and frontend, checked on
archives ``torch.jit.save`` writes):

- ``torch.<op>`` and ``torch.autograd.<op>``: the operator ``aten::<op>``
  (longer ``torch`` names are ``unknown``); ``ops.<ns>.<op>``: ``<ns>::<op>``
  (``torch.ops`` does not compile in serialized code; it is judged like
  ``ops``).  Allowed, except the operators of :data:`DANGEROUS_OPS` (``save``
  writes any value to any path, ``from_file`` maps any file into a tensor: both
  run in torch 2.13; ``rpc_*`` reach the network; ``PythonOp`` calls Python)
  and any operator namespace outside :data:`STANDARD_OP_NAMESPACES`: those
  ops are registered by native or Python libraries (``debugprims``,
  ``c10d``, a model's own extension) and run their code.
- ``__torch__.<path>``: the archive's own classes and functions (allowed), and
  ``__torch__.torch.classes.<ns>.<Class>`` custom classes (as above).
- ``CONSTANTS.c<N>``, ``self`` and local variables, and the builtins of the
  frontend (:data:`BUILTIN_NAMES`: ``print``, ``annotate``, ``unchecked_cast``,
  ``uninitialized``, ``isinstance``, ``getattr(self, "0")``, ``fork``, ``range``,
  type names ...): allowed.
- A namespace used as a value (``t = torch``, ``a = ops.aten``,
  ``getattr(torch, "save")``: all three run ``save`` in torch 2.13) is
  ``dangerous``: what it is later called through cannot be seen by name.
  ``_C``, ``classes``, ``jit``, ``hub``, ``load_library``, ``load`` and the
  other parts of :data:`DANGEROUS_OPS` anywhere in a ``torch``/``ops`` name are
  ``dangerous``.
- Python's own ways out (:data:`DANGEROUS_NAMES`: ``open``, ``eval``,
  ``exec``, ``__import__``, ``os``, ``sys``, ``subprocess`` ...) and ``import``
  statements are ``dangerous``.  torch 2.13 refuses them as undefined values, so
  they cannot run there; they are reported because nothing else would put them
  in serialized code.  ``import __torch__`` and ``import __torch__.<path>`` (no
  alias) are what torch 1.3-1.4's printer wrote at the top of each file (torch's
  importer skips import lines): judged as the ``__torch__`` name they import.
- Any other global name is ``unknown``: torch refuses an undefined value, and
  ptfile does not guess which values a future torch defines.

Code that Python cannot parse, larger than
:attr:`~ptfile.limits.Limits.max_torchscript_code_bytes`, or nested beyond
Python's parser (``RecursionError``/``MemoryError``) is ``dangerous``:
torch.jit.load raises on what it cannot compile (and torch 2.13's recursive parser
kills the process on ~10^5 nested operators), but ptfile cannot tell what torch's
own lexer would read there.  Python reads line ends at least as eagerly
as torch's lexer (a lone ``\\r`` ends a line for Python, not torch; ``\\f``,
``\\v``, ``\\x1c``-``\\x1e``, NEL and U+2028 end none for either), so code hidden
from Python in a comment or string is hidden from torch too.

Allowed by design: code that computes with tensors, prints (``print`` writes to
the process's stdout), warns, raises, forks TorchScript closures and calls
torch's standard operators.
"""

from __future__ import annotations

import ast
import io
import tokenize
import warnings
from collections.abc import Iterator
from typing import Final

from ..limits import DEFAULT_LIMITS, Limits
from .verdicts import Finding, Verdict

__all__ = ["BUILTIN_NAMES", "DANGEROUS_NAMES", "DANGEROUS_OPS", "STANDARD_CLASS_NAMESPACES",
           "STANDARD_OP_NAMESPACES", "TORCHSCRIPT_PREFIX", "as_torchscript_type", "judge_code",
           "judge_name"]

#: The module prefix of TorchScript class references.
TORCHSCRIPT_PREFIX: Final = "__torch__"
#: Operator namespaces of torch's own computation (``ops.<ns>.<op>``).  Others
#: that torch 2.13 registers (``prims``, ``c10d``, ``debugprims``, ``inductor`` ...)
#: are Python kernels, collectives or compiler internals that no scripted model
#: calls; a namespace outside this set is a library's (``_caffe2`` too: torch 2.13
#: registers none).
#: The native kernels of torch's mobile and CPU backends are standard too: XNNPACK's
#: ``prepacked::linear_clamp_run``/``conv2d_clamp_run`` (what ``optimize_for_mobile``
#: writes), ``mkldnn``/``mkldnn_prepacked``/``mkl``/``onednn``, sparse and quantization
#: kernels, and the Vulkan and Metal prepacking ops of the mobile toolchains.
STANDARD_OP_NAMESPACES: Final = frozenset({
    "aten", "prim", "quantized", "_quantized", "profiler", "prepacked", "mkldnn",
    "mkldnn_prepacked", "mkl", "onednn", "sparse", "quantization", "vulkan_prepack",
    "metal_prepack"})
#: Custom-class namespaces torch registers for packed weights
#: (``torch.classes.quantized.LinearPackedParamsBase`` in a quantized model).
STANDARD_CLASS_NAMESPACES: Final = frozenset({"quantized", "rnn", "sparse", "mkldnn",
                                              "xnnpack", "vulkan", "metal"})
#: Operators (of any standard namespace) that touch files, the network or Python.
DANGEROUS_OPS: Final = frozenset({
    "save", "load", "from_file", "load_library", "_load_for_lite_interpreter",
    "_load_for_mobile", "rpc_async", "rpc_sync", "rpc_remote", "dist_backward",
    "get_gradients", "PythonOp", "IgnoredPythonOp"})
#: Parts of a ``torch``/``ops`` name that leave TorchScript's operators.
_DANGEROUS_PARTS: Final = DANGEROUS_OPS | {"_C", "classes", "jit", "hub", "package",
                                           "utils", "library", "cpp_extension"}
#: Global names that would reach files, processes, the network or Python itself.
DANGEROUS_NAMES: Final = frozenset({
    "open", "eval", "exec", "compile", "__import__", "breakpoint", "globals", "locals",
    "vars", "setattr", "delattr", "__builtins__", "builtins", "os", "sys", "subprocess",
    "posix", "nt", "shutil", "socket", "importlib", "ctypes", "pickle", "io", "pathlib",
    "rpc_async", "rpc_sync", "rpc_remote", "exit", "quit", "memoryview"})
#: Names serialized code uses that the importer or frontend define (never shadowed:
#: torch's printer renames a local called ``ops``, ``CONSTANTS``, ``fork`` ...).
_RESERVED: Final = frozenset({"torch", "ops", "CONSTANTS", TORCHSCRIPT_PREFIX, "fork",
                              "awaitable", "uninitialized", "inf", "nan", "infj", "nanj"})
#: Global names torch's frontend defines and serialized code uses: builtins, special
#: forms, class bases and type names.
BUILTIN_NAMES: Final = _RESERVED - {"torch", "ops", TORCHSCRIPT_PREFIX} | frozenset({
    "print", "tuple", "float", "complex", "int", "bool", "str", "getattr", "hasattr",
    "isinstance", "_to_tensor", "len", "hex", "oct", "round", "hash", "id", "min", "max",
    "abs", "all", "any", "divmod", "sum", "list", "dict", "ord", "chr", "bin", "pow",
    "range", "zip", "enumerate", "rangelist", "sorted", "annotate", "unchecked_cast",
    "AssertionError", "Module", "object", "Enum", "NamedTuple", "Interface",
    "ModuleInterface", "Tensor", "List", "Dict", "Optional", "Tuple", "Union", "Any",
    "Future", "Await", "RRef", "NoneType", "Final", "Device", "Stream", "Generator",
    "Storage", "Layout", "ScalarType", "MemoryFormat", "QScheme", "number", "Scalar",
    "Capsule", "__annotations__", "__parameters__", "__buffers__", "__constants__"})
_ATTR_FUNCTIONS: Final = frozenset({"getattr", "hasattr"})


def _longest_statement(text: str, most: int) -> int | None:
    """Tokens in the longest logical line of ``text`` (counting stops past ``most``), or
    None when the tokenizer refuses it.  Python's parser recurses once per trailer or
    operator of a statement, in C: this bounds it before :func:`ast.parse` runs.  A NUL
    character is refused before tokenizing: Python 3.13's tokenizer fails on one with a
    SystemError (an exception set while returning a token), and every parser refuses it."""
    if "\0" in text:
        return None
    longest = count = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                longest, count = max(longest, count), 0
            elif token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT,
                                    tokenize.DEDENT):
                count += 1
                if count > most:
                    return count
    except (tokenize.TokenError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return max(longest, count)


def judge_code(text: str, limits: Limits | None = None) -> tuple[Verdict, str]:
    """The verdict and message for one ``code/`` source file (rules: the module doc).

    Examples
    --------
    >>> judge_code("def forward(self, x):\\n  return torch.relu(x)\\n")[0]
    <Verdict.ALLOWED: 'allowed'>
    >>> judge_code("def open(self, x):\\n  print('os.system')\\n  return x\\n")[0]
    <Verdict.ALLOWED: 'allowed'>
    >>> judge_code("def forward(self):\\n  return torch.ops.evil.run()\\n")[0]
    <Verdict.DANGEROUS: 'dangerous'>
    """
    most = (limits or DEFAULT_LIMITS).max_torchscript_code_bytes
    what = "TorchScript code that torch.jit.load compiles"
    if len(text) > most:
        return Verdict.DANGEROUS, (f"{what}: {len(text)} characters, over "
                                   f"max_torchscript_code_bytes ({most}); not read")
    longest = _longest_statement(text, (limits or DEFAULT_LIMITS).max_torchscript_statement_tokens)
    if longest is None or longest > (limits or DEFAULT_LIMITS).max_torchscript_statement_tokens:
        return Verdict.DANGEROUS, (f"{what}, which ptfile cannot parse safely: a "
                                   "statement of more than max_torchscript_statement_tokens "
                                   "tokens, or source the tokenizer refuses")
    try:
        with warnings.catch_warnings():  # invalid escapes: a verdict, not a warning filter's
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
        nodes = list(ast.walk(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        # torch.jit.load raises on source it cannot compile; ptfile cannot say what
        # torch's own lexer would make of it, so it is not let through.
        return Verdict.DANGEROUS, (f"{what}, which ptfile cannot parse "
                                   f"({type(e).__name__}: {str(e)[:100]})")
    methods = ", ".join(dict.fromkeys(
        n.name for n in nodes if isinstance(n, ast.FunctionDef))) or "none"
    dangerous: dict[str, None] = {}
    unknown: dict[str, None] = {}
    for name, verdict in _judged_names(nodes):
        if verdict is Verdict.DANGEROUS:
            dangerous[name] = None
        elif verdict is Verdict.UNKNOWN:
            unknown[name] = None
    if dangerous:
        return Verdict.DANGEROUS, (f"{what} (methods: {methods[:200]}) refers to "
                                   f"{', '.join(dangerous)[:300]}")
    if unknown:
        return Verdict.UNKNOWN, (f"{what} (methods: {methods[:200]}) names "
                                 f"{', '.join(unknown)[:300]}, which TorchScript does "
                                 "not define")
    return Verdict.ALLOWED, (f"{what} (methods: {methods[:300]}); it calls only TorchScript "
                             "builtins and standard operators")


def _judged_names(nodes: list[ast.AST]) -> Iterator[tuple[str, Verdict]]:
    """Each global name the code refers to, dotted, with its verdict."""
    bound = _bound_names(nodes)
    inner: set[int] = set()  # Name/Attribute nodes inside a longer dotted name
    for node in nodes:
        if isinstance(node, ast.Attribute):
            inner.add(id(node.value))
        elif isinstance(node, ast.Import):
            yield from _judged_import(node, bound)
        elif isinstance(node, ast.ImportFrom):
            yield "an import statement", Verdict.DANGEROUS
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in _ATTR_FUNCTIONS and node.func.id not in bound and node.args:
            # getattr(obj, "name"): the name obj.name, when obj is a global name.
            parts = _dotted(node.args[0])
            if parts is not None and (parts[0] in _RESERVED or parts[0] not in bound):
                inner.add(id(node.args[0]))
                field = node.args[1] if len(node.args) > 1 else None
                if isinstance(field, ast.Constant) and isinstance(field.value, str):
                    name = [*parts, field.value]
                    yield ".".join(name), _judge(name, bound)
                else:
                    yield f"{node.func.id}({'.'.join(parts)}, ...)", Verdict.DANGEROUS
    for node in nodes:
        if id(node) in inner or not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        parts = _dotted(node)
        if parts is not None:
            yield ".".join(parts), _judge(parts, bound)


def _judged_import(node: ast.Import, bound: set[str]) -> Iterator[tuple[str, Verdict]]:
    """``import __torch__.<path>``: what torch 1.3-1.4's printer wrote at the top of each
    code file, judged as the ``__torch__`` name it imports (torch's importer skips import
    lines unread; they bind nothing, so later names are judged as written).  Any other
    import (``import os``, an alias) is dangerous."""
    for alias in node.names:
        parts = alias.name.split(".")
        if alias.asname is None and parts[0] == TORCHSCRIPT_PREFIX:  # a namespace: bound to
            yield f"import {alias.name}", (  # nothing, so not "taken as a value"
                _judge(parts, bound) if len(parts) > 3 else Verdict.ALLOWED)
        else:
            yield f"import {alias.name}", Verdict.DANGEROUS


def judge_name(dotted: str) -> Verdict:
    """The verdict of one global dotted name of serialized code (``ops.aten.add``,
    ``__torch__.torch.classes.quantized.X``), no local variable bound (rules: the module
    doc).

    Examples
    --------
    >>> judge_name("ops.prepacked.linear_clamp_run"), judge_name("ops.aten.save")
    (<Verdict.ALLOWED: 'allowed'>, <Verdict.DANGEROUS: 'dangerous'>)
    """
    return _judge(dotted.split("."), set())


def _judge(parts: list[str], bound: set[str]) -> Verdict:
    """The verdict of one whole dotted global name (not a prefix of a longer one)."""
    root = parts[0]
    if root not in _RESERVED and root in bound:
        return Verdict.ALLOWED  # a local variable, its attributes and methods
    if root == "torch" and len(parts) > 1 and parts[1] == "ops":
        parts, root = parts[1:], "ops"
    if root == "ops":
        if any(p in _DANGEROUS_PARTS for p in parts[1:]):
            return Verdict.DANGEROUS
        if len(parts) < 3:  # ops, ops.<ns>: a namespace taken as a value
            return Verdict.DANGEROUS
        return Verdict.ALLOWED if parts[1] in STANDARD_OP_NAMESPACES else Verdict.DANGEROUS
    if root == "torch":
        # torch.<op> is aten::<op>, and so is torch.autograd.<op> (the frontend
        # reads torch.autograd as torch); longer names are not what torch writes.
        rest = parts[1:]
        while rest and rest[0] == "autograd":
            rest = rest[1:]
        if not rest or any(p in _DANGEROUS_PARTS for p in rest):
            return Verdict.DANGEROUS
        return Verdict.ALLOWED if len(rest) == 1 else Verdict.UNKNOWN
    if root == TORCHSCRIPT_PREFIX:
        if parts[1:3] != ["torch", "classes"][:len(parts) - 1]:
            return Verdict.ALLOWED  # the archive's own classes and functions
        if len(parts) < 4:  # __torch__, __torch__.torch(.classes) as a value
            return Verdict.DANGEROUS
        return Verdict.ALLOWED if parts[3] in STANDARD_CLASS_NAMESPACES else \
            Verdict.DANGEROUS
    if root in DANGEROUS_NAMES:
        return Verdict.DANGEROUS
    if root in BUILTIN_NAMES:
        return Verdict.ALLOWED
    return Verdict.UNKNOWN


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None when it is not rooted at a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _bound_names(nodes: list[ast.AST]) -> set[str]:
    """Names the code binds anywhere: arguments, assignment and loop targets,
    functions and classes.  One set for the whole file: a name bound in one
    function and used unbound in another is an undefined value to torch."""
    bound: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return bound


def as_torchscript_type(f: Finding) -> Finding:
    """A ``__torch__.*`` global of a TorchScript archive: a class reference that
    torch.jit.load resolves against the archive's code, not a Python import
    (:mod:`ptfile.scanning.torchscript`); a custom class outside
    :data:`STANDARD_CLASS_NAMESPACES` is native code, dangerous."""
    if f.kind != "global" or f.verdict is not Verdict.UNKNOWN or \
            f.module.split(".")[0] != TORCHSCRIPT_PREFIX:
        return f
    parts = f"{f.module}.{f.name}".split(".")
    if parts[1:3] == ["torch", "classes"] and (
            len(parts) < 5 or parts[3] not in STANDARD_CLASS_NAMESPACES):
        return Finding("torchscript-type", Verdict.DANGEROUS, f.location, f.offset, f.module,
                       f.name, f.opcode, f"custom class {f.module}.{f.name}: registered by a "
                       "native library, torch.jit.load runs its __setstate__")
    return Finding("torchscript-type", Verdict.ALLOWED, f.location, f.offset, f.module, f.name,
                   f.opcode, f"TorchScript class {f.module}.{f.name}: torch.jit.load resolves "
                   "it against the archive's code/, it imports nothing")
