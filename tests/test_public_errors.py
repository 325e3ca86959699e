"""The errors a caller catches are importable from the package and keep their bases."""

from __future__ import annotations

import pytest

import turboinfer_llama as ti
from turboinfer_llama.devices import open_device
from turboinfer_llama.power import open_meter


def test_errors_are_exported_with_their_hierarchy() -> None:
    for sub in (ti.PermissionDenied, ti.DeviceNotFound, ti.InvalidFrequency, ti.DeviceGone):
        assert issubclass(sub, ti.DeviceError)
    assert issubclass(ti.Unsupported, ti.DeviceError)
    assert issubclass(ti.DeviceBusy, ti.DeviceError) and issubclass(ti.BadCounters, ti.DeviceError)
    assert issubclass(ti.InvalidDeviceSpec, ti.DeviceError)
    for value_error in (
        ti.InvalidDeviceSpec,
        ti.InvalidMeterSpec,
        ti.PromptsError,
        ti.TraceFormatError,
    ):
        assert issubclass(value_error, ValueError)
    assert set(ti.__all__) >= {"DeviceError", "PromptsError", "TraceFormatError"}


def test_bad_specs_raise_our_errors(tmp_path) -> None:
    with pytest.raises(ti.InvalidDeviceSpec, match="valid choices"):
        open_device("toaster")
    with pytest.raises(ti.InvalidMeterSpec, match="valid choices"):
        open_meter("thermometer")
    with pytest.raises(ti.InvalidMeterSpec, match="sim"):
        open_meter("sim")
    with pytest.raises(ti.InvalidMeterSpec, match="number"):
        open_meter("nvml:first")
    from turboinfer_llama.bench.prompts import load_prompts
    from turboinfer_llama.trace.record import load_trace

    with pytest.raises(ti.PromptsError):
        load_prompts(tmp_path / "missing.txt")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ti.TraceFormatError):
        load_trace(tmp_path / "bad.json")
    # a gzipped trace cut short, or gzip's magic on something else
    import gzip

    whole = gzip.compress(b'{"version": 1, "events": []}')
    (tmp_path / "cut.json.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "magic.json").write_bytes(b"\x1f\x8b not gzip")
    for name in ("cut.json.gz", "magic.json"):
        with pytest.raises(ti.TraceFormatError):
            load_trace(tmp_path / name)
