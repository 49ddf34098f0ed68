"""The one decision of which format a checkpoint is in: from its bytes, never from its name.

===============  ==================================================  =====================
format           leading bytes / records                              reader
===============  ==================================================  =====================
``zip``          ``PK\\x03\\x04`` (torch ≥ 1.6) with a ``data.pkl``     :mod:`.zipped`
``torchscript``  a ZIP with a ``constants.pkl`` record                :mod:`.torchscript`
``pt2``          a ZIP with an ``archive_format`` record              :mod:`.pt2`
``torchscript-   a ZIP with a ``model.json`` record (and no           refused
json``           ``data.pkl``): TorchScript of torch 1.0/1.1
``legacy``       pickle of the magic number ``0x1950A86A20F9469CFC6C``  :mod:`.legacy_pickle`
``tar``          a POSIX tar header (``ustar`` at offset 257)          :mod:`.legacy_tar`
``safetensors``  8 bytes (the header length), then ``{`` after any   :mod:`.safetensors`
                 JSON whitespace
===============  ==================================================  =====================

:func:`detect_source` is the only place that decides: it sniffs the first
512 bytes (:func:`detect`, a table of sniffers) and, for a ZIP, parses the
central directory once and refines the kind by its records.  The parsed
archive travels in the :class:`Detected` result, so no reader parses it again.

Safetensors is known by its bytes too, whatever the file's name: torch.load reads
a file as safetensors only when its path ends in ``.safetensors`` (and anything else,
file objects included, as a pickle, which fails on it); ptfile reads every name and
file objects.  The sniffer runs after the ZIP, legacy and tar ones (a file that is
one of those stays one), and asks only for ``{`` at byte 8, after any JSON whitespace
in the first :data:`HEAD_BYTES`, not for a plausible length: a header length beyond
the file or over ``Limits.max_safetensors_header_bytes`` is reported as that
(FormatError, LimitExceededError) by the one header reader, not as an unknown format.
A file under 9 bytes is no safetensors file (safetensors refuses it too).

TorchScript's first layout (``torch.jit.save`` of torch 1.0/1.1: ``<name>/version``
1, ``<name>/model.json`` describing the module and its tensors, ``<name>/tensors/<n>``,
``<name>/code/…``, later ``attributes.pkl``) is :attr:`Format.TORCHSCRIPT_JSON`: torch
2.13's ``torch.jit.load`` refuses it ("Legacy model format is not supported"), as it
checks for ``model.json`` before anything else, and ``torch.load`` finds no
``data.pkl``; ptfile's front doors refuse it by name
(:class:`~ptfile.errors.UnsupportedFeatureError`), ``scan`` names it.

Which files torch's loaders could read at all (a folder walk's question, asked of every
file under the folder, checkpoint or not) is :func:`loader_of`, from a file's first
:data:`SNIFF_BYTES` and its name, as torch 2.13 dispatches
(``torch/serialization.py``: ``load``, ``_is_zipfile``, ``_legacy_load``):

===============  ===========================================================================
reading          when
===============  ===========================================================================
``safetensors``  the path ends in ``.safetensors`` (exactly: ``torch.load`` tests
                 ``fspath.endswith(".safetensors")`` before anything else, and reads such a
                 file with the safetensors package only, whatever its bytes)
``zip``          ``PK\\x03\\x04`` at byte 0 (``_is_zipfile``; ``torch.jit.load`` and
                 ``_load_for_lite_interpreter`` ask the same of a ZIP: lite modules are ZIPs)
``legacy``       the legacy stream's magic (:data:`LEGACY_MAGIC_PICKLE`)
``tar``          a block ``tarfile`` accepts (its checksum: ustar, GNU, pax or V7 headers):
                 ``_legacy_load`` tries ``tarfile.open(mode="r:")`` first
``pickle``       anything the unpickler may read into code or a ``STOP`` from byte 0
                 (:func:`ptfile.picklevm.prefix.reaches_code`): ``_legacy_load``'s first
                 ``pickle.load``, and ``pickle.load``
===============  ===========================================================================

Anything else no loader reads (a TorchScript flatbuffer, ``PTMF`` at byte 4, holds no
pickle).  A file whose bytes are safetensors but whose name is not is *not* read as
safetensors by ``torch.load``, which reads it as a tar or a pickle: the scanner judges that
reading too (:mod:`ptfile.scanning.scanner`).

What an *input* is (a file, a URL, a checkpoint folder of some kind, a folder of many
files) is decided before, once, by :func:`ptfile.formats.inputs.resolve_input`, whose
record every front door carries; its names stay importable from here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from .._gc import paused_gc
from .._io.local import Source
from ..archive import ZipReader
from ..archive.tar import is_tar, tarfile_accepts
from ..errors import FormatError
from ..limits import DEFAULT_LIMITS, Limits
from ..picklevm.prefix import reaches_code
from .inputs import (
    CHECKPOINT_SUFFIXES,
    DCP_METADATA_NAME,
    Input,
    InputKind,
    detect_input,
    folder_kind,
    resolve_input,
)

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "DCP_METADATA_NAME",
    "HEAD_BYTES",
    "LEGACY_MAGIC_PICKLE",
    "SNIFF_BYTES",
    "ZIP_MARKERS",
    "Detected",
    "Format",
    "Input",
    "InputKind",
    "detect",
    "detect_input",
    "detect_source",
    "folded_markers",
    "folder_kind",
    "kind_of_markers",
    "loader_of",
    "resolve_input",
    "torch_reads_safetensors",
    "zip_kind",
]


class Format(enum.Enum):
    """The container formats ``torch.load`` reads."""

    ZIP = "zip"
    TORCHSCRIPT = "torchscript"
    PT2 = "pt2"
    LEGACY = "legacy"
    TAR = "tar"
    #: A safetensors file (:mod:`.safetensors`).
    SAFETENSORS = "safetensors"
    #: TorchScript's ``model.json`` layout (torch 1.0/1.1), which torch 2.13 refuses.
    TORCHSCRIPT_JSON = "torchscript-json"
    #: A ``torch.distributed.checkpoint`` directory, of either writer (:func:`detect_input`).
    DCP = "dcp"
    #: A checkpoint set: a Hugging Face ``.bin`` model folder or a trainer folder
    #: (:mod:`ptfile.formats.inputs`, read by :mod:`ptfile.sets`).
    SET = "set"
    #: A DeepSpeed ZeRO checkpoint folder (:mod:`ptfile.formats.inputs`, read by
    #: :mod:`ptfile.zero`).
    ZERO = "zero"
    UNKNOWN = "unknown"


#: How many leading bytes the sniffers look at (a tar header is 512 bytes).
HEAD_BYTES: Final = 512

#: The pickled magic number opening every legacy stream (protocol 2 LONG1 form).
LEGACY_MAGIC_PICKLE: Final = bytes.fromhex("80028a0a6cfc9c46f9206aa850192e")

#: The magic number as LONG1 bytes (protocols 2-5, after PROTO and any FRAME).
_MAGIC_LONG1: Final = LEGACY_MAGIC_PICKLE[2:-1]
#: The magic number as protocol 0/1 text (``LONG`` opcode).
_MAGIC_TEXT: Final = b"L119547037146038801333356L\n"

_SNIFFERS: Final[tuple[tuple[Format, Callable[[bytes], bool]], ...]] = (
    (Format.ZIP, lambda head: head[:4] == b"PK\x03\x04"),
    (Format.LEGACY, lambda head: (head[:1] == b"\x80" and _MAGIC_LONG1 in head[:32])
        or head.startswith(_MAGIC_TEXT)),
    (Format.TAR, is_tar),  # the tar reader's own test (archive.tar)
    # Last: "{" after the 8-byte header length (JSON may start with whitespace).
    (Format.SAFETENSORS, lambda head: head[8:].lstrip(b" \t\n\r")[:1] == b"{"),
)

#: How many leading bytes :func:`loader_of` needs: a tar header block.
SNIFF_BYTES: Final = 512
#: The name ``torch.load`` reads with the safetensors package (case counts).
_SAFETENSORS_NAME: Final = ".safetensors"

#: The readings of :func:`loader_of`, in torch's order after the name: (reading, test of the
#: leading bytes and the file's size).
_LOADERS: Final[tuple[tuple[str, Callable[[bytes, int], bool]], ...]] = (
    ("zip", lambda head, size: head[:4] == b"PK\x03\x04"),
    ("legacy", lambda head, size: detect(head) is Format.LEGACY),
    ("tar", lambda head, size: tarfile_accepts(head)),
    ("pickle", lambda head, size: reaches_code(head[:SNIFF_BYTES], size)),
)


def torch_reads_safetensors(name: str | None) -> bool:
    """Whether ``torch.load`` reads the file named ``name`` with the safetensors package:
    a path ending in ``.safetensors``, exactly (a file object, ``name`` None, never is).

    Examples
    --------
    >>> torch_reads_safetensors("m.safetensors"), torch_reads_safetensors("m.SAFETENSORS")
    (True, False)
    """
    return name is not None and name.endswith(_SAFETENSORS_NAME)


def loader_of(head: bytes, name: str | None, size: int) -> str | None:
    """Which of torch's readings opens a file of ``size`` bytes named ``name`` that starts
    with ``head`` (its first :data:`SNIFF_BYTES` or all of it): ``safetensors``, ``zip``,
    ``legacy``, ``tar`` or ``pickle`` (module docstring), or None when no loader reads it.

    Examples
    --------
    >>> loader_of(b"PK\\x03\\x04" + bytes(60), "model.weights", 64)
    'zip'
    >>> loader_of(b"# a README\\n", "README.md", 11) is None
    True
    >>> loader_of(b"", "empty.safetensors", 0)
    'safetensors'
    """
    if torch_reads_safetensors(name):
        return "safetensors"
    return next((reading for reading, reads in _LOADERS if reads(head, size)), None)


#: A torch ZIP's kind, by the records that mark it (first match wins): ``model.json``
#: sends ``torch.jit.load`` (which ``torch.load`` calls for ``constants.pkl``) to the
#: TorchScript layout torch 2.13 refuses; ``torch.load`` reads a ``data.pkl`` beside it.
_ZIP_KINDS: Final = (
    (("archive_format",), Format.PT2),
    (("constants.pkl", "model.json"), Format.TORCHSCRIPT_JSON),
    (("constants.pkl",), Format.TORCHSCRIPT),
    (("data.pkl",), Format.ZIP),
    (("model.json",), Format.TORCHSCRIPT_JSON),
)
#: The records (under the archive folder) that tell what torch's loaders read a ZIP as.
ZIP_MARKERS: Final = ("archive_format", "constants.pkl", "data.pkl", "model.json")


def detect(head: bytes) -> Format:
    """The format whose signature ``head`` (the first ≥ 512 bytes) carries.

    A ZIP is only :attr:`Format.ZIP` here: its records tell the kind
    (:func:`detect_source`).

    Examples
    --------
    >>> detect(b"PK\\x03\\x04" + bytes(508))
    <Format.ZIP: 'zip'>
    >>> detect(b"hello")
    <Format.UNKNOWN: 'unknown'>
    """
    for fmt, sniff in _SNIFFERS:
        if sniff(head):
            return fmt
    return Format.UNKNOWN


def zip_kind(reader: ZipReader) -> Format:
    """The kind of torch ZIP archive ``reader`` holds: ZIP, TORCHSCRIPT or PT2
    (:func:`kind_of_markers`).

    Raises
    ------
    FormatError
        torch's loaders read it as two different things.
    """
    prefix = reader.prefix
    exact = {m for m in ZIP_MARKERS if reader.get(f"{prefix}/{m}") is not None}
    return kind_of_markers(folded_markers(reader.names, prefix), exact)


def folded_markers(names: Sequence[str], folder: str) -> frozenset[str]:
    """The :data:`ZIP_MARKERS` that ``<folder>/<marker>`` finds among ``names`` when ASCII
    case is ignored, as torch's record lookups (miniz) find them."""
    joined = ("\0" + "\0".join(names) + "\0").encode("utf-8", "surrogateescape").lower()
    base = f"\0{folder}/".encode("utf-8", "surrogateescape").lower()
    return frozenset(m for m in ZIP_MARKERS if base + m.encode() + b"\0" in joined)


def kind_of_markers(found: Collection[str], exact: Collection[str]) -> Format:
    """The kind of a torch ZIP by its marker records: ``found`` as torch's case-folding
    lookups find them, ``exact`` those present in exactly that case.

    PT2 (``archive_format``) first, then TORCHSCRIPT (``constants.pkl``), else ZIP; the
    ``model.json`` of TorchScript's first layout makes a TORCHSCRIPT_JSON of an archive
    ``torch.jit.load`` reads (``constants.pkl``) or ``torch.load`` cannot (no ``data.pkl``).
    One reading or none: a file torch's loaders read as two things is refused.

    Raises
    ------
    FormatError
        ``archive_format`` with ``data.pkl`` or ``constants.pkl`` (``torch.export.load``
        reads a program, ``torch.load`` a pickle or TorchScript), or ``constants.pkl`` in
        another case only (``torch.load`` tests that name exactly and unpickles
        ``data.pkl``; ``torch.jit.load`` finds it and reads TorchScript).

    Examples
    --------
    >>> kind_of_markers({"data.pkl", "constants.pkl"}, {"data.pkl", "constants.pkl"})
    <Format.TORCHSCRIPT: 'torchscript'>
    >>> kind_of_markers({"model.json"}, {"model.json"})
    <Format.TORCHSCRIPT_JSON: 'torchscript-json'>
    """
    if "archive_format" in found and ("data.pkl" in found or "constants.pkl" in found):
        raise FormatError("the archive is both a torch.export program (archive_format) and a "
                          "torch.save or TorchScript archive (data.pkl, constants.pkl): "
                          "torch's loaders read it as different things")
    if "constants.pkl" in found and "constants.pkl" not in exact:
        raise FormatError("the archive's constants.pkl differs in case: torch.jit.load reads "
                          "it as TorchScript, torch.load unpickles its data.pkl")
    return next((fmt for records, fmt in _ZIP_KINDS if all(r in found for r in records)),
                Format.ZIP)


@dataclass(frozen=True, slots=True)
class Detected:
    """What one look at a source found: the format, the leading bytes and, for the
    ZIP kinds (ZIP, TORCHSCRIPT, PT2), the archive parsed once for every reader."""

    format: Format
    head: bytes
    archive: ZipReader | None = None

    def zip_reader(self) -> ZipReader:
        """The parsed archive of a ZIP kind (a programming error to ask otherwise)."""
        if self.archive is None:
            raise TypeError(f"a {self.format.value} source has no ZIP archive")
        return self.archive


def detect_source(source: Source, limits: Limits = DEFAULT_LIMITS) -> Detected:
    """The format of ``source``: :func:`detect`, with ZIPs parsed and refined by their records.

    Raises
    ------
    FormatError
        A ZIP's central directory is damaged (its records cannot be listed).
    """
    head = source.pread(0, min(source.size, HEAD_BYTES), "file signature")
    fmt = detect(head)
    if fmt is not Format.ZIP:
        return Detected(fmt, head)
    with paused_gc():  # 10^5 records make ~10^6 objects, none of them garbage
        reader = ZipReader(source, limits=limits)
    return Detected(zip_kind(reader), head, reader)
