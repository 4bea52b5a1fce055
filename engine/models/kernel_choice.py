"""KernelChoice: how a model computes on its device, decided once when its runtime is built."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """What `CausalLM.prepare` sets up; the default is the plain modules (CPU, tests, references)."""

    fuse_projections: bool = False  # q/k/v and gate/up as one GEMM each (GPU decode is launch-bound)
    fused: bool = False  # norms, rope, activations and the K/V write through kernels/norms.py (CUDA, not compiled)
    decode_gemm: bool = False  # GEMMs of at most 64 rows through the Triton skinny GEMM; the LM head stays on cuBLAS
    decode_splits: int | None = None  # K slices of the o/down/qkv decode GEMMs; None: kernels.linear.decode_splits

    def __post_init__(self) -> None:
        if self.decode_splits is not None and self.decode_splits < 1:
            raise ValueError("decode_splits must be at least 1 (or None: per K)")


PLAIN = KernelChoice()


def choose_kernels(device: torch.device | str, *, compile_decode: bool = False, fused: bool = True,
                   decode_gemm: bool | None = None, decode_splits: int | None = None,
                   quantized: bool = False) -> KernelChoice:
    """The kernels for a model on `device`: on CUDA fused projections, the fused norm/rope/activation kernels
    (3.5x faster uncompiled steps on an H200; inductor fuses its own under `compile_decode`) and, where kernels
    launch with PDL, the Triton decode GEMMs, which then chain with the kernels around them (H200: 1.28x at 1
    session); `decode_gemm` None = that default. Elsewhere the plain modules."""
    device = torch.device(device)
    if device.type != "cuda":
        # quantized CPU matrices: q/k/v and gate/up as one kernel call each where their formats match
        return KernelChoice(fuse_projections=True) if quantized else PLAIN
    fused = fused and not compile_decode
    if decode_gemm is None:
        decode_gemm = fused and _pdl(device)
    return KernelChoice(fuse_projections=True, fused=fused, decode_gemm=decode_gemm, decode_splits=decode_splits)


def _pdl(device: torch.device) -> bool:
    from kernels import triton_available

    if not triton_available():
        return False
    from kernels.pdl import pdl_supported

    return pdl_supported(device)
