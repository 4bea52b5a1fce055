"""The CPU product over K-quant super-blocks with interleaved codes (kernels/cpu/kgemm.c, built by
kernels/cpu_native.py) and its plain PyTorch reference (`impl="reference"`)."""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from kernels import cpu_native
from kernels.cpu_qgemm import run_product
from kernels.kquant_layout import file_order, tile_superblocks, untile_superblocks
from kernels.kquant_layout import interleave as interleave_reference

QK = 256  # weights per super-block
KINDS = {"Q4_K": (4, 144, 32), "Q5_K": (5, 176, 32), "Q6_K": (6, 210, 16)}  # type: (the kernel's kind, bytes per super-block, group)


def kgemm(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None, *,
          impl: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
    """x (R, K) @ Wᵀ (+ bias) -> (R, N) fp32 for W (N, K/256 · bytes) uint8, each row's `type_name` super-blocks
    with their codes interleaved (kernels/kquant_layout.py); bias (N,) fp32. `impl` "auto"/"native" runs
    the C kernel, "reference" PyTorch."""
    kind, size, _ = KINDS[type_name]
    k = blocks.shape[1] // size * QK
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {k}")
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        y = kgemm_reference(x, blocks, type_name)
        return y if bias is None else y + bias.float()
    return run_product(kernel.lib.parley_kgemm, x, blocks.shape[0], bias, blocks.data_ptr(), kind, out=out)


def amxkgemm(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None, *,
             impl: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
    """`kgemm` for W (N, K/256 · bytes) uint8 of Q4_K/Q5_K super-blocks in kernels/cpu/amxkgemm.c's groups of
    16 columns (kernels/kquant_layout.tile_superblocks), on AMX tiles (`cpu_native.amx_ready`)."""
    kind = KINDS[type_name][0]
    k = blocks.shape[1] // KINDS[type_name][1] * QK
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {k}")
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        y = kgemm_reference(x, blocks, type_name, untile_superblocks)
        return y if bias is None else y + bias.float()
    return run_product(kernel.lib.parley_amxkgemm, x, blocks.shape[0], bias, blocks.data_ptr(), kind, out=out)


def kgemm_grouped(x: torch.Tensor, mats: list[torch.Tensor], counts: list[int], type_name: str, *,
                  impl: str = "auto") -> torch.Tensor:
    """(R, N) fp32 for x (R, K) in groups of `counts` rows, in order, each group's rows @ its matrix's ᵀ (the
    matrices (N, K/256 · bytes) of one shape and `type_name`): a mixture's chosen experts in one library call, the
    rows that chose an expert side by side; every row exactly `kgemm`'s for it."""
    kind, size, _ = KINDS[type_name]
    k = mats[0].shape[1] // size * QK
    if x.shape[-1] != k or any(m.shape != mats[0].shape for m in mats) or len(counts) != len(mats) \
            or sum(counts) != x.shape[0] or min(counts) < 1:
        raise ValueError(f"x ({list(x.shape)}) must be {len(mats)} groups of {counts} rows of {k} columns, the "
                         "matrices of one shape")
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        starts = np.cumsum([0, *counts[:-1]]).tolist()
        return torch.cat([kgemm_reference(x[s:s + c], w, type_name) for w, s, c in zip(mats, starts, counts)])
    x = x.float().contiguous()
    n, groups = mats[0].shape[0], len(mats)
    y = torch.empty(x.shape[0], n, dtype=torch.float32)
    ptrs = (ctypes.c_void_p * groups)(*[m.data_ptr() for m in mats])
    first = (ctypes.c_int64 * groups)(*np.cumsum([0, *counts[:-1]]).tolist())
    sizes = (ctypes.c_int64 * groups)(*counts)
    rc = kernel.lib.parley_kgemm_grouped(x.data_ptr(), x.shape[0], k, ptrs, first, sizes, groups, kind, n,
                                         y.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise MemoryError(f"no memory for the activations of a {x.shape[0]} × {k} product")
    return y


def interleave(raw: np.ndarray, type_name: str, *, impl: str = "auto") -> torch.Tensor:
    """Rows of the file's `type_name` super-blocks (n, K/256 · bytes) as the kernel holds them: the same bytes with
    their codes interleaved (kernels/kquant_layout.interleave is the reference, `impl="reference"`)."""
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        return torch.from_numpy(interleave_reference(raw, type_name))
    src = np.ascontiguousarray(raw, dtype=np.uint8)
    out = torch.empty(src.shape, dtype=torch.uint8)
    kind, size, _ = KINDS[type_name]
    kernel.lib.parley_kq_interleave(src.ctypes.data, out.data_ptr(), src.size // size, kind, torch.get_num_threads())
    return out


def tile(raw: np.ndarray, type_name: str, *, impl: str = "auto") -> torch.Tensor:
    """Rows of the file's Q4_K/Q5_K super-blocks (n, K/256 · bytes), n a multiple of 16, in amxkgemm.c's groups
    (kernels/kquant_layout.tile_superblocks is the reference, `impl="reference"`)."""
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        return torch.from_numpy(tile_superblocks(raw, type_name))
    src = np.ascontiguousarray(raw, dtype=np.uint8)
    kind, size, _ = KINDS[type_name]
    s = src.shape[1] // size
    out = torch.empty(src.shape, dtype=torch.uint8)
    kernel.lib.parley_kq_tile(src.ctypes.data, out.data_ptr(), src.shape[0], s, kind, torch.get_num_threads())
    return out


def kgemm_reference(x: torch.Tensor, blocks: torch.Tensor, type_name: str, to_file=file_order) -> torch.Tensor:
    """The same arithmetic in float64: activations quantized per 32 as the kernel does (kernels/cpu_qgemm.py) times
    the exact weights (`to_file`: the held bytes back in the file's order)."""
    import gguf

    from kernels.cpu_qgemm import QB, quantize_activations

    a, d, _ = quantize_activations(x, QB)
    xq = a.double() * d.double().repeat_interleave(QB, dim=1)
    raw = to_file(blocks.numpy(), type_name)
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(raw.shape[0], -1)
    return (xq @ torch.from_numpy(w).double().t()).float()
