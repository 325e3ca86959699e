"""turboinfer-llama: stall-aware GPU frequency control for llama.cpp.

``turboinfer_llama.Llama`` is a drop-in for ``llama_cpp.Llama`` that watches the
engine from inside and (with a device and controller) lowers the GPU clock through
stalls and raises it before compute resumes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .settings import PowerSettings

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .llama import Llama


def __getattr__(name: str) -> Any:
    # Imported lazily so device, control and CLI code works without loading llama.cpp.
    if name == "Llama":
        from .llama import Llama

        return Llama
    raise AttributeError(name)


__all__ = ["Llama", "PowerSettings", "__version__"]
