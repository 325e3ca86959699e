"""The drop-in ``Llama``: llama-cpp-python's class plus power-saving hooks.

It hooks only narrow public points: the context parameters at creation (for the eval
callback), ``eval``, ``sample``, ``generate`` and ``reset``. With
``power_saving=False`` nothing is installed and it behaves as plain llama-cpp-python.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as llama_capi
from pydantic import ValidationError

from . import offload
from .devices.base import GpuDevice
from .engine.backends import PlacementError
from .engine.events import EventKind
from .engine.hooks import EvalHook, make_hook
from .live import RealDeviceControl, attach
from .session import PowerSession
from .settings import PowerSettings

# llama-cpp-python builds its context params inside __init__; we wrap the public
# params constructor for the duration of one construction so the callback is in the
# params when the context is created. The lock keeps concurrent constructions apart.
_PARAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def _eval_callback_in_context_params(hook: EvalHook) -> Iterator[None]:
    original = llama_capi.llama_context_default_params

    def with_callback() -> llama_capi.llama_context_params:
        params = original()
        params.cb_eval = hook.cb_eval
        params.cb_eval_user_data = hook.user_data
        return params

    with _PARAMS_LOCK:
        llama_capi.llama_context_default_params = with_callback
        try:
            yield
        finally:
            llama_capi.llama_context_default_params = original


def _signal_decode_entry(ctx: Any, power: PowerSession) -> None:
    """Tell the live loop the moment each ``llama_decode`` starts: the planner thread
    waits for it (GIL free) instead of competing with the engine's Python between
    decodes. It wraps this context's ``decode`` (llama-cpp-python's ``LlamaContext``,
    which calls ``llama_decode``) on the instance only; without it the planner falls
    back to its hold timeout (control/governor.py, ``PLAN_HOLD_NS``)."""
    inner = getattr(ctx, "decode", None)
    if inner is None:
        return
    entering = power.entering_decode

    def decode(batch: Any) -> Any:
        entering()
        return inner(batch)

    ctx.decode = decode


def _settings(power: PowerSettings | dict[str, Any] | None) -> PowerSettings:
    if power is None:
        return PowerSettings()
    if isinstance(power, PowerSettings):
        return power
    if isinstance(power, dict):
        try:
            return PowerSettings(**power)
        except ValidationError as e:
            raise ValueError(f"invalid power settings: {e}") from e
    raise TypeError(f"power must be PowerSettings, dict or None, not {type(power).__name__}")


class Llama(llama_cpp.Llama):
    """``llama_cpp.Llama`` with stall-aware GPU frequency control.

    Takes every argument ``llama_cpp.Llama`` takes, plus ``power_saving`` (False makes
    the plugin inert) and ``power`` (a ``PowerSettings``, a dict of its fields, or None
    for the defaults and ``TURBOINFER_*`` environment variables).
    """

    power: PowerSession | None

    def __init__(
        self,
        *args: Any,
        power_saving: bool = True,
        power: PowerSettings | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.power = None
        self.power_saving = power_saving
        self._prefill_pending = False
        self._kv_high_water = 0
        if not power_saving:
            super().__init__(*args, **kwargs)
            return
        settings = _settings(power)
        live = attach(settings)  # a bad device spec fails here, before the model loads
        steered = live.device if isinstance(live, RealDeviceControl) else None
        offload.default_gpu_layers(kwargs, steered)  # all layers on a local real GPU
        hook = make_hook(settings.granularity, settings.ring_capacity, native=settings.native_hooks)
        try:
            with _eval_callback_in_context_params(hook):
                super().__init__(*args, **kwargs)
        except BaseException:
            hook.disable()
            if live is not None:
                live.close()
            raise
        self.power = PowerSession(settings, hook, live)
        set_reuse_probe = getattr(hook, "set_reuse_probe", None)
        if set_reuse_probe is not None:  # a reused decode graph: read no tensor
            set_reuse_probe(self._ctx.ctx)
        # The ExitStack unwinds in reverse: this runs before the context is freed.
        self._stack.callback(self.power.detach)
        if live is not None:
            _signal_decode_entry(self._ctx, self.power)
        self._check_offload(settings, steered)

    def _check_offload(self, settings: PowerSettings, steered: GpuDevice | None) -> None:
        """Where the layers went (``stats()["offload"]``); on a local real GPU, an
        error (a warning with ``allow_cpu``) when none runs on a GPU device."""
        assert self.power is not None
        n_gpu_layers = int(self.model_params.n_gpu_layers)
        n_gpu_layers = offload.ALL_LAYERS if n_gpu_layers >= 0x7FFFFFFF else n_gpu_layers
        try:
            if offload.steers_local_gpu(steered):
                assert steered is not None
                report = offload.check(
                    self.model,
                    n_gpu_layers,
                    device_name=steered.name,
                    allow_cpu=settings.allow_cpu,
                )
            else:
                report = offload.inspect(self.model, n_gpu_layers)
        except offload.CpuInferenceError:
            self.close()  # gives the GPU back as found
            raise
        except PlacementError as e:  # only figures for stats() were at stake
            report = offload.OffloadReport(n_gpu_layers, gpu_backend=True, warning=str(e))
        self.power.offload = report.to_json()
        if settings.clock_standin and report.gpu_share != 0.0:
            self.close()  # gives the device back as found
            raise ValueError(
                "clock_standin stands in for a GPU clock on a model that runs on the "
                f"host's CPU; here {report.gpu_share} of the layers are (or may be) on "
                "a GPU, whose time already follows its clock"
            )

    # -- per-token events --------------------------------------------------------
    def eval(self, tokens: Sequence[int]) -> None:
        p = self.power
        if p is None:
            return super().eval(tokens)
        prefill = self._prefill_pending or len(tokens) > 1
        self._prefill_pending = False
        if self.n_tokens < self._kv_high_water:
            p.emit(EventKind.KV_EDIT, detail=f"seq_rm p0={self.n_tokens}")
        if prefill:
            p.emit(EventKind.PREFILL_BEGIN, n_tokens=len(tokens))
        p.on_decode_begin(len(tokens))
        try:
            p.on_compute_begin()
            super().eval(tokens)
        finally:
            p.on_decode_end()
            if prefill:
                p.emit(EventKind.PREFILL_END)
            self._kv_high_water = self.n_tokens

    def sample(self, *args: Any, **kwargs: Any) -> int:
        p = self.power
        if p is None:
            return super().sample(*args, **kwargs)
        p.emit(EventKind.SAMPLE_BEGIN)
        try:
            return super().sample(*args, **kwargs)
        finally:
            p.emit(EventKind.SAMPLE_END)

    def reset(self) -> None:
        if self.power is not None:
            self.power.emit(EventKind.KV_EDIT, detail="reset")
            self._kv_high_water = 0
        super().reset()

    def generate(
        self, tokens: Sequence[int], *args: Any, **kwargs: Any
    ) -> Generator[int, Sequence[int] | None, None]:
        p = self.power
        if p is None:
            yield from super().generate(tokens, *args, **kwargs)
            return
        p.on_request_begin(len(tokens))
        self._prefill_pending = True
        n = 0
        inner = super().generate(tokens, *args, **kwargs)
        try:
            token = next(inner)
            while True:
                p.on_token(n)
                n += 1
                sent = yield token
                token = inner.send(sent)
        except StopIteration:
            pass
        finally:
            inner.close()
            self._prefill_pending = False
            p.on_request_end(n)

    # -- teardown ----------------------------------------------------------------
    def close(self) -> None:
        """Detach the hooks, free the model and context, then free the hook ring."""
        power = getattr(self, "power", None)
        if power is not None:
            power.detach()
        if hasattr(self, "_stack"):  # absent when __init__ failed before llama_cpp's
            super().close()
        if power is not None:
            power.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
