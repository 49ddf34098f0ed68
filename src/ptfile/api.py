"""ptfile's front doors: :func:`load`, :func:`save` and :func:`open`, with torch's (and
``safetensors.safe_open``'s) signatures.

``open`` sits here, above both readers, so neither imports the other: a directory opens as a
:class:`~ptfile.dcp.reader.DCPReader`, anything else as a :class:`~ptfile.CheckpointReader`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Final

import numpy as np

from . import config
from ._io.atomic import atomic_file
from ._io.local import FileLike, damage_as_format_error
from ._io.paths import is_path, is_url
from ._io.remote import StorageOptions, local_path, open_any, open_target
from ._io.sink import PLAIN_BYTES, DirectSink
from .allowlist.policy import loads_structurally, reads_numpy_values
from .errors import FormatError, SaveError
from .formats import REFUSALS, Format, ReadOptions, detect_source, read, refuse
from .formats.inputs import Input, InputKind, resolve_input
from .formats.legacy_pickle import write_legacy
from .formats.options import Policy
from .formats.torchscript import TorchScriptArchive, read_torchscript
from .formats.zipped import archive_prefix, write_zip
from .limits import DEFAULT_LIMITS, Limits
from .model.location import MapLocation

if TYPE_CHECKING:
    from .dcp.reader import DCPReader
    from .reader import CheckpointReader
    from .sets import SetReader
    from .zero import ZeroReader

__all__ = ["detect_format", "load", "load_torchscript", "open", "save"]

_MMAP_MODES: Final = {"r": "r", "c": "private", "r+": "shared"}


def _mapped_access(f: FileLike, mmap: bool | str | None) -> str | None:
    """The map access for ``mmap``, refusing what cannot be mapped, as torch.load does."""
    access = _mmap_access(mmap)
    if access is not None and not is_path(f):
        raise ValueError("mmap needs a path (a local str or os.PathLike): a URL, a file object or "
                         "bytes cannot be mapped (torch.load refuses them too); pass the file's "
                         "path, or leave mmap off to read it")
    return access


def _mmap_access(mmap: bool | str | None) -> str | None:
    if mmap is None or mmap is False:
        return None
    if mmap is True:
        flags = config.current().mmap_flags
        return "shared" if flags == config.MAP_SHARED else "private"
    if mmap in _MMAP_MODES:
        return _MMAP_MODES[mmap]
    raise ValueError(f"mmap must be a bool or one of {sorted(_MMAP_MODES)}, got {mmap!r}")


def load(
    f: FileLike | Input,
    map_location: MapLocation = None,
    pickle_module: None = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | str | None = None,
    limits: Limits | None = None,
    skip_data: bool = False,
    structural: bool = False,
    storage_options: StorageOptions = None,
    **pickle_load_args: Any,
) -> Any:
    """Load an object saved by ``torch.save`` (or :func:`save`) without torch.

    Parameters
    ----------
    f
        A path, ``os.PathLike``, bytes, a binary file object (read from its
        current position; non-seekable streams are read whole), or a URL fsspec
        knows (``https://``, ``s3://``, ``hf://``…; ptfile's ``remote``
        extra), whose file is fetched with concurrent range requests.
    map_location
        As torch takes it: a tag string, a dict from recorded tags to new ones,
        or a callable ``(storage, location)``.  Data always lives in host memory;
        the tags are what changes.
    pickle_module
        Kept for positional parity with torch; anything but ``None`` is an error.
    weights_only
        ``True`` or not passed: ptfile reconstructs exactly what torch's
        weights-only unpickler allows.  ``False``: ptfile never executes a
        pickle, so it cannot do what torch does then (import and call whatever
        the file names); it loads structurally instead, as ``structural=True``.
        torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` and
        ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` apply as described in
        :mod:`ptfile.allowlist.policy`.
    mmap
        ``True`` maps the file (copy-on-write unless
        :func:`ptfile.set_default_mmap_options` says ``MAP_SHARED``): nothing is
        read until touched and arrays are views of the file.  ``"r"`` maps it
        read-only, ``"c"`` copy-on-write, ``"r+"`` shared (writes reach the
        file).  ``False`` (default) reads the file once into memory; arrays
        are writable views of that copy.  Mapping needs a path: with a file
        object or bytes, any of these raises ValueError (as in torch).  A
        mapped load reads the central directory and the pickle only: a
        storage's local header is read and checked when its bytes are first
        used, and a damaged one raises :class:`ArchiveError` from that use.
        ``None`` takes the ``mmap`` setting (torch's ``config.load.mmap``;
        ``False`` unless ``ptfile.settings(mmap=True)`` says otherwise).
    limits
        Ceilings for untrusted input (:class:`ptfile.Limits`).
    skip_data
        Build tensors (shape, dtype, strides) without reading any storage bytes
        (also inside ``with ptfile.skip_data():``).
    structural
        ``False`` (default): globals outside torch's weights-only allowlist and
        :func:`ptfile.add_safe_globals` raise :class:`UnsafeGlobalError`.
        ``True``: they load as inert stand-ins that record their name,
        arguments and state (:mod:`ptfile.allowlist.structural`); nothing from the file is
        imported or called.  ``ptfile.state_dict(obj)`` extracts the state dict
        of a whole ``torch.save(model)`` file.
    storage_options
        For a URL: fsspec's options for its backend (credentials, endpoints).
    pickle_load_args
        ``encoding=``/``errors=`` for Python 2 pickles.

    Returns
    -------
    The saved object, with :class:`ptfile.Tensor` leaves.  A safetensors file (known by
    its bytes, whatever its name: torch.load needs the ``.safetensors`` suffix) gives
    what torch.load gives: ``{name: Tensor}`` in data order, without its ``__metadata__``
    (:func:`ptfile.open`'s ``metadata()`` has it); ``map_location`` applies to the
    ``cpu`` tag as for any format (torch refuses a dict or callable here).

    Raises
    ------
    FormatError
        The input is not a well-formed checkpoint (with what, where, and what was expected).
    UnsafeGlobalError
        The pickle names a global outside torch's weights-only allowlist.
    LimitExceededError, UnsupportedFeatureError

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save({"w": np.eye(2, dtype="float32")}, buf)
    >>> sd = ptfile.load(io.BytesIO(buf.getvalue()))
    >>> sd["w"].shape, sd["w"].dtype
    (torch.Size([2, 2]), torch.float32)
    """
    if pickle_module is not None:
        raise TypeError("ptfile.load does not take a pickle_module: it never runs pickle code")
    structural = loads_structurally(weights_only, structural)
    skip_data = config.skipping_data(skip_data)
    unknown = set(pickle_load_args) - {"encoding", "errors"}
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    limits = limits or DEFAULT_LIMITS
    record = resolve_input(f, storage_options, limits=limits)
    storage_options = record.storage_options  # a record handed in carries its own
    if record.is_folder:
        return _load_folder(record, map_location, mmap, limits, skip_data, weights_only,
                            structural, pickle_load_args)
    f = local_path(record.location)  # type: ignore[assignment]
    access = _mapped_access(f, config.current().mmap if mmap is None else mmap)  # type: ignore[arg-type]
    # skip_data reads headers and the pickle only: read on demand instead of the whole file.
    source = open_any(f, storage_options=storage_options,  # type: ignore[arg-type]
                      mmap=access is not None, access=access or "private", lazy=skip_data,
                      limits=limits)
    try:
        with damage_as_format_error():
            return read(source, ReadOptions(
                map_location=map_location, limits=limits, skip_data=skip_data,
                encoding=pickle_load_args.get("encoding", "utf-8"),
                policy=Policy.STRUCTURAL if structural else Policy.STRICT))
    finally:
        source.close()


def _load_folder(record: Input, map_location: MapLocation, mmap: bool | str | None,
                 limits: Limits, skip_data: bool, weights_only: bool | None, structural: bool,
                 pickle_load_args: dict[str, Any]) -> Any:
    """:func:`load` of a folder: a DCP or safetensors folder as :func:`ptfile.load_dcp`
    reads it, a checkpoint set part by part (:func:`ptfile.sets.load_set`)."""
    if record.kind is InputKind.FOLDER:
        raise record.many_files(f"load each file ({', '.join(record.names[:4]) or 'none'}"
                                f"{', ...' if len(record.names) > 4 else ''})")
    if record.kind.is_dcp_readable:
        from .dcp.load import load_dcp

        return load_dcp(record, weights_only=weights_only, structural=structural, limits=limits)
    if record.kind is InputKind.ZERO:  # DeepSpeed's consolidated state dict
        from .zero import load_zero

        return load_zero(record, structural=structural, limits=limits)
    from .sets import load_set

    def load_file(path: str, part_structural: bool) -> Any:
        return load(path, map_location, mmap=mmap, limits=limits, skip_data=skip_data,
                    structural=part_structural, storage_options=record.storage_options,
                    **pickle_load_args)

    return load_set(record, load_file, limits=limits, structural=structural)


def save(
    obj: object,
    f: FileLike,
    pickle_module: None = None,
    pickle_protocol: int = 2,
    _use_new_zipfile_serialization: bool = True,
    _disable_byteorder_record: bool = False,
    *,
    archive_name: str | None = None,
    byteorder: str | None = None,
    skip_data: bool = False,
    storage_options: StorageOptions = None,
    fsync: bool = False,
) -> None:
    """Save ``obj`` as ``torch.save`` does, byte for byte, without torch.

    ``obj`` may hold dicts, OrderedDicts (their ``_metadata`` attribute
    included), lists, tuples, str, bytes, int, float, bool, None, ptfile
    tensors and numpy arrays (views of one base buffer share one storage).
    Storages are streamed from memory; a path target is written atomically
    (temporary file, renamed over the target once complete: a crash leaves
    the old file or the new one), beyond its first 256 MiB around the page
    cache where the platform allows (:mod:`ptfile._io.sink`), with the
    CRCs of large storages computed in a helper thread meanwhile.

    torch tensors (when torch is already imported) are converted through
    :mod:`ptfile.model.torch`, sharing kept.

    Parameters
    ----------
    obj
        The object to save.
    f
        A path, a writable binary file object, or a URL whose fsspec backend
        writes (``s3://``, ``gs://``, ``memory://``…), with ``storage_options``.
    pickle_protocol
        2 (torch's default), 3, 4 or 5: the bytes are ``torch.save``'s with the
        same protocol.  torch 2.13 reads protocols 4 and 5 back only with
        ``weights_only=False`` (its weights-only unpickler refuses ``FRAME``).
    _use_new_zipfile_serialization, _disable_byteorder_record
        torch's keywords.  ``_use_new_zipfile_serialization=False`` writes the
        legacy (pre-1.6) stream format, which torch reads back (storages are
        little-endian there, as torch writes them).
    archive_name
        Folder name inside the archive; default torch's rule (the file's stem,
        or ``archive`` for file objects).
    byteorder
        ``"little"`` or ``"big"``: the byte order of the storages and of the
        ``byteorder`` record (ZIP only); default the host's, as torch does.
    skip_data
        Write each storage record's space without its data (zeros, CRC 0, as
        torch's ``serialization.skip_data()``; a path target gets holes, so
        the file is sparse).  Fill it later through ``load(path, mmap="r+")``.
        Storages need no data then (``Storage(None, dtype, nbytes=n)``).
        Also inside ``with ptfile.skip_data():``; the legacy format cannot skip
        data (:class:`SaveError`, as torch refuses).
    fsync
        Power-loss durability for a path target: fsync the temporary file
        before the rename and its folder after it, so that once ``save``
        returns the new file survives a power cut.  Off by default, as in
        ``torch.save`` (which never fsyncs); the rename is atomic either way.

    Raises
    ------
    SaveError
        ``obj`` contains something that cannot be written.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO()
    >>> ptfile.save({"w": np.arange(3, dtype="int64")}, buf)
    >>> buf.getvalue()[:4]
    b'PK\\x03\\x04'
    """
    if pickle_module is not None:
        raise TypeError("ptfile.save does not take a pickle_module")
    skip_data = config.skipping_data(skip_data)
    if skip_data and not _use_new_zipfile_serialization:
        raise SaveError("skip_data cannot be used with _use_new_zipfile_serialization=False: "
                        "the legacy format has no room for storages without data (torch "
                        "refuses it too)")
    if byteorder not in (None, "little", "big"):
        raise ValueError(f"byteorder must be 'little' or 'big', got {byteorder!r}")
    # Never import torch ourselves: only convert what is there (a None entry is an import
    # blocked on purpose, which must not be retried).
    if sys.modules.get("torch") is not None:
        from .model.torch import from_torch  # the bridge imports torch: only here

        obj = from_torch(obj)
    emit: Callable[[Callable[[Any], Any]], None]
    if _use_new_zipfile_serialization:
        settings = config.current()
        if _disable_byteorder_record:
            settings = config.Settings(**{**_fields(settings), "byteorder_record": False})
        prefix = archive_name or archive_prefix(f)
        order = byteorder or sys.byteorder

        def emit(write: Callable[[Any], Any]) -> None:
            write_zip(obj, write, prefix, settings, pickle_protocol=pickle_protocol,
                      byteorder=order, skip_data=skip_data)
    else:
        if byteorder == "big":
            raise ValueError("the legacy format stores storages little-endian only")

        def emit(write: Callable[[Any], Any]) -> None:
            write_legacy(obj, write, pickle_protocol=pickle_protocol)
    if is_url(f):
        with open_target(str(f), storage_options) as fp:
            emit(fp.write)
        return
    f = local_path(f)  # type: ignore[assignment]
    if is_path(f):
        with atomic_file(os.fspath(f), fsync) as fp:  # type: ignore[arg-type]
            (_emit_sparse if skip_data else _emit_direct)(emit, fp)
        return
    emit(f.write)  # type: ignore[union-attr]


def _emit_direct(emit: Callable[[Callable[[Any], Any]], None], fp: IO[bytes]) -> None:
    """Run ``emit`` into ``fp``'s file through a :class:`~ptfile._io.sink.DirectSink`."""
    fp.flush()
    sink = DirectSink(fp.fileno(), PLAIN_BYTES)
    try:
        emit(sink.write)
        sink.close()
    finally:
        sink.release()


def _emit_sparse(emit: Callable[[Callable[[Any], Any]], None], fp: IO[bytes]) -> None:
    """Run ``emit`` into ``fp``, leaving holes for the zeros of skip_data records."""
    emit(_sparse_write(fp))


#: Zero runs at least this long become holes in skip_data files.
_HOLE_BYTES: Final = 1 << 16


def _sparse_write(fp: IO[bytes]) -> Callable[[Any], Any]:
    """``fp.write`` that seeks over long runs of zeros (skip_data records) instead of writing.

    The archive always ends in non-zero end records, so no hole is left at the end.
    """

    def write(data: Any) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes >= _HOLE_BYTES and not np.frombuffer(view, np.uint8).any():
            fp.seek(view.nbytes, os.SEEK_CUR)
        else:
            fp.write(view)

    return write


def _fields(settings: config.Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in settings.__slots__}


def detect_format(f: FileLike | Input, *, limits: Limits | None = None,
                  storage_options: StorageOptions = None) -> Format:
    """The checkpoint format of ``f``, from its bytes (never from its name).

    Parameters
    ----------
    f
        A path, bytes, a binary file object (read from its current position), or
        a URL (only the head, and a ZIP's tail, are fetched).
    limits
        Ceilings for untrusted input.
    storage_options
        For a URL: fsspec's options for its backend.

    Returns
    -------
    Format
        ``ZIP`` (torch.save ≥ 1.6), ``TORCHSCRIPT`` (torch.jit.save), ``PT2``
        (torch.export.save), ``LEGACY`` (pre-1.6 pickle stream), ``TAR``
        (pre-0.4), ``SAFETENSORS`` (whatever the file's name), ``DCP`` (a
        ``torch.distributed.checkpoint`` directory, from its file names), or ``UNKNOWN``.

    Raises
    ------
    FormatError
        A ZIP whose central directory cannot be read.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save([np.zeros(2)], buf, _use_new_zipfile_serialization=False)
    >>> ptfile.detect_format(io.BytesIO(buf.getvalue()))
    <Format.LEGACY: 'legacy'>
    """
    record = resolve_input(f, storage_options)
    storage_options = record.storage_options  # a record handed in carries its own
    kind = record.kind
    if kind.is_folder:
        return Format.DCP if kind.is_dcp_readable else Format.ZERO if kind is InputKind.ZERO \
            else Format.SET if kind.is_checkpoint_folder else Format.UNKNOWN
    target: Any = record.location
    position = None if isinstance(target, (str, os.PathLike, bytes, bytearray, memoryview)) \
        else target.tell()
    source = open_any(target, storage_options=storage_options, lazy=True,
                      limits=limits or DEFAULT_LIMITS)
    try:
        with damage_as_format_error():
            return detect_source(source, limits or DEFAULT_LIMITS).format
    finally:
        source.close()
        if position is not None:
            target.seek(position)


def load_torchscript(
    f: FileLike,
    map_location: MapLocation = None,
    *,
    mmap: bool | str | None = None,
    limits: Limits | None = None,
    skip_data: bool = False,
    storage_options: StorageOptions = None,
) -> TorchScriptArchive:
    """Read a ``torch.jit.save`` archive as data, without running any TorchScript.

    :func:`load` of a TorchScript archive returns just its state dict; this
    returns everything: the module tree (``__torch__.*`` objects as inert
    :class:`~ptfile.formats.torchscript.ScriptObject` records with their
    attributes), the tensor constants of ``constants.pkl``, the ``code/``
    sources as text and the ``extra/`` files as bytes.

    Parameters
    ----------
    f, map_location, mmap, limits, skip_data, storage_options
        As for :func:`load`.

    Returns
    -------
    TorchScriptArchive
        ``.module``, ``.constants``, ``.code``, ``.extra``, ``.version``,
        ``.byteorder``, and ``.state_dict()`` (what :func:`load` returns).

    Raises
    ------
    FormatError
        ``f`` is not a TorchScript archive, or it is damaged.
    UnsafeGlobalError
        The pickles name a global that is neither TorchScript's nor allowlisted.
    LimitExceededError, UnsupportedFeatureError

    Examples
    --------
    >>> import ptfile
    >>> ptfile.load_torchscript("model.pt").module.training  # doctest: +SKIP
    True
    """
    f = local_path(f)  # type: ignore[assignment]
    access = _mapped_access(f, mmap)
    limits = limits or DEFAULT_LIMITS
    skip_data = config.skipping_data(skip_data)
    source = open_any(f, storage_options=storage_options, mmap=access is not None,
                      access=access or "private", limits=limits)
    try:
        with damage_as_format_error():
            detected = detect_source(source, limits)
            if detected.format in REFUSALS:
                refuse(detected)
            if detected.format is not Format.TORCHSCRIPT:
                raise FormatError(f"not a TorchScript archive: ptfile found the "
                                  f"{detected.format.value} format (use ptfile.load)")
            return read_torchscript(source, detected, ReadOptions(
                map_location=map_location, limits=limits, skip_data=skip_data))
    finally:
        source.close()


def open(f: FileLike | Input, *, mmap: bool = True, limits: Limits | None = None,
         storage_options: StorageOptions = None, weights_only: bool | None = None,
         structural: bool = False) -> CheckpointReader | DCPReader | SetReader | ZeroReader:
    """Open a checkpoint for lazy, metadata-first reading (``safetensors.safe_open``'s API).

    A file (path, file object or URL) opens as :func:`ptfile.reader.open` describes, as a
    :class:`~ptfile.CheckpointReader`.  A directory (a path or URL: a
    ``torch.distributed.checkpoint`` with ``.metadata`` and ``*.distcp`` files, or a
    HuggingFace writer's ``*.safetensors``) opens as a :class:`~ptfile.dcp.reader.DCPReader`:
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
        As :func:`ptfile.load` takes them (:mod:`ptfile.allowlist.policy`): by default globals
        outside torch's weights-only allowlist and :func:`ptfile.safe_globals` raise
        :class:`UnsafeGlobalError`; ``structural=True`` or ``weights_only=False`` resolves
        them as inert stand-ins.  For a DCP directory, this is how its non-tensor items
        are read (:meth:`~ptfile.dcp.reader.DCPReader.value`, ``check``).

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
    numpy_values = reads_numpy_values(weights_only)  # a DCP folder's values, as torch's
    structural = loads_structurally(weights_only, structural)
    record = resolve_input(f, storage_options, limits=limits or DEFAULT_LIMITS)
    storage_options = record.storage_options  # a record handed in carries its own
    if record.kind is InputKind.FOLDER:
        raise record.many_files("open each file, or inspect/scan/verify the folder in bulk")
    if record.kind.is_dcp_readable:  # a DCP folder of either writer
        from .dcp.reader import open_dcp  # each reader imported when it is the one needed

        return open_dcp(record, limits=limits, structural=structural,
                        numpy_values=numpy_values)
    if record.kind is InputKind.ZERO:
        from .zero import open_zero

        return open_zero(record, limits=limits, structural=structural)
    if record.is_folder:
        from .sets import open_set

        return open_set(record, mmap=mmap, limits=limits, structural=structural)
    from .reader import open as open_file

    return open_file(record.location, mmap=mmap, limits=limits,
                     storage_options=storage_options, structural=structural)
