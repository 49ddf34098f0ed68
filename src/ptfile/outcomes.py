"""How a command's outcome is reported: the one exit-code table every command shares, each
command's verdicts and their codes, and which code wins over many files.

=====  ======================  ==============================================================
code   constant                meaning
=====  ======================  ==============================================================
0      :data:`EXIT_OK`         ok (scan: clean; verify: intact; diff: identical)
1      :data:`EXIT_UNSAFE`     found something (scan: dangerous; verify: damaged —
       :data:`EXIT_INVALID`    :data:`EXIT_INVALID`; diff: differs)
2      :data:`EXIT_ERROR`      could not read (missing, not a checkpoint, damaged, network,
                               refused globals, bad usage)
3      :data:`EXIT_UNKNOWN`    scan only: unknown globals, nothing dangerous
=====  ======================  ==============================================================

Each command's verdicts map to a code by :data:`VERDICT_CODES` (:func:`exit_code` asks it):

=========  ===========================================  ====
command    verdict                                      code
=========  ===========================================  ====
scan       ``allowed`` (clean)                          0
scan       ``dangerous``                                1
scan       ``unknown`` (0 with ``allow_unknown``)       3
verify     ``ok`` / ``damaged``                         0/1
inspect    ``ok``                                       0
convert    ``converted`` / ``skipped`` (output exists)  0
diff       ``identical`` / ``differs``                  0/1
any        ``error`` (could not read, write, scan)      2
=========  ===========================================  ====

A file **needs attention** (:func:`needs_attention`) when its verdict's code is not 0,
``allow_unknown`` aside: an unknown global is worth a look even where it passes.

Over many files the worst code wins (:func:`worst`), in the order of :data:`WORST_FIRST`:
a failed check (1) before an error (2) before unknown globals (3) before 0.  A
transient failure (a connection reset, a 5xx) becomes an error outcome only after
:data:`RETRIES` more attempts.  This module imports nothing: the command line reads
it before it knows whether it will need numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["BACKOFF_SECONDS", "ERROR", "EXIT_CODES", "EXIT_DIFFERENT", "EXIT_ERROR",
           "EXIT_INVALID", "EXIT_OK", "EXIT_UNKNOWN", "EXIT_UNSAFE", "RETRIES", "SCAN_CODES",
           "VERDICT_CODES", "WORST_FIRST", "exit_code", "needs_attention", "worst"]

EXIT_OK: Final = 0
#: ``scan`` found something dangerous.
EXIT_UNSAFE: Final = 1
#: ``verify`` found damage (same value as EXIT_UNSAFE: "the check failed").
EXIT_INVALID: Final = 1
#: ``diff`` found a difference (as diff(1)).
EXIT_DIFFERENT: Final = 1
#: The command could not do its work: unreadable or unsupported input.
EXIT_ERROR: Final = 2
#: ``scan``: nothing dangerous, but names on no allowlist.
EXIT_UNKNOWN: Final = 3
#: Which code wins over several files, worst first (then EXIT_OK).
WORST_FIRST: Final = (EXIT_UNSAFE, EXIT_ERROR, EXIT_UNKNOWN)
#: The verdict of a file any command could not read (or write, or scan).
ERROR: Final = "error"
#: ``scan``'s code per verdict.
SCAN_CODES: Final = {"allowed": EXIT_OK, "dangerous": EXIT_UNSAFE, "unknown": EXIT_UNKNOWN}
#: Each command's code per verdict (``error`` is :data:`EXIT_ERROR` for every command).
VERDICT_CODES: Final = {
    "scan": SCAN_CODES,
    "verify": {"ok": EXIT_OK, "damaged": EXIT_INVALID},
    "inspect": {"ok": EXIT_OK},
    "convert": {"converted": EXIT_OK, "skipped": EXIT_OK},
    "diff": {"identical": EXIT_OK, "differs": EXIT_DIFFERENT},
}
#: What each code means, as ``--help`` prints it.
EXIT_CODES: Final = {
    EXIT_OK: "ok (scan: clean; verify: intact; diff: identical)",
    EXIT_UNSAFE: "found something (scan: dangerous; verify: damaged; diff: differs)",
    EXIT_ERROR: "could not read (missing, not a checkpoint, damaged, network, refused "
                "globals, usage)",
    EXIT_UNKNOWN: "scan only: unknown globals, nothing dangerous (0 with --allow-unknown)",
}

#: Attempts after the first for a transient I/O error, and the first wait (doubled each time).
RETRIES: Final = 2
BACKOFF_SECONDS: Final = 0.2


def exit_code(command: str, verdict: str, *, allow_unknown: bool = False) -> int:
    """The exit code of one file's ``verdict`` under ``command`` (:data:`VERDICT_CODES`);
    ``allow_unknown`` makes scan's ``unknown`` 0.

    Raises
    ------
    KeyError
        A command or verdict the table does not have (a ptfile bug).

    Examples
    --------
    >>> exit_code("scan", "unknown"), exit_code("scan", "unknown", allow_unknown=True)
    (3, 0)
    >>> exit_code("verify", "damaged"), exit_code("inspect", "error")
    (1, 2)
    """
    if verdict == ERROR:
        return EXIT_ERROR
    code = VERDICT_CODES[command][verdict]
    return EXIT_OK if code == EXIT_UNKNOWN and allow_unknown else code


def needs_attention(command: str, verdict: str) -> bool:
    """Whether a file of this verdict is worth a look: its code is not 0 (``unknown``
    included, whatever ``allow_unknown`` says).

    Examples
    --------
    >>> needs_attention("scan", "unknown"), needs_attention("convert", "skipped")
    (True, False)
    """
    return exit_code(command, verdict) != EXIT_OK


def worst(codes: Iterable[int]) -> int:
    """The exit code that wins over several files (:data:`WORST_FIRST`, then 0).

    Examples
    --------
    >>> worst([0, 3, 2]), worst([2, 1]), worst([])
    (2, 1, 0)
    """
    return min(set(codes) - {EXIT_OK}, key=WORST_FIRST.index, default=EXIT_OK)
