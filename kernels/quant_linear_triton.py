"""Triton weight-only quantized `x @ wᵀ` for decode-sized row counts (M <= 64), dequantizing in registers.

Decode reads every weight once per step, so bytes are time: a 4-bit weight streams a quarter of bf16's bytes
(plus a bf16 scale and zero per 32), an int8 row half. One program owns a BLOCK_N slice of the output columns
for all rows, loads its packed weight rows a chunk of K at a time, dequantizes them to the activations' dtype
in registers and multiplies on the tensor cores. The row tile is the step's rows rounded up to ROW_TILE (16, 32, 48
or 64), one 16-row dot per 16 rows (the MMA work of a 64-row tile at one row would cost an 8B model ~1 ms a step);
each row's sum runs over K in the same order in every tile, so a row's result does not depend on the step's rows
(tested bit for bit: the same 16-row instruction everywhere; Hopper's 64-row wgmma rounded an int8 row otherwise).

Layouts (engine/quant/weight.py builds them):
  int4  words (N, KP/8) int32, KP = K rounded up to CHUNK = 128 (padding: code 8, scale and zero 0: weight 0).
        In each chunk of 128 weights, word w holds weight 16 i + w in its nibble i (bits 4i..4i+3), so nibble i
        of the chunk's 16 words is one contiguous 16-wide slice of K. pairs (N, KP/128, 4) int32: the chunk's
        four groups of 32 as bf16 pairs (s0|s2, s1|s3, z0|z2, z1|z3), low half first: w = (code - 8) * s + z.
        A nibble pair (i, i + 4) sits 16 bits apart in a word, with groups (i // 2, i // 2 + 2): one bf16x2 each.
        Tiled (where N is a multiple of 16, engine/quant/weight.py): words (N/16, KP/128, 16, 16) and pairs
        (N/16, KP/128, 16, 4), a chunk's 16 rows side by side, so a program's load of a chunk is one contiguous run
        (H200, one row: 8B gate/up 39.4 → 37.7 µs, o 8.6 → 8.0, 270M head 56 → 52; 64 rows: 270M head 139 → 109).
  fp4   MXFP4 (gpt-oss's experts) in int4's words, each nibble a 4-bit float (E2M1: sign, two exponent bits, one
        mantissa bit); pairs (N, KP/128, 1) int32: the chunk's four groups' exponent bytes e (low byte first),
        w = fp4 * 2^(e - 127) (e <= 128; padding: code 0). Tiled as int4, pairs (N/16, KP/128, 16, 1). The kernels
        tell the two kinds apart by the pairs' last dimension (`is_fp4`).
  int8  codes (N, K) int8 and scale (N,): w = code * scale, the scale applied to the output column
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, prefetch_l2_rows, wait_for_previous
from kernels.quant_linear import is_fp4

CHUNK = 128  # weights per int4 chunk
# int8 codes up to this size prefetch into L2 during the previous kernel (H200, one row: 8B v 13.0 → 8.6 µs, 270M
# gate/up 3.8 → 3.5; the 270M head, 168 MB, 53 → 69 µs and int4 matrices lost at every size: not there)
PREFETCH_BYTES = 8 << 20
ROW_TILE = 16  # rows of one tensor-core dot: a step of more rows runs one more dot per 16 on every weight it loads



@triton.jit
def _bf16_half(pair, HIGH: tl.constexpr):
    # one bf16 of a packed pair, as fp32 (exact)
    if HIGH:
        return (pair & -65536).to(tl.float32, bitcast=True)
    return (pair << 16).to(tl.float32, bitcast=True)


@triton.jit
def _code(word, i: tl.constexpr, pairs_a, pairs_b, zeros_a, zeros_b, dt: tl.constexpr):
    # nibble i of each word dequantized in fp32, then to dt: the portable path (interpreter, fp32 activations)
    if (i % 4) < 2:  # nibbles 0, 1, 4, 5: groups 0 and 2, the first pairs
        scale, zero = _bf16_half(pairs_a, i >= 4), _bf16_half(zeros_a, i >= 4)
    else:
        scale, zero = _bf16_half(pairs_b, i >= 4), _bf16_half(zeros_b, i >= 4)
    code = ((word >> (4 * i)) & 0xF).to(tl.float32)
    return ((code - 8.0) * scale + zero).to(dt)


@triton.jit
def _chunk_codes(Q, P, offs_n, n_ok, chunk, stride_qn, stride_pn, dt: tl.constexpr, ASM: tl.constexpr,
                 TILE: tl.constexpr, FP4: tl.constexpr = False):
    # the chunk's eight (BLOCK_N, 16) slices of dequantized weights, slice i = K offsets 16 i .. 16 i + 15; a chunk's
    # TILE rows lie together (1: row-major), stride_qn and stride_pn step one TILE-row group
    w_ok = n_ok[:, None]
    group, r = (offs_n // TILE)[:, None], (offs_n % TILE)[:, None]
    word = tl.load(Q + group * stride_qn + chunk * (16 * TILE) + r * 16 + tl.arange(0, 16)[None, :], mask=w_ok,
                   other=0)
    if FP4:
        e = tl.load(P + group * stride_pn + chunk * TILE + r, mask=w_ok, other=0)  # the four groups' exponent bytes
        # groups (0 | 2) and (1 | 3) as bf16 pairs 2^(e - 1): exponent field e + 126 (e <= 128)
        s_a = ((e & 0x00FF00FF) + 0x007E007E) << 7
        s_b = (((e >> 8) & 0x00FF00FF) + 0x007E007E) << 7
        return _fp4_codes(word, tl.broadcast_to(s_a, word.shape), tl.broadcast_to(s_b, word.shape), dt, ASM)
    # the chunk's four pairs in one 16-byte load per row (four 4-byte loads each touched the row's 32-byte sector: the
    # H200's 8B gate/up at one row 67 → 45.5 µs)
    pairs = tl.load(P + group * stride_pn + chunk * (4 * TILE) + r * 4 + tl.arange(0, 4)[None, :], mask=w_ok, other=0)
    a, b = tl.split(tl.reshape(pairs, (pairs.shape[0], 2, 2)))  # columns (0, 2) and (1, 3)
    s_a, z_a = tl.split(a)
    s_b, z_b = tl.split(b)
    s_a, s_b, z_a, z_b = s_a[:, None], s_b[:, None], z_a[:, None], z_b[:, None]
    if ASM:
        s_a, s_b = tl.broadcast_to(s_a, word.shape), tl.broadcast_to(s_b, word.shape)
        z_a, z_b = tl.broadcast_to(z_a, word.shape), tl.broadcast_to(z_b, word.shape)
        # eight bf16 weights out of one word, two at a time: (word >> 4j) & 0x000f000f | 0x43004300 is the bf16 pair
        # (128 + code j, 128 + code j+4); minus 136 (exact) is (code - 8); one bf16x2 FMA applies (scale, zero)
        return tl.inline_asm_elementwise(
            """
            {
            .reg .b32 q, t, m136, one;
            mov.b32 m136, 0xC308C308;
            mov.b32 one, 0x3F803F80;
            lop3.b32 q, $8, 0x000f000f, 0x43004300, 0xea;
            fma.rn.bf16x2 t, q, one, m136;
            fma.rn.bf16x2 t, t, $9, $11;
            mov.b32 {$0, $4}, t;
            shr.b32 q, $8, 4;
            lop3.b32 q, q, 0x000f000f, 0x43004300, 0xea;
            fma.rn.bf16x2 t, q, one, m136;
            fma.rn.bf16x2 t, t, $9, $11;
            mov.b32 {$1, $5}, t;
            shr.b32 q, $8, 8;
            lop3.b32 q, q, 0x000f000f, 0x43004300, 0xea;
            fma.rn.bf16x2 t, q, one, m136;
            fma.rn.bf16x2 t, t, $10, $12;
            mov.b32 {$2, $6}, t;
            shr.b32 q, $8, 12;
            lop3.b32 q, q, 0x000f000f, 0x43004300, 0xea;
            fma.rn.bf16x2 t, q, one, m136;
            fma.rn.bf16x2 t, t, $10, $12;
            mov.b32 {$3, $7}, t;
            }
            """, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r", [word, s_a, s_b, z_a, z_b],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16,
                   tl.bfloat16), is_pure=True, pack=1,
        )
    return (_code(word, 0, s_a, s_b, z_a, z_b, dt), _code(word, 1, s_a, s_b, z_a, z_b, dt),
            _code(word, 2, s_a, s_b, z_a, z_b, dt), _code(word, 3, s_a, s_b, z_a, z_b, dt),
            _code(word, 4, s_a, s_b, z_a, z_b, dt), _code(word, 5, s_a, s_b, z_a, z_b, dt),
            _code(word, 6, s_a, s_b, z_a, z_b, dt), _code(word, 7, s_a, s_b, z_a, z_b, dt))


def _fp4_pair_ptx(j: int) -> str:
    """PTX for nibbles j and j + 4 of word $8 -> outputs $j and $(j + 4): the sign moved to bit 15 (and 31), the other
    three bits to bits 6-8 (and 22-24), times scale pair $9 (j < 2: groups 0 | 2) or $10 (groups 1 | 3)."""
    sign = f"shl.b32 a, $8, {12 - 4 * j};" if j < 3 else "mov.b32 a, $8;"
    rest = f"shl.b32 b, $8, {6 - 4 * j};" if j < 2 else f"shr.b32 b, $8, {4 * j - 6};"
    return (f"{sign} {rest} and.b32 b, b, 0x01C001C0; lop3.b32 t, a, 0x80008000, b, 0xea; "
            f"fma.rn.bf16x2 t, t, ${9 if j < 2 else 10}, z; mov.b32 {{${j}, ${j + 4}}}, t;")


# eight bf16 weights out of one fp4 word, two at a time (`_fp4_codes`); z: the product's addend, -0
FP4_PTX = tl.constexpr("{ .reg .b32 a, b, t, z; mov.b32 z, 0x80008000; "
                       + " ".join(_fp4_pair_ptx(j) for j in range(4)) + " }")


@triton.jit
def _fp4_codes(word, s_a, s_b, dt: tl.constexpr, ASM: tl.constexpr):
    # `_chunk_codes`' slices of 4-bit floats: the nibble's bits placed in a bf16 as sign, the exponent field's two low
    # bits and the mantissa's top bit make fp4 * 2^-126 (subnormal where the exponent is 0), exact; times the group's
    # 2^(e - 1) (one bf16x2 FMA, exact) it is fp4 * 2^(e - 127)
    if ASM:
        return tl.inline_asm_elementwise(
            FP4_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [word, s_a, s_b],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16,
                   tl.bfloat16), is_pure=True, pack=1,
        )
    return (_fp4(word, 0, s_a, dt), _fp4(word, 1, s_a, dt), _fp4(word, 2, s_b, dt), _fp4(word, 3, s_b, dt),
            _fp4(word, 4, s_a, dt), _fp4(word, 5, s_a, dt), _fp4(word, 6, s_b, dt), _fp4(word, 7, s_b, dt))


@triton.jit
def _fp4(word, i: tl.constexpr, scales, dt: tl.constexpr):
    # nibble i of each word as a 4-bit float times its group's scale, in fp32 (exact), then to dt: the portable path
    q = (word >> (4 * i)) & 0xF
    mag = q & 7
    power = tl.where(mag < 4, 0.5, tl.where(mag < 6, 1.0, 2.0))  # 2^(exponent - 2), exponent 1..3
    value = tl.where(mag < 2, mag.to(tl.float32) * 0.5, ((mag & 1) + 2).to(tl.float32) * power)
    value = tl.where(q >= 8, -value, value)
    scale = _bf16_half(scales, i >= 4) * 1.1754943508222875e-38  # 2^(e - 1) * 2^-126
    return (value * scale).to(dt)


@triton.jit
def _slice_dot(X, offs_m, m_ok, k, K, stride_xm, w, acc, DOT_FP32: tl.constexpr):
    # acc += x[:, k : k + 16] @ wᵀ
    x = tl.load(X + offs_m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
    if DOT_FP32:
        x, w = x.to(tl.float32), w.to(tl.float32)
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _chunk_dots(X, rows, M, k, K, stride_xm, w0, w1, w2, w3, w4, w5, w6, w7, acc, DOT_FP32: tl.constexpr):
    # acc += x[rows, chunk] @ chunk's weightsᵀ: eight 16-deep dots over the chunk's slices, k its first slice's offsets
    return _chunk_dots_at(X, rows, rows < M, k, K, stride_xm, w0, w1, w2, w3, w4, w5, w6, w7, acc, DOT_FP32)


@triton.jit
def _chunk_dots_at(X, rows, m_ok, k, K, stride_xm, w0, w1, w2, w3, w4, w5, w6, w7, acc, DOT_FP32: tl.constexpr):
    # `_chunk_dots` for any rows of X (gathered), those where m_ok
    acc = _slice_dot(X, rows, m_ok, k, K, stride_xm, w0, acc, DOT_FP32)
    acc = _slice_dot(X, rows, m_ok, k + 16, K, stride_xm, w1, acc, DOT_FP32)
    acc = _slice_dot(X, rows, m_ok, k + 32, K, stride_xm, w2, acc, DOT_FP32)
    acc = _slice_dot(X, rows, m_ok, k + 48, K, stride_xm, w3, acc, DOT_FP32)
    acc = _slice_dot(X, rows, m_ok, k + 64, K, stride_xm, w4, acc, DOT_FP32)
    acc = _slice_dot(X, rows, m_ok, k + 80, K, stride_xm, w5, acc, DOT_FP32)
    acc = _slice_dot(X, rows, m_ok, k + 96, K, stride_xm, w6, acc, DOT_FP32)
    return _slice_dot(X, rows, m_ok, k + 112, K, stride_xm, w7, acc, DOT_FP32)


@triton.jit
def _int4_linear(
    X, Q, P, Y, M, N, K, KP, CS,
    stride_xm, stride_qn, stride_pn, stride_ym, stride_ys,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, DOT_FP32: tl.constexpr, ASM: tl.constexpr,
    TILE: tl.constexpr, PDL: tl.constexpr, FP4: tl.constexpr,
):
    # program (n, s) sums chunks [s * CS, (s + 1) * CS) and stores at Y[s] (fp32 partials when split); a tile of more
    # than 16 rows dequantizes each chunk once for one 16-row dot per 16 rows (a 64-row dot's wgmma would take the
    # weights through shared memory: the H200's 8B gate/up at 64 rows took 163 µs, 1.7× bf16's time)
    wait_for_previous(PDL)
    rows = tl.arange(0, 16)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    dt: tl.constexpr = X.dtype.element_ty
    acc0 = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    c_lo = tl.program_id(1) * CS
    for c0 in range(c_lo, tl.minimum(KP // 128, c_lo + CS), CHUNKS):  # CHUNKS divides CS and the chunk count
        for c in tl.static_range(CHUNKS):
            chunk = c0 + c
            w0, w1, w2, w3, w4, w5, w6, w7 = _chunk_codes(Q, P, offs_n, n_ok, chunk, stride_qn, stride_pn, dt, ASM,
                                                          TILE, FP4)
            k = chunk * 128 + tl.arange(0, 16)
            acc0 = _chunk_dots(X, rows, M, k, K, stride_xm, w0, w1, w2, w3, w4, w5, w6, w7, acc0, DOT_FP32)
            if BLOCK_M >= 32:
                acc1 = _chunk_dots(X, rows + 16, M, k, K, stride_xm, w0, w1, w2, w3, w4, w5, w6, w7, acc1, DOT_FP32)
            if BLOCK_M >= 48:
                acc2 = _chunk_dots(X, rows + 32, M, k, K, stride_xm, w0, w1, w2, w3, w4, w5, w6, w7, acc2, DOT_FP32)
            if BLOCK_M == 64:
                acc3 = _chunk_dots(X, rows + 48, M, k, K, stride_xm, w0, w1, w2, w3, w4, w5, w6, w7, acc3, DOT_FP32)
    _store_tile(Y + tl.program_id(1) * stride_ys + offs_n[None, :], rows, M, n_ok, acc0, acc1, acc2, acc3, 1.0,
                stride_ym, BLOCK_M)


@triton.jit
def _int8_linear(
    X, C, S, Y, M, N, K, KS,
    stride_xm, stride_cn, stride_ym, stride_ys,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
    PREFETCH: tl.constexpr, LANES: tl.constexpr, PDL: tl.constexpr,
):
    # program (n, s) sums K [s * KS, (s + 1) * KS) and stores at Y[s] (fp32 partials, each scaled, when split); a
    # tile is one 16-row dot per 16 rows, one instruction in every tile (Hopper's 64-row wgmma rounds a row otherwise)
    k_lo = tl.program_id(1) * KS
    if PREFETCH:  # this program's codes of its K slice, into L2 while the last kernel runs
        n_rows = tl.minimum(N - tl.program_id(0) * BLOCK_N, BLOCK_N)
        prefetch_l2_rows(C + tl.program_id(0) * BLOCK_N * stride_cn + k_lo, stride_cn, n_rows,
                         tl.minimum(K - k_lo, KS), BLOCK_N, LANES)
    wait_for_previous(PDL)
    rows = tl.arange(0, 16)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    dt = X.dtype.element_ty
    acc0 = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, tl.minimum(K, k_lo + KS), BLOCK_K):  # BLOCK_K divides KS
        k = k0 + offs_k
        c = tl.load(C + offs_n[:, None] * stride_cn + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0)
        w = c.to(dt)  # |code| <= 127: exact in bf16
        acc0 = _slice_dot(X, rows, rows < M, k, K, stride_xm, w, acc0, DOT_FP32)
        if BLOCK_M >= 32:
            acc1 = _slice_dot(X, rows + 16, rows + 16 < M, k, K, stride_xm, w, acc1, DOT_FP32)
        if BLOCK_M >= 48:
            acc2 = _slice_dot(X, rows + 32, rows + 32 < M, k, K, stride_xm, w, acc2, DOT_FP32)
        if BLOCK_M == 64:
            acc3 = _slice_dot(X, rows + 48, rows + 48 < M, k, K, stride_xm, w, acc3, DOT_FP32)
    scale = tl.load(S + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    _store_tile(Y + tl.program_id(1) * stride_ys + offs_n[None, :], rows, M, n_ok, acc0, acc1, acc2, acc3, scale,
                stride_ym, BLOCK_M)


@triton.jit
def _store_tile(out, rows, M, n_ok, acc0, acc1, acc2, acc3, scale, stride_ym, BLOCK_M: tl.constexpr):
    # the tile's 16-row accumulators, each times `scale`, to rows 0-15, 16-31, ... (those the tile has)
    _store_rows(out, rows, M, n_ok, acc0 * scale, stride_ym)
    if BLOCK_M >= 32:
        _store_rows(out, rows + 16, M, n_ok, acc1 * scale, stride_ym)
    if BLOCK_M >= 48:
        _store_rows(out, rows + 32, M, n_ok, acc2 * scale, stride_ym)
    if BLOCK_M == 64:
        _store_rows(out, rows + 48, M, n_ok, acc3 * scale, stride_ym)


@triton.jit
def _store_rows(out, rows, M, n_ok, y, stride_ym):
    tl.store(out + rows[:, None] * stride_ym, y.to(out.dtype.element_ty), mask=(rows < M)[:, None] & n_ok[None, :])


@triton.jit
def _int4_dequantize(Q, P, W, N, K, stride_qn, stride_pn, stride_wn, BLOCK_N: tl.constexpr, ASM: tl.constexpr,
                     TILE: tl.constexpr, FP4: tl.constexpr):
    # W[n, k] = (code - 8) * scale + zero in W's dtype, one chunk per program column: a prefill GEMM's weight
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    chunk = tl.program_id(1)
    n_ok = offs_n < N
    dt: tl.constexpr = W.dtype.element_ty
    w0, w1, w2, w3, w4, w5, w6, w7 = _chunk_codes(Q, P, offs_n, n_ok, chunk, stride_qn, stride_pn, dt, ASM, TILE,
                                                  FP4)
    k = chunk * 128 + tl.arange(0, 16)
    at = W + offs_n[:, None] * stride_wn + k[None, :]
    _store_slice(at, 0, w0, n_ok, k, K)
    _store_slice(at, 16, w1, n_ok, k, K)
    _store_slice(at, 32, w2, n_ok, k, K)
    _store_slice(at, 48, w3, n_ok, k, K)
    _store_slice(at, 64, w4, n_ok, k, K)
    _store_slice(at, 80, w5, n_ok, k, K)
    _store_slice(at, 96, w6, n_ok, k, K)
    _store_slice(at, 112, w7, n_ok, k, K)


@triton.jit
def _store_slice(at, offset: tl.constexpr, w, n_ok, k, K):
    tl.store(at + offset, w.to(at.dtype.element_ty), mask=n_ok[:, None] & (k + offset < K)[None, :])


def int4_layout(words: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(words (N, KP/8), pairs (N, KP/128, 4 or 1), tile): the kernels' view of either int4 layout (or fp4's), rows in
    tile order (tile 1: row-major; the strides the kernels take are one tile-row group's, `stride(0) * tile`)."""
    if words.dim() == 2:
        return words, pairs, 1
    g, chunks, tile, _ = words.shape
    width = pairs.shape[-1]
    assert words.is_contiguous() and pairs.is_contiguous() and pairs.shape == (g, chunks, tile, width), \
        (words.shape, pairs.shape)
    return words.view(g * tile, chunks * 16), pairs.view(g * tile, chunks, width), tile


def _rows(x: torch.Tensor) -> int:
    """The row tile: the rows rounded up to ROW_TILE, at most 64 (the interpreter: 16; tests only)."""
    cap = ROW_TILE if x.device.type == "cpu" else 4 * ROW_TILE
    assert x.shape[0] <= cap, f"the quantized decode GEMM takes at most {cap} rows here, not {x.shape[0]}"
    return max(1, triton.cdiv(x.shape[0], ROW_TILE)) * ROW_TILE


def _asm(x: torch.Tensor) -> bool:
    """The bf16x2 dequantization in PTX: bf16 activations on a GPU with bf16x2 FMA (compute capability 8+)."""
    return x.is_cuda and x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 8


def _slice_chunks(n_chunks: int, splits: int, step: int) -> int:
    """Chunks per K slice: whole multiples of `step` (`_slice_step`), which every tile's loop step divides, so a
    slice's bounds, and a row's bits, never change with the step's rows."""
    return triton.cdiv(triton.cdiv(n_chunks, splits), step) * step


def _slice_step(n: int, n_chunks: int, interpret: bool = False) -> int:
    """The chunks every K slice of an N-wide matrix is a multiple of: a multiple of each tile's loop step (1 or 2)."""
    if interpret:
        return 1
    return 2 if n < 65536 and n_chunks % 2 == 0 else 1


def int4_slices(n: int, n_chunks: int, splits: int, interpret: bool = False) -> int:
    """The K slices int4_linear_triton returns for `splits` (fewer where the chunks run out)."""
    if splits <= 1:
        return 1
    return triton.cdiv(n_chunks, _slice_chunks(n_chunks, splits, _slice_step(n, n_chunks, interpret)))


def int8_slices(k: int, splits: int, interpret: bool = False) -> int:
    """The K slices int8_linear_triton returns for `splits` (its K step never changes with the rows)."""
    if splits <= 1:
        return 1
    return triton.cdiv(k, _slice_k(k, splits, int8_tiles(0, interpret)[1]))


def _slice_k(k: int, splits: int, block_k: int) -> int:
    """K per int8 slice: whole K steps."""
    return triton.cdiv(triton.cdiv(k, splits), block_k) * block_k


def _result(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=dtype, device=x.device)
    assert out.shape == shape and out.dtype == dtype and out.stride(-1) == 1, (out.shape, shape, out.dtype, dtype)
    return out


def _prefetches(launch: dict, block_n: int, num_warps: int, wanted: bool | None, codes: torch.Tensor) -> bool:
    """Whether an int8 launch prefetches its codes into L2 before waiting on the previous kernel (kernels/pdl.py):
    with PDL, one lane per row at least, rows 16-byte aligned (the bulk prefetch's unit), and `wanted` (None: codes of
    at most PREFETCH_BYTES)."""
    if wanted is None:
        wanted = codes.numel() <= PREFETCH_BYTES
    return wanted and launch["PDL"] and 32 * num_warps >= block_n and codes.data_ptr() % 16 == 0 \
        and codes.stride(0) % 16 == 0 and codes.shape[1] % 16 == 0


def int4_tiles(n: int, n_chunks: int, interpret: bool = False, rows: int = ROW_TILE) -> tuple[int, int, int, int]:
    """(BLOCK_N, chunks per loop step, stages, warps) for an N-wide matrix of `n_chunks` chunks and a `rows`-row tile:
    the H200 sweeps' best (bench/quant_linear_gpu.py --sweep, --configs; two K slices above 16 rows): at one row wide
    tiles for the LM head, narrow ones (more programs) for layers, and below 16384 columns two warps and one chunk a
    step (fewer warps share the activations' shared-memory reads; 8B at one row: qkv 20.3 → 11.9 µs, o 10.0 → 8.6, down
    27.9 → 25.5; 270M gate/up 3.3 → 2.9), at 16384-65535 columns one chunk a step (8B gate/up at 1 / 8 / 16 rows
    35.5 / 37.3 / 39.1 → 33.5 / 34.9 / 37.1 µs, 1B 14.3 / 15.3 / 16.2 → 12.9 / 13.4 / 14.3). Since a sweep of warps
    1-4 (docs/bench/h200-int4-warp-columns.jsonl), 64 columns a warp from 4096 columns up: 128 columns and 2 warps at
    16384-65535 (8B gate/up at 1 / 16 rows 33.8 → 30.5 / 31.8 µs), 64 and one warp at 4096-16383 (8B o 6.8 → 6.2,
    down 18.3 → 16.1 µs, in the 8 K slices the narrower tiles' count gives); above 16 rows 64 columns,
    128 where N >= 6144 (8B at 64 rows: gate/up 135 → 90 µs, down 116 → 64, qkv 70 → 27, o 37 → 20 against the one-row
    tiles)."""
    if interpret:
        return 16, 1, 1, 4
    if rows > ROW_TILE and n < 65536:
        return (128, 2 if n_chunks % 2 == 0 else 1, 3, 4) if n >= 6144 else (64, 1, 3, 4)
    if n >= 65536:
        return 128, 1, 3, 4
    if n >= 16384:
        return 128, 1, 3, 2
    return (64, 1, 3, 1) if n >= 4096 else (32, 1, 4, 2)


def int4_splits(n: int, n_chunks: int, device: torch.device) -> int:
    """K slices for a decode GEMM whose consumer sums partials: at least 2, more where the columns give fewer than four
    programs per SM, rounded down to a power of two (H200 sweep, one row: 3 slices ran 1.1-1.6× slower than 2 or 4 on
    every 8B matrix; four programs per SM, not two, give the 8B's o and down and the 1B's qkv 4 slices, not 2: at 1 / 8
    / 16 rows o 7.8 / 8.3 / 9.5 → 6.8 / 7.3 / 8.9 µs, down 23.1 / 25.8 / 28.7 → 18.9 / 21.1 / 28.6, 1B qkv 4.7 / 4.9 /
    5.2 → 4.2 / 4.6 / 5.0), each slice >= 2 chunks (H200, the 270M's o and down at 1 / 8 / 64 rows: 4 slices of 2
    chunks 2.8 / 2.9 / 6.6 → 2.2 / 2.2 / 4.4 µs, 8 of 2 chunks 3.0 / 3.0 / 6.4 → 2.5 / 2.6 / 4.3 against slices of 4
    chunks)."""
    bn = int4_tiles(n, n_chunks, device.type == "cpu")[0]
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    want = max(2, -(-4 * sms // triton.cdiv(n, bn)))
    cap = max(1, n_chunks // 2)
    return 1 << (min(want, cap).bit_length() - 1)


def int4_linear_triton(x: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor, *,
                       out_dtype: torch.dtype | None = None, splits: int = 1, block_n: int | None = None,
                       chunks: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ Wᵀ for either int4 layout above -> (M, N) in `out_dtype` (default x's); M <= 64. With `splits` > 1
    the result is fp32 partial sums (S, M, N) over K slices (whole chunks; S = `int4_slices`) for a consumer to add.
    `out`: where to write them (a column range of a wider result: unit column stride)."""
    M, K = x.shape
    words, pairs, tile = int4_layout(words, pairs)
    N, kp = words.shape[0], words.shape[1] * 8
    assert kp % CHUNK == 0 and K <= kp < K + CHUNK and pairs.shape[:2] == (N, kp // CHUNK), \
        (x.shape, words.shape, pairs.shape)
    assert x.stride(1) == 1 and words.stride(1) == 1 and pairs.is_contiguous()
    rows = _rows(x)
    interpret = x.device.type == "cpu"
    n_chunks = kp // CHUNK
    bn, step, stages, warps = int4_tiles(N, n_chunks, interpret, rows)
    bn, step, stages, warps = block_n or bn, chunks or step, num_stages or stages, num_warps or warps
    if x.dtype == torch.float32 and rows > 16:
        stages = min(stages, 2)  # fp32 tiles of 64 rows: deeper pipelines exceed the shared memory
    assert n_chunks % step == 0, (n_chunks, step)
    cs = _slice_chunks(n_chunks, splits, max(step, _slice_step(N, n_chunks, interpret)))
    s = triton.cdiv(n_chunks, cs)
    y = _result(out, (s, M, N) if splits > 1 else (M, N), torch.float32 if splits > 1 else out_dtype or x.dtype, x)
    if M == 0:
        return y
    assert bn % tile == 0, (bn, tile)
    _int4_linear[(triton.cdiv(N, bn), s)](
        x, words, pairs, y, M, N, K, kp, cs, x.stride(0), words.stride(0) * tile, pairs.stride(0) * tile,
        y.stride(-2), y.stride(0) if splits > 1 else 0,
        BLOCK_M=rows, BLOCK_N=bn, CHUNKS=step, DOT_FP32=interpret and x.dtype == torch.bfloat16, ASM=_asm(x),
        TILE=tile, FP4=is_fp4(pairs), num_warps=warps, num_stages=stages, **launch_options(x),
    )
    return y


def int8_tiles(n: int, interpret: bool = False, rows: int = ROW_TILE) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, stages, warps) for an N-wide matrix and a `rows`-row tile: the H200 sweeps' (bench/
    quant_linear_gpu.py --sweep, --kernel int8 --configs): at one row 64-column tiles for wide matrices, 32 for the
    narrow, two warps (fewer warps share the activations' shared-memory reads), four pipeline stages, three for the
    LM head (8B at one row: down 48.7 → 24.8 µs, v 8.7 → 5.6, head 137 → 135; 270M gate/up 3.5 → 3.0, head 53 → 49);
    above 16 rows 64 columns and three stages, 128 columns for the LM head (8B at 64 rows: down 65 → 49 µs, v 17.5 →
    7.9, head 339 → 266). BLOCK_K never changes with the rows: it sets the K slices' bounds, so a row's bits."""
    if interpret:
        return 16, 32, 1, 4
    if rows > ROW_TILE:
        return (128, 128, 2, 4) if n >= 65536 else (64, 128, 3, 4)
    return (64 if n >= 16384 else 32 if n > 1024 else 16), 128, 3 if n >= 65536 else 4, 2


def int8_splits(n: int, k: int, device: torch.device) -> int:
    """K slices for a decode GEMM whose consumer sums partials: enough programs for four per SM (H200, 1 row: the 8B
    down 89 → 36 µs in 3 slices, qkv 28 → 16 µs in 2, at two per SM; four per SM, 5 slices for down, took the 8B's
    whole step from 2.07× to 2.08× bf16 at one session and 0.86× to 0.90× at 64, 1.95× / 1.93× at eight, with
    speculation off: the 8-session 7.4 → 12.1 ms once seen at three per SM was the verify rows' tile), at most one per
    2 K steps, rounded up: a short K splits too (the 270M's qkv, K 640, at 1 / 8 / 64 rows: 3.0 / 3.3 / 5.8 → 2.3 /
    2.6 / 3.6 µs in slices of 256, 256 and 128)."""
    bn, bk = int8_tiles(n, device.type == "cpu")[:2]
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    want = -(-4 * sms // triton.cdiv(n, bn))
    return max(1, min(want, triton.cdiv(k, 2 * bk)))


def int8_linear_triton(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, *,
                       out_dtype: torch.dtype | None = None, splits: int = 1, block_n: int | None = None,
                       block_k: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                       out: torch.Tensor | None = None, prefetch: bool | None = None) -> torch.Tensor:
    """x (M, K) @ (codes * scale[:, None])ᵀ -> (M, N) in `out_dtype` (default x's); M <= 64. With `splits` > 1 the
    result is fp32 partial sums (S, M, N) over K slices (S = `int8_slices`) for a consumer to add; `out` as int4's.
    `prefetch`: the codes into L2 before waiting on the previous kernel (None: where they are at most PREFETCH_BYTES)."""
    M, K = x.shape
    N = codes.shape[0]
    assert codes.shape == (N, K) and scale.shape == (N,), (x.shape, codes.shape, scale.shape)
    assert x.stride(1) == 1 and codes.stride(1) == 1
    rows = _rows(x)
    interpret = x.device.type == "cpu"
    bn, bk, stages, warps = int8_tiles(N, interpret, rows)
    bn, bk, warps = block_n or bn, block_k or bk, num_warps or warps
    ks = _slice_k(K, splits, bk)
    s = triton.cdiv(K, ks)
    y = _result(out, (s, M, N) if splits > 1 else (M, N), torch.float32 if splits > 1 else out_dtype or x.dtype, x)
    if M == 0:
        return y
    launch = launch_options(x)
    _int8_linear[(triton.cdiv(N, bn), s)](
        x, codes, scale, y, M, N, K, ks, x.stride(0), codes.stride(0), y.stride(-2),
        y.stride(0) if splits > 1 else 0,
        BLOCK_M=rows, BLOCK_N=bn, BLOCK_K=bk, DOT_FP32=interpret and x.dtype == torch.bfloat16,
        PREFETCH=_prefetches(launch, bn, warps, prefetch, codes), LANES=32 * warps,
        num_warps=warps, num_stages=num_stages or stages, **launch,
    )
    return y


def int4_dequantize_triton(words: torch.Tensor, pairs: torch.Tensor, dtype: torch.dtype,
                           k: int | None = None) -> torch.Tensor:
    """The (N, k) matrix of either int4 layout in `dtype` (k: the unpadded width, default the padded one)."""
    words, pairs, tile = int4_layout(words, pairs)
    N, kp = words.shape[0], words.shape[1] * 8
    k = k or kp
    w = torch.empty(N, k, dtype=dtype, device=words.device)
    bn = 32
    assert bn % tile == 0, (bn, tile)
    _int4_dequantize[(triton.cdiv(N, bn), kp // CHUNK)](
        words, pairs, w, N, k, words.stride(0) * tile, pairs.stride(0) * tile, w.stride(0), BLOCK_N=bn,
        ASM=words.is_cuda and dtype == torch.bfloat16 and torch.cuda.get_device_capability(words.device)[0] >= 8,
        TILE=tile, FP4=is_fp4(pairs),
    )
    return w
