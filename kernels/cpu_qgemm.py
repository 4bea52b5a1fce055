"""The CPU products over block codes (kernels/cpu/qgemm.c; byte codes interleaved in units: kernels/cpu/q8gemm.c;
built by kernels/cpu_native.py) and their plain PyTorch reference (`impl="reference"`)."""
from __future__ import annotations

import torch

from kernels import cpu_native

QB = 32  # activation block


def qgemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None, bits: int,
          group: int, zero: int, bias: torch.Tensor | None = None, *, lut: torch.Tensor | None = None,
          impl: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
    """x (R, K) @ Wᵀ (+ bias) -> (R, N) fp32 for W in block codes (engine/quant/block_codes.py): codes
    (N, K·bits/8) uint8, scales and offsets (N, K/group) fp16, bias (N,) fp32; `lut` (16,) uint8: 4-bit codes are
    indices into it (MXFP4). `impl` "auto"/"native" runs the C kernel, "reference" plain PyTorch."""
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        y = qgemm_reference(x, codes, scales, offsets, bits, group, zero, lut)
        return y if bias is None else y + bias.float()
    if lut is not None and (lut.dtype != torch.uint8 or lut.shape != (16,) or not lut.is_contiguous() or bits != 4):
        raise ValueError("qgemm's lut is 16 contiguous uint8 codes for 4-bit indices")
    return run_product(kernel.lib.parley_qgemm, x, codes.shape[0], bias, codes.data_ptr(), scales.data_ptr(),
                       offsets.data_ptr() if offsets is not None else None, bits,
                       lut.data_ptr() if lut is not None else None, group, zero, out=out)


def run_product(fn, x: torch.Tensor, n: int, bias: torch.Tensor | None, *weights,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """y (R, N) fp32 from one of the library's products, fn(x, R, K, *weights, N, bias, y, threads) -> 0, or -1
    without scratch memory, or -2 for a K it does not take; written into `out` (R, N) fp32 contiguous where given."""
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        raise ValueError(f"{fn.__name__} takes a contiguous fp32 bias")
    x = x.float().contiguous()
    r, k = x.shape
    if out is not None and (out.shape != (r, n) or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError(f"{fn.__name__} writes a contiguous fp32 ({r}, {n}) out, not {out.dtype} {list(out.shape)}")
    y = torch.empty(r, n, dtype=torch.float32) if out is None else out
    if r == 0:
        return y
    rc = fn(x.data_ptr(), r, k, *weights, n, bias.data_ptr() if bias is not None else None, y.data_ptr(),
            torch.get_num_threads())
    if rc == -2:
        raise ValueError(f"{fn.__name__} does not take K = {k}")
    if rc != 0:
        raise MemoryError(f"no memory for the activations of a {r} × {k} product")
    return y


def q8gemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None, *,
           bits: int = 8, impl: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
    """x (R, K) @ Wᵀ (+ bias) -> (R, N) fp32 for W in byte codes with zero 128 and an fp16 scale per 32, the codes
    (N, K) interleaved in units (kernels/kquant_layout.interleave_units), K a multiple of 128; `bits` 5: the codes
    (N, 5K/8) packed by kernels/kquant_layout.pack_fifths."""
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        from kernels.kquant_layout import natural_units, unpack_fifths

        held = unpack_fifths(codes.numpy()) if bits == 5 else codes.numpy()
        y = qgemm_reference(x, torch.from_numpy(natural_units(held)), scales, None, 8, QB, 128)
        return y if bias is None else y + bias.float()
    return run_product(kernel.lib.parley_q8gemm, x, codes.shape[0], bias, codes.data_ptr(), scales.data_ptr(), bits,
                       out=out)


def amxgemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None, *,
            bits: int = 8, impl: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
    """x (R, K) @ Wᵀ (+ bias) -> (R, N) fp32 for W in byte codes (zero 128) with an fp16 scale per 32, codes
    (N, K·bits/8) and scales (N, K/32) in kernels/cpu/amxgemm.c's groups of 16 columns
    (kernels/kquant_layout.tile_codes, `bits` 8 or 5), on AMX tiles (`cpu_native.amx_ready`); the library writes
    into `out` where given (a buffer kept across calls: no fresh pages)."""
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        from kernels.kquant_layout import untile_codes, untile_scales

        y = qgemm_reference(x, torch.from_numpy(untile_codes(codes.numpy(), bits)),
                            torch.from_numpy(untile_scales(scales.numpy())), None, 8, QB, 128)
        return y if bias is None else y + bias.float()
    return run_product(kernel.lib.parley_amxgemm, x, codes.shape[0], bias, codes.data_ptr(), scales.data_ptr(), bits,
                       out=out)


def quantize_activations(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's activation quantization: per block of 32, d = max|x| / 127 and a = round(x / d) in -127..127;
    also d·Σa per weight group. Returns (a (R, K) float, d (R, K/32), dsum (R, K/group))."""
    r, k = x.shape
    xb = x.float().reshape(r, k // QB, QB)
    amax = xb.abs().amax(-1)
    d = amax / 127
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    a = torch.round(xb * inv[..., None]).clamp_(-127, 127)
    dsum = (a.reshape(r, k // group, group).sum(-1) * d.repeat_interleave(QB // group, dim=1))
    return a.reshape(r, k), d, dsum


def qgemm_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                    bits: int, group: int, zero: int, lut: torch.Tensor | None = None) -> torch.Tensor:
    """The same arithmetic in float64: quantized activations times the dequantized codes, blockwise."""
    r, k = x.shape
    a, d, _ = quantize_activations(x, group)
    u = unpack_codes(codes, bits, k)
    u = (u if lut is None else lut[u.long()]).double()
    s = scales.double().repeat_interleave(group, dim=1)
    o = -zero * s if offsets is None else offsets.double().repeat_interleave(group, dim=1)
    xq = a.double() * d.double().repeat_interleave(QB, dim=1)
    return (xq @ (u * s + o).t()).float()


def unpack_codes(codes: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """(N, K·bits/8) uint8 -> (N, K) codes; 4-bit blocks of 32 hold code j in byte j's low nibble, j + 16 high;
    5-bit blocks those 16 bytes then 4 whose bit j is code j's 16 (engine/quant/block_codes.pack_fives)."""
    if bits == 8:
        return codes
    n = codes.shape[0]
    c = codes.reshape(n, k // QB, QB // 8 * bits)
    low = torch.cat([c[..., :16] & 0x0F, c[..., :16] >> 4], dim=-1)
    if bits == 5:
        shifts = torch.arange(8, dtype=torch.uint8)
        fifth = ((c[..., 16:, None] >> shifts) & 1).reshape(n, k // QB, QB)  # bit j of the 4 bytes, little-endian
        low = low | (fifth << 4)
    return low.reshape(n, k)
