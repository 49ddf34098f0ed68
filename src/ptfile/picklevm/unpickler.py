"""Restricted unpickling: CPython's C unpickler behind an exact pre-check.

Design (decided by measurement)
-------------------------------
Pickles are executed by CPython's C unpickler (``pickle.Unpickler``).  On a
``data.pkl`` of 100,000 tensors written by ``torch.save`` (10.9 MB, 3.0
million opcodes) it takes 0.1 s with trivial callbacks, read through a
buffered reader (with ``peek``, the C unpickler prefetches 128 KiB at a time;
from a ``BytesIO`` it calls ``read`` for every opcode and takes twice as
long); a machine written in Python is several times slower
(``pickletools.genops``, which only decodes the opcodes, already takes 2.75 s).  It is restricted by two hooks: ``find_class``, the caller's
allowlist, resolves every global (``GLOBAL``, ``STACK_GLOBAL``, ``INST``), and
``persistent_load`` resolves persistent ids.  They are the only way into
code: the calling opcodes (``REDUCE``, ``NEWOBJ``, ``NEWOBJ_EX``, ``INST``,
``OBJ``) and ``BUILD`` only ever touch objects that the stream built from
data or that the hooks (and the calls they allowed) returned.

The C unpickler is not memory-bounded, though.  The nine bytes
``80 02 4E 72 00 E1 F5 05 2E`` (``LONG_BINPUT 100000000``) make it allocate
and zero a 1.5 GB memo table, and ``BINBYTES``, ``BINBYTES8``,
``BINUNICODE8`` and ``BYTEARRAY8`` allocate their declared length (up to
2**64) before reading it.  So every stream first passes
:func:`~ptfile.picklevm.check_stream`, an exact non-executing walk (rules in
:mod:`ptfile.picklevm.lexer`).  Its fast gear takes 0.09 s on the pickle
above (a plain Python loop over the opcodes takes 1.3 s).  A stream that passes makes the C unpickler allocate at
most a constant times its length, plus what the callbacks allocate.  Only
MARK nesting is limited, not the depth of the object graph: ``]`` n times then
``a`` n - 1 times builds a list nested n deep, so code that walks the result
recursively must expect that.

Errors: a :class:`~ptfile.errors.PtfileError` raised by a callback propagates
unchanged; anything else out of the C unpickler (``UnpicklingError``,
``EOFError``, ``ValueError``, ``TypeError``, ``KeyError``, ``AttributeError``,
``UnicodeDecodeError``, ``MemoryError``, ...) becomes a
:class:`~ptfile.errors.PickleStreamError` that names it and chains it.  Its
offset comes from a second run up to the failure through an unbuffered
reader, which knows exactly where the unpickler stopped.

What the caller's objects are exposed to
----------------------------------------
The stream can only *call* what ``find_class`` and ``persistent_load`` return
(and what those calls return): ``REDUCE``, ``NEWOBJ``, ``NEWOBJ_EX``,
``INST`` and ``OBJ`` call an object from the stack.  But ``BUILD`` also works
on any object on the stack, including the very objects ``find_class``
returned: it calls their ``__setstate__(state)`` when they have one (frozen
slotted dataclasses do), else updates their ``__dict__`` (functions have one)
and sets the attributes named in a slot-state dict (a function's
``__defaults__``, a class's attributes).  ``APPEND``/``APPENDS``/``SETITEM``/``SETITEMS``/
``ADDITEMS`` call ``append``/``extend``/``__setitem__``/``add`` on objects
that are not a list/dict/set.  Such changes to shared, module-level objects
outlive the load.  ``find_class`` MUST therefore return objects for which
that is harmless: builtin functions and classes (immutable), per-load copies,
or instances of a slotted class without ``__setstate__``, ``__dict__`` and
``__setattr__``.

A callback that can only make its value from the ``BUILD`` state that follows
(numpy's arrays) hands out a placeholder instead and registers it
(:mod:`ptfile.picklevm.deferred`); :func:`unpickle` puts the values in place
once the stream is read.

``EXT1``/``EXT2``/``EXT4`` are refused: the C unpickler looks their code up in
``copyreg``'s process-wide extension cache *before* calling ``find_class``, so
a code resolved once by any unrestricted unpickler bypasses the allowlist, and
the object ``find_class`` returns for a code is stored in that global cache.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any, Final

from ..errors import PickleStreamError, PtfileError, UnsupportedFeatureError
from ..limits import DEFAULT_LIMITS, Limits, applied
from ._walk import Buffer
from .deferred import collecting, substitute
from .hazards import run_unpickler
from .lexer import StreamInfo, check_stream

__all__ = ["unpickle"]

#: Buffer of the reader the C unpickler reads from (it peeks 128 KiB ahead).
_PREFETCH_BYTES: Final = 1 << 18


class _RestrictedUnpickler(pickle.Unpickler):
    """The C unpickler, with ``find_class`` delegated to the caller."""

    def __init__(
        self,
        file: io.BufferedIOBase,
        find_class: Callable[[str, str], Any],
        persistent_load: Callable[[Any], Any] | None,
        encoding: str,
        errors: str,
    ) -> None:
        # buffers=(): out-of-band NEXT_BUFFER fails cleanly ("not enough buffers").
        super().__init__(file, encoding=encoding, errors=errors, buffers=())
        self._find_class = find_class
        if persistent_load is not None:
            # The C unpickler calls this attribute directly; a method would add a
            # Python frame per persistent id (4 ms per 100,000).  Without it a
            # persistent id is an UnpicklingError.
            self.persistent_load = persistent_load  # type: ignore[method-assign]

    def find_class(self, module: str, name: str) -> Any:
        """Resolve ``GLOBAL``/``STACK_GLOBAL``/``INST`` names through the caller's allowlist."""
        return self._find_class(module, name)


def _checked_stream(data: Buffer, limits: Limits, start: int) -> tuple[bytes, StreamInfo]:
    """The bytes of the stream at ``start``, checked by :func:`check_stream`."""
    info = check_stream(data, limits, start=start)
    if isinstance(data, bytes):
        whole = info.start == 0 and info.end == len(data)
        return (data if whole else data[info.start:info.end]), info
    # A mutable buffer (or a shared mapping) may change after the check: what is
    # unpickled is a copy, so the copy is what must pass.
    stream = bytes(memoryview(data).cast("B")[start:info.end])
    copy = check_stream(stream, limits)
    ext = None if copy.ext_offset is None else start + copy.ext_offset
    return stream[:copy.end], StreamInfo(start, start + copy.end, copy.protocol,
                                         copy.max_depth, ext)


def unpickle(
    data: Buffer,
    *,
    find_class: Callable[[str, str], Any],
    persistent_load: Callable[[Any], Any] | None,
    limits: Limits = DEFAULT_LIMITS,
    encoding: str = "ASCII",
    errors: str = "strict",
    start: int = 0,
    hash_work: bool = False,
) -> tuple[Any, int]:
    """Unpickle the stream at ``data[start:]``, resolving globals through ``find_class``.

    The stream must first pass :func:`~ptfile.picklevm.check_stream`; then
    CPython's C unpickler runs it.  Bytes after ``STOP`` are ignored.

    Parameters
    ----------
    data : bytes, bytearray or memoryview
        Holds the pickle at ``start``.
    find_class : callable
        ``find_class(module, name)`` for every ``GLOBAL``, ``STACK_GLOBAL`` and
        ``INST``, with the names exactly as in the stream (Python 2 names such
        as ``__builtin__`` are not mapped).  Return the object to use, or raise
        (typically :class:`~ptfile.errors.UnsafeGlobalError`).  See the module
        docstring for what the stream can do to the returned objects.
    persistent_load : callable or None
        Called with each persistent id; None makes persistent ids an error.
    limits : Limits
        Ceilings applied by the pre-check, and the :func:`ptfile.limits.active`
        ones while the callbacks run.
    encoding, errors : str
        How Python 2 ``str`` objects are decoded (as in :func:`pickle.loads`;
        ``encoding="bytes"`` keeps them as bytes).
    start : int
        Offset of the first opcode.

    Returns
    -------
    object, int
        The unpickled object and the offset just after ``STOP``.

    Raises
    ------
    PickleStreamError
        The stream is malformed, or unpickling it failed (the original
        exception is chained as ``__cause__``).
    LimitExceededError
        A ceiling of ``limits`` was hit.
    UnsupportedFeatureError
        The stream uses ``EXT1``/``EXT2``/``EXT4``.
    PtfileError
        Whatever :class:`~ptfile.errors.PtfileError` the callbacks raise, unchanged.

    Notes
    -----
    ``bytes`` are unpickled in place.  Other buffers are checked, copied, and
    the copy checked again, as they may change in between.

    Examples
    --------
    >>> import pickle
    >>> allowed = {("builtins", "set"): set}
    >>> unpickle(pickle.dumps({1, 2}, 3), find_class=lambda module, name: allowed[module, name],
    ...          persistent_load=None)
    ({1, 2}, 34)
    """
    stream, info = _checked_stream(data, limits, start)
    if info.ext_offset is not None:
        raise UnsupportedFeatureError(
            f"EXT opcode at offset {info.ext_offset:#x}: extension codes resolve through "
            "copyreg's process-wide cache, which bypasses find_class")
    # A buffered reader has peek(): the C unpickler then prefetches 128 KiB at a time
    # instead of calling read() for every opcode's argument (2x faster on big streams).
    file = io.BufferedReader(io.BytesIO(stream), _PREFETCH_BYTES)
    unpickler = _RestrictedUnpickler(file, find_class, persistent_load, encoding, errors)
    try:
        # Deep tuples make hashing recurse in C: give the C unpickler the stack they need.
        # The callbacks read ``limits`` (max_ndim) as the active ones.
        with applied(limits), collecting() as pending:
            root = run_unpickler(unpickler.load, stream, hash_work=hash_work)
            # Placeholders a callback deferred (numpy arrays): swapped for their values.
            return (substitute(root, pending) if pending else root), info.end
    except PtfileError:
        raise
    except Exception as exc:  # the C unpickler's and the callbacks' exception zoo
        where = _failure_offset(stream, find_class, persistent_load, encoding, errors)
        raise PickleStreamError(f"unpickling failed: {type(exc).__name__}: {exc!s:.300}",
                                offset=info.start + (file.tell() if where is None else where)
                                ) from exc


def _failure_offset(stream: bytes, find_class: Callable[[str, str], Any],
                    persistent_load: Callable[[Any], Any] | None, encoding: str,
                    errors: str) -> int | None:
    """Where the C unpickler stops on ``stream``, read without prefetching (so exactly).

    The buffered reader only knows how far the unpickler's prefetches went; a
    second run up to the failure, reading opcode by opcode, finds the offset.
    """
    file = io.BytesIO(stream)
    try:
        run_unpickler(_RestrictedUnpickler(file, find_class, persistent_load, encoding,
                                           errors).load, stream)
    except Exception:  # noqa: BLE001 - the failure we are locating
        return file.tell()
    return None
