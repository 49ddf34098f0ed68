"""The tar scan: the pickles torch's tar loader unpickles, and every other member's.

:func:`scan_tar` follows the loader model beside it (:func:`.loaders.tar.legacy_tar`):
the pickles torch's tar loader unpickles, each finding naming its loaders; where the
model cannot tell what torch reads next, an ``unknown`` finding and every pickle in the
rest of the member; members torch never unpickles (and every member of an archive
``tarfile`` refuses) scanned whole, their findings at most ``unknown``.
:func:`scan_tar_head` scans the stream at byte 0, which torch reads when ``tarfile``
refuses the archive or the file object has no ``fileno()``.
"""

from __future__ import annotations

import dataclasses

from .._io.local import Source
from ..archive import tar
from .containers import TarMember
from .loaders import PICKLE_LOAD, TORCH_LOAD, TORCH_LOAD_UNSAFE
from .loaders.tar import TarReading
from .reads import next_head
from .stream import Scan, in_file, scan_file_stream, scan_pickle, tag
from .verdicts import Finding, Verdict
from .zip import report_anomaly

__all__ = ["scan_tar", "scan_tar_head"]


def scan_tar(s: Scan, source: Source, reading: TarReading, depth: int) -> None:
    """A tar as torch's tar loader reads it (:func:`.loaders.tar.legacy_tar`): the pickles
    it unpickles, where the model cannot tell (``unknown``, and the rest of that member
    searched), and the other members (at most ``unknown``: only other tools read them).
    When ``tarfile`` refuses the archive, torch reads none of it (at most ``unknown``)."""
    for anomaly in reading.anomalies:
        report_anomaly(s, anomaly, "tar", s.at(source, anomaly.offset))
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
        scan_pickle(probe, reading.data[member.offset], f"tar:{member.name}", region.start,
                     depth)
        tag(s, in_file(probe.findings, f"tar:{member.name}", s.at(source, member.offset)),
            region.loaders)
    for member, offset in reading.search:
        probe = s.probe()
        _scan_tar_member(probe, reading.data[member.offset], f"tar:{member.name}", offset,
                         depth)
        tag(s, probe.findings, (TORCH_LOAD_UNSAFE,), dedupe=True)
    for member in reading.members:
        if member.offset not in read:
            probe = s.probe()
            _scan_tar_member(probe, _member_bytes(s, source, reading, member),
                             f"tar:{member.name}", 0, depth)
            s.findings.extend(_unread(f) for f in probe.findings)


def _member_bytes(s: Scan, source: Source, reading: TarReading, member: TarMember) -> bytes:
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


def _scan_tar_member(s: Scan, data: bytes, label: str, pos: int, depth: int) -> None:
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
        end = scan_pickle(_probe := s.probe(), data, label, pos, depth)
        if end > pos:
            s.findings.extend(_probe.findings)
            found, pos = found + 1, end
        else:
            pos = next_head(data, pos + 1)


def scan_tar_head(s: Scan, source: Source, depth: int) -> None:
    """The stream at byte 0 of a tar: torch reads it when ``tarfile`` refuses the archive
    (any ``TarError``) or when given a file object without ``fileno()``, and
    ``pickle.load`` always (:func:`.loaders.stream.legacy_stream`).

    The first header is read, and more (eight times as much each time, up to
    ``Limits.max_pickle_bytes``) while a pickle there runs past what was read.
    """
    window, most = tar.BLOCK, min(source.size, s.limits.max_pickle_bytes)
    while True:
        probe = s.probe()
        scan_file_stream(probe, source.pread(0, min(window, most), "tar head"), "tar(byte 0)",
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
