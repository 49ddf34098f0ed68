"""The stream scan: every pickle at and after a place in some bytes, and the payloads nested in them.

The container every other one comes down to.  :func:`scan_pickle` walks one pickle
(:func:`ptfile.picklevm.symbolic.trace`, or :func:`.fast.fast_names` when it is plainly
clean) and turns what it names, calls and costs into findings; the byte and text
constants that hold a pickle or a ZIP are scanned in turn (:mod:`.nested`), and so are
the bytes after a ``STOP`` (:func:`scan_stream`).  :func:`scan_file_stream` reads the
pickles at byte 0 of a file as torch's stream loader and ``pickle.load`` do
(:func:`.loaders.stream.legacy_stream`, the loader model beside it).

:class:`Scan` is one scan's state; its ``scan_source`` is the scanner's dispatch by
format (:mod:`.scanner`), which a nested ZIP is handed to.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from .._io.local import BytesSource, Source
from ..errors import PtfileError
from ..limits import Limits
from ..picklevm._walk import frame_violation
from ..picklevm.opcodes import OPCODES
from ..picklevm.symbolic import GlobalRef, NameUse, Trace, trace
from .containers import Window
from .fast import fast_names
from .loaders import TORCH_LOAD, TORCH_LOAD_UNSAFE
from .loaders.stream import LEGACY_PICKLES, legacy_stream
from .nested import looks_like_payload, may_hold_payload, nested_payload
from .reads import next_head
from .verdicts import Finding, Verdict, codec_is_standard, verdict_of

__all__ = ["Scan", "bare_pickle", "bytes_source", "in_file", "looks_like_pickle",
           "scan_file_stream", "scan_pickle", "scan_stream", "tag"]


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
class Scan:
    """One scan's state: limits, findings, and the nested scans left (shared by probes)."""

    limits: Limits
    #: The scan of a whole source (a nested ZIP, a record that is a file): the scanner's
    #: dispatch by format (:func:`ptfile.scanning.scanner.scan`), given here so that the
    #: containers' scans call it without importing it.
    scan_source: Callable[[Scan, Source, str, int], str]
    findings: list[Finding] = field(default_factory=list)
    #: Nested scans left (``Limits.max_nested_scans`` at first), shared by the probes.
    budget: list[int] = field(default_factory=list)
    #: The file scanned (its source): offsets in it are bytes of the file
    #: (:attr:`Finding.file_offset`); None when scanning bytes.
    file: Source | None = None

    def __post_init__(self) -> None:
        if not self.budget:
            self.budget.append(self.limits.max_nested_scans)

    def add(self, *args: Any, **kwargs: Any) -> None:
        self.findings.append(Finding(*args, **kwargs))

    def probe(self) -> Scan:
        """A scan whose findings are kept only if the caller decides so (same budget)."""
        return Scan(self.limits, self.scan_source, budget=self.budget, file=self.file)

    def at(self, source: Source, offset: int | None) -> int | None:
        """``offset`` in ``source`` as a byte of the file: itself when ``source`` is the
        file scanned, else None (a window, a record's bytes)."""
        return offset if source is self.file else None

    def spend(self, where: str) -> bool:
        """Take one nested scan from the budget; False (and one finding) when none is left."""
        self.budget[0] -= 1
        if self.budget[0] == -1:
            self.add("limit", Verdict.UNKNOWN, where, None, "", "nested-scans", message=(
                f"more than {self.limits.max_nested_scans} nested payloads "
                "(Limits.max_nested_scans): the rest are not scanned"))
        return self.budget[0] >= 0


def _name_finding(s: Scan, use: NameUse, where: str) -> None:
    if not use.resolved:
        s.add("global", Verdict.DANGEROUS, where, use.pos, use.module, use.name, use.opcode,
              "STACK_GLOBAL with a module or name that is not a string literal: the name is "
              "computed while unpickling and cannot be known statically")
        return
    verdict = verdict_of(use.module, use.name)
    s.add("global", verdict, where, use.pos, use.module, use.name, use.opcode,
          f"imports {use.module}.{use.name}")


def _codec_calls(s: Scan, info: Trace, where: str) -> None:
    for call in info.calls:
        func = call.func
        if isinstance(func, GlobalRef) and (func.module, func.name) == _ENCODE \
                and not codec_is_standard(call.args):
            s.add("codec", Verdict.DANGEROUS, where, call.pos, func.module, func.name,
                  call.opcode, "_codecs.encode with a codec outside the standard set: the "
                  "lookup imports an encodings module by that name")


def _object_arrays(s: Scan, info: Trace, where: str) -> None:
    for call in info.calls:
        func = call.func
        if isinstance(func, GlobalRef) and (func.module.replace("._core", ".core"),
                                            func.name) in _NUMPY_DTYPE | {("numpy.core.multiarray", "dtype")} \
                and isinstance(call.args, tuple) and call.args \
                and isinstance(call.args[0], str) and call.args[0].lstrip("|<>=").startswith("O"):
            s.add("numpy-object-array", Verdict.DANGEROUS, where, call.pos, func.module,
                  func.name, call.opcode, "a numpy array of dtype object: its items are "
                  "arbitrary pickled objects")


def _hazards(s: Scan, info: Trace, where: str) -> None:
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


def scan_pickle(s: Scan, data: bytes, where: str, start: int = 0, depth: int = 0) -> int:
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


def _frames(s: Scan, data: bytes, start: int, end: int, where: str) -> None:
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


def looks_like_pickle(blob: bytes) -> bool:
    return len(blob) >= 2 and ((blob[0] == 0x80 and 1 <= blob[1] <= 5)
                               or (blob[:1] in (b"c", b"(") and blob.rstrip().endswith(b".")))


def _scan_blob(s: Scan, blob: bytes, where: str, depth: int) -> None:
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
        s.scan_source(probe, bytes_source(blob), where, depth + 1)
    else:
        scan_stream(probe, blob, where, depth + 1)
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


def _scan_trailing(s: Scan, data: bytes, pos: int, where: str, depth: int) -> None:
    """The bytes after STOP: consecutive pickles (``pickle.load`` called again reads them:
    second pickles in a record), then pickles or ZIPs that start anywhere in the rest.
    As many consecutive pickles as torch's legacy loader reads in a row (a fact of
    torch, not a ceiling: the scanning budgets are ``Limits`` fields)."""
    for i in range(LEGACY_PICKLES):
        probe = s.probe()
        end = scan_pickle(probe, data, f"{where} (after STOP #{i + 1})", pos, depth)
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


def _scan_head(s: Scan, data: bytes, at: int, label: str, depth: int) -> int:
    """The pickle or ZIP that may start at ``data[at]``, kept when it reads as one (read in
    place: no copy of the rest); returns where its pickle ends (or -1)."""
    probe, end = s.probe(), -1
    if data.startswith(b"PK\x03\x04", at):
        if depth < s.limits.max_scan_nesting:
            s.scan_source(probe, Window(bytes_source(data), at, len(data) - at), label,
                         depth + 1)
        unread = any(f.location == label and f.kind == "format" for f in probe.findings)
    else:
        end = scan_pickle(probe, data, label, at, depth + 1)
        unread = any(f.location == label and f.kind == "stream" and f.offset == at
                     for f in probe.findings)
    if not unread:
        s.findings.extend(probe.findings)
    return end


def scan_stream(s: Scan, data: bytes, where: str, depth: int, count: int = 1) -> None:
    """Consecutive pickles at the start of ``data`` (legacy: five; plain pickles: one+)."""
    pos = 0
    for i in range(max(count, 1)):
        label = where if count == 1 else f"{where}#{i}"
        end = scan_pickle(s, data, label, pos, depth)
        if end < 0:
            return
        pos = end
        if pos >= len(data):
            return
    if count == 1 and pos < len(data):
        s.add("stream", Verdict.UNKNOWN, where, pos, message=f"{len(data) - pos} bytes after "
              "STOP: loaders ignore them, other tools may not")
        _scan_trailing(s, data, pos, where, depth)


#: What follows a label in the locations of findings in its own bytes: the N-th pickle of
#: a stream, a pickle after a ``STOP`` (not `` > nested@``: a payload in a constant).
_OWN_BYTES: Final = re.compile(r"(#\d+)?( \(after STOP@0x[0-9a-f]+\))?")


def in_file(findings: list[Finding], label: str, base: int | None) -> list[Finding]:
    """``findings`` with :attr:`Finding.file_offset` set, ``base`` + ``offset``, for those
    whose offset is in the bytes of ``label`` (``label``, ``label#N``, ``label (after
    STOP@...)``), that the file holds from ``base`` on (None: nowhere)."""
    if base is None:
        return findings
    return [dataclasses.replace(f, file_offset=base + f.offset)
            if f.offset is not None and f.location.startswith(label)
            and _OWN_BYTES.fullmatch(f.location, len(label)) else f for f in findings]


def tag(s: Scan, findings: list[Finding], loaders: tuple[str, ...],
         dedupe: bool = False) -> None:
    """Keep ``findings``, each naming ``loaders`` (where it names none yet); ``dedupe``:
    only those not already found (same kind, verdict, offset and name)."""
    seen = {(f.kind, f.verdict, f.offset, f.module, f.name) for f in s.findings} \
        if dedupe else set()
    for f in findings:
        if (f.kind, f.verdict, f.offset, f.module, f.name) in seen:
            continue
        s.findings.append(f if f.loaders else dataclasses.replace(f, loaders=loaders))


def scan_file_stream(s: Scan, data: bytes, where: str, depth: int, legacy: bool) -> None:
    """The pickles torch's stream loader and ``pickle.load`` read from byte 0 of a file
    (:func:`.loaders.stream.legacy_stream`), each finding naming its loaders; for a file
    that is not a legacy stream, the bytes after the first pickle as :func:`scan_stream`
    reads them too (``pickle.load`` called again, pickles hidden there)."""
    label, first_end = where or "stream", -1
    for region in legacy_stream(data, s.limits):
        name = label if region.label == "#0" and not legacy else f"{label}{region.label}"
        probe = s.probe()
        end = scan_pickle(probe, data, name, region.start, depth)
        tag(s, probe.findings, region.loaders)
        if region.label == "#0":
            first_end = end
    if not legacy and 0 < first_end < len(data):
        s.add("stream", Verdict.UNKNOWN, label, first_end, message=f"{len(data) - first_end} "
              "bytes after STOP: loaders ignore them, other tools may not",
              loaders=(TORCH_LOAD_UNSAFE, TORCH_LOAD))
        probe = s.probe()
        _scan_trailing(probe, data, first_end, label, depth)
        tag(s, probe.findings, (TORCH_LOAD_UNSAFE, TORCH_LOAD), dedupe=True)


def bare_pickle(s: Scan, data: bytes, where: str, depth: int) -> bool:
    """Scan ``data`` as a pickle when it reads as one from byte 0, whatever its first opcode.

    torch unpickles the start of every file that is neither a ZIP nor a tar (its
    legacy loader's first pickle), so a protocol 0/1 stream that opens with ``V``,
    ``S``, ``I``, ``]``, ``N``... runs as surely as one that opens with ``PROTO``.
    """
    if data[:1] not in _OPCODE_BYTES:
        return False
    probe = s.probe()
    scan_file_stream(probe, data, where, depth, legacy=False)
    if any(f.kind == "stream" and f.offset == 0 for f in probe.findings):
        return False  # not a readable pickle at byte 0
    s.findings.extend(probe.findings)
    return True


def bytes_source(data: bytes) -> Source:
    return BytesSource(data)
