"""Readers of checkpoint sets: a Hugging Face ``.bin`` model folder and a trainer folder.

A set is one checkpoint made of parts (:class:`~ptfile.formats.inputs.Part`), each read
by the reader of its form:

=============  ==========================================================================
form           reader
=============  ==========================================================================
``file``       :func:`ptfile.reader.open` (a ``CheckpointReader``)
``shards``     the DCP readers' safetensors view (:func:`ptfile.dcp.reader.open_dcp`
               over the part's files only)
``bin-shards`` :class:`ShardedReader`: one ``CheckpointReader`` per ``.bin`` shard, the
               names in the index's order
``json``       the JSON document itself, a value of the set (``trainer_state.json``)
=============  ==========================================================================

Names.  A set of one part (``model``, ``shards``) is named as its part: the state
dict's names.  A trainer folder's names start with the part's role: ``model.<name>``,
``optimizer.state.0.exp_avg``, ``trainer_state.global_step``; its :attr:`SetReader.object`
is ``{role: part object}``, which :func:`ptfile.model.tree.flatten` names the same way.

Policies.  Each part is read under the caller's policy, except two roles whose content is
known: ``rng_state`` parts (numpy's RNG state beside torch's) are read with
:data:`ptfile.NUMPY_GLOBALS` added, as data; ``training_args`` (a pickled
``TrainingArguments``, a class outside any allowlist) is read structurally: inert
stand-ins, nothing imported or called.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, NamedTuple, TypeVar

import numpy as np

from ..errors import FormatError, PtfileError, add_note
from ..formats import Format
from ..formats.inputs import Input, InputKind, Part, read_small
from ..limits import DEFAULT_LIMITS, Limits
from ..model.tensor import Tensor
from ..reader import CheckpointReader, TensorInfo, TensorReader
from ..reader import open as open_file

__all__ = ["Route", "SetReader", "ShardedReader", "open_part", "open_set", "part_policy",
           "read_json", "role_of", "role_policy"]

_T = TypeVar("_T")

#: Roles read structurally whatever the caller's policy (module docstring).
STRUCTURAL_ROLES: Final = frozenset({"training_args"})
#: Roles read with :data:`ptfile.NUMPY_GLOBALS` added.
NUMPY_ROLES: Final = frozenset({"rng_state"})


def role_of(part: Part) -> str:
    """A part's role without its rank (``rng_state_1`` → ``rng_state``)."""
    base, _, rank = part.role.rpartition("_")
    return base if rank.isdigit() and base else part.role


class Route(NamedTuple):
    """Where a set's tensor is: the reader holding it, its name there, and the file (or
    part) that reader reads, which keys its storages apart from other files'."""

    reader: Any
    name: str
    file: str


class _Merged(TensorReader):
    """Tensors of several readers under one set of names: ``routes`` maps each name to
    its :class:`Route`."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self._names = self._routes = routes

    def __getitem__(self, name: str) -> Tensor:
        ck, inner, _ = self._routes[name]
        return ck[inner]  # type: ignore[no-any-return]

    def _route(self, name: str) -> Route:
        found = self._routes.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def get_tensor(self, name: str) -> np.ndarray[Any, Any]:
        """The tensor ``name`` as a numpy array (its part's reader reads it)."""
        ck, inner, _ = self._route(name)
        return ck.get_tensor(inner)  # type: ignore[no-any-return]

    def get_slice(self, name: str) -> Any:
        """A lazy slice of the tensor ``name``."""
        ck, inner, _ = self._route(name)
        return ck.get_slice(inner)

    def info(self, name: str) -> TensorInfo:
        """The tensor's metadata, named as in the set, its storage keyed by its file."""
        ck, inner, file = self._route(name)
        return _renamed(ck.info(inner), name, file)

    def _gathered(self, table: Callable[[Any], Mapping[str, _T]]
                  ) -> Iterator[tuple[str, Route, _T]]:
        """Each name with its route and what ``table`` (asked once per reader, for all of
        that reader's names) gives for it."""
        tables: dict[int, Mapping[str, _T]] = {}
        for name, route in self._routes.items():
            found = tables.get(id(route.reader))
            if found is None:
                found = tables[id(route.reader)] = table(route.reader)
            yield name, route, found[route.name]

    def infos(self) -> Iterator[TensorInfo]:
        """Every tensor's metadata, in name order."""
        for name, route, info in self._gathered(lambda ck: {t.name: t for t in ck.infos()}):
            yield _renamed(info, name, route.file)

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor without data, by set name."""
        return {name: t for name, _, t in self._gathered(lambda ck: ck.tensors())}

    def load_tensors(self) -> dict[str, Tensor]:
        """Every tensor with its data (ties inside one part kept)."""
        return {name: t for name, _, t in self._gathered(lambda ck: ck.load_tensors())}


def _renamed(info: TensorInfo, name: str, file: str) -> TensorInfo:
    key = info.storage_key
    return info._replace(name=name, storage_key=None if key is None else
                         (f"{file}:{key}" if file else key))


class ShardedReader(_Merged):
    """A model in ``.bin`` shards: one :class:`CheckpointReader` per shard, the names in
    the index's order (a name the index lists that its shard lacks is damage)."""

    def __init__(self, record: Input, part: Part, *, mmap: bool, limits: Limits,
                 structural: bool) -> None:
        self.readers: dict[str, CheckpointReader] = {}
        try:
            for shard in part.files:
                self.readers[shard] = open_file(
                    record.path(shard), mmap=mmap, limits=limits,
                    storage_options=record.storage_options, structural=structural)
            routes: dict[str, Route] = {}
            for name, shard in record.weight_map.items():
                if name not in self.readers[shard]:
                    raise FormatError(f"{record.path(part.index or '')}: the index puts "
                                      f"{name!r} in {shard}, which does not hold it")
                routes[name] = Route(self.readers[shard], name, shard)
            for shard, ck in self.readers.items():  # names a shard holds beyond the index
                for name in ck:
                    routes.setdefault(name, Route(ck, name, shard))
        except BaseException:
            self.close()
            raise
        super().__init__(routes)

    format: Format = Format.SET

    @property
    def object(self) -> dict[str, Tensor]:
        """The merged state dict (tensors without data)."""
        return self.tensors()

    def metadata(self) -> dict[str, str]:
        """The shards, as strings."""
        return {"format": "bin shards", "shards": str(len(self.readers)),
                "files": ", ".join(self.readers)}

    @property
    def source_size(self) -> int:
        """Bytes of every shard."""
        return sum(ck.source_size for ck in self.readers.values())

    def close(self) -> None:
        """Close every shard."""
        for ck in self.readers.values():
            ck.close()


def open_part(record: Input, part: Part, *, mmap: bool = True, limits: Limits | None = None,
              structural: bool = False) -> Any:
    """The reader of one part (module docstring's table); a ``json`` part's value.

    Raises
    ------
    FormatError, UnsafeGlobalError, LimitExceededError, UnsupportedFeatureError
        As :func:`ptfile.open` for the part's files.
    """
    limits = limits or DEFAULT_LIMITS
    role, structural = part_policy(part, structural)
    if part.form == "json":
        return read_json(record, part.files[0], limits)
    if part.form == "shards":  # the DCP readers', over the part's files alone
        from ..dcp.reader import open_dcp

        return open_dcp(record.alone(part), limits=limits, structural=structural,
                        label="safetensors shards")
    if part.form == "bin-shards":
        return ShardedReader(record, part, mmap=mmap, limits=limits, structural=structural)
    with role_policy(role):
        return open_file(record.path(part.files[0]), mmap=mmap, limits=limits,
                         storage_options=record.storage_options, structural=structural)


def part_policy(part: Part, structural: bool) -> tuple[str, bool]:
    """A part's role (its rank aside) and whether it is read structurally: as the caller
    asks, or by its role (:data:`STRUCTURAL_ROLES`)."""
    role = role_of(part)
    return role, structural or role in STRUCTURAL_ROLES


@contextlib.contextmanager
def role_policy(role: str) -> Iterator[None]:
    if role not in NUMPY_ROLES:
        yield
        return
    from ..allowlist.policy import NUMPY_GLOBALS, safe_globals

    with safe_globals(NUMPY_GLOBALS):
        yield


def read_json(record: Input, name: str, limits: Limits) -> Any:
    """A JSON part of a set (``trainer_state.json``), bounded as every small file of a
    checkpoint folder is (:func:`~ptfile.formats.inputs.read_small`).

    Raises
    ------
    FormatError, LimitExceededError
        Missing, unreadable, too large or not JSON.
    """
    text = read_small(record.path(name), record.storage_options, limits, name)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{record.path(name)}: not JSON: {exc}") from exc


class SetReader(_Merged):
    """A checkpoint set opened part by part (module docstring): a read-only
    ``Mapping[str, Tensor]`` over every part's tensors, with the reader API
    (``info``, ``get_tensor``, ``get_slice``, ``metadata``, ``object``)."""

    format: Format = Format.SET

    def __init__(self, record: Input, parts: dict[str, Any]) -> None:
        self.record = record
        self.parts = parts
        prefixed = record.kind is InputKind.TRAINER
        routes: dict[str, Route] = {}
        for part in record.parts:
            ck = parts.get(part.role)
            if isinstance(ck, ShardedReader):  # its routes name each shard
                for name, route in ck._routes.items():
                    routes[f"{part.role}.{name}" if prefixed else name] = route
            elif isinstance(ck, Mapping) and hasattr(ck, "info"):
                file = part.files[0] if len(part.files) == 1 else part.role
                for name in ck:
                    routes[f"{part.role}.{name}" if prefixed else name] = Route(ck, name, file)
        super().__init__(routes)

    @property
    def object(self) -> Any:
        """A one-part set's object; a trainer folder's ``{role: part object}``."""
        objects = {role: getattr(ck, "object", ck) for role, ck in self.parts.items()}
        if self.record.kind is not InputKind.TRAINER and len(objects) == 1:
            return next(iter(objects.values()))
        return objects

    def readers(self) -> list[tuple[str, Any]]:
        """Every reader of the set with the file it reads (a part's role where it reads
        several): ``.bin`` shards one by one; JSON parts have none."""
        out: list[tuple[str, Any]] = []
        for part in self.record.parts:
            ck = self.parts.get(part.role)
            if isinstance(ck, ShardedReader):
                out += list(ck.readers.items())
            elif ck is not None and hasattr(ck, "info"):
                out.append((part.files[0] if len(part.files) == 1 else part.role, ck))
        return out

    def metadata(self) -> dict[str, str]:
        """The set's kind, its parts (role: files) and file count, as strings."""
        meta = {"format": self.record.kind.value, "parts": str(len(self.record.parts)),
                "files": str(len(self.record.files()))}
        for part in self.record.parts:
            meta[f"part.{part.role}"] = ", ".join(part.files)
        return meta

    @property
    def source_size(self) -> int:
        """Bytes of the parts' files read so far (each part's own measure)."""
        return sum(ck.source_size for ck in self.parts.values() if hasattr(ck, "source_size"))

    def close(self) -> None:
        """Close every part."""
        for ck in self.parts.values():
            close = getattr(ck, "close", None)
            if callable(close):
                close()

    def __repr__(self) -> str:
        return f"<SetReader {self.record.label!r} {self.record.kind.value} {len(self)} tensors>"


def open_set(record: Input, *, mmap: bool = True, limits: Limits | None = None,
             structural: bool = False, roles: Callable[[Part], bool] | None = None) -> SetReader:
    """Open every part of the set ``record`` (those ``roles`` keeps, when given).

    Raises
    ------
    FormatError
        ``record`` is no checkpoint set; or as :func:`open_part`, the message naming the
        part's file.
    """
    if not record.is_checkpoint_folder or record.kind is InputKind.DCP:
        raise FormatError(f"{record.label!r} is not a checkpoint set ({record.kind.value})")
    parts: dict[str, Any] = {}
    try:
        for part in record.parts:
            if roles is not None and not roles(part):
                continue
            try:
                parts[part.role] = open_part(record, part, mmap=mmap, limits=limits,
                                             structural=structural)
            except PtfileError as exc:
                add_note(exc, f"in the {part.role} part of {record.label} "
                         f"({', '.join(part.files)})")
                raise
    except BaseException:
        for ck in parts.values():
            close = getattr(ck, "close", None)
            if callable(close):
                close()
        raise
    return SetReader(record, parts)
