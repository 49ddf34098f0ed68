"""ptfile: PyTorch checkpoints (.pt/.pth/.bin) without torch.

>>> import io, numpy as np, ptfile
>>> buf = io.BytesIO()
>>> ptfile.save({"w": np.ones((2, 3), "float32")}, buf)
>>> ptfile.load(io.BytesIO(buf.getvalue()))["w"].numpy().sum()
np.float32(6.0)

``import ptfile`` imports only the exception classes; each other public name is
imported from its module the first time it is used (:data:`_EXPORTS`, PEP 562), so
the ``ptfile`` command and a script that only scans start without numpy's and
ml_dtypes' import time.  Every public name reports ``ptfile`` as its module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from . import _lazy
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

if TYPE_CHECKING:  # what the lazy names are, for type checkers (test_api checks the two agree)
    from .allowlist.policy import (
        NUMPY_GLOBALS,
        add_safe_globals,
        clear_safe_globals,
        get_safe_globals,
        safe_globals,
    )
    from .allowlist.structural import StandIn, state_dict
    from .api import detect_format, load, load_torchscript, open, save
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
    from .dcp.load import load_dcp
    from .dcp.reader import DCPReader, DCPSlice
    from .dcp.writer import save_dcp
    from .formats import Format
    from .formats.torchscript import ScriptObject, TorchScriptArchive
    from .inspection import DiffReport, Inspection, VerifyReport, diff, inspect, verify
    from .limits import DEFAULT_LIMITS, Limits
    from .model.dtypes import DTYPES, DType
    from .model.layouts import QuantizedTensor, SparseTensor
    from .model.location import register_package
    from .model.tensor import Device, Parameter, Size, Storage, Tensor
    from .reader import (
        CheckpointReader,
        TensorInfo,
        TensorSlice,
    )
    from .scanning import Finding, ScanResult, Verdict, scan
    from .scanning.unsafe_globals import get_unsafe_globals_in_checkpoint
    from .zero import ZeroReader, ZeroSlice, load_zero

__version__ = "0.1.0"

#: Each public name (but the errors, imported above) -> the module that defines it.
_EXPORTS: Final[dict[str, str]] = {
    "detect_format": "api", "load": "api", "load_torchscript": "api", "save": "api",
    "MAP_PRIVATE": "config", "MAP_SHARED": "config", "LoadEndianness": "config",
    "Settings": "config", "get_crc32_options": "config",
    "get_default_load_endianness": "config", "get_default_mmap_options": "config",
    "set_crc32_options": "config", "set_default_load_endianness": "config",
    "set_default_mmap_options": "config", "settings": "config", "skip_data": "config",
    "load_dcp": "dcp.load",
    "DCPReader": "dcp.reader", "DCPSlice": "dcp.reader",
    "save_dcp": "dcp.writer",
    "load_zero": "zero", "ZeroReader": "zero", "ZeroSlice": "zero",
    "DTYPES": "model.dtypes", "DType": "model.dtypes",
    "Format": "formats",
    "ScriptObject": "formats.torchscript", "TorchScriptArchive": "formats.torchscript",
    "DiffReport": "inspection", "Inspection": "inspection", "VerifyReport": "inspection",
    "diff": "inspection", "inspect": "inspection", "verify": "inspection",
    "DEFAULT_LIMITS": "limits", "Limits": "limits",
    "register_package": "model.location",
    "open": "api",
    "NUMPY_GLOBALS": "allowlist.policy", "add_safe_globals": "allowlist.policy", "clear_safe_globals": "allowlist.policy",
    "get_safe_globals": "allowlist.policy", "safe_globals": "allowlist.policy",
    "CheckpointReader": "reader", "TensorInfo": "reader", "TensorSlice": "reader",
    "Finding": "scanning", "ScanResult": "scanning", "Verdict": "scanning", "scan": "scanning",
    "get_unsafe_globals_in_checkpoint": "scanning.unsafe_globals",
    "StandIn": "allowlist.structural", "state_dict": "allowlist.structural",
    "Device": "model.tensor", "Parameter": "model.tensor", "QuantizedTensor": "model.layouts",
    "Size": "model.tensor", "SparseTensor": "model.layouts", "Storage": "model.tensor", "Tensor": "model.tensor",
}

__all__ = [
    "DEFAULT_LIMITS",
    "DTYPES",
    "MAP_PRIVATE",
    "MAP_SHARED",
    "NUMPY_GLOBALS",
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
    "ZeroReader",
    "ZeroSlice",
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
    "load_zero",
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


def _publish(obj: Any, name: str) -> None:
    """Report ``ptfile`` as the module of a public class or function (pickle still finds
    it there: ``ptfile.<name>`` is the same object)."""
    if (isinstance(obj, type) or callable(obj)) and getattr(obj, "__name__", None) == name \
            and str(getattr(obj, "__module__", "")).startswith("ptfile."):
        obj.__module__ = "ptfile"


def __getattr__(name: str) -> Any:
    """A public name, imported on first use; or a subpackage (``ptfile.bulk``)."""
    if name not in _EXPORTS and not name.startswith("_"):
        try:
            return importlib.import_module(f"ptfile.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"ptfile.{name}":
                raise
    obj = _lazy.load(__name__, _EXPORTS, name)
    _publish(obj, name)
    return obj


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


for _name in sorted(set(__all__) & set(globals())):  # the errors, imported above
    _publish(globals()[_name], _name)
del _name
