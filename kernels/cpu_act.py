"""A gated MLP's activation in one library call (kernels/cpu/act.c): act(gate) · up, over a fused gate|up product or
two. Plain PyTorch reference beside it (`impl="reference"`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import cpu_native

ACTS = {"silu": 0, "gelu_tanh": 1}


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: str, *, impl: str = "auto") -> torch.Tensor:
    """gate, up (R, I) fp32 (views of one fused product will do) -> (R, I) = act(gate) · up; act "silu" or
    "gelu_tanh"."""
    if act not in ACTS:
        raise ValueError(f"act must be one of {tuple(ACTS)}, not {act!r}")
    kernel = cpu_native.chosen(impl)
    r, i = gate.shape
    if kernel is None or gate.dtype != torch.float32 or up.dtype != torch.float32 or up.shape != gate.shape \
            or gate.stride(-1) != 1 or up.stride(-1) != 1 or up.stride(0) != gate.stride(0):
        if impl == "native" and kernel is not None:
            raise ValueError("gated_act takes fp32 rows of one stride")
        return gated_act_reference(gate, up, act)
    out = torch.empty(r, i, dtype=torch.float32)
    kernel.lib.parley_gated_act(gate.data_ptr(), up.data_ptr(), r, i, gate.stride(0), ACTS[act], out.data_ptr())
    return out


def gated_act_reference(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    a = F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")
    return a * up
