"""Atheris harness: the error contract of load (strict, structural) and scan, coverage-guided.

Run (outside CI; needs the fuzz extra: ``pip install -e '.[fuzz]'``)::

    python fuzz/fuzz_load.py -max_total_time=3600 -rss_limit_mb=4096 -timeout=10 \\
        fuzz/corpus fuzz/seeds

Any exception other than :class:`ptfile.PtfileError` is a finding, as are
crashes, timeouts and RSS beyond the limit (libFuzzer reports those).  A
finding becomes a regression file: minimise it (``-minimize_crash=1``), copy it
to ``tests/regressions/4-<slug>.bin`` and add its expected outcome to
``tests/regressions/test_regressions.py``.
"""

from __future__ import annotations

import io
import sys
import warnings

import atheris

with atheris.instrument_imports():
    import ptfile


def test_one_input(data: bytes) -> None:
    """One input: both load modes and the scanner; only ptfile errors may escape."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for structural in (False, True):
            try:
                ptfile.load(io.BytesIO(data), structural=structural)
            except ptfile.PtfileError:
                pass
        ptfile.scan(data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
