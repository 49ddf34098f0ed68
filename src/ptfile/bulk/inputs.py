"""Which files the inputs name (globs, directories, URL prefixes), and where each
converted file goes.

A directory or prefix is walked by :func:`ptfile.formats.walk.walk_tree`, torch's way:
every regular file, dot-folders included, kept when it is named as a checkpoint or one of
torch's loaders reads its first bytes; a checkpoint folder (a DCP folder of either writer,
a sharded model folder, a trainer folder) is one input.  ``scan`` (``inside``) also walks
the insides of checkpoint folders (their strays and subfolders, each its own input);
``inspect``, ``verify`` and ``convert`` do not enter them.  :func:`walk` returns the
skipped files and the links leaving the root beside the inputs."""

from __future__ import annotations

import glob as globbing
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .._io.paths import is_url, url_scheme
from .._io.remote import StorageOptions, filesystem
from ..errors import RemoteError
from ..formats.detection import CHECKPOINT_SUFFIXES, InputKind, detect_input
from ..formats.walk import Found, Tree, walk_tree

__all__ = ["CHECKPOINT_SUFFIXES", "OUTPUT_SUFFIXES", "Expansion", "as_items", "expand", "expands",
           "has_magic", "output_for", "outputs", "walk"]

#: Schemes whose URLs have no folders to probe (a probe would be a GET of the page).
_FLAT_SCHEMES: Final = frozenset({"http", "https"})
#: The output suffix per conversion kind.
OUTPUT_SUFFIXES: Final = {"safetensors": ".safetensors", "npz": ".npz", "pt": ".pt"}


def has_magic(text: str) -> bool:
    return any(c in text for c in "*?[")


def _suffix(name: str) -> str:
    return os.path.splitext(name.rstrip("/"))[1].lower()


def _expand_local(item: str, exclude: Sequence[str], inside: bool) -> Tree:
    if has_magic(item):
        return Tree(files=tuple(Found(p) for p in globbing.glob(item, recursive=True)
                                if os.path.isfile(p)))
    if os.path.isdir(item):
        return walk_tree(os.path.normpath(item), exclude, inside=inside)
    return Tree(files=(Found(os.path.normpath(item)),))


def _expand_url(item: str, storage_options: StorageOptions, exclude: Sequence[str],
                inside: bool) -> Tree:
    fs, path = filesystem(item, storage_options)
    try:
        if has_magic(path):
            matched = fs.glob(path, detail=True)
            return Tree(files=tuple(Found(fs.unstrip_protocol(p)) for p, info in matched.items()
                                    if info.get("type") != "directory"))
        if not (url_scheme(item) not in _FLAT_SCHEMES and (
                item.endswith("/") or _suffix(path) not in CHECKPOINT_SUFFIXES)
                and fs.isdir(path)):
            return Tree(files=(Found(item),))
    except (OSError, ValueError) as exc:  # fsspec's listing errors: not found, denied, bad bucket
        raise RemoteError(f"{item}: cannot list: {type(exc).__name__}: {exc}", url=item) from exc
    return walk_tree(fs.unstrip_protocol(path.rstrip("/")), exclude, inside=inside,
                     storage_options=storage_options)


@dataclass(frozen=True)
class Expansion:
    """What the inputs name: ``files`` (files and checkpoint folders, sorted, each once),
    the ``skipped`` files no loader reads, the files whose real path leaves the folder
    that named them (``outside``: path → real path), and the folders reached again through
    links (``repeated``)."""

    files: list[str]
    skipped: list[str]
    outside: dict[str, str]
    repeated: list[str]


def walk(inputs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | Expansion,
         storage_options: StorageOptions = None, *, exclude: Sequence[str] = (),
         inside: bool = False) -> Expansion:
    """:func:`expand`, with what the walks skipped and found outside their folders.

    Raises
    ------
    RemoteError
        A URL pattern or prefix cannot be listed.
    UnsupportedFeatureError
        fsspec, or the backend a URL needs, is not installed.
    """
    if isinstance(inputs, Expansion):
        return inputs
    files: set[str] = set()
    skipped: set[str] = set()
    outside: dict[str, str] = {}
    repeated: set[str] = set()
    for item in as_items(inputs):
        tree = _expand_url(item, storage_options, exclude, inside) if is_url(item) else \
            _expand_local(item, exclude, inside)
        files.update(tree.paths())
        skipped.update(tree.skipped)
        repeated.update(tree.repeated)
        outside.update({f.path: f.target for f in tree.files if f.target is not None})
    return Expansion(sorted(files), sorted(skipped - files), dict(sorted(outside.items())),
                     sorted(repeated))


def expand(inputs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | Expansion,
           storage_options: StorageOptions = None, *, exclude: Sequence[str] = (),
           inside: bool = False) -> list[str]:
    """The files that ``inputs`` name (globs, directories, URL prefixes expanded: the
    module docstring), sorted and without duplicates; ``exclude`` globs leave files and
    folders out of the walks, ``inside`` walks into checkpoint folders too.

    Raises
    ------
    RemoteError
        A URL pattern or prefix cannot be listed.
    UnsupportedFeatureError
        fsspec, or the backend a URL needs, is not installed.

    Examples
    --------
    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = tmp.name
    >>> for name in ("a.pt", "sub/b.bin", "sub/notes.txt", ".git/c.pt"):
    ...     os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    ...     open(os.path.join(root, name), "wb").close()
    >>> [os.path.relpath(p, root) for p in expand([root, os.path.join(root, "*.pt")])]
    ['.git/c.pt', 'a.pt', 'sub/b.bin']
    >>> [os.path.relpath(p, root) for p in expand(root, exclude=[".git"])]
    ['a.pt', 'sub/b.bin']
    >>> tmp.cleanup()
    """
    return walk(inputs, storage_options, exclude=exclude, inside=inside).files


def expands(item: str, storage_options: StorageOptions = None, *, probe: bool = False) -> bool:
    """True when ``item`` stands for files it does not name (a glob, a directory, a URL
    prefix ending in ``/``): the command line then reports in JSON Lines.  With
    ``probe``, a URL without a checkpoint suffix (``hf://user/repo``) is asked for (one
    listing request).

    Examples
    --------
    >>> expands("models/*.pt"), expands("s3://bucket/models/"), expands("model.pt")
    (True, True, False)
    """
    if has_magic(item) or (is_url(item) and item.endswith("/")):
        return True
    if not is_url(item):
        return detect_input(item) is InputKind.FOLDER
    return probe and url_scheme(item) not in _FLAT_SCHEMES and \
        detect_input(item, storage_options) is InputKind.FOLDER


def as_items(inputs: Any) -> list[str]:
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    return [str(os.fspath(i)) for i in items]


def _base(item: str) -> str:
    """The folder (in :func:`_key` form) an input's files are relative to: the directory
    or prefix itself, a glob's folder before its first wildcard, a file's folder."""
    key = _key(item)
    if has_magic(key):
        return key[:min(key.index(c) for c in "*?[" if c in key)].rpartition("/")[0]
    folder = os.path.isdir(item) if not is_url(item) else \
        item.endswith("/") or _suffix(item) not in CHECKPOINT_SUFFIXES
    return key.rstrip("/") if folder else os.path.dirname(key)


def outputs(urls: list[str], items: list[str], out_prefix: str | None,
             fmt: str) -> tuple[list[str], list[str | None]]:
    """The inputs to convert (less those under ``out_prefix``: earlier outputs; and less
    files a folder or glob found that are already of the kind ``fmt`` writes) and the
    output of each: under ``out_prefix``, at its path relative to the input that named it
    (the inputs' common folder when none does)."""
    named = {_key(item) for item in items}
    urls = [url for url in urls
            if _key(url) in named or _suffix(url) != OUTPUT_SUFFIXES[fmt]]
    if out_prefix is None:
        return urls, [output_for(url, fmt) for url in urls]
    inside = _key(out_prefix).rstrip("/") + "/"
    urls = [url for url in urls if not _key(url).startswith(inside)]
    bases = sorted({_base(item) for item in items}, key=len, reverse=True)
    common = _common_folder(urls)
    roots = [next((b for b in bases if _key(url).startswith(b + "/")), common) for url in urls]
    return urls, [output_for(url, fmt, out_prefix, root) for url, root in zip(urls, roots,
                                                                             strict=True)]


def _key(url: str) -> str:
    """A URL or path as a path-like key: ``s3://b/k`` → ``s3/b/k``."""
    scheme = url_scheme(url)
    return url.replace("://", "/", 1) if scheme else os.path.abspath(url)


def _common_folder(urls: Sequence[str]) -> str:
    keys = [_key(u) for u in urls]
    if not keys:
        return ""
    common = os.path.commonpath(keys) if len({k.startswith("/") for k in keys}) == 1 else ""
    return common if len(keys) > 1 or common != keys[0] else os.path.dirname(common)


def output_for(url: str, fmt: str, out_prefix: str | None = None, root: str = "") -> str | None:
    """Where ``url`` converted to ``fmt`` goes: beside it, or under ``out_prefix`` at its
    path relative to ``root`` (a folder of :func:`_key` form); None when that is the
    input itself.

    Examples
    --------
    >>> output_for("s3://b/zoo/bert/model.bin", "safetensors")
    's3://b/zoo/bert/model.safetensors'
    >>> output_for("s3://b/zoo/bert/model.bin", "safetensors", "out/", "s3/b/zoo")
    'out/bert/model.safetensors'
    """
    suffix = OUTPUT_SUFFIXES[fmt]
    stem, old = os.path.splitext(url)
    if out_prefix is None:
        return None if old.lower() == suffix else stem + suffix
    relative = os.path.relpath(os.path.splitext(_key(url))[0], root or "/") + suffix
    return out_prefix.rstrip("/") + "/" + relative.replace(os.sep, "/")

