"""The one inflater of ZIP members (APPNOTE 4.4.5, method 8: raw deflate), bounded.

Both readers of an archive inflate here: :meth:`ZipReader.read
<ptfile.archive.reader.ZipReader.read>` (strict: exactly the declared size, then the
end of the stream) and the scanner's walk (:func:`ptfile.scanning.containers.read_member`,
tolerant: the first bytes it needs, whatever the declared size says).  The bound is
the same for both: a member may inflate to at most ``Limits.max_inflate_ratio`` times
its compressed size plus :data:`INFLATE_ALLOWANCE` (:func:`inflate_bound`); a member
that declares more is refused before anything is inflated, and one that inflates past
it is stopped there.  Output is never allocated beyond what is asked for
(``decompress``'s ``max_length``).
"""

from __future__ import annotations

import zlib
from typing import Final

from ..errors import ArchiveError, LimitExceededError

__all__ = ["INFLATE_ALLOWANCE", "inflate", "inflate_bound", "inflate_prefix"]

#: A deflated member may inflate to Limits.max_inflate_ratio times its size plus this.
INFLATE_ALLOWANCE: Final = 1 << 20


def inflate_bound(name: str, size: int, compressed_size: int, ratio: int) -> int:
    """The most bytes member ``name`` may inflate to.

    Raises
    ------
    LimitExceededError
        It declares a ``size`` over that (a deflate bomb, or a lie).
    """
    most = ratio * compressed_size + INFLATE_ALLOWANCE
    if size > most:
        raise LimitExceededError("max_inflate_ratio", ratio, size // max(compressed_size, 1),
                                 f"record {name!r} inflates {compressed_size} bytes to {size}")
    return most


def _inflate(raw: bytes | memoryview, n: int, name: str) -> tuple[bytes, zlib._Decompress]:
    """At most ``n`` bytes of the raw deflate stream ``raw``, and the inflater after them."""
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        return inflater.decompress(raw, n), inflater
    except zlib.error as exc:
        raise ArchiveError(f"bad deflate stream: {exc}", member=name) from exc


def inflate(raw: bytes | memoryview, name: str, size: int) -> bytes:
    """Strict: the ``size`` bytes member ``name`` declares, and then the end of the stream.

    Raises
    ------
    ArchiveError
        A damaged stream, or one that holds more or fewer bytes than declared.
    """
    out, inflater = _inflate(raw, size + 1, name)
    if len(out) != size or not inflater.eof:
        raise ArchiveError(
            f"deflate stream holds {'more' if len(out) > size else 'fewer'} than the "
            f"declared {size} bytes",
            member=name,
        )
    return out


def inflate_prefix(raw: bytes | memoryview, name: str, keep: int, most: int,
                   ratio: int) -> bytes:
    """Tolerant: the first ``keep`` bytes of member ``name`` (fewer if the stream ends
    sooner), whatever size it declares; ``most`` is its :func:`inflate_bound`.

    Raises
    ------
    ArchiveError
        A damaged stream (before ``keep`` bytes).
    LimitExceededError
        It inflates to more than ``most`` bytes (``keep >= most``: the bound was reached
        with input left over).
    """
    out, inflater = _inflate(raw, min(keep, most), name)
    if len(out) >= most and inflater.unconsumed_tail:
        raise LimitExceededError("max_inflate_ratio", ratio, len(out) // max(len(raw), 1),
                                 f"record {name!r} inflates {len(raw)} bytes to more "
                                 f"than {most}")
    return out
