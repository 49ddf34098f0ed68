"""``ptfile.open``: one front door for files and for DCP directories.

A path or URL naming a directory (:func:`ptfile._dcp_files.is_directory`) whose files
make it a ``torch.distributed.checkpoint`` (:func:`ptfile.formats.detect_directory`)
opens as a :class:`~ptfile.dcp_reader.DCPReader`; anything else as a
:class:`~ptfile.CheckpointReader` (:func:`ptfile.reader.open`).  Both offer the same
interface.  This sits above both readers so neither imports the other.
"""

from __future__ import annotations

import os

from ._dcp_files import is_directory
from ._io import FileLike
from ._remote import StorageOptions
from .dcp_reader import DCPReader, open_dcp
from .limits import Limits
from .policy import loads_structurally
from .reader import CheckpointReader
from .reader import open as open_file

__all__ = ["is_dcp_directory", "open"]


def is_dcp_directory(f: object, storage_options: StorageOptions = None) -> bool:
    """Whether ``f`` names a directory (a path or URL); a DCP one or not, it is read as one."""
    return is_directory(f, storage_options)


def open(f: FileLike, *, mmap: bool = True, limits: Limits | None = None,
         storage_options: StorageOptions = None, weights_only: bool | None = None,
         structural: bool = False) -> CheckpointReader | DCPReader:
    """Open a checkpoint for lazy, metadata-first reading (``safetensors.safe_open``'s API).

    A file (path, file object or URL) opens as :func:`ptfile.reader.open` describes, as a
    :class:`~ptfile.CheckpointReader`.  A directory (a path or URL: a
    ``torch.distributed.checkpoint`` with ``.metadata`` and ``*.distcp`` files, or a
    HuggingFace writer's ``*.safetensors``) opens as a :class:`~ptfile.dcp_reader.DCPReader`:
    its metadata is read, each tensor's chunks only when the tensor is read, and a slice
    reads only the chunks it meets.

    Parameters
    ----------
    f
        A path, a seekable binary file object, a URL fsspec knows, or a DCP directory.
    mmap
        Map a file read-only (tensors are zero-copy views); DCP chunks are read by range.
    limits
        Ceilings for untrusted input.
    storage_options
        For a URL: fsspec's options for its backend (credentials, endpoints).
    weights_only, structural
        As :func:`ptfile.load` takes them (:mod:`ptfile.policy`): by default globals
        outside torch's weights-only allowlist and :func:`ptfile.safe_globals` raise
        :class:`UnsafeGlobalError`; ``structural=True`` or ``weights_only=False`` resolves
        them as inert stand-ins.  For a DCP directory, this is how its non-tensor items
        are read (:meth:`~ptfile.dcp_reader.DCPReader.value`, ``check``).

    Returns
    -------
    CheckpointReader or DCPReader
        A context manager and read-only ``Mapping[str, Tensor]`` with ``keys``,
        ``info``, ``get_tensor``, ``get_slice`` and ``metadata``.

    Raises
    ------
    FormatError
        The file or directory is not a well-formed checkpoint.
    UnsafeGlobalError
        A pickle names a global outside the policy that reads it.
    LimitExceededError, UnsupportedFeatureError, RemoteError

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save({"w": np.ones((2, 3), "float32")}, buf)
    >>> with ptfile.open(io.BytesIO(buf.getvalue())) as ck:
    ...     list(ck.keys()), ck.info("w").shape
    (['w'], (2, 3))
    """
    structural = loads_structurally(weights_only, structural)
    if is_dcp_directory(f, storage_options):
        return open_dcp(os.fspath(f), limits=limits,  # type: ignore[arg-type]
                        storage_options=storage_options, structural=structural)
    return open_file(f, mmap=mmap, limits=limits, storage_options=storage_options,
                     structural=structural)
