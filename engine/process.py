"""Process-wide settings a runtime wants, made in this one place: they hold for every model in the process."""
from __future__ import annotations

import os

import torch


def configure_process(device: torch.device | str, compile_decode: bool = False) -> None:
    """Called when a runtime is built for `device`, before the process's first GPU matmul: PyTorch reads the
    cuBLAS workspace setting once, at its first cuBLAS call. Nothing to set off CUDA; calling again is harmless.

    - cuBLAS without a workspace, unless the user configured one: the decode LM head (1-64 rows by the whole
      vocabulary) then runs a kernel that needs no zeroed workspace, so no memset launch before it (H200,
      Gemma-3 head at 1 row: 82.2 vs 84.0 us; prefill-sized GEMMs unchanged).
    - With `compile_decode`, room for one torch.compile of the decode forward per graph bucket.
    """
    if torch.device(device).type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    if compile_decode:
        import torch._dynamo as dynamo

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo.config, name):
                setattr(dynamo.config, name, max(64, getattr(dynamo.config, name)))
