"""The walk of a folder as torch sees it: every regular file a loader could read, whatever
its name or folder.

``torch.load`` opens any path and decides by the bytes (and the ``.safetensors`` name):
it cares nothing for dot-folders (``.cache/model.pt``), suffixes (``model.weights``,
``pytorch_model.bin.1``) or what sits beside a checkpoint.  :func:`walk_tree` therefore
looks at every regular file under a folder, local or behind an fsspec URL:

* a file named as a checkpoint (:data:`~ptfile.formats.inputs.CHECKPOINT_SUFFIXES`) is
  kept unread (its reader says what it is, or that it is damaged);
* any other file is kept when :func:`~ptfile.formats.detection.loader_of` says one of
  torch's loaders reads its first :data:`~ptfile.formats.detection.SNIFF_BYTES` bytes
  (ZIP, legacy stream, a tar ``tarfile`` accepts, a pickle that reaches code); the rest
  are *skipped*, and listed in :attr:`Tree.skipped`;
* a checkpoint folder (:func:`~ptfile.formats.inputs.checkpoint_files`: a DCP folder, a
  sharded or ``.bin`` model, a trainer folder) is one input in :attr:`Tree.folders`, read
  as its kind.  With ``inside`` (``scan``) its other files and its subfolders are walked
  as everywhere else: a payload beside a DCP ``.metadata`` or in ``checkpoint-500/sub/``
  is found.  Without (``inspect``, ``verify``, ``convert``: the checkpoint is the
  question, not its strays) the walk does not enter it;
* symlinks are followed, to files and folders; a file whose real path leaves the root is
  kept with that path in :attr:`Found.target`; a folder reached a second time (a link
  loop, or two links to one folder) is walked once and listed in :attr:`Tree.repeated`;
  FIFOs, sockets and devices are never opened;
* ``exclude`` globs (``fnmatch``, matched against the path relative to the root and
  against the name: ``.git``, ``*.txt``, ``data/*``) leave files and whole folders out,
  unread and unlisted: the explicit way out.

Remote folders (an fsspec listing) have no links; the first bytes of the files to sniff are
fetched in one batch (``cat_ranges``) where the backend can.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .detection import SNIFF_BYTES, loader_of
from .inputs import InputKind, checkpoint_files, is_checkpoint_name

__all__ = ["Found", "Tree", "loadable", "walk_tree"]


@dataclass(frozen=True, slots=True)
class Found:
    """A file a loader could read: its path under the root (through any links) and, when
    its real path leaves the root, that path."""

    path: str
    target: str | None = None


@dataclass(frozen=True)
class Tree:
    """What :func:`walk_tree` found under a root."""

    #: Checkpoint folders, each one input read as its kind.
    folders: tuple[str, ...] = ()
    #: Files a loader could read (outside the checkpoint folders' own files).
    files: tuple[Found, ...] = ()
    #: Files no loader reads.
    skipped: tuple[str, ...] = ()
    #: Folders reached again through a link, walked once.
    repeated: tuple[str, ...] = ()

    def paths(self) -> list[str]:
        """The inputs: checkpoint folders and files."""
        return [*self.folders, *(f.path for f in self.files)]


@dataclass
class _Walk:
    exclude: Sequence[str]
    inside: bool
    folders: list[str] = field(default_factory=list)
    files: list[Found] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    repeated: list[str] = field(default_factory=list)

    def excluded(self, relative: str, name: str) -> bool:
        return any(fnmatch.fnmatchcase(relative, g) or fnmatch.fnmatchcase(name, g)
                   for g in self.exclude)

    def tree(self) -> Tree:
        return Tree(tuple(self.folders), tuple(self.files), tuple(self.skipped),
                    tuple(self.repeated))

    def folder(self, path: str, names: Iterable[str]) -> tuple[bool, frozenset[str]]:
        """Note ``path`` when it is a checkpoint folder: whether to walk on into it, and
        the names its checkpoint reads."""
        kind, own = checkpoint_files(names)
        if kind is InputKind.FOLDER:
            return True, frozenset()
        self.folders.append(path)
        return self.inside, own


def walk_tree(root: str, exclude: Sequence[str] = (), *, inside: bool = True,
              storage_options: Mapping[str, Any] | None = None) -> Tree:
    """The checkpoint folders, readable files and skipped files under ``root`` (a local
    folder or a folder URL), sorted (module docstring).

    Raises
    ------
    RemoteError
        A URL folder cannot be listed.

    Examples
    --------
    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> for name, data in {".cache/m.weights": b"PK\\x03\\x04" + bytes(40),
    ...                    "a.pt": b"", "README.md": b"# hello\\n"}.items():
    ...     os.makedirs(os.path.dirname(os.path.join(tmp.name, name)), exist_ok=True)
    ...     with open(os.path.join(tmp.name, name), "wb") as fp:
    ...         _ = fp.write(data)
    >>> tree = walk_tree(tmp.name)
    >>> [os.path.relpath(p, tmp.name) for p in tree.paths()]
    ['.cache/m.weights', 'a.pt']
    >>> [os.path.relpath(p, tmp.name) for p in tree.skipped]
    ['README.md']
    >>> tmp.cleanup()
    """
    from .._io.paths import is_url

    walk = _Walk(tuple(exclude), inside)
    if is_url(root):
        _walk_remote(walk, root, storage_options)
    else:
        _walk_local(walk, root)
    walk.folders.sort()
    walk.files.sort(key=lambda f: f.path)
    walk.skipped.sort()
    return walk.tree()


def _walk_local(walk: _Walk, root: str) -> None:
    real_root = os.path.realpath(root)
    seen: set[tuple[int, int]] = set()
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            st = os.stat(folder)
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            continue  # unreadable or vanished: nothing a loader reads either
        if (st.st_dev, st.st_ino) in seen:
            walk.repeated.append(folder)
            continue
        seen.add((st.st_dev, st.st_ino))
        files, dirs = [], []
        for entry in entries:
            if walk.excluded(os.path.relpath(entry.path, root).replace(os.sep, "/"),
                             entry.name):
                continue
            mode = _mode(entry)
            if stat.S_ISREG(mode):
                files.append(entry)
            elif stat.S_ISDIR(mode):
                dirs.append(os.path.normpath(entry.path))  # "./x" of a walk of "." is "x"
        enter, own = walk.folder(folder, (e.name for e in files))
        if not enter:
            continue
        for entry in files:
            if entry.name not in own:
                _look(walk, os.path.normpath(entry.path), entry.name, real_root)
        pending.extend(reversed(dirs))


def _mode(entry: os.DirEntry[str]) -> int:
    """The mode of what ``entry`` names, through a link (0: a broken link)."""
    try:
        return entry.stat().st_mode
    except OSError:
        return 0


def loadable(path: str, name: str | None = None) -> bool | None:
    """Whether the local file ``path`` (named ``name``, its base name by default) is one a
    walk keeps: named as a checkpoint (not read), or one of torch's loaders reads its first
    :data:`~.detection.SNIFF_BYTES` (:func:`~.detection.loader_of`); None when it cannot be
    read to say."""
    name = os.path.basename(path) if name is None else name
    if is_checkpoint_name(name):
        return True
    try:
        with open(path, "rb") as fp:
            head = fp.read(SNIFF_BYTES)
            size = os.fstat(fp.fileno()).st_size
    except OSError:
        return None
    return loader_of(head, name, size) is not None


def _look(walk: _Walk, path: str, name: str, real_root: str) -> None:
    """Keep ``path`` when it is named as a checkpoint or a loader reads it; else skip it."""
    if not loadable(path, name):
        walk.skipped.append(path)
        return
    real = os.path.realpath(path)
    inside = real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)
    walk.files.append(Found(path, None if inside else real))


def _walk_remote(walk: _Walk, root: str, storage_options: Mapping[str, Any] | None) -> None:
    from .._io.remote import filesystem
    from ..errors import RemoteError

    fs, path = filesystem(root, storage_options)
    path = path.rstrip("/")
    try:
        listing = fs.find(path, detail=True)
    except (OSError, ValueError) as exc:
        raise RemoteError(f"{root}: cannot list: {type(exc).__name__}: {exc}",
                          url=root) from exc
    sizes = {p: int(info.get("size") or 0) for p, info in listing.items()
             if info.get("type") != "directory"
             and not walk.excluded(p[len(path) + 1:], p.rpartition("/")[2])
             and not any(walk.excluded(d, d.rpartition("/")[2])
                         for d in _parents(p[len(path) + 1:]))}
    by_folder: dict[str, list[str]] = {}
    for p in sizes:
        folder, _, name = p.rpartition("/")
        by_folder.setdefault(folder, []).append(name)
    closed: list[str] = []  # checkpoint folders not walked into
    sniff: list[str] = []
    for folder in sorted(by_folder):
        if any(folder == c or folder.startswith(c + "/") for c in closed):
            continue
        enter, own = walk.folder(fs.unstrip_protocol(folder), by_folder[folder])
        if not enter:
            closed.append(folder)
            continue
        for name in by_folder[folder]:
            if name in own:
                continue
            full = f"{folder}/{name}"
            if is_checkpoint_name(name):
                walk.files.append(Found(fs.unstrip_protocol(full)))
            else:
                sniff.append(full)
    sniff = [p for p in sniff if not any(p.startswith(c + "/") for c in closed)]
    for p, head in zip(sniff, _heads(fs, sniff), strict=True):
        readable = head is not None and loader_of(head, p.rpartition("/")[2], sizes[p])
        (walk.files.append(Found(fs.unstrip_protocol(p))) if readable
         else walk.skipped.append(fs.unstrip_protocol(p)))


def _parents(relative: str) -> list[str]:
    """The folders of a relative path (``a``, ``a/b`` for ``a/b/c``)."""
    parts = relative.split("/")[:-1]
    return ["/".join(parts[:i + 1]) for i in range(len(parts))]


def _heads(fs: Any, paths: list[str]) -> list[bytes | None]:
    """The first :data:`SNIFF_BYTES` of each remote file, in one batch where the backend
    can (None: it cannot be read)."""
    if not paths:
        return []
    fetch: Callable[[], list[Any]] = lambda: fs.cat_ranges(  # noqa: E731
        paths, [0] * len(paths), [SNIFF_BYTES] * len(paths), on_error="return")
    try:
        got = fetch()
    except (AttributeError, NotImplementedError, TypeError, OSError, ValueError):
        got = []
        for p in paths:
            try:
                got.append(fs.cat_file(p, start=0, end=SNIFF_BYTES))
            except (OSError, ValueError) as exc:
                got.append(exc)
    return [bytes(h) if isinstance(h, (bytes, bytearray)) else None for h in got]
