"""Properties against real torch, on random objects torch writes.

The objects mix what state dicts and training checkpoints hold (tensors of every
common dtype, views sharing storages, Parameters, ints, strs, lists, nested dicts,
OrderedDicts) in random numbers, so memo indices, SETITEMS batches and storage
keys fall everywhere ptfile's inline writers have a boundary.  For them:
ptfile's resaves are byte-identical to torch's (plain, ``skip_data``, every save
option, from the legacy format); every way of loading equals ``torch.load``;
``ptfile.open`` agrees with ``ptfile.load`` and ``get_slice`` with numpy
indexing; safetensors conversion keeps every tensor; damaged copies load or
raise a PtfileError.  TorchScript archives of random modules load as
``torch.jit.load``'s state dict.  The suite runs a few dozen examples of each;
the commit messages say how many thousands passed when each was added.
"""

from __future__ import annotations

import collections
import contextlib
import io
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import ptfile
from oracle import assert_same, assert_sharing, ptfile_bytes, torch_bytes

torch = pytest.importorskip("torch")

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8,
           torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn]


@st.composite
def _tensor(draw: st.DrawFn, bases: list[Any]) -> Any:
    base = draw(st.sampled_from(bases))
    kind = draw(st.sampled_from(["whole", "slice", "step", "matrix", "fresh", "param"]))
    if kind == "slice":
        start = draw(st.integers(0, len(base)))
        return base[start:draw(st.integers(start, len(base)))]
    if kind == "step":
        return base[::draw(st.integers(1, 3))]
    if kind == "matrix" and len(base) % 2 == 0 and len(base):
        matrix = base.view(2, -1)
        return matrix.t() if draw(st.booleans()) else matrix
    if kind == "fresh":
        return torch.ones(draw(st.lists(st.integers(0, 3), max_size=3)),
                          dtype=draw(st.sampled_from(_DTYPES)))
    if kind == "param":
        return torch.nn.Parameter(base.clone().float(), requires_grad=draw(st.booleans()))
    return base


@st.composite
def torch_objects(draw: st.DrawFn) -> Any:
    """A dict (or OrderedDict) of tensors and plain values, some nested."""
    # Bases are not empty: torch.load gives the tensors that share an empty storage
    # one storage each, so its resave has a record more than the file (ptfile keeps
    # the sharing, and its resave is the original file).
    bases = [torch.arange(draw(st.integers(1, 12))).to(draw(st.sampled_from(_DTYPES)))
             for _ in range(draw(st.integers(1, 4)))]
    kind = draw(st.sampled_from([dict, collections.OrderedDict]))
    out = kind()
    for i in range(draw(st.integers(0, 70))):
        key = draw(st.sampled_from([f"layer.{i}.weight", f"k{i}"]) | st.text(max_size=4))
        value = draw(st.sampled_from(["tensor", "tensor", "tensor", "int", "str", "list",
                                      "none", "nested"]))
        if value == "tensor":
            out[key] = draw(_tensor(bases))
        elif value == "int":
            out[key] = draw(st.integers(-(2**40), 2**40))
        elif value == "str":
            out[key] = draw(st.sampled_from(["cpu", "storage", "0", "x"]) | st.text(max_size=3))
        elif value == "list":
            out[key] = [draw(_tensor(bases)) for _ in range(draw(st.integers(0, 3)))]
        elif value == "nested":
            out[key] = {"w": draw(_tensor(bases)), "step": i}
        else:
            out[key] = None
    return out


def _torch_load(raw: bytes) -> Any:
    return torch.load(io.BytesIO(raw), weights_only=True)


@contextlib.contextmanager
def _on_disk(raw: bytes) -> Iterator[Path]:
    """``raw`` as a file, for the loads that take a path (a map)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ckpt.pt"
        path.write_bytes(raw)
        yield path


@settings(max_examples=60, deadline=None)
@given(torch_objects())
def test_resave_of_random_torch_objects_is_byte_identical(obj: Any) -> None:
    # The oracle is torch's own resave of what it loaded: the pickle memoises by
    # identity, and a loaded "cpu" value is no longer torch's interned location
    # literal, so both write it out again where the original has a GET.
    raw = torch_bytes(obj)
    assert ptfile_bytes(ptfile.load(io.BytesIO(raw))) == torch_bytes(_torch_load(raw))


@settings(max_examples=40, deadline=None)
@given(torch_objects(), st.sampled_from([4, 5]))
def test_resave_of_random_torch_objects_at_protocols_4_and_5_is_byte_identical(
        obj: Any, protocol: int) -> None:
    # Files torch wrote with protocol 4 or 5 (framed, MEMOIZE, STACK_GLOBAL) load, and
    # ptfile's resave with that protocol is torch's.
    raw = torch_bytes(obj, pickle_protocol=protocol)
    loaded = ptfile.load(io.BytesIO(raw))
    expected = torch.load(io.BytesIO(raw), weights_only=False)  # weights_only knows no FRAME
    assert_same(loaded, expected)
    assert ptfile_bytes(loaded, pickle_protocol=protocol) == torch_bytes(
        expected, pickle_protocol=protocol)


def test_tensors_sharing_an_empty_storage_keep_sharing_it() -> None:
    base = torch.arange(0).float()
    raw = torch_bytes({"a": base, "b": base[0:0], "c": base[::2]})
    loaded = ptfile.load(io.BytesIO(raw))
    assert loaded["a"].storage is loaded["b"].storage is loaded["c"].storage
    assert ptfile_bytes(loaded) == raw  # torch's own resave has one record per tensor


def _raw(array: Any) -> bytes:
    return np.ascontiguousarray(array).tobytes()


@settings(max_examples=40, deadline=None)
@given(torch_objects())
def test_open_agrees_with_load_on_random_torch_objects(obj: Any) -> None:
    # The metadata ptfile.open lists (its own fast paths) is that of the tensors
    # ptfile.load builds, and each data_offset points at the storage's bytes.
    raw = torch_bytes(obj)
    expected = ptfile.model.tree.flatten(ptfile.load(io.BytesIO(raw)))
    with _on_disk(raw) as path:
        for source in (path, io.BytesIO(raw)):
            with ptfile.open(source) as ck:
                assert sorted(ck.keys()) == sorted(expected)
                for info in ck.infos():
                    t = expected[info.name]
                    assert (info.dtype, info.shape, info.stride, info.storage_offset,
                            info.requires_grad) == (t.dtype, t.shape, t.stride(),
                                                    t.storage_offset(), t.requires_grad)
                    assert t.storage is not None and info.storage_key == t.storage.key
                    assert info.storage_nbytes == t.storage.nbytes
                    assert info.data_offset is not None
                    stored = raw[info.data_offset:info.data_offset + info.storage_nbytes]
                    assert stored == bytes(t.storage.data)
                    assert _raw(ck.get_tensor(info.name)) == _raw(t.numpy())


@settings(max_examples=40, deadline=None)
@given(torch_objects())
def test_load_equals_torch_load_on_random_torch_objects(obj: Any) -> None:
    # Every way of loading (the fast path from memory and from a map, the reference
    # path that map_location takes) gives torch.load's values, metadata and sharing.
    raw = torch_bytes(obj)
    expected = _torch_load(raw)
    with _on_disk(raw) as path:
        for loaded in (ptfile.load(io.BytesIO(raw)), ptfile.load(path, mmap=True),
                       ptfile.load(io.BytesIO(raw), map_location="cpu")):
            assert_same(loaded, expected)
            assert_sharing(loaded, expected)


@settings(max_examples=30, deadline=None)
@given(torch_objects())
def test_legacy_format_load_equals_torch_load(obj: Any) -> None:
    # The pre-1.6 pickle-stream format, written by torch for the same random objects;
    # resaved, it becomes what torch.save writes for what torch.load read.
    raw = torch_bytes(obj, _use_new_zipfile_serialization=False)
    try:
        expected = _torch_load(raw)
    except AttributeError:  # torch 2.13 cannot read the untyped (float8) storages it wrote
        expected = None
    loaded = ptfile.load(io.BytesIO(raw))
    assert_same(loaded, obj if expected is None else expected)
    assert_sharing(loaded, obj if expected is None else expected)
    if expected is not None:  # converted to the ZIP format, as torch converts it
        assert ptfile_bytes(loaded) == torch_bytes(expected)


@settings(max_examples=30, deadline=None)
@given(torch_objects())
def test_skip_data_save_of_random_torch_objects_is_byte_identical(obj: Any) -> None:
    # save(skip_data=True) writes torch's serialization.skip_data() layout: same records,
    # zero-filled payloads, CRC 0.  Both files get the same name (it names the archive).
    raw = torch_bytes(obj)
    with tempfile.TemporaryDirectory() as folder:
        ours, theirs = Path(folder) / "ptfile", Path(folder) / "torch"
        ours.mkdir()
        theirs.mkdir()
        with torch.serialization.skip_data():
            torch.save(_torch_load(raw), theirs / "ckpt.pt")
        ptfile.save(ptfile.load(io.BytesIO(raw)), ours / "ckpt.pt", skip_data=True)
        assert (ours / "ckpt.pt").read_bytes() == (theirs / "ckpt.pt").read_bytes()


@settings(max_examples=30, deadline=None)
@given(torch_objects(), st.booleans(), st.sampled_from([1, 8, 64, 4096]), st.booleans(),
       st.sampled_from([2, 3, 4, 5]))
def test_save_options_match_torch_on_random_objects(obj: Any, crc: bool, alignment: int,
                                                    no_byteorder: bool, protocol: int) -> None:
    # CRC on/off, storage alignment, the byteorder record and the pickle protocol, set
    # the torch way on one side and the ptfile way on the other: the same bytes.
    from torch.utils.serialization import config as torch_config

    raw = torch_bytes(obj)
    options = {"pickle_protocol": protocol, "_disable_byteorder_record": no_byteorder}
    default_alignment = torch_config.save.storage_alignment
    torch.serialization.set_crc32_options(crc)
    torch_config.save.storage_alignment = alignment
    try:
        expected = torch_bytes(_torch_load(raw), **options)
    finally:
        torch.serialization.set_crc32_options(True)
        torch_config.save.storage_alignment = default_alignment
    with ptfile.config.settings(crc32=crc, storage_alignment=alignment):
        assert ptfile_bytes(ptfile.load(io.BytesIO(raw)), **options) == expected


@st.composite
def _modules(draw: st.DrawFn) -> Any:
    """A small random nn.Sequential in one floating dtype."""
    layers: list[Any] = []
    width = draw(st.integers(1, 5))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["linear", "batchnorm", "layernorm", "relu", "embedding"]))
        if kind == "linear":
            out = draw(st.integers(1, 5))
            layers.append(torch.nn.Linear(width, out, bias=draw(st.booleans())))
            width = out
        elif kind == "batchnorm":
            layers.append(torch.nn.BatchNorm1d(width))
        elif kind == "layernorm":
            layers.append(torch.nn.LayerNorm(width))
        elif kind == "relu":
            layers.append(torch.nn.ReLU())
        else:
            layers.append(torch.nn.Embedding(draw(st.integers(1, 6)), width))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.float64, torch.bfloat16]))
    return torch.nn.Sequential(*layers).to(dtype)


@settings(max_examples=10, deadline=None)
@given(_modules())
def test_torchscript_state_dict_equals_torch_on_random_modules(module: Any) -> None:
    # ptfile.load of a torch.jit.save archive is its state dict, as torch.jit.load has it.
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    raw = buffer.getvalue()
    expected = torch.jit.load(io.BytesIO(raw)).state_dict()
    loaded = ptfile.load(io.BytesIO(raw))
    assert list(loaded) == list(expected)
    for name, value in expected.items():
        assert_same(loaded[name], value, name)


def _torch_flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Tensors of a torch-loaded tree by dotted name, as ptfile.model.tree.flatten names them."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    items = obj.items() if isinstance(obj, dict) else \
        enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(_torch_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _bytes_of(t: Any) -> Any:
    return torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1).view(torch.uint8)


@settings(max_examples=20, deadline=None)
@given(torch_objects())
def test_safetensors_conversion_of_random_torch_objects(obj: Any) -> None:
    # Every tensor (shared ones copied) reaches safetensors with its dtype, shape and bytes.
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from ptfile.export.convert import convert

    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "a.pt", Path(folder) / "a.safetensors"
        torch.save(obj, source)
        expected = _torch_flat(torch.load(source, weights_only=True))
        assume(sorted(expected) == sorted(ptfile.model.tree.flatten(ptfile.load(source))))
        convert(str(source), str(target), to="safetensors", shared="copy")
        got = safetensors_torch.load_file(target)
        assert sorted(got) == sorted(expected)
        for name, t in expected.items():
            assert (got[name].dtype, got[name].shape) == (t.dtype, t.shape), name
            assert torch.equal(_bytes_of(got[name]), _bytes_of(t)), name


@st.composite
def _basic_index(draw: st.DrawFn, ndim: int) -> tuple[Any, ...]:
    """A numpy basic index for ``ndim`` dimensions: ints, slices (negative steps too),
    None and at most one Ellipsis; out-of-range ints included."""
    parts: list[Any] = []
    for _ in range(draw(st.integers(0, ndim))):
        kind = draw(st.sampled_from(["int", "slice", "slice", "none"]))
        if kind == "int":
            parts.append(draw(st.integers(-4, 4)))
        elif kind == "none":
            parts.append(None)
        else:
            bound = st.none() | st.integers(-5, 5)
            parts.append(slice(draw(bound), draw(bound),
                               draw(st.none() | st.sampled_from([1, 2, 3, -1, -2]))))
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), Ellipsis)
    return tuple(parts)


@settings(max_examples=30, deadline=None)
@given(torch_objects(), st.data())
def test_get_slice_equals_numpy_indexing_on_random_objects(obj: Any, data: st.DataObject) -> None:
    # ptfile.open(...).get_slice(name)[index] reads what numpy's basic indexing selects.
    raw = torch_bytes(obj)
    loaded = ptfile.model.tree.flatten(ptfile.load(io.BytesIO(raw)))
    with ptfile.open(io.BytesIO(raw)) as ck:
        for name, tensor in loaded.items():
            array = tensor.numpy()
            index = data.draw(_basic_index(array.ndim))
            try:
                expected = array[index]
            except IndexError:
                with pytest.raises(IndexError):
                    ck.get_slice(name)[index]
                continue
            got = ck.get_slice(name)[index]
            assert (got.shape, got.dtype) == (expected.shape, expected.dtype), index
            assert _raw(got) == _raw(expected), (name, index)


def _damaged(original: bytes, data: st.DataObject) -> bytes:
    """``original`` with a few bits flipped, cut short, or a few bytes overwritten."""
    raw = bytearray(original)
    kind = data.draw(st.sampled_from(["flip", "truncate", "overwrite"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "truncate":
        del raw[data.draw(st.integers(0, len(raw))):]
    else:
        at, size = data.draw(st.integers(0, len(raw) - 1)), data.draw(st.integers(1, 8))
        raw[at:at + size] = data.draw(st.binary(min_size=size, max_size=size))
    return bytes(raw)


@settings(max_examples=40, deadline=None)
@given(torch_objects(), st.data())
def test_mapped_load_used_whole_fails_exactly_when_the_in_memory_load_fails(
        obj: Any, data: st.DataObject) -> None:
    # load(mmap=True) checks a storage's local header on first use of its bytes; used
    # whole, it must fail exactly when load(mmap=False), which checks them all up front,
    # fails, and otherwise give the same bytes (1,000 examples pass locally).
    damaged = _damaged(torch_bytes(obj), data)

    def outcome(read: Any) -> Any:
        try:
            tensors = ptfile.model.tree.flatten(read())
            return {name: _raw(t.numpy()) for name, t in tensors.items()}
        except ptfile.PtfileError:
            return "error"

    with _on_disk(damaged) as path:
        assert outcome(lambda: ptfile.load(path, mmap=True)) == \
            outcome(lambda: ptfile.load(io.BytesIO(damaged)))


@settings(max_examples=50, deadline=None)
@given(torch_objects(), st.data())
def test_mutated_random_torch_files_load_or_raise_ptfile_errors(obj: Any,
                                                                data: st.DataObject) -> None:
    # The error contract on files torch wrote for random objects, then damaged: every way
    # of reading either works or raises a PtfileError (1,500 + 600 examples pass locally).
    damaged = _damaged(torch_bytes(obj), data)

    def read_all(source: Any) -> None:
        with ptfile.open(source) as ck:
            list(ck.infos())
            for name in ck:
                ck.get_tensor(name)

    def use_all(loaded: Any) -> None:  # with mmap=True, local headers are read on first use
        for tensor in ptfile.model.tree.flatten(loaded).values():
            np.asarray(tensor)

    with _on_disk(damaged) as path:
        for read in (lambda: ptfile.load(io.BytesIO(damaged)),
                     lambda: use_all(ptfile.load(path, mmap=True)),
                     lambda: ptfile.load(io.BytesIO(damaged), map_location="cpu"),
                     lambda: read_all(path), lambda: read_all(io.BytesIO(damaged)),
                     lambda: ptfile.scan(io.BytesIO(damaged))):
            try:
                read()
            except ptfile.PtfileError:
                pass
