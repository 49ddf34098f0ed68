"""Scan results as SARIF 2.1.0, the format CI code scanning reads (GitHub, GitLab, Azure).

``ptfile scan --format sarif`` writes one SARIF log with **one run** (tool
``ptfile``) over every file scanned, and **one result per finding** that is not
``allowed`` (with ``--verbose``, allowed ones too, at level ``none``), plus one
result per file that could not be scanned.  A result's rule is the *capability*
its finding gives whoever loads the file (:data:`RULES`), so a dashboard groups
them by what is at stake, not by pickle opcode:

========  ======================  ========  ==========================================
rule id   name                    level     findings
========  ======================  ========  ==========================================
PTF101    code-execution          error     dangerous globals that run code, import by
                                            name or evaluate (``os.system``, ``eval``)
PTF102    file-access             error     globals that open, write or remove files
PTF103    network-access          error     globals that open sockets or fetch URLs
PTF104    native-code             error     ``ctypes``, custom operator libraries,
                                            AOTInductor shared objects
PTF105    torchscript-code        error     ``code/`` that calls what TorchScript
                                            should not reach
PTF106    resource-exhaustion     error     pickles that exhaust memory or time in
                                            CPython's unpickler, hash floods, bombs
PTF107    loader-divergence       error     files loaders read differently (archive
                                            anomalies, polyglots, frame tricks)
PTF108    hidden-payload          error     pickles nested in constants or after STOP
PTF201    unknown-global          warning   names on no allowlist (``torch.load``
                                            refuses them; not known to be harmful)
PTF202    unverifiable            warning   what the scanner cannot judge (an
                                            extension code, an unread record)
PTF301    could-not-scan          error     the file is missing, damaged or no
                                            checkpoint (the command's exit 2)
PTF900    allowed                 none      allowed names (``--verbose`` only)
========  ======================  ========  ==========================================

Locations, as GitHub code scanning reads them (:func:`artifact_uri`, :func:`region_of`):

* ``artifactLocation.uri`` is the file relative to the current directory (the
  repository's root in CI), with ``/`` and percent-encoded (``uriBaseId``
  ``%SRCROOT%``); a file outside it is an absolute ``file://`` URI, a URL stays as it is.
* ``region.startLine`` is always 1: a checkpoint is binary, it has no lines, and GitHub
  refuses a result without one.  ``region.byteOffset`` is the byte **of the file** that
  the finding names (:attr:`~ptfile.scanning.Finding.file_offset`): the opcode of a bare
  or legacy stream, of a stored ZIP record (the record's data offset plus the opcode's
  place in it), of a tar member, or the archive header.  A finding with no such byte (in
  a compressed record, in a payload nested in a constant, in a file of a DCP folder, which
  is scanned as one input) has no ``byteOffset``; its place is in ``properties``.
* The record or member is a logical location (``kind: "member"``); ``properties`` gives
  ``record`` and ``offsetInRecord`` (the offset within that record, as ``--json``'s
  ``offset``) and the ``loaders`` that would run it.

``partialFingerprints`` key each result by file, record, rule and name, so a
code-scanning service tracks it across commits.  Each rule carries GitHub's
``security-severity`` (:data:`SEVERITY`) and the ``security`` tag.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

__all__ = ["RULES", "SARIF_SCHEMA", "SARIF_VERSION", "SEVERITY", "artifact_uri", "region_of",
           "rule_of", "to_sarif"]

SARIF_VERSION: Final = "2.1.0"
SARIF_SCHEMA: Final = "https://json.schemastore.org/sarif-2.1.0.json"

#: rule id -> (name, level, description)
RULES: Final[dict[str, tuple[str, str, str]]] = {
    "PTF101": ("code-execution", "error",
               ("Loading the file runs code: a global that executes, imports by name or "
               "evaluates.")),
    "PTF102": ("file-access", "error", "Loading the file opens, writes or removes files."),
    "PTF103": ("network-access", "error", "Loading the file opens sockets or fetches URLs."),
    "PTF104": ("native-code", "error",
               ("Loading the file loads native code (ctypes, custom operator libraries, "
               "compiled models).")),
    "PTF105": ("torchscript-code", "error",
               ("TorchScript code that torch.jit.load compiles calls what TorchScript "
               "should not reach.")),
    "PTF106": ("resource-exhaustion", "error",
               ("Unpickling the file exhausts memory or time (expansion, hash flooding, "
               "compression bombs).")),
    "PTF107": ("loader-divergence", "error",
               ("Loaders read the file differently (archive anomalies, polyglots, frame "
               "tricks): what one loader vets is not what another runs.")),
    "PTF108": ("hidden-payload", "error",
               "A pickle or archive hidden in a constant or after a record's end."),
    "PTF201": ("unknown-global", "warning",
               ("A name on no allowlist: torch.load(weights_only=True) refuses it; "
               "weights_only=False imports it.")),
    "PTF202": ("unverifiable", "warning", "Something the scanner cannot judge statically."),
    "PTF301": ("could-not-scan", "error",
               "The file could not be scanned: missing, damaged or not a checkpoint."),
    "PTF900": ("allowed", "none", "A name on torch's weights-only allowlist (or yours)."),
}

#: GitHub's ``security-severity`` of each rule (9.0 and up: critical; 7.0: high; 4.0:
#: medium): running code or native code is critical, the other error rules high, the
#: warnings medium.
SEVERITY: Final = {"PTF101": "9.8", "PTF102": "8.1", "PTF103": "8.1", "PTF104": "9.8",
                   "PTF105": "8.8", "PTF106": "7.5", "PTF107": "8.1", "PTF108": "9.0",
                   "PTF201": "5.0", "PTF202": "4.0", "PTF301": "5.0"}

#: Module prefixes by capability, first match wins (the rest of the dangerous names run code).
_CAPABILITIES: Final = (
    ("PTF103", ("socket", "_socket", "ssl", "_ssl", "http", "httplib", "urllib", "urllib2",
                "requests", "ftplib", "smtplib", "telnetlib", "imaplib", "poplib", "nntplib",
                "xmlrpc", "xmlrpclib", "socketserver", "SocketServer", "webbrowser",
                "asyncore", "asynchat", "smtpd", "select", "selectors", "torch.hub",
                "torch.utils.model_zoo", "torch.distributed.rpc")),
    ("PTF104", ("ctypes", "_ctypes", "numpy.ctypeslib", "torch.ops.load_library",
                "torch._ops.load_library", "torch.classes.load_library",
                "torch._classes.load_library", "torch.utils.cpp_extension", "torch._C._dlopen",
                "mmap")),
    ("PTF102", ("builtins.open", "__builtin__.open", "__builtin__.file", "io", "_io",
                "shutil", "tempfile", "pathlib", "glob", "fileinput", "linecache", "shelve",
                "dbm", "sqlite3", "_sqlite3", "zipfile", "tarfile", "logging",
                "numpy.save", "numpy.savez", "numpy.savez_compressed", "numpy.savetxt",
                "numpy.fromfile", "numpy.memmap", "numpy.load", "numpy.loadtxt",
                "numpy.genfromtxt", "numpy.fromregex", "torch.save", "torch.load",
                "os.remove", "os.unlink", "os.rmdir", "os.rename", "os.open", "os.mkdir",
                "os.makedirs", "os.removedirs", "os.replace", "os.chmod", "os.chown",
                "posix.remove", "posix.unlink", "posix.open", "posix.mkdir", "posix.rename")),
)
#: Finding kinds that are a capability of their own, whatever their name.
_KINDS: Final = {"torchscript-code": "PTF105", "native-code": "PTF104", "hazard": "PTF106",
                 "limit": "PTF106", "resource": "PTF106", "archive": "PTF107",
                 "frame": "PTF107", "nested": "PTF108", "build-on-global": "PTF101",
                 "codec": "PTF101", "numpy-object-array": "PTF101"}


def _starts(qualname: str, prefixes: Iterable[str]) -> bool:
    return any(qualname == p or qualname.startswith(p + ".") for p in prefixes)


def rule_of(finding: Mapping[str, Any]) -> str:
    """The rule id of one finding (a :meth:`Finding.to_dict` dict).

    Examples
    --------
    >>> rule_of({"kind": "global", "verdict": "dangerous", "module": "posix", "name": "system"})
    'PTF101'
    >>> rule_of({"kind": "global", "verdict": "dangerous", "module": "socket", "name": "socket"})
    'PTF103'
    >>> rule_of({"kind": "global", "verdict": "unknown", "module": "my.net", "name": "Net"})
    'PTF201'
    """
    verdict = finding.get("verdict")
    if verdict == "allowed":
        return "PTF900"
    if verdict != "dangerous":
        return "PTF201" if finding.get("kind") == "global" else "PTF202"
    kind = str(finding.get("kind", ""))
    if kind in _KINDS:
        return _KINDS[kind]
    qualname = ".".join(x for x in (finding.get("module"), finding.get("name")) if x)
    return next((rule for rule, prefixes in _CAPABILITIES if _starts(qualname, prefixes)),
                "PTF101")


def artifact_uri(path: str, root: str | None = None) -> str:
    """The SARIF ``uri`` of a scanned file: relative to ``root`` (the current directory)
    when it is under it, with ``/`` and percent-encoded; else an absolute ``file://`` URI;
    a URL as it is.

    Examples
    --------
    >>> artifact_uri("/repo/models/a b.pt", "/repo"), artifact_uri("/repo/x/m.pt", "/repo")
    ('models/a%20b.pt', 'x/m.pt')
    >>> artifact_uri("/elsewhere/m.pt", "/repo"), artifact_uri("s3://b/m.pt", "/repo")
    ('file:///elsewhere/m.pt', 's3://b/m.pt')
    """
    if "://" in path:
        return path
    root = os.path.abspath(root or os.getcwd())
    full = os.path.abspath(path)
    if os.path.commonpath([root, full]) != root:
        return Path(full).as_uri()
    return quote(Path(os.path.relpath(full, root)).as_posix(), safe="/")


def _uri(path: str) -> str:
    return artifact_uri(path)


def region_of(finding: Mapping[str, Any]) -> dict[str, Any]:
    """A finding's SARIF region: line 1 (a binary file's only one; GitHub needs a line),
    and the byte of the file it names when there is one (``file_offset``).

    Examples
    --------
    >>> region_of({"offset": 169, "file_offset": 233}), region_of({"offset": 5})
    ({'startLine': 1, 'byteOffset': 233}, {'startLine': 1})
    """
    region: dict[str, Any] = {"startLine": 1}
    offset = finding.get("file_offset")
    if isinstance(offset, int) and offset >= 0:
        region["byteOffset"] = offset
    return region


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:32]


def _result(path: str, finding: Mapping[str, Any]) -> dict[str, Any]:
    rule = rule_of(finding)
    name = ".".join(x for x in (finding.get("module"), finding.get("name")) if x)
    record = str(finding.get("location") or "")
    message = str(finding.get("message") or "") or f"{finding.get('kind')}: {name}"
    if name and name not in message:
        message = f"{name}: {message}"
    offset = finding.get("offset")
    physical: dict[str, Any] = {"artifactLocation": _artifact(path),
                                "region": region_of(finding)}
    location: dict[str, Any] = {"physicalLocation": physical}
    if record and record != "file":
        location["logicalLocations"] = [{"name": record, "fullyQualifiedName": record,
                                         "kind": "member"}]
    return {
        "ruleId": rule, "ruleIndex": list(RULES).index(rule), "level": RULES[rule][1],
        "message": {"text": message}, "locations": [location],
        "partialFingerprints": {"ptfileFinding/v1": _fingerprint(path, record, rule, name,
                                                                 finding.get("kind"))},
        "properties": {"verdict": finding.get("verdict"), "kind": finding.get("kind"),
                       "global": name or None, "record": record or None,
                       "offsetInRecord": offset, "opcode": finding.get("opcode") or None,
                       "loaders": list(finding.get("loaders") or [])},
    }


def _artifact(path: str) -> dict[str, Any]:
    uri = _uri(path)
    return {"uri": uri} if ":" in uri.split("/", 1)[0] else {"uri": uri, "uriBaseId": "%SRCROOT%"}


def _error(path: str, error: str) -> dict[str, Any]:
    return {"ruleId": "PTF301", "ruleIndex": list(RULES).index("PTF301"), "level": "error",
            "message": {"text": f"could not scan: {error}"},
            "locations": [{"physicalLocation": {"artifactLocation": _artifact(path),
                                                "region": {"startLine": 1}}}],
            "partialFingerprints": {"ptfileFinding/v1": _fingerprint(path, "PTF301")}}


def to_sarif(docs: Iterable[Mapping[str, Any]], *, version: str, verbose: bool = False,
             exit_code: int | None = None) -> dict[str, Any]:
    """One SARIF 2.1.0 log for the scan of several files.

    ``docs`` are what ``ptfile scan --json`` prints per file: a
    :meth:`ScanResult.to_dict` with ``path`` (and ``exit_code``), or
    ``{"path": ..., "error": "..."}`` for a file that could not be scanned.

    Examples
    --------
    >>> log = to_sarif([{"path": "evil.pkl", "findings": [{"kind": "global",
    ...     "verdict": "dangerous", "location": "stream", "offset": 2, "module": "posix",
    ...     "name": "system", "message": "calls a shell"}]}], version="0.1.0")
    >>> [r["ruleId"] for r in log["runs"][0]["results"]], log["version"]
    (['PTF101'], '2.1.0')
    """
    results: list[dict[str, Any]] = []
    artifacts: list[str] = []
    for doc in docs:
        path = str(doc.get("path") or "<stream>")
        artifacts.append(path)
        if doc.get("error"):
            err = doc["error"]
            results.append(_error(path, err if isinstance(err, str) else
                                  f"{err.get('type')}: {err.get('message')}"))
            continue
        results += [_result(path, f) for f in doc.get("findings", [])
                    if verbose or f.get("verdict") != "allowed"]
    rules = [{"id": rid, "name": name, "shortDescription": {"text": text},
              "fullDescription": {"text": text}, "defaultConfiguration": {"level": level},
              "help": {"text": f"{text} See `ptfile scan --help` and the documentation's "
                               "security model (docs/security.md) for what each loader runs."},
              "properties": {"tags": ["security"], **(
                  {"security-severity": SEVERITY[rid]} if rid in SEVERITY else {})}}
             for rid, (name, level, text) in RULES.items()]
    invocation: dict[str, Any] = {"executionSuccessful": not any(
        r["ruleId"] == "PTF301" for r in results)}
    if exit_code is not None:
        invocation["exitCode"] = exit_code
    return {
        "$schema": SARIF_SCHEMA, "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {"name": "ptfile", "version": version,
                                "semanticVersion": version, "rules": rules}},
            "artifacts": [{"location": _artifact(p)} for p in dict.fromkeys(artifacts)],
            "invocations": [invocation],
            "results": results,
            "columnKind": "unicodeCodePoints",
        }],
    }
