"""Offload policy: on a real local GPU, the model must run on that GPU.

Steering a GPU's clock saves nothing while llama.cpp computes on the CPU. So when the
power device is a local real GPU (kgsl, devfreq, kmod), every layer is offloaded by
default (``n_gpu_layers=-1``) unless the caller chose a number, and after loading we
ask llama.cpp where the layers went (``engine.backends``). A CPU-only build, an
explicit ``n_gpu_layers=0`` or a load that put no layer on a GPU device is one clear
error; ``PowerSettings.allow_cpu`` turns it into a warning (tests on CPU-only hosts).

adb devices are excluded: their inference runs on the phone (``turboinfer android
bench``), and the simulator (the default) needs no GPU at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .devices.base import DeviceError, GpuDevice
from .engine.backends import Placement, PlacementError, model_placement, supports_gpu_offload

log = logging.getLogger("turboinfer_llama")

LOCAL_GPU_BACKENDS: tuple[str, ...] = ("kgsl", "devfreq", "kmod")
ALL_LAYERS = -1

BUILD_HELP = (
    "Build llama-cpp-python with a GPU backend: "
    "CMAKE_ARGS='-DGGML_VULKAN=ON' pip install --force-reinstall --no-cache-dir "
    "--no-binary llama-cpp-python 'llama-cpp-python>=0.3.36,<0.4' (Vulkan: Adreno 6xx "
    "through Mesa Turnip, Mali; use -DGGML_OPENCL=ON for Adreno 7xx and newer); on a "
    "phone, examples/android/termux-run.sh setup does it in Termux."
)
LAYERS_HELP = (
    "Offload the layers: leave n_gpu_layers unset or -1 (all). llama.cpp counts the "
    "output layer too, offloading the last n_gpu_layers - 1 repeating layers."
)
ALLOW_HELP = "Set allow_cpu (TURBOINFER_ALLOW_CPU=1, --allow-cpu) to run anyway."


class CpuInferenceError(DeviceError):
    """The model would run on the CPU while we steer a GPU's clock."""


def backend_name(device: GpuDevice) -> str:
    """The devices/ backend module a device comes from: kgsl, devfreq, kmod, adb, sim."""
    return type(device).__module__.rsplit(".", 1)[-1]


def steers_local_gpu(device: GpuDevice | None) -> bool:
    """True for a real GPU on this machine, whose clock only matters if we compute there."""
    if device is None or device.capabilities.simulated:
        return False
    return backend_name(device) in LOCAL_GPU_BACKENDS


def default_gpu_layers(kwargs: dict[str, Any], device: GpuDevice | None) -> None:
    """Offload every layer when steering a local GPU and the caller chose no number."""
    if steers_local_gpu(device) and "n_gpu_layers" not in kwargs:
        kwargs["n_gpu_layers"] = ALL_LAYERS


@dataclass
class OffloadReport:
    """What llama.cpp did with ``n_gpu_layers``; shown in ``stats()["offload"]``."""

    n_gpu_layers: int
    gpu_backend: bool
    placement: Placement | None = None
    warning: str | None = None

    @property
    def gpu_share(self) -> float | None:
        """Offloaded share of the layers; 0 when nothing can be offloaded, None unknown."""
        if self.placement is not None:
            return self.placement.gpu_share
        if not self.gpu_backend or self.n_gpu_layers == 0:
            return 0.0
        return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "n_gpu_layers": self.n_gpu_layers,
            "gpu_backend": self.gpu_backend,
            "gpu_share": self.gpu_share,
            "warning": self.warning,
        }
        if self.placement is not None:
            out.update(self.placement.to_json())
        return out


def inspect(model: Any, n_gpu_layers: int) -> OffloadReport:
    """Ask llama.cpp where ``model``'s layers are (a one-token probe decode, skipped
    when nothing can have been offloaded)."""
    report = OffloadReport(n_gpu_layers=n_gpu_layers, gpu_backend=supports_gpu_offload())
    if report.gpu_backend and n_gpu_layers != 0:
        report.placement = model_placement(model)
    return report


def check(model: Any, n_gpu_layers: int, *, device_name: str, allow_cpu: bool) -> OffloadReport:
    """``inspect`` plus the policy: error (or warning with ``allow_cpu``) when no layer
    runs on a GPU device while we steer ``device_name``."""
    try:
        report = inspect(model, n_gpu_layers)
    except PlacementError as e:
        raise CpuInferenceError(f"cannot tell where llama.cpp put the model: {e}") from e
    if not report.gpu_backend:
        problem = (
            "this llama-cpp-python build has no GPU backend (llama_supports_gpu_offload() is false)"
        )
    elif n_gpu_layers == 0:
        problem = "n_gpu_layers=0 keeps every layer on the CPU"
    elif report.placement is not None and report.placement.layers_on_gpu == 0:
        problem = f"llama.cpp put none of the {report.placement.n_layer} layers on a GPU device"
    else:
        p = report.placement
        if p is not None and p.layers_on_gpu < p.n_layer:
            log.info(
                "partial offload: %d of %d layers on %s; the rest runs on the CPU",
                p.layers_on_gpu,
                p.n_layer,
                ", ".join(p.gpu_devices),
            )
        return report
    advice = BUILD_HELP if not report.gpu_backend else LAYERS_HELP
    message = (
        f"{problem}: steering {device_name} is pointless while the model runs on the CPU. {advice}"
    )
    if not allow_cpu:
        raise CpuInferenceError(f"{message} {ALLOW_HELP}")
    log.warning("%s (allow_cpu is set: running anyway)", message)
    report.warning = message
    return report


__all__ = [
    "ALL_LAYERS",
    "LOCAL_GPU_BACKENDS",
    "CpuInferenceError",
    "OffloadReport",
    "backend_name",
    "check",
    "default_gpu_layers",
    "inspect",
    "steers_local_gpu",
]
