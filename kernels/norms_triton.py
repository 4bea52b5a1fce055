"""Triton kernels for the small per-token work around a decode step's GEMMs, fused one launch each.

Without torch.compile each RMSNorm costs about nine launches and each rotary embedding six; at decode
sizes every launch is latency, so a step spends more time there than in its GEMMs. These do the same
arithmetic in fp32 (rounding where the PyTorch modules round):

- `add_norm`: optionally normalise `x` (the "pre" norm of Gemma's sandwich), add it to a residual, then
  normalise the sum: one row per program.
- `norm_rope`: per-head RMSNorm (q/k norms) then the half-split rotary embedding, one (token, head) per
  program; reads strided q/k views of a fused QKV output.
- `act_mul`: act(gate) * up over a fused gate/up output.
- `embed_norm`: a step's embedding rows (dense, or a quantized table's int8 or int4 rows dequantized; scaled, for
  Gemma) and the first block's input norm of them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, wait_for_previous

GELU_TANH_C = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi); jitted code reads only constexpr globals


@triton.jit
def _scale(x, inv, w, GEMMA: tl.constexpr, DT: tl.constexpr):
    # x * inv * w in fp32 (broadcast shapes); Gemma scales in fp32, the others round first, as the modules do
    if GEMMA:
        return (x * inv * w).to(DT).to(tl.float32)
    return ((x * inv).to(DT).to(tl.float32) * w).to(DT).to(tl.float32)


@triton.jit
def _rms(x, w, n, eps, GEMMA: tl.constexpr, DT: tl.constexpr):
    # x, w fp32 (masked lanes are 0)
    return _scale(x, tl.math.rsqrt(tl.sum(x * x, 0) / n + eps), w, GEMMA, DT)


@triton.jit
def _add_norm(
    X, RES, W_PRE, W, Y, SUM,
    stride_x, stride_xs, stride_r, stride_y, stride_s, D, eps,
    BLOCK: tl.constexpr, GEMMA: tl.constexpr, HAS_PRE: tl.constexpr, HAS_RES: tl.constexpr, HAS_NORM: tl.constexpr,
    SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    # SPLITS > 0: X holds that many fp32 partial sums of a split-K GEMM, added here in order
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < D
    dt = SUM.dtype.element_ty
    v = tl.load(X + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    if SPLITS:
        for s in tl.static_range(1, SPLITS):
            v += tl.load(X + s * stride_xs + row * stride_x + offs, mask=ok, other=0.0)
        v = v.to(dt).to(tl.float32)  # rounded where a whole GEMM's output is
    if HAS_PRE:
        v = _rms(v, tl.load(W_PRE + offs, mask=ok, other=0.0).to(tl.float32), D, eps, GEMMA, dt)
    if HAS_RES:
        r = tl.load(RES + row * stride_r + offs, mask=ok, other=0.0).to(tl.float32)
        v = (v + r).to(dt).to(tl.float32)
        tl.store(SUM + row * stride_s + offs, v.to(dt), mask=ok)
    if HAS_NORM:
        y = _rms(v, tl.load(W + offs, mask=ok, other=0.0).to(tl.float32), D, eps, GEMMA, dt)
        tl.store(Y + row * stride_y + offs, y.to(dt), mask=ok)


@triton.jit
def _load_row(src, offs, ok, stride_split, SPLITS: tl.constexpr, DT: tl.constexpr):
    # fp32 values at src + offs; SPLITS > 0: the sum of that many split-K partials, rounded to DT as the
    # whole GEMM's output would be
    x = tl.load(src + offs, mask=ok, other=0.0).to(tl.float32)
    if SPLITS:
        for s in tl.static_range(1, SPLITS):
            x += tl.load(src + s * stride_split + offs, mask=ok, other=0.0)
        x = x.to(DT).to(tl.float32)
    return x


@triton.jit
def _embed_norm(
    Tok, E, R, W, H, Y, stride_e, stride_r, stride_h, stride_y, V, D, scale, eps,
    BLOCK: tl.constexpr, GEMMA: tl.constexpr, HAS_SCALE: tl.constexpr, ROW_SCALED: tl.constexpr, INT4: tl.constexpr,
    TILE: tl.constexpr, PDL: tl.constexpr,
):
    # one token per program: its embedding row (times the model's scale, rounded as a tensor product
    # would be) and that row's RMSNorm, the first block's input. ROW_SCALED: E holds int8 codes and R a scale per row;
    # INT4: E the int4 words and R their (scale, zero) pairs (kernels/quant_linear_triton.py), stride_e and stride_r
    # one TILE-row group's
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < D
    dt = H.dtype.element_ty
    tok = tl.load(Tok + row).to(tl.int64)
    ids = offs * 0 + tok  # vector form: the interpreter rejects scalar & vector masks
    known = (ids >= 0) & (ids < V)  # an id outside the table reads zeros, never outside it
    if INT4:
        v = _int4_row(E, R, tok // TILE, tok % TILE, offs, ok & known, stride_e, stride_r, TILE).to(dt).to(tl.float32)
    else:
        v = tl.load(E + tok * stride_e + offs, mask=ok & known, other=0.0).to(tl.float32)
    if ROW_SCALED:  # the row dequantized in fp32, then rounded to the model's dtype (as QuantEmbedding's rows)
        v = (v * tl.load(R + ids, mask=ok & known, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
    if HAS_SCALE:
        v = (v * scale).to(dt).to(tl.float32)
    tl.store(H + row * stride_h + offs, v.to(dt), mask=ok)
    y = _rms(v, tl.load(W + offs, mask=ok, other=0.0).to(tl.float32), D, eps, GEMMA, dt)
    tl.store(Y + row * stride_y + offs, y.to(dt), mask=ok)


@triton.jit
def _int4_row(Q, P, group, r, offs, ok, stride_q, stride_p, TILE: tl.constexpr):
    # weights `offs` of row (group, r) in fp32, (code - 8) * scale + zero: weight 16 i + w of a 128-weight chunk is
    # nibble i of the chunk's word w; its group of 32 (i // 2) has its bf16 scale and zero in pairs (s0|s2, s1|s3,
    # z0|z2, z1|z3), low half first
    chunk, i, w = offs // 128, (offs % 128) // 16, offs % 16
    word = tl.load(Q + group * stride_q + chunk * (16 * TILE) + r * 16 + w, mask=ok, other=0)
    code = ((word >> (4 * i)) & 0xF).to(tl.float32)
    at = P + group * stride_p + chunk * (4 * TILE) + r * 4 + (i // 2) % 2
    high = i >= 4
    s = tl.load(at, mask=ok, other=0)
    z = tl.load(at + 2, mask=ok, other=0)
    s = tl.where(high, s & -65536, s << 16).to(tl.float32, bitcast=True)
    z = tl.where(high, z & -65536, z << 16).to(tl.float32, bitcast=True)
    return (code - 8.0) * s + z  # the product is exact (4 bits by 8): fused or not, the same sum


@triton.jit
def _head_norm_rope(src, w1, w2, c1, c2, s1, s2, offs, ok, HALF, eps,
                    DT: tl.constexpr, GEMMA: tl.constexpr, HAS_NORM: tl.constexpr, stride_split,
                    SPLITS: tl.constexpr):
    # one head's halves: RMS over the whole head, weight, then the half-split rotation (cos/sin fp32 of
    # each half), rounding where the modules round
    x1 = _load_row(src, offs, ok, stride_split, SPLITS, DT)
    x2 = _load_row(src + HALF, offs, ok, stride_split, SPLITS, DT)
    if HAS_NORM:
        inv = tl.math.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
        x1 = _scale(x1, inv, w1, GEMMA, DT)
        x2 = _scale(x2, inv, w2, GEMMA, DT)
    return (x1 * c1 - x2 * s1).to(DT), (x2 * c2 + x1 * s2).to(DT)


@triton.jit
def _norm_rope(
    X, W, COS, SIN, Y,
    stride_xt, stride_xh, stride_yt, stride_yh, stride_ct, stride_st, H, HALF, eps,
    BLOCK: tl.constexpr, GEMMA: tl.constexpr, HAS_NORM: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous(PDL)
    pid = tl.program_id(0)
    t = (pid // H).to(tl.int64)
    h = pid % H
    offs = tl.arange(0, BLOCK)
    ok = offs < HALF
    dt = Y.dtype.element_ty
    w1 = tl.load(W + offs, mask=ok & HAS_NORM, other=0.0).to(tl.float32)
    w2 = tl.load(W + HALF + offs, mask=ok & HAS_NORM, other=0.0).to(tl.float32)
    c1 = tl.load(COS + t * stride_ct + offs, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(COS + t * stride_ct + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + t * stride_st + offs, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + t * stride_st + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    y1, y2 = _head_norm_rope(X + t * stride_xt + h * stride_xh, w1, w2, c1, c2, s1, s2, offs, ok, HALF, eps, dt,
                             GEMMA, HAS_NORM, 0, 0)
    dst = Y + t * stride_yt + h * stride_yh
    tl.store(dst + offs, y1, mask=ok)
    tl.store(dst + HALF + offs, y2, mask=ok)


@triton.jit
def _qkv_rope_write(
    QKV, QW, KW, Pos, InvFreq, QOut, KCache, VCache, Slots,
    stride_t, stride_split, stride_ot, stride_oh, stride_ks, stride_kh, stride_vs, stride_vh,
    H, HKV, HALF, eps,
    BLOCK: tl.constexpr, GEMMA: tl.constexpr, HAS_NORM: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    # one (token, head) of q or k per program; a k program also copies its head of v into the cache. The
    # rotation's cos/sin come from the position and inverse frequencies here, rounded as the Rotary tables are.
    # SPLITS > 0: QKV holds a split-K GEMM's fp32 partials, summed here.
    wait_for_previous(PDL)
    pid = tl.program_id(0)
    t = (pid // (H + HKV)).to(tl.int64)
    h = pid % (H + HKV)
    offs = tl.arange(0, BLOCK)
    ok = offs < HALF
    dt = QOut.dtype.element_ty
    src = QKV + t * stride_t + h * (2 * HALF)  # q heads, then k heads, then v heads, each 2*HALF wide
    is_q = (offs * 0 + h) < H  # vector form: the interpreter rejects scalar & vector masks
    w1 = tl.load(QW + offs, mask=ok & is_q & HAS_NORM, other=0.0).to(tl.float32) + tl.load(
        KW + offs, mask=ok & ~is_q & HAS_NORM, other=0.0).to(tl.float32)
    w2 = tl.load(QW + HALF + offs, mask=ok & is_q & HAS_NORM, other=0.0).to(tl.float32) + tl.load(
        KW + HALF + offs, mask=ok & ~is_q & HAS_NORM, other=0.0).to(tl.float32)
    angle = tl.load(Pos + t).to(tl.float32) * tl.load(InvFreq + offs, mask=ok, other=0.0)
    c = tl.cos(angle).to(dt).to(tl.float32)
    sn = tl.sin(angle).to(dt).to(tl.float32)
    y1, y2 = _head_norm_rope(src, w1, w2, c, c, sn, sn, offs, ok, HALF, eps, dt, GEMMA, HAS_NORM, stride_split,
                             SPLITS)
    if h < H:
        dst = QOut + t * stride_ot + h * stride_oh
        tl.store(dst + offs, y1, mask=ok)
        tl.store(dst + HALF + offs, y2, mask=ok)
    else:
        slot = tl.load(Slots + t).to(tl.int64)
        kh = h - H
        kdst = KCache + slot * stride_ks + kh * stride_kh
        tl.store(kdst + offs, y1.to(KCache.dtype.element_ty), mask=ok)
        tl.store(kdst + HALF + offs, y2.to(KCache.dtype.element_ty), mask=ok)
        vsrc = src + HKV * (2 * HALF)
        vdst = VCache + slot * stride_vs + kh * stride_vh
        v1 = _load_row(vsrc, offs, ok, stride_split, SPLITS, dt)
        v2 = _load_row(vsrc + HALF, offs, ok, stride_split, SPLITS, dt)
        tl.store(vdst + offs, v1.to(dt).to(VCache.dtype.element_ty), mask=ok)
        tl.store(vdst + HALF + offs, v2.to(dt).to(VCache.dtype.element_ty), mask=ok)


@triton.jit
def activation(g, GELU: tl.constexpr):
    """GELU (tanh form) or SiLU of fp32 `g`."""
    if GELU:  # tanh(z) = 2 sigmoid(2z) - 1
        z = GELU_TANH_C * (g + 0.044715 * g * g * g)
        return 0.5 * g * (2.0 * tl.sigmoid(2.0 * z))
    return g * tl.sigmoid(g)


@triton.jit
def _act_mul(X, Y, stride_x, stride_split, stride_y, I, BLOCK: tl.constexpr, GELU: tl.constexpr,
             SPLITS: tl.constexpr, PDL: tl.constexpr):
    # SPLITS > 0: X holds that many fp32 partial sums of a split-K GEMM, added here in order
    wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    dt = Y.dtype.element_ty
    g = _load_row(X + row * stride_x, cols, ok, stride_split, SPLITS, dt)
    u = _load_row(X + row * stride_x + I, cols, ok, stride_split, SPLITS, dt)
    tl.store(Y + row * stride_y + cols, (activation(g, GELU).to(dt).to(tl.float32) * u).to(dt), mask=ok)


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()  # the CPU Linear's output is column-major


def _rows(x: torch.Tensor) -> torch.Tensor:
    return _unit_stride(x).reshape(-1, x.shape[-1])


def add_norm_triton(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, gemma: bool,
    residual: torch.Tensor | None = None, pre_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(residual + pre(x) or x, norm of that): either part None when not asked for. `x` may be split-K
    partials (S, T, D) fp32 of `residual`'s (T, D); they are summed first."""
    D = x.shape[-1]
    splits = x.shape[0] if x.dim() == 3 else 0
    assert not splits or (residual is not None and x.stride(-1) == 1 and x.dtype == torch.float32), x.shape
    x2 = x if splits else _rows(x)
    res = _rows(residual) if residual is not None else x2
    n = res.shape[0]
    total = torch.empty_like(res) if residual is not None else x2
    y = torch.empty_like(res) if weight is not None else x2
    if n:
        _add_norm[(n,)](
            x2, res, pre_weight if pre_weight is not None else x2, weight if weight is not None else x2, y, total,
            x2.stride(-2), x2.stride(0) if splits else 0, res.stride(0), y.stride(0), total.stride(0), D, eps,
            BLOCK=triton.next_power_of_2(D), GEMMA=gemma, HAS_PRE=pre_weight is not None,
            HAS_RES=residual is not None, HAS_NORM=weight is not None, SPLITS=splits,
            num_warps=4 if D <= 4096 else 8, **launch_options(x2),
        )
    shape = residual.shape if residual is not None else x.shape
    return (total.view(shape) if residual is not None else None), (y.view(shape) if weight is not None else None)


def embed_norm_triton(
    tokens: torch.Tensor, table: torch.Tensor, scale: float | None, weight: torch.Tensor, eps: float, gemma: bool,
    row_scale: torch.Tensor | None = None, dtype: torch.dtype | None = None, int4_pairs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (T,) -> (h, norm(h)), h = table[tokens] (* scale, a value already rounded to `dtype`, default the
    table's); `row_scale` (V,): the table is int8 codes, a row's values code * its scale; `int4_pairs`: the table is
    int4 words (either layout of kernels/quant_linear_triton.py) and these their pairs, a row's values rounded to
    `dtype` as QuantEmbedding's rows are."""
    D, tile, stride_r = weight.shape[0], 1, 0
    if int4_pairs is not None:
        from kernels.quant_linear_triton import int4_layout

        table, int4_pairs, tile = int4_layout(table, int4_pairs)
        stride_r = int4_pairs.stride(0) * tile
    T, V = tokens.shape[0], table.shape[0]
    assert table.stride(1) == 1, table.stride()
    h = torch.empty(T, D, dtype=dtype or table.dtype, device=table.device)
    y = torch.empty_like(h)
    if T:
        _embed_norm[(T,)](
            tokens, table, next(t for t in (row_scale, int4_pairs, table) if t is not None), weight, h, y,
            table.stride(0) * tile, stride_r, h.stride(0), y.stride(0), V, D, scale or 1.0, eps,
            BLOCK=triton.next_power_of_2(D), GEMMA=gemma, HAS_SCALE=scale is not None, ROW_SCALED=row_scale is not None,
            INT4=int4_pairs is not None, TILE=tile, num_warps=4 if D <= 4096 else 8, **launch_options(table),
        )
    return h, y


def norm_rope_triton(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, gemma: bool, cos: torch.Tensor, sin: torch.Tensor,
) -> torch.Tensor:
    """x (T, H, D) (any token/head strides), cos/sin (T, 1, D) or (T, D) -> (T, H, D) contiguous."""
    T, H, D = x.shape
    assert D % 2 == 0, x.shape
    x = _unit_stride(x)
    cos2, sin2 = _unit_stride(cos.reshape(T, D)), _unit_stride(sin.reshape(T, D))
    y = torch.empty(T, H, D, dtype=x.dtype, device=x.device)
    if T:
        _norm_rope[(T * H,)](
            x, weight if weight is not None else x, cos2, sin2, y,
            x.stride(0), x.stride(1), y.stride(0), y.stride(1), cos2.stride(0), sin2.stride(0), H, D // 2, eps,
            BLOCK=triton.next_power_of_2(D // 2), GEMMA=gemma, HAS_NORM=weight is not None, num_warps=1 if D <= 256 else 2,
            **launch_options(x),
        )
    return y


def act_mul_triton(x: torch.Tensor, act: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x (T, 2I) = [gate | up] -> act(gate) * up (T, I); act 'gelu_tanh' or 'silu'. With `dtype` (the model's), `x`
    is a split-K GEMM's fp32 partials (S, T, 2I), summed first."""
    assert act in ("gelu_tanh", "silu"), act
    splits = x.shape[0] if dtype is not None and x.dim() == 3 else 0
    assert not splits or (x.stride(-1) == 1 and x.dtype == torch.float32), x.shape
    x2 = x if splits else _rows(x)
    T, two_i = x2.shape[-2:]
    inter = two_i // 2
    y = torch.empty(T, inter, dtype=dtype or x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(inter))
    if T:
        _act_mul[(T, triton.cdiv(inter, block))](x2, y, x2.stride(-2), x2.stride(0) if splits else 0, y.stride(0),
                                                  inter, BLOCK=block, GELU=act == "gelu_tanh", SPLITS=splits,
                                                  num_warps=4, **launch_options(x2))
    return y if splits else y.view(*x.shape[:-1], inter)


def qkv_rope_write_triton(
    qkv: torch.Tensor, heads: int, kv_heads: int, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
    eps: float, gemma: bool, positions: torch.Tensor, inv_freq: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """qkv (T, (H + 2 Hkv) D) from the fused projection -> q (T, H, D) normed and rotated at `positions`
    (T,) by `inv_freq` (D/2,) fp32; k (normed, rotated) and v go straight into the caches (rows, C, Hkv, D)
    at flat `slots` (T,) int64. qkv may be split-K partials (S, T, width) fp32 of a `dtype` product."""
    splits = qkv.shape[0] if qkv.dim() == 3 else 0
    qkv = _unit_stride(qkv)
    T, width = qkv.shape[-2:]
    dtype = dtype or qkv.dtype
    rows, C, Hkv, D = k_cache.shape
    assert Hkv == kv_heads and width == (heads + 2 * kv_heads) * D and D % 2 == 0, (qkv.shape, k_cache.shape)
    assert slots.shape == (T,) and slots.dtype == torch.int64
    for cache in (k_cache, v_cache):  # the flat slot view needs row stride == C * column stride
        assert cache.stride(0) == C * cache.stride(1) and cache.stride(3) == 1, cache.stride()
    assert positions.shape == (T,) and inv_freq.shape == (D // 2,) and inv_freq.dtype == torch.float32
    q = torch.empty(T, heads, D, dtype=dtype, device=qkv.device)
    if T:
        has_norm = q_weight is not None
        _qkv_rope_write[(T * (heads + kv_heads),)](
            qkv, q_weight if has_norm else qkv, k_weight if has_norm else qkv, positions, inv_freq, q, k_cache, v_cache,
            slots, qkv.stride(-2), qkv.stride(0) if splits else 0, q.stride(0), q.stride(1),
            k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
            heads, kv_heads, D // 2, eps,
            BLOCK=triton.next_power_of_2(D // 2), GEMMA=gemma, HAS_NORM=has_norm, SPLITS=splits,
            num_warps=1 if D <= 256 else 2, **launch_options(qkv),
        )
    return q
