"""The scan harness (issue 23): real torch decides what runs; ``ptfile scan`` must agree.

Thousands of container variants (:mod:`variants`, drawn by hypothesis, derandomized) are
built in this process, each with a payload that only creates its own sentinel file, and
opened by every real loader — ``torch.load`` (``weights_only`` False and True, ``mmap``),
``torch.jit.load``, ``torch.export.load``, ``pickle.load`` — in one sandboxed child
(:mod:`loader_oracle`), together with files torch writes.  The properties:

(a) when any real loader creates the sentinel, ``ptfile.scan`` exits non-zero (a verdict
    other than allowed, or a raise: exit 2);
(b) every benign torch-written file scans clean (exit 0), and no loader runs anything;
(c) ``ptfile.load`` and ``ptfile.load(structural=True)`` never create the sentinel.

Misses already filed as named regressions (``test_scan_regressions.KNOWN_GAPS``) are
reported, not failed, until the scanner handles them.  Longer runs:
``PTFILE_HARNESS_VARIANTS=20000 PTFILE_HARNESS_SEED=7 pytest tests/scanning/test_scan_harness.py``
or ``fuzz/scan_campaign.py``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_scan_regressions import known_gap

from harness import CONTRACT_BROKEN, Case, collect, evaluate, summary
from variants import benign_files

pytestmark = pytest.mark.slow  # 3,000 variants through the real loaders: about a minute

#: Variants per run: derandomized in CI; PTFILE_HARNESS_SEED draws others.
VARIANTS = int(os.environ.get("PTFILE_HARNESS_VARIANTS", "3000"))
SEED = os.environ.get("PTFILE_HARNESS_SEED")

#: Techniques whose payload some real loader must run in a sound oracle.
MUST_FIRE = ("legacy", "pickle", "tar", "zip.data", "zip.around", "pt2")


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Case]]:
    root = tmp_path_factory.mktemp("scan_harness")
    began = time.monotonic()
    drawn = collect(VARIANTS, random_seed=int(SEED) if SEED else None)
    result = evaluate(root, drawn, benign_files())
    print("\n" + summary(result, began))
    yield result
    shutil.rmtree(root, ignore_errors=True)


def test_enough_variants(cases: list[Case]) -> None:
    drawn = [c for c in cases if c.recipe is not None]
    assert len(drawn) >= min(VARIANTS, 2500) * 0.95
    assert len({c.recipe.label() for c in drawn if c.recipe}) >= len(drawn) * 0.9


def test_oracle_is_sound(cases: list[Case]) -> None:
    """The sandbox lets payloads reach their sentinel: each loader-reachable technique fires."""
    for technique in MUST_FIRE:
        fired = [c for c in cases if c.recipe and c.recipe.technique == technique and c.fired]
        assert fired, f"no real loader ran any {technique} payload: is the oracle broken?"
    assert not any(c.outcome.crashed for c in cases if c.recipe is None)


def test_scan_flags_every_file_a_real_loader_runs(cases: list[Case]) -> None:
    misses = [c for c in cases if c.miss]
    new = [c for c in misses if c.recipe and not known_gap(c.recipe)]
    assert not new, "\n".join(f"{c.fired} ran it, scan: {c.why}: {c.recipe.label()}"
                              for c in new if c.recipe)


def test_scan_raises_only_ptfile_errors(cases: list[Case]) -> None:
    assert not [(c.name, c.why) for c in cases if c.exit_code == CONTRACT_BROKEN][:5]


def test_benign_torch_files_scan_clean(cases: list[Case]) -> None:
    benign = [c for c in cases if c.recipe is None]
    assert len(benign) > 50
    assert not [c for c in benign if c.outcome.fired]
    assert not [(c.name, c.why) for c in benign if c.exit_code != 0]


def test_ptfile_load_never_runs_the_payload(cases: list[Case]) -> None:
    assert not [(c.name, c.ptfile_fired, c.recipe) for c in cases if c.ptfile_fired]


def test_no_sentinel_left_behind(cases: list[Case]) -> None:
    root = cases[0].path.parent.parent
    assert not list((root / "sentinels").iterdir())
    assert not list(Path(root / "cwd").iterdir())
