"""ptfile scan side by side with picklescan and fickling: time per file and what each flags.

Usage::

    python benchmarks/scan.py            # needs: pip install picklescan fickling
    python benchmarks/scan.py --harness  # the harness's files, real torch as oracle (+ modelscan)

The corpus is generated here, nothing is downloaded: the hostile checkpoints of
``tests/support/hostile.py`` (each payload would only create a marker file),
the nested payloads, two-way ZIPs and ``.pt2`` archives of
``tests/scanning/test_scan_{nested,readings,pt2}.py`` with their benign twins,
plus benign files torch writes (state dicts, a whole pickled module, a
TorchScript model, a legacy file, a protocol-4 file).  Each scanner reads every
file from disk in this process; a file counts as *flagged* when the scanner
reports it unsafe (ptfile: dangerous or unknown; picklescan: any dangerous
global or a scan error; fickling: any record not judged safe, at its default
severity) and as an *error* when the scanner raised.
A hostile file that is not flagged is a miss; a benign file that torch loads
with ``weights_only=True`` and that is flagged is a false positive.

``--harness`` (issue 23 item 5) runs the scan harness's files instead: ``--variants``
recipes (default 1000) drawn from ``--seed`` (default 23) by ``tests/support/variants.py``,
each with a payload that only creates its own sentinel, plus the harness's benign files torch
writes (``variants.benign_files``).  The ground truth is real torch: the harness's sandboxed
oracle (``tests/support/loader_oracle.py``, through ``harness.evaluate``) opens every file
with ``torch.load`` (``weights_only`` False and True, ``mmap``), ``torch.jit.load``,
``torch.export.load`` and ``pickle.load``; a file is *fired* when one of them created its
sentinel.  Then ptfile, picklescan, modelscan 0.8.8 and fickling scan every file, flagged as
above; modelscan (its ``ModelScan().scan`` API, the code behind ``modelscan -p FILE``)
flags a file when its report lists any issue (any severity) or any error; a file it skips
(a format it does not read) is not flagged, as its CLI's exit code says.  Per technique
(``zip.data``, ``zip.record``, ``zip.around``, ``legacy``, ``tar``, ``torchscript``,
``pt2``, ``pickle``, ``benign``): files, fired, and for each scanner the *misses* (fired,
not flagged, not an error), the *false positives* (a benign torch-written file flagged or
an error on it) and the *errors* (the scanner raised).  A variant no real loader fires is
neither: its flags are shown only in the ``flagged`` count of the last column.
A default run takes about 15 s on the 2-core machine (the oracle: ~10 s).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "support"), str(HERE.parent / "tests" / "scanning")]

from hostile import corpus  # noqa: E402 - the tests' generators, by path


def _techniques() -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(hostile, benign) files of the newer techniques, from the tests' generators: nested
    payloads (raw, base64, hex, archives, after STOP), ZIPs read two ways, tar links, ``.pt2``."""
    import test_scan_nested as nested
    import test_scan_pt2 as pt2
    import test_scan_readings as readings
    import test_scan_tar as tar
    import torch

    hostile = {f"nested_{t}": make(nested.EVIL[2]) for t, make in nested.TECHNIQUES.items()}
    benign = {f"nested_{t}_ok": make(nested.KIND) for t, make in nested.TECHNIQUES.items()
              if "stop" not in t and "second" not in t}
    benign.update({f"lookalike_{n}": nested.holder(v) for n, v in nested.LOOKALIKES.items()})
    hostile.update({"two_directories": readings.two_directories(),
                    "concatenated_zip": pickle.dumps({"v": 1}, 2) + readings.checkpoint(
                        readings.EVIL)})
    hostile.update({f"local_{f}_mismatch": readings._patch_local(
        readings.raw_zip([(readings.D, readings.EVIL), (readings.V, b"3\n")]), *m)
        for f, m in readings.MISMATCHES.items()})
    benign.update({f"written_by_{n}": make() for n, make in readings.BENIGN.items()})
    hostile.update({f"tar_{k}_pickle": tar._linked_checkpoint(tar.SYSTEM, kind)
                    for k, kind in (("symlink", b"2"), ("hardlink", b"1"))})
    plain = pt2.exported(pt2._Plain(), torch.ones(1, 3))
    opaque = pt2.opaque_pt2()
    benign["pt2_plain"] = plain
    hostile.update({"pt2_evil_weight": pt2.evil_weight(plain),
                    "pt2_evil_opaque": pt2.evil_opaque(opaque)})
    return hostile, benign


def _weights_only(data: bytes) -> bool:
    """Whether torch loads the file with ``weights_only=True`` (a .pt2: torch.export.load
    reads it without unpickling an object)."""
    import torch

    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception:  # noqa: BLE001 - any refusal counts
        return data[:4] == b"PK\x03\x04" and b"archive_format" in data
    return True


def _benign(folder: Path) -> dict[str, tuple[Path, bool]]:
    """name -> (path, torch loads it with weights_only=True)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
    made: dict[str, tuple[Path, bool]] = {}

    def put(name: str, weights_only: bool, write: Callable[[Path], None]) -> None:
        path = folder / name
        write(path)
        made[name] = (path, weights_only)

    put("state_dict.pt", True, lambda p: torch.save(model.state_dict(), p))
    put("many.pt", True, lambda p: torch.save({f"w{i}": torch.randn(4) for i in range(2000)}, p))
    put("legacy.pt", True, lambda p: torch.save(model.state_dict(), p,
                                               _use_new_zipfile_serialization=False))
    put("proto4.pt", False, lambda p: torch.save(model.state_dict(), p, pickle_protocol=4))
    put("whole_module.pt", False, lambda p: torch.save(model, p))
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(model.eval()), buf)
    put("torchscript.pt", False, lambda p: p.write_bytes(buf.getvalue()))
    return made


def _ptfile(path: Path) -> bool:
    import ptfile

    result = ptfile.scan(path)
    return result.is_dangerous or result.verdict is not ptfile.Verdict.ALLOWED


def _picklescan(path: Path) -> bool:
    from picklescan.scanner import scan_file_path

    result = scan_file_path(str(path))
    return bool(result.infected_files or result.scan_err)


def _fickling(path: Path) -> bool:
    """fickling's own verdict, ZIP archives record by record (its scan_zip_archive)."""
    import zipfile

    import fickling

    if zipfile.is_zipfile(path):
        results = fickling.scan_zip_archive(str(path), graceful=True).values()
    else:
        results = [fickling.scan_file(str(path), graceful=True)]
    return not all(r.is_safe for r in results)


SCANNERS: dict[str, Callable[[Path], bool]] = {
    "ptfile": _ptfile, "picklescan": _picklescan, "fickling": _fickling,
}


def _run(scanner: Callable[[Path], bool], path: Path) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        flagged = "flag" if scanner(path) else "pass"
    except Exception:  # noqa: BLE001 - a scanner's crash on a hostile file is a result
        flagged = "error"
    return flagged, time.perf_counter() - start


def _modelscan(path: Path) -> bool:
    """modelscan's report for the file (ZIP members included): any issue or error."""
    from modelscan.modelscan import ModelScan

    report = ModelScan().scan(str(path))
    return bool(report["issues"] or report["errors"])


PEERS: dict[str, Callable[[Path], bool]] = {
    "ptfile": _ptfile, "picklescan": _picklescan, "modelscan": _modelscan,
    "fickling": _fickling,
}


def harness(variants: int, seed: int) -> int:
    """The harness's variants and benign files: real torch's verdict, then every scanner's."""
    import logging

    from harness import collect, evaluate
    from variants import benign_files

    logging.disable(logging.CRITICAL)  # modelscan and fickling log every skip
    began = time.monotonic()
    drawn = collect(variants, random_seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        cases = evaluate(Path(tmp), drawn, benign_files())
        oracle = time.monotonic() - began
        rows: dict[str, dict[str, int]] = {}
        seconds = dict.fromkeys(PEERS, 0.0)
        quiet = io.StringIO()
        for case in cases:
            tech = case.recipe.technique if case.recipe else "benign"
            row = rows.setdefault(tech, {"files": 0, "fired": 0})
            row["files"] += 1
            row["fired"] += bool(case.fired)
            for name, scanner in PEERS.items():
                with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                    flagged, spent = _run(scanner, case.path)  # fickling prints warnings
                seconds[name] += spent
                for key, hit in (("miss", bool(case.fired) and flagged == "pass"),
                                 ("false+", case.recipe is None and flagged != "pass"),
                                 ("error", flagged == "error"),
                                 ("flagged", flagged != "pass")):
                    row[f"{name}.{key}"] = row.get(f"{name}.{key}", 0) + hit
    order = [t for t in ("zip.data", "zip.record", "zip.around", "legacy", "tar",
                         "torchscript", "pt2", "pickle", "benign") if t in rows]
    rows["total"] = {k: sum(rows[t].get(k, 0) for t in order)
                     for k in {k for t in order for k in rows[t]}}
    print(f"{variants} variants (seed {seed}) + {rows.get('benign', {}).get('files', 0)} benign "
          f"files; real-torch oracle {oracle:.0f} s\n"
          "cells: misses / false positives / errors  (misses: fired by a real loader, not "
          "flagged; false positives: benign, flagged)")
    print(f"{'technique':12} {'files':>5} {'fired':>5} "
          + " ".join(f"{n:>12}" for n in PEERS) + "   flagged: " + " ".join(PEERS))
    for tech in [*order, "total"]:
        row = rows[tech]
        cells = [f"{row.get(f'{n}.miss', 0)}/{row.get(f'{n}.false+', 0)}/"
                 f"{row.get(f'{n}.error', 0)}" for n in PEERS]
        flags = [str(row.get(f"{n}.flagged", 0)) for n in PEERS]
        print(f"{tech:12} {row['files']:5} {row['fired']:5} "
              + " ".join(f"{c:>12}" for c in cells) + "   " + " ".join(flags))
    print("scan seconds: " + ", ".join(f"{n} {s:.1f}" for n, s in seconds.items())
          + f"; whole run {time.monotonic() - began:.0f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--harness", action="store_true",
                        help="scan the differential harness's files, real torch as the oracle")
    parser.add_argument("--variants", type=int, default=1000, help="harness recipes drawn")
    parser.add_argument("--seed", type=int, default=23, help="the recipes' seed")
    args = parser.parse_args()
    if args.harness:
        return harness(args.variants, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        markers = folder / "markers"
        markers.mkdir()
        files: dict[str, tuple[Path, bool | None]] = {}
        for case in corpus(markers):
            path = folder / f"{case.name}.pt"
            path.write_bytes(case.data)
            files[case.name] = (path, None if not case.dangerous else False)
        more_hostile, more_benign = _techniques()
        for name, data in more_hostile.items():
            (folder / f"{name}.pt").write_bytes(data)
            files[name] = (folder / f"{name}.pt", False)
        hostile = {k for k, (_, v) in files.items() if v is False}
        benign = _benign(folder)
        for name, data in more_benign.items():
            (folder / f"{name}.pt").write_bytes(data)
            benign[name] = (folder / f"{name}.pt", _weights_only(data))
        files.update({k: (p, w) for k, (p, w) in benign.items()})
        totals = {name: {"miss": 0, "false+": 0, "error": 0, "seconds": 0.0}
                  for name in SCANNERS}
        print(f"{'file':34} " + " ".join(f"{n:>18}" for n in SCANNERS))
        for name, (path, weights_only) in files.items():
            cells = []
            for scanner_name, scanner in SCANNERS.items():
                flagged, seconds = _run(scanner, path)
                row = totals[scanner_name]
                row["seconds"] += seconds
                row["error"] += flagged == "error"
                row["miss"] += name in hostile and flagged == "pass"
                row["false+"] += bool(weights_only) and flagged != "pass"
                cells.append(f"{flagged:>6} {seconds * 1000:8.1f} ms")
            kind = "hostile" if name in hostile else "benign" if name in benign else "resource"
            print(f"{name[:26]:26} {kind:7} " + " ".join(f"{c:>18}" for c in cells))
        print(f"\n{len(hostile)} hostile files that must be flagged; "
              f"{sum(1 for _, w in benign.values() if w)} benign files torch loads with "
              "weights_only=True, which must pass")
        for scanner_name, row in totals.items():
            print(f"{scanner_name:11} misses {row['miss']:3}  false positives {row['false+']:2}  "
                  f"errors {row['error']:3}  total {row['seconds']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
