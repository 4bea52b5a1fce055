"""sdpa_varlen (Triton) against a float64 oracle: the reference over flat, position-indexed storage.

On CPU the Triton kernels run under TRITON_INTERPRET=1 (see conftest.py) at small shapes;
on CUDA the same tests run at larger shapes, in bf16 too, plus graph-replay and Gemma-shaped
cases. The kernel under test reads ring storage; the oracle reads a flat copy holding every
position, so ring indexing is checked independently. Unwritten storage and uncovered query
rows are NaN: any read of them shows up as a NaN in the output.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch

from kernels import sdpa_varlen, sdpa_varlen_reference, triton_available

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
# Interpreter: fp32 is numpy-exact; fp16 dots round P to fp16; bf16 is cast to fp32 in-kernel
# (bf16 dots are wrong in the interpreter) so only its storage rounding shows.
TOL = {
    torch.float32: 1e-4 if ON_GPU else 2e-5,
    torch.float16: 4e-3,
    torch.bfloat16: 3e-2,
    torch.float64: 1e-10,  # the reference checked against itself
}
SCALE = 0.09  # deliberately not D**-0.5 (Gemma scales by query_pre_attn_scalar**-0.5)

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (CPU uses the reference)")
pytestmark = pytest.mark.gpu  # run on the GPU when there is one (`make test-gpu`)
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs CUDA: real shapes, bf16 dots, graph capture")


@dataclass
class Step:
    q: torch.Tensor  # (T, H, D), NaN on uncovered rows
    k_cache: torch.Tensor  # (rows, C, Hkv, D) the storage under test (ring when rows is given)
    v_cache: torch.Tensor
    k_flat: torch.Tensor  # (max_kv, C, Hkv, D) row == position: the oracle's storage
    v_flat: torch.Tensor
    seq_info: torch.Tensor  # (S, 4) int32
    covered: torch.Tensor  # (T,) bool
    max_q_len: int
    max_kv_len: int


def make_step(
    segments: list[tuple[int, int]],  # (q_len, kv_end) per segment
    *,
    Hkv: int,
    G: int,
    D: int,
    dtype: torch.dtype,
    rows: int | None = None,  # None: flat storage
    gaps: bool = True,
    seed: int = 0,
    exact: bool = False,  # small integers: q.k and softmax sums come out exact whatever a dot's order
) -> Step:
    gen = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    S = len(segments)
    C = S + 2  # spare columns; the last is scratch
    max_kv = max([kv for _, kv in segments] + [1])
    rows = rows or max_kv
    cols = torch.randperm(C - 1, generator=gen)[:S].tolist()
    nan = float("nan")
    k_flat = torch.full((max_kv, C, Hkv, D), nan, dtype=dtype)
    v_flat = torch.full((max_kv, C, Hkv, D), nan, dtype=dtype)
    k_cache = torch.full((rows, C, Hkv, D), nan, dtype=dtype)
    v_cache = torch.full((rows, C, Hkv, D), nan, dtype=dtype)
    table, t = [], 0
    for (q_len, kv_end), col in zip(segments, cols):
        assert kv_end >= q_len
        t += rnd.randint(0, 2) if gaps else 0
        table.append((t, q_len, col, kv_end))
        t += q_len
        k = _draw((kv_end, Hkv, D), gen, exact, sparse=True).to(dtype)
        v = _draw((kv_end, Hkv, D), gen, exact, sparse=False).to(dtype)
        k_flat[:kv_end, col], v_flat[:kv_end, col] = k, v
        # A ring keeps the last `rows` positions, each at row p % rows.
        live = torch.arange(max(0, kv_end - rows), kv_end)
        k_cache[live % rows, col], v_cache[live % rows, col] = k[live], v[live]
    T = t + (rnd.randint(0, 2) if gaps else 0)
    covered = torch.zeros(T, dtype=torch.bool)
    for q_start, q_len, _, _ in table:
        covered[q_start : q_start + q_len] = True
    q = _draw((T, Hkv * G, D), gen, exact, sparse=True).to(dtype)
    q[~covered] = nan
    seq_info = torch.tensor(table, dtype=torch.int32).view(S, 4)
    on = lambda x: x.to(DEVICE)  # noqa: E731
    return Step(
        on(q), on(k_cache), on(v_cache), on(k_flat), on(v_flat), on(seq_info), on(covered),
        max([ql for ql, _ in segments] + [0]), max_kv,
    )


def _draw(shape: tuple[int, ...], gen: torch.Generator, exact: bool, sparse: bool) -> torch.Tensor:
    if not exact:
        return torch.randn(shape, generator=gen)
    if sparse:  # q and k: 0/1, a score is a small count
        return (torch.rand(shape, generator=gen) < 0.15).float()
    return torch.randint(-2, 3, shape, generator=gen).float()


def oracle(step: Step, *, causal: bool, window: int | None, softcap: float = 0.0,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    return sdpa_varlen_reference(
        step.q.double(), step.k_flat.double(), step.v_flat.double(), step.seq_info,
        scale=SCALE, max_q_len=step.max_q_len, max_kv_len=step.max_kv_len,
        causal=causal, window=window, rows_are_ring=False, softcap=softcap,
        sinks=None if sinks is None else sinks.double(),
    )


def run_triton(step: Step, *, causal: bool, window: int | None, num_splits: int | None = None,
               softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    return sdpa_varlen(
        step.q, step.k_cache, step.v_cache, step.seq_info,
        scale=SCALE, max_q_len=step.max_q_len, max_kv_len=step.max_kv_len,
        causal=causal, window=window, num_splits=num_splits, softcap=softcap, sinks=sinks, impl="triton",
    )


def check(out: torch.Tensor, ref: torch.Tensor, step: Step) -> None:
    assert out.shape == step.q.shape and out.dtype == step.q.dtype
    assert torch.isfinite(out).all(), "NaN/inf: the kernel read unwritten storage or an uncovered row"
    assert (out[~step.covered] == 0).all(), "rows no segment covers must be zero"
    tol = TOL[out.dtype]
    torch.testing.assert_close(out[step.covered].double(), ref[step.covered], atol=tol, rtol=tol)


def scaled(small: list[tuple[int, int]], big: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return big if ON_GPU else small


MIXED = scaled(
    [(3, 11), (1, 20), (5, 5), (0, 0), (2, 9), (1, 1)],
    [(37, 1100), (1, 2000), (128, 128), (0, 0), (5, 3000), (1, 1), (1, 700)],
)


@needs_triton
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("G", [1, 2, 4, 8])
@pytest.mark.parametrize("D", [64, 128, 256, 80, 96])  # and head dims that are not powers of two
def test_gqa_ratios_and_head_dims(causal: bool, G: int, D: int) -> None:
    step = make_step(MIXED, Hkv=2 if G <= 2 else 1, G=G, D=D, dtype=torch.float16, seed=G * D)
    check(run_triton(step, causal=causal, window=None), oracle(step, causal=causal, window=None), step)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_dtypes(dtype: torch.dtype, causal: bool) -> None:
    step = make_step(MIXED, Hkv=2, G=2, D=64, dtype=dtype, seed=3)
    check(run_triton(step, causal=causal, window=None), oracle(step, causal=causal, window=None), step)


RING_Q = 64 if ON_GPU else 6  # max_write: the most tokens a sequence writes in one step
RING_CASES = scaled(
    [(6, 50), (1, 33), (4, 4), (1, 1), (3, 17), (6, 13)],
    [(64, 5000), (1, 3333), (17, 17), (1, 1), (64, 600), (1, 515)],
)


@needs_triton
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [512, 1000] if ON_GPU else [8, 3])
@pytest.mark.parametrize("slack", [0, 5])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_window_over_ring(causal: bool, window: int, slack: int, num_splits: int) -> None:
    # The smallest ring the cache allocates: window + max_write - 1 rows (plus slack).
    rows = window + RING_Q - 1 + slack
    assert max(kv for _, kv in RING_CASES) > rows, "the test must wrap the ring"
    step = make_step(RING_CASES, Hkv=1, G=4, D=64, dtype=torch.float32, rows=rows, seed=window + slack)
    out = run_triton(step, causal=causal, window=window, num_splits=num_splits)
    check(out, oracle(step, causal=causal, window=window), step)


@needs_triton
def test_window_on_flat_storage() -> None:
    # A sliding-window layer that has not grown into a ring yet: flat rows, rows_are_ring=False.
    step = make_step(MIXED, Hkv=1, G=4, D=64, dtype=torch.float32, seed=11)
    out = sdpa_varlen(
        step.q, step.k_cache, step.v_cache, step.seq_info, scale=SCALE, max_q_len=step.max_q_len,
        max_kv_len=step.max_kv_len, window=7, rows_are_ring=False, impl="triton",
    )
    check(out, oracle(step, causal=True, window=7), step)


@needs_triton
@pytest.mark.parametrize("q_len", [1, 2, 7, 16, 33] + ([128, 512] if ON_GPU else []))
@pytest.mark.parametrize("causal", [True, False])
def test_query_lengths_from_decode_to_chunk(q_len: int, causal: bool) -> None:
    ctx = 900 if ON_GPU else 20
    step = make_step([(q_len, q_len + ctx), (1, ctx // 2)], Hkv=1, G=4, D=64, dtype=torch.float32, seed=q_len)
    check(run_triton(step, causal=causal, window=None), oracle(step, causal=causal, window=None), step)


def random_segments(seed: int, n: int) -> list[tuple[int, int]]:
    rnd = random.Random(seed)
    q_max, ctx_max = (80, 3000) if ON_GPU else (9, 40)
    segs = []
    for _ in range(n):
        q_len = rnd.choice([0, 1, 1, 1, rnd.randint(1, q_max)])
        segs.append((q_len, q_len + (0 if q_len == 0 else rnd.randint(0, ctx_max))))
    return segs


@needs_triton
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_splits", [1, None])
def test_many_sequences_of_mixed_lengths(seed: int, num_splits: int | None) -> None:
    segs = random_segments(seed, 24 if ON_GPU else 10)
    window = [None, 10 if not ON_GPU else 300, None][seed]
    causal = seed != 1 or not ON_GPU
    rows = None
    if window:
        rows = window + max(q for q, _ in segs) - 1
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    step = make_step(segs, Hkv=1, G=4, D=128, dtype=dtype, rows=rows, seed=seed)
    check(run_triton(step, causal=causal, window=window, num_splits=num_splits), oracle(step, causal=causal, window=window), step)


@needs_triton
@pytest.mark.parametrize("num_splits", [1, 2, 4, 7, 16])
@pytest.mark.parametrize("D", [64, 80])
def test_split_k_widths(num_splits: int, D: int) -> None:
    # 16 splits over ~40 keys leaves most splits empty: they must merge as nothing.
    step = make_step(scaled([(1, 40), (2, 23), (1, 3)], [(1, 4000), (2, 2300), (1, 3)]),
                     Hkv=2, G=2, D=D, dtype=torch.float32, seed=num_splits)
    check(run_triton(step, causal=True, window=None, num_splits=num_splits), oracle(step, causal=True, window=None), step)


@needs_triton
def test_zero_length_segments_and_uncovered_rows() -> None:
    segs = [(0, 0), (2, 7), (0, 5), (0, 0), (1, 4), (0, 0)]
    step = make_step(segs, Hkv=1, G=2, D=64, dtype=torch.float32, seed=5)
    assert (~step.covered).any()
    for num_splits in (1, 3):
        check(run_triton(step, causal=True, window=None, num_splits=num_splits), oracle(step, causal=True, window=None), step)


@needs_triton
def test_bounds_larger_than_needed() -> None:
    # The grid is planned from host bounds that may exceed this step's real lengths.
    step = make_step([(2, 9), (1, 4)], Hkv=1, G=4, D=64, dtype=torch.float32, seed=9)
    out = sdpa_varlen(
        step.q, step.k_cache, step.v_cache, step.seq_info, scale=SCALE,
        max_q_len=40, max_kv_len=600, impl="triton",
    )
    check(out, oracle(step, causal=True, window=None), step)


@needs_triton
def test_empty_steps() -> None:
    step = make_step([(0, 0), (0, 3)], Hkv=1, G=2, D=64, dtype=torch.float32, seed=1)
    out = run_triton(step, causal=True, window=None)
    assert out.shape == step.q.shape and (out == 0).all()
    no_segments = torch.zeros(0, 4, dtype=torch.int32, device=DEVICE)
    q = torch.randn(3, 2, 64, device=DEVICE)
    out = sdpa_varlen(q, step.k_cache, step.v_cache, no_segments, scale=SCALE, max_q_len=4, max_kv_len=8, impl="triton")
    assert (out == 0).all()


# -- the reference itself (no Triton needed)


def test_reference_ring_matches_flat() -> None:
    step = make_step([(3, 30), (1, 17), (2, 2)], Hkv=1, G=4, D=16, dtype=torch.float64, rows=8 + 3 - 1, seed=2)
    for causal in (True, False):
        ring = sdpa_varlen_reference(step.q, step.k_cache, step.v_cache, step.seq_info, scale=SCALE,
                                     max_q_len=3, max_kv_len=30, causal=causal, window=8)
        check(ring, oracle(step, causal=causal, window=8), step)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window, num_splits", [(None, 1), (None, None), (8 if not ON_GPU else 512, 3)])
def test_softcap(dtype: torch.dtype, window: int | None, num_splits: int | None) -> None:
    """Gemma 2's score cap, softcap · tanh(score / softcap), low enough to bite at these scores; windowed over a ring
    and split."""
    rows = (window + max(q for q, _ in MIXED) - 1) if window else None  # the smallest ring that holds every row's keys
    step = make_step(MIXED, Hkv=2, G=2, D=32, dtype=dtype, rows=rows, seed=3)
    step.q *= 4  # scores well past the cap
    ref = oracle(step, causal=True, window=window, softcap=0.5)
    check(run_triton(step, causal=True, window=window, num_splits=num_splits, softcap=0.5), ref, step)
    uncapped = oracle(step, causal=True, window=window)
    assert (uncapped - ref)[step.covered].abs().max() > 0.05


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window, num_splits", [(None, 1), (None, None), (8 if not ON_GPU else 512, 3)])
def test_sinks(dtype: torch.dtype, window: int | None, num_splits: int | None) -> None:
    """gpt-oss's attention sinks (a logit per query head in each softmax, without a value), whole and split (the
    merge adds the sink once), windowed over a ring; one sink high enough to take most of its head's weight."""
    rows = (window + max(q for q, _ in MIXED) - 1) if window else None
    step = make_step(MIXED, Hkv=2, G=2, D=32, dtype=dtype, rows=rows, seed=5)
    sinks = torch.tensor([0.5, -1.0, 4.0, 2.0], device=step.q.device)
    ref = oracle(step, causal=True, window=window, sinks=sinks)
    check(run_triton(step, causal=True, window=window, num_splits=num_splits, sinks=sinks), ref, step)
    plain = oracle(step, causal=True, window=window)
    assert (plain - ref)[step.covered].abs().max() > 0.05


def test_reference_sinks_match_transformers_softmax() -> None:
    """The reference's sinks as transformers' gpt-oss attention computes them: the sink appended to the scores, the
    softmax taken, its column dropped."""
    step = make_step([(3, 6)], Hkv=1, G=2, D=16, dtype=torch.float64, gaps=False, seed=4)
    sinks = torch.tensor([0.3, -0.7], dtype=torch.float64, device=DEVICE)
    out = sdpa_varlen_reference(step.q, step.k_flat, step.v_flat, step.seq_info, scale=SCALE, max_q_len=3,
                                max_kv_len=6, sinks=sinks)
    col = int(step.seq_info[0, 2])
    k, v = step.k_flat[:, col, 0], step.v_flat[:, col, 0]
    for i, qpos in enumerate(range(3, 6)):
        for g in range(2):
            scores = SCALE * (k[: qpos + 1] @ step.q[i, g])
            p = torch.softmax(torch.cat([scores, sinks[g:g + 1]]), 0)[:-1]
            torch.testing.assert_close(out[i, g], p @ v[: qpos + 1], atol=1e-12, rtol=1e-12)


def test_reference_matches_explicit_softmax() -> None:
    step = make_step([(3, 6)], Hkv=1, G=2, D=16, dtype=torch.float64, gaps=False, seed=4)
    out = sdpa_varlen_reference(step.q, step.k_flat, step.v_flat, step.seq_info, scale=SCALE,
                                max_q_len=3, max_kv_len=6, window=2)
    col = int(step.seq_info[0, 2])
    k, v = step.k_flat[:, col, 0], step.v_flat[:, col, 0]  # (6, D)
    for i, qpos in enumerate(range(3, 6)):
        keys = [qpos - 1, qpos]  # window 2
        for h in range(2):
            w = torch.softmax(step.q[i, h] @ k[keys].T * SCALE, dim=0)
            torch.testing.assert_close(out[i, h], w @ v[keys])


def test_reference_rejects_bounds_that_do_not_hold() -> None:
    step = make_step([(4, 10)], Hkv=1, G=1, D=16, dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="planned bounds"):
        sdpa_varlen_reference(step.q, step.k_flat, step.v_flat, step.seq_info, scale=SCALE, max_q_len=3, max_kv_len=10)


def test_auto_and_unknown_impl() -> None:
    step = make_step([(2, 5)], Hkv=1, G=2, D=16, dtype=torch.float32, seed=0)
    args = (step.q, step.k_flat, step.v_flat, step.seq_info)
    kw = dict(scale=SCALE, max_q_len=2, max_kv_len=5)
    if not ON_GPU:  # auto picks the reference for CPU tensors, whether Triton is installed or not
        torch.testing.assert_close(sdpa_varlen(*args, **kw), sdpa_varlen(*args, **kw, impl="reference"))
    with pytest.raises(ValueError, match="impl"):
        sdpa_varlen(*args, **kw, impl="cuda")


# -- CUDA only: real shapes, graphs


@needs_triton
@gpu_only
@pytest.mark.parametrize("window", [None, 512])
@pytest.mark.parametrize("mix", ["decode64", "prefill+decode", "draft"])
def test_gemma3_270m_shapes(window: int | None, mix: str) -> None:
    # 4 query heads over 1 KV head, head dim 256, bf16, scale 256**-0.5.
    rnd = random.Random(7)
    if mix == "decode64":
        segs, causal = [(1, rnd.randint(1, 4096)) for _ in range(64)], True
    elif mix == "prefill+decode":
        segs, causal = [(512, 512 + 2048)] + [(1, rnd.randint(1, 4096)) for _ in range(31)], True
    else:  # speculative draft blocks: non-causal over the block
        segs, causal = [(16, rnd.randint(16, 4096)) for _ in range(8)], False
    rows = window + max(q for q, _ in segs) - 1 if window else None
    step = make_step(segs, Hkv=1, G=4, D=256, dtype=torch.bfloat16, rows=rows, gaps=False, seed=len(segs))
    check(run_triton(step, causal=causal, window=window), oracle(step, causal=causal, window=window), step)


@needs_triton
@gpu_only
def test_one_cuda_graph_serves_any_length_mix() -> None:
    S, max_q, max_kv, rows = 8, 16, 2048, 2048
    q = torch.zeros(S * max_q, 4, 256, dtype=torch.bfloat16, device=DEVICE)
    seq_info = torch.zeros(S, 4, dtype=torch.int32, device=DEVICE)
    k_cache = torch.randn(rows, S + 1, 1, 256, device=DEVICE).to(torch.bfloat16)
    v_cache = torch.randn(rows, S + 1, 1, 256, device=DEVICE).to(torch.bfloat16)
    call = lambda: sdpa_varlen(q, k_cache, v_cache, seq_info, scale=SCALE, max_q_len=max_q,  # noqa: E731
                               max_kv_len=max_kv, impl="triton")
    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    rnd = random.Random(0)
    for _ in range(4):
        table, t = [], 0
        for col in range(S):
            q_len = rnd.choice([0, 1, rnd.randint(1, max_q)])
            table.append((t, q_len, col, rnd.randint(q_len, max_kv) if q_len else 0))
            t += q_len
        seq_info.copy_(torch.tensor(table, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        ref = sdpa_varlen_reference(q.double(), k_cache.double(), v_cache.double(), seq_info, scale=SCALE,
                                    max_q_len=max_q, max_kv_len=max_kv)
        covered = torch.zeros(q.shape[0], dtype=torch.bool, device=DEVICE)
        covered[:t] = True
        assert (out[~covered] == 0).all()
        torch.testing.assert_close(out[covered].double(), ref[covered], atol=3e-2, rtol=3e-2)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 40])
def test_a_decode_row_is_the_same_alone_and_batched(dtype: torch.dtype, window: int | None) -> None:
    """A one-row query's output never depends on its step: other rows' lengths (so the step's split count) and the
    number of segments change nothing, bit for bit (batched == alone; a verify row == the decode step)."""
    lengths = scaled([5, 70, 33, 130, 1], [5, 700, 330, 1300, 1])
    step = make_step([(1, n) for n in lengths], Hkv=2, G=4, D=64, dtype=dtype, seed=11)
    together = run_triton(step, causal=True, window=window)
    for i, (q_start, _, _, _) in enumerate(step.seq_info.tolist()):
        info = step.seq_info[i:i + 1].clone()
        info[0, 0] = 0  # the row alone: a one-token step
        alone = sdpa_varlen(step.q[q_start:q_start + 1], step.k_cache, step.v_cache, info, scale=SCALE, max_q_len=1,
                            max_kv_len=lengths[i], causal=True, window=window, impl="triton")
        assert torch.equal(alone[0], together[q_start]), (i, lengths[i])


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 40])
def test_a_verify_row_is_the_decode_row_at_its_position(dtype: torch.dtype, window: int | None) -> None:
    """Each row of a multi-row segment (speculative verify) equals, bit for bit, the one-token step at its position,
    also where the segment's rows straddle a doubling of the split width, and where a window's start moves row by
    row (split bounds at fixed positions, not at the tile's first key). The GPU's MMA rounds a row the same at any
    tile position; the interpreter's numpy dot may not, so there the data are small integers (scale ln 2: integer
    scores in the log2 domain) and a split's sums are exact: only where the splits cut can change a bit."""
    q_len = 6
    ends = scaled([35, 100, 68], [8196, 9000, 300])  # rows over 30..35 keys cross the interpreter's 32-key doubling
    scale = SCALE if ON_GPU else math.log(2)
    step = make_step([(q_len, n) for n in ends], Hkv=2, G=4, D=64, dtype=dtype, seed=5,
                     rows=(window + 64) if window else None, exact=not ON_GPU)
    together = sdpa_varlen(step.q, step.k_cache, step.v_cache, step.seq_info, scale=scale, max_q_len=q_len,
                           max_kv_len=step.max_kv_len, causal=True, window=window, impl="triton")
    for q_start, _, column, kv_end in step.seq_info.tolist():
        for j in range(q_len):
            info = torch.tensor([[0, 1, column, kv_end - q_len + j + 1]], dtype=torch.int32, device=DEVICE)
            alone = sdpa_varlen(step.q[q_start + j:q_start + j + 1], step.k_cache, step.v_cache, info, scale=scale,
                                max_q_len=1, max_kv_len=kv_end, causal=True, window=window, impl="triton")
            assert torch.equal(alone[0], together[q_start + j]), (kv_end, j)
