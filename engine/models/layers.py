"""Building blocks shared by every architecture file: linear, norms, rotary embedding, MLP, attention."""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.memory import trim_heap
from engine.models.args import ModelArgs, RopeArgs
from engine.models.kernel_choice import KernelChoice
from engine.quant.weight import QuantTensor, concat_rows

DECODE_ROWS = 64  # steps of up to this many tokens may take the Triton decode GEMM


class AttentionCache(Protocol):
    """What a layer needs from the KV cache: write this step's K/V and attend with the cache's mask."""

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
               scale: float, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        ...  # q (T, H, D), k/v (T, Hkv, D) or None when already written -> (T, H, D); softcap > 0 caps the scores;
        # sinks (H,) fp32: a logit per head in each row's softmax without a value (gpt-oss)

    def direct_write(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        ...  # (K store, V store, flat slots) a kernel may write this step's K/V into, or None


class Linear(nn.Linear):
    """nn.Linear whose CPU path multiplies as W @ xᵀ: MKL's skinny-M sgemm is 2-4x slower the other way round.

    On CUDA with `decode_kernel` set (`CausalLM.prepare`), steps of at most 64 rows run the Triton skinny GEMM
    of kernels/.
    `partial_sums` is the same product for a consumer that adds split-K partials itself.
    """

    decode_kernel = False
    split_k = 0  # > 1: partial_sums of a decode step returns this many K slices' partials

    def partial_sums(self, x: torch.Tensor) -> torch.Tensor:
        """x @ Wᵀ, or for a decode step with `split_k` > 1 its split-K fp32 partials (S, T, N), which the
        caller's next kernel sums (kernels.norms.add_norm, qkv_rope_write; `sum_partials` otherwise)."""
        if self.split_k > 1 and self.decode_kernel and self.bias is None and x.is_cuda and x.dim() == 2 \
                and x.shape[0] <= DECODE_ROWS and not torch.compiler.is_compiling():
            from kernels.linear import linear_partials

            return linear_partials(x, self.weight, self.split_k)
        return self(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dim() != 2:
            if self.decode_kernel and x.dim() == 2 and x.shape[0] <= DECODE_ROWS:
                from kernels.linear import decode_linear

                y = decode_linear(x, self.weight)
                return y if self.bias is None else y + self.bias
            return F.linear(x, self.weight, self.bias)
        y = torch.mm(self.weight, x.t()).t()
        return y + self.bias if self.bias is not None else y


class QuantLinear(nn.Module):
    """A Linear whose weight stays quantized (engine/quant): the CPU's weight-only int4/int8 kernels."""

    def __init__(self, qweight: QuantTensor, bias: torch.Tensor | None):
        super().__init__()
        self.qweight = qweight
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.in_features, self.out_features = qweight.in_features, qweight.out_features

    decode_kernel = False  # the quantized kernels are chosen by the weight's device, not by `prepare`
    split_k = 0  # > 1: partial_sums of a CUDA decode step returns this many K slices' partials (set by `prepare`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None and self.qweight.format == "blocks":  # the bias inside the library's call
            return self.qweight(x, bias=self.bias.float()).to(x.dtype)
        y = self.qweight(x).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def partial_sums(self, x: torch.Tensor) -> torch.Tensor:
        """As Linear.partial_sums: split-K fp32 partials (S, T, N) for a decode step on CUDA, else the product."""
        if self.split_k > 1 and self.bias is None and x.is_cuda and x.dim() == 2 and x.shape[0] <= DECODE_ROWS \
                and not torch.compiler.is_compiling():
            return self.qweight.partials(x, self.split_k)
        return self(x)


class QuantEmbedding(nn.Module):
    """An embedding table kept quantized: a lookup dequantizes only the rows asked for; tied, it is the LM head."""

    def __init__(self, qweight: QuantTensor, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.qweight = qweight
        self.dtype = dtype  # the model's activations

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.qweight.rows(ids.reshape(-1)).to(self.dtype).reshape(*ids.shape, -1)


def _fused(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether `module` runs its fused Triton kernel: chosen (`CausalLM.prepare`), on CUDA, not inside torch.compile."""
    return module.fused and x.is_cuda and not torch.compiler.is_compiling()


class RMSNorm(nn.Module):
    """RMSNorm over the last axis; `gemma` computes in fp32 and scales by the (+1-folded) weight in fp32."""

    fused = False  # CUDA without torch.compile: one Triton launch (kernels/norms.py) instead of nine
    native = False  # on Parley's CPU kernels (blocks weights): one library call (kernels/cpu_norms.py)

    def __init__(self, dim: int, eps: float, gemma: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.gemma = gemma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fused(self, x):
            from kernels.norms import add_norm

            return add_norm(x, self.weight, self.eps, self.gemma)[1]
        if self.native and x.dtype == torch.float32:
            from kernels.cpu_norms import rms_norm

            return rms_norm(x, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma:
            return (xf * self.weight.float()).type_as(x)
        return self.weight * xf.to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm over the last axis, in fp32: centred, scaled, times the weight, plus the bias when there is one
    (Cohere's has none, StableLM's has one)."""

    fused = native = False  # no fused kernel: `add_and_norm` and `CausalLM.embed` take the torch path

    def __init__(self, dim: int, eps: float, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf - xf.mean(-1, keepdim=True)
        xf = self.weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))
        return (xf if self.bias is None else xf + self.bias.float()).to(x.dtype)


def inv_freq(head_dim: int, rope: RopeArgs) -> torch.Tensor:
    """(head_dim / 2,) fp32 rotary frequencies, as transformers computes them; a partial rotary's unrotated pairs get 0
    (cos 1, sin 0: every rope kernel leaves them as they are)."""
    dim = head_dim if rope.rotary_dim is None else rope.rotary_dim
    inv = 1.0 / (rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    if rope.factors is not None:
        inv = inv / torch.tensor(rope.factors, dtype=torch.float32, device="cpu")
    return torch.cat([inv, torch.zeros((head_dim - dim) // 2, device="cpu")]) if dim < head_dim else inv


class Rotary(nn.Module):
    """Half-split rotary embedding (HF layout); GGUF Llama weights are un-permuted to match at load."""

    def __init__(self, head_dim: int, rope: RopeArgs):
        super().__init__()
        # on the CPU even while the model is built on the meta device (there a division imports torch's compiler, ~2 s;
        # CausalLM.reset_buffers makes the real ones)
        self.register_buffer("inv_freq", inv_freq(head_dim, rope), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        from kernels.norms import rope_tables

        return rope_tables(positions, self.inv_freq, dtype)  # (T, 1, D) each


class RopeInputs:
    """One step's rotary inputs for a layer kind; the cos/sin tables are made on first use (the fused
    attention prologue rotates from positions and frequencies itself: no table launches on that path)."""

    def __init__(self, rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype,
                 tables: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.rotary, self.positions, self.dtype = rotary, positions, dtype
        self._tables = tables  # given: made already (a CPU tape's fixed buffers)

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tables is None:
            self._tables = self.rotary(self.positions, self.dtype)
        return self._tables


def add_and_norm(
    h: torch.Tensor, delta: torch.Tensor, norm: RMSNorm | None, pre: RMSNorm | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h + pre(delta) (or + delta), and norm of that sum (None without `norm`): a block's residual step.
    `delta` may be split-K partials (S, T, D) fp32 from a decode GEMM: summed first (in the kernel when fused)."""
    first = pre or norm
    if first is not None and _fused(first, h):
        from kernels.norms import add_norm

        return add_norm(delta, norm.weight if norm else None, first.eps, first.gemma, residual=h,
                        pre_weight=pre.weight if pre else None)
    if first is not None and first.native and h.dtype == torch.float32 and delta.dim() == h.dim():
        from kernels.cpu_norms import add_norm as cpu_add_norm

        return cpu_add_norm(h, delta, pre.weight if pre else None, norm.weight if norm else None, first.eps)
    if delta.dim() == h.dim() + 1:
        from kernels.norms import sum_partials

        delta = sum_partials(delta, h.dtype)
    h = h + (pre(delta) if pre is not None else delta)
    return h, (norm(h) if norm is not None else None)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def fused_linear(parts: list[Linear | QuantLinear]) -> Linear | QuantLinear | None:
    """One Linear whose output is the parts' outputs side by side: one GEMM launch instead of several (quantized parts
    in different formats: one launch per format on CUDA, engine/quant/stacked.py; None elsewhere)."""
    first = parts[0]
    if any(isinstance(p, QuantLinear) for p in parts):
        return _fused_quantized(parts)
    bias = first.bias is not None
    with torch.device("meta"):
        out = Linear(first.in_features, sum(p.out_features for p in parts), bias=bias)
    out.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
    if bias:
        out.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    return out


def _fused_quantized(parts: list) -> QuantLinear | None:
    if not all(isinstance(p, QuantLinear) for p in parts) or any((p.bias is None) != (parts[0].bias is None) for p in parts):
        return None
    qweight = concat_rows([p.qweight for p in parts])
    if qweight is None:  # formats differ: on CUDA each format's rows in its own kernel, into one result
        from engine.quant.stacked import stack_rows

        qweight = stack_rows([p.qweight for p in parts])
    if qweight is None:
        return None
    bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts])
    return QuantLinear(qweight, bias)


class GatedMLP(nn.Module):
    fused = False  # with fused gate/up on CUDA: act(gate) * up in one Triton launch
    native = False  # on Parley's CPU kernels (blocks weights): act(gate) * up in one library call (kernels/cpu_act.py)

    def __init__(self, hidden: int, inter: int, act: str, bias: bool = False, glu: "ClampedGLU | None" = None):
        super().__init__()
        self.gate_proj = Linear(hidden, inter, bias=bias)
        self.up_proj = Linear(hidden, inter, bias=bias)
        self.down_proj = Linear(inter, hidden, bias=bias)
        self.gate_up_proj: Linear | None = None
        self.act = _activation(act)
        self.glu = glu  # gpt-oss's clamped gate and up (no fused kernel: the torch path)
        self.act_kernel = None if glu is not None else \
            {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}.get(act)

    def fuse_projections(self) -> None:
        if self.gate_up_proj is None and (fused := fused_linear([self.gate_proj, self.up_proj])) is not None:
            self.gate_up_proj = fused
            self.gate_proj = self.up_proj = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused_up = self.gate_up_proj
        if fused_up is not None and self.act_kernel and _fused(self, x):
            if fused_up.decode_kernel and x.dim() == 2 and x.shape[0] <= DECODE_ROWS:
                from kernels.linear import linear_act

                return self.down_proj.partial_sums(linear_act(x, fused_up.weight, self.act_kernel))  # act in the epilogue
            from kernels.norms import act_mul

            h = fused_up.partial_sums(x)  # a quantized decode step's split-K partials: act_mul sums them
            parts = x.dtype if h.dim() > x.dim() else None
            return self.down_proj.partial_sums(act_mul(h, self.act_kernel, dtype=parts))
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if self.native and self.act_kernel and gate.dtype == torch.float32 and x.dim() == 2:
            from kernels.cpu_act import gated_act

            return self.down_proj.partial_sums(gated_act(gate, up, self.act_kernel, impl="native"))
        return self.down_proj.partial_sums(self.glu(gate, up) if self.glu is not None else self.act(gate) * up)


class ClampedGLU:
    """gpt-oss's gated activation: the gate capped above and the up clamped at ±`limit`, then
    gate · sigmoid(alpha · gate) · (up + 1)."""

    def __init__(self, alpha: float, limit: float):
        self.alpha, self.limit = alpha, limit

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
        return gate * torch.sigmoid(gate * self.alpha) * (up + 1)


class MLP(nn.Module):
    """down(act(up(x))), with biases when the model has them (StarCoder 2): no gate, so no fused activation kernel."""

    def __init__(self, hidden: int, inter: int, act: str, bias: bool):
        super().__init__()
        self.up_proj = Linear(hidden, inter, bias=bias)
        self.down_proj = Linear(inter, hidden, bias=bias)
        self.act = _activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.partial_sums(self.act(self.up_proj(x)))


def mlp(args: ModelArgs) -> nn.Module:
    """The model's MLP: gated (most models) or not."""
    if args.gated_mlp:
        return GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act)
    return MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.dense_bias)


def _activation(name: str):
    if name == "silu":
        return F.silu
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    if name == "relu2":  # Arcee's, Nemotron's: relu(x)²
        return lambda x: F.relu(x).square()
    from engine.errors import UnsupportedModelError

    raise UnsupportedModelError(f"Activation {name!r} is not supported.")


class Attention(nn.Module):
    """Projections, optional per-head q/k norms and rope; the cache owns K/V storage and the mask."""

    fused = False  # CUDA without torch.compile: q/k norm + rope in one Triton launch each
    native = False  # on Parley's CPU kernels: q/k norms, rope and the K/V write in one library call (kernels/cpu_rope.py)

    def __init__(self, args: ModelArgs, layer_id: int, gemma_norm: bool = False):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads, self.n_kv, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.scale = args.attn_scale(layer_id)
        self.softcap = args.attn_softcap or 0.0
        gain = args.q_gain()  # a partial rotary's LongRoPE factor, on its rotated dims only (CPU: reset_buffers moves it)
        self.q_gain = None if gain is None else torch.tensor(gain, dtype=torch.float32, device="cpu")
        bias = args.attention_bias
        self.q_proj = Linear(args.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(args.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = Linear(args.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = Linear(self.n_heads * self.head_dim, args.hidden_size, bias=args.dense_bias)
        # gpt-oss: a learned logit per head that joins the softmax without a value (fp32 in every dtype: keeps_fp32)
        self.sinks = nn.Parameter(torch.zeros(self.n_heads), requires_grad=False) if args.attn_sinks else None
        self.whole_norm = args.qk_norm and args.qk_norm_whole  # over all heads at once: before the heads split
        if args.qk_norm:
            q_dim, k_dim = (self.n_heads * self.head_dim, self.n_kv * self.head_dim) if self.whole_norm else \
                (self.head_dim, self.head_dim)
            self.q_norm = RMSNorm(q_dim, args.rms_norm_eps, gemma=gemma_norm)
            self.k_norm = RMSNorm(k_dim, args.rms_norm_eps, gemma=gemma_norm)
        else:
            self.q_norm = self.k_norm = None
        self.qkv_proj: Linear | None = None

    def fuse_projections(self) -> None:
        if self.qkv_proj is None and (fused := fused_linear([self.q_proj, self.k_proj, self.v_proj])) is not None:
            self.qkv_proj = fused
            self.q_proj = self.k_proj = self.v_proj = None

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        kv = self.n_kv * self.head_dim
        return self.qkv_proj(x).split([self.n_heads * self.head_dim, kv, kv], dim=-1)

    def forward(self, x: torch.Tensor, rope: RopeInputs, cache: AttentionCache) -> torch.Tensor:
        t = x.shape[0]
        # the prologues have no gain; the fused one sums the GEMM's partials, so no whole-projection norm comes first
        fusable = self.q_gain is None and not self.whole_norm
        if fusable and self.qkv_proj is not None and _fused(self, x) and (stores := cache.direct_write(self.layer_id)):
            # norms, rope and the K/V write: one launch, which also sums the GEMM's split-K partials
            q = self._fused_prologue(self.qkv_proj.partial_sums(x), rope, stores)
            out = cache.attend(self.layer_id, q, None, None, self.scale, self.softcap, self.sinks)
            return self.o_proj.partial_sums(out.reshape(t, self.n_heads * self.head_dim))
        q, k, v = self._qkv(x)
        if self.whole_norm:  # new k rows: v's alike, as the CPU prologue wants k and v rows of one stride
            q, k, v = self.q_norm(q), self.k_norm(k), v.contiguous()
        if self.q_gain is None and self.native and x.dim() == 2 and q.dtype == torch.float32 \
                and (stores := cache.direct_write(self.layer_id)):
            out = cache.attend(self.layer_id, self._native_prologue(q, k, v, rope, stores), None, None, self.scale,
                               self.softcap, self.sinks)
            return self.o_proj.partial_sums(out.reshape(t, self.n_heads * self.head_dim))
        q = q.reshape(t, self.n_heads, self.head_dim)
        k = k.reshape(t, self.n_kv, self.head_dim)
        v = v.reshape(t, self.n_kv, self.head_dim)
        cos, sin = rope.tables()
        if _fused(self, x):
            from kernels.norms import norm_rope

            qn, kn = (None, None) if self.whole_norm else (self.q_norm, self.k_norm)
            eps, gemma = (qn.eps, qn.gemma) if qn is not None else (0.0, False)
            q = norm_rope(q, qn.weight if qn is not None else None, eps, gemma, cos, sin)
            k = norm_rope(k, kn.weight if kn is not None else None, eps, gemma, cos, sin)
        else:
            if self.q_norm is not None and not self.whole_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.q_gain is not None:  # after any q norm; equal within each rotated pair, so after the rotary as before
            q = q * self.q_gain.to(q.dtype)
        out = cache.attend(self.layer_id, q, k, v, self.scale, self.softcap, self.sinks)  # (T, H, D)
        return self.o_proj.partial_sums(out.reshape(t, self.n_heads * self.head_dim))

    def _native_prologue(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RopeInputs,
                         stores) -> torch.Tensor:
        from kernels.cpu_rope import qk_rope_write

        qn, kn = (None, None) if self.whole_norm else (self.q_norm, self.k_norm)  # whole norms: applied already
        if any(t.stride(-1) != 1 for t in (q, k, v)) or k.stride(0) != v.stride(0):
            # float projections beside quantized ones (a file's F32 attention, MXFP4 experts): the CPU's W @ xᵀ
            # product is a transposed view
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        cos, sin = rope.tables()
        k_store, v_store, slots = stores
        return qk_rope_write(q, k, v, qn.weight if qn else None, kn.weight if kn else None, qn.eps if qn else 0.0,
                             cos, sin, slots, k_store, v_store, impl="native")

    def _fused_prologue(self, qkv: torch.Tensor, rope: RopeInputs, stores) -> torch.Tensor:
        from kernels.norms import qkv_rope_write

        qn, kn = self.q_norm, self.k_norm
        eps, gemma = (qn.eps, qn.gemma) if qn is not None else (0.0, False)
        return qkv_rope_write(qkv, self.n_heads, self.n_kv, qn.weight if qn else None, kn.weight if kn else None,
                              eps, gemma, rope.positions, rope.rotary.inv_freq, *stores, dtype=rope.dtype)


class CausalLM(nn.Module):
    """The shared top: embed, run the blocks, then norm and LM head on the sampled rows only."""

    embed_scale: float | None = None

    def __init__(self, args: ModelArgs, blocks: list[nn.Module], gemma_norm: bool = False):
        super().__init__()
        self.args = args
        # layers whose normed outputs (T, hidden) every forward keeps in `last_taps`, in this order: what a DFlash
        # drafter conditions on (engine/speculative/dflash.py)
        self.tap_layers: tuple[int, ...] = ()
        self.last_taps: tuple[torch.Tensor, ...] | None = None
        # where the next forward's logits go (a runner's buffer kept across its eager steps), or None: fresh
        self.logits_out: torch.Tensor | None = None
        self.model = nn.Module()
        # the weight comes from the file: no random init (on the meta device it imports torch's compiler, ~2 s)
        self.model.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size,
                                               _weight=torch.empty(args.vocab_size, args.hidden_size))
        self.model.layers = nn.ModuleList(blocks)
        self.model.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, gemma=gemma_norm)
        self.lm_head = None if args.tie_word_embeddings else Linear(args.hidden_size, args.vocab_size, bias=False)
        self.rotary = nn.ModuleDict({kind: Rotary(args.head_dim, r) for kind, r in args.rope.items()})

    def reset_buffers(self, device: torch.device | str) -> None:
        """Recomputes the rope tables on `device` (the model may have been built on the meta device)."""
        self.rotary = nn.ModuleDict({k: Rotary(self.args.head_dim, r) for k, r in self.args.rope.items()}).to(device)
        for module in self.modules():
            if isinstance(module, Attention) and module.q_gain is not None:
                module.q_gain = module.q_gain.to(device)

    def prepare(self, choice: KernelChoice) -> None:
        """Sets up how this model computes, in one call, before it serves (`choose_kernels` decides). Fused
        projections stay fused; everything else follows the choice given (a model serves one runner)."""
        from kernels.linear import decode_splits

        if choice.fuse_projections:
            # a list of every module would keep each replaced projection alive until the last layer is fused
            for module in [m for m in self.modules() if isinstance(m, (Attention, GatedMLP))]:
                module.fuse_projections()
                trim_heap()  # the parts freed leave holes the next, larger fused matrix does not fit in
        native = not choice.fused and any(isinstance(m, QuantTensor) and m.format == "blocks" for m in self.modules())
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, GatedMLP)):
                module.native, module.fused = native, choice.fused
            if isinstance(module, Linear):
                module.decode_kernel = choice.decode_gemm and module is not self.lm_head
            if isinstance(module, (Attention, GatedMLP)):
                # the GEMMs whose next kernel adds split-K partials: o and down (the residual add), fused qkv
                # (the attention prologue), and a quantized fused gate/up (act_mul; bf16's has act in its epilogue)
                for name in ("o_proj", "down_proj", "qkv_proj", "gate_up_proj"):
                    if isinstance(lin := getattr(module, name, None), Linear) and name != "gate_up_proj":
                        splits = choice.decode_splits or decode_splits(lin.in_features)
                        lin.split_k = splits if choice.decode_gemm else 0
                    elif isinstance(lin, QuantLinear):  # the fused consumers sum partials (gate/up: act_mul)
                        lin.split_k = lin.qweight.decode_splits() if choice.fused else 0
        for module in self.modules():  # a mixture's experts, stacked for one launch per projection (engine/models/moe.py)
            if hasattr(module, "prepare_experts"):
                module.prepare_experts(choice.fused)

    def install_quantized(self, path: str, qweight: QuantTensor, dtype: torch.dtype = torch.float32) -> None:
        """Puts a quantized matrix in place of the Linear or Embedding at `path` (its bias, if any, comes later);
        `dtype` the model's activations (an embedding's rows come out in it)."""
        from engine.errors import ModelLoadError

        parent_path, _, leaf = path.rpartition(".")
        parent = self.get_submodule(parent_path) if parent_path else self
        old = getattr(parent, leaf)
        shape = (old.num_embeddings, old.embedding_dim) if isinstance(old, nn.Embedding) else \
            (old.out_features, old.in_features)
        if tuple(qweight.shape) != shape:
            raise ModelLoadError(f"{path}.weight has shape {tuple(qweight.shape)}, the architecture needs {shape}.")
        if isinstance(old, nn.Embedding):
            setattr(parent, leaf, QuantEmbedding(qweight, dtype))
        else:
            bias = old.bias if old.bias is not None else None
            new = QuantLinear(qweight, None)
            if bias is not None:  # a meta placeholder until load_state_dict assigns the file's bias
                new.bias = nn.Parameter(torch.empty(shape[0], device="meta"), requires_grad=False)
            setattr(parent, leaf, new)

    def float_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict with every quantized matrix dequantized under its `.weight` name (for other backends)."""
        state = {k: v for k, v in self.state_dict().items() if ".qweight." not in k}
        for name, module in self.named_modules():
            if isinstance(module, (QuantLinear, QuantEmbedding)):
                state[f"{name}.weight"] = module.qweight.dequantize()
        return state

    def head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the output matrix, fp32 (a quantized head dequantizes only those)."""
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        if isinstance(head, (QuantEmbedding, QuantLinear)):
            return head.qweight.rows(ids)
        return self.head_weight()[ids].float()

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        if isinstance(head, (QuantEmbedding, QuantLinear)):
            out = self.logits_out
            fits = out is not None and x.dim() == 2 and not x.is_cuda and out.shape[0] >= x.shape[0] \
                and out.shape[1] == head.qweight.shape[0]
            return head.qweight(x, torch.float32, out=out[:x.shape[0]] if fits else None)
        return _head(x, self.head_weight())

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: AttentionCache, logit_rows: torch.Tensor | None
    ) -> torch.Tensor:
        """tokens/positions (T,), logit_rows (R,) -> fp32 logits (R, V) for the selected rows only
        (logit_rows None: every row, in order)."""
        h, x = self.embed(tokens)
        return self.forward_hidden(h, x, self.rope_inputs(positions, h.dtype), cache, logit_rows)

    def rope_inputs(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, RopeInputs]:
        return {kind: RopeInputs(rot, positions, dtype) for kind, rot in self.rotary.items()}

    def forward_hidden(self, h: torch.Tensor, x: torch.Tensor | None, ropes: dict[str, RopeInputs],
                       cache: AttentionCache, logit_rows: torch.Tensor | None) -> torch.Tensor:
        """`forward` from the embedded rows h (and the first block's input norm of them, or None) on: the blocks,
        the final norm and the LM head (what a CPU tape records, engine/cpu_tape.py)."""
        layers, taps = self.model.layers, {}
        for i, layer in enumerate(layers):
            # each block ends with the next one's input norm (the last: the final norm), a row-wise op:
            # fused, the residual add and that norm are one launch
            next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            h, x = layer(h, ropes[layer.kind], cache, x, next_norm)
            if i in self.tap_layers:
                taps[i] = x  # a fresh tensor no later op writes: kept as is, so a CPU tape records no extra work
        if taps:
            self.last_taps = tuple(taps[i] for i in self.tap_layers)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return self.head_logits(x)

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 logits of final-normed rows x (R, hidden)."""
        logits = self._logits(x).float()
        if self.args.logits_scaling != 1.0:
            logits = logits / self.args.logits_scaling
        cap = self.args.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def embed(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h, the first block's input norm of h or None); fused, one launch for both."""
        first, table = self.model.layers[0].input_layernorm, self.model.embed_tokens
        if first is not None and first.fused and tokens.is_cuda and not torch.compiler.is_compiling():
            from kernels.norms import embed_norm

            if isinstance(table, nn.Embedding):
                return embed_norm(tokens, table.weight, self.embed_scale, first.weight, first.eps, first.gemma)
            q = table.qweight if isinstance(table, QuantEmbedding) else None  # rows as QuantEmbedding's
            if q is not None and q.format == "int8":
                return embed_norm(tokens, q.codes, self.embed_scale, first.weight, first.eps, first.gemma,
                                  row_scale=q.scale, dtype=table.dtype)
            if q is not None and q.format == "int4" and hasattr(q, "words"):
                return embed_norm(tokens, q.words, self.embed_scale, first.weight, first.eps, first.gemma,
                                  int4_pairs=q.pairs, dtype=table.dtype)
        h = self.model.embed_tokens(tokens)
        if self.embed_scale is not None:
            h = h * torch.tensor(self.embed_scale, dtype=h.dtype)
        return h, None


def _head(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if h.is_cuda and h.dtype in (torch.bfloat16, torch.float16):
        try:
            return torch.mm(h, weight.t(), out_dtype=torch.float32)  # fp32 logits from the GEMM: no cast launch
        except (RuntimeError, NotImplementedError, TypeError):  # a torch or GPU without fp32-out GEMMs
            return F.linear(h, weight)
    if h.device.type != "cpu":
        return F.linear(h, weight)
    if h.shape[0] == 1:  # MKL's gemv is half as fast as its two-row gemm on this layout
        return torch.mm(weight, torch.cat((h, h)).t()).t()[:1]
    return torch.mm(weight, h.t()).t()
