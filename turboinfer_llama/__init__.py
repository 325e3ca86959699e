"""turboinfer-llama: stall-aware GPU frequency control for llama.cpp.

``turboinfer_llama.Llama`` is a drop-in for ``llama_cpp.Llama`` that watches the
engine from inside and (with a device and controller) lowers the GPU clock through
stalls and raises it before compute resumes.

Errors a caller may want to catch are exported here: ``DeviceError`` and its
subclasses (every device and meter failure), ``InvalidDeviceSpec``,
``InvalidMeterSpec``, ``PromptsError`` and ``TraceFormatError`` (the last four are
also ``ValueError``s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .devices import InvalidDeviceSpec
from .devices.base import (
    BadCounters,
    DeviceError,
    DeviceGone,
    DeviceNotFound,
    InvalidFrequency,
    PermissionDenied,
    Unsupported,
)
from .devices.owner import DeviceBusy
from .power.base import InvalidMeterSpec
from .settings import PowerSettings

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .bench.prompts import PromptsError
    from .llama import Llama
    from .trace.record import TraceFormatError

# Imported lazily so device, control and CLI code works without loading llama.cpp.
_LAZY = {
    "Llama": ("llama", "Llama"),
    "PromptsError": ("bench.prompts", "PromptsError"),
    "TraceFormatError": ("trace.record", "TraceFormatError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(name)


__all__ = [
    "BadCounters",
    "DeviceBusy",
    "DeviceError",
    "DeviceGone",
    "DeviceNotFound",
    "InvalidDeviceSpec",
    "InvalidFrequency",
    "InvalidMeterSpec",
    "Llama",
    "PermissionDenied",
    "PowerSettings",
    "PromptsError",
    "TraceFormatError",
    "Unsupported",
    "__version__",
]
