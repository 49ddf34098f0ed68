"""The text report of a bulk run (``ptfile scan|inspect|verify|convert DIR`` on a terminal,
or with ``--format text``): what a person reads where a script reads JSON Lines.

Three parts, once every file is done (the progress bar on stderr shows the run):

1. a table of every file, sorted by path: ``path``, ``verdict`` (the record's: ``allowed``,
   ``dangerous``, ``unknown``, ``ok``, ``damaged``, ``converted``, ``skipped``, ``error``)
   and a short reason of one line (at most :data:`REASON_CHARS` characters): the format and
   a tally of findings (scan), tensors and size (inspect), what was checked or the first
   problem (verify), the output (convert), the error (any);
2. the totals by verdict, the files, the time and the exit code;
3. the files that need attention (:func:`ptfile.outcomes.needs_attention`: dangerous,
   unknown, damaged, error), worst first, each with its details: every finding that is
   not allowed, every problem, or the whole error.

Every name from a file is written through :func:`ptfile.cli.text.shown` (escape
sequences and control characters never reach the terminal as such).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Final, TextIO

from ..outcomes import ERROR, VERDICT_CODES, WORST_FIRST, needs_attention
from .text import finding_line, global_name, shown, size, table, tally

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["REASON_CHARS", "TextReport", "reason"]

#: The longest reason a table row shows (the details below the table say the rest).
REASON_CHARS: Final = 100
#: How many globals a scan's reason names before "…".
_NAMED_GLOBALS: Final = 3


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _error(record: dict[str, Any]) -> str:
    error = record.get("error") or {}
    return f"{error.get('type', 'Error')}: {error.get('message', '')}"


def _scan(result: dict[str, Any]) -> str:
    findings = result.get("findings", [])
    flagged = list(dict.fromkeys(global_name(f) for f in findings
                                 if f.get("verdict") != "allowed"))
    names = ", ".join(flagged[:_NAMED_GLOBALS]) + (", …" if len(flagged) > _NAMED_GLOBALS else "")
    return f"{result.get('format', '?')}; {tally(findings)}" + (f": {names}" if names else "")


def _inspect(result: dict[str, Any]) -> str:
    totals = result.get("totals", {})
    return (f"{result.get('format', '?')}; {_count(totals.get('tensors', 0), 'tensor')}, "
            f"{_count(totals.get('parameters', 0), 'parameter')}, "
            f"{size(totals.get('storage_bytes', 0))}")


def _verify(result: dict[str, Any]) -> str:
    problems = result.get("problems", [])
    errors = [p for p in problems if p.get("severity") != "warning"]
    if errors:
        first = errors[0]
        more = f" (and {_count(len(errors) - 1, 'more problem')})" if len(errors) > 1 else ""
        return f"{shown(first.get('where', ''))}: {shown(first.get('message', ''))}{more}"
    return (f"{result.get('format', '?')}; {_count(result.get('records_checked', 0), 'record')}, "
            f"{size(result.get('bytes_checked', 0))} checked; "
            f"{_count(result.get('tensors_checked', 0), 'tensor')}"
            + (f"; {_count(len(problems), 'warning')}" if problems else ""))


def _convert(result: dict[str, Any]) -> str:
    if "tensors" not in result:  # skipped: the output exists (a complete one)
        return f"{shown(result.get('output'))} exists"
    dropped = len(result.get("dropped", []))
    return (f"→ {shown(result.get('output'))} ({result.get('kind', '?')}, "
            f"{_count(result['tensors'], 'tensor')}" + (f", {dropped} dropped" if dropped else "")
            + ")")


#: Each command's reason from its record's ``result``.
_REASONS: Final[dict[str, Callable[[dict[str, Any]], str]]] = {
    "scan": _scan, "inspect": _inspect, "verify": _verify, "convert": _convert}


def reason(record: dict[str, Any]) -> str:
    """One line on why a file has its verdict, safe to show, at most :data:`REASON_CHARS`.

    Examples
    --------
    >>> reason({"command": "scan", "verdict": "error", "error": {"type": "FormatError",
    ...         "message": "truncated\\nstream"}})
    "'FormatError: truncated\\\\nstream'"
    """
    text = shown(_error(record)) if record.get("verdict") == ERROR or not record.get("result") \
        else _REASONS[record["command"]](record["result"])
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


def details(record: dict[str, Any]) -> list[str]:
    """The lines under a file that needs attention: its findings that are not allowed,
    its problems, or its whole error."""
    result = record.get("result")
    if record.get("verdict") == ERROR or not result:
        return [shown(_error(record))]
    if record["command"] == "scan":
        return [finding_line(f) for f in result.get("findings", [])
                if f.get("verdict") != "allowed"]
    if record["command"] == "verify":
        return [f"{p.get('severity', '?')}: {shown(p.get('where', ''))}: "
                f"{shown(p.get('message', ''))}" for p in result.get("problems", [])]
    return []


class TextReport:
    """The records of a bulk run, kept as the table needs them (a row each, and the details
    of those that need attention), written once the run is done."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.rows: list[tuple[str, str, str]] = []
        self.attention: list[tuple[int, str, str, list[str]]] = []

    def add(self, record: dict[str, Any]) -> None:
        path, verdict = str(record["path"]), str(record["verdict"])
        self.rows.append((path, verdict, reason(record)))
        if needs_attention(self.command, verdict):
            code = int(record["exit_code"])
            rank = WORST_FIRST.index(code) if code in WORST_FIRST else len(WORST_FIRST)
            self.attention.append((rank, path, verdict, details(record)))

    def write(self, summary: dict[str, Any], out: TextIO) -> None:
        """The table, the totals and the files that need attention."""
        rows = [["path", "verdict", "reason"]]
        rows += [[shown(path), verdict, why] for path, verdict, why in sorted(self.rows)]
        table(rows, out, indent="")
        out.write(f"\n{self._totals(summary)}\n")
        self._walked(summary, out)
        if self.attention:
            out.write(f"\nNeeds attention ({len(self.attention)})\n")
            for _rank, path, verdict, lines in sorted(self.attention, key=lambda a: a[:2]):
                out.write(f"{shown(path)}: {verdict}\n")
                out.writelines(f"  {line}\n" for line in lines)

    @staticmethod
    def _walked(summary: dict[str, Any], out: TextIO) -> None:
        """The walk's notes: files skipped (listed with --list-skipped), links out of the
        folder, folders reached again."""
        skipped = summary.get("skipped") or 0
        if skipped:
            hint = "" if "skipped_files" in summary else " (--list-skipped lists them)"
            out.write(f"{skipped} file{'s' if skipped != 1 else ''} skipped: no loader of "
                      f"torch's reads them{hint}\n")
            out.writelines(f"  {shown(p)}\n" for p in summary.get("skipped_files", []))
        out.writelines(f"link out of the folder: {shown(path)} -> {shown(target)} (scanned)\n" for path, target in summary.get("outside", {}).items())
        out.writelines(f"folder reached again through a link, walked once: {shown(path)}\n" for path in summary.get("repeated", []))

    def _totals(self, summary: dict[str, Any]) -> str:
        counts = Counter(verdict for _path, verdict, _why in self.rows)
        order = [*VERDICT_CODES.get(self.command, {}), ERROR]
        parts = [f"{counts[v]} {v}" for v in order if counts[v]]
        parts += [f"{n} {v}" for v, n in counts.items() if v not in order]
        files = len(self.rows)
        seconds = summary.get("seconds")
        took = f" in {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        return (f"{files} file{'s' if files != 1 else ''}{took}: {', '.join(parts) or 'none'}"
                f" — exit {summary.get('exit_code')}")
