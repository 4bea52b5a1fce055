"""Kernel tests pick their device here: the GPU when there is one, else the CPU with the Triton kernels under
the interpreter (`make test-gpu` runs the tests marked `gpu` on a GPU host).

TRITON_INTERPRET must be set before the kernel modules are decorated (first imported),
so it is set here, at collection, before any test module imports them.
"""

from __future__ import annotations

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where a kernel test puts its tensors: Triton runs CUDA tensors on a GPU, CPU tensors only interpreted."""
    return torch.device("cuda" if ON_GPU else "cpu")
