"""The two modes of the container parsers: strict (for loading) and tolerant (for scanning).

Every parser of a container (:mod:`ptfile.archive.directory`,
:mod:`ptfile.archive._entries`, :mod:`ptfile.archive.reader`,
:mod:`ptfile.archive.tar`) takes an ``anomalies`` argument:

``None`` (strict, the default)
    Damage and ambiguity raise the :class:`~ptfile.errors.PtfileError` the
    loader raises; oddities the loader accepts pass silently.
a list (tolerant)
    Each is appended as an :class:`Anomaly` instead, and the parse goes on
    where it can (or stops where the bytes cannot be read further), returning
    what it read.  Oddities the loader accepts are appended too: a scanner
    must say *what* two readers could read two ways, and look at each reading.

So there is one parser per container: a scanner that reads other bytes than
the loader is how scanners are bypassed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PtfileError

__all__ = ["Anomaly", "report"]


@dataclass(frozen=True, slots=True)
class Anomaly:
    """Something about a container that two readers could read two ways, or not at all.

    ``code`` names the kind (``duplicate-name``, ``bad-tar-header``…; each
    parser's docstring lists its codes).  ``region`` is ``(start, size)`` of
    another archive the anomaly points at, and ``eocd`` the offset of another
    end record: what a scanner should read too.
    """

    code: str
    message: str
    offset: int | None = None
    member: str | None = None
    region: tuple[int, int] | None = None
    eocd: int | None = None


def report(anomalies: list[Anomaly] | None, code: str, error: PtfileError) -> None:
    """Strict mode (``anomalies`` is None): raise ``error``; tolerant mode: record it.

    Examples
    --------
    >>> from ptfile.errors import ArchiveError
    >>> found: list[Anomaly] = []
    >>> report(found, "bad-local-header", ArchiveError("no local header", offset=4))
    >>> found[0].code, found[0].offset
    ('bad-local-header', 4)
    """
    if anomalies is None:
        raise error
    anomalies.append(Anomaly(code, str(error), getattr(error, "offset", None),
                             getattr(error, "member", None)))
