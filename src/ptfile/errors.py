"""The whole exception hierarchy of ptfile, and nothing else.

The contract
------------
For any input bytes, :func:`ptfile.load` (and every other reader in ptfile)
either succeeds or raises a :class:`PtfileError`.  Damage is a
:class:`FormatError` (or :class:`LimitExceededError` when a ceiling of
:class:`ptfile.Limits` is hit), policy is :class:`UnsafeGlobalError`, valid
files ptfile cannot represent are :class:`UnsupportedFeatureError`.  No
``struct.error``, ``IndexError``, ``KeyError``, ``EOFError`` or
``UnicodeDecodeError`` may escape; low-level exceptions are caught at the layer
boundary and re-raised with the offset and member being read, chained with
``from``.

Every class also inherits the builtin exception a caller would already catch
(``ValueError`` for damage, ``pickle.UnpicklingError`` for pickle problems,
``NotImplementedError`` for unsupported features, ``TypeError`` for objects
``save`` cannot write), so code written for ``torch.load`` keeps working.

A message that shows a value read from a file shows it through :func:`brief`, never
``repr``: the repr of a tuple of shared tuples takes ``2**levels`` steps (60 levels fit
in 250 bytes) and that of a 1 GB string allocates a gigabyte, before any truncation.
"""

from __future__ import annotations

import pickle
import reprlib

__all__ = [
    "ArchiveError",
    "FormatError",
    "LimitExceededError",
    "PickleStreamError",
    "PtfileError",
    "PtfileWarning",
    "RemoteError",
    "SaveError",
    "StorageError",
    "UnknownFormatError",
    "UnsafeGlobalError",
    "UnsupportedFeatureError",
    "brief",
]


class PtfileError(Exception):
    """Base of everything ptfile raises on purpose."""


class FormatError(PtfileError, ValueError):
    """The input is not a well-formed checkpoint.

    ``offset`` is the byte offset (in the file, or in ``member`` when given)
    where the problem was found; ``member`` the archive record being read.
    """

    def __init__(self, message: str, *, offset: int | None = None, member: str | None = None):
        where = []
        if member is not None:
            where.append(f"record {member!r}")
        if offset is not None:
            where.append(f"offset {offset:#x}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.offset = offset
        self.member = member


class UnknownFormatError(FormatError):
    """No reader recognised the leading bytes of the input."""


class ArchiveError(FormatError):
    """ZIP damage: end records, central directory, local headers, bounds, overlaps."""


class PickleStreamError(FormatError, pickle.UnpicklingError):
    """A pickle stream is malformed: unknown opcode, stack underflow, bad memo, truncation."""


class StorageError(FormatError):
    """A storage record is missing or short, or a tensor view does not fit its storage."""


class UnsafeGlobalError(PtfileError, pickle.UnpicklingError):
    """A pickle names a global outside the allowlist (policy, not damage)."""

    def __init__(self, message: str, *, module: str, name: str, offset: int | None = None):
        super().__init__(message)
        self.module = module
        self.name = name
        self.offset = offset


class LimitExceededError(PtfileError, ValueError):
    """A ceiling of :class:`ptfile.Limits` was hit before anything was allocated."""

    def __init__(self, limit: str, maximum: int, actual: int, what: str = ""):
        text = f"{what}: " if what else ""
        super().__init__(
            f"{text}{actual} exceeds Limits.{limit} = {maximum}; "
            f"pass ptfile.Limits({limit}=...) to raise it"
        )
        self.limit = limit
        self.maximum = maximum
        self.actual = actual


class UnsupportedFeatureError(PtfileError, NotImplementedError):
    """The input is well-formed but uses something ptfile cannot represent."""


class RemoteError(PtfileError, OSError):
    """A remote source (an fsspec URL) could not be read as asked: not found (404),
    forbidden (403), a server error that retries did not cure, or a response of the
    wrong length.  ``url`` and ``status`` (the HTTP status, when there is one) say which."""

    def __init__(self, message: str, *, url: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.url, self.status = url, status


class SaveError(PtfileError, TypeError):
    """``save`` was given an object (or a combination of objects) it cannot write."""


class PtfileWarning(UserWarning):
    """Oddities ptfile tolerates, as torch does (e.g. a CRC mismatch)."""


#: How :func:`brief` shows a value: a few items of each container, a few levels deep.
_BRIEF: reprlib.Repr = reprlib.Repr()
_BRIEF.maxlevel = 3
_BRIEF.maxtuple = _BRIEF.maxlist = _BRIEF.maxarray = _BRIEF.maxdict = 4
_BRIEF.maxset = _BRIEF.maxfrozenset = _BRIEF.maxdeque = 4
_BRIEF.maxstring = _BRIEF.maxother = _BRIEF.maxlong = 80


def add_note(exc: BaseException, note: str) -> None:
    """Add context to an error on its way out (``add_note`` is new in Python 3.11; on 3.10
    the note goes to ``__notes__`` as PEP 678 defines it, where callers read it)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    try:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, TypeError):  # an exception type that refuses new attributes
        pass


def brief(value: object, limit: int = 80) -> str:
    """A bounded repr of an untrusted value for a message: at most ``limit`` characters,
    built in bounded time and memory (:mod:`reprlib`: a few items per container, three
    levels; the repr of a shared-tuple chain or a huge string is never built whole).

    Examples
    --------
    >>> brief((1, "two", [3.0]))
    "(1, 'two', [3.0])"
    >>> t = ()
    >>> for _ in range(60):
    ...     t = (t, t)
    >>> brief(t)
    '(((...), (...)), ((...), (...)))'
    """
    try:
        text = _BRIEF.repr(value)
    except Exception:  # noqa: BLE001 - an odd object's own __repr__ failing
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."
