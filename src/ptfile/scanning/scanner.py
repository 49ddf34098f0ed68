"""``ptfile.scan``: a static scanner for every pickle a checkpoint holds.  Nothing runs.

What is scanned
---------------
* ZIP archives (torch ≥ 1.6, TorchScript, lite interpreter, ``.pt2``): exactly the records
  torch's ZIP loaders read, with their leniency (names looked up ignoring case, ``.pt2``
  payload configs: :mod:`ptfile.scanning.loaders.zipfamily`), each finding naming its
  loaders, including records the central directory names twice and *shadow* local
  headers it never names; other ``.pkl`` records at most ``unknown``; plus the archive
  anomalies of
  :mod:`ptfile.scanning.containers` (duplicate names, local/central mismatch,
  overlaps, data outside the archive, bytes before the first record, a second
  archive in the comment).
* Legacy streams and plain pickles: the pickles torch's stream loader reads
  from byte 0 (:func:`ptfile.scanning.loaders.stream.legacy_stream`: five in a
  row, magic, protocol, sys_info, object, storage keys, while the first two can
  be what torch wants; both next pickles where a frame outlasts a ``STOP``).  A file of
  no known format is scanned as a pickle when it reads as one from byte 0,
  whatever its first opcode (protocol 0/1 streams open with ``V``, ``S``,
  ``I``, ``]``...): torch unpickles the start of every such file.
* Legacy tar files: the pickles torch's tar loader unpickles, with its
  leniency (:func:`ptfile.scanning.loaders.tar.legacy_tar`: any key types and
  ranks, reading on past records ptfile would refuse); where that model cannot
  tell what torch reads next, an ``unknown`` finding and every pickle in the
  rest of the member.  Members torch never unpickles (``sys_info``, a ``.npy``
  of objects...) and the members of an archive ``tarfile`` refuses are scanned
  whole, their findings at most ``unknown``.  And the stream at byte 0, which
  torch reads when ``tarfile`` refuses the archive or the file object has no
  ``fileno()``, and ``pickle.load`` always.
* The format is the loader's (:func:`ptfile.formats.detect`); a file whose
  first block ``tarfile`` accepts (by its checksum alone: ``ustar`` magic or
  not) is walked as a tar too, as torch tries ``tarfile`` first.
* Each finding names the loaders that would read what it is about
  (:attr:`Finding.loaders <ptfile.scanning.Finding.loaders>`).
* A safetensors file holds no pickle (torch.load reads it through the safetensors
  package): its header is read and checked (:mod:`ptfile.formats.safetensors`), and a
  well-formed one has no findings; a damaged one raises its FormatError or
  LimitExceededError.  Its tensor bytes are not searched.
* A file that is a ZIP *and* starts otherwise (a polyglot) is scanned both ways,
  when the ZIP reads with the offsets it states (as miniz, ``torch.jit.load``'s
  reader, reads it); one only ``zipfile`` finds by shifting its offsets (the
  bytes of a ZIP saved in a storage) is no loader's reading and is not flagged.
* Nested payloads (:mod:`ptfile.scanning.nested`): every byte string or text
  constant that holds a pickle or a ZIP, raw or as base64 or hex text
  (``torch.storage._load_from_bytes``, ``pickle.loads(base64.b64decode(...))``
  and ``bytes.fromhex`` unpickle such constants) is scanned in turn, up to
  ``Limits.max_scan_nesting`` levels, and reported (kind ``nested``, its findings under
  ``<record> > nested@<offset>(<encoding>)``) when it reads as one.
* Bytes after a record's STOP: the consecutive pickles a second
  ``pickle.load`` reads, then any pickle or ZIP that starts in the rest
  (``Limits.max_trailing_probes`` at most).  A legacy stream's bytes after its
  five pickles are raw storages, and are not searched.

Every pickle is walked by :func:`ptfile.picklevm.symbolic.trace`, whose
symbolic stack and memo resolve ``STACK_GLOBAL`` names built indirectly.

Resources: the walk also estimates what CPython's C unpickler (torch.load's, pickle.load's)
would spend on each pickle (:mod:`ptfile.picklevm.symbolic`); a pickle over
``Limits.max_unpickled_bytes`` of objects or ``Limits.max_hash_steps`` tuple hashes gets a
dangerous ``hazard`` finding (``memory``, ``hash-work``: exit 1), as one over
``max_hash_collisions`` or ``max_depth`` does (``hash-flooding``, ``deep-tuples``).

Verdicts are decided in :mod:`ptfile.scanning.verdicts`.  The scan is split by container,
each beside its loader model (:mod:`.loaders`): :mod:`.zip`, :mod:`.tar` and
:mod:`.stream` (pickles, streams, nested payloads); this module detects the format and
hands each source to its container's scan.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .._io.local import FileLike, Source
from .._io.paths import is_path
from .._io.remote import StorageOptions, local_path, open_any
from ..archive import tar
from ..formats import Format, detect
from ..formats.detection import loader_of, torch_reads_safetensors
from ..formats.inputs import Input, InputKind, resolve_input
from ..limits import DEFAULT_LIMITS, Limits
from .loaders.stream import LEGACY_PICKLES
from .loaders.tar import legacy_tar, tarfile_header
from .reads import holds_zip, stream_head
from .stream import Scan, bare_pickle, bytes_source, in_file, looks_like_pickle, scan_file_stream
from .tar import scan_tar, scan_tar_head
from .verdicts import ScanResult, Verdict, raise_if_damaged
from .zip import scan_zip

__all__ = ["scan"]


def _scan_source(s: Scan, source: Source, where: str, depth: int,
                 named_safetensors: bool = False) -> str:
    """Scan ``source`` as the loader detects it (:func:`ptfile.formats.detect`), and as a
    tar too when it has a tar header (torch tries ``tarfile`` first on every non-ZIP file).
    Safetensors bytes are torch.load's safetensors only under a ``.safetensors`` name
    (``named_safetensors``); under any other, torch.load reads them as a tar or a pickle,
    and that reading is judged too (:func:`_scan_torch_reading`)."""
    head = source.pread(0, min(source.size, 512), "file signature")
    fmt = detect(head)
    if fmt is Format.ZIP:
        return scan_zip(s, source, where, depth)
    if fmt is Format.SAFETENSORS:  # data only: its header is checked, damage raises
        from ..formats.safetensors import read_header  # (its dtypes import numpy)

        read_header(source, s.limits)
        if not named_safetensors:
            _scan_torch_reading(s, source, head, where, depth)
        return "safetensors"
    legacy = fmt is Format.LEGACY
    if tar.is_tar(head) or tarfile_header(head):  # tarfile accepts v7 headers too
        scan_tar(s, source, legacy_tar(source, s.limits), depth)
        if not legacy:
            scan_tar_head(s, source, depth)
            return "tar"
    data = stream_head(source, s.limits, LEGACY_PICKLES if legacy else 0)
    if holds_zip(source, s.limits, shifted=False):
        s.add("archive", Verdict.DANGEROUS, where or "file", 0, "", "polyglot",
              message="the file holds a ZIP archive but does not start with one: torch.load "
              "reads the leading bytes, torch.jit.load and ZIP tools the archive")
        scan_zip(s, source, f"{where}(zip)" if where else "(zip)", depth)
    mark = len(s.findings)
    if looks_like_pickle(head) or legacy:
        scan_file_stream(s, data, where, depth, legacy)
        kind = "legacy" if legacy else "pickle"
    elif bare_pickle(s, data, where, depth):
        kind = "pickle"
    else:
        s.add("format", Verdict.UNKNOWN, where or "file", 0,
              message=f"not a known checkpoint format (starts {head[:8].hex(' ')})")
        return "unknown"
    s.findings[mark:] = in_file(s.findings[mark:], where or "stream", s.at(source, 0))
    return kind


def _scan_torch_reading(s: Scan, source: Source, head: bytes, where: str, depth: int) -> None:
    """What torch.load reads in safetensors bytes under another name (a polyglot): the
    tar ``tarfile`` accepts in its first block (and the stream at byte 0, as for every
    tar), else the pickle at byte 0 when the unpickler may reach code there
    (:func:`ptfile.formats.detection.loader_of`'s readings)."""
    if tarfile_header(head):
        scan_tar(s, source, legacy_tar(source, s.limits), depth)
        scan_tar_head(s, source, depth)
    elif loader_of(head, None, source.size) == "pickle":
        bare_pickle(s, stream_head(source, s.limits, 0), where, depth)


def scan(f: FileLike | bytes, *, limits: Limits | None = None,
         storage_options: StorageOptions = None, whole: bool = True) -> ScanResult:
    """Statically scan a checkpoint: every global, call target and anomaly, with verdicts.

    Nothing is imported, called or unpickled.  The scan reads records and
    pickles; tensor data is not read.

    Parameters
    ----------
    f : path, file object, bytes or URL
        The checkpoint.  A URL's file is read by range requests: its pickles
        and records' headers, never the storages.
    limits : Limits, optional
        Ceilings (pickle size, opcodes, names; ``max_hash_collisions`` and
        ``max_depth`` decide the hazard findings).
    storage_options : dict, optional
        For a URL: fsspec's options for its backend.
    whole : bool
        A checkpoint folder: its checkpoint and every other file in it and under it a
        loader reads (:mod:`ptfile.scanning.folders`); False: its checkpoint only (a bulk
        walk scans the others as inputs of their own).

    Returns
    -------
    ScanResult
        ``findings`` with verdicts; ``is_dangerous``, ``is_clean``,
        ``unsafe_globals``, ``to_dict()``.

    Raises
    ------
    OSError
        The file cannot be opened.

    Examples
    --------
    >>> import ptfile
    >>> result = ptfile.scan(b"\\x80\\x02cposix\\nsystem\\nX\\x02\\x00\\x00\\x00hi\\x85R.")
    >>> result.is_dangerous, sorted(result.unsafe_globals)
    (True, ['posix.system'])
    """
    limits = limits or DEFAULT_LIMITS
    record = resolve_input(f, storage_options, limits=limits)
    storage_options = record.storage_options  # a record handed in carries its own
    if record.kind is InputKind.FOLDER:
        raise record.many_files("scan them in bulk (ptfile.bulk.scan, or the command line's scan "
                               "of the folder)")
    if record.is_folder:
        def scan_file(path: object) -> ScanResult:
            return scan(path, limits=limits, storage_options=storage_options)  # type: ignore[arg-type]

        if not whole:
            return _scan_checkpoint_folder(record, scan_file, limits, tags=True)
        from .folders import scan_folder  # its walk reaches a ZeRO run folder's tag folders

        return scan_folder(record, lambda r: _scan_checkpoint_folder(r, scan_file, limits),
                           scan_file)
    f = record.location
    source = bytes_source(bytes(f)) if isinstance(f, (bytes, bytearray, memoryview)) \
        else open_any(f, storage_options=storage_options, mmap=is_path(local_path(f)),
                      access="r", lazy=True, limits=limits)
    try:
        state = Scan(limits, _scan_source, file=source)
        name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
        if source.size == 0:
            state.add("format", Verdict.UNKNOWN, "file", 0, message="empty file")
            fmt = "unknown"
        else:  # torch.load's dispatch by name: only a .safetensors path is safetensors
            fmt = _scan_source(state, source, "", 0,
                               torch_reads_safetensors(None if name is None else str(name)))
        raise_if_damaged(state.findings)
        return ScanResult(str(name) if name is not None else None, fmt, tuple(state.findings))
    finally:
        source.close()


def _scan_checkpoint_folder(record: Input, scan_file: Callable[[object], ScanResult],
                            limits: Limits, *, tags: bool = False) -> ScanResult:
    """A checkpoint folder's checkpoint, as its kind: a DCP checkpoint's pickles, a ZeRO
    folder's rank files (``tags``: a run folder's latest tag folder too), or every
    checkpoint file of a set."""
    if record.kind.is_dcp_readable:
        from .dcp import scan_directory  # (the DCP metadata model imports numpy)

        return scan_directory(record, lambda data: scan(data, limits=limits),
                              limits=limits)
    if record.kind is InputKind.ZERO:  # DeepSpeed's classes read as data
        from .dcp import scan_zero

        return scan_zero(record, scan_file, limits=limits, tags=tags)
    from .dcp import scan_set

    return scan_set(record, scan_file)


