"""Checkpoint sets: one checkpoint made of several files in a folder.

A Hugging Face model folder in ``.bin`` (``pytorch_model.bin``, or shards and their
index) and a trainer checkpoint folder (``checkpoint-500/``: the model, ``optimizer.pt``,
``scheduler.pt``, ``rng_state*.pth``, ``trainer_state.json``, ``training_args.bin``) are
sets: :mod:`ptfile.formats.inputs` recognises them and names their parts by role, and
:mod:`.reader` reads them part by part (the module docstring there says how each part
is read and named).  Safetensors model folders and torch's distributed checkpoints are
read by :mod:`ptfile.dcp`; a trainer folder whose model is in safetensors shards reads
that part through it.

:func:`load_set` is what :func:`ptfile.load` returns for a set: a one-part set's object
(the merged state dict of a sharded model), a trainer folder's ``{role: object}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import FormatError, PtfileError, add_note
from ..formats.inputs import Input, InputKind, Part
from ..limits import DEFAULT_LIMITS, Limits
from .reader import (
    SetReader,
    ShardedReader,
    open_part,
    open_set,
    part_policy,
    read_json,
    role_policy,
)

__all__ = ["SetReader", "ShardedReader", "load_set", "open_part", "open_set"]


def load_set(record: Input, load_file: Callable[[str, bool], Any], *,
             limits: Limits | None = None, structural: bool = False) -> Any:
    """Every part of the set ``record`` loaded, data included: a one-part set's object
    (a model's state dict, its shards merged in the index's order), a trainer folder's
    ``{role: object}`` (``trainer_state`` as its JSON).

    ``load_file(path, structural)`` loads one file (:func:`ptfile.load`, with the caller's
    other options); each part is read under its role's policy (:mod:`.reader`).

    Raises
    ------
    FormatError, UnsafeGlobalError, LimitExceededError, UnsupportedFeatureError
        As :func:`ptfile.load` for the part that fails (a note names it).
    """
    if not record.is_checkpoint_folder or record.kind.is_dcp_readable:
        raise FormatError(f"{record.label!r} is not a checkpoint set ({record.kind.value})")
    limits = limits or DEFAULT_LIMITS
    out: dict[str, Any] = {}
    for part in record.parts:
        try:
            out[part.role] = _load_part(record, part, load_file, limits, structural)
        except PtfileError as exc:
            add_note(exc, f"in the {part.role} part of {record.label} ({', '.join(part.files)})")
            raise
    if record.kind is not InputKind.TRAINER and len(out) == 1:
        return next(iter(out.values()))
    return out


def _load_part(record: Input, part: Part, load_file: Callable[[str, bool], Any],
               limits: Limits, structural: bool) -> Any:
    role, structural = part_policy(part, structural)
    if part.form == "json":
        return read_json(record, part.files[0], limits)
    if part.form == "shards":  # the DCP readers', over the part's files alone
        from ..dcp.load import load_dcp

        return load_dcp(record.alone(part), structural=structural, limits=limits)
    if part.form == "bin-shards":
        shards = {name: load_file(record.path(name), structural) for name in part.files}
        merged: dict[str, Any] = {}
        for name, shard in record.weight_map.items():
            if not isinstance(shards[shard], dict) or name not in shards[shard]:
                raise FormatError(f"{record.path(part.index or '')}: the index puts {name!r} "
                                  f"in {shard}, which does not hold it")
            merged[name] = shards[shard][name]
        for shard in shards.values():
            for name, value in shard.items():
                merged.setdefault(name, value)
        return merged
    with role_policy(role):
        return load_file(record.path(part.files[0]), structural)
