"""open_device: specs, auto-detection of every fake tree, no silent simulator."""

from __future__ import annotations

import logging

import pytest
from fakesysfs import make_exynos_mali, make_jetson_orin, make_oneplus8_kgsl

from turboinfer_llama.devices import (
    AUTO_ORDER,
    DeviceNotFound,
    InvalidDeviceSpec,
    open_device,
    parse_spec,
    probe,
)


def test_parse_spec() -> None:
    assert parse_spec("sim") == ("sim", None)
    assert parse_spec("sim:mali-g76") == ("sim", "mali-g76")
    assert parse_spec("devfreq:/sys/class/devfreq/x") == ("devfreq", "/sys/class/devfreq/x")
    assert parse_spec("KGSL") == ("kgsl", None)


@pytest.mark.parametrize("spec", ["gpu", "simulator:x", "auto:sim", ""])
def test_bad_spec_lists_choices(spec: str) -> None:
    with pytest.raises(InvalidDeviceSpec, match=r"sim\[:profile\].*auto"):
        open_device(spec)


def test_auto_order_is_kmod_kgsl_devfreq() -> None:
    assert AUTO_ORDER == ("kmod", "kgsl", "devfreq")


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (make_oneplus8_kgsl, "kgsl:kgsl-3d0"),
        (make_exynos_mali, "devfreq:18500000.mali"),
        (make_jetson_orin, "devfreq:17000000.ga10b"),
    ],
)
def test_auto_detects_each_fake_tree(tmp_path, make, name) -> None:
    make(tmp_path)
    gpu = open_device("auto", root=str(tmp_path))
    try:
        assert gpu.name == name
        assert not gpu.capabilities.simulated
    finally:
        gpu.close()


def test_auto_falls_back_to_sim_with_a_logged_line(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="turboinfer_llama.devices"):
        gpu = open_device("auto", root=str(tmp_path))
    assert gpu.capabilities.simulated
    assert "falling back to the simulated GPU" in caplog.text


@pytest.mark.parametrize("spec", ["kgsl", "devfreq", "devfreq:17000000.ga10b"])
def test_named_real_device_never_becomes_sim(tmp_path, spec: str) -> None:
    with pytest.raises(DeviceNotFound):
        open_device(spec, root=str(tmp_path))


def test_sim_spec_with_profile() -> None:
    gpu = open_device("sim:mali-g76")
    assert gpu.name == "sim:mali-g76" and gpu.capabilities.simulated
    assert gpu.frequencies_hz()[-1] == 702_000_000


def test_probe_explains_missing_backends(tmp_path) -> None:
    ok, why = probe("kgsl", root=str(tmp_path))
    assert not ok and "no KGSL GPU" in why
    ok, why = probe("sim")
    assert ok and "simulated" in why
