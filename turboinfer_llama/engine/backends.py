"""llama.cpp's compute backends and devices, asked through ggml's public backend API.

Steering a GPU clock only pays while llama.cpp runs the model on that GPU, so we ask
llama.cpp (never its log text) two things:

* which backends and devices this build has: ggml's backend registry
  (``ggml_backend_reg_*``, ``ggml_backend_dev_*``: name, description, type, memory);
* where a loaded model's layers went: a one-token decode in a small throw-away context
  whose eval callback looks at every node's weights (``src`` tensors in weight
  buffers) and asks each buffer for its device (``ggml_backend_buffer_get_type`` ->
  ``ggml_backend_buft_get_device``). The callback answers False, so nothing syncs.

llama-cpp-python's ctypes bindings expose ``llama_supports_gpu_offload`` but not the
ggml backend API, so these functions are typed here on the same libggml mapping that
llama_cpp loaded (``llama_cpp/lib``).
"""

from __future__ import annotations

import ctypes
import functools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .events import layer_of
from .ggml_mirror import GGML_MAX_SRC, GgmlUnavailable, TensorPrefix, tensor_layout

# enum ggml_backend_dev_type (ggml-backend.h), in declaration order.
DEVICE_TYPES: tuple[str, ...] = ("cpu", "gpu", "igpu", "accel", "meta")
GPU_TYPES = frozenset({"gpu", "igpu"})
_USAGE_WEIGHTS = 1  # GGML_BACKEND_BUFFER_USAGE_WEIGHTS


@dataclass(frozen=True)
class BackendDevice:
    """One ggml backend device, e.g. ``Vulkan0`` "Adreno (TM) 650", type ``igpu``."""

    name: str
    description: str
    type: str
    backend: str
    memory_free_bytes: int
    memory_total_bytes: int

    @property
    def is_gpu(self) -> bool:
        return self.type in GPU_TYPES

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "type": self.type,
            "backend": self.backend,
            "memory_free_bytes": self.memory_free_bytes,
            "memory_total_bytes": self.memory_total_bytes,
        }


@dataclass(frozen=True)
class BackendApi:
    """libggml's backend registry and buffer functions, typed for ctypes."""

    path: Path
    lib: ctypes.CDLL


def _lib_dir() -> Path:
    try:
        import llama_cpp
    except ImportError as e:
        raise GgmlUnavailable("llama-cpp-python is not importable") from e
    return Path(llama_cpp.__file__).resolve().parent / "lib"


def _typed(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


@functools.cache
def load_backend_api() -> BackendApi:
    """libggml (the registry lives there; it links libggml-base for the buffer calls)."""
    libdir = _lib_dir()
    found = sorted(libdir.glob("libggml.so*")) + sorted(libdir.glob("libggml.dylib"))
    if not found:
        raise GgmlUnavailable(f"libggml not found in {libdir}")
    path = found[0]
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    try:
        lib = ctypes.CDLL(str(path))
        for name, restype, args in [
            ("ggml_backend_dev_count", sz, ()),
            ("ggml_backend_dev_get", vp, (sz,)),
            ("ggml_backend_dev_name", ctypes.c_char_p, (vp,)),
            ("ggml_backend_dev_description", ctypes.c_char_p, (vp,)),
            ("ggml_backend_dev_type", ctypes.c_int, (vp,)),
            ("ggml_backend_dev_memory", None, (vp, ctypes.POINTER(sz), ctypes.POINTER(sz))),
            ("ggml_backend_dev_backend_reg", vp, (vp,)),
            ("ggml_backend_reg_count", sz, ()),
            ("ggml_backend_reg_get", vp, (sz,)),
            ("ggml_backend_reg_name", ctypes.c_char_p, (vp,)),
            ("ggml_backend_reg_dev_count", sz, (vp,)),
            ("ggml_backend_buffer_get_type", vp, (vp,)),
            ("ggml_backend_buffer_get_usage", ctypes.c_int, (vp,)),
            ("ggml_backend_buffer_is_host", ctypes.c_bool, (vp,)),
            ("ggml_backend_buffer_name", ctypes.c_char_p, (vp,)),
            ("ggml_backend_buft_get_device", vp, (vp,)),
        ]:
            _typed(lib, name, restype, *args)
    except (OSError, AttributeError) as e:
        raise GgmlUnavailable(f"cannot use ggml's backend API in {path}: {e}") from e
    return BackendApi(path, lib)


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


def _device(api: BackendApi, dev: int) -> BackendDevice:
    lib = api.lib
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    kind = int(lib.ggml_backend_dev_type(dev))
    reg = lib.ggml_backend_dev_backend_reg(dev)
    return BackendDevice(
        name=_text(lib.ggml_backend_dev_name(dev)),
        description=_text(lib.ggml_backend_dev_description(dev)),
        type=DEVICE_TYPES[kind] if 0 <= kind < len(DEVICE_TYPES) else f"type{kind}",
        backend=_text(lib.ggml_backend_reg_name(reg)) if reg else "",
        memory_free_bytes=int(free.value),
        memory_total_bytes=int(total.value),
    )


def devices() -> list[BackendDevice]:
    """Every device of every registered ggml backend, in registry order."""
    api = load_backend_api()
    lib = api.lib
    return [_device(api, lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def backends() -> list[dict[str, Any]]:
    """Registered backends (``CPU``, ``Vulkan``, ``OpenCL`` ...) with their device counts."""
    lib = load_backend_api().lib
    out = []
    for i in range(lib.ggml_backend_reg_count()):
        reg = lib.ggml_backend_reg_get(i)
        out.append(
            {
                "name": _text(lib.ggml_backend_reg_name(reg)),
                "devices": int(lib.ggml_backend_reg_dev_count(reg)),
            }
        )
    return out


def supports_gpu_offload() -> bool:
    """llama.cpp's own answer: does this build have a backend that takes layers?"""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


@dataclass
class Placement:
    """Where a loaded model's layers and nodes are, from one observed decode.

    A layer counts as offloaded when every weight its nodes read sits in a device
    buffer of a GPU-type device (host buffers, even a GPU backend's pinned ones,
    are system memory used by the CPU backend).
    """

    n_layer: int
    layer_devices: dict[int, str] = field(default_factory=dict)
    weight_bytes_by_device: dict[str, int] = field(default_factory=dict)
    nodes_by_device: dict[str, int] = field(default_factory=dict)

    @property
    def layers_on_gpu(self) -> int:
        return sum(1 for d in self.layer_devices.values() if d != "CPU")

    @property
    def gpu_share(self) -> float:
        """Offloaded fraction of the model's repeating layers (0..1)."""
        return self.layers_on_gpu / self.n_layer if self.n_layer else 0.0

    @property
    def gpu_devices(self) -> list[str]:
        return sorted({d for d in self.layer_devices.values() if d != "CPU"})

    def to_json(self) -> dict[str, Any]:
        return {
            "n_layer": self.n_layer,
            "layers_on_gpu": self.layers_on_gpu,
            "gpu_share": round(self.gpu_share, 4),
            "gpu_devices": self.gpu_devices,
            "weight_bytes_by_device": dict(self.weight_bytes_by_device),
            "nodes_by_device": dict(self.nodes_by_device),
        }


class _PlacementProbe:
    """The eval callback of the probe context: reads buffers, answers False (no sync)."""

    def __init__(self, api: BackendApi) -> None:
        self.api = api
        self._dev_names: dict[int, tuple[str, bool]] = {}
        self.layer_places: dict[int, set[str]] = {}
        self.weights: Counter[str] = Counter()
        self.nodes: Counter[str] = Counter()
        self._seen_weights: set[int] = set()
        self.error: str | None = None
        self.cb = _eval_callback_type()(self._eval)

    def _place(self, buffer: int) -> str:
        """Device name for a buffer; "CPU" for host memory or a CPU-type device."""
        lib = self.api.lib
        buft = lib.ggml_backend_buffer_get_type(buffer)
        dev = lib.ggml_backend_buft_get_device(buft) if buft else None
        if not dev:
            return "CPU"
        known = self._dev_names.get(dev)
        if known is None:
            d = _device(self.api, dev)
            known = self._dev_names[dev] = (d.name, d.is_gpu)
        name, is_gpu = known
        return name if is_gpu and not lib.ggml_backend_buffer_is_host(buffer) else "CPU"

    def _eval(self, tensor: int | None, ask: bool, _user: int | None) -> bool:
        if not ask or not tensor or self.error is not None:
            return True
        try:
            lib = self.api.lib
            node: Any = TensorPrefix.from_address(tensor)
            if node.buffer:
                self.nodes[self._place(node.buffer)] += 1
            layer = layer_of(node.name.decode("utf-8", "replace"))
            for src_ptr in list(node.src)[:GGML_MAX_SRC]:
                if not src_ptr:
                    continue
                src: Any = TensorPrefix.from_address(src_ptr)
                if not src.buffer or lib.ggml_backend_buffer_get_usage(src.buffer) != (
                    _USAGE_WEIGHTS
                ):
                    continue
                place = self._place(src.buffer)
                if layer >= 0:
                    self.layer_places.setdefault(layer, set()).add(place)
                if src_ptr not in self._seen_weights:
                    self._seen_weights.add(src_ptr)
                    size = int(src.nb[3]) * int(src.ne[3])
                    self.weights[place] += size
        except Exception as e:  # never let an exception into llama.cpp's compute loop
            self.error = f"{type(e).__name__}: {e}"
        return False


def _eval_callback_type() -> Any:
    import llama_cpp

    return llama_cpp.ggml_backend_sched_eval_callback


class PlacementError(RuntimeError):
    """The placement probe could not run (context, decode or tensor layout)."""


def model_placement(model: int, *, n_threads: int = 1) -> Placement:
    """Decode one token in a small extra context of ``model`` (a ``llama_model *``) and
    report which device holds each layer's weights and which computes each node."""
    import llama_cpp

    layout = tensor_layout()
    if not layout.valid:
        raise PlacementError(f"ggml tensor layout not verified: {layout.reason}")
    api = load_backend_api()
    probe = _PlacementProbe(api)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 256
    params.n_batch = params.n_ubatch = 8
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = n_threads
    params.cb_eval = probe.cb
    params.cb_eval_user_data = None
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise PlacementError("llama.cpp could not create the placement probe's context")
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        token = int(llama_cpp.llama_vocab_bos(vocab))
        arr = (llama_cpp.llama_token * 1)(max(token, 0))
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, 1))
        if rc != 0:
            raise PlacementError(f"llama_decode returned {rc} in the placement probe")
    finally:
        llama_cpp.llama_free(ctx)
    if probe.error:
        raise PlacementError(f"placement probe callback failed: {probe.error}")
    n_layer = int(llama_cpp.llama_model_n_layer(model))
    layer_devices = {
        layer: (next(iter(places)) if len(places) == 1 else "CPU")
        for layer, places in sorted(probe.layer_places.items())
        if 0 <= layer < n_layer
    }
    return Placement(
        n_layer=n_layer,
        layer_devices=layer_devices,
        weight_bytes_by_device=dict(probe.weights),
        nodes_by_device=dict(probe.nodes),
    )


__all__ = [
    "DEVICE_TYPES",
    "GPU_TYPES",
    "BackendDevice",
    "Placement",
    "PlacementError",
    "backends",
    "devices",
    "load_backend_api",
    "model_placement",
    "supports_gpu_offload",
]
