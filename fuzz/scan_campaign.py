"""Long campaign of the scan harness (issue 23): real torch loaders against ``ptfile scan``.

Draws container variants (``tests/support/variants.py``) in rounds, each round from a new
hypothesis seed; runs every real loader on them in the sandboxed child
(``tests/support/loader_oracle.py``); scans them with ``ptfile.scan``.  Stops after
``--minutes`` or ``--variants``, prints how many variants it tried per technique, and
writes every miss — a file a real loader ran whose scan exits 0, a benign torch-written
file that does not scan clean, a file ``ptfile.load`` ran, a scan that raised something
other than a PtfileError — to ``--out``: the file's bytes, and a JSON with the recipe,
the loaders that fired and scan's verdict.  Misses already filed as xfail regressions
(``tests/scanning/test_scan_regressions.py``) are counted apart, not written.

    python fuzz/scan_campaign.py --minutes 30 --out fuzz/scan-misses
    python fuzz/scan_campaign.py --variants 50000 --techniques tar pt2 --seed 7
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "scanning"))

from test_scan_regressions import known_gap

from harness import CONTRACT_BROKEN, Case, collect, evaluate
from variants import TECHNIQUES, benign_files


def _problem(case: Case) -> str | None:
    if case.ptfile_fired:
        return "ptfile-load-ran-payload"
    if case.exit_code == CONTRACT_BROKEN:
        return "scan-contract"
    if case.recipe is None:
        return "benign-not-clean" if case.exit_code != 0 or case.fired else None
    if case.miss:
        return "known-gap" if known_gap(case.recipe) else "miss"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--variants", type=int, default=0, help="stop after this many (0: by time)")
    ap.add_argument("--round", type=int, default=3000, help="variants per oracle batch")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--techniques", nargs="*", choices=sorted(TECHNIQUES))
    ap.add_argument("--out", type=Path, default=Path("fuzz/scan-misses"))
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.minutes * 60
    tried, fired, problems = Counter[str](), Counter[str](), Counter[str]()
    began, round_no, total = time.monotonic(), 0, 0
    args.out.mkdir(parents=True, exist_ok=True)
    while time.monotonic() < deadline and (not args.variants or total < args.variants):
        count = args.round if not args.variants else min(args.round, args.variants - total)
        drawn = collect(count, args.techniques, random_seed=args.seed + round_no)
        root = Path(tempfile.mkdtemp(prefix="ptfile-scan-campaign-"))
        try:
            cases = evaluate(root, drawn, benign_files() if round_no == 0 else None)
            for case in cases:
                tech = case.recipe.technique if case.recipe else "benign"
                tried[tech] += 1
                fired[tech] += bool(case.fired)
                problem = _problem(case)
                if problem is None:
                    continue
                problems[f"{tech}:{problem}"] += 1
                if problem == "known-gap":
                    continue
                stem = f"{problem}-{tech}-s{args.seed + round_no}-{case.name}"
                shutil.copyfile(case.path, args.out / f"{stem}{case.path.suffix}")
                (args.out / f"{stem}.json").write_text(json.dumps({
                    "problem": problem, "technique": tech,
                    "recipe": case.recipe.params if case.recipe else None,
                    "label": case.recipe.label() if case.recipe else case.name,
                    "fired": list(case.outcome.fired), "errors": case.outcome.errors,
                    "crashed": case.outcome.crashed, "scan_exit": case.exit_code,
                    "scan": case.why}, indent=1, default=repr))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        total += len(drawn)
        round_no += 1
        print(f"round {round_no}: {total} variants, {time.monotonic() - began:.0f} s, "
              f"problems {dict(problems)}", flush=True)
    print(f"\n{'technique':14} {'tried':>7} {'fired':>7}")
    for tech in sorted(tried):
        print(f"{tech:14} {tried[tech]:7} {fired[tech]:7}")
    print(f"\nproblems: {dict(problems) or 'none'}; written to {args.out}")
    return 1 if any(not k.endswith("known-gap") for k in problems) else 0


if __name__ == "__main__":
    sys.exit(main())
