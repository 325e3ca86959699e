"""The Python ABI in devices/kmod.py must match kernel_module/turboinfer_uapi.h.

The header is parsed (structs, constants, ioctl numbers) and compared with the ctypes
layouts; where gcc is present, sizes and offsets are also compiled from the header
itself, so the two cannot drift.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from turboinfer_llama.devices import kmod

HEADER = Path(__file__).resolve().parents[1] / "kernel_module" / "turboinfer_uapi.h"

STRUCTS = {
    "ti_info": kmod.TiInfo,
    "ti_set_freq": kmod.TiSetFreq,
    "ti_range": kmod.TiRange,
    "ti_stats": kmod.TiStats,
    "ti_sample_config": kmod.TiSampleConfig,
    "ti_sample": kmod.TiSample,
}
C_TYPES = {"__u32": ctypes.c_uint32, "__u64": ctypes.c_uint64, "char": ctypes.c_char}


def _source() -> str:
    text = HEADER.read_text()
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _defines() -> dict[str, str]:
    return dict(re.findall(r"^#define\s+(TI_\w+)\s+(.+?)\s*$", _source(), flags=re.M))


def _int_defines() -> dict[str, int]:
    out = {}
    for name, value in _defines().items():
        if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", value):
            out[name] = int(value, 0)
    return out


def _header_structs() -> dict[str, list[tuple[str, str, int | None]]]:
    consts = _int_defines()
    structs = {}
    for name, body in re.findall(r"struct\s+(\w+)\s*\{(.*?)\};", _source(), flags=re.S):
        fields = []
        for ctype, field, count in re.findall(
            r"(__u32|__u64|char)\s+(\w+)\s*(?:\[(\w+)\])?;", body
        ):
            n = None if not count else int(count) if count.isdigit() else consts[count]
            fields.append((field, ctype, n))
        # every declaration in the body was understood
        assert len(fields) == body.count(";"), f"unparsed field in struct {name}"
        structs[name] = fields
    return structs


def test_header_declares_exactly_our_structs() -> None:
    assert set(_header_structs()) == set(STRUCTS)


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_fields_match_header(name: str) -> None:
    py = STRUCTS[name]
    expected = []
    for field, ctype, count in _header_structs()[name]:
        base = C_TYPES[ctype]
        expected.append((field, base * count if count else base))
    got = list(py._fields_)
    assert [f for f, _ in got] == [f for f, _ in expected]
    for (field, t_py), (_, t_h) in zip(got, expected, strict=True):
        assert ctypes.sizeof(t_py) == ctypes.sizeof(t_h), field
        assert getattr(t_py, "_type_", t_py) == getattr(t_h, "_type_", t_h), field


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_structs_have_no_implicit_padding(name: str) -> None:
    """Explicit padding only: the C struct packs to the sum of its fields."""
    py = STRUCTS[name]
    assert ctypes.sizeof(py) == sum(ctypes.sizeof(t) for _, t in py._fields_)
    assert ctypes.sizeof(py) % 8 == 0


def test_constants_match_header() -> None:
    consts = _int_defines()
    names = [n for n in consts if hasattr(kmod, n)]
    # every numeric constant of the header exists in Python
    assert sorted(names) == sorted(consts)
    for n in names:
        assert getattr(kmod, n) == consts[n], n


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (kmod.TI_IOC_MAGIC << 8) | nr


def test_ioctl_numbers_match_header() -> None:
    dirs = {"_IO": 0, "_IOW": 1, "_IOR": 2, "_IOWR": 3}
    found = 0
    for name, value in _defines().items():
        m = re.fullmatch(
            r"(_IO|_IOR|_IOW|_IOWR)\(TI_IOC_MAGIC,\s*(\d+)(?:,\s*struct (\w+))?\)", value
        )
        if not m:
            continue
        found += 1
        macro, nr, struct = m.groups()
        size = ctypes.sizeof(STRUCTS[struct]) if struct else 0
        assert getattr(kmod, name) == _ioc(dirs[macro], int(nr), size), name
    assert found == 6


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_compiled_sizes_and_offsets_match(tmp_path: Path) -> None:
    """Let the C compiler lay the header out and compare every offset and size."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", f'#include "{HEADER}"', "int main(void){"]
    for cname, py in STRUCTS.items():
        lines.append(f'printf("{cname} sizeof %zu\\n", sizeof(struct {cname}));')
        for field, _ in py._fields_:
            lines.append(f'printf("{cname} {field} %zu\\n", offsetof(struct {cname}, {field}));')
    for ioc in (
        "TI_GET_INFO",
        "TI_SET_FREQ",
        "TI_SET_RANGE",
        "TI_RELEASE",
        "TI_GET_STATS",
        "TI_SAMPLE_CONFIG",
    ):
        lines.append(f'printf("ioctl {ioc} %lu\\n", (unsigned long){ioc});')
    lines.append("return 0;}")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        a, b, value = line.split()
        if a == "ioctl":
            assert getattr(kmod, b) == int(value), b
        elif b == "sizeof":
            assert ctypes.sizeof(STRUCTS[a]) == int(value), a
        else:
            assert getattr(STRUCTS[a], b).offset == int(value), f"{a}.{b}"
