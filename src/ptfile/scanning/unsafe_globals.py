"""``get_unsafe_globals_in_checkpoint``: which globals :func:`ptfile.load` would refuse.

torch 2.13's function of that name disassembles ``data.pkl`` of a ``torch.save``
archive and returns the ``"module.name"`` of every ``GLOBAL`` that is neither on
its weights-only allowlist nor added with ``add_safe_globals``, as a list made
from a set (so in no particular order).  ptfile answers the same question from
its scanner (:func:`ptfile.scan`) and its strict policy
(:func:`ptfile.allowlist.policy.find_allowed`), running nothing:

=======================  ===========================  ==========================================
file                     torch                        ptfile
=======================  ===========================  ==========================================
ZIP (``torch.save``)     the unsafe ``GLOBAL`` names  the same names, in the order the pickle
                         of ``data.pkl``              first names them
clean ZIP                ``[]``                       ``[]``
``STACK_GLOBAL``         ``UnpicklingError``          resolved statically (the scanner's
(protocol 4 and up)      (unsupported opcode)         symbolic stack); a name computed while
                                                      unpickling is listed as the scanner
                                                      shows it (``os.<result of ...>``)
TorchScript              ``ValueError``               :class:`FormatError` (a ValueError)
PT2 (``torch.export``)   ``RuntimeError`` (no         ``[]``: a ``.pt2`` has no ``.pkl`` record
                         ``data.pkl``)                (its weights are raw records; the nested
                                                      archives of pickled weights are not listed)
legacy (< 1.6), tar      ``ValueError``               the unsafe names of every pickle the
                                                      loader unpickles (torch's load refuses
                                                      the same names in them)
anything else            ``ValueError``               :class:`FormatError`
=======================  ===========================  ==========================================

Names are returned as torch returns them: a Python 2 name is translated as torch's
weights-only unpickler translates it, whatever the protocol (``__builtin__.long`` is
``builtins.int``, ``copy_reg._reconstructor`` is ``copyreg._reconstructor``), through
:data:`TORCH_NAME_MAPPING` and :data:`TORCH_IMPORT_MAPPING`, the part of CPython's
:mod:`_compat_pickle` that torch 2.13 adopts (``torch._utils``); a name of the rest of
``_compat_pickle`` (``cPickle``, ``commands``...) is returned as written, as torch does.

A name in a module torch never allows (``os``, ``sys``, ``posix``, ``nt``) is listed
even when registered with :func:`ptfile.add_safe_globals`: ptfile's load refuses it
then too (torch's function leaves it out, although torch's load refuses it).
Nested pickles (bytes inside the pickle that are pickles themselves) are not the
loader's business: :func:`ptfile.scan` reports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from .._io.local import FileLike
from .._io.remote import StorageOptions
from ..allowlist.policy import find_allowed
from ..errors import FormatError
from ..limits import Limits
from .scanner import scan
from .verdicts import Finding, python3_name

__all__ = ["TORCH_IMPORT_MAPPING", "TORCH_NAME_MAPPING", "get_unsafe_globals_in_checkpoint"]

#: The Python 2 modules torch's weights-only unpickler renames (to :mod:`_compat_pickle`'s
#: names), in every protocol: ``torch._utils.IMPORT_MAPPING``'s keys in torch 2.13.
TORCH_IMPORT_MAPPING: Final = frozenset({
    "__builtin__", "copy_reg", "Queue", "repr", "_abcoll", "UserDict", "UserList",
    "UserString", "whichdb", "StringIO", "cStringIO"})
#: The Python 2 names torch renames one by one: ``torch._utils.NAME_MAPPING``'s keys.
TORCH_NAME_MAPPING: Final = frozenset({
    *(("__builtin__", n) for n in ("xrange", "reduce", "intern", "unichr", "unicode", "long",
                                   "basestring")),
    *(("itertools", n) for n in ("izip", "imap", "ifilter", "ifilterfalse", "izip_longest")),
    ("UserDict", "IterableUserDict"), ("UserList", "UserList"), ("UserString", "UserString"),
    ("exceptions", "StandardError"), ("UserDict", "UserDict")})


def torch_name(module: str, name: str) -> tuple[str, str]:
    """``module.name`` as torch's weights-only unpickler reads a ``GLOBAL`` of it.

    Examples
    --------
    >>> torch_name("__builtin__", "long"), torch_name("cPickle", "loads")
    (('builtins', 'int'), ('cPickle', 'loads'))
    """
    if (module, name) in TORCH_NAME_MAPPING or module in TORCH_IMPORT_MAPPING:
        return python3_name(module, name)
    return module, name


def _top_level(location: str) -> bool:
    return " > " not in location


def _zip_object_pickle(location: str) -> bool:
    """``<folder>/data.pkl``: the one pickle torch's function (and load) reads."""
    folder, _, name = location.partition("/")
    return bool(folder) and name == "data.pkl" and _top_level(location)


def _stream_pickle(location: str) -> bool:
    """``stream#N``: the legacy format's consecutive pickles (torch unpickles all five)."""
    return location.startswith("stream#") and _top_level(location)


def _tar_pickle(location: str) -> bool:
    """``tar:<member>``: every pickle of the pre-0.4 tar format's members."""
    return location.startswith("tar:") and _top_level(location)


#: The scanner's format → which of its locations hold pickles that the loader unpickles.
_LOADED: Final[dict[str, Callable[[str], bool]]] = {
    "zip": _zip_object_pickle,
    "legacy": _stream_pickle,
    "tar": _tar_pickle,
}


def _unsafe(finding: Finding) -> bool:
    """Whether the strict policy refuses the global of ``finding``, named as torch does."""
    return find_allowed(*torch_name(finding.module, finding.name)) is None


def get_unsafe_globals_in_checkpoint(f: FileLike, *, limits: Limits | None = None,
                                     storage_options: StorageOptions = None) -> list[str]:
    """The globals of a checkpoint that :func:`ptfile.load` would refuse, as torch's function.

    Reads the pickles statically (:func:`ptfile.scan`): nothing is imported or
    run.  A name is unsafe when it is neither on torch's weights-only allowlist
    nor added with :func:`ptfile.add_safe_globals` / :func:`ptfile.safe_globals`.

    Parameters
    ----------
    f
        A path, bytes, a binary file object, or a URL (read by range requests:
        its pickles, never the storages).
    limits
        Ceilings for untrusted input.
    storage_options
        For a URL: fsspec's options for its backend.

    Returns
    -------
    list of str
        ``"module.name"`` strings, each once, in the order the file first names
        them (torch returns the same names in no particular order); ``[]`` for a
        clean file.

    Raises
    ------
    FormatError
        ``f`` is not a checkpoint of ``torch.save`` (a TorchScript archive,
        or an unknown format): a ValueError, as torch raises; or a ZIP that torch's
        loaders read as two kinds (refused as :func:`ptfile.detect_format` refuses it).

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save({"w": np.zeros(2, "float32")}, buf)
    >>> ptfile.get_unsafe_globals_in_checkpoint(buf.getvalue())
    []
    """
    result = scan(f, limits=limits, storage_options=storage_options)
    ambiguous = next((x for x in result.findings
                      if x.name == "ambiguous-kind" and x.location == "archive"), None)
    if ambiguous is not None:  # refused as detect_format refuses it, with its message
        raise FormatError(ambiguous.message)
    loaded = _LOADED.get(result.format)
    if loaded is None:
        kind = "a TorchScript archive (torch.jit.save)" if result.format == "torchscript" \
            else f"in the {result.format} format"
        raise FormatError(f"expected a checkpoint written by torch.save, but the file is {kind}; "
                          "ptfile.scan(f) lists the globals of any file")
    return list(dict.fromkeys(".".join(torch_name(x.module, x.name)) for x in result.findings
                              if x.kind == "global" and loaded(x.location) and _unsafe(x)))
