"""The torch bridge: ptfile objects to torch tensors and back, without copying.

This is the only module of ptfile that imports torch, and nothing in the core
imports it: :func:`ptfile.save` calls :func:`from_torch` only when torch is
already in ``sys.modules``.

* :func:`to_torch` turns a loaded object tree into torch objects.  Every ptfile
  :class:`~ptfile.Storage` becomes one ``torch.UntypedStorage`` over the same
  memory (``torch.frombuffer``), so tensors that shared a storage in the file
  share it in torch; :class:`~ptfile.Parameter` becomes ``nn.Parameter``;
  ``map_location`` is honoured as ``torch.load`` does (a device, a tag mapping,
  or a callable on the tag), moving each storage once.  Sparse tensors (COO and
  the compressed layouts) become torch sparse tensors over their parts;
  quantized ones (qint8, quint8, qint32; per tensor or per channel) are made
  by torch from the integer representation, which it copies.
* :func:`from_torch` does the reverse for saving: CPU tensors are viewed, not
  copied; a storage on another device is copied to the host once and keeps its
  location tag (``cuda:0``), as ``torch.save`` records it.
"""

from __future__ import annotations

import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np
import torch

from ..errors import UnsupportedFeatureError
from .dtypes import DTYPES, DType
from .layouts import QuantizedTensor, SparseTensor
from .tensor import Device, Parameter, Size, Storage, Tensor

__all__ = ["from_torch", "to_torch"]

TorchMapLocation = (str | torch.device | Mapping[str, str] | Callable[[str], Any] | None)

#: The plain integer dtype torch's quantized dtypes store (``int_repr()``'s dtype).
_QUANTIZED_INTS: Final = {"qint8": "int8", "quint8": "uint8", "qint32": "int32"}


def _torch_dtype(dtype: DType) -> torch.dtype:
    found = getattr(torch, dtype.name, None)
    if not isinstance(found, torch.dtype):
        raise UnsupportedFeatureError(f"this torch has no dtype {dtype!r}")
    return found


def _target(location: str, map_location: Any) -> str:
    if map_location is None:
        return location
    if isinstance(map_location, (str, torch.device)):
        return str(map_location)
    if isinstance(map_location, Mapping):
        return str(map_location.get(location, location))
    return str(map_location(location))


class _ToTorch:
    """One conversion: a memo of converted storages and objects, by identity."""

    def __init__(self, map_location: Any) -> None:
        self._map_location = map_location
        self._storages: dict[int, torch.UntypedStorage] = {}
        self._memo: dict[int, Any] = {}

    def storage(self, s: Storage, dtype: DType) -> torch.UntypedStorage:
        found = self._storages.get(id(s))
        if found is not None:
            return found
        device = _target(s.location, self._map_location)
        if s.data is None or device == "meta":
            made = torch.empty(s.nbytes, dtype=torch.uint8, device="meta").untyped_storage()
        else:
            made = self._host_storage(s, dtype)
            if device != "cpu":
                made = torch.empty(0, dtype=torch.uint8).set_(made).to(device).untyped_storage()
        self._storages[id(s)] = made
        return made

    @staticmethod
    def _host_storage(s: Storage, dtype: DType) -> torch.UntypedStorage:
        data = s.data
        assert data is not None
        if not data.nbytes:
            return torch.empty(0, dtype=torch.uint8).untyped_storage()
        if s.byteorder != sys.byteorder and dtype.swap > 1:  # one swapped copy, still shared
            data = memoryview(np.frombuffer(data, f"u{dtype.swap}").byteswap().view(np.uint8))
        with warnings.catch_warnings():  # read-only maps: torch warns that writes would fail
            warnings.simplefilter("ignore", UserWarning)
            base = torch.frombuffer(data, dtype=torch.uint8)
        return base.untyped_storage()

    def tensor(self, t: Tensor, as_dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = as_dtype or _torch_dtype(t.dtype)
        if t.storage is None:
            return torch.empty_strided(t._shape, t._stride, dtype=dtype, device="meta")
        storage = self.storage(t.storage, t.dtype)
        out = torch.empty(0, dtype=dtype, device=storage.device)
        out.set_(storage, t._offset, t._shape, t._stride)
        if t.metadata:
            torch._C._set_tensor_metadata(out, t.metadata)  # type: ignore[attr-defined]
        if isinstance(t, Parameter):
            out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
        elif t.requires_grad:
            out.requires_grad_(True)
        for name, value in t.attributes.items():  # what torch's _set_obj_state sets
            setattr(out, name, self.convert(value))
        return out

    def quantized(self, q: QuantizedTensor) -> torch.Tensor:
        """A torch quantized tensor from the integer representation (which torch copies)."""
        plain = _QUANTIZED_INTS.get(q.int_repr.dtype.name)
        if plain is None:
            raise UnsupportedFeatureError(f"to_torch of a {q.int_repr.dtype.name} quantized "
                                          "tensor (torch builds those only by quantizing)")
        ints = self.tensor(q.int_repr, as_dtype=getattr(torch, plain))
        if q.qscheme == "per_tensor_affine" and q.scale is not None and q.zero_point is not None:
            out = torch._make_per_tensor_quantized_tensor(ints, q.scale, q.zero_point)
        elif q.scales is not None and q.zero_points is not None and q.axis is not None:
            out = torch._make_per_channel_quantized_tensor(
                ints, self.tensor(q.scales), self.tensor(q.zero_points), q.axis)
        else:
            raise UnsupportedFeatureError(f"quantizer {q.qscheme!r} without its parameters")
        return out.requires_grad_(True) if q.requires_grad else out

    def sparse(self, s: SparseTensor) -> torch.Tensor:
        """A torch sparse tensor whose parts view the ptfile parts' memory."""
        size, values = tuple(s.size), self.tensor(s.values)
        if s.layout == "sparse_coo" and s.indices is not None:
            return torch.sparse_coo_tensor(self.tensor(s.indices), values, size,
                                           is_coalesced=bool(s.is_coalesced))
        layout = getattr(torch, s.layout, None)
        if not isinstance(layout, torch.layout) or s.compressed_indices is None \
                or s.plain_indices is None:
            raise UnsupportedFeatureError(f"to_torch of a {s.layout!r} sparse tensor")
        return torch.sparse_compressed_tensor(self.tensor(s.compressed_indices),
                                              self.tensor(s.plain_indices), values, size,
                                              layout=layout)

    def convert(self, obj: Any) -> Any:
        found = self._memo.get(id(obj))
        if found is not None:
            return found
        out = self._convert(obj)
        if out is not obj:
            self._memo[id(obj)] = out
        return out

    def _convert(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            return self.tensor(obj)
        if isinstance(obj, QuantizedTensor):
            return self.quantized(obj)
        if isinstance(obj, SparseTensor):
            return self.sparse(obj)
        if isinstance(obj, dict):
            out = type(obj)() if isinstance(obj, OrderedDict) else {}
            out.update((k, self.convert(v)) for k, v in obj.items())
            if hasattr(obj, "_metadata"):
                out._metadata = obj._metadata  # type: ignore[attr-defined]
            return out
        if isinstance(obj, Size):
            return torch.Size(obj)
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.convert(v) for v in obj)
        if isinstance(obj, Device):
            return torch.device(str(obj))
        if isinstance(obj, DType):
            return _torch_dtype(obj)
        return obj


def to_torch(obj: Any, map_location: TorchMapLocation = None) -> Any:
    """torch objects for a loaded ptfile object tree, sharing memory with it.

    Parameters
    ----------
    obj
        What :func:`ptfile.load` returned (or any tree holding ptfile tensors).
    map_location
        As ``torch.load``: None keeps each storage's recorded location, a
        device (``"cpu"``, ``"cuda:0"``, ``"meta"``) moves everything there, a
        mapping renames location tags, a callable maps a tag to a device.

    Returns
    -------
    The same tree with ``torch.Tensor``/``nn.Parameter`` leaves; tensors that
    shared a ptfile storage share one torch storage.

    Raises
    ------
    UnsupportedFeatureError
        A dtype this torch lacks.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> from ptfile.model.torch import to_torch
    >>> buf = io.BytesIO(); ptfile.save({"w": np.arange(3, dtype="f4")}, buf)
    >>> to_torch(ptfile.load(io.BytesIO(buf.getvalue())))["w"]
    tensor([0., 1., 2.])
    """
    return _ToTorch(map_location).convert(obj)


# --------------------------------------------------------------------------- torch → ptfile


def _dtype(t: torch.dtype) -> DType:
    name = str(t).removeprefix("torch.")
    found = DTYPES.get(name)
    if found is None:
        raise UnsupportedFeatureError(f"ptfile has no dtype for {t}")
    return found


class _FromTorch:
    def __init__(self) -> None:
        self._storages: dict[tuple[int, str], tuple[torch.UntypedStorage, Storage]] = {}
        self._memo: dict[int, Any] = {}

    def storage(self, t: torch.Tensor, dtype: DType) -> Storage:
        us = t.untyped_storage()
        key = (us.data_ptr(), str(us.device))
        found = self._storages.get(key)
        if found is not None and found[0].nbytes() == us.nbytes():
            return found[1]
        whole = torch.empty(0, dtype=torch.uint8, device=us.device).set_(us)
        array = whole.detach().cpu().numpy()
        location = "cpu" if us.device.type == "cpu" else str(us.device)
        storage = Storage(memoryview(array.data).cast("B"), dtype, location=location,
                          untyped=dtype.is_v3)
        self._storages[key] = (us, storage)  # keeps the torch storage alive while saving
        return storage

    def tensor(self, t: torch.Tensor) -> Tensor:
        dtype = _dtype(t.dtype)
        metadata = torch._utils.get_tensor_metadata(t) or None  # type: ignore[no-untyped-call]
        if t.device.type == "meta":
            return Tensor(None, 0, tuple(t.shape), t.stride(), dtype=dtype,
                          requires_grad=t.requires_grad)
        storage = self.storage(t, dtype)
        data = Tensor(storage, int(t.storage_offset()), tuple(t.shape), t.stride(), dtype=dtype,
                      requires_grad=False if isinstance(t, torch.nn.Parameter) else
                      t.requires_grad, metadata=metadata)
        # The Python attributes, as torch.save pickles them (Tensor/Parameter.__reduce_ex__).
        state = torch._utils._get_obj_state(t) or None  # type: ignore[no-untyped-call]
        if isinstance(t, torch.nn.Parameter):
            return Parameter(data, t.requires_grad, state=self.convert(state))
        if state is not None and type(t) is torch.Tensor:
            data.python_state, data.type_name = self.convert(state), "torch.Tensor"
        return data

    def convert(self, obj: Any) -> Any:
        found = self._memo.get(id(obj))
        if found is not None:
            return found[1]
        out = self._convert(obj)
        self._memo[id(obj)] = (obj, out)  # the original is kept so its id stays unique
        return out

    def _convert(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, dict):
            if not _holds_torch(obj):
                return obj
            out = type(obj)() if isinstance(obj, OrderedDict) else {}
            out.update((k, self.convert(v)) for k, v in obj.items())
            if hasattr(obj, "_metadata"):
                out._metadata = obj._metadata  # type: ignore[attr-defined]
            return out
        if isinstance(obj, torch.Size):
            return Size(obj)
        if isinstance(obj, (list, tuple)) and _holds_torch(obj):
            return type(obj)(self.convert(v) for v in obj)
        if isinstance(obj, torch.device):
            return Device(str(obj))
        if isinstance(obj, torch.dtype):
            return _dtype(obj)
        return obj


def _holds_torch(obj: Any, depth: int = 0) -> bool:
    """True when a torch object is somewhere in the tree (type-name check, bounded depth)."""
    module = type(obj).__module__
    if module == "torch" or module.startswith("torch."):
        return True
    if depth > 100:
        return False
    if isinstance(obj, dict):
        return any(_holds_torch(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_torch(v, depth + 1) for v in obj)
    return False


def from_torch(obj: Any) -> Any:
    """ptfile objects for a tree holding torch tensors; the tree itself if it holds none.

    Parameters
    ----------
    obj
        A state dict or any tree of dicts/lists/tuples with torch tensors,
        parameters, sizes, devices and dtypes.

    Returns
    -------
    The tree with ptfile leaves; CPU tensors view the torch memory, tensors
    sharing a torch storage share one ptfile storage.

    Raises
    ------
    UnsupportedFeatureError
        A dtype ptfile does not know.

    Examples
    --------
    >>> import torch
    >>> from ptfile.model.torch import from_torch
    >>> from_torch({"w": torch.zeros(2)})["w"]
    ptfile.Tensor(shape=[2], dtype=torch.float32)
    """
    if not _holds_torch(obj):
        return obj
    return _FromTorch().convert(obj)
