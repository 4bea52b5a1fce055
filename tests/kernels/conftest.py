"""Kernel tests pick their device here: the GPU when there is one, else the CPU with the Triton kernels under
the interpreter (`make test-gpu` runs the tests marked `gpu` on a GPU host).

TRITON_INTERPRET must be set before the kernel modules are decorated (first imported),
so it is set here, at collection, before any test module imports them.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from typing import Callable

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where a kernel test puts its tensors: Triton runs CUDA tensors on a GPU, CPU tensors only interpreted."""
    return torch.device("cuda" if ON_GPU else "cpu")


@pytest.fixture(scope="session")
def build_for(tmp_path_factory) -> Callable[..., "cpu_native.CpuKernel"]:
    """build_for(march, extra=()): the CPU library built for another -march (what a CPU of that kind builds), bound
    like the real one. Once a session for each march: a build takes ~8 s, and a dozen tests share each."""
    from kernels import cpu_native  # here: the module's import must follow TRITON_INTERPRET, set above

    folder = tmp_path_factory.mktemp("isa")
    built: dict[tuple[str, tuple[str, ...]], cpu_native.CpuKernel | None] = {}

    def build(march: str, extra: tuple[str, ...] = ()) -> "cpu_native.CpuKernel":
        key = (march, tuple(extra))
        if key not in built:
            out = folder / f"parley-cpu-{march}{''.join(extra)}.so"
            flags = [f if f != "-march=native" else f"-march={march}" for f in cpu_native.FLAGS] + list(extra)
            try:
                cpu_native.build_library("cc", out, flags)
                built[key] = cpu_native.bind(ctypes.CDLL(str(out)), out)
            except subprocess.CalledProcessError:
                built[key] = None
        if built[key] is None:
            pytest.skip(f"cc cannot build for {march}")
        return built[key]
    return build
