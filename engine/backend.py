"""Which backend runs a model: CUDA PyTorch, then MLX on Apple silicon, then CPU PyTorch."""
from __future__ import annotations

import platform
import sys

import torch

from engine.errors import ParleyError

BACKENDS = ("auto", "torch", "mlx")


def resolve_backend(name: str, device: str) -> str:
    """'torch' or 'mlx' for a requested backend ('auto' picks) and device."""
    if name not in BACKENDS:
        raise ParleyError(f"Unknown backend {name!r}; choose one of {', '.join(BACKENDS)}.")
    from engine.mlx_backend import mlx_available

    if name == "mlx":
        if not mlx_available():
            raise ParleyError("The MLX backend needs the `mlx` package (pip install mlx; on Linux: mlx[cpu]).")
        return "mlx"
    if name == "torch" or device.startswith("cuda") or torch.cuda.is_available():
        return "torch"
    apple = sys.platform == "darwin" and platform.machine() == "arm64"
    return "mlx" if apple and mlx_available() else "torch"


DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16")


def resolve_device(device: str, dtype: str) -> tuple[str, str]:
    """('auto' picks) -> the torch device and weight dtype: CUDA in bf16 when a GPU is there, else CPU in fp32."""
    if device not in DEVICES and not device.startswith("cuda:"):
        raise ParleyError(f"Unknown device {device!r}; choose one of {', '.join(DEVICES)}.")
    if dtype not in DTYPES:
        raise ParleyError(f"Unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}.")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ParleyError("No CUDA device is available; run with --device cpu (or install a CUDA build of torch).")
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"  # CPU bf16 matmuls are slow and drift
    return device, dtype

