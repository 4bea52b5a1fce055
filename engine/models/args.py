"""ModelArgs: one dataclass that describes every supported decoder-only architecture."""
from __future__ import annotations

import math
import functools
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable

from engine.errors import UnsupportedModelError

# GGUF block tensor suffix -> HF module path inside model.layers.N, shared by every architecture
GGUF_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router (its experts: gguf_weights.EXPERTS)
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",  # Qwen2-MoE's expert every token takes, and its gate
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}

GLOBAL = "global"
SLIDING = "sliding"
NOPE = "nope"  # a global layer without rotary positions (SmolLM3's, Command-R7B's): its rotary has frequency 0
MAX_COUNT = 1 << 20  # layers, heads, widths: far beyond any real model, far below what exhausts memory
# a model's own context: allocates nothing (sessions hold what they are set to), so bounded only to stay a sane
# number, above Llama 4 Scout's 10M and Llama-3-8B-Gradient's 4M (2**20 refused the latter)
MAX_CONTEXT = 1 << 24


@dataclass(slots=True)
class RopeArgs:
    """Rotary embedding of one attention kind: base and per-frequency divisors (scaling)."""

    theta: float
    factors: list[float] | None = None  # inv_freq is divided by these (linear and llama3 scaling)
    # None: the whole head rotates. Else the first `rotary_dim` dims of each head (Phi-4-mini: 3/4), which the
    # loader moves so that they pair as a whole head's do (engine/models/partial_rotary.py); the rest get frequency
    # 0. 0: no rotation at all (NOPE layers)
    rotary_dim: int | None = None
    # YaRN's scale of cos and sin (transformers' attention_factor; llama.cpp's mscale): q·k by its square
    attn_factor: float = 1.0

    def __post_init__(self) -> None:
        if not 1 < self.theta < math.inf:  # also NaN: every frequency would be NaN, every answer token 0
            raise UnsupportedModelError(f"The rotary base (rope theta) must be a number above 1, not {self.theta}.")
        if not 0 < self.attn_factor < math.inf:  # also NaN
            raise UnsupportedModelError(
                f"The rotary attention factor must be a positive number, not {self.attn_factor}.")

    def pairs(self, head_dim: int) -> int:
        """How many (dim, dim + half) pairs rotate: one factor each."""
        return (head_dim if self.rotary_dim is None else self.rotary_dim) // 2


@dataclass(slots=True)
class ModelArgs:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: dict[str, RopeArgs]  # keyed by layer kind: GLOBAL, SLIDING
    layer_types: list[str]
    sliding_window: int | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    qk_norm_whole: bool = False  # OLMo 2: the q/k norms span the whole projection, not each head
    parallel_residual: bool = False  # attention and the MLP side by side on one norm (Cohere; layernorm_block.py)
    gated_mlp: bool = True  # down(act(gate(x)) * up(x)); False: down(act(up(x))) (StarCoder 2)
    dense_bias: bool = False  # biases on o_proj and the MLP's matrices too (StarCoder 2)
    query_pre_attn_scalar: float | None = None
    attn_factor: float = 1.0  # LongRoPE's scale of q and k (HF scales cos and sin): q·k by its square
    # LongRoPE: `rope` holds the factors within `original_context`, `long_rope` those beyond it (fit_context picks)
    long_rope: RopeArgs | None = None
    original_context: int | None = None
    hidden_act: str = "silu"
    final_logit_softcapping: float | None = None
    attn_softcap: float | None = None  # Gemma 2: every attention score capped as cap · tanh(score / cap)
    # Granite: embeddings times the first, each block's attention and MLP output times the second before its residual
    # add, logits divided by the third
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    # mixture of experts (Qwen3-MoE, Mixtral; engine/models/moe.py): each token's MLP is the router's top
    # `experts_per_token` of `num_experts` gated MLPs of `moe_intermediate_size`; 0 experts: a dense model
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # the chosen experts' weights renormalised to sum to 1 (Mixtral, Qwen3-MoE)
    dense_layers: list[int] = field(default_factory=list)  # layers of an MoE model that keep a dense MLP
    shared_expert_size: int = 0  # > 0: every token also takes one gated MLP of this width, sigmoid-gated (Qwen2-MoE)
    shared_expert_gated: bool = True  # False: the shared expert's output added as it is (ERNIE 4.5)
    expert_select_bias: bool = False  # the router chooses by its scores + a per-expert bias (ERNIE 4.5, GLM-4.5)
    router_sigmoid: bool = False  # the router's scores: a sigmoid per expert (GLM-4.5), else the softmax over them
    routed_scaling: float = 1.0  # the chosen experts' weights times this, after renormalising (GLM-4.5's 2.5)
    router_bias: bool = False  # a bias on the router's logits (gpt-oss)
    expert_bias: bool = False  # biases on every expert's matrices (gpt-oss)
    # gpt-oss's experts: the gate capped at `glu_limit`, the up clamped at ±it, gate · sigmoid(alpha · gate) · (up + 1)
    glu_limit: float | None = None
    glu_alpha: float = 1.702
    attn_sinks: bool = False  # a learned logit per head joins every softmax without a value (gpt-oss)
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim"):
            positive(getattr(self, name), name)
        positive(self.max_position_embeddings, "max_position_embeddings", MAX_CONTEXT)
        if self.head_dim % 2:  # the rotary turns pairs of dims: an odd head failed the first step's rope
            raise UnsupportedModelError(f"The model's attention heads are {self.head_dim} dims wide; a rotary "
                                        "embedding needs an even number.")
        if not 0 <= self.rms_norm_eps < 1:  # also NaN, which made every logit NaN and every token 0
            raise UnsupportedModelError(f"The norm epsilon must be a small number from 0 to 1, not {self.rms_norm_eps}.")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise UnsupportedModelError(f"The sliding window must be a positive number of tokens, not {self.sliding_window}.")
        if len(self.layer_types) != self.num_layers:
            raise UnsupportedModelError(
                f"layer_types lists {len(self.layer_types)} layers but the model has {self.num_layers}."
            )
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"{self.num_heads} attention heads do not divide into {self.num_kv_heads} KV heads."
            )
        for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling", "routed_scaling"):
            if not getattr(self, name) > 0:  # also NaN
                raise UnsupportedModelError(f"{name} must be a positive number, not {getattr(self, name)}.")
        for name in ("final_logit_softcapping", "attn_softcap"):
            if getattr(self, name) is not None and not getattr(self, name) >= 0:  # 0: none, as transformers reads it
                raise UnsupportedModelError(f"{name} must be a positive number, not {getattr(self, name)}.")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise UnsupportedModelError("The model has sliding-window layers but no window size.")
        if self.num_experts:
            positive(self.num_experts, "expert count", 4096)
            positive(self.moe_intermediate_size, "expert feed-forward length")
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise UnsupportedModelError(f"The model routes each token to {self.experts_per_token} experts; it "
                                            f"must be from 1 to its {self.num_experts} experts.")
        for kind in set(self.layer_types):
            if kind not in self.rope:
                raise UnsupportedModelError(f"No rotary embedding settings for {kind} layers.")
        self._take_yarn_gain()

    def _take_yarn_gain(self) -> None:
        # YaRN scales cos and sin. One gain on every layer kind is attn_factor's LongRoPE scale; gains that differ by
        # kind (OLMo 3: YaRN on its full-attention layers only) stay on their kinds and scale those layers' q·k
        kinds = set(self.layer_types)
        gains = {self.rope[kind].attn_factor for kind in kinds}
        if gains == {1.0}:
            return
        if self.attn_factor != 1.0 and gains != {self.attn_factor}:
            raise UnsupportedModelError("YaRN rotary scaling together with LongRoPE's attention factor is not supported.")
        if len(gains) == 1:
            self.attn_factor = gains.pop()
        elif any(self.rope[kind].rotary_dim for kind in kinds):
            raise UnsupportedModelError("YaRN rotary scaling on some layer kinds of a partly rotated head is not "
                                        "supported.")

    def attn_scale(self, layer_id: int) -> float:
        """q·k's scale in layer `layer_id`: 1/sqrt(head_dim or query_pre_attn_scalar), times the square of the rotary's
        attention gain (LongRoPE's, or YaRN's of the layer's kind) where it scales every dim of q and k."""
        gain = self.attn_factor if self.attn_factor != 1.0 else self.rope[self.layer_types[layer_id]].attn_factor
        factor = 1.0 if self.rotated_gain() else gain ** 2
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5 * factor

    def rotated_gain(self) -> float | None:
        """LongRoPE's attention factor squared where only part of each head rotates: HF and llama.cpp scale the rotated
        dims' cos and sin, so it scales their share of q·k only and cannot fold into the attention scale."""
        rot = self.rope[GLOBAL].rotary_dim if GLOBAL in self.rope else None
        return self.attn_factor ** 2 if rot and self.attn_factor != 1.0 else None

    def q_gain(self) -> list[float] | None:
        """Per head dim, what q is multiplied by (`rotated_gain` on the rotated dims, in the order
        `partial_rotary_order` leaves them: the first rotary_dim / 2 of each half), or None. It is the same within
        each rotated pair, so it may come before or after the rotary."""
        gain = self.rotated_gain()
        if gain is None:
            return None
        half, rot_half = self.head_dim // 2, self.rope[GLOBAL].rotary_dim // 2
        return [gain if i % half < rot_half else 1.0 for i in range(self.head_dim)]

    def sparse_layer(self, layer_id: int) -> bool:
        """Whether layer `layer_id` routes its tokens to experts (else a dense MLP)."""
        return self.num_experts > 0 and layer_id not in self.dense_layers

    def layer_windows(self) -> list[int | None]:
        """Per layer: the sliding window (keys with distance < window are visible) or None for global."""
        return [self.sliding_window if t == SLIDING else None for t in self.layer_types]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelArgs":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["rope"] = {k: RopeArgs(**v) for k, v in kw["rope"].items()}
        if kw.get("long_rope") is not None:
            kw["long_rope"] = RopeArgs(**kw["long_rope"])
        return cls(**kw)


def fit_context(args: ModelArgs, context: int | None) -> ModelArgs:
    """The model as it runs with sessions of `context` tokens (None: the model's own). A LongRoPE model keeps its
    short factors and its original context when `context` fits in that, else takes the long factors for every position,
    as llama.cpp chooses by its context size (transformers switches mid-sequence, which would leave every cached key
    rotated the other way)."""
    if args.long_rope is None or args.original_context is None:
        return args
    if context is not None and context <= args.original_context:
        return replace(args, max_position_embeddings=args.original_context, long_rope=None)
    return replace(args, rope={kind: args.long_rope for kind in args.rope}, long_rope=None)


def rope_from_hf(params: dict[str, Any], head_dim: int, max_positions: int | None = None) -> RopeArgs:
    """Reads one HF rope parameter dict (v4 `rope_scaling` merged with `rope_theta`, or v5 `rope_parameters`);
    `max_positions` (the config's max_position_embeddings) stands in for YaRN's original context where it has none."""
    theta = float(params.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return RopeArgs(theta)
    if kind == "linear":
        return RopeArgs(theta, [float(params["factor"])] * (head_dim // 2))
    if kind == "llama3":
        return RopeArgs(theta, llama3_factors(theta, head_dim, params))
    if kind == "yarn":
        return _yarn_from_hf(theta, head_dim, params, max_positions)
    raise UnsupportedModelError(f"Rotary scaling type {kind!r} is not supported yet.")


def _yarn_from_hf(theta: float, head_dim: int, p: dict[str, Any], max_positions: int | None) -> RopeArgs:
    original = p.get("original_max_position_embeddings") or max_positions
    if not original:
        raise UnsupportedModelError("YaRN rotary scaling without original_max_position_embeddings is not supported.")
    factor = p.get("factor") or (max_positions or original) / original  # DeepSeek-V3 gives the two contexts only
    mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
    gain = p.get("attention_factor")
    if gain is None:
        gain = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all) if mscale and mscale_all \
            else yarn_mscale(factor)
    dims = int(head_dim * p.get("partial_rotary_factor", 1.0))
    return RopeArgs(theta, yarn_factors(theta, dims, float(factor), int(original), float(p.get("beta_fast") or 32),
                                        float(p.get("beta_slow") or 1), bool(p.get("truncate", True))),
                    attn_factor=float(gain))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context `factor` times the original: 1 + 0.1 · mscale · ln(factor)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_factors(theta: float, dims: int, factor: float, original: int, beta_fast: float = 32.0,
                 beta_slow: float = 1.0, truncate: bool = True) -> list[float]:
    """YaRN's frequencies as divisors of inv_freq: pairs that turn more than `beta_fast` times within the original
    context keep their frequency, those under `beta_slow` turns are divided by `factor`, a linear ramp between (as
    transformers and llama.cpp compute them)."""
    if not factor >= 1.0:
        raise UnsupportedModelError(f"YaRN's scaling factor must be at least 1, not {factor!r}.")

    def pair_of(turns: float) -> float:  # the pair index whose wavelength fits `turns` times in the original context
        return dims * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_of(beta_fast), pair_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # as both references: no division by zero
    out = []
    for j in range(dims // 2):
        keep = 1.0 - min(max((j - low) / (high - low), 0.0), 1.0)  # 1: the original frequency, 0: divided by factor
        out.append(1.0 / ((1.0 - keep) / factor + keep))
    return out


def llama3_factors(theta: float, head_dim: int, p: dict[str, Any]) -> list[float]:
    """Llama 3.1's frequency-dependent rope scaling, expressed as divisors of inv_freq."""
    factor = float(p["factor"])
    low, high = float(p.get("low_freq_factor", 1.0)), float(p.get("high_freq_factor", 4.0))
    old_ctx = float(p.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for i in range(0, head_dim, 2):
        inv = 1.0 / (theta ** (i / head_dim))
        wavelen = 2 * math.pi / inv
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def hf_rope_params(config: dict[str, Any]) -> dict[str, Any]:
    """The rope parameters of a HF config in either the v4 or the v5 layout."""
    params = dict(config.get("rope_parameters") or {})
    if not params:
        params = dict(config.get("rope_scaling") or {})
        params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    return params


def hf_layer_types(config: dict[str, Any], num_layers: int, default_pattern: int | None = None) -> list[str]:
    """Per-layer kinds from `layer_types` (v5), `sliding_window_pattern` or a model default."""
    types = config.get("layer_types")
    if types:
        return [SLIDING if "sliding" in t else GLOBAL for t in types]
    pattern = config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or default_pattern
    if pattern:
        return [GLOBAL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]
    return [GLOBAL] * num_layers


def gguf_layer_kinds(pattern: Any, n: int, key: str) -> list[str]:
    """llama.cpp's sliding_window_pattern: one flag per layer (true: sliding), or a period whose last layer is global
    (0: every layer slides)."""
    if pattern == 0:
        return [SLIDING] * n
    if isinstance(pattern, list):
        if len(pattern) != n:
            raise UnsupportedModelError(
                f"The sliding window pattern lists {len(pattern)} layers but the model has {n}.")
        return [SLIDING if flag else GLOBAL for flag in pattern]
    period = positive(pattern, key)
    return [SLIDING if (i + 1) % period else GLOBAL for i in range(n)]


def positive(value: Any, what: str, most: int = MAX_COUNT) -> int:
    """A count read from a model file, as an int from 1 to `most`; 0 (a division by zero later) or 2**31 layers
    (gigabytes of bookkeeping before any weight is read) are refused with the field's name."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or not 1 <= int(value) <= most:
        raise UnsupportedModelError(f"The model's {what} must be a whole number from 1 to {most:,}, not {value!r}.")
    return int(value)


def gguf_layer_count(value: Any, shapes: dict[str, tuple[int, ...]], key: str) -> int:
    """block_count, checked against the block tensors the file holds."""
    n = positive(value, key)
    if not any(name.startswith(f"blk.{n - 1}.") for name in shapes) or any(name.startswith(f"blk.{n}.") for name in shapes):
        held = len({name.split(".")[1] for name in shapes if name.startswith("blk.")})
        raise UnsupportedModelError(f"The model's {key} says {n:,} layers but the file holds tensors for {held:,}.")
    return n


def gguf_metadata_errors(read: Callable[..., "ModelArgs"]) -> Callable[..., "ModelArgs"]:
    """An architecture's args_from_gguf, with a metadata value of the wrong kind (a list where a count belongs,
    a string for a float) reported as such, naming the last key read, rather than as a raw TypeError."""
    @functools.wraps(read)
    def checked(meta: dict[str, Any], *args: Any, **kwargs: Any) -> "ModelArgs":
        reading = _KeysRead(meta)
        try:
            return read(reading, *args, **kwargs)
        except (TypeError, ValueError, IndexError, KeyError, OverflowError) as exc:
            at = f" (the last key read: {reading.last})" if reading.last else ""
            raise UnsupportedModelError(f"The GGUF metadata holds a value of the wrong kind{at}: {exc}.") from None

    return checked


class _KeysRead(dict):
    """Metadata that notes the last key read: a wrong-kind value fails as it is used, right after its read."""

    last: str | None = None

    def __getitem__(self, key: str) -> Any:
        self.last = key
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.last = key
        return super().get(key, default)


def require(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise UnsupportedModelError(f"{where} does not define {key!r}.")
    return d[key]
