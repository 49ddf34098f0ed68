"""Every miss the scan harness found, as a named case built by code (issue 23).

Each case is a :class:`variants.Recipe` reduced by hand to the parameters that matter.
Two tests per case: the real loader runs its payload (the oracle, torch 2.13 in the
sandboxed child: so the case stays a true positive), and ``ptfile.scan`` exits non-zero.
Cases the scanner does not handle yet are ``xfail(strict=True)``: a fix turns them into
XPASS, which fails, so the marker and :data:`KNOWN_GAPS`' entry go together.

Found by ``test_scan_harness`` (3,000 derandomized variants) on the scanner of 545a417:

* **tar**: a legacy tar whose ``tensors`` member is written at pickle protocol 0 or 1
  with a storage key that is not a str or int (tuple, bytes, float, ``(None, i)``): the
  payload in the next tensor record's pickle runs in ``torch.load(weights_only=False)``;
  scan: clean.
* **pt2 subfolder**: a ``use_pickle`` weight whose ``path_name`` has a folder
  (``sub/weight_9``): ``torch.export.load`` joins it under ``data/weights/`` and
  ``torch.load(weights_only=False)``s it; scan: clean.
* **pt2 marker case**: ``archive_format`` named in another case (``Archive_Format``):
  torch's reader finds it case-insensitively, so ``torch.export.load`` reads the archive
  as ``.pt2`` and unpickles the sample inputs (weights_only=False on fallback); scan:
  clean (with the folder ``M``; ``model`` gives unknown).

All three are fixed by the loader models of :mod:`ptfile.scanning.loaders` (tar and
stream, the ZIP family): no case is an xfail any more.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import loaders_for, scan_exit
from loader_oracle import Job, Outcome, run_loaders, sandbox
from variants import Recipe, build

_TAR = {"kind": "open", "extra_member": False, "position": "tensor_args", "header": "ustar",
        "order": ["storages", "tensors", "pickle"], "ranks": [1, 1]}
_PT2 = {"kind": "open", "case": "same", "prefix": "model", "protocol": 2}

#: name -> (recipe, loader that runs it, issue-23 gap it falls in or None when scan flags it)
CASES: dict[str, tuple[Recipe, str, str | None]] = {
    "tar-tensor-record-tuple-key-protocol0": (
        Recipe("tar", {**_TAR, "key": "tuple", "protocol": 0}),
        "torch.load(weights_only=False)", None),
    "tar-tensor-record-bytes-key-protocol1": (
        Recipe("tar", {**_TAR, "key": "bytes", "protocol": 1}),
        "torch.load(weights_only=False)", None),
    "tar-tensor-record-float-key-protocol0": (
        Recipe("tar", {**_TAR, "key": "float", "protocol": 0}),
        "torch.load(weights_only=False)", None),
    "tar-tensor-record-none-tuple-key-protocol1": (
        Recipe("tar", {**_TAR, "key": "none_tuple", "protocol": 1}),
        "torch.load(weights_only=False)", None),
    "pt2-pickled-weight-in-subfolder-bare": (
        Recipe("pt2", {**_PT2, "role": "weight", "subfolder": True, "wrapper": "bare"}),
        "torch.export.load", None),
    "pt2-pickled-weight-in-subfolder-torch-zip": (
        Recipe("pt2", {**_PT2, "role": "weight", "subfolder": True, "wrapper": "zip"}),
        "torch.export.load", None),
    "pt2-pickled-weight-in-subfolder-legacy-stream": (
        Recipe("pt2", {**_PT2, "role": "weight", "subfolder": True, "wrapper": "legacy"}),
        "torch.export.load", None),
    "pt2-archive-format-marker-title-case": (
        Recipe("pt2", {**_PT2, "role": "archive_format_case", "subfolder": False,
                       "wrapper": "bare", "case": "title", "prefix": "M"}),
        "torch.export.load", None),
    # guards: the same shapes the scanner already flags (they must stay flagged)
    "tar-tensor-record-tuple-key-protocol2": (
        Recipe("tar", {**_TAR, "key": "tuple", "protocol": 2}),
        "torch.load(weights_only=False)", None),
    "pt2-pickled-weight-top-level": (
        Recipe("pt2", {**_PT2, "role": "weight", "subfolder": False, "wrapper": "bare"}),
        "torch.export.load", None),
}

_REASONS = {
    "tar": "issue 23: the scanner stops at a legacy-tar record ptfile refuses (non-str key, "
           "protocol 0/1 tensors member) and misses the pickles torch reads after it",
    "pt2": "issue 23: .pt2 use_pickle records with a folder in path_name are not scanned as "
           "pickles torch.export.load reads",
    "names": "issue 23: the .pt2 marker is looked up case-sensitively; torch's reader "
             "finds Archive_Format case-insensitively",
}


def _tar_gap(r: Recipe) -> bool:
    p = r.params
    return (p["position"] == "tensor_args" and p["protocol"] <= 1
            and p["key"] in ("tuple", "bytes", "float", "none_tuple"))


def _pt2_subfolder_gap(r: Recipe) -> bool:
    return r.params["role"] == "weight" and r.params["subfolder"]


def _pt2_marker_gap(r: Recipe) -> bool:
    return r.params["role"] == "archive_format_case" and r.params["case"] != "same"


#: The misses test_scan_harness reports without failing, while the xfails above stand.
#: Empty: the three gaps the harness found first (tar records after one ptfile refuses,
#: pickled .pt2 weights in subfolders, the .pt2 marker in another case) are fixed by the
#: loader models (ptfile.scanning.loaders); their cases stay as regressions.
KNOWN_GAPS: dict[str, tuple[str, Callable[[Recipe], bool]]] = {}


def known_gap(recipe: Recipe) -> str | None:
    """The known gap a harness miss falls in, or None (a new miss: the harness fails)."""
    for name, (technique, matches) in KNOWN_GAPS.items():
        if recipe.technique == technique and matches(recipe):
            return name
    return None


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    root = tmp_path_factory.mktemp("scan_regressions")
    files, sentinels = sandbox(root)
    jobs = []
    for i, (name, (recipe, _, _)) in enumerate(CASES.items()):
        data = build(recipe, str(sentinels / f"r{i}"))
        path = files / f"{name}{recipe.suffix()}"
        path.write_bytes(data)
        jobs.append(Job(name, path, sentinels / f"r{i}", loaders_for(data)))
    yield {o.id: o for o in run_loaders(root, jobs)}
    shutil.rmtree(root, ignore_errors=True)


def _params(fail_known: bool) -> list[object]:
    out = []
    for name, (_, _, gap) in CASES.items():
        marks = ([pytest.mark.xfail(strict=True, reason=_REASONS[gap])]
                 if gap and fail_known else [])
        out.append(pytest.param(name, id=name, marks=marks))
    return out


@pytest.mark.parametrize("name", _params(fail_known=False))
def test_a_real_loader_runs_it(name: str, oracle: dict[str, Outcome]) -> None:
    assert CASES[name][1] in oracle[name].fired, oracle[name]


@pytest.mark.parametrize("name", _params(fail_known=True))
def test_scan_exits_non_zero(name: str, tmp_path: Path) -> None:
    recipe = CASES[name][0]
    path = tmp_path / f"{name}{recipe.suffix()}"
    path.write_bytes(build(recipe, str(path.parent / "never-created")))
    code, why = scan_exit(path)
    assert code != 0, why


@pytest.mark.parametrize("name", list(CASES))
def test_known_gaps_name_the_xfails(name: str) -> None:
    """The harness tolerates exactly the misses these xfails stand for."""
    assert known_gap(CASES[name][0]) == CASES[name][2]


@pytest.mark.parametrize("name", list(CASES))
def test_ptfile_load_never_runs_it(name: str, oracle: dict[str, Outcome]) -> None:
    fired = [n for n in oracle[name].fired if n.startswith("ptfile")]
    assert not fired
