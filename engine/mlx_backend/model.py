"""MLX versions of the model template: same module names as engine/models, so one state dict fits both."""
from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.models.args import ModelArgs

BIASED_NORMS = ("stablelm", "starcoder2")  # model types whose LayerNorms add a bias
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = mx.ones((dim,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    """Centred, in fp32; StableLM's with a bias, Cohere's without."""

    def __init__(self, dim: int, eps: float, bias: bool = False):
        super().__init__()
        self.weight = mx.ones((dim,))
        if bias:
            self.bias = mx.zeros((dim,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        bias = self.bias.astype(mx.float32) if "bias" in self else None
        return mx.fast.layer_norm(x.astype(mx.float32), self.weight.astype(mx.float32), bias, self.eps).astype(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads, self.n_kv, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.scale = args.attn_scale(layer_id)
        self.softcap = args.attn_softcap or 0.0
        gain = args.q_gain()
        self._q_gain = None if gain is None else mx.array(gain)  # private: not a parameter
        bias = args.attention_bias
        self.q_proj = nn.Linear(args.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(args.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(args.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, args.hidden_size, bias=args.dense_bias)
        if args.attn_sinks:  # gpt-oss: a logit per head in each softmax, without a value
            self.sinks = mx.zeros((self.n_heads,))
        self.whole_norm = args.qk_norm and args.qk_norm_whole  # OLMo 2: over the projection, before the heads split
        if args.qk_norm:
            whole = self.whole_norm
            self.q_norm = RMSNorm(self.n_heads * self.head_dim if whole else self.head_dim, args.rms_norm_eps)
            self.k_norm = RMSNorm(self.n_kv * self.head_dim if whole else self.head_dim, args.rms_norm_eps)
        self.qk_norm = args.qk_norm

    def __call__(self, x: mx.array, rope: tuple[mx.array, mx.array], cache) -> mx.array:
        t = x.shape[0]
        q, k = self.q_proj(x), self.k_proj(x)
        if self.whole_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(t, self.n_heads, self.head_dim)
        k = k.reshape(t, self.n_kv, self.head_dim)
        v = self.v_proj(x).reshape(t, self.n_kv, self.head_dim)
        if self.qk_norm and not self.whole_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self._q_gain is not None:
            q = q * self._q_gain.astype(q.dtype)
        cos, sin = rope
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        sinks = self.sinks if "sinks" in self else None
        out = cache.attend(self.layer_id, q, k, v, self.scale, self.softcap, sinks)  # (T, H, D)
        return self.o_proj(out.reshape(t, self.n_heads * self.head_dim))


def _rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str, bias: bool = False, glu: tuple[float, float] | None = None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act = nn.silu if act == "silu" else nn.gelu_approx
        # gpt-oss's clamped gate (engine/models/layers.ClampedGLU); plain floats: not parameters
        self.glu_alpha, self.glu_limit = glu if glu is not None else (None, None)

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.glu_limit is None:
            return self.down_proj(self.act(gate) * up)
        alpha, limit = self.glu_alpha, self.glu_limit
        gate, up = mx.minimum(gate, limit), mx.clip(up, -limit, limit)
        return self.down_proj(gate * mx.sigmoid(gate * alpha) * (up + 1))


class PlainMLP(nn.Module):
    """down(act(up(x))), biased (StarCoder 2)."""

    def __init__(self, hidden: int, inter: int, act: str, bias: bool):
        super().__init__()
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act = {"silu": nn.silu, "relu2": lambda x: mx.square(nn.relu(x))}.get(act, nn.gelu_approx)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act(self.up_proj(x)))


class SelectBias(nn.Module):
    def __init__(self, experts: int):
        super().__init__()
        self.bias = mx.zeros((experts,))


class SparseMoE(nn.Module):
    """engine/models/moe.py's experts: each row through its router's top-k gated MLPs, weighted, in expert order."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate = nn.Linear(args.hidden_size, args.num_experts, bias=args.router_bias)
        glu = (args.glu_alpha, args.glu_limit) if args.glu_limit is not None else None
        self.experts = [MLP(args.hidden_size, args.moe_intermediate_size, args.hidden_act, args.expert_bias, glu)
                        for _ in range(args.num_experts)]
        self.top_k, self.norm_topk = args.experts_per_token, args.norm_topk_prob
        self.sigmoid, self.scaling = args.router_sigmoid, args.routed_scaling  # GLM-4.5's
        if args.expert_select_bias:  # ERNIE 4.5's, GLM-4.5's: added to the scores for the choice only
            self.select = SelectBias(args.num_experts)
        if args.shared_expert_size:  # Qwen2-MoE's (gated), ERNIE 4.5's
            self.shared_expert = MLP(args.hidden_size, args.shared_expert_size, args.hidden_act)
            if args.shared_expert_gated:
                self.shared_expert_gate = nn.Linear(args.hidden_size, 1, bias=False)
        self.shared = bool(args.shared_expert_size)

    def __call__(self, x: mx.array) -> mx.array:
        out = self._routed(x)
        if not self.shared:
            return out
        if "shared_expert_gate" not in self:
            return out + self.shared_expert(x)
        return out + mx.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    def _routed(self, x: mx.array) -> mx.array:
        logits = self.gate(x).astype(mx.float32)
        probs = mx.sigmoid(logits) if self.sigmoid else mx.softmax(logits, axis=-1)
        scores = probs + self.select.bias.astype(mx.float32) if "select" in self else probs
        chosen = mx.argsort(-scores, axis=-1)[:, :self.top_k]
        weights = mx.take_along_axis(probs, chosen, axis=-1)
        if self.norm_topk:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        if self.scaling != 1.0:
            weights = weights * self.scaling
        stacked = self._stack()
        if stacked is not None:
            return self._gathered(x, stacked, chosen, weights)
        picks = np.array(chosen)  # which rows each expert takes: decided on the host, as in PyTorch
        out = mx.zeros(x.shape, dtype=mx.float32)
        for e in np.unique(picks).tolist():
            rows, slots = np.nonzero(picks == e)
            r = mx.array(rows)
            y = self.experts[e](x[r]).astype(mx.float32) * weights[r, mx.array(slots)][:, None]
            out = out.at[r].add(y)
        return out.astype(x.dtype)

    def _gathered(self, x: mx.array, stacked, chosen: mx.array, weights: mx.array) -> mx.array:
        """Every (row, expert) pair by index in the graph (engine/mlx_backend/experts.py); each row's experts summed
        in ascending order from 0, as the host path sums them."""
        if x.shape[0] == 0:
            return mx.zeros(x.shape, dtype=x.dtype)
        order = mx.argsort(chosen, axis=-1)
        chosen, weights = mx.take_along_axis(chosen, order, axis=-1), mx.take_along_axis(weights, order, axis=-1)
        y = stacked(x, chosen, self.experts[0].act).astype(mx.float32) * weights[..., None]
        out = mx.zeros((x.shape[0], x.shape[1]), dtype=mx.float32)
        for j in range(self.top_k):
            out = out + y[:, j]
        return out.astype(x.dtype)

    def _stack(self):
        """The experts stacked for gathered products (once), or None where they cannot be (the host path then)."""
        if "_stacked" not in self.__dict__:
            from engine.mlx_backend.experts import StackedExperts

            self.__dict__["_stacked"] = StackedExperts.of(self.experts)
        return self.__dict__["_stacked"]


def _feed_forward(args: ModelArgs, layer_id: int) -> nn.Module:
    """A layer's MLP: routed experts where the model has them, else dense."""
    return SparseMoE(args) if args.sparse_layer(layer_id) else _mlp(args)


def _mlp(args: ModelArgs) -> nn.Module:
    if args.gated_mlp:
        return MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
    return PlainMLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.dense_bias)


class LlamaBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, layer_id)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = _feed_forward(args, layer_id)
        self.residual_multiplier = args.residual_multiplier  # Granite's; a float, not a parameter

    def __call__(self, h: mx.array, rope, cache) -> mx.array:
        h = h + self._scaled(self.self_attn(self.input_layernorm(h), rope, cache))
        return h + self._scaled(self.mlp(self.post_attention_layernorm(h)))

    def _scaled(self, x: mx.array) -> mx.array:
        m = self.residual_multiplier
        return x if m == 1.0 else x * m


class Olmo2Block(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        self.self_attn = Attention(args, layer_id)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args.hidden_size, args.intermediate_size, args.hidden_act)
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, h: mx.array, rope, cache) -> mx.array:
        h = h + self.post_attention_layernorm(self.self_attn(h, rope, cache))
        return h + self.post_feedforward_layernorm(self.mlp(h))


class LayerNormBlock(nn.Module):
    """Cohere's and StableLM's (engine/models/layernorm_block.py): attention and the MLP in turn, or side by side on
    one norm of the input."""

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        bias = args.model_type in BIASED_NORMS
        self.input_layernorm = LayerNorm(args.hidden_size, args.rms_norm_eps, bias)
        self.self_attn = Attention(args, layer_id)
        if not args.parallel_residual:
            self.post_attention_layernorm = LayerNorm(args.hidden_size, args.rms_norm_eps, bias)
        self.mlp = _mlp(args)

    def __call__(self, h: mx.array, rope, cache) -> mx.array:
        x = self.input_layernorm(h)
        h = h + self.self_attn(x, rope, cache)
        return h + self.mlp(self.post_attention_layernorm(h) if "post_attention_layernorm" in self else x)


class Gemma3Block(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.kind = args.layer_types[layer_id]
        dim, eps = args.hidden_size, args.rms_norm_eps
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = Attention(args, layer_id)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.pre_feedforward_layernorm = RMSNorm(dim, eps)
        self.mlp = MLP(dim, args.intermediate_size, args.hidden_act)
        self.post_feedforward_layernorm = RMSNorm(dim, eps)

    def __call__(self, h: mx.array, rope, cache) -> mx.array:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), rope, cache))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class QuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear made from given arrays (mlx_backend.quantized); its product comes back in the input's
    dtype (fp32 scales would otherwise promote a bf16 model's activations)."""

    def __init__(self, weight: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
                 bias: mx.array | None = None, mode: str = "affine"):
        nn.Module.__init__(self)
        self.group_size, self.bits, self.mode = group_size, bits, mode
        self.weight, self.scales = weight, scales
        if biases is not None:  # "affine" only ("mxfp4" has scales alone)
            self.biases = biases
        if bias is not None:
            self.bias = bias
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        if x.size == 0:  # no rows (a step sampling none): MLX's CPU quantized_matmul divides by zero on them
            return mx.zeros((*x.shape[:-1], self.weight.shape[0]), dtype=x.dtype)
        return super().__call__(x).astype(x.dtype)


class QuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding made from given arrays. A lookup dequantizes in fp32 (exact: with bf16 scales MLX
    would round each weight to bf16); `as_linear` (the tied LM head) returns the input's dtype."""

    def __init__(self, weight: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int):
        nn.Module.__init__(self)
        self.group_size, self.bits, self.mode = group_size, bits, "affine"
        self.weight, self.scales, self.biases = weight, scales, biases
        self.num_embeddings, self.dims = weight.shape[0], weight.shape[1] * 32 // bits
        self.freeze()

    def __call__(self, ids: mx.array) -> mx.array:
        if ids.size == 0:  # mx.dequantize cannot reshape an empty gather
            return mx.zeros((*ids.shape, self.dims), dtype=mx.float32)
        return mx.dequantize(self["weight"][ids], self["scales"][ids].astype(mx.float32),
                             self["biases"][ids].astype(mx.float32), group_size=self.group_size, bits=self.bits)

    def as_linear(self, x: mx.array) -> mx.array:
        if x.size == 0:  # as QuantizedLinear
            return mx.zeros((*x.shape[:-1], self.num_embeddings), dtype=x.dtype)
        return super().as_linear(x).astype(x.dtype)


# by model type (Gemma's by prefix, the rest Llama's)
BLOCKS = {"olmo2": Olmo2Block, "olmo3": Olmo2Block, "exaone4": Olmo2Block, "glm4": Gemma3Block,
          "cohere": LayerNormBlock, "cohere2": LayerNormBlock, "stablelm": LayerNormBlock, "starcoder2": LayerNormBlock}


class Body(nn.Module):
    def __init__(self, args: ModelArgs, block):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [block(args, i) for i in range(args.num_layers)]
        if BLOCKS.get(args.model_type) is LayerNormBlock:
            self.norm = LayerNorm(args.hidden_size, args.rms_norm_eps, args.model_type in BIASED_NORMS)
        else:
            self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class CausalLM(nn.Module):
    """forward(tokens (T,), positions (T,), cache, logit_rows (R,)) -> fp32 logits (R, V), as in PyTorch."""

    def __init__(self, args: ModelArgs, dtype: str = "float32"):
        super().__init__()
        self.args = args
        self.compute_dtype = DTYPES[dtype]  # activations (a bf16 or quantized matrix's product is cast back to it)
        gemma = args.model_type.startswith("gemma")
        self.model = Body(args, Gemma3Block if gemma else BLOCKS.get(args.model_type, LlamaBlock))
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.embed_scale = math.sqrt(args.hidden_size) if gemma else (
            args.embedding_multiplier if args.embedding_multiplier != 1.0 else None)
        self._inv_freq = {kind: _inv_freq(args.head_dim, r) for kind, r in args.rope.items()}

    def __call__(self, tokens: mx.array, positions: mx.array, cache, logit_rows: mx.array) -> mx.array:
        h = self.model.embed_tokens(tokens).astype(self.compute_dtype)
        if self.embed_scale is not None:
            h = h * mx.array(self.embed_scale, dtype=h.dtype)
        ropes = {kind: _rope_tables(positions, inv, h.dtype) for kind, inv in self._inv_freq.items()}
        for layer in self.model.layers:
            h = layer(h, ropes[layer.kind], cache)
        h = self.model.norm(h[logit_rows])
        if self.args.tie_word_embeddings:
            logits = self.model.embed_tokens.as_linear(h)
        else:
            logits = self.lm_head(h)
        logits = logits.astype(mx.float32)
        if self.args.logits_scaling != 1.0:
            logits = logits / self.args.logits_scaling
        cap = self.args.final_logit_softcapping
        return mx.tanh(logits / cap) * cap if cap else logits


def _inv_freq(head_dim: int, rope) -> mx.array:
    from engine.models.layers import inv_freq

    return mx.array(inv_freq(head_dim, rope).numpy())  # the PyTorch model's frequencies, bit for bit


def _rope_tables(positions: mx.array, inv: mx.array, dtype) -> tuple[mx.array, mx.array]:
    freqs = positions.astype(mx.float32)[:, None] * inv[None, :]
    emb = mx.concatenate([freqs, freqs], axis=-1)[:, None, :]  # (T, 1, D)
    return mx.cos(emb).astype(dtype), mx.sin(emb).astype(dtype)

