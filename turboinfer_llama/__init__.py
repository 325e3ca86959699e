"""turboinfer-llama: stall-aware GPU frequency control for llama.cpp."""

from __future__ import annotations

from .settings import PowerSettings

__version__ = "0.1.0"

__all__ = ["PowerSettings", "__version__"]
