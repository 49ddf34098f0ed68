"""``get_unsafe_globals_in_checkpoint`` names globals as torch does (issue 23).

torch's function translates Python 2 names (``torch._utils``' part of ``_compat_pickle``)
before it compares them with its allowlist and returns them; the scanner judges a Python 2
name as CPython imports it too.
"""

from __future__ import annotations

import argparse
import collections
import io

import pytest

import ptfile
from hostile import with_data_pkl
from ptfile.scanning.verdicts import Verdict

torch = pytest.importorskip("torch")


def _with_data_pkl(pickled: bytes) -> bytes:
    """A ``torch.save`` archive whose ``data.pkl`` is ``pickled``."""
    buf = io.BytesIO()
    torch.save({}, buf)
    return with_data_pkl(buf.getvalue(), pickled)


def _glob(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


#: A protocol-2 pickle naming Python 2 globals: a list of them.
PY2 = (b"\x80\x02](" + _glob("__builtin__", "long") + _glob("copy_reg", "_reconstructor")
       + _glob("__builtin__", "set") + _glob("__builtin__", "unicode")
       + _glob("UserDict", "UserDict") + _glob("cPickle", "loads")
       + _glob("itertools", "izip") + b"e.")


def _torch(data: bytes) -> list[str]:
    return torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))


def test_python2_names_are_translated_as_torch_translates_them() -> None:
    data = _with_data_pkl(PY2)
    expected = _torch(data)
    assert "builtins.int" in expected and "copyreg._reconstructor" in expected
    assert sorted(ptfile.get_unsafe_globals_in_checkpoint(data)) == sorted(expected)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.act = torch.nn.GELU()


def _saved(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.parametrize("make", [
    lambda: _Net(),
    lambda: {"state_dict": {"w": torch.zeros(2)}, "epoch": 3, "global_step": 10,
             "hyper_parameters": {"args": argparse.Namespace(lr=0.1, name="x")},
             "callbacks": {"ModelCheckpoint{'monitor': None}": {
                 "best_model_path": "", "best_k_models": collections.OrderedDict()}},
             "loops": collections.defaultdict(list)},
], ids=["whole-module", "lightning"])
def test_torch_written_files_list_what_torch_lists(make: object) -> None:
    data = _saved(make())  # type: ignore[operator]
    assert sorted(ptfile.get_unsafe_globals_in_checkpoint(data)) == sorted(_torch(data))


def test_legacy_file() -> None:
    """torch's function refuses a legacy file; ptfile lists its pickles' unsafe names,
    translated as torch's load translates them."""
    buf = io.BytesIO()
    torch.save({"a": torch.zeros(2), "n": argparse.Namespace(x=1)}, buf,
               _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match=r"checkpoint returned by torch\.save"):
        _torch(buf.getvalue())
    assert ptfile.get_unsafe_globals_in_checkpoint(buf.getvalue()) == ["argparse.Namespace"]


@pytest.mark.parametrize(("module", "name", "verdict"), [
    ("__builtin__", "eval", Verdict.DANGEROUS),
    ("__builtin__", "reduce", Verdict.DANGEROUS),     # functools.reduce
    ("commands", "getoutput", Verdict.DANGEROUS),     # subprocess.getoutput
    ("copy_reg", "_reconstructor", Verdict.UNKNOWN),  # copyreg._reconstructor
    ("__builtin__", "set", Verdict.ALLOWED),
])
def test_scan_judges_python2_names_as_translated(module: str, name: str,
                                                 verdict: Verdict) -> None:
    data = b"\x80\x02" + _glob(module, name) + b"."
    [finding] = [f for f in ptfile.scan(data).findings if f.kind == "global"]
    assert finding.verdict is verdict
