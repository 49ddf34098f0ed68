"""The ZIP scan: exactly the records torch's ZIP loaders read, and the archive's anomalies.

:func:`scan_zip` walks the archive as the loader does, in its tolerant mode
(:func:`.containers.walk_zip`), reports each anomaly (:data:`DIVERGENT_ANOMALIES` are
dangerous, the rest ``unknown``) and scans what an anomaly hides (a second archive, a
region outside the directory); then the records the loader model beside it
(:func:`.loaders.zipfamily.zip_regions`: ``torch.load``, ``torch.jit.load``,
``torch.export.load``) says each loader reads, as it reads them, each finding naming its
loaders; pickle-named records no loader reads are scanned too, at most ``unknown``.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from .._io.local import Source
from ..errors import FormatError, LimitExceededError
from ..formats.detection import ZIP_MARKERS, folded_markers, kind_of_markers
from .containers import Anomaly, Window, ZipEntry, read_member, walk_zip
from .loaders.zipfamily import Region, ZipModel, zip_regions
from .pt2 import NATIVE_CODE, UNREADABLE_CONFIG
from .stream import Scan, bytes_source, in_file, scan_stream
from .torchscript import as_torchscript_type, judge_code
from .verdicts import Finding, Verdict

__all__ = ["DIVERGENT_ANOMALIES", "report_anomaly", "scan_zip"]


#: Archive anomalies that make readers read different records: dangerous, whatever each
#: reads (the others are ``unknown``).  Names that collide exactly or by case (miniz and
#: ``zipfile`` pick different ones); a directory that ends before the end records
#: (``zipfile`` shifts every offset); a file that is a ZIP but starts otherwise (torch
#: unpickles its start, ZIP tools read the archive); local headers the directory never
#: names, or that disagree with it (what readers that scan forward read).
DIVERGENT_ANOMALIES: Final = frozenset({"duplicate-name", "case-colliding-names",
                                        "shifted-directory", "polyglot", "shadow-record",
                                        "local-header-mismatch"})


def report_anomaly(s: Scan, anomaly: Anomaly, where: str, file_offset: int | None = None) -> None:
    label = anomaly.member or where or "archive"
    verdict = Verdict.DANGEROUS if anomaly.code in DIVERGENT_ANOMALIES else Verdict.UNKNOWN
    s.add("archive", verdict, label, anomaly.offset, "", anomaly.code, message=anomaly.message,
          file_offset=file_offset)


def scan_zip(s: Scan, source: Source, where: str, depth: int, eocd: int | None = None) -> str:
    """A ZIP: its anomalies, then exactly the records torch's loaders read
    (:func:`ptfile.scanning.loaders.zipfamily.zip_regions`), each finding naming its
    loaders; pickle-named records no loader reads are scanned, at most ``unknown``."""
    walked = walk_zip(source, s.limits, eocd)
    if walked is None:
        s.add("format", Verdict.UNKNOWN, where, None, message="no ZIP end record")
        return "unknown"
    entries, anomalies = walked
    for anomaly in anomalies:
        report_anomaly(s, anomaly, where, s.at(source, anomaly.offset))
        if depth >= s.limits.max_scan_nesting:
            continue
        if anomaly.region is not None and 0 < anomaly.region[1] < source.size:
            start, size = anomaly.region
            s.scan_source(s, Window(source, start, size), f"{where}({anomaly.code}@{start:#x})",
                         depth + 1)
        if anomaly.eocd is not None:
            scan_zip(s, source, f"{where}({anomaly.code}@{anomaly.eocd:#x})", depth + 1,
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
            scan_stream(probe, data, label, depth)
            located = in_file(probe.findings, label, _record_base(s, source, entry))
            s.findings.extend(map(_unread_record, located))
    return fmt


def _record_base(s: Scan, source: Source, entry: ZipEntry) -> int | None:
    """Where the file holds a record's bytes as they are: its data offset when it is stored
    (method 0) in the file scanned, else None (compressed, or in a nested archive)."""
    return s.at(source, entry.data_offset) if entry.method == 0 else None


def _unread_record(f: Finding) -> Finding:
    """A finding in a pickle-named record no torch loader reads (``bytecode.pkl``, another
    folder's ``data.pkl``): at most ``unknown``, as only another tool would read it."""
    if f.verdict is not Verdict.DANGEROUS:
        return f
    return dataclasses.replace(f, verdict=Verdict.UNKNOWN, message=f"{f.message} (in a "
                               "record no torch loader reads)")


def _zip_kind(s: Scan, entries: list[ZipEntry], where: str) -> str:
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


def _read_quiet(s: Scan, source: Source, entry: ZipEntry) -> bytes | None:
    """A record's bytes for the loader model (a payload config), None when unreadable."""
    try:
        return read_member(source, entry, s.limits)
    except LimitExceededError:
        return None


def _scan_pt2_record(s: Scan, source: Source, region: Region, label: str,
                     depth: int) -> None:
    """One record a loader reads, as it reads it (:data:`~.loaders.zipfamily.How`): a
    pickle, a whole file ``torch.load`` reads (``guess``: kept only when it reads as one),
    TorchScript code, or native code."""
    entry = region.entry
    if region.how == "native":
        s.add(NATIVE_CODE, Verdict.DANGEROUS, label, entry.header_offset, "",
              entry.name.rsplit("/", 1)[-1], message="AOTInductor compiled code: "
              "torch.export.load loads the compiled model, which runs native code",
              file_offset=s.at(source, entry.header_offset))
        return
    data = _read_record(s, source, entry, label)
    if data is None:
        return
    if region.how == "code":
        verdict, message = judge_code(data.decode("utf-8", "replace"), s.limits)
        s.add("torchscript-code", verdict, label, entry.header_offset, "",
              entry.name.rsplit("/", 1)[-1], message=message,
              file_offset=s.at(source, entry.header_offset))
    elif region.how == "pickle":
        mark = len(s.findings)
        scan_stream(s, data, label, depth)
        s.findings[mark:] = in_file(s.findings[mark:], label, _record_base(s, source, entry))
    elif not data:
        return
    elif depth >= s.limits.max_scan_nesting:
        s.add("nested", Verdict.DANGEROUS, label, 0,
              message=f"pickles nested more than {s.limits.max_scan_nesting} deep")
    elif region.how == "file":
        s.scan_source(s, bytes_source(data), label, depth + 1)
    else:  # guess: raw tensor bytes are data, what reads as a pickle or archive is scanned
        probe = s.probe()
        s.scan_source(probe, bytes_source(data), label, depth + 1)
        if not any(f.location == label and f.kind == "format" for f in probe.findings):
            s.findings.extend(probe.findings)


def _read_record(s: Scan, source: Source, entry: ZipEntry, label: str) -> bytes | None:
    """A record's bytes, or None with a finding (unreadable, or a limit hit)."""
    try:
        data = read_member(source, entry, s.limits)
    except LimitExceededError as exc:  # a bomb: what it hides is not scanned
        s.add("limit", Verdict.DANGEROUS, label, entry.data_offset, "",
              "max_inflate_ratio", message=f"not scanned: {exc}",
              file_offset=s.at(source, entry.data_offset))
        return None
    if data is None:
        s.add("stream", Verdict.UNKNOWN, label, entry.data_offset,
              message="record cannot be read (method or bounds)",
              file_offset=s.at(source, entry.data_offset))
    return data
