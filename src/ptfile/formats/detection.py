"""The one decision of which format a checkpoint is in: from its bytes, never from its name.

===============  ==================================================  =====================
format           leading bytes / records                              reader
===============  ==================================================  =====================
``zip``          ``PK\\x03\\x04`` (torch ≥ 1.6) with a ``data.pkl``     :mod:`.zipped`
``torchscript``  a ZIP with a ``constants.pkl`` record                :mod:`.torchscript`
``pt2``          a ZIP with an ``archive_format`` record              :mod:`.pt2`
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

What an *input* is comes first, and is decided here once too, by :func:`detect_input`
(from names and the file system's answers, never by reading a checkpoint): one file
(:attr:`InputKind.FILE`: a local path, a file object, bytes; :attr:`InputKind.URL`), one
checkpoint that is a folder, or a folder of many files.  A folder's kind is
:func:`folder_kind` of its file names:

==================  =============================================================
kind                the folder's own files (subfolders are not looked at)
==================  =============================================================
``DCP``             a metadata pickle: ``.metadata`` or ``__<rank>.metadata``
                    (torch's FileSystemWriter), whatever else is beside it
``SHARDS``          ``*.safetensors`` and no other checkpoint file
                    (:data:`CHECKPOINT_SUFFIXES`): a HuggingFaceStorageWriter
                    folder (one rank or several, consolidated or not: the
                    shards of a consolidated one are in ``sharded/``, not read),
                    or a Hugging Face sharded model (``*.index.json`` + shards)
``FOLDER``          anything else: many files, each its own checkpoint
==================  =============================================================

``ptfile.load`` (which names the folder kinds' own readers), ``ptfile.open``,
``scan``, ``inspect``, ``verify``, ``diff``, ``convert``, the DCP readers and the bulk
walks all ask it, so they agree on what an input is.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .._gc import paused_gc
from .._io.local import Source
from .._io.paths import is_url, url_scheme
from ..archive import ZipReader
from ..archive.tar import is_tar
from ..errors import FormatError
from ..limits import DEFAULT_LIMITS, Limits

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "DCP_METADATA_NAME",
    "HEAD_BYTES",
    "LEGACY_MAGIC_PICKLE",
    "ZIP_MARKERS",
    "Detected",
    "Format",
    "InputKind",
    "detect",
    "detect_input",
    "detect_source",
    "folded_markers",
    "folder_kind",
    "kind_of_markers",
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
    #: A ``torch.distributed.checkpoint`` directory, of either writer (:func:`detect_input`).
    DCP = "dcp"
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

#: A torch ZIP's kind, by the record that marks it (first match wins).
_ZIP_KINDS: Final = (("archive_format", Format.PT2), ("constants.pkl", Format.TORCHSCRIPT))
#: The records (under the archive folder) that tell what torch's loaders read a ZIP as.
ZIP_MARKERS: Final = ("archive_format", "constants.pkl", "data.pkl")


#: A DCP metadata pickle's file name: the coordinator's ``.metadata``, or a rank's own
#: ``__<rank>.metadata`` (``use_collectives=False``).
DCP_METADATA_NAME: Final = re.compile(r"\.metadata|__\d+\.metadata")
#: A HuggingFaceStorageWriter's (and a sharded model's) files: what its reader reads.
_SHARD_SUFFIX: Final = ".safetensors"
#: A shard's name as the HuggingFace writers give it: ``model-00001-of-00002.safetensors``
#: (any stem: ``diffusion_pytorch_model-…``), one per rank ``shard-00001-model-…``.
_SHARD_NAME: Final = re.compile(r"(?:shard-\d+-)?[^/]+-\d+-of-\d+\.safetensors")
#: The index of a sharded model (``model.safetensors.index.json``).
_SHARD_INDEX: Final = re.compile(r"[^/]+\.safetensors\.index\.json")
#: File names that hold checkpoints, by suffix (ASCII case ignored): what torch.save,
#: torch.jit.save, torch.export.save and pickle write under (.bin: Hugging Face; .ckpt:
#: Lightning; .tar: pre-0.4), and .safetensors.  A folder walk keeps these files.
CHECKPOINT_SUFFIXES: Final = frozenset({".pt", ".pth", ".bin", ".ckpt", ".pt2", ".tar",
                                        ".pkl", ".pickle", ".safetensors"})
#: The URL schemes whose folders cannot be listed (a listing would fetch the page).
_FLAT_SCHEMES: Final = frozenset({"http", "https"})


class InputKind(enum.Enum):
    """What an input is (:func:`detect_input`): one file, one checkpoint folder, or a
    folder of many files."""

    #: One file: a local path (a missing one too), a file object or bytes.
    FILE = "file"
    #: One file behind a URL.
    URL = "url"
    #: A torch FileSystemWriter folder: ``.metadata`` or ``__<rank>.metadata``.
    DCP = "dcp"
    #: ``*.safetensors`` shards (named ``…-00001-of-00002.safetensors``, indexed by a
    #: ``*.safetensors.index.json``, or one file alone) and no other checkpoint: a HuggingFaceStorageWriter
    #: folder or a Hugging Face sharded model folder, read as one checkpoint.
    SHARDS = "shards"
    #: A folder of many files (or none): each checkpoint in it is one input of its own.
    FOLDER = "folder"

    @property
    def is_folder(self) -> bool:
        """Whether the input is a folder (of whatever kind): the DCP readers read it, and
        refuse a FOLDER as no one checkpoint."""
        return self in (InputKind.DCP, InputKind.SHARDS, InputKind.FOLDER)

    @property
    def is_checkpoint_folder(self) -> bool:
        """Whether the input is one checkpoint that is a folder (DCP or SHARDS)."""
        return self in (InputKind.DCP, InputKind.SHARDS)


def _suffix(name: str) -> str:
    return os.path.splitext(name)[1].lower()


def folder_kind(names: Iterable[str]) -> InputKind:
    """What a folder holding the files ``names`` (its own, not its subfolders') is:
    :attr:`InputKind.DCP`, :attr:`InputKind.SHARDS` or :attr:`InputKind.FOLDER`.

    Examples
    --------
    >>> folder_kind([".metadata", "__0_0.distcp"]), folder_kind(["a.txt"])
    (<InputKind.DCP: 'dcp'>, <InputKind.FOLDER: 'folder'>)
    >>> folder_kind(["model-00001-of-00001.safetensors", "model.safetensors.index.json"])
    <InputKind.SHARDS: 'shards'>
    >>> folder_kind(["adapter.safetensors", "model.pt"])  # two checkpoints side by side
    <InputKind.FOLDER: 'folder'>
    >>> folder_kind(["a.safetensors", "b.safetensors"])  # unrelated files, no shards
    <InputKind.FOLDER: 'folder'>
    """
    names = list(names)
    if any(DCP_METADATA_NAME.fullmatch(n) for n in names):
        return InputKind.DCP
    shards = [n for n in names if n.endswith(_SHARD_SUFFIX) and len(n) > len(_SHARD_SUFFIX)]
    others = [n for n in names if _suffix(n) in CHECKPOINT_SUFFIXES and n not in shards]
    # Shards by their index, by their names, or one file alone (a model folder's
    # ``model.safetensors``): a folder of unrelated ``.safetensors`` files (adapters)
    # holds many checkpoints, not one.
    sharded = len(shards) == 1 or any(_SHARD_INDEX.fullmatch(n) for n in names) \
        or all(_SHARD_NAME.fullmatch(n) for n in shards)
    return InputKind.SHARDS if shards and not others and sharded else InputKind.FOLDER


def detect_input(f: object, storage_options: Mapping[str, Any] | None = None) -> InputKind:
    """What the input ``f`` is: the one decision every front door asks.

    A path that is no folder (a missing one too) is a FILE, as is anything but a path or
    URL (file objects, bytes).  A folder is :func:`folder_kind` of its files.  A URL is
    listed only when it may name a folder: not ``http(s)://`` (no listing without
    fetching the page), and only when its last component has no suffix (``ckpt``,
    ``step-100/``, not ``model.pt``); one the backend does not call a folder, or that it
    cannot ask about, is a URL (reading it says what is wrong).

    Raises
    ------
    FormatError
        A local folder cannot be listed.
    RemoteError
        A URL the backend calls a folder cannot be listed.

    Examples
    --------
    >>> detect_input(b"PK..."), detect_input("https://host/ckpt"), detect_input("none.pt")
    (<InputKind.FILE: 'file'>, <InputKind.URL: 'url'>, <InputKind.FILE: 'file'>)
    """
    from .._io.remote import local_path

    if not isinstance(f, (str, os.PathLike)):
        return InputKind.FILE
    name = os.fsdecode(local_path(os.fspath(f)))  # type: ignore[arg-type]
    if not is_url(name):
        if not os.path.isdir(name):
            return InputKind.FILE
        from .._io.directory import local_names

        return folder_kind(local_names(name))
    names = _url_names(name, storage_options)
    return InputKind.URL if names is None else folder_kind(names)


def _url_names(url: str, storage_options: Mapping[str, Any] | None) -> list[str] | None:
    """The file names of the folder ``url`` names, or None when it names none (or the
    backend cannot say)."""
    from .._io.directory import remote_names
    from .._io.remote import filesystem

    if url_scheme(url) in _FLAT_SCHEMES or "." in url.rstrip("/").rsplit("/", 1)[-1]:
        return None
    try:
        fs, path = filesystem(url, storage_options)
        if not fs.isdir(path):
            return None
    except Exception:  # noqa: BLE001 (fsspec or a backend missing or failing: the file path says so)
        return None
    return remote_names(fs, path, url)


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

    PT2 (``archive_format``) first, then TORCHSCRIPT (``constants.pkl``), else ZIP.
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
    """
    if "archive_format" in found and ("data.pkl" in found or "constants.pkl" in found):
        raise FormatError("the archive is both a torch.export program (archive_format) and a "
                          "torch.save or TorchScript archive (data.pkl, constants.pkl): "
                          "torch's loaders read it as different things")
    if "constants.pkl" in found and "constants.pkl" not in exact:
        raise FormatError("the archive's constants.pkl differs in case: torch.jit.load reads "
                          "it as TorchScript, torch.load unpickles its data.pkl")
    return next((fmt for record, fmt in _ZIP_KINDS if record in found), Format.ZIP)


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
