"""DeepSpeed ZeRO checkpoints (stages 1, 2, 3), consolidated without torch or DeepSpeed.

A ZeRO checkpoint is a model cut into pieces across data-parallel ranks, like a DCP
checkpoint: this package reads it beside :mod:`ptfile.dcp`, with the same streaming
contract (``../shared/spec/deepspeed-zero.md``).  :mod:`.files` finds the tag folder and
its rank files and locates tensors in them; :mod:`.layout` maps every tensor of the
consolidated state dict to its pieces; :mod:`.reader` assembles tensors one at a time
(:class:`ZeroReader`, what :func:`ptfile.open` returns); :mod:`.convert` writes a
``.pt``, ``.safetensors`` or Hugging Face folder tensor by tensor with
:mod:`ptfile.dcp.consolidate`'s writers.

:func:`load_zero` returns what DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``
returns: buffers, frozen parameters, trainable parameters (fp32 master weights), tied
names last, sharing their target's tensor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..formats.inputs import Input, InputKind, resolve_input
from ..limits import DEFAULT_LIMITS, Limits
from ..model.dtypes import DType
from ..model.tensor import Tensor
from .layout import Entry, Layout, read_layout
from .reader import ZeroReader, ZeroSlice, as_tensor, output_dtype

__all__ = ["Entry", "Layout", "ZeroReader", "ZeroSlice", "load_zero", "open_zero", "zero_layout"]


def zero_layout(directory: str | os.PathLike[str] | Input, *, tag: str | None = None,
                exclude_frozen: bool = False, limits: Limits | None = None,
                structural: bool = False, storage_options: Mapping[str, Any] | None = None,
                frozen_from_module: bool = False) -> Layout:
    """The :class:`Layout` of the ZeRO checkpoint ``directory`` (a run folder, with
    ``latest``, or a tag folder; a path or an fsspec URL).

    Raises
    ------
    FormatError, UnsupportedFeatureError, UnsafeGlobalError
        As :func:`ptfile.zero.layout.read_layout`.
    """
    limits = limits or DEFAULT_LIMITS
    record = resolve_input(directory, storage_options, limits=limits)
    if not record.is_folder:
        from ..errors import FormatError

        raise FormatError(f"{record.label!r} is not a folder: a ZeRO checkpoint is the run "
                          "folder (with 'latest') or a tag folder (global_step<N>/)")
    if record.kind is not InputKind.ZERO and tag is None:
        from ..errors import FormatError

        raise FormatError(f"{record.label!r} is not a ZeRO checkpoint folder "
                          f"({record.kind.value}): no rank files, 'latest' or zero_to_fp32.py")
    return read_layout(str(record.location), list(record.names), tag=tag,
                       exclude_frozen=exclude_frozen, storage_options=record.storage_options,
                       limits=limits, structural=structural,
                       frozen_from_module=frozen_from_module)


def open_zero(directory: str | os.PathLike[str] | Input, *, tag: str | None = None,
              exclude_frozen: bool = False, dtype: str | DType | None = None,
              limits: Limits | None = None, structural: bool = False,
              storage_options: Mapping[str, Any] | None = None,
              frozen_from_module: bool = False) -> ZeroReader:
    """The ZeRO checkpoint ``directory`` opened lazily: its files' pickles are read, no
    tensor (:class:`ZeroReader`).

    Raises
    ------
    FormatError, UnsupportedFeatureError, UnsafeGlobalError
        As :func:`zero_layout`.
    ValueError
        ``dtype`` is not one DeepSpeed's tools offer.
    """
    wanted = output_dtype(dtype)
    layout = zero_layout(directory, tag=tag, exclude_frozen=exclude_frozen, limits=limits,
                         structural=structural, storage_options=storage_options,
                         frozen_from_module=frozen_from_module)
    record_options = directory.storage_options if isinstance(directory, Input) \
        else storage_options
    return ZeroReader(layout, dtype=wanted, storage_options=record_options, limits=limits)


def load_zero(directory: str | os.PathLike[str] | Input, *, tag: str | None = None,
              exclude_frozen: bool = False, dtype: str | DType | None = None,
              limits: Limits | None = None, structural: bool = False,
              storage_options: Mapping[str, Any] | None = None,
              frozen_from_module: bool = False) -> dict[str, Tensor]:
    """The consolidated state dict of a DeepSpeed ZeRO checkpoint, without torch.

    What ``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``
    returns, key for key, in its order and dtypes: buffers (floating ones as float32),
    frozen parameters (in the model's dtype; none for ZeRO-1), trainable parameters
    (float32 master weights), then tied names, the same :class:`~ptfile.Tensor` as their
    target.  Each tensor is assembled from its rank pieces in turn.

    Parameters
    ----------
    directory
        The run folder (``latest`` names the tag) or a tag folder, a path or a URL.
    tag
        The tag folder to read instead of ``latest``'s.
    exclude_frozen
        Leave out the frozen parameters (``exclude_frozen_parameters=True``).
    dtype
        Cast every floating tensor to ``"fp32"``, ``"fp16"`` or ``"bf16"``
        (``zero_to_torch.py --dtype``); None keeps each tensor's dtype.
    frozen_from_module
        ZeRO-1 records no frozen parameters (DeepSpeed's tool returns none): take them
        from the model file's ``module``, in the model's bit16 dtype (after the buffers,
        where ZeRO-2 has them; :meth:`ZeroReader.summary` lists them as ``frozen_bit16``).

    Raises
    ------
    FormatError, UnsupportedFeatureError, UnsafeGlobalError
        As :func:`zero_layout`; a rank file shorter than its tensors.
    """
    with open_zero(directory, tag=tag, exclude_frozen=exclude_frozen, dtype=dtype,
                   limits=limits, structural=structural, storage_options=storage_options,
                   frozen_from_module=frozen_from_module) as ck:
        out: dict[str, Tensor] = {}
        for name, entry in ck.layout.entries.items():
            out[name] = as_tensor(ck.get_tensor(name), ck.dtype_of(entry), entry.requires_grad)
        for alias, target in ck.layout.aliases.items():
            out[alias] = out[target]
        return out
