"""POSIX tar headers: the one reader of tar archives, for the loader and the scanner.

The tar checkpoint format of torch < 0.4 (:mod:`ptfile.formats.legacy_tar`)
is a POSIX.1-1988 (ustar) archive, possibly with GNU or PAX (POSIX.1-2001)
extensions, read by torch through Python's ``tarfile``.  Where ``tarfile``
and this module could read a header two ways, this module reads it as
``tarfile`` does.

* The archive is a sequence of 512-byte blocks.  A header block holds the name
  (bytes 0-99), octal or GNU base-256 numeric fields (``size`` at 124-135),
  the checksum (148-155: the sum of the header's bytes, as unsigned or as
  signed chars, with the checksum field read as eight spaces), the type flag
  (156) and, for ustar, the magic ``ustar`` (257) and a name prefix (345-499).
  The member's data follows in ``ceil(size / 512)`` blocks.
* A reader MUST check every header's checksum and numeric fields, and that
  each member's data lies inside the input.  The archive ends at the first
  all-zero block, or at the end of the input (``tarfile`` needs no end marker).
* Types ``0``, NUL and ``7`` (contiguous file) are regular files: their data is
  the member's bytes (``tarfile.REGULAR_TYPES``, less GNU sparse).
* Type ``L`` (GNU long name) gives the next member's name in its data; type
  ``x`` (PAX) gives ``path`` and ``size`` records (``"<len> key=value\\n"``)
  that override the next header's fields, on top of those of every earlier
  ``g`` (PAX global) header (``tarfile`` applies global fields only through a
  later ``x`` header); ``g`` and ``K`` (GNU long link name) carry no member.
* Type ``S`` (GNU sparse) is a file with holes: ``tarfile`` reads it, and may
  read up to 21 sparse entries per extension block after the header (byte 482,
  then byte 504 of each extension block, says another block follows) before
  the data.  ptfile skips those blocks as ``tarfile`` does and does not read
  sparse members (nor PAX ``GNU.sparse.*`` members): the loader reports such a
  ``pickle`` or ``storages`` member as missing.

Tolerant mode (:mod:`ptfile.archive.anomalies`) reports these codes:

* ``bad-tar-header``: a header's checksum or a numeric field is wrong, or a
  PAX record or GNU long name is malformed or too long; the walk stops there
  (``tarfile`` stops there too, or refuses the archive when it is the first);
* ``truncated-tar-member``: a member's data runs past the end of the input
  (its bytes up to the end are listed); the walk stops;
* ``too-many-members``: more than ``Limits.max_records`` members; the walk stops;
* ``sparse-tar-member``: a sparse member, which ``tarfile`` reads and ptfile
  does not (its stored bytes are listed, for a scanner to read);
* ``tar-link``: a hard (``1``) or symbolic (``2``) link; ``tarfile.extractfile``
  (how torch reads ``pickle``) and ``extract`` of a hard link (``storages``,
  ``tensors``) give the target member's bytes, so tolerant mode lists the link
  with its target's bytes (symbolic: the target relative to the link's folder,
  the last member of that name; hard: the last such member before it), and
  strict mode skips links as before.  A ``K`` (GNU long link name) or PAX
  ``linkpath`` gives a long target.

Tolerant mode reads numbers as ``tarfile`` does (its ``nti``): a field is cut at
its first NUL and read by Python's ``int(text.strip() or "0", 8)``, so
surrounding whitespace of any kind, a sign, ``_`` between digits and a ``0o``
prefix are accepted, and a leading ``0xff`` byte is a negative base-256 number;
a PAX ``size`` is read by ``int()`` and is 0 when that fails.  Strict mode
keeps to plain octal digits.  It also reports what makes ``tarfile`` raise
``ReadError`` while it lists the members (torch then reads the file as a
stream):

* ``truncated-tar-member`` also when only the padding of the last member's
  last block is missing (``tarfile`` reads the byte before the next header);
* ``tar-orphan-extended-header``: a GNU long name, long link or PAX header not
  followed by a readable header (``tarfile``'s ``SubsequentHeaderError``);
* ``negative-tar-size``: a negative size (``tarfile`` would step back over its
  own headers); the walk stops.
"""

from __future__ import annotations

import posixpath
import struct
from dataclasses import dataclass
from typing import Final

from .._io.local import Source
from ..errors import FormatError, LimitExceededError, PtfileError, brief
from ..limits import Limits
from .anomalies import Anomaly, report

__all__ = ["BLOCK", "REGULAR_TYPES", "TarHeader", "TarMember", "is_tar", "read_members",
           "tarfile_accepts"]

BLOCK: Final = 512
#: Header types that carry a member's data as it is (``tarfile.REGULAR_TYPES`` but sparse).
REGULAR_TYPES: Final = frozenset({b"0", b"\0", b"7"})
SPARSE_TYPE: Final = b"S"
LONG_NAME_TYPE: Final = b"L"
LONG_LINK_TYPE: Final = b"K"
#: Hard and symbolic links: ``tarfile.extractfile`` (how torch reads ``pickle``) and
#: ``extract`` of a hard link (``storages``, ``tensors``) give the target member's bytes.
HARD_LINK_TYPE: Final = b"1"
SYMBOLIC_LINK_TYPE: Final = b"2"
LINK_TYPES: Final = frozenset({HARD_LINK_TYPE, SYMBOLIC_LINK_TYPE})
PAX_TYPE: Final = b"x"
PAX_GLOBAL_TYPE: Final = b"g"
PAX_TYPES: Final = frozenset({PAX_TYPE, PAX_GLOBAL_TYPE})
#: Where the ustar magic is, and its first five bytes.
USTAR_MAGIC_AT: Final = 257
USTAR_MAGIC: Final = b"ustar"
DIRECTORY_TYPE: Final = b"5"
#: Types whose header bytes 345-499 are not a name prefix (``tarfile.GNU_TYPES``).
GNU_TYPES: Final = frozenset({b"L", b"K", b"S"})
#: The ustar header (POSIX.1-1988): name, mode, uid, gid, size, mtime, chksum,
#: typeflag, linkname, magic, version, uname, gname, devmajor, devminor, prefix, pad.
_USTAR: Final = struct.Struct("100s8s8s8s12s12s8s1s100s6s2s32s32s8s8s155s12s")
_CHKSUM_AT: Final = struct.calcsize("100s8s8s8s12s12s")  # the fields before chksum
#: The old GNU header after devminor: atime, ctime, offset, longnames, unused,
#: 4 sparse entries (offset, size), isextended, realsize, pad.
_GNU_TAIL: Final = struct.Struct("12s12s12s4s1s96s1s12s17s")
_GNU_TAIL_AT: Final = _USTAR.size - struct.calcsize("155s12s")  # where prefix starts
#: An old GNU sparse extension block: 21 sparse entries, isextended, pad.
_SPARSE_EXTENSION: Final = struct.Struct("504s1s7s")


@dataclass(frozen=True, slots=True)
class TarMember:
    """One member of the tar archive whose data a reader takes: where its bytes are."""

    name: str
    offset: int
    size: int


def is_tar(head: bytes) -> bool:
    """True when ``head`` (at least 262 bytes of the input) has the ustar magic.

    Examples
    --------
    >>> is_tar(bytes(257) + b"ustar\\x0000")
    True
    """
    return head[USTAR_MAGIC_AT:USTAR_MAGIC_AT + len(USTAR_MAGIC)] == USTAR_MAGIC


def tarfile_accepts(head: bytes) -> bool:
    """Whether Python's ``tarfile`` (torch's tar reader) accepts ``head``, a file's first
    512 bytes, as a header: by its checksum alone, ``ustar`` magic or not, its numbers
    read as ``tarfile`` reads them (an all-zero block is an empty archive, not a header).

    Examples
    --------
    >>> tarfile_accepts(bytes(512)), tarfile_accepts(b"x" * 512)
    (False, False)
    """
    if len(head) < BLOCK or head[:BLOCK] == bytes(BLOCK):
        return False
    try:
        TarHeader.from_bytes(head[:BLOCK], 0, lenient=True)
    except PtfileError:
        return False
    return True


def _octal(field: bytes, what: str, offset: int, lenient: bool = False) -> int:
    if field[:1] == b"\x80":  # GNU base-256 for values that do not fit in octal
        return int.from_bytes(field[1:], "big")
    if lenient:
        return _nti(field, what, offset)
    text = field.split(b"\0", 1)[0].strip(b" ")
    if text and not all(0x30 <= c <= 0x37 for c in text):
        raise FormatError(f"tar header field {what} is not octal: {field!r}", offset=offset)
    return int(text, 8) if text else 0


def _nti(field: bytes, what: str, offset: int) -> int:
    """A number field as ``tarfile``'s ``nti`` reads it (module docstring)."""
    if field[:1] == b"\xff":  # GNU base-256, negative
        return int.from_bytes(field[1:], "big") - int(256 ** (len(field) - 1))
    text = field.split(b"\0", 1)[0]
    try:
        value: int = int(text.decode("ascii").strip() or "0", 8)
    except (UnicodeDecodeError, ValueError):
        raise FormatError(f"tar header field {what} is not a number: {field!r}",
                          offset=offset) from None
    return value


@dataclass(frozen=True, slots=True)
class TarHeader:
    """A 512-byte tar header block: the fields a reader uses.

    ``name`` is the name as ``tarfile`` makes it: the ``prefix`` field, a
    ``/`` and the ``name`` field, unless the prefix is empty or the type is a
    GNU one (``L``, ``K``, ``S``); ``kind`` is the type flag, with a NUL-type
    name ending in ``/`` read as a directory (``5``), as V7 archives mean it.
    ``size`` is the header's own size field (a PAX ``size`` overrides it);
    ``sparse_extended`` says an extension block follows a GNU sparse header.
    """

    name: bytes
    size: int
    kind: bytes
    sparse_extended: bool
    linkname: bytes = b""

    @classmethod
    def from_bytes(cls, block: bytes, offset: int, lenient: bool = False) -> TarHeader:
        """Parse and check the header ``block`` found at file ``offset`` (``lenient``: its
        numbers as ``tarfile`` reads them, module docstring).

        Raises
        ------
        FormatError
            Its checksum or a numeric field is wrong.
        """
        (name, _, _, _, size, _, chksum, kind, linkname, _, _, _, _, _, _, prefix,
         _) = _USTAR.unpack(block)  # fmt: skip
        stored = _octal(chksum, "chksum", offset, lenient)
        body = block[:_CHKSUM_AT] + b" " * len(chksum) + block[_CHKSUM_AT + len(chksum):]
        if stored not in (sum(body), sum(b - 256 if b > 127 else b for b in body)):
            raise FormatError(f"tar header checksum {stored:#o} does not match its bytes",
                              offset=offset)
        name, prefix = name.split(b"\0", 1)[0], prefix.split(b"\0", 1)[0]
        if kind == b"\0" and name.endswith(b"/"):
            kind = DIRECTORY_TYPE
        if prefix and kind not in GNU_TYPES:
            name = prefix + b"/" + name
        extended = False
        if kind == SPARSE_TYPE:
            *_, is_extended, _, _ = _GNU_TAIL.unpack_from(block, _GNU_TAIL_AT)
            extended = is_extended != b"\0"
        return cls(name, _octal(size, "size", offset, lenient), kind, extended,
                   linkname.split(b"\0", 1)[0])


def _pax(data: bytes, offset: int) -> dict[bytes, bytes]:
    """``"<len> key=value\\n"`` records of a PAX header."""
    fields: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        length_text, space, _ = data[pos:pos + 20].partition(b" ")
        if not space or not length_text.isdigit() or int(length_text) < 5 \
                or pos + int(length_text) > len(data):
            raise FormatError("malformed PAX extended header record", offset=offset + pos)
        record = data[pos + len(length_text) + 1: pos + int(length_text) - 1]
        key, _, value = record.partition(b"=")
        fields[key] = value
        pos += int(length_text)
    return fields


def _member_size(header: TarHeader, pending: dict[bytes, bytes], pos: int,
                 lenient: bool = False) -> int:
    """The member's size: a preceding PAX ``size`` field overrides the header's."""
    text = pending.get(b"size")
    if text is None:
        return header.size
    if lenient:  # tarfile: int(value), 0 when that fails
        try:
            return int(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return 0
    if not text.isdigit() or len(text) > 20:
        raise FormatError(f"PAX size {brief(text, 40)} is not a decimal number", offset=pos)
    return int(text)


def _extended(source: Source, pos: int, size: int, kind: bytes,
              limits: Limits) -> dict[bytes, bytes]:
    """The fields a GNU long-name or PAX header sets for the next member."""
    if size > limits.max_name_length + BLOCK:
        raise LimitExceededError("max_name_length", limits.max_name_length, size,
                                 "tar extended header")
    data = source.pread(pos + BLOCK, size, "tar extended header")
    if kind in (LONG_NAME_TYPE, LONG_LINK_TYPE):
        return {b"path" if kind == LONG_NAME_TYPE else b"linkpath": data.split(b"\0", 1)[0]}
    return _pax(data, pos + BLOCK)


def _sparse_blocks(source: Source, header: TarHeader, pos: int) -> int:
    """How many extension blocks follow a GNU sparse header (``tarfile`` reads them all)."""
    blocks, extended = 0, header.sparse_extended
    while extended and pos + (blocks + 2) * BLOCK <= source.size:
        blocks += 1
        block = source.pread(pos + blocks * BLOCK, BLOCK, "tar sparse extension")
        _, is_extended, _ = _SPARSE_EXTENSION.unpack(block)
        extended = is_extended != b"\0"
    return blocks


class _Walk:
    """One pass over the headers; ``anomalies`` None is strict mode, a list tolerant."""

    def __init__(self, source: Source, limits: Limits, anomalies: list[Anomaly] | None) -> None:
        self.source, self.limits, self.anomalies = source, limits, anomalies
        self.members: list[TarMember] = []
        #: Fields of PAX global headers: the base of every later PAX header (as tarfile's).
        self.globals: dict[bytes, bytes] = {}
        #: Tolerant mode: (members before it, type, name, target, header offset) of each link.
        self.links: list[tuple[int, bytes, str, str, int]] = []

    def run(self) -> None:
        pos, pending, source = 0, dict[bytes, bytes](), self.source
        lenient, extended = self.anomalies is not None, False
        while pos + BLOCK <= source.size:
            block = source.pread(pos, BLOCK, "tar header")
            if block == bytes(BLOCK):
                self._orphan(extended, pos)
                return
            try:
                header = TarHeader.from_bytes(block, pos, lenient)
            except FormatError:
                self._orphan(extended, pos)
                raise
            kind = header.kind
            size = _member_size(header, pending, pos, lenient)
            if size < 0:
                raise _Stop("negative-tar-size", FormatError(
                    f"tar member size {size} is negative", offset=pos))
            data = pos + BLOCK * (1 + (_sparse_blocks(source, header, pos)
                                       if kind == SPARSE_TYPE else 0))
            if data + size > source.size:
                self._add(kind, pending, header, data, source.size - data, pos)
                raise _Stop("truncated-tar-member", FormatError(
                    f"tar member of {size} bytes reaches beyond the end of the input",
                    offset=pos))
            if lenient and data + -(-size // BLOCK) * BLOCK > source.size:
                self._add(kind, pending, header, data, size, pos)
                raise _Stop("truncated-tar-member", FormatError(
                    f"the last block of a tar member of {size} bytes is cut short "
                    "(tarfile reads its padding)", offset=pos))
            extended = kind in (LONG_NAME_TYPE, LONG_LINK_TYPE) or kind in PAX_TYPES
            if kind in (LONG_NAME_TYPE, LONG_LINK_TYPE) or kind in PAX_TYPES:
                fields = _extended(source, pos, size, kind, self.limits)
                if kind == PAX_GLOBAL_TYPE:
                    self.globals.update(fields)
                pending = {**self.globals, **fields} if kind == PAX_TYPE else \
                    {} if kind == PAX_GLOBAL_TYPE else {**pending, **fields}
            else:
                self._add(kind, pending, header, data, size, pos)
                pending = {}
            pos = data + -(-size // BLOCK) * BLOCK
        self._orphan(extended, pos)

    def _orphan(self, extended: bool, pos: int) -> None:
        """Tolerant mode: an extended header with no readable header after it."""
        if extended and self.anomalies is not None:
            raise _Stop("tar-orphan-extended-header", FormatError(
                "an extended (GNU long name or PAX) header is not followed by a readable "
                "header (tarfile refuses the archive)", offset=pos))

    def _add(self, kind: bytes, pending: dict[bytes, bytes], header: TarHeader, data: int,
             size: int, pos: int) -> None:
        sparse = kind == SPARSE_TYPE or any(k.startswith(b"GNU.sparse.") for k in pending)
        name = (pending.get(b"path") or header.name).decode("utf-8", "replace")
        if kind in LINK_TYPES and self.anomalies is not None:
            self._link(kind, name, (pending.get(b"linkpath") or header.linkname).decode(
                "utf-8", "replace"), pos)
            return
        if kind not in REGULAR_TYPES and not sparse:
            return
        if sparse:
            if self.anomalies is None:
                return  # the loader does not read sparse members
            self.anomalies.append(Anomaly("sparse-tar-member", "a sparse member: tarfile "
                                          "(torch) fills in its holes, ptfile does not read it",
                                          pos, name))
        self.members.append(TarMember(name, data, size))
        if len(self.members) > self.limits.max_records:
            raise _Stop("too-many-members", LimitExceededError(
                "max_records", self.limits.max_records, len(self.members), "tar members"))


    def _link(self, kind: bytes, name: str, target: str, pos: int) -> None:
        """Tolerant mode: a link, resolved when the walk ends (:meth:`resolve_links`)."""
        if kind == SYMBOLIC_LINK_TYPE:
            target = "/".join(filter(None, (posixpath.dirname(name), target)))
        self.links.append((len(self.members), kind, name, target, pos))

    def resolve_links(self) -> None:
        """Each link is listed, in archive order, with its target's bytes, as ``tarfile``
        reads it: the last regular member whose normalised name is the target, among all
        members (symbolic) or those before the link (hard); the strict loader follows no
        link."""
        anomalies = self.anomalies
        if anomalies is None or not self.links:
            return
        regular = list(self.members)
        for at, kind, name, target, _ in reversed(self.links):
            wanted = posixpath.normpath(target)
            scope = regular if kind == SYMBOLIC_LINK_TYPE else regular[:at]
            found = next((m for m in reversed(scope) if posixpath.normpath(m.name) == wanted),
                         None)
            if found is not None:
                self.members.insert(at, TarMember(name, found.offset, found.size))
        anomalies.extend(Anomaly(
            "tar-link", f"a {'hard' if kind == HARD_LINK_TYPE else 'symbolic'} link to "
            f"{target!r}: tarfile (torch) reads its target's bytes under this name, ptfile's "
            "loader follows no link", pos, name) for _, kind, name, target, pos in self.links)


class _Stop(Exception):
    """Control flow inside this module (never escapes): the walk ends with an anomaly."""

    def __init__(self, code: str, error: PtfileError) -> None:
        super().__init__(code)
        self.code, self.error = code, error


def read_members(source: Source, limits: Limits,
                 anomalies: list[Anomaly] | None = None) -> list[TarMember]:
    """The members of the tar archive in ``source`` whose data a reader takes, in order.

    Parameters
    ----------
    source : Source
        The archive.
    limits : Limits
        ``max_records`` bounds the members, ``max_name_length`` extended headers.
    anomalies : list of Anomaly, optional
        None: strict mode (raise).  A list: tolerant mode; what strict mode
        raises is appended (module docstring) and the members read so far
        are returned.

    Raises
    ------
    FormatError
        A header is damaged or a member reaches beyond the end of the input.
    LimitExceededError
        More members than ``limits.max_records``, or an overlong extended header.

    Examples
    --------
    >>> from ptfile._io.local import BytesSource
    >>> from ptfile.limits import DEFAULT_LIMITS
    >>> read_members(BytesSource(bytes(1024)), DEFAULT_LIMITS)
    []
    """
    walk = _Walk(source, limits, anomalies)
    try:
        walk.run()
    except _Stop as stop:
        report(anomalies, stop.code, stop.error)
    except PtfileError as exc:
        report(anomalies, "bad-tar-header", exc)
    walk.resolve_links()
    return walk.members
