"""`linear(x, w)` for decode steps, with the same implementation switch as the attention ops.

`impl="triton"` runs the skinny-M Triton GEMM (at most 64 rows; CUDA, or the CPU interpreter),
`impl="reference"` is `F.linear`. `linear_act` is a gated MLP's first half in one GEMM launch;
`linear_partials` a long-K GEMM split over K whose partial sums the next kernel adds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import IMPLS

MAX_ROWS = 64
DECODE_SPLITS = 2  # H200, Gemma-3-270M step at 1 session: 2 slices 0.526 ms, 4: 0.537, 1 (whole K): 0.562


def decode_splits(k: int) -> int:
    """How many K slices a decode GEMM with reduction length `k` is cut into when its consumer sums them."""
    return DECODE_SPLITS if k >= 512 else 1


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()  # the kernel reads rows along a contiguous K


def linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def linear(x: torch.Tensor, weight: torch.Tensor, *, impl: str = "triton") -> torch.Tensor:
    """x (M, K) @ weightᵀ (K, N) -> (M, N); the Triton path takes M <= 64."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference" or (impl == "auto" and not x.is_cuda):
        return linear_reference(x, weight)
    from kernels.skinny_linear_triton import skinny_linear_triton

    return skinny_linear_triton(x, weight)


def linear_act(x: torch.Tensor, weight: torch.Tensor, act: str, *, impl: str = "triton") -> torch.Tensor:
    """act(x @ gateᵀ) * (x @ upᵀ) for a fused [gate | up] weight (2I, K) -> (M, I); act 'gelu_tanh' or 'silu'.
    The Triton path applies the activation in the GEMM's epilogue (one launch for the MLP's first half)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference" or (impl == "auto" and not x.is_cuda):
        from kernels.norms import act_mul

        return act_mul(linear_reference(x, weight), act, impl="reference")
    from kernels.skinny_linear_triton import skinny_linear_triton

    return skinny_linear_triton(_unit_stride(x), weight, act=act)


def linear_partials(x: torch.Tensor, weight: torch.Tensor, splits: int, *, impl: str = "triton") -> torch.Tensor:
    """x @ weightᵀ as split-K fp32 partials (S, M, N), S <= `splits`, for a consumer that sums them
    (add_norm); the reference is one fp32 product (S = 1)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference" or (impl == "auto" and not x.is_cuda):
        return F.linear(x.float(), weight.float())[None]
    from kernels.skinny_linear_triton import skinny_linear_triton

    return skinny_linear_triton(_unit_stride(x), weight, splits=splits, partials=True)


@torch.library.custom_op("parley::skinny_linear", mutates_args=())
def _skinny_linear_op(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return linear(_unit_stride(x), weight, impl="triton")


@_skinny_linear_op.register_fake
def _(x, weight):
    return x.new_empty(x.shape[0], weight.shape[0])


def decode_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The Triton GEMM as one opaque op (torch.compile fuses around it, not into it); M <= 64."""
    return torch.ops.parley.skinny_linear(x, weight)
