"""What an input is, decided once: the :class:`Input` record every front door carries.

``load``, ``open``, ``detect_format``, ``scan``, ``inspect``, ``verify``, ``diff``,
``convert`` and the bulk walks each call :func:`resolve_input` once (or are handed its
record) and pass the record down: no layer below lists the folder or decides its kind
again, so a folder URL costs one listing.  The decision uses names and the file system's
answers only, never a checkpoint's bytes (which format a *file* is, is
:mod:`.detection`'s).

==============  ==============================================================================
kind            what it is (a folder's own files; subfolders are not looked at)
==============  ==============================================================================
``file``        one file: a local path (a missing one too), a file object, bytes
``url``         one file behind a URL
``dcp``         a torch FileSystemWriter folder: ``.metadata`` or ``__<rank>.metadata``,
                whatever else is beside it
``shards``      ``*.safetensors`` and no other checkpoint file: a HuggingFaceStorageWriter
                folder (one rank or several, consolidated or not), or a Hugging Face
                model folder in safetensors (``model.safetensors``, or shards named
                ``…-00001-of-00002.safetensors`` or listed by ``*.safetensors.index.json``)
``model``       a Hugging Face model folder in ``.bin``: ``pytorch_model.bin`` alone, or
                ``*.bin.index.json`` with the shards it names, and no other checkpoint
``trainer``     a trainer checkpoint folder (``checkpoint-500/``): model weights (either
                form above) beside parts :data:`ROLES` names (``optimizer.pt``,
                ``scheduler.pt``, ``rng_state*.pth``, ``trainer_state.json``,
                ``training_args.bin``...); any other checkpoint file in it is a part too
``zero``        a DeepSpeed ZeRO checkpoint: a tag folder (``global_step2/``: one
                optimizer file per rank, ``*zero_pp_rank_<r>_mp_rank_00_optim_states.pt``,
                and ``*mp_rank_00_model_states.pt``), or the run folder above it
                (``latest`` or ``zero_to_fp32.py``, and no other checkpoint file);
                read by :mod:`ptfile.zero`
``folder``      anything else: many files, each its own checkpoint
==============  ==============================================================================

An index file (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``) given
as the input stands for its folder's model: ``shards`` or ``model``, with only the files
its ``weight_map`` names.

The folder kinds ``shards``, ``model`` and ``trainer`` are *checkpoint sets*: one
checkpoint made of :class:`Part` s, each with a role (``model``, ``optimizer``...) and
its files.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .._io.paths import is_url, url_scheme
from ..errors import FormatError, LimitExceededError, PtfileError
from ..limits import DEFAULT_LIMITS, Limits

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "DCP_METADATA_NAME",
    "ROLES",
    "Input",
    "InputKind",
    "Part",
    "checkpoint_files",
    "detect_input",
    "folder_kind",
    "is_checkpoint_name",
    "read_index",
    "read_small",
    "resolve_input",
]

#: A DCP metadata pickle's file name: the coordinator's ``.metadata``, or a rank's own
#: ``__<rank>.metadata`` (``use_collectives=False``).
DCP_METADATA_NAME: Final = re.compile(r"\.metadata|__\d+\.metadata")
#: File names that hold checkpoints, by suffix (ASCII case ignored): what torch.save,
#: torch.jit.save, torch.export.save and pickle write under (.bin: Hugging Face; .ckpt:
#: Lightning; .tar: pre-0.4), and .safetensors.  A folder walk keeps these files.
CHECKPOINT_SUFFIXES: Final = frozenset({".pt", ".pth", ".bin", ".ckpt", ".pt2", ".tar",
                                        ".pkl", ".pickle", ".safetensors"})
_SAFETENSORS: Final = ".safetensors"
#: A shard's name as the Hugging Face writers give it: ``model-00001-of-00002.safetensors``
#: (any stem: ``diffusion_pytorch_model-…``), one per rank ``shard-00001-model-…``.
_SHARD_NAME: Final = re.compile(r"(?:shard-\d+-)?[^/]+-\d+-of-\d+\.safetensors")
_BIN_SHARD_NAME: Final = re.compile(r"[^/]+-\d+-of-\d+\.bin")
#: The index of a sharded model (``model.safetensors.index.json``).
_SHARD_INDEX: Final = re.compile(r"[^/]+\.safetensors\.index\.json")
_BIN_INDEX: Final = re.compile(r"[^/]+\.bin\.index\.json")
#: A Hugging Face model's single ``.bin`` weights file (transformers, PEFT, diffusers).
_BIN_MODEL: Final = re.compile(r"(?:pytorch_model|adapter_model|diffusion_pytorch_model)\.bin")

#: The parts of a trainer checkpoint folder besides its model, by file name: the role
#: each plays (``transformers.Trainer``, ``accelerate``).  A folder holding one of these is
#: a trainer folder.
ROLES: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("optimizer", re.compile(r"optimizer(?:_\d+)?\.(?:pt|bin|pth)")),
    ("scheduler", re.compile(r"scheduler(?:_\d+)?\.(?:pt|bin|pth)")),
    ("scaler", re.compile(r"scaler\.(?:pt|bin|pth)")),
    ("rng_state", re.compile(r"rng_state(?:_\d+)?\.pth|random_states_\d+\.pkl")),
    ("trainer_state", re.compile(r"trainer_state\.json")),
    ("training_args", re.compile(r"training_args\.bin")),
)

#: A ZeRO tag folder's rank files (:mod:`ptfile.zero.files` reads them).
_ZERO_RANK_FILE: Final = re.compile(
    r"(?:(?:bf16_|fp16_)?zero_pp_rank_\d+_)?mp_rank_\d+_(?:model|optim)_states\.pt"
    r"|layer_\d+-model_states\.pt|expp_rank_\d+_mp_rank_\d+_model_states\.pt")
#: What DeepSpeed's rank 0 writes beside the tag folders of a run folder.
_ZERO_RUN_FILES: Final = frozenset({"latest", "zero_to_fp32.py"})

#: The URL schemes whose folders cannot be listed (a listing would fetch the page).
_FLAT_SCHEMES: Final = frozenset({"http", "https"})


class InputKind(enum.Enum):
    """What an input is (:func:`resolve_input`; the module docstring's table)."""

    FILE = "file"
    URL = "url"
    DCP = "dcp"
    SHARDS = "shards"
    MODEL = "model"
    TRAINER = "trainer"
    ZERO = "zero"
    FOLDER = "folder"

    @property
    def is_folder(self) -> bool:
        """Whether the input is a folder (of whatever kind)."""
        return self not in (InputKind.FILE, InputKind.URL)

    @property
    def is_checkpoint_folder(self) -> bool:
        """Whether the input is one checkpoint that is a folder (every folder kind but
        ``folder``)."""
        return self.is_folder and self is not InputKind.FOLDER

    @property
    def is_dcp_readable(self) -> bool:
        """Whether the DCP readers read it (a FileSystemWriter or safetensors folder)."""
        return self in (InputKind.DCP, InputKind.SHARDS)


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a checkpoint set: its role and its files (names in the folder).

    ``form`` says how its files read: ``file`` (one checkpoint file), ``shards``
    (safetensors shards, read as one), ``bin-shards`` (``.bin`` shards named by
    ``index``), ``json`` (a JSON document: ``trainer_state.json``).
    """

    role: str
    files: tuple[str, ...]
    form: str = "file"
    index: str | None = None


@dataclass(frozen=True)
class Input:
    """An input, decided once (:func:`resolve_input`), carried by every layer.

    ``given`` is what the caller passed (for messages), ``location`` the path or URL
    read (a folder's, for the folder kinds), ``names`` a folder's files (its one
    listing), ``parts`` a checkpoint set's parts, ``weight_map`` an index's map of
    tensor names to shard files (``{}`` without an index).
    """

    kind: InputKind
    given: Any
    location: Any
    storage_options: Mapping[str, Any] | None = None
    names: tuple[str, ...] = ()
    parts: tuple[Part, ...] = ()
    weight_map: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_folder(self) -> bool:
        """Whether the input is a folder."""
        return self.kind.is_folder

    @property
    def is_checkpoint_folder(self) -> bool:
        """Whether the input is one checkpoint that is a folder."""
        return self.kind.is_checkpoint_folder

    @property
    def label(self) -> str:
        """The input as the user named it, for messages."""
        given = self.given
        return os.fsdecode(given) if isinstance(given, (str, bytes, os.PathLike)) \
            and not isinstance(given, bytes) else repr(given)[:80]

    def many_files(self, advice: str) -> FormatError:
        """The error of a front door that reads one checkpoint, handed a folder of many
        files (``advice``: what to do instead); a folder of DCP data files without their
        metadata is named as that."""
        if any(n.endswith(".distcp") for n in self.names):
            why = ("holds DCP data files (*.distcp) but no .metadata (nor __<rank>.metadata): "
                   "no torch.distributed.checkpoint without it")
        else:
            why = "is a folder of many files, not one checkpoint"
        return FormatError(f"{self.label!r} {why}: {advice}")

    def part(self, role: str) -> Part | None:
        """The part playing ``role`` (None when there is none)."""
        return next((p for p in self.parts if p.role == role), None)

    def path(self, name: str) -> str:
        """The path or URL of the folder's file ``name``."""
        if is_url(self.location):
            return f"{str(self.location).rstrip('/')}/{name}"
        return os.path.join(os.fspath(self.location), name)

    def alone(self, part: Part) -> Input:
        """The record of ``part`` as a checkpoint of its own (a trainer folder's model):
        ``shards`` or ``model`` by its form, its files only."""
        kind = InputKind.SHARDS if part.form == "shards" else InputKind.MODEL
        names = (*part.files, *([part.index] if part.index else ()))
        return Input(kind, self.given, self.location, self.storage_options, names, (part,),
                     self.weight_map)

    @property
    def from_index(self) -> bool:
        """Whether the input was named by its index file (``*.index.json``)."""
        return isinstance(self.given, (str, os.PathLike)) and \
            os.fsdecode(os.fspath(self.given)).endswith(".index.json")

    def files(self) -> list[str]:
        """Every file the parts name, in part order (a set's files)."""
        return [name for p in self.parts for name in (*p.files, *([p.index] if p.index else []))]


def _suffix(name: str) -> str:
    return os.path.splitext(name)[1].lower()


def is_checkpoint_name(name: str) -> bool:
    """Whether a file name is one a checkpoint is saved under (:data:`CHECKPOINT_SUFFIXES`).

    Examples
    --------
    >>> is_checkpoint_name("optimizer.pt"), is_checkpoint_name("config.json")
    (True, False)
    """
    return _suffix(name) in CHECKPOINT_SUFFIXES


def _is_checkpoint(name: str) -> bool:
    return is_checkpoint_name(name) or name.endswith(".index.json")


def _model_part(names: Sequence[str]) -> Part | None:
    """The model weights among ``names`` as one part, or None when they are not one model
    (none, several forms side by side, unrelated safetensors files)."""
    shards = [n for n in names if n.endswith(_SAFETENSORS) and len(n) > len(_SAFETENSORS)]
    st_index = [n for n in names if _SHARD_INDEX.fullmatch(n)]
    bins = [n for n in names if _BIN_MODEL.fullmatch(n) or _BIN_SHARD_NAME.fullmatch(n)]
    bin_index = [n for n in names if _BIN_INDEX.fullmatch(n)]
    if shards and not bins and not bin_index:
        # By their index, by their names, or one file alone (a model folder's
        # model.safetensors): unrelated .safetensors files (adapters) are many checkpoints.
        if len(shards) == 1 or st_index or all(_SHARD_NAME.fullmatch(n) for n in shards):
            return Part("model", tuple(shards), "shards", st_index[0] if st_index else None)
        return None
    if bins and not shards and not st_index:
        if len(bin_index) == 1:
            return Part("model", tuple(bins), "bin-shards", bin_index[0])
        if len(bins) == 1 and not bin_index:
            return Part("model", tuple(bins))
    return None


def folder_kind(names: Iterable[str]) -> InputKind:
    """What a folder holding the files ``names`` (its own, not its subfolders') is.

    Examples
    --------
    >>> folder_kind([".metadata", "__0_0.distcp"]), folder_kind(["a.txt"])
    (<InputKind.DCP: 'dcp'>, <InputKind.FOLDER: 'folder'>)
    >>> folder_kind(["model-00001-of-00001.safetensors", "model.safetensors.index.json"])
    <InputKind.SHARDS: 'shards'>
    >>> folder_kind(["pytorch_model.bin", "config.json"])
    <InputKind.MODEL: 'model'>
    >>> folder_kind(["model.safetensors", "optimizer.pt", "trainer_state.json"])
    <InputKind.TRAINER: 'trainer'>
    >>> folder_kind(["adapter.safetensors", "model.pt"])  # two checkpoints side by side
    <InputKind.FOLDER: 'folder'>
    >>> folder_kind(["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"])
    <InputKind.ZERO: 'zero'>
    >>> folder_kind(["latest", "zero_to_fp32.py"])  # the run folder above global_step2/
    <InputKind.ZERO: 'zero'>
    """
    return _classify(list(names))[0]


def checkpoint_files(names: Iterable[str]) -> tuple[InputKind, frozenset[str]]:
    """What a folder holding ``names`` is, and which of them its checkpoint reads as that
    kind: a DCP folder's metadata and ``.distcp`` files (their items, by the metadata), a
    set's parts; none for a folder of many files.  The others are strays a folder walk
    looks at one by one (:mod:`ptfile.formats.walk`).

    Examples
    --------
    >>> kind, files = checkpoint_files([".metadata", "__0_0.distcp", "extra.pt"])
    >>> kind, sorted(files)
    (<InputKind.DCP: 'dcp'>, ['.metadata', '__0_0.distcp'])
    """
    names = list(names)
    kind, parts = _classify(names)
    if kind is InputKind.DCP:
        return kind, frozenset(n for n in names if DCP_METADATA_NAME.fullmatch(n)
                               or n.endswith(".distcp"))
    if kind is InputKind.ZERO:  # a tag folder's rank files (a run folder's tags are folders)
        return kind, frozenset(n for n in names if _ZERO_RANK_FILE.fullmatch(n))
    return kind, frozenset(n for p in parts for n in (*p.files, *([p.index] if p.index else [])))


def _classify(names: list[str]) -> tuple[InputKind, tuple[Part, ...]]:
    """The kind of a folder holding ``names`` and, for a set, its parts."""
    if any(DCP_METADATA_NAME.fullmatch(n) for n in names):
        return InputKind.DCP, ()
    if _is_zero(names):
        return InputKind.ZERO, ()
    roles: list[Part] = []
    rest: list[str] = []
    for name in names:
        role = next((r for r, pattern in ROLES if pattern.fullmatch(name)), None)
        if role is not None:
            form = "json" if name.endswith(".json") else "file"
            same = [i for i, p in enumerate(roles) if p.role == role]
            # rng_state_0.pth, rng_state_1.pth...: one part per file, the rank in its role
            roles.append(Part(f"{role}_{len(same)}" if same else role, (name,), form))
        elif _is_checkpoint(name):
            rest.append(name)
    model = _model_part(rest)
    used: set[str | None] = {*model.files, model.index} if model is not None else set()
    left = [n for n in rest if n not in used]
    if not roles:  # a model alone, or many checkpoints side by side
        if model is None or left:
            return InputKind.FOLDER, ()
        return (InputKind.SHARDS if model.form == "shards" else InputKind.MODEL), (model,)
    others = tuple(Part(os.path.splitext(n)[0], (n,)) for n in left)
    return InputKind.TRAINER, (*((model,) if model else ()), *roles, *others)


def _is_zero(names: list[str]) -> bool:
    """A ZeRO tag folder (an optimizer rank file among its checkpoint files, all rank
    files), or its run folder (``latest``/``zero_to_fp32.py`` and no checkpoint file)."""
    checkpoints = [n for n in names if _is_checkpoint(n)]
    if any(n.endswith("_optim_states.pt") for n in checkpoints):
        return all(_ZERO_RANK_FILE.fullmatch(n) for n in checkpoints)
    return not checkpoints and bool(_ZERO_RUN_FILES.intersection(names))


def read_index(text: bytes, where: str, limits: Limits = DEFAULT_LIMITS) -> dict[str, str]:
    """The ``weight_map`` of a Hugging Face index (``*.index.json``): tensor name → shard
    file name in the same folder.

    Raises
    ------
    FormatError
        Not JSON, no ``weight_map`` object, or a shard that is no file name of the folder.
    LimitExceededError
        The index is larger than ``Limits.max_json_bytes``.
    """
    if len(text) > limits.max_json_bytes:
        raise LimitExceededError("max_json_bytes", limits.max_json_bytes, len(text),
                                 f"{where}: the index")
    try:
        index = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{where}: not a JSON index: {exc}") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "/" not in v and "\\" not in v
            and v not in ("", ".", "..") for k, v in weight_map.items()):
        raise FormatError(f"{where}: weight_map must map tensor names to shard file names "
                          "of the same folder")
    return weight_map


def resolve_input(f: object, storage_options: Mapping[str, Any] | None = None, *,
                  limits: Limits = DEFAULT_LIMITS) -> Input:
    """The record of the input ``f``: the one decision every front door asks.

    An :class:`Input` is returned as it is (a layer handed the record does not decide
    again).  A path that is no folder (a missing one too) is a FILE, as is anything but
    a path or URL (file objects, bytes), except an index file (module docstring).  A URL
    is listed only when it may name a folder: not ``http(s)://``, and only when its last
    component has no suffix; one the backend does not call a folder, or that it cannot
    ask about, is a URL (reading it says what is wrong).

    Raises
    ------
    FormatError
        A local folder cannot be listed, or an index file cannot be read.
    RemoteError
        A URL the backend calls a folder cannot be listed.

    Examples
    --------
    >>> resolve_input(b"PK...").kind, resolve_input("https://host/ckpt").kind
    (<InputKind.FILE: 'file'>, <InputKind.URL: 'url'>)
    """
    if isinstance(f, Input):
        return f
    from .._io.remote import local_path

    if not isinstance(f, (str, os.PathLike)):
        return Input(InputKind.FILE, f, f, storage_options)
    name = os.fsdecode(local_path(os.fspath(f)))  # type: ignore[arg-type]
    if name.endswith(".index.json"):
        return _from_index(f, name, storage_options, limits)
    if not is_url(name):
        if not os.path.isdir(name):
            return Input(InputKind.FILE, f, name if isinstance(f, str) else f, storage_options)
        from .._io.directory import local_names

        return _folder(f, name, local_names(name), storage_options, limits)
    names = _url_names(name, storage_options)
    if names is None:
        return Input(InputKind.URL, f, name, storage_options)
    return _folder(f, name.rstrip("/"), names, storage_options, limits)


def detect_input(f: object, storage_options: Mapping[str, Any] | None = None) -> InputKind:
    """The kind of the input ``f`` (:func:`resolve_input`'s ``kind``).

    Examples
    --------
    >>> detect_input(b"PK..."), detect_input("none.pt")
    (<InputKind.FILE: 'file'>, <InputKind.FILE: 'file'>)
    """
    return resolve_input(f, storage_options).kind


def _folder(given: object, location: str, names: list[str],
            storage_options: Mapping[str, Any] | None, limits: Limits) -> Input:
    kind, parts = _classify(names)
    record = Input(kind, given, location, storage_options, tuple(names), parts)
    model = record.part("model")
    if model is None or model.index is None:
        return record
    weight_map = read_index(read_small(record.path(model.index), storage_options, limits),
                            record.path(model.index), limits)
    return Input(kind, given, location, storage_options, tuple(names), parts, weight_map)


def _from_index(given: object, name: str, storage_options: Mapping[str, Any] | None,
                limits: Limits) -> Input:
    """An index file as the input: its folder's model, the files it names."""
    folder, _, index = name.rstrip("/").rpartition("/" if is_url(name) else os.sep)
    folder = folder or "."
    where = name
    weight_map = read_index(read_small(name, storage_options, limits), where, limits)
    shards = tuple(dict.fromkeys(weight_map.values()))
    st = _SHARD_INDEX.fullmatch(index) is not None
    if not st and not _BIN_INDEX.fullmatch(index):
        raise FormatError(f"{where}: an index names .safetensors or .bin shards "
                          "(model.safetensors.index.json, pytorch_model.bin.index.json)")
    part = Part("model", shards, "shards" if st else "bin-shards", index)
    return Input(InputKind.SHARDS if st else InputKind.MODEL, given, folder, storage_options,
                 (*shards, index), (part,), weight_map)


def read_small(path: str, storage_options: Mapping[str, Any] | None, limits: Limits,
               what: str = "the index") -> bytes:
    """The bytes of a small file of a checkpoint folder (an index, ``trainer_state.json``,
    DeepSpeed's ``latest``), path or URL, refusing one over ``Limits.max_json_bytes``
    before reading it.

    Raises
    ------
    FormatError
        The file is missing or cannot be read.
    LimitExceededError
        It is larger than ``Limits.max_json_bytes``.
    """
    from .._io.remote import open_any

    try:
        source = open_any(path, storage_options=storage_options, limits=limits, lazy=True)
    except FileNotFoundError as exc:
        raise FormatError(f"{path}: {what} is missing") from exc
    except OSError as exc:
        raise FormatError(f"{path}: {what} cannot be read: {exc}") from exc
    try:
        if source.size > limits.max_json_bytes:
            raise LimitExceededError("max_json_bytes", limits.max_json_bytes, source.size,
                                     f"{path}: {what}")
        return bytes(source.pread(0, source.size, what))
    finally:
        source.close()


def _url_names(url: str, storage_options: Mapping[str, Any] | None) -> list[str] | None:
    """The file names of the folder ``url`` names, asked only when its last component has
    no suffix (:func:`url_folder_names`); None otherwise."""
    if "." in url.rstrip("/").rsplit("/", 1)[-1]:
        return None
    return url_folder_names(url, storage_options)


def url_folder_names(url: str, storage_options: Mapping[str, Any] | None) -> list[str] | None:
    """The file names of the folder ``url`` names, or None when it names none (nothing
    there, a file, a flat scheme such as ``https://``, or a backend that cannot say): one
    listing request, whose answer is the folder's listing (a listing of a file's own URL
    gives that file).

    Examples
    --------
    >>> url_folder_names("https://host/models/", None) is None
    True
    """
    from .._io.directory import file_names
    from .._io.remote import filesystem

    if url_scheme(url) in _FLAT_SCHEMES:
        return None
    try:
        fs, path = filesystem(url, storage_options)
        entries = fs.ls(path, detail=True)
    except PtfileError:
        return None
    except Exception:  # noqa: BLE001 (fsspec or a backend missing or failing: the file path says so)
        return None
    key = path.rstrip("/")
    if not entries or any(str(e.get("name", "")).rstrip("/") == key for e in entries):
        return None  # nothing there, or the URL names a file
    return file_names(entries)
