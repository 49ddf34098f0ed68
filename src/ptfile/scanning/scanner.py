"""``ptfile.scan``: a static scanner for every pickle a checkpoint holds.  Nothing runs.

What is scanned
---------------
* ZIP archives (torch ≥ 1.6, TorchScript, ``.pt2``): exactly the records torch's
  ZIP loaders read, with their leniency (names looked up ignoring case, ``.pt2``
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

Verdicts are decided in :mod:`ptfile.scanning.verdicts`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Final

from .._io.local import BytesSource, FileLike, Source, is_path
from .._io.remote import StorageOptions, local_path, open_any
from ..archive import tar
from ..errors import (
    ArchiveError,
    FormatError,
    LimitExceededError,
    PickleStreamError,
    PtfileError,
    UnknownFormatError,
)
from ..formats import Format, detect
from ..formats.detection import ZIP_MARKERS, detect_input, folded_markers, kind_of_markers
from ..limits import DEFAULT_LIMITS, Limits
from ..picklevm._walk import frame_violation
from ..picklevm.opcodes import OPCODES
from ..picklevm.symbolic import GlobalRef, NameUse, Trace, trace
from .containers import Anomaly, TarMember, Window, ZipEntry, read_member, walk_zip
from .fast import fast_names
from .loaders import PICKLE_LOAD, TORCH_LOAD, TORCH_LOAD_UNSAFE
from .loaders.stream import LEGACY_PICKLES, legacy_stream
from .loaders.tar import TarReading, legacy_tar, tarfile_header
from .loaders.zipfamily import Region, ZipModel, zip_regions
from .nested import looks_like_payload, may_hold_payload, nested_payload
from .pt2 import NATIVE_CODE, UNREADABLE_CONFIG
from .reads import holds_zip, next_head, stream_head
from .torchscript import as_torchscript_type, judge_code
from .verdicts import Finding, ScanResult, Verdict, codec_is_standard, verdict_of

__all__ = ["scan"]

#: Bytes that are an opcode: a pickle may start with any of them.
_OPCODE_BYTES: Final = frozenset(bytes([op.code]) for op in OPCODES)
#: ``_codecs.encode``: allowlisted (picklers write bytes with it), but its codec name is
#: looked up, importing ``encodings.<name>``.
_ENCODE: Final = ("_codecs", "encode")
#: The FRAME opcode.
_FRAME_BYTE: Final = b"\x95"
#: numpy array reconstruction: fine for numbers, dangerous with dtype ``object``.
_NUMPY_DTYPE: Final = frozenset({("numpy", "dtype"), ("numpy.core.multiarray", "dtype")})


@dataclass(slots=True)
class _Scan:
    """One scan's state: limits, findings, and the nested scans left (shared by probes)."""

    limits: Limits
    findings: list[Finding] = field(default_factory=list)
    #: Nested scans left (``Limits.max_nested_scans`` at first), shared by the probes.
    budget: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.budget:
            self.budget.append(self.limits.max_nested_scans)

    def add(self, *args: Any, **kwargs: Any) -> None:
        self.findings.append(Finding(*args, **kwargs))

    def probe(self) -> _Scan:
        """A scan whose findings are kept only if the caller decides so (same budget)."""
        return _Scan(self.limits, budget=self.budget)

    def spend(self, where: str) -> bool:
        """Take one nested scan from the budget; False (and one finding) when none is left."""
        self.budget[0] -= 1
        if self.budget[0] == -1:
            self.add("limit", Verdict.UNKNOWN, where, None, "", "nested-scans", message=(
                f"more than {self.limits.max_nested_scans} nested payloads "
                "(Limits.max_nested_scans): the rest are not scanned"))
        return self.budget[0] >= 0


def _name_finding(s: _Scan, use: NameUse, where: str) -> None:
    if not use.resolved:
        s.add("global", Verdict.DANGEROUS, where, use.pos, use.module, use.name, use.opcode,
              "STACK_GLOBAL with a module or name that is not a string literal: the name is "
              "computed while unpickling and cannot be known statically")
        return
    verdict = verdict_of(use.module, use.name)
    s.add("global", verdict, where, use.pos, use.module, use.name, use.opcode,
          f"imports {use.module}.{use.name}")


def _codec_calls(s: _Scan, info: Trace, where: str) -> None:
    for call in info.calls:
        func = call.func
        if isinstance(func, GlobalRef) and (func.module, func.name) == _ENCODE \
                and not codec_is_standard(call.args):
            s.add("codec", Verdict.DANGEROUS, where, call.pos, func.module, func.name,
                  call.opcode, "_codecs.encode with a codec outside the standard set: the "
                  "lookup imports an encodings module by that name")


def _object_arrays(s: _Scan, info: Trace, where: str) -> None:
    for call in info.calls:
        func = call.func
        if isinstance(func, GlobalRef) and (func.module.replace("._core", ".core"),
                                            func.name) in _NUMPY_DTYPE | {("numpy.core.multiarray", "dtype")} \
                and isinstance(call.args, tuple) and call.args \
                and isinstance(call.args[0], str) and call.args[0].lstrip("|<>=").startswith("O"):
            s.add("numpy-object-array", Verdict.DANGEROUS, where, call.pos, func.module,
                  func.name, call.opcode, "a numpy array of dtype object: its items are "
                  "arbitrary pickled objects")


def _hazards(s: _Scan, info: Trace, where: str) -> None:
    if info.max_collisions > s.limits.max_hash_collisions:
        s.add("hazard", Verdict.DANGEROUS, where, None, "", "hash-flooding", "",
              f"{info.max_collisions} distinct dict/set keys share one hash value: inserting "
              "them takes quadratic time")
    if info.max_tuple_depth > s.limits.max_depth:
        s.add("hazard", Verdict.DANGEROUS, where, None, "", "deep-tuples", "",
              f"tuples nest {info.max_tuple_depth} deep: hashing one recurses in C and can "
              "overflow the stack")
    if info.alloc_bytes > s.limits.max_unpickled_bytes:
        s.add("hazard", Verdict.DANGEROUS, where, None, "", "memory", "",
              f"CPython's unpickler would allocate about {info.alloc_bytes:,} bytes "
              f"({info.objects:,} objects; estimate), over Limits.max_unpickled_bytes "
              f"({s.limits.max_unpickled_bytes:,}): torch.load and pickle.load run out of memory")
    if info.hash_steps > s.limits.max_hash_steps:
        s.add("hazard", Verdict.DANGEROUS, where, None, "", "hash-work", "",
              f"hashing the dict/set keys takes about {info.hash_steps:,} tuple hashes (keys "
              f"of shared tuples), over Limits.max_hash_steps ({s.limits.max_hash_steps:,}): "
              "torch.load and pickle.load hang")


def _allowed(module: str, name: str) -> bool:
    return verdict_of(module, name) is Verdict.ALLOWED


def _scan_pickle(s: _Scan, data: bytes, where: str, start: int = 0, depth: int = 0) -> int:
    """Scan the pickle at ``data[start:]``; returns the offset after STOP (or -1)."""
    fast = fast_names(data, start, s.limits, _allowed, may_hold_payload)
    if fast is not None:  # plainly clean, as CPython itself resolves it (see .fast)
        names, end = fast
        for module, name in names:
            s.add("global", Verdict.ALLOWED, where, None, module, name, "",
                  f"imports {module}.{name}")
        return end
    try:
        info = trace(data, start, limits=s.limits)
    except PtfileError as exc:
        s.add("stream", Verdict.UNKNOWN, where, start, message=f"not a readable pickle: {exc}")
        return -1
    _frames(s, data, start, info.end, where)
    for use in info.names:
        _name_finding(s, use, where)
    for code, pos in info.exts:
        s.add("ext", Verdict.UNKNOWN, where, pos, "", str(code), "EXT",
              f"extension code {code}: resolved through copyreg's process-wide registry, "
              "which is empty in a fresh interpreter (torch and CPython then raise); a "
              "process that registered codes would import what it maps them to")
    for use in info.global_builds:
        s.add("build-on-global", Verdict.DANGEROUS, where, use.pos, use.module, use.name,
              use.opcode, "BUILD sets attributes on an imported object (smuggles names past "
              "scanners, or changes the object for everyone who imports it)")
    if info.error is not None:
        s.add("stream", Verdict.UNKNOWN, where, None, message=f"the unpickler stops: {info.error}")
    _object_arrays(s, info, where)
    _codec_calls(s, info, where)
    _hazards(s, info, where)
    for blob, pos in info.blobs:
        _scan_blob(s, blob, f"{where} > nested@{pos:#x}", depth)
    return info.end


def _frames(s: _Scan, data: bytes, start: int, end: int, where: str) -> None:
    """Rule 6 of :mod:`ptfile.picklevm.lexer`: an opcode that straddles a frame's end reads
    differently in CPython's C unpickler over a ``BytesIO`` (torch.load's ZIP records), which
    takes its argument from after the frame, than in this walk: what that unpickler would run
    is hidden, so the stream is dangerous."""
    if end <= start or _FRAME_BYTE not in data[start:end]:
        return
    try:
        found = frame_violation(data, start, end, s.limits)
    except PtfileError:
        return  # a damaged stream: the walk reports it
    if found is not None:
        s.add("frame", Verdict.DANGEROUS, where, found[0], "", "frame-straddle", "FRAME",
              f"{found[1]}; CPython's unpickler over a BytesIO, as torch.load reads ZIP "
              "records, takes opcodes this walk does not see")


def _looks_like_pickle(blob: bytes) -> bool:
    return len(blob) >= 2 and ((blob[0] == 0x80 and 1 <= blob[1] <= 5)
                               or (blob[:1] in (b"c", b"(") and blob.rstrip().endswith(b".")))


def _scan_blob(s: _Scan, blob: bytes, where: str, depth: int) -> None:
    """A constant that holds a pickle or a ZIP, raw or as base64/hex text
    (:mod:`ptfile.scanning.nested`): scanned, and reported when it reads as one."""
    encoding = "bytes"
    if not looks_like_payload(blob):
        found = nested_payload(blob, s.limits.max_pickle_bytes)
        if found is None:
            return
        encoding, blob = found
        where = f"{where}({encoding})"
    if depth >= s.limits.max_scan_nesting:
        s.add("nested", Verdict.DANGEROUS, where, 0,
              message=f"pickles nested more than {s.limits.max_scan_nesting} deep")
        return
    if not s.spend(where):
        return
    probe = s.probe()
    archive = blob.startswith(b"PK\x03\x04")
    if archive:
        _scan_source(probe, _bytes_source(blob), where, depth + 1)
    else:
        _scan_stream(probe, blob, where, depth + 1)
    if any(f.location == where and (f.kind == "format" if archive else
                                    f.kind == "stream" and f.offset == 0)
           for f in probe.findings):
        return  # bytes that merely start like one: data, not a payload
    s.add("nested", Verdict.ALLOWED, where, 0, message=(
        f"{'base64' if encoding == 'base64' else 'hex' if encoding == 'hex' else 'a byte'} "
        f"{'string' if encoding == 'bytes' else 'text'} holding "
        f"{'a ZIP archive' if archive else 'a pickle'}: whoever loads it runs what the "
        "findings under this location name"))
    s.findings.extend(probe.findings)


def _scan_trailing(s: _Scan, data: bytes, pos: int, where: str, depth: int) -> None:
    """The bytes after STOP: consecutive pickles (``pickle.load`` called again reads them:
    second pickles in a record), then pickles or ZIPs that start anywhere in the rest.
    As many consecutive pickles as torch's legacy loader reads in a row (a fact of
    torch, not a ceiling: the scanning budgets are ``Limits`` fields)."""
    for i in range(LEGACY_PICKLES):
        probe = s.probe()
        end = _scan_pickle(probe, data, f"{where} (after STOP #{i + 1})", pos, depth)
        if end <= pos:
            break
        s.findings.extend(probe.findings)
        pos = end
        if pos >= len(data):
            return
    at, probes, most = pos, 0, s.limits.max_trailing_probes
    while (at := next_head(data, at)) >= 0:
        if probes == most:
            s.add("limit", Verdict.UNKNOWN, where, at, "", "trailing-probes", message=(
                f"more than {most} places after STOP where a pickle or a ZIP may start "
                "(Limits.max_trailing_probes): the rest are not searched"))
            break
        if not s.spend(where):
            break
        probes += 1
        at = max(at + 1, _scan_head(s, data, at, f"{where} (after STOP@{at:#x})", depth))


def _scan_head(s: _Scan, data: bytes, at: int, label: str, depth: int) -> int:
    """The pickle or ZIP that may start at ``data[at]``, kept when it reads as one (read in
    place: no copy of the rest); returns where its pickle ends (or -1)."""
    probe, end = s.probe(), -1
    if data.startswith(b"PK\x03\x04", at):
        if depth < s.limits.max_scan_nesting:
            _scan_source(probe, Window(_bytes_source(data), at, len(data) - at), label,
                         depth + 1)
        unread = any(f.location == label and f.kind == "format" for f in probe.findings)
    else:
        end = _scan_pickle(probe, data, label, at, depth + 1)
        unread = any(f.location == label and f.kind == "stream" and f.offset == at
                     for f in probe.findings)
    if not unread:
        s.findings.extend(probe.findings)
    return end


def _scan_stream(s: _Scan, data: bytes, where: str, depth: int, count: int = 1) -> None:
    """Consecutive pickles at the start of ``data`` (legacy: five; plain pickles: one+)."""
    pos = 0
    for i in range(max(count, 1)):
        label = where if count == 1 else f"{where}#{i}"
        end = _scan_pickle(s, data, label, pos, depth)
        if end < 0:
            return
        pos = end
        if pos >= len(data):
            return
    if count == 1 and pos < len(data):
        s.add("stream", Verdict.UNKNOWN, where, pos, message=f"{len(data) - pos} bytes after "
              "STOP: loaders ignore them, other tools may not")
        _scan_trailing(s, data, pos, where, depth)


def _tag(s: _Scan, findings: list[Finding], loaders: tuple[str, ...],
         dedupe: bool = False) -> None:
    """Keep ``findings``, each naming ``loaders`` (where it names none yet); ``dedupe``:
    only those not already found (same kind, verdict, offset and name)."""
    seen = {(f.kind, f.verdict, f.offset, f.module, f.name) for f in s.findings} \
        if dedupe else set()
    for f in findings:
        if (f.kind, f.verdict, f.offset, f.module, f.name) in seen:
            continue
        s.findings.append(f if f.loaders else dataclasses.replace(f, loaders=loaders))


def _scan_file_stream(s: _Scan, data: bytes, where: str, depth: int, legacy: bool) -> None:
    """The pickles torch's stream loader and ``pickle.load`` read from byte 0 of a file
    (:func:`.loaders.stream.legacy_stream`), each finding naming its loaders; for a file
    that is not a legacy stream, the bytes after the first pickle as :func:`_scan_stream`
    reads them too (``pickle.load`` called again, pickles hidden there)."""
    label, first_end = where or "stream", -1
    for region in legacy_stream(data, s.limits):
        name = label if region.label == "#0" and not legacy else f"{label}{region.label}"
        probe = s.probe()
        end = _scan_pickle(probe, data, name, region.start, depth)
        _tag(s, probe.findings, region.loaders)
        if region.label == "#0":
            first_end = end
    if not legacy and 0 < first_end < len(data):
        s.add("stream", Verdict.UNKNOWN, label, first_end, message=f"{len(data) - first_end} "
              "bytes after STOP: loaders ignore them, other tools may not",
              loaders=(TORCH_LOAD_UNSAFE, TORCH_LOAD))
        probe = s.probe()
        _scan_trailing(probe, data, first_end, label, depth)
        _tag(s, probe.findings, (TORCH_LOAD_UNSAFE, TORCH_LOAD), dedupe=True)


def _bare_pickle(s: _Scan, data: bytes, where: str, depth: int) -> bool:
    """Scan ``data`` as a pickle when it reads as one from byte 0, whatever its first opcode.

    torch unpickles the start of every file that is neither a ZIP nor a tar (its
    legacy loader's first pickle), so a protocol 0/1 stream that opens with ``V``,
    ``S``, ``I``, ``]``, ``N``... runs as surely as one that opens with ``PROTO``.
    """
    if data[:1] not in _OPCODE_BYTES:
        return False
    probe = s.probe()
    _scan_file_stream(probe, data, where, depth, legacy=False)
    if any(f.kind == "stream" and f.offset == 0 for f in probe.findings):
        return False  # not a readable pickle at byte 0
    s.findings.extend(probe.findings)
    return True


def _bytes_source(data: bytes) -> Source:
    return BytesSource(data)


def _scan_zip(s: _Scan, source: Source, where: str, depth: int, eocd: int | None = None) -> str:
    """A ZIP: its anomalies, then exactly the records torch's loaders read
    (:func:`ptfile.scanning.loaders.zipfamily.zip_regions`), each finding naming its
    loaders; pickle-named records no loader reads are scanned, at most ``unknown``."""
    walked = walk_zip(source, s.limits, eocd)
    if walked is None:
        s.add("format", Verdict.UNKNOWN, where, None, message="no ZIP end record")
        return "unknown"
    entries, anomalies = walked
    for anomaly in anomalies:
        _anomaly(s, anomaly, where)
        if depth >= s.limits.max_scan_nesting:
            continue
        if anomaly.region is not None and 0 < anomaly.region[1] < source.size:
            start, size = anomaly.region
            _scan_source(s, Window(source, start, size), f"{where}({anomaly.code}@{start:#x})",
                         depth + 1)
        if anomaly.eocd is not None:
            _scan_zip(s, source, f"{where}({anomaly.code}@{anomaly.eocd:#x})", depth + 1,
                      anomaly.eocd)
    fmt = _zip_kind(s, entries, where)
    model = zip_regions(entries, lambda entry: _read_quiet(s, source, entry))
    if model.guessed:
        s.add("archive", Verdict.UNKNOWN, where or "archive", None, "", UNREADABLE_CONFIG,
              message=f"torch.export.load reads the records its payload configs name, and "
              f"{'; '.join(model.guessed)[:500]}: every record was scanned as one "
              "torch.load may read")
    for region in model.regions:
        mark = len(s.findings)
        label = f"{where}:{region.entry.name}" if where else region.entry.name
        _scan_pt2_record(s, source, region, label, depth)
        s.findings[mark:] = [_read_by(f, region, model) for f in s.findings[mark:]]
    for entry in model.unread:
        data = _read_record(s, source, entry, label := f"{where}:{entry.name}" if where
                            else entry.name)
        if data is not None:
            probe = s.probe()
            _scan_stream(probe, data, label, depth)
            s.findings.extend(map(_unread_record, probe.findings))
    return fmt


def _unread_record(f: Finding) -> Finding:
    """A finding in a pickle-named record no torch loader reads (``bytecode.pkl``, another
    folder's ``data.pkl``): at most ``unknown``, as only another tool would read it."""
    if f.verdict is not Verdict.DANGEROUS:
        return f
    return dataclasses.replace(f, verdict=Verdict.UNKNOWN, message=f"{f.message} (in a "
                               "record no torch loader reads)")


def _zip_kind(s: _Scan, entries: list[ZipEntry], where: str) -> str:
    """The archive's kind by :func:`ptfile.formats.detection.kind_of_markers` (the one
    decision ``detect_format`` makes); one torch's loaders read as two things is an
    ``ambiguous-kind`` anomaly (``ptfile.load`` refuses it; every reading is scanned)."""
    names = [e.name for e in entries if not e.shadow]
    folder = names[0].split("/", 1)[0] if names and "/" in names[0] else ""
    found = folded_markers(names, folder)
    exact = set(names)
    try:
        return kind_of_markers(found, {m for m in ZIP_MARKERS if f"{folder}/{m}" in exact}).value
    except FormatError as exc:
        s.add("archive", Verdict.UNKNOWN, where or "archive", None, "", "ambiguous-kind",
              message=str(exc))
        return "pt2" if "archive_format" in found else "torchscript"


def _read_by(f: Finding, region: Region, model: ZipModel) -> Finding:
    """A finding of ``region``, naming the loaders that read it (a TorchScript class
    reference where ``torch.jit.load`` reads the archive)."""
    if model.jit:
        f = as_torchscript_type(f)
    return dataclasses.replace(f, loaders=region.loaders)


def _read_quiet(s: _Scan, source: Source, entry: ZipEntry) -> bytes | None:
    """A record's bytes for the loader model (a payload config), None when unreadable."""
    try:
        return read_member(source, entry, s.limits)
    except LimitExceededError:
        return None


def _scan_pt2_record(s: _Scan, source: Source, region: Region, label: str,
                     depth: int) -> None:
    """One record a loader reads, as it reads it (:data:`~.loaders.zipfamily.How`): a
    pickle, a whole file ``torch.load`` reads (``guess``: kept only when it reads as one),
    TorchScript code, or native code."""
    entry = region.entry
    if region.how == "native":
        s.add(NATIVE_CODE, Verdict.DANGEROUS, label, entry.header_offset, "",
              entry.name.rsplit("/", 1)[-1], message="AOTInductor compiled code: "
              "torch.export.load loads the compiled model, which runs native code")
        return
    data = _read_record(s, source, entry, label)
    if data is None:
        return
    if region.how == "code":
        verdict, message = judge_code(data.decode("utf-8", "replace"), s.limits)
        s.add("torchscript-code", verdict, label, entry.header_offset, "",
              entry.name.rsplit("/", 1)[-1], message=message)
    elif region.how == "pickle":
        _scan_stream(s, data, label, depth)
    elif not data:
        return
    elif depth >= s.limits.max_scan_nesting:
        s.add("nested", Verdict.DANGEROUS, label, 0,
              message=f"pickles nested more than {s.limits.max_scan_nesting} deep")
    elif region.how == "file":
        _scan_source(s, _bytes_source(data), label, depth + 1)
    else:  # guess: raw tensor bytes are data, what reads as a pickle or archive is scanned
        probe = s.probe()
        _scan_source(probe, _bytes_source(data), label, depth + 1)
        if not any(f.location == label and f.kind == "format" for f in probe.findings):
            s.findings.extend(probe.findings)


def _read_record(s: _Scan, source: Source, entry: ZipEntry, label: str) -> bytes | None:
    """A record's bytes, or None with a finding (unreadable, or a limit hit)."""
    try:
        data = read_member(source, entry, s.limits)
    except LimitExceededError as exc:  # a bomb: what it hides is not scanned
        s.add("limit", Verdict.DANGEROUS, label, entry.data_offset, "",
              "max_inflate_ratio", message=f"not scanned: {exc}")
        return None
    if data is None:
        s.add("stream", Verdict.UNKNOWN, label, entry.data_offset,
              message="record cannot be read (method or bounds)")
    return data


#: Archive anomalies that make readers read different records: dangerous, whatever each
#: reads (the others are ``unknown``).  Names that collide exactly or by case (miniz and
#: ``zipfile`` pick different ones); a directory that ends before the end records
#: (``zipfile`` shifts every offset); a file that is a ZIP but starts otherwise (torch
#: unpickles its start, ZIP tools read the archive); local headers the directory never
#: names, or that disagree with it (what readers that scan forward read).
DIVERGENT_ANOMALIES: Final = frozenset({"duplicate-name", "case-colliding-names",
                                        "shifted-directory", "polyglot", "shadow-record",
                                        "local-header-mismatch"})


def _anomaly(s: _Scan, anomaly: Anomaly, where: str) -> None:
    label = anomaly.member or where or "archive"
    verdict = Verdict.DANGEROUS if anomaly.code in DIVERGENT_ANOMALIES else Verdict.UNKNOWN
    s.add("archive", verdict, label, anomaly.offset, "", anomaly.code, message=anomaly.message)


def _scan_tar(s: _Scan, source: Source, reading: TarReading, depth: int) -> None:
    """A tar as torch's tar loader reads it (:func:`.loaders.tar.legacy_tar`): the pickles
    it unpickles, where the model cannot tell (``unknown``, and the rest of that member
    searched), and the other members (at most ``unknown``: only other tools read them).
    When ``tarfile`` refuses the archive, torch reads none of it (at most ``unknown``)."""
    for anomaly in reading.anomalies:
        _anomaly(s, anomaly, "tar")
    if not reading.is_tar:
        s.add("archive", Verdict.UNKNOWN, "tar", 0, "", "tarfile-refuses",
              message=f"torch's tarfile refuses this archive ({reading.why_not}): torch.load "
              "reads the file as a stream, other tools may read the members",
              loaders=(TORCH_LOAD_UNSAFE,))
    if not reading.is_tar:  # torch reads no member: each is scanned whole, at most unknown
        for member in reading.members:
            probe = s.probe()
            _scan_tar_member(probe, _member_bytes(s, source, reading, member),
                             f"tar:{member.name}", 0, depth)
            s.findings.extend(_unread(f) for f in probe.findings)
        return
    for member, offset, why in reading.unknown:
        label = f"tar:{member.name}" if member.name else "tar"
        s.add("tar-loader", Verdict.UNKNOWN, label, member.offset + offset, message=(
            f"what torch's tar loader reads next cannot be told: {why}"),
            loaders=(TORCH_LOAD_UNSAFE,))
    read: set[int] = set()
    for region in reading.regions:
        member = region.member
        read.add(member.offset)
        probe = s.probe()
        _scan_pickle(probe, reading.data[member.offset], f"tar:{member.name}", region.start,
                     depth)
        _tag(s, probe.findings, region.loaders)
    for member, offset in reading.search:
        probe = s.probe()
        _scan_tar_member(probe, reading.data[member.offset], f"tar:{member.name}", offset,
                         depth)
        _tag(s, probe.findings, (TORCH_LOAD_UNSAFE,), dedupe=True)
    for member in reading.members:
        if member.offset not in read:
            probe = s.probe()
            _scan_tar_member(probe, _member_bytes(s, source, reading, member),
                             f"tar:{member.name}", 0, depth)
            s.findings.extend(_unread(f) for f in probe.findings)


def _member_bytes(s: _Scan, source: Source, reading: TarReading, member: TarMember) -> bytes:
    """A member's bytes (read by the model already, or up to ``Limits.max_pickle_bytes``)."""
    data = reading.data.get(member.offset)
    if data is None:
        data = source.pread(member.offset, min(member.size, s.limits.max_pickle_bytes),
                            f"tar member {member.name}")
    return data


def _unread(f: Finding) -> Finding:
    """A finding in a tar member torch never unpickles (a ``.npy`` of objects, say): at
    most ``unknown``, as only another tool would read it."""
    if f.verdict is not Verdict.DANGEROUS:
        return f
    return dataclasses.replace(f, verdict=Verdict.UNKNOWN, message=f"{f.message} (in a "
                               "member torch.load never unpickles)")


def _scan_tar_member(s: _Scan, data: bytes, label: str, pos: int, depth: int) -> None:
    """Every pickle from ``data[pos:]`` a lenient reader might read: consecutive pickles
    from there, and from every place a pickle may start after bytes that are none
    (:func:`.reads.next_head`: ``PROTO``, a protocol 0/1 ``GLOBAL`` line)."""
    found, most = 0, s.limits.max_tar_pickles
    while 0 <= pos < len(data):
        if found == most:
            s.add("limit", Verdict.UNKNOWN, label, pos, "", "tar-pickles", message=(
                f"more than {most} pickles in one member (Limits.max_tar_pickles): the "
                "rest is not searched"))
            break
        end = _scan_pickle(_probe := s.probe(), data, label, pos, depth)
        if end > pos:
            s.findings.extend(_probe.findings)
            found, pos = found + 1, end
        else:
            pos = next_head(data, pos + 1)


def _scan_tar_head(s: _Scan, source: Source, depth: int) -> None:
    """The stream at byte 0 of a tar: torch reads it when ``tarfile`` refuses the archive
    (any ``TarError``) or when given a file object without ``fileno()``, and
    ``pickle.load`` always (:func:`.loaders.stream.legacy_stream`).

    The first header is read, and more (eight times as much each time, up to
    ``Limits.max_pickle_bytes``) while a pickle there runs past what was read.
    """
    window, most = tar.BLOCK, min(source.size, s.limits.max_pickle_bytes)
    while True:
        probe = s.probe()
        _scan_file_stream(probe, source.pread(0, min(window, most), "tar head"), "tar(byte 0)",
                          depth, legacy=True)
        if window >= most or not any(f.kind == "stream" and "truncated" in f.message
                                     for f in probe.findings):
            break
        window *= 8
    if any(f.kind != "stream" for f in probe.findings):  # it read as a pickle, not as a name
        s.add("archive", Verdict.UNKNOWN, "tar", 0, "", "pickle-in-tar-header",
              message="the first tar header starts with a pickle: torch unpickles it when "
              "tarfile cannot read the archive or the file has no fileno()",
              loaders=(TORCH_LOAD_UNSAFE, TORCH_LOAD, PICKLE_LOAD))
        s.findings.extend(probe.findings)


def _scan_source(s: _Scan, source: Source, where: str, depth: int) -> str:
    """Scan ``source`` as the loader detects it (:func:`ptfile.formats.detect`), and as a
    tar too when it has a tar header (torch tries ``tarfile`` first on every non-ZIP file)."""
    head = source.pread(0, min(source.size, 512), "file signature")
    fmt = detect(head)
    if fmt is Format.ZIP:
        return _scan_zip(s, source, where, depth)
    if fmt is Format.SAFETENSORS:  # data only: its header is checked, damage raises
        from ..formats.safetensors import read_header  # (its dtypes import numpy)

        read_header(source, s.limits)
        return "safetensors"
    legacy = fmt is Format.LEGACY
    if tar.is_tar(head) or tarfile_header(head):  # tarfile accepts v7 headers too
        _scan_tar(s, source, legacy_tar(source, s.limits), depth)
        if not legacy:
            _scan_tar_head(s, source, depth)
            return "tar"
    data = stream_head(source, s.limits, LEGACY_PICKLES if legacy else 0)
    if holds_zip(source, s.limits, shifted=False):
        s.add("archive", Verdict.DANGEROUS, where or "file", 0, "", "polyglot",
              message="the file holds a ZIP archive but does not start with one: torch.load "
              "reads the leading bytes, torch.jit.load and ZIP tools the archive")
        _scan_zip(s, source, f"{where}(zip)" if where else "(zip)", depth)
    if _looks_like_pickle(head) or legacy:
        _scan_file_stream(s, data, where, depth, legacy)
        return "legacy" if legacy else "pickle"
    if _bare_pickle(s, data, where, depth):
        return "pickle"
    s.add("format", Verdict.UNKNOWN, where or "file", 0,
          message=f"not a known checkpoint format (starts {head[:8].hex(' ')})")
    return "unknown"


def scan(f: FileLike | bytes, *, limits: Limits | None = None,
         storage_options: StorageOptions = None) -> ScanResult:
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
    if detect_input(f, storage_options).is_folder:  # a DCP checkpoint: its pickles, each a file
        from .dcp import scan_directory  # (the DCP metadata model imports numpy)

        return scan_directory(f, lambda data: scan(data, limits=limits),  # type: ignore[arg-type]
                              limits=limits, storage_options=storage_options)
    source = _bytes_source(bytes(f)) if isinstance(f, (bytes, bytearray, memoryview)) \
        else open_any(f, storage_options=storage_options, mmap=is_path(local_path(f)),
                      access="r", lazy=True, limits=limits)
    try:
        state = _Scan(limits)
        if source.size == 0:
            state.add("format", Verdict.UNKNOWN, "file", 0, message="empty file")
            fmt = "unknown"
        else:
            fmt = _scan_source(state, source, "", 0)
        name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
        _raise_if_damaged(state.findings)
        return ScanResult(str(name) if name is not None else None, fmt, tuple(state.findings))
    finally:
        source.close()


#: Findings that say the file cannot be read, not what it would run: the container or
#: a pickle in it ends, or is not one.  Each ``stream`` message starts with one of these.
_DAMAGE_STREAM: Final = ("not a readable pickle", "the unpickler stops",
                         "record cannot be read")


def _is_damage(f: Finding) -> bool:
    return f.kind == "format" or (f.kind == "stream" and f.message.startswith(_DAMAGE_STREAM))


def _raise_if_damaged(findings: list[Finding]) -> None:
    """Raise the :class:`FormatError` of a damaged or unknown file: one whose every
    finding short of ``allowed`` says it cannot be read (empty, random bytes, a ZIP with
    no end record, a pickle cut short) — an error, exit 2, not ``unknown`` globals that
    ``--allow-unknown`` would pass.  A file with anything else to report (a dangerous or
    unknown global before the damage, an anomaly) keeps its findings and verdict: the
    loaders may run what comes before the damage."""
    worry = [f for f in findings if f.verdict is not Verdict.ALLOWED]
    if not worry or not all(map(_is_damage, worry)):
        return
    first = worry[0]
    cls: type[FormatError] = (
        ArchiveError if "ZIP" in first.message else
        UnknownFormatError if first.kind == "format" else PickleStreamError)
    member = first.location if first.location not in ("", "file") else None
    raise cls(f"cannot scan: {first.message}", offset=first.offset, member=member)
