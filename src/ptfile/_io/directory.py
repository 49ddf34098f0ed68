"""The files of a DCP checkpoint directory, local or behind an fsspec URL, read by range.

A ``torch.distributed.checkpoint`` directory is a flat set of files: ``.metadata`` (or
``__<rank>.metadata``), ``__<rank>_<n>.distcp`` data files, or, for the HuggingFace writer,
``*.safetensors`` and ``model.safetensors.index.json``.  :class:`DirectoryFiles` gives every
reader above one way to list them and read byte ranges of them:

* a local directory: each data file is mapped read-only on its first read (an empty file
  is ``b""``: it cannot be mapped), and reads are views of the map;
* a URL (``s3://bucket/ckpt``, ``https://…``…): each file is a
  :class:`~ptfile._io.remote.RemoteSource`, so a read fetches only its range.

Only names of the directory itself are read: a name with a path separator, ``.`` or
``..`` is refused, so metadata cannot point outside the checkpoint.  Whether an input *is* such a directory is
decided elsewhere, once (:func:`ptfile.formats.detection.detect_input`).  ``opened`` and
``bytes_read`` record what was read, which the tests use to show that a lazy read touches
only the chunks it needs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import FormatError, PtfileError, RemoteError
from ..limits import DEFAULT_LIMITS, Limits
from .local import MmapSource, Source
from .paths import is_url
from .remote import RemoteSource, filesystem, local_path

__all__ = ["DirectoryFiles", "file_names", "local_names", "remote_names"]


def local_names(folder: str) -> list[str]:
    """The file names of the local folder ``folder``, sorted (subfolders left out).

    Raises
    ------
    FormatError
        The folder cannot be listed.
    """
    try:
        with os.scandir(folder) as entries:
            return sorted(e.name for e in entries if e.is_file())
    except OSError as exc:
        raise FormatError(f"{folder!r} cannot be listed: {exc}") from exc


def remote_names(fs: Any, path: str, url: str) -> list[str]:
    """The file names of the folder ``path`` of the fsspec filesystem ``fs`` (the URL
    ``url``), sorted (subfolders left out).

    Raises
    ------
    RemoteError
        The backend cannot list it.
    """
    try:
        entries = fs.ls(path, detail=True)
    except PtfileError:
        raise
    except Exception as exc:
        raise RemoteError(f"{url}: cannot list the directory: {exc}", url=url) from exc
    return file_names(entries)


def file_names(entries: list[dict[str, Any]]) -> list[str]:
    """The names of the files among an fsspec listing's ``entries`` (detail form), sorted
    (subfolders left out)."""
    return sorted(str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries
                  if e.get("type") == "file")


class DirectoryFiles:
    """A checkpoint directory's files: listed once (or given: ``names``, the listing of
    the input's record, :mod:`ptfile.formats.inputs`), each opened on its first read."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 storage_options: Mapping[str, Any] | None = None,
                 limits: Limits = DEFAULT_LIMITS, names: Sequence[str] | None = None) -> None:
        name = os.fspath(directory)
        self.is_remote = is_url(local_path(name))
        self.directory = name.rstrip("/") if self.is_remote else str(local_path(name))
        self._options = storage_options
        self._limits = limits
        self._open: dict[str, Source] = {}
        #: Names of the files whose bytes were read, and how many bytes in all.
        self.opened: set[str] = set()
        self.bytes_read = 0
        #: What readers above cache per checkpoint (safetensors headers...), by their keys.
        self.memo: dict[Any, Any] = {}
        #: The listing: the one the input's record carries (``names``), else listed now.
        self._names = sorted(names) if names is not None else self._list()

    def _list(self) -> list[str]:
        if not self.is_remote:
            if not os.path.isdir(self.directory):
                raise FormatError(f"{self.directory!r} is not a directory: "
                                  "a DCP checkpoint is one")
            return local_names(self.directory)
        fs, path = filesystem(self.directory, self._options)
        try:
            if not fs.isdir(path):
                raise FormatError(f"{self.directory!r} is not a directory: "
                                  "a DCP checkpoint is one")
        except PtfileError:
            raise
        except Exception as exc:
            raise RemoteError(f"{self.directory}: cannot list the directory: {exc}",
                              url=self.directory) from exc
        return remote_names(fs, path, self.directory)

    @property
    def bytes_fetched(self) -> int:
        """For a URL: the bytes the server sent so far (range reads of every file opened)."""
        return sum(f.bytes_fetched for f in self._open.values())

    def names(self) -> list[str]:
        """The directory's file names, sorted (subdirectories left out)."""
        return list(self._names)

    def has(self, name: str) -> bool:
        """Whether the directory holds a file ``name``."""
        return name in self._names

    def _checked(self, name: str, what: str) -> str:
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise FormatError(f"{what} names the file {name!r}, not one in the directory")
        if name not in self._names:
            raise FormatError(f"DCP checkpoint file {name!r} ({what}) is missing from "
                              f"{self.directory!r}")
        return name

    def _file(self, name: str, what: str) -> Source:
        found = self._open.get(name)
        if found is None:
            self._checked(name, what)
            found = self._open[name] = self._open_file(name)
            self.opened.add(name)
        return found

    def _open_file(self, name: str) -> Source:
        if self.is_remote:
            return RemoteSource(f"{self.directory}/{name}", self._options, limits=self._limits)
        path = os.path.join(self.directory, name)
        try:  # mapped read-only, without a descriptor of its own: a folder may hold many
            return MmapSource(path, "r", descriptor=False)
        except FileNotFoundError as exc:
            raise FormatError(f"DCP checkpoint file {path!r} is missing") from exc
        except OSError as exc:
            raise FormatError(f"DCP checkpoint file {path!r} cannot be read: {exc}") from exc

    def size(self, name: str, what: str = "a file") -> int:
        """The byte size of the file ``name``."""
        return self._file(name, what).size

    def read(self, name: str, offset: int, n: int, what: str) -> bytes | memoryview:
        """Bytes ``[offset, offset + n)`` of ``name``, checked to lie inside the file."""
        data = self._file(name, what)
        if offset < 0 or n < 0 or offset + n > data.size:
            raise FormatError(f"{what} at [{offset}, {offset + n}) lies outside "
                              f"{name!r} ({data.size} bytes)")
        self.bytes_read += n
        if not n:
            return b""
        return data.pread(offset, n, what) if data.reads_on_demand else \
            data.view(offset, n, what)

    def read_whole(self, name: str, what: str) -> bytes:
        """The whole file ``name`` (a small one: metadata, an index)."""
        return bytes(self.read(name, 0, self.size(name, what), what))

    def close(self) -> None:
        """Close every file opened (views handed out must be released first)."""
        for data in self._open.values():
            data.close()  # a map stays while a view of it lives (a lazy reader's array)
        self._open.clear()

    def __enter__(self) -> DirectoryFiles:  # noqa: PYI034 (typing.Self is 3.11+)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
