"""What a step's candidates cost: torch.topk over whole rows against two stages (each slice's top-k, then the top-k
of those), a candidate for the GPU sampler's top-k that was measured slower and not taken (docs/ENGINE.md).

    python -m bench.topk [--device cuda] [--rows 1 8 64] [--widths 40 256] [--vocabs 262144 128256]
                         [--blocks 2048 4096 8192] [--calls 20] [--rounds 5]

Each variant is captured in a CUDA graph of `calls` calls (as the sampling graphs replay it; on the CPU it runs
eagerly) and replayed `rounds` times; the best replay counts. Logits are random values rounded to bf16, as a bf16
model's are, so the boundary often ties. One JSON line per (vocab, rows, width, variant): µs a call, the ratio to
torch.topk in the same process, and whether the chosen ids equal torch.topk's (as sets) on those rows and on rows
of a few distinct values (ties everywhere), and whether a row picks the same ids alone as in the batch.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import emit  # noqa: E402


def largest(rows: torch.Tensor, width: int, block: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `width` largest logits and their ids, in no order, in two stages: the top-k of each slice of
    `block` logits, then the top-k of those (a row's largest `width` are among its slices' largest `width`). Ties
    at the boundary go to the lowest id, as torch.topk takes them on CUDA; a tail past the last whole slice last."""
    vocab = rows.shape[-1]
    slices = vocab // block
    whole = slices * block
    top, ids = rows[:, :whole].unflatten(1, (slices, block)).topk(width, dim=-1, sorted=False)
    ids = (ids + torch.arange(0, whole, block, device=rows.device)[:, None]).flatten(1)
    top = top.flatten(1)
    if whole < vocab:
        tail, tail_ids = rows[:, whole:].topk(min(width, vocab - whole), dim=-1, sorted=False)
        top, ids = torch.cat([top, tail], 1), torch.cat([ids, tail_ids + whole], 1)
    top, at = top.topk(width, dim=-1, sorted=False)
    return top, ids.gather(1, at)


def _logits(rows: int, vocab: int, device: torch.device, distinct: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(rows * 7 + vocab)
    if distinct:  # a few values only: every boundary ties
        x = torch.randint(0, distinct, (rows, vocab), generator=g).float()
    else:
        x = (torch.randn(rows, vocab, generator=g) * 3).bfloat16().float()
    return x.to(device)


def _same_sets(fn: Callable, x: torch.Tensor, width: int) -> bool:
    want = x.topk(width, dim=-1, sorted=False)[1].sort(dim=-1).values
    got = fn(x, width)[1].sort(dim=-1).values
    return bool(torch.equal(want, got))


def _alone_equal(fn: Callable, x: torch.Tensor, width: int) -> bool:
    """Whether each of the first rows picks the same ids alone as in the whole batch (ties included)."""
    together = fn(x, width)[1].sort(dim=-1).values
    return all(torch.equal(fn(x[i:i + 1], width)[1].sort(dim=-1).values, together[i:i + 1]) for i in range(min(4, len(x))))


def _time(fn: Callable, x: torch.Tensor, width: int, calls: int, rounds: int) -> float:
    """µs a call, best of `rounds` replays of `calls` calls."""
    if x.is_cuda:
        fn(x, width)  # warm-up outside the capture: kernels compiled, workspace allocated
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn(x, width)
        run = graph.replay
    else:
        def run() -> None:
            for _ in range(calls):
                fn(x, width)
    best = float("inf")
    for _ in range(rounds + 1):
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        if x.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--widths", type=int, nargs="+", default=[40, 256])
    ap.add_argument("--vocabs", type=int, nargs="+", default=[262144, 128256])
    ap.add_argument("--blocks", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    device = torch.device(args.device)
    variants: dict[str, Callable] = {"torch.topk": lambda x, w: x.topk(w, dim=-1, sorted=False)}
    for b in args.blocks:
        variants[f"largest/{b}"] = lambda x, w, b=b: largest(x, w, block=b)
    for vocab in args.vocabs:
        for rows in args.rows:
            x, ties = _logits(rows, vocab, device), _logits(rows, vocab, device, distinct=5)
            for width in args.widths:
                base = None
                for name, fn in variants.items():
                    us = _time(fn, x, width, args.calls, args.rounds)
                    base = base or us
                    emit(device=args.device, vocab=vocab, rows=rows, width=width, variant=name, us=round(us, 1),
                         vs_topk=round(base / us, 3), same_set=_same_sets(fn, x, width) and _same_sets(fn, ties, width),
                         alone_equal=_alone_equal(fn, x, width) and _alone_equal(fn, ties, width))


if __name__ == "__main__":
    main()
