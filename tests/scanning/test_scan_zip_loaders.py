"""The ZIP loaders' model (:mod:`ptfile.scanning.loaders.zipfamily`), grounded by real torch.

Each leniency is a file mutated from one torch writes (names in another case, records in
subfolders, a config that names them, the old ``torch.export`` format behind a ``.pt2``),
with a payload that only creates a sentinel file.  One sandboxed child (:mod:`loader_oracle`)
runs the real loader on every such file: where it creates the sentinel, ``ptfile.scan`` must
not pass the file.  Benign files torch
writes scan clean, and findings name the loaders that read them.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
import zipfile
from collections.abc import Callable, Iterator

import pytest
import torch

import ptfile
from hostile import checkpoint, raw_zip
from loader_oracle import Job, Outcome, run_loaders, sandbox
from ptfile.scanning import Verdict
from ptfile.scanning.loaders import EXPORT_LOAD, JIT_LOAD, LITE_LOAD, TORCH_LOAD, TORCH_LOAD_UNSAFE
from ptfile.scanning.pt2 import UNREADABLE_CONFIG

SENTINEL = "SENTINEL_PATH"


def payload(path: str) -> bytes:
    """A protocol 2 pickle of ``builtins.open(path, "w")``: it creates ``path``."""
    return (b"\x80\x02c__builtin__\nopen\nq\x00X" + len(path).to_bytes(4, "little")
            + path.encode() + b"X\x01\x00\x00\x00w\x86R.")


def fires(oracle: dict[str, tuple[bytes, Outcome]], case: str, loader: str) -> tuple[bool, bytes]:
    """Whether ``loader`` created the sentinel of the oracle's file ``case``; and the file."""
    data, outcome = oracle[case]
    assert outcome.crashed is None and outcome.errors.keys() == {loader}, outcome
    return outcome.fired == (loader,), data


def not_passed(data: bytes) -> ptfile.ScanResult | None:
    """``ptfile.scan`` of ``data``: dangerous (the result), or a ptfile error (None)."""
    try:
        result = ptfile.scan(data)
    except ptfile.PtfileError:
        return None
    assert result.is_dangerous, [f for f in result.findings if f.verdict is not Verdict.ALLOWED]
    return result


# ------------------------------------------------------------------ torch-written files

class _Lin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


@pytest.fixture(scope="module")
def saved() -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def scripted() -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(_Lin()), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def exported() -> bytes:
    buf = io.BytesIO()
    torch.export.save(torch.export.export(_Lin(), (torch.ones(1, 2),)), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory, scripted: bytes,
           exported: bytes) -> Iterator[dict[str, tuple[bytes, Outcome]]]:
    """Every file below whose payload a real loader must run, by case, with what it did:
    one sandboxed child (:mod:`loader_oracle`) runs them all, each with its one loader."""
    builds: dict[str, tuple[str, Callable[[str], bytes]]] = {
        f"data-pkl-{name}": (TORCH_LOAD_UNSAFE, _data_pkl_renamed(name)) for name in DATA_PKL_NAMES}
    builds["constants-pkl"] = (TORCH_LOAD_UNSAFE, lambda path: _constants_pkl_renamed(scripted, path))
    for case, build in EXPORT_CASES.items():
        builds[f"export-{case}"] = (EXPORT_LOAD, lambda path, build=build: build(exported, path))
    root = tmp_path_factory.mktemp("zip_loaders")
    files, sentinels = sandbox(root)
    jobs, data = [], {}
    for i, (case, (loader, build)) in enumerate(builds.items()):
        data[case] = build(str(sentinels / f"s{i}"))
        (files / f"f{i}").write_bytes(data[case])
        jobs.append(Job(case, files / f"f{i}", sentinels / f"s{i}", (loader,)))
    yield {o.id: (data[o.id], o) for o in run_loaders(root, jobs)}
    shutil.rmtree(root, ignore_errors=True)


def members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(n, z.read(n)) for n in z.namelist()]


def remap(data: bytes, change: Callable[[str, bytes], tuple[str, bytes] | None],
          extra: list[tuple[str, bytes]] | None = None) -> bytes:
    """A stored copy of ``data`` with each record renamed/changed (None drops it)."""
    out = [new for name, value in members(data) if (new := change(name, value)) is not None]
    return raw_zip(out + (extra or []))


def test_benign_torch_files_scan_clean_and_name_their_loaders(saved: bytes, scripted: bytes,
                                                               exported: bytes) -> None:
    expect = {"zip": {TORCH_LOAD_UNSAFE, TORCH_LOAD}, "torchscript": {TORCH_LOAD_UNSAFE, JIT_LOAD},
              "pt2": {EXPORT_LOAD}}
    for data in (saved, scripted, exported):
        result = ptfile.scan(data)
        assert result.verdict is Verdict.ALLOWED, result.findings
        assert result.findings
        assert {x for f in result.findings for x in f.loaders} == expect[result.format]
        assert all(f.loaders for f in result.findings)


# ------------------------------------------------------------------ torch.load, case folded

def _data_pkl_renamed(new: str) -> Callable[[str], bytes]:
    return lambda path: raw_zip([(f"archive/{new}", payload(path)), ("archive/version", b"3\n")])


DATA_PKL_NAMES = ("DATA.PKL", "Data.pkl")


@pytest.mark.parametrize("name", DATA_PKL_NAMES)
def test_torch_load_finds_data_pkl_in_any_case(oracle: dict[str, tuple[bytes, Outcome]],
                                               name: str) -> None:
    fired, data = fires(oracle, f"data-pkl-{name}", TORCH_LOAD_UNSAFE)
    assert fired
    result = not_passed(data)
    assert result is not None and result.format == "zip"
    found = [f for f in result.findings if f.qualname == "__builtin__.open"]
    assert found and all(f.loaders == (TORCH_LOAD_UNSAFE, TORCH_LOAD) for f in found)


def _constants_pkl_renamed(scripted: bytes, path: str) -> bytes:
    return remap(scripted, lambda n, v: (n.replace("constants.pkl", "Constants.pkl"),
                                         payload(path) if n.endswith("/data.pkl") else v))


def test_constants_pkl_in_another_case_is_a_pickle_to_torch_load(
        oracle: dict[str, tuple[bytes, Outcome]]) -> None:
    """torch.load tests ``constants.pkl`` exactly: ``Constants.pkl`` is no TorchScript to it,
    and its full unpickler runs data.pkl; torch.jit.load finds it and reads TorchScript."""
    fired, data = fires(oracle, "constants-pkl", TORCH_LOAD_UNSAFE)
    assert fired
    result = not_passed(data)
    assert result is not None
    assert any(f.name == "ambiguous-kind" for f in result.findings)
    with pytest.raises(ptfile.FormatError, match="differs in case"):
        ptfile.load(data)


def test_a_data_pkl_no_loader_finds_is_at_most_unknown(saved: bytes) -> None:
    evil = pickle.dumps(_System(), protocol=2)
    where = "archive/sub/data.pkl"
    result = ptfile.scan(remap(saved, lambda n, v: (n, v), [(where, evil)]))
    found = [f for f in result.findings if f.location == where and f.kind == "global"]
    assert found and all(f.verdict is Verdict.UNKNOWN and not f.loaders for f in found)
    assert result.verdict is Verdict.UNKNOWN


def test_a_bytecode_pkl_is_read_by_the_lite_interpreter(saved: bytes) -> None:
    # _load_for_lite_interpreter unpickles bytecode.pkl (tests/scanning/test_scan_lite.py)
    evil = pickle.dumps(_System(), protocol=2)
    where = "archive/bytecode.pkl"
    result = ptfile.scan(remap(saved, lambda n, v: (n, v), [(where, evil)]))
    found = [f for f in result.findings if f.location == where and f.kind == "global"]
    assert found and all(f.verdict is Verdict.DANGEROUS and f.loaders == (LITE_LOAD,)
                         for f in found)


class _System:
    def __reduce__(self) -> tuple[object, ...]:
        import os
        return (os.system, ("true",))


# ------------------------------------------------------------------ torch.jit.load

def _load_jit(data: bytes) -> str:
    try:
        torch.jit.load(io.BytesIO(data))
    except RuntimeError as exc:
        return type(exc).__name__
    return "loaded"


def test_jit_load_compiles_code_records_in_any_case(scripted: bytes) -> None:
    upper = remap(scripted, lambda n, v: (n.split("/", 1)[0] + "/" + n.split("/", 1)[1].upper(), v))
    assert _load_jit(upper) == "loaded"  # every record found ignoring case
    broken = remap(scripted, lambda n, v: (n.replace("/code/", "/CODE/").replace(".py", ".PY"),
                                           v + b"\n)(" if n.endswith(".py") else v))
    assert _load_jit(broken) == "RuntimeError"  # CODE/__TORCH__.PY is what it compiles
    result = ptfile.scan(upper)
    code = [f for f in result.findings if f.kind == "torchscript-code"]
    assert code and all(JIT_LOAD in f.loaders for f in code)
    assert result.format == "torchscript"
    assert not any(f.kind == "global" and f.module.startswith("__torch__") for f in result.findings)


def test_jit_load_reads_records_under_a_folder_in_another_case(scripted: bytes) -> None:
    """The folder is the first name's; lookups fold its case too (torch.load then refuses the
    archive: get_all_records is exact)."""
    changed = remap(scripted, lambda n, v: (n if n.endswith("/data/0") else
                                            "ARCHIVE/" + n.split("/", 1)[1], v))
    assert members(changed)[0][0] == "archive/data/0"
    assert _load_jit(changed) == "loaded"
    result = ptfile.scan(changed)
    assert any(f.kind == "torchscript-code" and f.location.startswith("ARCHIVE/code/")
               and f.loaders == (JIT_LOAD,) for f in result.findings)


# ------------------------------------------------------------------ torch.export.load

def _config(change: Callable[[dict[str, dict[str, object]]], None]) -> Callable[[str, bytes], tuple[str, bytes]]:
    def go(name: str, value: bytes) -> tuple[str, bytes]:
        if name.endswith(("_weights_config.json", "_constants_config.json")):
            doc = json.loads(value)
            change(doc["config"]) if name.endswith("_weights_config.json") else None
            return name, json.dumps(doc).encode()
        return name, value
    return go


def _pickled_weight(path_name: str, record: str, *, use_pickle: object = True,
                    whole: bool = True) -> Callable[[bytes, str], bytes]:
    def build(exported: bytes, path: str) -> bytes:
        def change(config: dict[str, dict[str, object]]) -> None:
            meta = config["lin.weight"]
            meta.update(path_name=path_name, use_pickle=use_pickle, tensor_meta=None)
        body = checkpoint(payload(path)) if whole else payload(path)
        return remap(exported, _config(change), [(record, body)])
    return build


def _constant(path_name: str, record: str, body: Callable[[str], bytes],
              use_pickle: object = True) -> Callable[[bytes, str], bytes]:
    def build(exported: bytes, path: str) -> bytes:
        def go(name: str, value: bytes) -> tuple[str, bytes]:
            if name.endswith("_constants_config.json"):
                doc = json.loads(value)
                doc["config"]["evil"] = {"path_name": path_name, "is_param": False,
                                         "use_pickle": use_pickle, "tensor_meta": None}
                return name, json.dumps(doc).encode()
            return name, value
        return remap(exported, go, [(record, body(path))])
    return build


def _old_format_behind(exported: bytes, path: str) -> bytes:
    """A .pt2 with top-level records: get_all_records raises, load_pt2's RuntimeError sends
    torch.export.load to the torch 2.7 format, read by zipfile (exact names, no folder)."""
    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize
    art = serialize(torch.export.export(_Lin(), (torch.ones(1, 2),)))
    return remap(exported, lambda n, v: (n, v), [
        ("version", ".".join(map(str, SCHEMA_VERSION)).encode()),
        ("serialized_exported_program.json", art.exported_program),
        ("serialized_state_dict.pt", checkpoint(payload(path))),
        ("serialized_constants.pt", art.constants),
        ("serialized_example_inputs.pt", art.example_inputs)])


EXPORT_CASES: dict[str, Callable[[bytes, str], bytes]] = {
    "use-pickle-weight-in-a-subfolder": _pickled_weight("sub/dir/w", "archive/data/weights/sub/dir/w"),
    "use-pickle-weight-named-in-another-case": _pickled_weight("Weight_X", "archive/DATA/WEIGHTS/weight_x"),
    "use-pickle-weight-a-bare-pickle": _pickled_weight("w", "archive/data/weights/w", whole=False),
    "use-pickle-weight-dotdot": _pickled_weight("../elsewhere", "archive/data/weights/../elsewhere"),
    "use-pickle-truthy-string": _pickled_weight("w", "archive/data/weights/w", use_pickle="no"),
    "opaque-object-in-a-subfolder": _constant("opaque_obj_0/x", "archive/data/constants/opaque_obj_0/x",
                                              payload),
    "opaque-object-in-another-case": _constant("opaque_obj_Q", "archive/Data/Constants/OPAQUE_OBJ_q",
                                               payload),
    "tensor-constant-use-pickle-1": _constant("tensor_9", "archive/data/constants/tensor_9",
                                              lambda p: checkpoint(payload(p)), use_pickle=1),
    "sample-inputs-in-another-case": lambda exported, path: remap(exported, lambda n, v: (
        n.replace("sample_inputs", "SAMPLE_INPUTS"),
        checkpoint(payload(path)) if "sample_inputs" in n else v)),
    "marker-in-another-case": lambda exported, path: remap(
        _pickled_weight("w", "archive/data/weights/w")(exported, path),
        lambda n, v: (n.replace("archive_format", "Archive_Format"), v)),
    "old-format-behind-a-pt2": _old_format_behind,
}


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_export_load_reads_what_its_configs_name(oracle: dict[str, tuple[bytes, Outcome]],
                                                 case: str) -> None:
    fired, data = fires(oracle, f"export-{case}", EXPORT_LOAD)
    assert fired, case
    result = not_passed(data)
    assert result is not None
    found = [f for f in result.findings if f.qualname == "__builtin__.open"]
    assert found and all(EXPORT_LOAD in f.loaders for f in found), found
    assert result.format == "pt2"


def test_an_unreadable_config_makes_every_record_a_possible_pickle(exported: bytes) -> None:
    evil = checkpoint(pickle.dumps(_System(), protocol=2))
    # weight_0's bytes start with an opcode the unpickler stops at (APPENDS with no MARK):
    # raw tensor bytes that fail at once are data, whatever their first byte (random
    # weights made this test pass or fail by chance before).
    data = remap(exported, lambda n, v: (n, b"{not json" if n.endswith("_weights_config.json")
                                         else b"e" + bytes(len(v) - 1) if n.endswith("/weight_0")
                                         else v), [("archive/data/weights/anything", evil)])
    result = ptfile.scan(data)
    assert any(f.name == UNREADABLE_CONFIG and f.verdict is Verdict.UNKNOWN
               for f in result.findings)
    assert result.is_dangerous
    # Raw tensor bytes are data, not findings.
    assert not any("weight_0" in f.location for f in result.findings)


def test_a_raw_weight_no_config_marks_is_not_scanned(exported: bytes) -> None:
    """Records the config reads as raw bytes (use_pickle false) are data, whatever they hold."""
    evil = checkpoint(pickle.dumps(_System(), protocol=2))
    data = remap(exported, lambda n, v: (n, evil if n.endswith("/weight_0") else v))
    assert ptfile.scan(data).verdict is Verdict.ALLOWED


def test_a_pt2_that_is_also_a_pickle_checkpoint_is_refused(exported: bytes, saved: bytes) -> None:
    """torch.load reads its data.pkl, torch.export.load its program: ptfile.load refuses it
    (one reading), and scan reports the ambiguity while scanning both."""
    data = remap(exported, lambda n, v: (n, v), [("archive/data.pkl", members(saved)[0][1])])
    assert members(saved)[0][0].endswith("/data.pkl")
    with pytest.raises(ptfile.FormatError, match=r"both a torch\.export program"):
        ptfile.load(data)
    with pytest.raises(ptfile.FormatError):
        ptfile.detect_format(io.BytesIO(data))
    result = ptfile.scan(data)
    assert result.format == "pt2" and not result.is_clean
    assert any(f.name == "ambiguous-kind" for f in result.findings)
    loaders = {x for f in result.findings for x in f.loaders}
    assert {TORCH_LOAD, EXPORT_LOAD} <= loaders
