"""The scan harness's driver: draw recipes, build files, run the oracle, scan, compare.

Shared by ``test_scan_harness.py`` (a bounded, derandomized run in ``make test``) and
``fuzz/scan_campaign.py`` (long runs).  Files are generated in the parent; the oracle
(:mod:`loader_oracle`) runs them in batches in sandboxed children.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

import ptfile
from loader_oracle import PTFILE_LOADERS, TORCH_LOADERS, Job, Outcome, run_loaders, sandbox
from variants import Recipe, build, recipes


def collect(count: int, techniques: list[str] | None = None,
            random_seed: int | None = None) -> list[Recipe]:
    """``count`` recipes drawn by hypothesis: derandomized, or from ``random_seed``."""
    drawn: list[Recipe] = []

    @settings(max_examples=count, derandomize=random_seed is None, database=None,
              phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(recipes(techniques))
    def draw(recipe: Recipe) -> None:
        drawn.append(recipe)

    if random_seed is not None:
        draw = seed(random_seed)(draw)
    draw()
    return drawn


#: scan_exit's code when scan raises something other than a PtfileError (a scanner bug).
CONTRACT_BROKEN = 70


def scan_exit(path: Path) -> tuple[int, str]:
    """``ptfile scan``'s exit code for one file (0 clean; a raise counts as 2) and why."""
    try:
        result = ptfile.scan(path)
    except ptfile.PtfileError as exc:
        return 2, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a broken contract is reported, not raised
        return CONTRACT_BROKEN, f"not a PtfileError: {type(exc).__name__}: {exc}"
    verdict = result.verdict.value
    if verdict == "allowed":
        return 0, "clean"
    return (1 if verdict == "dangerous" else 3), verdict


def loaders_for(data: bytes) -> tuple[str, ...]:
    """Every loader, ``torch.load(mmap=True)`` only where it applies (a ZIP at byte 0)."""
    torch = tuple(n for n in TORCH_LOADERS if n != "torch.load(mmap=True)"
                  or data.startswith(b"PK\x03\x04"))
    return torch + PTFILE_LOADERS


@dataclass
class Case:
    """One file through the harness."""

    recipe: Recipe | None
    name: str
    path: Path
    outcome: Outcome
    exit_code: int
    why: str

    @property
    def fired(self) -> tuple[str, ...]:
        """Real loaders that created the sentinel."""
        return tuple(n for n in self.outcome.fired if n in TORCH_LOADERS)

    @property
    def ptfile_fired(self) -> tuple[str, ...]:
        return tuple(n for n in self.outcome.fired if n in PTFILE_LOADERS)

    @property
    def miss(self) -> bool:
        """A real loader ran the payload, and scan exits 0."""
        return bool(self.fired) and self.exit_code == 0


def evaluate(root: Path, drawn: Iterable[Recipe], benign: dict[str, bytes] | None = None,
             batch: int = 4000) -> list[Case]:
    """Build, oracle and scan every recipe (and the benign files, sentinel-less)."""
    files, sentinels = sandbox(root)
    entries: list[tuple[Recipe | None, str, Path, Path]] = []
    for i, recipe in enumerate(drawn):
        sentinel = sentinels / f"s{i:06d}"
        path = files / f"v{i:06d}{recipe.suffix()}"
        path.write_bytes(build(recipe, str(sentinel)))
        entries.append((recipe, f"v{i:06d}", path, sentinel))
    for name, data in (benign or {}).items():
        path = files / f"benign-{name}{'.pt2' if name == 'export' else '.pt'}"
        path.write_bytes(data)
        entries.append((None, f"benign-{name}", path, sentinels / f"none-{name}"))
    jobs = [Job(name, path, sentinel, loaders_for(path.read_bytes()))
            for _, name, path, sentinel in entries]
    outcomes: list[Outcome] = []
    for at in range(0, len(jobs), batch):
        outcomes += run_loaders(root, jobs[at:at + batch])
    cases = []
    for (recipe, name, path, _), outcome in zip(entries, outcomes, strict=True):
        code, why = scan_exit(path)
        cases.append(Case(recipe, name, path, outcome, code, why))
    return cases


def summary(cases: list[Case], began: float) -> str:
    """Per technique: variants, how many a real loader ran, misses."""
    rows: dict[str, list[int]] = {}
    for case in cases:
        tech = case.recipe.technique if case.recipe else "benign"
        row = rows.setdefault(tech, [0, 0, 0])
        row[0] += 1
        row[1] += bool(case.fired)
        row[2] += case.miss or (case.recipe is None and case.exit_code != 0)
    lines = [f"{'technique':14} {'variants':>8} {'fired':>6} {'misses':>6}"]
    lines += [f"{t:14} {a:8} {b:6} {c:6}" for t, (a, b, c) in sorted(rows.items())]
    lines.append(f"{len(cases)} files in {time.monotonic() - began:.0f} s")
    return "\n".join(lines)
