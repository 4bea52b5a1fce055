"""A mixture of experts' chosen experts on the GPU without the host: every (row, expert) pair's product, the experts
read from a stacked tensor by index on the device (kernels/moe_triton.py), and each row's experts summed with their
weights; with the implementation switch of the other ops (`impl="reference"` is plain PyTorch, `"triton"` the
kernels)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention import _use_triton
from kernels.quant_linear import WORDS, int4_rows_reference, is_fp4

FORMATS = ("int4", "fp4", "int8", "bf16")
TILE_ROWS = 16  # pairs of one expert a grouped tile takes: one 16-row dot
TABLE_PAIRS = 1024  # pairs up to which one program lays out the tiles (a decode step's; prefill chunks: torch's sort)


@dataclass(frozen=True, slots=True)
class PairTiles:
    """A step's (row, expert) pairs grouped by expert for the products: tile t is the pairs
    `order[starts[t]:starts[t + 1]]`, up to TILE_ROWS of one expert (`experts` sorted); unused tiles are empty. Its
    size depends only on the pair count, so a step of the same rows replays as one CUDA graph."""

    order: torch.Tensor  # (P,) int32: pair indices sorted by expert, ascending within one
    experts: torch.Tensor  # (P,) int32: their experts, ascending
    starts: torch.Tensor  # (capacity + 1,) int32

    @property
    def capacity(self) -> int:
        return self.starts.shape[0] - 1


def tile_capacity(pairs: int, num_experts: int) -> int:
    """The most tiles `pairs` pairs over `num_experts` experts can make: one per TILE_ROWS pairs, one more per expert."""
    return pairs // TILE_ROWS + min(num_experts, pairs)


def pair_tiles(experts: torch.Tensor, num_experts: int, *, impl: str = "auto") -> PairTiles:
    """The tiles of pairs whose experts are `experts` (P,), on the device without a host sync: a decode step's in one
    launch; beyond TABLE_PAIRS pairs (prefill chunks, whose one program would compare every pair with every other)
    through torch's sort and a few element-wise ops, which give the same tiles."""
    p = experts.shape[0]
    capacity = tile_capacity(p, num_experts)
    if _use_triton(impl, experts) and p <= TABLE_PAIRS:
        import triton

        from kernels.moe_triton import _pair_tiles

        order = torch.empty(p, dtype=torch.int32, device=experts.device)
        sorted_experts = torch.empty_like(order)
        starts = torch.empty(capacity + 1, dtype=torch.int32, device=experts.device)
        block = triton.next_power_of_2(max(p, 1))
        _pair_tiles[(1,)](experts.contiguous(), order, sorted_experts, starts, p, capacity, BLOCK=block,
                          CHUNK=max(1, min(block, 8192 // block)), TBLOCK=triton.next_power_of_2(capacity + 1))
        return PairTiles(order, sorted_experts, starts)
    sorted_experts, order = torch.sort(experts.to(torch.int32), stable=True)
    i = torch.arange(p, device=experts.device)
    new = torch.ones(p, dtype=torch.bool, device=experts.device)
    new[1:] = sorted_experts[1:] != sorted_experts[:-1]
    first = torch.cummax(torch.where(new, i, 0), 0).values  # each pair's expert's first sorted pair
    opens = (i - first) % TILE_ROWS == 0
    tile = torch.cumsum(opens, 0) - 1
    starts = torch.full((capacity + 2,), p, dtype=torch.int32, device=experts.device)
    starts.scatter_(0, torch.where(opens, tile, capacity + 1), i.to(torch.int32))  # the last slot: a dump
    slots = torch.arange(capacity + 1, device=experts.device)
    starts = torch.where(slots < opens.sum(), starts[:capacity + 1], p).to(torch.int32)
    return PairTiles(order.to(torch.int32), sorted_experts, starts)


def experts_linear(x: torch.Tensor, fmt: str, stacked: dict[str, torch.Tensor], experts: torch.Tensor, x_div: int,
                   *, tiles: PairTiles | None = None, impl: str = "auto") -> torch.Tensor:
    """(P, N) in x's dtype: row p = x[p // x_div] @ W_{experts[p]}ᵀ, for P = len(experts) pairs; `stacked` holds every
    expert's buffers of format `fmt` along a first axis (int4: words, pairs; int8: codes, scale; bf16: weight).
    `tiles` (`pair_tiles(experts, ...)`): the pairs of an expert run side by side, reading it once per tile; each row's
    bits are the same either way."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
    pairs = experts.shape[0]
    if _use_triton(impl, x):
        return _experts_triton(x, fmt, stacked, experts, x_div, pairs, tiles)
    rows = x.index_select(0, torch.arange(pairs, device=x.device) // x_div)
    out = [rows[p:p + 1].float() @ _dense(fmt, stacked, int(e), x.shape[1]).t() for p, e in enumerate(experts.tolist())]
    return torch.cat(out).to(x.dtype)


def weighted_rows(y: torch.Tensor, weights: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """(T, H) in y's dtype: row t = Σ_j weights[t, j] · y[t·k + j] in fp32, j in order; y (T·k, H), weights (T, k)."""
    t, k = weights.shape
    if _use_triton(impl, y):
        from kernels.moe_triton import _weighted_rows

        out = torch.empty(t, y.shape[1], dtype=y.dtype, device=y.device)
        block = 1024
        _weighted_rows[(t, -(-y.shape[1] // block))](y, weights.float().contiguous(), out, y.shape[1], KTOP=k,
                                                    BLOCK_H=block)
        return out
    parts = y.float().reshape(t, k, -1) * weights.float()[..., None]
    total = parts[:, 0]
    for j in range(1, k):
        total = total + parts[:, j]
    return total.to(y.dtype)


def _dense(fmt: str, stacked: dict[str, torch.Tensor], e: int, k: int) -> torch.Tensor:
    """Expert e's matrix in fp32."""
    if fmt in WORDS:
        return int4_rows_reference(stacked["words"][e], stacked["pairs"][e], torch.float32, k)
    if fmt == "int8":
        return stacked["codes"][e].float() * stacked["scale"][e].float()[:, None]
    return stacked["weight"][e].float()


def _experts_triton(x: torch.Tensor, fmt: str, stacked: dict[str, torch.Tensor], experts: torch.Tensor, x_div: int,
                    pairs: int, tiles: PairTiles | None) -> torch.Tensor:
    import triton

    from kernels.moe_triton import _int4_experts, _rows_experts
    from kernels.quant_linear_triton import _asm, int4_layout, int4_tiles, int8_tiles

    x = x if x.stride(1) == 1 else x.contiguous()
    experts = experts.contiguous()  # any integer type: the kernels read it as it is
    # grouped: tiles of one expert's pairs (their sorted experts read per tile); else one pair per program
    grid_tiles, ex, order, starts = (tiles.capacity, tiles.experts, tiles.order, tiles.starts) if tiles is not None \
        else (pairs, experts, experts, experts)
    interpret = x.device.type == "cpu"
    dot_fp32 = interpret and x.dtype == torch.bfloat16
    k = x.shape[1]
    if fmt in WORDS:
        words, pairs_, tile = int4_layout(stacked["words"][0], stacked["pairs"][0])
        n, kp = words.shape[0], words.shape[1] * 8
        bn, step, stages, warps = int4_tiles(n, kp // 128, interpret, 16)
        y = torch.empty(pairs, n, dtype=x.dtype, device=x.device)
        _int4_experts[(triton.cdiv(n, bn), grid_tiles)](
            x, stacked["words"], stacked["pairs"], ex, order, starts, y, n, k, kp, x_div, x.stride(0),
            stacked["words"].stride(0), words.stride(0) * tile, stacked["pairs"].stride(0), pairs_.stride(0) * tile,
            y.stride(0), BLOCK_N=bn, CHUNKS=step, DOT_FP32=dot_fp32, ASM=_asm(x), TILE=tile,
            GROUPED=tiles is not None, FP4=is_fp4(pairs_), num_warps=warps, num_stages=stages)
        return y
    codes = stacked["codes"] if fmt == "int8" else stacked["weight"]
    scale = stacked["scale"] if fmt == "int8" else codes
    n = codes.shape[1]
    bn, bk, stages, warps = int8_tiles(n, interpret, 16)
    y = torch.empty(pairs, n, dtype=x.dtype, device=x.device)
    _rows_experts[(triton.cdiv(n, bn), grid_tiles)](
        x, codes, scale, ex, order, starts, y, n, k, x_div, x.stride(0), codes.stride(0), codes.stride(1),
        scale.stride(0), y.stride(0), BLOCK_N=bn, BLOCK_K=bk, DOT_FP32=dot_fp32, SCALED=fmt == "int8",
        GROUPED=tiles is not None, num_warps=warps, num_stages=stages)
    return y
