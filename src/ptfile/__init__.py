"""ptfile: PyTorch checkpoints (.pt/.pth/.bin) without torch.

>>> import io, numpy as np, ptfile
>>> buf = io.BytesIO()
>>> ptfile.save({"w": np.ones((2, 3), "float32")}, buf)
>>> ptfile.load(io.BytesIO(buf.getvalue()))["w"].numpy().sum()
np.float32(6.0)
"""

from __future__ import annotations

from .api import detect_format, load, load_torchscript, save
from .config import (
    MAP_PRIVATE,
    MAP_SHARED,
    LoadEndianness,
    Settings,
    get_crc32_options,
    get_default_load_endianness,
    get_default_mmap_options,
    set_crc32_options,
    set_default_load_endianness,
    set_default_mmap_options,
    settings,
    skip_data,
)
from .dcp import load_dcp
from .dcp_reader import DCPReader, DCPSlice
from .dcp_writer import save_dcp
from .dtypes import DTYPES, DType
from .errors import (
    ArchiveError,
    FormatError,
    LimitExceededError,
    PickleStreamError,
    PtfileError,
    PtfileWarning,
    RemoteError,
    SaveError,
    StorageError,
    UnknownFormatError,
    UnsafeGlobalError,
    UnsupportedFeatureError,
)
from .formats import Format
from .formats.torchscript import ScriptObject, TorchScriptArchive
from .inspection import DiffReport, Inspection, VerifyReport, diff, inspect, verify
from .limits import DEFAULT_LIMITS, Limits
from .location import register_package
from .opening import open
from .policy import add_safe_globals, clear_safe_globals, get_safe_globals, safe_globals
from .reader import (
    CheckpointReader,
    TensorInfo,
    TensorSlice,
)
from .scanning import Finding, ScanResult, Verdict, scan
from .scanning.unsafe_globals import get_unsafe_globals_in_checkpoint
from .structural import StandIn, state_dict
from .tensor import Device, Parameter, QuantizedTensor, Size, SparseTensor, Storage, Tensor

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_LIMITS",
    "DTYPES",
    "MAP_PRIVATE",
    "MAP_SHARED",
    "ArchiveError",
    "CheckpointReader",
    "DCPReader",
    "DCPSlice",
    "DType",
    "Device",
    "DiffReport",
    "Finding",
    "Format",
    "FormatError",
    "Inspection",
    "LimitExceededError",
    "Limits",
    "LoadEndianness",
    "Parameter",
    "PickleStreamError",
    "PtfileError",
    "PtfileWarning",
    "QuantizedTensor",
    "RemoteError",
    "SaveError",
    "ScanResult",
    "ScriptObject",
    "Settings",
    "Size",
    "SparseTensor",
    "StandIn",
    "Storage",
    "StorageError",
    "Tensor",
    "TensorInfo",
    "TensorSlice",
    "TorchScriptArchive",
    "UnknownFormatError",
    "UnsafeGlobalError",
    "UnsupportedFeatureError",
    "Verdict",
    "VerifyReport",
    "__version__",
    "add_safe_globals",
    "clear_safe_globals",
    "detect_format",
    "diff",
    "get_crc32_options",
    "get_default_load_endianness",
    "get_default_mmap_options",
    "get_safe_globals",
    "get_unsafe_globals_in_checkpoint",
    "inspect",
    "load",
    "load_dcp",
    "load_torchscript",
    "open",
    "register_package",
    "safe_globals",
    "save",
    "save_dcp",
    "scan",
    "set_crc32_options",
    "set_default_load_endianness",
    "set_default_mmap_options",
    "settings",
    "skip_data",
    "state_dict",
    "verify",
]

# Everything public reports ``ptfile`` as its module, as its users import it (one loop, so
# a new export cannot be forgotten); objects exported under another name keep theirs, so
# pickle still finds each one by ``module.qualname``.
for _name in __all__:
    _obj = globals()[_name]
    if (isinstance(_obj, type) or callable(_obj)) and getattr(_obj, "__name__", None) == _name \
            and str(getattr(_obj, "__module__", "")).startswith("ptfile."):
        _obj.__module__ = "ptfile"
del _name, _obj
