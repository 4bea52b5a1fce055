"""Triton kernels, each beside a PyTorch reference: attention over the batched-sequence KV store, KV writes,
fused norms/rope/activations, decode GEMMs; on Hopper they launch with PDL (kernels/pdl.py)."""

from kernels.attention import kv_write, sdpa_varlen, triton_available
from kernels.reference import kv_write_reference, sdpa_varlen_reference

__all__ = [
    "kv_write",
    "kv_write_reference",
    "sdpa_varlen",
    "sdpa_varlen_reference",
    "triton_available",
]
