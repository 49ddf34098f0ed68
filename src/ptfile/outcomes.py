"""How a command's outcome is reported: the one exit-code table every command shares.

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

Over many files the worst code wins, in the order of :data:`WORST_FIRST`.  A
transient failure (a connection reset, a 5xx) becomes an error outcome only after
:data:`RETRIES` more attempts.  This module imports nothing: the command line reads
it before it knows whether it will need numpy.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BACKOFF_SECONDS", "EXIT_CODES", "EXIT_DIFFERENT", "EXIT_ERROR", "EXIT_INVALID",
           "EXIT_OK", "EXIT_UNKNOWN", "EXIT_UNSAFE", "RETRIES", "SCAN_CODES", "WORST_FIRST"]

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
#: ``scan``'s code per verdict.
SCAN_CODES: Final = {"allowed": EXIT_OK, "dangerous": EXIT_UNSAFE, "unknown": EXIT_UNKNOWN}
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
