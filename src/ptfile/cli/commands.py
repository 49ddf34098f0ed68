"""The ``ptfile`` command: inspect, scan, convert, verify and diff PyTorch checkpoints.

Every command exits with a code from one table (:data:`EXIT_CODES`; ``--help``
prints it, docs/guide/cli.md repeats it):

====  ======================================================================
code  meaning
====  ======================================================================
0     ok: the command did its work and found nothing (``scan``: clean;
      ``verify``: intact; ``diff``: identical)
1     found something: ``scan``: dangerous (would run code, open files or
      sockets, or reads differently in different loaders); ``verify``: the
      checkpoint opened and a check failed (a CRC, a bound, a record);
      ``diff``: the two differ
2     could not read: missing, not a checkpoint, damaged past opening (empty,
      truncated, random bytes), unreachable URL, refused globals, bad usage —
      the same for every command, ``scan`` and ``verify`` included
3     ``scan`` only: unknown globals, nothing dangerous: ``torch.load`` would
      import or call names on no allowlist (a whole pickled ``nn.Module``);
      ``--allow-unknown`` makes it 0
====  ======================================================================

Over several files the code is the worst one: 1, then 2, then 3, then 0.

``scan``, ``inspect``, ``verify`` and ``convert`` also take globs, directories
and URL prefixes (``s3://bucket/models/**/*.bin``) and run over every file on a
local pool or Dask, printing a table on a terminal and JSON Lines through a pipe
(:mod:`ptfile.cli.bulk` says when; ``--format`` decides).  Text output shows every name
from a file inert (:func:`ptfile.cli.text.shown`).

Every read command takes ``--json`` and then prints one JSON document on
stdout.  Long work (convert, verify, diff) shows a progress bar on stderr when
stderr is a terminal and ``tqdm`` is installed (ptfile's ``cli`` extra);
piped, it is silent.  ``tqdm`` is optional, not a runtime dependency: the
library itself needs only numpy and ml_dtypes, and a missing bar costs nothing
but the bar.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

from .._io.progress import progress_bar as _progress
from ..errors import PtfileError, PtfileWarning, UnsafeGlobalError
from ..outcomes import (
    ERROR,
    EXIT_CODES,
    EXIT_DIFFERENT,
    EXIT_ERROR,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNKNOWN,
    EXIT_UNSAFE,
    WORST_FIRST,
    exit_code,
    worst,
)
from . import bulk as _cli_bulk
from .inspect_text import render_inspection
from .text import finding_line, inert, shown, size, tally

__all__ = ["EXIT_CODES", "EXIT_DIFFERENT", "EXIT_ERROR", "EXIT_INVALID", "EXIT_OK", "EXIT_UNKNOWN",
           "EXIT_UNSAFE", "main"]


_EPILOG: Final = "exit codes (every command):\n" + "".join(
    f"  {code}  {meaning}\n" for code, meaning in EXIT_CODES.items()) + \
    f"  over several files the worst wins: {', then '.join(map(str, WORST_FIRST))}\n" + """\

examples:
  ptfile inspect model.pt                  what is inside (reads no tensor data)
  ptfile inspect model.pt --json | jq .totals
  ptfile scan *.pt                         is it safe to load? (never executes anything)
  ptfile convert model.pt model.safetensors
  ptfile convert pytorch_model.bin.index.json out/   sharded HF checkpoint, shard by shard
  ptfile convert checkpoint/ model.pt      a DCP directory, tensor by tensor (or .safetensors, out/)
  ptfile verify model.pt                   CRC of every record, structure, bounds
  ptfile diff before.pt after.pt           added/removed keys, changes, max |a-b|
"""


# --------------------------------------------------------------------------- output helpers


def _print_json(doc: Any, out: TextIO) -> None:
    json.dump(doc, out, indent=2, default=str)
    out.write("\n")


# --------------------------------------------------------------------------- inspect


def _cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    from ..inspection import inspect

    ins = inspect(_cli_bulk.record_of(args, args.file), structural=args.structural)
    if args.json:
        _print_json(ins.to_dict(), out)
    else:
        render_inspection(ins, out, args.limit)
    return exit_code("inspect", "ok")


# --------------------------------------------------------------------------- scan


def _cmd_scan(args: argparse.Namespace, out: TextIO) -> int:
    try:
        scan = importlib.import_module("ptfile.scanning").scan
    except (ImportError, AttributeError):
        raise PtfileError("this ptfile has no scanner (ptfile.scanning)") from None
    args.json = args.json or args.format == "json"
    results, codes = [], [EXIT_OK]
    for path in args.files:
        if args.loadable_only and not _loadable(path):
            continue  # no loader of torch's reads it: skipped, as a folder walk skips it
        try:
            result = args.allow_list.apply(scan(_cli_bulk.record_of(args, path)))
        except (PtfileError, OSError) as exc:
            codes.append(exit_code("scan", ERROR))
            results.append({"path": path, "error": f"{type(exc).__name__}: {exc}",
                            "exit_code": codes[-1]})
            continue
        codes.append(exit_code("scan", result.verdict.value, allow_unknown=args.allow_unknown))
        results.append({"path": path, **result.to_dict(), "exit_code": codes[-1]})
    code = worst(codes)
    if args.format == "sarif":
        _print_json(_sarif(results, args, code), out)
    elif args.json:
        _print_json(results if len(results) != 1 else results[0], out)
    else:
        for doc in results:
            _render_scan(doc, out, args.verbose)
    return code


def _loadable(path: str) -> bool:
    """Whether a folder walk would keep the file ``path`` (:func:`ptfile.formats.walk.loadable`:
    named as a checkpoint, or a torch loader reads its first bytes); a path that is no local
    regular file (a folder, a URL, a missing file) or cannot be read is scanned as named,
    so the scan says what is wrong with it."""
    from ..formats.walk import loadable

    return not os.path.isfile(path) or loadable(path) is not False


def _sarif(docs: list[dict[str, Any]], args: argparse.Namespace, code: int) -> Any:
    """The scan's SARIF 2.1.0 log (:mod:`ptfile.scanning.sarif`)."""
    from .. import __version__
    from ..scanning.sarif import to_sarif

    return to_sarif(docs, version=__version__, verbose=args.verbose, exit_code=code)


#: How a file's overall scan verdict reads in text output.
_VERDICTS: Final = {"allowed": "clean", "unknown": "UNKNOWN globals (not loadable as is)"}


def _render_scan(doc: dict[str, Any], out: TextIO, verbose: bool) -> None:
    if "error" in doc:
        out.write(f"{shown(doc['path'])}: ERROR {shown(doc['error'])}\n")
        return
    findings = doc.get("findings", [])
    verdict = "DANGEROUS" if doc.get("is_dangerous") else _VERDICTS.get(
        str(doc.get("verdict")), str(doc.get("verdict")).upper())
    out.write(f"{shown(doc['path'])}: {verdict} ({doc.get('format', '?')}; {tally(findings)})\n")
    out.writelines(f"  {finding_line(f)}\n" for f in findings
                   if verbose or f.get("verdict") != "allowed")


# --------------------------------------------------------------------------- convert


def _cmd_convert(args: argparse.Namespace, out: TextIO) -> int:
    from ..export import convert  # the safetensors package only when converting
    record = _cli_bulk.record_of(args, args.input)  # decided once, for every step
    to = args.to or convert.target_kind(args.output, record)
    with _progress(0, "convert", not args.no_progress, unit="shard") as step:
        summary = convert.convert(record, args.output, to=to, shared=args.shared,
                                  on_step=step, storage_options=_options(args),
                                  structural=args.structural, npz_upcast=args.npz_upcast,
                                  zero={"tag": args.tag, "exclude_frozen": args.exclude_frozen,
                                        "dtype": args.dtype,
                                        "frozen_from_module": args.frozen_from_module})
    if args.json:
        _print_json(summary, out)
    else:
        aliases = summary.get("aliases", {})
        out.write(f"wrote {shown(summary['output'])} ({summary['kind']}, {summary['tensors']} "
                  f"tensors{', ' + str(summary['shards']) + ' shards' if summary.get('shards') else ''})\n")
        out.writelines(f"  {shown(alias)}: same data as {shown(kept)} (stored once)\n"
                       for alias, kept in aliases.items())
        # Its lines quote names from the file: one with anything unsafe is shown as a repr.
        out.writelines(inert(line.rstrip("\n")) + "\n" for line in convert.describe(summary))
    return exit_code("convert", "converted")


# --------------------------------------------------------------------------- verify / diff


def _cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    from .._io.paths import is_url
    from ..inspection import verify

    record = _cli_bulk.record_of(args, args.file)
    nbytes = 0 if is_url(args.file) or record.is_folder else os.path.getsize(args.file)
    with _progress(nbytes, "verify", not args.no_progress) as step:
        report = verify(record, progress=step)
    if args.json:
        _print_json(report.to_dict(), out)
    else:
        status = "OK" if report.ok else "DAMAGED"
        out.write(f"{shown(args.file)}: {status} ({report.format}; {report.records_checked} records, "
                  f"{size(report.bytes_checked)} checked; {report.tensors_checked} tensors)\n")
        out.writelines(f"  {p.severity}: {shown(p.where)}: {shown(p.message)}\n"
                       for p in report.problems)
    return exit_code("verify", "ok" if report.ok else "damaged")


def _cmd_diff(args: argparse.Namespace, out: TextIO) -> int:
    from ..inspection import diff

    with _progress(0, "diff", not args.no_progress, unit="tensor") as step:
        report = diff(args.a, args.b, progress=step, storage_options=_options(args),
                      tensors_only=args.tensors_only, structural=args.structural)
    if args.json:
        _print_json(report.to_dict(), out)
    else:
        _render_diff(report, out, args.verbose)
    return exit_code("diff", "identical" if report.identical else "differs")


def _render_diff(report: Any, out: TextIO, verbose: bool) -> None:
    if report.identical:
        values = f" and {report.values_compared} other values" if report.values_compared \
            else ""
        out.write(f"identical: same names, dtypes, shapes and values ({len(report.max_abs_diff)}"
                  f" tensors{values})\n")
        return
    out.writelines(f"- {shown(name)}\n" for name in report.removed)
    out.writelines(f"+ {shown(name)}\n" for name in report.added)
    out.writelines(f"~ {shown(name)}: {inert(change)}\n" for name, change in report.changed.items())
    out.writelines(f"~ {shown(name)}: {inert(a)} -> {inert(b)}\n"  # reprs: of any object
                   for name, (a, b) in report.values_changed.items())
    out.writelines(f"~ {shown(name) or '(the whole object)'}: {a or 'no container'} -> "
                   f"{b or 'no container'} (nesting)\n"
                   for name, (a, b) in report.structure.items())
    for name, value in report.max_abs_diff.items():
        if value != 0 or verbose:
            out.write(f"≠ {shown(name)}: max |a-b| = {value:.6g}\n")
    same = sum(1 for v in report.max_abs_diff.values() if v == 0)
    out.write(f"{len(report.removed)} removed, {len(report.added)} added, "
              f"{len(report.changed)} changed, {len(report.max_abs_diff) - same} differ in "
              f"value, {same} equal; {len(report.values_changed)} of "
              f"{report.values_compared} other values differ"
              f"{f'; {len(report.structure)} containers differ' if report.structure else ''}\n")


# --------------------------------------------------------------------------- parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptfile", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        description="Read, vet and convert PyTorch checkpoints (.pt/.pth/.bin) without torch.")
    from .. import __version__  # ptfile imports cli lazily, never at import time

    parser.add_argument("--version", action="version", version=f"ptfile {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (func, helptext) in _COMMANDS.items():
        p = sub.add_parser(name, help=helptext, description=helptext,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        _ARGUMENTS[name](p)
        if name in _cli_bulk.BULK_COMMANDS:
            _cli_bulk.add_arguments(p, name)
        p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                       type=_storage_option, dest="storage_options",
                       help="an fsspec option for URL inputs and outputs (repeatable; VALUE "
                            "is JSON when it parses: anon=true, endpoint_url=http://...)")
    return parser


def _storage_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as a pair: VALUE as JSON when it parses, else as text.

    Examples
    --------
    >>> _storage_option("anon=true"), _storage_option("endpoint_url=http://h:9000")
    (('anon', True), ('endpoint_url', 'http://h:9000'))
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``--storage-option`` pairs as fsspec's ``storage_options`` (None when none)."""
    return dict(args.storage_options) or None


_STRUCTURAL_HELP: Final = ("read a pickle that names globals outside torch's weights-only "
                            "allowlist (a whole torch.save(model)) with inert stand-ins; "
                            "nothing runs. Tensors are named as the module's state_dict()")


def _args_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="+", metavar="FILE",
                   help="checkpoint to describe (several, globs, directories: a table on a "
                        "terminal, JSON Lines through a pipe; see --format)")
    p.add_argument("--json", action="store_true", help="print one JSON document "
                   "(folders, globs, several files: JSON Lines)")
    p.add_argument("--limit", type=int, default=40, metavar="N",
                   help="rows per table and items per container (0: all; default 40)")
    p.add_argument("--structural", action="store_true", help=_STRUCTURAL_HELP)


def _args_scan(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="checkpoints to scan (globs, directories: a table on a terminal, JSON "
                        "Lines through a pipe; see --format)")
    p.add_argument("--json", action="store_true", help="print JSON (--format json; folders "
                   "and globs: JSON Lines)")
    p.add_argument("--format", choices=("text", "json", "jsonl", "sarif"), default=None,
                   help="text (the default for files named; for folders and globs on a "
                        "terminal: a table, the totals and the files that need attention), "
                        "json, jsonl (JSON Lines: one record per file, then a summary; the "
                        "default for folders and globs when stdout is not a terminal), or "
                        "sarif: one SARIF 2.1.0 log for CI code scanning (one result per "
                        "finding; rules by capability)")
    p.add_argument("-v", "--verbose", action="store_true", help="also list allowed globals")
    p.add_argument("--loadable-only", action="store_true",
                   help="skip a named file that none of torch's loaders reads (by its name "
                        "and first bytes, as a folder walk decides): the pre-commit hook "
                        "hands every staged file")
    g = p.add_argument_group("allowing (also from pyproject.toml's [tool.ptfile] table)")
    g.add_argument("--allow", action="append", default=[], metavar="MODULE.NAME",
                   help="count this unknown global as allowed (repeatable; a glob matches "
                        "module.name: 'transformers.training_args.*'); never a dangerous "
                        "one: --allow posix.system is an error")
    g.add_argument("--allow-numpy", action="store_true",
                   help="count numpy's arrays, scalars, dtypes and RNG states "
                        "(ptfile.NUMPY_GLOBALS) as allowed; object arrays stay dangerous")
    g.add_argument("--allow-unknown", action="store_true",
                   help="exit 0, not 3, for files whose worst verdict is unknown")
    g.add_argument("--no-config", action="store_true",
                   help="read no [tool.ptfile] table from pyproject.toml")


def _args_convert(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", nargs="+", metavar="PATH",
                   help="checkpoint, .safetensors, a Hugging Face *.index.json or a DCP "
                        "directory, then the output file (or folder: for a sharded index, or "
                        "Hugging Face shards of a DCP directory); one input, or more than two, "
                        "or --out-prefix: each input converted beside it or under the prefix "
                        "(a table on a terminal, JSON Lines through a pipe; see --format)")
    p.add_argument("--to", choices=("safetensors", "npz", "pt"),
                   help="output kind (default: from the output's suffix; in bulk, "
                        "safetensors)")
    p.add_argument("--shared", choices=("dedupe", "copy", "error"), default="dedupe",
                   help="tensors sharing storage: store tied views once (default), copy "
                        "each, or refuse")
    p.add_argument("--npz-upcast", action="store_true",
                   help=".npz: widen bfloat16/float8 to float32 (default: their raw bits as "
                        "uint16/uint8, the dtype noted in the __ptfile__ member)")
    p.add_argument("--json", action="store_true", help="print a JSON summary (in bulk, "
                   "as PATH says: JSON Lines)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--structural", action="store_true", help=_STRUCTURAL_HELP)
    zero = p.add_argument_group("DeepSpeed ZeRO folders (as zero_to_fp32.py)")
    zero.add_argument("--tag", help="the tag folder to read (default: the one 'latest' names)")
    zero.add_argument("--exclude-frozen", action="store_true",
                      help="leave out the frozen parameters")
    zero.add_argument("--frozen-from-module", action="store_true",
                      help="ZeRO-1: take the frozen parameters (which it does not record) from "
                           "the model file, in the model's bit16 dtype")
    zero.add_argument("--dtype", choices=("fp32", "fp16", "bf16"),
                      help="floating tensors' output dtype (default fp32; integer and bool "
                           "buffers keep theirs)")


def _args_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="+", metavar="FILE",
                   help="checkpoint to check (several, globs, directories: a table on a "
                        "terminal, JSON Lines through a pipe; see --format)")
    p.add_argument("--json", action="store_true", help="print JSON (folders, globs, several "
                   "files: JSON Lines)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _args_diff(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="first checkpoint")
    p.add_argument("b", help="second checkpoint")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="also list equal tensors")
    p.add_argument("--tensors-only", action="store_true",
                   help="compare tensors only, not other values (step, config): for a .pt "
                        "against its .safetensors conversion")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--structural", action="store_true", help=_STRUCTURAL_HELP)


_COMMANDS: Final[dict[str, tuple[Callable[[argparse.Namespace, TextIO], int], str]]] = {
    "inspect": (_cmd_inspect, ("describe a checkpoint: format, records, tensors, tree, totals "
                              "(reads no tensor data)")),
    "scan": (_cmd_scan, ("list the globals each file's pickles reference and flag dangerous "
                        "ones (never executes)")),
    "convert": (_cmd_convert, ("convert to/from .safetensors, to .npz, or to the current .pt "
                              "format; sharded Hugging Face checkpoints shard by shard")),
    "verify": (_cmd_verify, ("check structure, the CRC-32 of every record, and every tensor's "
                            "bounds")),
    "diff": (_cmd_diff, ("compare two checkpoints: keys added/removed, dtype/shape changes, "
                        "max |a-b| per tensor")),
}
_ARGUMENTS: Final[dict[str, Callable[[argparse.ArgumentParser], None]]] = {
    "inspect": _args_inspect, "scan": _args_scan, "convert": _args_convert,
    "verify": _args_verify, "diff": _args_diff,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ptfile`` command line; return its exit code.

    Examples
    --------
    >>> main(["--version"])  # doctest: +SKIP
    ptfile 0.1.0
    """
    parser = _parser()
    args = parser.parse_args(argv)
    out = sys.stdout
    with warnings.catch_warnings():
        _say_warnings(args.command)
        return _run(args, out)


def _say_warnings(command: str) -> None:
    """ptfile's own warnings (a server that ignores byte ranges, a CRC torch tolerates) as
    one line each on stderr, ``ptfile inspect: warning: ...``, not Python's two-line form
    with a source line."""
    default = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if not issubclass(category, PtfileWarning):
            default(message, category, filename, lineno, file, line)
            return
        print(f"ptfile {command}: warning: {inert(message)}", file=file or sys.stderr)

    warnings.showwarning = show
    warnings.simplefilter("default", PtfileWarning)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    try:
        if args.command == "scan":
            _allowing(args)
        if _cli_bulk.is_bulk(args):
            return _cli_bulk.run(args, out)
        _cli_bulk.single(args)
        return int(args.func(args, out))
    except BrokenPipeError:  # `ptfile inspect big.pt | head`
        return EXIT_OK
    except (PtfileError, OSError) as exc:
        message = _error_message(args, exc)
        if getattr(args, "json", False):
            _print_json({"error": type(exc).__name__, "message": message,
                         "path": _input_of(args) or getattr(exc, "input", None),
                         "exit_code": EXIT_ERROR}, out)
        print(f"ptfile {args.command}: error: {inert(message)}", file=sys.stderr)
        return EXIT_ERROR


def _allowing(args: argparse.Namespace) -> None:
    """scan's allow-list: ``--allow``, ``--allow-numpy`` and the ``[tool.ptfile]`` table
    (:mod:`.config`) as ``args.allow_list`` (a pattern that would pass a dangerous name
    raises, exit 2)."""
    from ..scanning.allowing import AllowList
    from . import config

    config.apply(args)
    args.allow_list = AllowList(tuple(args.allow), numpy=args.allow_numpy)


def _input_of(args: argparse.Namespace) -> str | None:
    """The one input a single-file command was reading (None for diff: its error names it)."""
    value = getattr(args, "file", None) or getattr(args, "input", None)
    return value if isinstance(value, str) else None


def _error_message(args: argparse.Namespace, exc: BaseException) -> str:
    """The error as the command line says it: the input first, and for a refused global,
    what to type (``--structural``, ``ptfile scan``) rather than the Python call."""
    path = _input_of(args) or getattr(exc, "input", None)
    if isinstance(exc, UnsafeGlobalError):
        where = path or "the checkpoint"
        flag = " rerun with --structural to read it with inert stand-ins (nothing runs);" \
            if "structural" in vars(args) else ""
        text = (f"{where} names {exc.module}.{exc.name}, which torch.load(weights_only=True) "
                f"refuses:{flag} `ptfile scan {path or 'FILE'}` lists every global it "
                f"references")
        return text
    text = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        text = f"no such file or directory: {exc.filename}"
        path = None
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        # The file it names (an output, its folder) may be none of the inputs: as mkdir says.
        text, path = f"{exc.filename}: {exc.strerror}", None
    return f"{path}: {text}" if path is not None and not text.startswith(path) else text
