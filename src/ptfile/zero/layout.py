"""Where every tensor of a consolidated ZeRO state dict lies in the rank files.

:func:`read_layout` reads the pickles of a tag folder's files (no tensor bytes) and
returns a :class:`Layout`: for each name of the state dict that DeepSpeed's
``get_fp32_state_dict_from_zero_checkpoint`` returns, in its order, an :class:`Entry`
listing the :class:`~.files.Piece` s whose elements, concatenated, are the tensor
(``../shared/spec/deepspeed-zero.md`` §4-§7):

* **buffers**: the first model file's ``module`` entries named by ``buffer_names``, in
  ``module`` order; floating ones are returned as float32;
* **frozen parameters** (unless excluded; ZeRO-1 saves none): ZeRO-2's full tensors from
  ``frozen_param_fragments``, ZeRO-3's per-rank padded fragments concatenated; their
  dtype is the model's (not upcast);
* **trainable parameters**, in ``param_shapes`` order, float32 from the optimizer files:
  ZeRO 1/2 walks each flat group over the ranks' slices laid end to end (skipping
  ``param_alignment_paddings``), so a parameter straddling ranks has a piece from each;
  ZeRO-3 takes ``ceil(numel / world_size)`` elements at the running offset from every
  rank (sub-groups laid end to end per rank) and keeps the first ``numel``;
* **tied names** (``shared_params`` of rank 0): aliases of their target, last.

The element counts are checked as DeepSpeed checks them (ZeRO 1/2: the consumed and
available lengths rounded up to ``2 * world_size`` agree; ZeRO-3: the per-rank partitions
fill each rank's flat groups exactly), and the file count must equal the partition count.
A ``BF16_Optimizer`` folder (ZeRO-1 with fp32 gradient accumulation; its optimizer files
have no ``zero_stage``), which DeepSpeed's tool refuses, is read as ZeRO-1 with its
trailing padding ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import FormatError, PtfileError, add_note, brief
from ..limits import DEFAULT_LIMITS, Limits
from ..model.dtypes import DTYPES, DType
from ..model.tensor import Tensor
from .files import Piece, RankFile, rank_files, tag_folder

__all__ = ["Entry", "Group", "Layout", "read_layout"]

_FLOAT32: Final = DTYPES["float32"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of the state dict: its name, role (``buffer``, ``frozen``,
    ``frozen-bit16``, ``parameter``), dtype and shape as returned, and the pieces holding
    its elements (concatenated, exactly ``numel`` of them, in the files' dtype ``source``).

    ``storage`` is the storage DeepSpeed's consolidation gives the tensor when it keeps the
    files' dtype (``zero_to_fp32``'s ``.bin`` layout: ZeRO-1/2 parameters are views at
    ``storage_offset`` of their whole flat group, shared under ``storage_key``; ZeRO-3
    parameters and frozen fragments keep their partition padding; buffers and ZeRO-2
    frozen parameters their storage in the model file); empty: exactly its elements.
    ``requires_grad`` is the flag DeepSpeed's tensor has (its flat groups', saved set)."""

    name: str
    role: str
    dtype: DType
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    source: DType
    group: int | None = None
    storage: tuple[Piece, ...] = ()
    storage_offset: int = 0
    storage_key: str | None = None
    requires_grad: bool = False

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class Group:
    """One flat group of the optimizer files: its parameters (in order), their elements,
    and the elements each rank saved."""

    index: int
    params: tuple[str, ...]
    numel: int
    rank_numels: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """A ZeRO checkpoint's tensors and where they lie (module docstring)."""

    folder: str
    tag: str
    stage: int
    world_size: int
    optimizer: str  # "zero", or "bf16_optimizer"
    ds_version: str | None
    model_files: tuple[str, ...]
    optim_files: tuple[str, ...]
    entries: dict[str, Entry]
    aliases: dict[str, str]
    groups: tuple[Group, ...]
    model_dtype: str | None = None
    excluded: tuple[str, ...] = ()
    sizes: dict[str, int] = field(default_factory=dict)

    def names(self) -> list[str]:
        """Every name of the state dict, in DeepSpeed's order (aliases last)."""
        return [*self.entries, *(a for a in self.aliases if a not in self.entries)]

    def entry(self, name: str) -> Entry:
        """The entry of ``name`` (an alias: its target's).

        Raises
        ------
        KeyError
            No such name.
        """
        return self.entries[self.aliases.get(name, name)]


def _take(spans: Sequence[Piece], start: int, count: int, what: str) -> list[Piece]:
    """The pieces of elements ``[start, start + count)`` of ``spans`` laid end to end."""
    out: list[Piece] = []
    base = 0
    for span in spans:
        lo, hi = max(start, base), min(start + count, base + span.count)
        if lo < hi:
            out.append(span.cut(lo - base, hi - lo))
        base += span.count
        if base >= start + count:
            break
    if sum(p.count for p in out) != count:
        raise FormatError(f"{what}: the flat groups end before its elements "
                          f"[{start}, {start + count})")
    return out


def _trim(pieces: Sequence[Piece], count: int) -> tuple[Piece, ...]:
    """The first ``count`` elements of ``pieces``."""
    return tuple(_take(pieces, 0, count, "a parameter"))


def _dict(value: Any, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise FormatError(f"{what} is {brief(value, 80)}, not a dict")
    return value


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(d) is int and d >= 0 for d in value):
        raise FormatError(f"{what}: shape {brief(value, 80)} is not a tuple of sizes")
    return tuple(value)


class _Reading:
    """The state of one :func:`read_layout`: the rank files and what was found."""

    def __init__(self, folder: str, models: list[RankFile], optims: list[RankFile]) -> None:
        self.folder, self.models, self.optims = folder, models, optims
        self.model = _dict(models[0].object, f"{models[0].path}")
        self.osds = [_dict(_dict(f.object, f.path).get("optimizer_state_dict"),
                           f"{f.path}: optimizer_state_dict") for f in optims]
        osd = self.osds[0]
        if "zero_stage" in osd:
            self.stage, self.optimizer = osd["zero_stage"], "zero"
        elif "single_partition_of_fp32_groups" in osd and "partition_count" in osd:
            self.stage, self.optimizer = 1, "bf16_optimizer"
        else:
            raise FormatError(f"{optims[0].path} is not a ZeRO checkpoint: no zero_stage")
        if type(self.stage) is not int or not 1 <= self.stage <= 3:
            raise FormatError(f"{optims[0].path}: unknown ZeRO stage {brief(self.stage, 40)}")
        count = osd.get("partition_count")
        if isinstance(count, list) and count and all(type(c) is int for c in count):
            count = max(count)
        if type(count) is not int or count < 1:
            raise FormatError(f"{optims[0].path}: partition_count {brief(count, 80)} is not a "
                              "positive int")
        if count != len(optims):
            raise FormatError(f"{self.folder}: partition_count is {count} but there are "
                              f"{len(optims)} *_optim_states.pt files (a rank's file is "
                              "missing, or an older checkpoint's is left over)")
        self.world_size = count
        self.groups: list[Group] = []
        self.requires_grad = False  # set by the flat groups read

    def flat(self, rank: int) -> list[Piece]:
        """Rank ``rank``'s fp32 flat groups, as pieces."""
        key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        f = self.optims[rank]
        groups = self.osds[rank].get(key)
        if not isinstance(groups, list):
            raise FormatError(f"{f.path}: {key} is {brief(groups, 80)}, not a list")
        pieces = [f.piece(t, f"{key}[{i}]") for i, t in enumerate(groups)]
        self.requires_grad |= any(getattr(t, "requires_grad", False) for t in groups)
        for i, p in enumerate(pieces):
            if p.dtype != _FLOAT32 or (isinstance(groups[i], Tensor) and groups[i].ndim != 1):
                raise FormatError(f"{f.path}: {key}[{i}] is not a 1-D float32 tensor")
        return pieces

    def param_shapes(self) -> list[list[tuple[str, tuple[int, ...]]]]:
        shapes = self.model.get("param_shapes")
        if not isinstance(shapes, list):
            raise FormatError(f"{self.models[0].path}: param_shapes is {brief(shapes, 80)}")
        return [[(str(n), _shape(s, f"{n!r}")) for n, s in _dict(g, "param_shapes").items()]
                for g in shapes]

    def buffers(self) -> dict[str, Entry]:
        names = self.model.get("buffer_names")
        if not isinstance(names, list):
            raise FormatError(f"{self.models[0].path} is not a model states file: no "
                              "buffer_names")
        module = _dict(self.model.get("module"), f"{self.models[0].path}: module")
        wanted = set(names)
        out = {}
        for name, t in module.items():
            if name in wanted:
                piece = self.models[0].piece(t, f"buffer {name!r}")
                dtype = _FLOAT32 if t.dtype.is_floating_point else t.dtype
                out[name] = Entry(name, "buffer", dtype, tuple(t.shape), (piece,), t.dtype,
                                  storage=(self.models[0].storage_piece(t, name),),
                                  storage_offset=t.storage_offset())
        return out

    def frozen(self) -> dict[str, Entry]:
        shapes = self.model.get("frozen_param_shapes")
        if shapes is None:
            return {}
        out = {}
        for name, shape in _dict(shapes, "frozen_param_shapes").items():
            shape = _shape(shape, f"frozen {name!r}")
            numel = math.prod(shape)
            files = self.models if self.stage == 3 else self.models[:1]
            pieces, dtype, offset = [], None, 0
            for f in files:
                frags = _dict(_dict(f.object, f.path).get("frozen_param_fragments"),
                              f"{f.path}: frozen_param_fragments")
                if name not in frags:
                    raise FormatError(f"{f.path}: frozen_param_fragments lacks {name!r}")
                piece = f.piece(frags[name], f"frozen {name!r}")
                pieces.append(piece)
                dtype = piece.dtype
            assert dtype is not None
            storage = tuple(pieces)
            if self.stage < 3:  # the fragment itself, in its storage of the model file
                storage = (files[0].storage_piece(frags[name], name),)
                offset = frags[name].storage_offset()
            out[name] = Entry(name, "frozen", dtype, shape, _trim(pieces, numel), dtype,
                              storage=storage, storage_offset=offset)
        return out

    def frozen_from_module(self, trainable: Mapping[str, Entry], buffers: Mapping[str, Entry]
                           ) -> dict[str, Entry]:
        """ZeRO-1's frozen parameters, which it does not record: the first model file's
        ``module`` entries that are no buffer, trainable parameter or tied alias, in the
        model's (bit16) dtype, role ``frozen-bit16``."""
        module = _dict(self.model.get("module"), f"{self.models[0].path}: module")
        aliases = _dict(self.model.get("shared_params") or {}, "shared_params")
        out = {}
        for name, t in module.items():
            if name in trainable or name in buffers or name in aliases:
                continue
            piece = self.models[0].piece(t, f"module {name!r}")
            out[name] = Entry(name, "frozen-bit16", t.dtype, tuple(t.shape), (piece,), t.dtype,
                              storage=(self.models[0].storage_piece(t, name),),
                              storage_offset=t.storage_offset())
        return out

    def zero12(self) -> dict[str, Entry]:
        paddings = self.osds[0].get("param_alignment_paddings")
        flats = [self.flat(r) for r in range(self.world_size)]
        out: dict[str, Entry] = {}
        for g, params in enumerate(self.param_shapes()):
            spans = [flat[g] for flat in flats if g < len(flat)]
            if len(spans) != self.world_size:
                raise FormatError(f"{self.folder}: a rank's file has no flat group {g}")
            pads = paddings[g] if isinstance(paddings, list) and g < len(paddings) else None
            if pads is not None and (not isinstance(pads, list) or len(pads) != len(params)):
                raise FormatError(f"{self.folder}: param_alignment_paddings[{g}] has "
                                  f"{brief(pads, 40)} for {len(params)} parameters")
            offset = 0
            for i, (name, shape) in enumerate(params):
                numel = math.prod(shape)
                pieces = _take(spans, offset, numel, f"parameter {name!r}")
                whole = tuple(spans) if self.optimizer == "zero" else ()
                out[name] = Entry(name, "parameter", _FLOAT32, shape, tuple(pieces), _FLOAT32, g,
                                  storage=whole, storage_offset=offset, storage_key=f"group {g}",
                                  requires_grad=self.requires_grad)
                offset += numel + (int(pads[i]) if pads is not None else 0)
            avail = sum(s.count for s in spans)
            align = 2 * self.world_size
            if self.optimizer == "zero" and \
                    math.ceil(offset / align) != math.ceil(avail / align):
                raise FormatError(f"{self.folder}: flat group {g}: the parameters take {offset} "
                                  f"elements, the ranks saved {avail}")
            self.groups.append(Group(g, tuple(n for n, _ in params), offset,
                                     tuple(s.count for s in spans)))
        return out

    def zero3(self) -> dict[str, Entry]:
        flats = [self.flat(r) for r in range(self.world_size)]
        ws = self.world_size
        out: dict[str, Entry] = {}
        offset = 0
        for g, params in enumerate(self.param_shapes()):
            start = offset
            for name, shape in params:
                numel = math.prod(shape)
                part = -(-numel // ws)
                pieces = [p for flat in flats
                          for p in _take(flat, offset, part, f"parameter {name!r}")]
                out[name] = Entry(name, "parameter", _FLOAT32, shape, _trim(pieces, numel),
                                  _FLOAT32, g, storage=tuple(pieces),
                                  requires_grad=self.requires_grad)
                offset += part
            self.groups.append(Group(g, tuple(n for n, _ in params), offset - start,
                                     tuple(flat[g].count if g < len(flat) else 0
                                           for flat in flats)))
        for r, flat in enumerate(flats):
            if sum(p.count for p in flat) != offset:
                raise FormatError(f"{self.optims[r].path}: the parameters' partitions take "
                                  f"{offset} elements, the rank saved {sum(p.count for p in flat)}")
        return out

    def aliases(self, entries: Mapping[str, Entry]) -> dict[str, str]:
        shared = self.model.get("shared_params") or {}
        return {str(a): str(t) for a, t in _dict(shared, "shared_params").items()
                if t in entries}

    def model_dtype(self, buffers: Mapping[str, Entry]) -> str | None:
        module = self.model.get("module")
        for name, t in (module.items() if isinstance(module, Mapping) else ()):
            if name not in buffers and isinstance(t, Tensor):
                return t.dtype.name
        return None


def read_layout(location: str, names: list[str], *, tag: str | None = None,
                exclude_frozen: bool = False, storage_options: Mapping[str, Any] | None = None,
                limits: Limits | None = None, structural: bool = False,
                frozen_from_module: bool = False) -> Layout:
    """The :class:`Layout` of the ZeRO checkpoint in ``location`` (a run folder with
    ``latest`` or a tag folder; ``names`` its files).

    ``frozen_from_module``: where the checkpoint records no frozen parameters (ZeRO-1,
    which DeepSpeed's tool returns without them), take them from the model file's
    ``module``, in the model's bit16 dtype (role ``frozen-bit16``).

    Raises
    ------
    FormatError
        Damage: a missing or extra rank file, a partition count that disagrees with the
        files, flat groups shorter than the parameters need, a model file without
        ``buffer_names``, a file that is not a ``torch.save`` ZIP.
    UnsupportedFeatureError
        Pipeline or tensor parallel files, NVMe offload, a universal checkpoint.
    UnsafeGlobalError
        A global outside torch's allowlist and DeepSpeed's classes (``structural``: stand-ins).
    """
    limits = limits or DEFAULT_LIMITS
    folder, tag, listing = tag_folder(location, names, tag, storage_options, limits)
    model_names, optim_names = rank_files(folder, listing, storage_options)
    opened: list[RankFile] = []

    def rank_file(name: str) -> RankFile:
        f = RankFile(folder, name, storage_options=storage_options, limits=limits,
                     structural=structural)
        opened.append(f)
        return f

    try:
        optims = [rank_file(n) for n in optim_names]
        stage = _dict(optims[0].object, optims[0].path).get("optimizer_state_dict", {})
        wanted = model_names if isinstance(stage, Mapping) and stage.get("zero_stage") == 3 \
            else model_names[:1]
        reading = _Reading(folder, [rank_file(n) for n in wanted], optims)
        if reading.stage == 3 and len(model_names) != reading.world_size:
            raise FormatError(f"{folder}: ZeRO-3 needs one model file per rank: "
                              f"{len(model_names)} for {reading.world_size} ranks")
        buffers = reading.buffers()
        frozen = {} if exclude_frozen else reading.frozen()
        params = reading.zero3() if reading.stage == 3 else reading.zero12()
        if frozen_from_module and not exclude_frozen \
                and reading.model.get("frozen_param_shapes") is None:
            frozen = reading.frozen_from_module(params, buffers)
        entries = {**buffers, **frozen, **params}
        excluded = tuple(reading.frozen()) if exclude_frozen else ()
        version = reading.model.get("ds_version")
        return Layout(folder, tag, reading.stage, reading.world_size, reading.optimizer,
                      version if isinstance(version, str) else None,
                      tuple(model_names), tuple(optim_names), entries,
                      reading.aliases(entries), tuple(reading.groups),
                      reading.model_dtype(buffers), excluded,
                      {f.name: f.size for f in opened})
    except PtfileError as exc:
        add_note(exc, f"reading the ZeRO checkpoint {folder}")
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise FormatError(f"{folder}: not a ZeRO checkpoint DeepSpeed wrote: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        for f in opened:
            f.close()
