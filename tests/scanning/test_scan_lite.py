"""The lite interpreter (issue 30): what ``_load_for_lite_interpreter`` runs is scanned.

Benign files are written by ``_save_for_lite_interpreter``; hostile ones carry a payload
only the lite interpreter runs (:mod:`lite_cases`: ``bytecode.pkl`` calls ``aten::save``
from a ``__setstate__``, ``code/`` harmless).  Real torch in the sandboxed oracle child
(:mod:`loader_oracle`) says which loader runs what.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import ptfile
from lite_cases import BENIGN, LAYOUTS, hostile, lite_bytes
from loader_oracle import Job, Outcome, run_loaders, sandbox
from ptfile import cli, outcomes
from ptfile.limits import DEFAULT_LIMITS
from ptfile.scanning import Verdict
from ptfile.scanning.lite import judge_bytecode
from ptfile.scanning.loaders import JIT_LOAD, LITE_LOAD

LOADERS = (LITE_LOAD, JIT_LOAD, "torch.load(weights_only=False)")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Outcome]]:
    root = tmp_path_factory.mktemp("lite")
    folder, sentinels = sandbox(root)
    jobs = []
    for layout in LAYOUTS:
        path, sentinel = folder / f"hostile-{layout}.ptl", sentinels / layout
        path.write_bytes(hostile(str(sentinel), layout))
        jobs.append(Job(f"hostile-{layout}", path, sentinel, LOADERS))
    for name, make in BENIGN.items():
        path = folder / f"benign-{name}.ptl"
        path.write_bytes(lite_bytes(make()))
        jobs.append(Job(f"benign-{name}", path, sentinels / name, LOADERS))
    return {job.id: (job.path, outcome) for job, outcome in zip(jobs, run_loaders(root, jobs),
                                                                  strict=True)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_payload_only_the_lite_interpreter_runs_is_dangerous(
        layout: str, files: dict[str, tuple[Path, Outcome]]) -> None:
    path, outcome = files[f"hostile-{layout}"]
    assert outcome.fired == (LITE_LOAD,)  # torch.jit.load compiles the harmless code/
    assert cli.main(["scan", str(path)]) == outcomes.EXIT_UNSAFE
    found = [f for f in ptfile.scan(path).findings if f.verdict is Verdict.DANGEROUS]
    assert [(f.kind, f.loaders) for f in found] == [("torchscript-code", (LITE_LOAD,))]
    assert "aten::save" in found[0].message


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_torch_written_lite_files_scan_clean(
        name: str, files: dict[str, tuple[Path, Outcome]]) -> None:
    path, outcome = files[f"benign-{name}"]
    assert outcome.errors[LITE_LOAD] is None and not outcome.fired  # it loads, runs nothing
    assert cli.main(["scan", str(path)]) == outcomes.EXIT_OK
    result = ptfile.scan(path)
    assert any(f.kind == "torchscript-code" and f.loaders == (LITE_LOAD,)
               for f in result.findings), "bytecode.pkl is judged"


def _program(operators: tuple[tuple[str, str, int], ...], types: tuple[str, ...] = ()) -> bytes:
    method = ("__torch__.M.forward", (("instructions", (("OP", 0, 0), ("RET", 0, 0))),
                                      ("operators", operators), ("constants", ()),
                                      ("types", types), ("register_size", 1)))
    return pickle.dumps((8, method), protocol=2)


@pytest.mark.parametrize(("operators", "types", "verdict"), [
    ((("aten::add", "Tensor", 2), ("prim::ListConstruct", "", 0)), (), Verdict.ALLOWED),
    ((("prepacked::linear_clamp_run", "", 2),),
     ("__torch__.torch.classes.xnnpack.LinearOpContext",), Verdict.ALLOWED),
    ((("aten::save", "", 2),), (), Verdict.DANGEROUS),
    ((("aten::from_file", "", 4),), (), Verdict.DANGEROUS),
    ((("evil::run", "", 1),), (), Verdict.DANGEROUS),
    ((("prim::PythonOp", "", 1),), (), Verdict.DANGEROUS),
    ((("aten::add", "", 2),), ("Optional[__torch__.torch.classes.evil.Runner]",),
     Verdict.DANGEROUS),
])
def test_judge_bytecode(operators: tuple[tuple[str, str, int], ...], types: tuple[str, ...],
                        verdict: Verdict) -> None:
    assert judge_bytecode(_program(operators, types), DEFAULT_LIMITS)[0] is verdict


def test_a_damaged_program_is_judged_on_what_it_holds() -> None:
    data = _program((("aten::save", "", 2),))
    assert judge_bytecode(data[:-20], DEFAULT_LIMITS)[0] is Verdict.DANGEROUS
