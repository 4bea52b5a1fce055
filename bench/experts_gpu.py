"""A mixture layer's expert products alone on one GPU (kernels/moe.py `experts_linear`, as the engine's decode steps
run them): gpt-oss-20b's shapes (32 experts, hidden 2880, gate|up 5760 × 2880, down 2880 × 2880, top 4), the experts
held as MXFP4's fp4 words, as int8 rows (what MXFP4 became on CUDA before fp4) and as bf16. Each (rows, format) is
timed in one CUDA graph over several layers' copies (more bytes than L2 holds), experts drawn at random per row.
Prints JSON lines: rows, format, us a layer, the layer's resident MB and the ratio against int8 and bf16.

    python -m bench.experts_gpu --rows 1 8 64
"""
from __future__ import annotations

import argparse
import json
from contextlib import contextmanager

import numpy as np
import torch

from bench.attention_bench import time_graph
from engine.quant.weight import mxfp4_words
from kernels.moe import experts_linear, pair_tiles

EXPERTS, HIDDEN, INTER, TOP = 32, 2880, 2880, 4
GROUP_ROWS = 2  # from this many rows an expert's pairs run side by side (engine/models/moe.py `group_rows`)


def _fp4(n: int, k: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """Every expert's (n, k) MXFP4 matrix (random codes, scales near gpt-oss's) as stacked fp4 words and exponents."""
    blocks = rng.integers(0, 256, (n, k // 32, 17), dtype=np.uint8)
    parts = []
    for _ in range(EXPERTS):
        blocks[..., 0] = rng.integers(116, 126, (n, k // 32))
        q = mxfp4_words(blocks.reshape(n, -1), k)
        parts.append((q.words, q.pairs))
    return {"words": torch.stack([w for w, _ in parts]).cuda(), "pairs": torch.stack([p for _, p in parts]).cuda()}


def _int8(n: int, k: int) -> dict[str, torch.Tensor]:
    return {"codes": torch.randint(-127, 128, (EXPERTS, n, k), dtype=torch.int8, device="cuda"),
            "scale": torch.full((EXPERTS, n), 1e-3, dtype=torch.bfloat16, device="cuda")}


def _bf16(n: int, k: int) -> dict[str, torch.Tensor]:
    return {"weight": torch.randn(EXPERTS, n, k, dtype=torch.bfloat16, device="cuda") * 0.02}


def _copies(stacked: dict[str, torch.Tensor], copies: int) -> list[dict[str, torch.Tensor]]:
    return [stacked] + [{name: t.clone() for name, t in stacked.items()} for _ in range(copies - 1)]


def _layer(fmt: str, gate_up: dict, down: dict, x: torch.Tensor, experts: torch.Tensor):
    tiles = pair_tiles(experts, EXPERTS) if x.shape[0] >= GROUP_ROWS else None

    def run() -> None:
        h = experts_linear(x, fmt, gate_up, experts, TOP, tiles=tiles)
        experts_linear(h[:, :INTER].contiguous(), fmt, down, experts, 1, tiles=tiles)
    return run


@contextmanager
def _tiles(tile: tuple[int, int, int, int]):
    """The int4/fp4 kernels' tiles fixed to `tile` (kernels/quant_linear_triton.py `int4_tiles`) for a while."""
    import kernels.quant_linear_triton as qlt

    default = qlt.int4_tiles
    qlt.int4_tiles = lambda *args, **kw: tile
    try:
        yield
    finally:
        qlt.int4_tiles = default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--copies", type=int, default=4, help="layers' copies of every format's experts in one graph")
    ap.add_argument("--fp4-tiles", type=json.loads, default=[],
                    help='fp4 tiles tried besides the default, JSON [[block_n, chunks, stages, warps], ...]')
    opts = ap.parse_args()
    rng = np.random.default_rng(0)
    weights = {"fp4": (_fp4(2 * INTER, HIDDEN, rng), _fp4(HIDDEN, INTER, rng)),
               "int8": (_int8(2 * INTER, HIDDEN), _int8(HIDDEN, INTER)),
               "bf16": (_bf16(2 * INTER, HIDDEN), _bf16(HIDDEN, INTER))}
    layers = {fmt: list(zip(_copies(gu, opts.copies), _copies(dn, opts.copies))) for fmt, (gu, dn) in weights.items()}
    g = torch.Generator().manual_seed(1)
    for m in opts.rows:
        x = torch.randn(m, HIDDEN, generator=g).to(torch.bfloat16).cuda()
        chosen = [torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP].sort().values for _ in range(m)]).reshape(-1)
                  .cuda() for _ in range(opts.copies)]
        us = {fmt: time_graph([_layer(fmt, gu, dn, x, e) for (gu, dn), e in zip(copies, chosen)]) * 1e3
              for fmt, copies in layers.items()}
        for tile in opts.fp4_tiles:
            with _tiles(tuple(tile)):
                us[f"fp4 {tile}"] = time_graph([_layer("fp4", gu, dn, x, e)
                                                for (gu, dn), e in zip(layers["fp4"], chosen)]) * 1e3
        for fmt, t in us.items():
            mb = sum(t.numel() * t.element_size() for part in weights[fmt.split()[0]] for t in part.values()) / 2**20
            print(json.dumps({"rows": m, "format": fmt, "us_per_layer": round(t, 2), "layer_mb": round(mb, 1),
                              "vs_int8": round(us["int8"] / t, 3), "vs_bf16": round(us["bf16"] / t, 3)}), flush=True)


if __name__ == "__main__":
    main()
