"""Numpy values as data (issue 25 item 5): ``ptfile.NUMPY_GLOBALS`` against real torch.

Checkpoints are written by torch the way training code writes them (Hugging Face
Trainer's ``rng_state.pth``, a Lightning-style checkpoint, a DCP item from
``np.random.get_state()``) and read three ways: ptfile inside
``ptfile.safe_globals(ptfile.NUMPY_GLOBALS)``, torch with ``weights_only=True`` inside
``torch.serialization.safe_globals`` of exactly the names torch asks for, and torch with
``weights_only=False``.  Hostile pickles must end in a ptfile error, and numpy's own
pickle code must never run.
"""

from __future__ import annotations

import io
import pickle
import random
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import ptfile
from numpy_oracle import assert_same, ptfile_load, torch_asks, torch_loads
from ptfile.allowlist import numpy_globals
from ptfile.formats import policies
from ptfile.picklevm.deferred import substitute
from ptfile.picklevm.unpickler import unpickle

_reconstruct = np._core.multiarray._reconstruct  # type: ignore[attr-defined]
_scalar = np._core.multiarray.scalar  # type: ignore[attr-defined]


# -- helpers -------------------------------------------------------------------------------
def check_against_torch(path: Path, **options: Any) -> Any:
    restricted, unrestricted = torch_loads(path)
    loaded = ptfile_load(path, **options)
    assert_same(loaded, restricted)
    assert_same(loaded, unrestricted)
    return loaded


def save(tmp_path: Path, obj: object, name: str = "x.pth") -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


# -- training checkpoints --------------------------------------------------------------------
def trainer_rng_state() -> dict[str, Any]:
    """What transformers' Trainer._save_rng_state saves (CPU only)."""
    random.seed(1)
    np.random.seed(2)
    np.random.standard_normal()  # has_gauss=1, a cached gaussian
    torch.manual_seed(3)
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state()}


def test_trainer_rng_state_matches_torch(tmp_path: Path) -> None:
    path = save(tmp_path, trainer_rng_state(), "rng_state.pth")
    assert torch_asks(path) == ["numpy._core.multiarray._reconstruct", "numpy.ndarray",
                                "numpy.dtype", "numpy.dtypes.UInt32DType"]
    loaded = check_against_torch(path)
    kind, keys, _, has_gauss, _ = loaded["numpy"]
    assert (kind, keys.dtype, keys.shape, has_gauss) == ("MT19937", np.uint32, (624,), 1)
    restored = np.random.RandomState()
    restored.set_state(loaded["numpy"])
    np.random.set_state(trainer_rng_state()["numpy"])
    assert restored.standard_normal() == np.random.standard_normal()
    random.setstate(loaded["python"])  # the Python state is plain data already


def test_rng_state_refused_without_numpy_globals(tmp_path: Path) -> None:
    path = save(tmp_path, trainer_rng_state(), "rng_state.pth")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    with pytest.raises(ptfile.UnsafeGlobalError, match=r"ptfile\.NUMPY_GLOBALS") as info:
        ptfile.load(path)
    assert (info.value.module, info.value.name) == ("numpy._core.multiarray", "_reconstruct")
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.open(path).object  # noqa: B018 - reading it is the point


def test_lightning_style_checkpoint_matches_torch(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    checkpoint = {
        "epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.5.0",
        "state_dict": model.state_dict(),
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4}}}},
        "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {
            "best_model_score": torch.tensor(0.25), "best_k_models": {},
            "best_model_path": "epoch=2.ckpt"}},
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": np.float64(1e-3), "dropout": np.float32(0.1),
                             "layers": np.array([64, 32], np.int64), "amp": np.bool_(True),
                             "mean": np.array([0.485, 0.456, 0.406]), "name": np.str_("resnet")},
    }
    path = save(tmp_path, checkpoint, "epoch=2.ckpt")
    asked = torch_asks(path)
    assert {"numpy._core.multiarray._reconstruct", "numpy._core.multiarray.scalar",
            "numpy.ndarray", "numpy.dtype", "numpy.dtypes.Float64DType"} <= set(asked)
    check_against_torch(path)


# -- arrays, scalars, dtypes ----------------------------------------------------------------
ARRAYS = {
    "bool": np.array([True, False, True]),
    "int8": np.arange(-3, 3, dtype=np.int8),
    "uint16": np.arange(5, dtype=np.uint16),
    "int64": np.arange(12, dtype=np.int64).reshape(3, 4),
    "float16": np.linspace(-1, 1, 7, dtype=np.float16),
    "float32-nan": np.array([1.5, np.nan, -np.inf], np.float32),
    "complex64": np.array([1 + 2j, -3j], np.complex64),
    "complex128": np.array([[1 + 2j], [3 - 4j]]),
    "longdouble": np.array([1.25, -2.5], np.longdouble),
    "big-endian-int32": np.arange(6, dtype=">i4").reshape(2, 3),
    "big-endian-float64": np.array([1.5, -2.25], ">f8"),
    "0-d": np.array(7.5),
    "fortran": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "fortran-big-endian": np.asfortranarray(np.arange(24, dtype=">u2").reshape(2, 3, 4)),
    "empty": np.zeros((0, 3), np.float32),
    "non-contiguous": np.arange(20, dtype=np.int16).reshape(4, 5)[::2, 1::2],
    "unicode": np.array(["ab", "cde"]),
    "bytes": np.array([b"x", b"yz"]),
    "datetime64": np.array(["2020-01-01T00:00", "2021-06-30T12:34"], "datetime64[ms]"),
    "timedelta64": np.array([1, 2], "timedelta64[15s]"),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_arrays_match_torch(tmp_path: Path, name: str) -> None:
    array = ARRAYS[name]
    loaded = check_against_torch(save(tmp_path, {"a": array}))
    np.testing.assert_array_equal(loaded["a"], array)
    if array.size == 0:  # protocol 2 pickles b"" as builtins.bytes(): torch asks for it
        assert "bytes" in torch_asks(save(tmp_path, {"a": array}))
    # big-endian comes back native, as numpy's own unpickling makes it
    assert loaded["a"].dtype == array.dtype.newbyteorder("=")


SCALARS = [np.float64(1.5), np.float32(np.nan), np.int32(-7), np.uint8(255), np.bool_(False),
           np.complex64(1 - 2j), np.float16(0.5), np.str_("tok"), np.bytes_(b"ab"),
           np.datetime64("2024-02-29", "D"), np.longdouble(2.5)]


@pytest.mark.parametrize("value", SCALARS, ids=lambda v: type(v).__name__)
def test_scalars_match_torch(tmp_path: Path, value: np.generic) -> None:
    loaded = check_against_torch(save(tmp_path, [value]))
    assert type(loaded[0]) is type(value)


@pytest.mark.parametrize("dtype", ["f8", ">i4", "b1", "<U3", "S4", "c16", "M8[ms]"])
def test_dtypes_match_torch(tmp_path: Path, dtype: str) -> None:
    loaded = check_against_torch(save(tmp_path, {"d": np.dtype(dtype)}))
    assert loaded["d"] == np.dtype(dtype) and loaded["d"].str == np.dtype(dtype).str


def datetime_dtype(descr: str, order: str, unit: bytes, count: int, absent: Any) -> Reduced:
    """A datetime dtype as numpy pickles it, its own (absent) metadata written as ``absent``."""
    return Reduced(np.dtype, (descr, False, True),
                   (4, order, None, None, None, -1, -1, 0, (absent, (unit, count, 1, 1))))


@pytest.mark.parametrize("absent", [None, {}], ids=["numpy-2.4", "numpy-1.x-2.2"])
def test_datetime_dtypes_of_every_numpy_match_torch(tmp_path: Path, absent: Any) -> None:
    """numpy 2.4 pickles a datetime dtype without metadata as ``(None, (unit, ...))``, numpy
    1.x to 2.2 as ``({}, (unit, ...))``: both read the same, whichever numpy runs."""
    deltas = np.array([1, -2], ">m8[15s]")
    day = np.datetime64("2024-02-29", "D")
    value = {"dtype": datetime_dtype("M8", "<", b"ms", 1, absent),
             "array": array_state((2,), datetime_dtype("m8", ">", b"s", 15, absent),
                                  deltas.tobytes()),
             "scalar": Reduced(_scalar, (datetime_dtype("M8", "<", b"D", 1, absent),
                                         day.tobytes()))}
    loaded = check_against_torch(save(tmp_path, value))
    assert loaded["dtype"] == np.dtype("M8[ms]") and loaded["dtype"].metadata is None
    np.testing.assert_array_equal(loaded["array"], deltas)
    assert loaded["array"].dtype.str == "<m8[15s]"
    assert type(loaded["scalar"]) is np.datetime64 and loaded["scalar"] == day


def test_shared_array_stays_shared(tmp_path: Path) -> None:
    array = np.arange(4.0)
    path = save(tmp_path, {"a": array, "b": array, "t": (array, [array])})
    loaded = ptfile_load(path)
    assert loaded["a"] is loaded["b"] is loaded["t"][0] is loaded["t"][1][0]
    restricted, _ = torch_loads(path)
    assert restricted["a"] is restricted["b"]


def test_numpy_beside_tensors_and_ordered_dicts(tmp_path: Path) -> None:
    state = OrderedDict(w=torch.ones(2, 2), rng=np.random.get_state())
    state._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    loaded = check_against_torch(save(tmp_path, {"sd": state}))
    assert loaded["sd"]._metadata == {"": {"version": 1}}


def test_legacy_format_and_numpy_1_names(tmp_path: Path) -> None:
    """A legacy (non-ZIP) file, and numpy 1.x's ``numpy.core`` names."""
    value = {"numpy": np.random.get_state(), "s": np.float32(2.5)}
    buffer = io.BytesIO()
    torch.save(value, buffer, _use_new_zipfile_serialization=False)
    old = buffer.getvalue().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"cnumpy.core.multiarray\n_reconstruct" in old
    for data in (buffer.getvalue(), old):
        assert_same(ptfile_load(io.BytesIO(data)), value)


def test_open_and_structural_take_numpy_globals(tmp_path: Path) -> None:
    path = save(tmp_path, {"w": torch.zeros(2), "rng": np.random.get_state()})
    expected = torch.load(path, weights_only=False)
    with ptfile.safe_globals(ptfile.NUMPY_GLOBALS):
        with ptfile.open(path) as reader:
            assert_same(reader.object["rng"], expected["rng"])
        assert_same(ptfile.load(path, structural=True)["rng"], expected["rng"])
    stand_in = ptfile.load(path, structural=True)["rng"][1]  # no numpy globals: inert
    assert isinstance(stand_in, ptfile.StandIn) and stand_in.name == "_reconstruct"


# -- DCP ---------------------------------------------------------------------------------------
@pytest.fixture
def dcp_checkpoint(tmp_path: Path) -> tuple[Path, Any]:
    np.random.seed(5)
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "rng": np.random.get_state(),
             "extra": {"step": 7, "scale": np.float32(0.5)}}
    directory = tmp_path / "ckpt"
    dcp.save(state, checkpoint_id=directory)
    dcp_to_torch_save(directory, tmp_path / "whole.pt")
    return directory, torch.load(tmp_path / "whole.pt", weights_only=False)


def test_dcp_numpy_item_matches_torch(dcp_checkpoint: tuple[Path, Any]) -> None:
    directory, expected = dcp_checkpoint
    # torch's DCP loader reads non-tensor items with weights_only=False: so does ptfile,
    # with NUMPY_GLOBALS' inert rebuilders, unless weights_only=True is asked for
    assert_same(ptfile.load_dcp(directory), expected)
    with pytest.raises(ptfile.UnsafeGlobalError, match=r"NUMPY_GLOBALS"):
        ptfile.load_dcp(directory, weights_only=True)
    with ptfile.safe_globals(ptfile.NUMPY_GLOBALS):
        assert_same(ptfile.load_dcp(directory), expected)
        with ptfile.open(directory) as reader:
            assert_same(reader.value("rng"), expected["rng"])
            assert list(reader.check()) == []


def test_dcp_weights_only_and_structural(dcp_checkpoint: tuple[Path, Any]) -> None:
    directory, expected = dcp_checkpoint
    for options in ({"structural": True}, {"weights_only": False}):
        loaded = ptfile.load_dcp(directory, **options)
        assert_same(loaded, expected)  # numpy values as data, as torch's DCP loader reads them
        with ptfile.open(directory, **options) as reader:
            assert_same(reader.value("rng"), expected["rng"])
    loaded = ptfile.load_dcp(directory, weights_only=True, structural=True)
    assert isinstance(loaded["rng"][1], ptfile.StandIn)  # weights-only: no numpy, stand-ins
    assert_same(loaded["model"], expected["model"])
    with ptfile.open(directory, weights_only=True) as reader, \
            pytest.raises(ptfile.UnsafeGlobalError):
        reader.value("rng")


def test_dcp_force_weights_only(dcp_checkpoint: tuple[Path, Any],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load_dcp(dcp_checkpoint[0], weights_only=False)


# -- numpy's pickle code never runs ----------------------------------------------------------
def test_numpy_pickle_code_never_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save(tmp_path, {"rng": np.random.get_state(), "s": np.float64(1.0),
                           "d": np.dtype(">i2"), "f": ARRAYS["fortran-big-endian"]})
    expected = torch.load(path, weights_only=False)

    def refuse(*args: object) -> None:
        raise AssertionError("numpy's pickle code ran")

    for name in ("_reconstruct", "scalar"):  # numpy.core.multiarray forwards to these
        monkeypatch.setattr(f"numpy._core.multiarray.{name}", refuse)
    built: list[object] = []
    for cls in (numpy_globals._ArrayState, numpy_globals._DTypeState):
        original = cls.__setstate__

        def spy(self: Any, state: Any, original: Any = original) -> None:
            built.append(type(self))
            original(self, state)

        monkeypatch.setattr(cls, "__setstate__", spy)
    assert_same(ptfile_load(path), expected)
    # Every BUILD went to ptfile's placeholders: 2 arrays and 4 dtypes, nothing else.
    assert sorted(c.__name__ for c in built) == ["_ArrayState"] * 2 + ["_DTypeState"] * 4


# -- hostile pickles ---------------------------------------------------------------------------
class Reduced:
    """Pickles as ``func(*args)`` then ``BUILD state`` (None: no BUILD)."""

    def __init__(self, func: Any, args: tuple[Any, ...], state: Any = None) -> None:
        self.value = (func, args) if state is None else (func, args, state)

    def __reduce__(self) -> Any:
        return self.value


def array_state(shape: Any, dtype: Any = None, data: Any = b"", fortran: Any = False,
                version: Any = 1) -> Reduced:
    return Reduced(_reconstruct, (np.ndarray, (0,), b"b"),
                   (version, shape, np.dtype("f8") if dtype is None else dtype, fortran, data))


HOSTILE = {
    "object-dtype": (np.array([1, "a", None], dtype=object), ptfile.UnsafeGlobalError),
    "object-scalar-dtype": (np.dtype(object), ptfile.UnsafeGlobalError),
    "structured": (np.zeros(2, [("a", "<i4"), ("b", "<f8")]), ptfile.UnsupportedFeatureError),
    "subarray-dtype": (np.dtype(("<i4", (2,))), ptfile.UnsupportedFeatureError),
    "void": (np.zeros(2, "V3"), ptfile.UnsupportedFeatureError),
    "bytes-short": (array_state((4,), data=b"\0" * 31), ptfile.StorageError),
    "bytes-long": (array_state((4,), data=b"\0" * 33), ptfile.StorageError),
    "huge-shape": (array_state((2**40, 2**20), data=b"\0" * 8), ptfile.StorageError),
    "huge-zero-size": (array_state((0, 2**62, 2**62)), ptfile.StorageError),
    "negative-dim": (array_state((-1,)), ptfile.PickleStreamError),
    "float-dim": (array_state((2.0,), data=b"\0" * 16), ptfile.PickleStreamError),
    "too-many-dims": (array_state((1,) * 65, data=b"\0" * 8), ptfile.LimitExceededError),
    "version-2": (array_state((1,), data=b"\0" * 8, version=2), ptfile.PickleStreamError),
    "data-as-list": (array_state((1,), data=[1.0]), ptfile.PickleStreamError),
    "fortran-not-bool": (array_state((1,), data=b"\0" * 8, fortran=1), ptfile.PickleStreamError),
    "dtype-as-str": (array_state((1,), dtype="f8", data=b"\0" * 8), ptfile.PickleStreamError),
    "no-build": (Reduced(_reconstruct, (np.ndarray, (0,), b"b")), ptfile.FormatError),
    "other-subtype": (Reduced(_reconstruct, (np.dtype, (0,), b"b")), ptfile.PickleStreamError),
    "other-shape": (Reduced(_reconstruct, (np.ndarray, (5,), b"b")), ptfile.PickleStreamError),
    "scalar-short": (Reduced(_scalar, (np.dtype("f8"), b"\0" * 4)), ptfile.StorageError),
    "scalar-object": (Reduced(_scalar, (np.dtype("f8"), [1])), ptfile.PickleStreamError),
    "dtype-bad-descr": (Reduced(np.dtype, ("x9", False, True)), ptfile.UnsupportedFeatureError),
    "dtype-not-str": (Reduced(np.dtype, (9, False, True)), ptfile.PickleStreamError),
    "dtype-odd-size": (Reduced(np.dtype, ("i3", False, True)), ptfile.UnsupportedFeatureError),
    "dtype-bad-order": (Reduced(np.dtype, ("i4", False, True), (3, "!", None, None, None, -1,
                                                                -1, 0)),
                        ptfile.PickleStreamError),
    "dtype-bad-unit": (Reduced(np.dtype, ("M8", False, True),
                               (4, "<", None, None, None, -1, -1, 0, (None, (b"zz", 1, 1, 1)))),
                       ptfile.PickleStreamError),
    "dtype-metadata": (np.dtype("f8", metadata={"k": 1}), ptfile.UnsupportedFeatureError),
    "datetime-metadata": (np.dtype("M8[ms]", metadata={"k": 1}),
                          ptfile.UnsupportedFeatureError),
    "datetime-metadata-list": (Reduced(np.dtype, ("M8", False, True),
                                       (4, "<", None, None, None, -1, -1, 0,
                                        ([], (b"ms", 1, 1, 1)))),
                               ptfile.PickleStreamError),
    "huge-string-dtype": (Reduced(np.dtype, ("U999999999999", False, True)),
                          ptfile.UnsupportedFeatureError),
    "build-on-global": (Reduced(np.dtype, ("f8", False, True)), None),  # control: loads
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_numpy_pickles_raise_ptfile_errors(tmp_path: Path, name: str) -> None:
    value, error = HOSTILE[name]
    path = save(tmp_path, {"x": value})
    if error is None:
        assert ptfile_load(path)["x"] == np.dtype("f8")
        return
    with pytest.raises(error):
        ptfile_load(path)
    try:  # structural: a call ptfile refuses becomes an inert stand-in, or an error
        loaded = ptfile_load(path, structural=True)
    except ptfile.PtfileError:
        return
    assert not isinstance(loaded["x"], (np.ndarray, np.generic))


def test_build_on_allowlisted_numpy_globals_refused() -> None:
    """``BUILD`` on the shared rebuilders (``GLOBAL numpy dtype; {} BUILD``) never mutates
    them; the ndarray marker cannot be called or built on either."""
    find = policies.strict()
    with ptfile.safe_globals(ptfile.NUMPY_GLOBALS):
        for stream in (b"\x80\x02cnumpy\ndtype\n}b.", b"\x80\x02cnumpy\nndarray\n}b.",
                       b"\x80\x02cnumpy\nndarray\n)R."):
            with pytest.raises(ptfile.PtfileError):
                unpickle(stream, find_class=find, persistent_load=None)
        value, _ = unpickle(b"\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00f8\x89\x88\x87R.",
                            find_class=find, persistent_load=None)
    assert value == np.dtype("f8")  # a dtype without BUILD: native order
    assert ptfile.NUMPY_GLOBALS["numpy.ndarray"] is numpy_globals.NDARRAY
    with pytest.raises(TypeError):
        ptfile.NUMPY_GLOBALS["numpy.ndarray"] = None  # type: ignore[index]


# -- the substitution walk ---------------------------------------------------------------------
class Later:
    def __init__(self, value: object) -> None:
        self.value = value

    def finish(self) -> object:
        return self.value


def test_substitute_everywhere_and_deep() -> None:
    p = Later(np.arange(2))
    root: Any = [p]
    for _ in range(100_000):
        root = (root,)
    out = substitute(root, [p])
    for _ in range(100_000):
        out = out[0]
    assert out[0] is p.value
    q = Later("q")
    table = {q: (q, frozenset({q})), "s": {q}}
    swapped = substitute(table, [q])
    assert swapped == {"q": ("q", frozenset({"q"})), "s": {"q"}}
    cyclic: list[Any] = [q]
    cyclic.append(cyclic)
    assert substitute(cyclic, [q])[0] == "q"



def test_substitute_enters_a_tensors_python_state_only() -> None:
    """A tensor's hooks, metadata and Python state are entered (not its storage)."""
    buffer = io.BytesIO()
    ptfile.save({"t": np.ones(2, np.float32)}, buffer)
    tensor = ptfile.load(io.BytesIO(buffer.getvalue()))["t"]
    p = Later(np.arange(3))
    tensor.python_state = {"extra": p}
    assert substitute([tensor], [p])[0].python_state["extra"] is p.value
