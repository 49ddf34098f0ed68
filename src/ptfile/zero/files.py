"""The files of a ZeRO checkpoint: which tag folder, which rank files, and where their tensors lie.

``engine.save_checkpoint(DIR)`` writes ``DIR/latest`` (the tag) and ``DIR/<tag>/`` with
one model file (ZeRO 1/2: ``mp_rank_00_model_states.pt``; ZeRO-3: one per rank) and one
optimizer file per data-parallel rank (``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt``)
(``../shared/spec/deepspeed-zero.md`` §1).  :func:`tag_folder` finds the tag folder from
the run folder (its ``latest``, or the ``tag`` asked for) or takes the tag folder itself;
:func:`rank_files` lists its model and optimizer files in DeepSpeed's natural order
(``zero_pp_rank_10`` after ``_9``), refusing what ptfile does not read (table below).
:class:`RankFile` reads one file's pickle only (its tensors without their bytes, under
:func:`ptfile.formats.policies.deepspeed`) and locates each tensor's elements in the file
(:class:`Piece`), so no optimizer state is ever read.

===================================================  ========================================
files                                                 refused as
===================================================  ========================================
``*_mp_rank_01_*`` and higher                         tensor (model) parallel
``layer_*-model_states.pt``                           pipeline parallel
``expp_rank_*``                                       MoE expert parallel
``offloaded_tensors/`` (NVMe offload)                 NVMe offload
``zero/`` in the tag folder, ``latest_universal``     a universal checkpoint
===================================================  ========================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .._io.directory import local_names
from .._io.local import Source
from .._io.paths import is_url
from .._io.remote import open_any
from ..archive.records import METHOD_STORED
from ..errors import (
    FormatError,
    PtfileError,
    UnsupportedFeatureError,
    add_note,
    brief,
)
from ..formats import open_detected
from ..formats.detection import detect_source
from ..formats.inputs import read_small, url_folder_names
from ..formats.options import Policy, ReadOptions
from ..limits import Limits
from ..model.dtypes import DType
from ..model.tensor import Tensor, contiguous_stride

__all__ = ["MODEL_FILE", "OPTIM_FILE", "Piece", "RankFile", "natural_key", "rank_files",
           "tag_folder"]

#: A model states file (``mp_rank_00_model_states.pt``, ``zero_pp_rank_1_mp_rank_00_…``).
MODEL_FILE: Final = re.compile(r"(?:zero_pp_rank_\d+_)?mp_rank_(\d+)_model_states\.pt")
#: An optimizer states file, with the ``bf16_`` prefix of bf16 runs.
OPTIM_FILE: Final = re.compile(r"(?:bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")
#: Files of layouts ptfile does not consolidate (module docstring), and what they are.
_UNSUPPORTED: Final = (
    (re.compile(r"layer_\d+-model_states\.pt"), "pipeline-parallel layer files"),
    (re.compile(r"expp_rank_\d+_mp_rank_\d+_model_states\.pt"), "MoE expert-parallel files"),
)
#: The file naming the latest tag, and the universal checkpoint's.
LATEST: Final = "latest"
_LATEST_UNIVERSAL: Final = "latest_universal"


def natural_key(name: str) -> tuple[Any, ...]:
    """DeepSpeed's sort key: digit runs compared as integers.

    Examples
    --------
    >>> sorted(["zero_pp_rank_10_x", "zero_pp_rank_9_x"], key=natural_key)
    ['zero_pp_rank_9_x', 'zero_pp_rank_10_x']
    """
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if is_url(folder) else os.path.join(folder, name)


def _folder_names(folder: str, storage_options: Mapping[str, Any] | None) -> list[str] | None:
    """The file names of ``folder``, or None when it is no folder: a URL is asked once, as
    every folder URL is (:func:`~ptfile.formats.inputs.url_folder_names`)."""
    if is_url(folder):
        return url_folder_names(folder, storage_options)
    return local_names(folder) if os.path.isdir(folder) else None


def _read_latest(path: str, storage_options: Mapping[str, Any] | None, limits: Limits) -> str:
    text = read_small(path, storage_options, limits, "the latest tag")  # a few bytes
    try:
        tag = text.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: not a tag name: {exc}") from exc
    if not tag or "/" in tag or "\\" in tag or tag in (".", ".."):
        raise FormatError(f"{path}: {tag!r} is not a tag folder's name")
    return tag


def tag_folder(location: str, names: list[str], tag: str | None,
               storage_options: Mapping[str, Any] | None, limits: Limits
               ) -> tuple[str, str, list[str]]:
    """The tag folder to read, its tag and its file names.

    ``location`` is the run folder (with ``latest``) or a tag folder (with rank files),
    ``names`` its files.  ``tag`` chooses a tag folder of the run folder over ``latest``.

    Raises
    ------
    FormatError
        No ``latest`` and no ``tag`` given, or the tag folder is missing.
    UnsupportedFeatureError
        A universal checkpoint.
    """
    has_ranks = any(OPTIM_FILE.fullmatch(n) or MODEL_FILE.fullmatch(n) for n in names)
    if tag is None and has_ranks:
        return location, os.path.basename(location.rstrip("/\\")), names
    if tag is None:
        if LATEST not in names:
            if _LATEST_UNIVERSAL in names:
                raise UnsupportedFeatureError(f"{location}: a universal checkpoint "
                                              "(latest_universal): ptfile reads ZeRO checkpoints")
            raise FormatError(f"{location}: no 'latest' file names the tag folder to read: "
                              "pass the tag (tag=..., --tag)")
        tag = _read_latest(_join(location, LATEST), storage_options, limits)
    elif "/" in tag or "\\" in tag or tag in ("", ".", ".."):
        raise FormatError(f"{tag!r} is not a tag folder's name")
    folder = _join(location, tag)
    found = _folder_names(folder, storage_options)
    if found is None:
        raise FormatError(f"{location}: the tag folder {tag!r} is missing")
    return folder, tag, found


def rank_files(folder: str, names: list[str],
               storage_options: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """The model files and the optimizer files of the tag folder, in natural order.

    Raises
    ------
    UnsupportedFeatureError
        Files of a layout ptfile does not consolidate (module docstring).
    FormatError
        No model file or no optimizer file.
    """
    for pattern, what in _UNSUPPORTED:
        found = [n for n in names if pattern.fullmatch(n)]
        if found:
            raise UnsupportedFeatureError(f"{folder}: {what} ({found[0]}): ptfile consolidates "
                                          "data-parallel ZeRO checkpoints only")
    model = sorted((n for n in names if MODEL_FILE.fullmatch(n)), key=natural_key)
    optim = sorted((n for n in names if OPTIM_FILE.fullmatch(n)), key=natural_key)
    parallel = [n for n in (*model, *optim)
                if int((MODEL_FILE.fullmatch(n) or OPTIM_FILE.fullmatch(n)).groups()[-1])]  # type: ignore[union-attr]
    if parallel:
        raise UnsupportedFeatureError(f"{folder}: tensor-parallel files ({parallel[0]}): ptfile "
                                      "consolidates data-parallel ZeRO checkpoints only")
    for sub, what in (("offloaded_tensors", "NVMe-offloaded optimizer state (offloaded_tensors/)"),
                      ("zero", "a universal checkpoint (zero/)")):
        if not optim and _folder_names(_join(folder, sub), storage_options) is not None:
            raise UnsupportedFeatureError(f"{folder}: {what}: ptfile reads ZeRO checkpoints "
                                          "whose fp32 weights are in *_optim_states.pt files")
    if not model:
        raise FormatError(f"{folder}: no *_model_states.pt file")
    if not optim:
        raise FormatError(f"{folder}: no *_optim_states.pt file")
    return model, optim


@dataclass(frozen=True, slots=True)
class Piece:
    """``count`` elements of ``dtype`` at byte ``offset`` of the tag folder's file ``file``."""

    file: str
    offset: int
    count: int
    dtype: DType
    byteorder: str = "little"

    def cut(self, start: int, count: int) -> Piece:
        """Elements ``[start, start + count)`` of this piece."""
        return Piece(self.file, self.offset + start * self.dtype.itemsize, count, self.dtype,
                     self.byteorder)


def _is_contiguous(tensor: Tensor) -> bool:
    return all(size == 1 or got == want for size, got, want in zip(
        tensor.shape, tensor.stride(), contiguous_stride(tensor.shape), strict=True))


class RankFile:
    """One rank file's pickle, read without tensor bytes, and where its tensors lie."""

    def __init__(self, folder: str, name: str, *, storage_options: Mapping[str, Any] | None,
                 limits: Limits, structural: bool) -> None:
        self.name = name
        self.path = _join(folder, name)
        policy = Policy.STRUCTURAL_DEEPSPEED if structural else Policy.STRICT_DEEPSPEED
        source: Source = open_any(self.path, storage_options=storage_options, limits=limits,
                                  lazy=True)
        self.size = source.size
        try:
            opened = open_detected(source, detect_source(source, limits),
                                   ReadOptions(limits=limits, policy=policy, skip_data=True))
            if opened.archive is None:
                raise FormatError(f"{self.path}: not a torch.save ZIP checkpoint")
            self.archive = opened.archive
            self.object: Any = opened.obj
        except PtfileError as exc:
            add_note(exc, f"reading {self.path}")
            source.close()
            raise
        self._source = source

    def close(self) -> None:
        """Close the file."""
        self._source.close()

    def storage_piece(self, tensor: Tensor, what: str) -> Piece:
        """The whole storage of ``tensor`` (a tensor :meth:`piece` located)."""
        if tensor.storage is None or tensor.storage.key is None:
            raise FormatError(f"{self.path}: {what} has no storage record")
        member = f"{self.archive.prefix}/data/{tensor.storage.key}"
        record = self.archive.get(member)
        if record is None:
            raise FormatError(f"{self.path}: {what}: its storage record {member!r} is missing")
        return Piece(self.name, self.archive.data_offset(member),
                     record.size // tensor.dtype.itemsize, tensor.dtype, tensor.storage.byteorder)

    def piece(self, tensor: Any, what: str) -> Piece:
        """Where the elements of ``tensor`` (a contiguous tensor of this file) lie.

        Raises
        ------
        FormatError
            Not a tensor, not contiguous, its storage record missing, compressed or short.
        """
        if not isinstance(tensor, Tensor) or tensor.storage is None \
                or tensor.storage.key is None:
            raise FormatError(f"{self.path}: {what} is {brief(tensor, 80)}, not a tensor")
        if not _is_contiguous(tensor):
            raise FormatError(f"{self.path}: {what} is not contiguous")
        member = f"{self.archive.prefix}/data/{tensor.storage.key}"
        record = self.archive.get(member)
        itemsize = tensor.dtype.itemsize
        end = (tensor.storage_offset() + tensor.numel()) * itemsize
        if record is None or record.method != METHOD_STORED or end > record.size:
            raise FormatError(f"{self.path}: {what}: its storage record {member!r} is missing, "
                              "compressed or shorter than the tensor")
        offset = self.archive.data_offset(member) + tensor.storage_offset() * itemsize
        return Piece(self.name, offset, tensor.numel(), tensor.dtype, tensor.storage.byteorder)
