"""What a model's runtime holds beside its weights, known from the model's header alone: the first KV cache, the CPU
decode tapes, one step's activations. The load counts them with the weights, so a model that cannot serve its chats
is refused before its weights are read (engine/memory.py `check_fits`), not after a full load."""
from __future__ import annotations

from engine.backend import resolve_backend
from engine.cache import first_cache_bytes
from engine.cache.growth import GROWTH_MARGIN
from engine.cpu_tape import MAX_ROWS
from engine.loading.loader import LoadOptions
from engine.models.args import ModelArgs
from engine.speculative import TILE_SEQUENCES
from engine.runtime import EngineConfig, cache_config_for, cache_storage

VERIFY_ROWS = 9  # a drafting session's widest step: its token and 8 drafts (engine/speculative)
CPU_DRAFTERS = 2  # sessions that draft in one step on the CPU (engine/speculative make_drafter)
FLOAT = 4  # activations and logits are fp32 on the CPU; on CUDA bf16 takes less: the count stays an upper bound


def runtime_parts(config: EngineConfig, args: ModelArgs, options: LoadOptions) -> list[tuple[str, int]]:
    """(what, bytes) the runtime of `config` adds to the model's weights on `options.device`; none for MLX, which
    sizes its own."""
    if resolve_backend(config.backend, options.device) != "torch":
        return []
    device = options.device.split(":")[0]
    storage = cache_storage(device, options.quantized, "torch", options.torch_dtype)
    cache = cache_config_for(args, config, storage)
    chats = f"{config.max_sessions} chat{'' if config.max_sessions == 1 else 's'}"
    parts = [(f"a cache for {chats}", first_cache_bytes(cache, args.layer_windows(), args.num_kv_heads, args.head_dim)
              + GROWTH_MARGIN)]
    if storage == "float16" and config.kv_layout == "sequence":  # Parley's CPU library runs it: steps are taped
        parts.append(("decode tapes", tape_rows(config) * tape_row_bytes(args) + MAX_ROWS * FLOAT * args.vocab_size))
    parts.append(("a step's activations", step_bytes(config, args, device)))
    return parts


def tape_rows(config: EngineConfig) -> int:
    """Rows of the widest tape (engine/cpu_tape.py), whose memory all tapes share: a decode step of every session, and
    with drafting a verify step of MAX_ROWS."""
    return MAX_ROWS if config.speculative != "off" else min(config.max_sessions, MAX_ROWS)


def layer_row_floats(args: ModelArgs) -> int:
    """Floats one row's pass through one layer allocates: norms and residuals, q/k/v and the attention output, the
    MLP's gate, up and activation (an expert model's chosen experts)."""
    experts = args.experts_per_token * args.moe_intermediate_size + args.shared_expert_size
    ffn = max(args.intermediate_size, experts) if args.num_experts else args.intermediate_size
    q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    return 6 * args.hidden_size + 3 * q + 2 * kv + 3 * ffn


def tape_row_bytes(args: ModelArgs) -> int:
    """A taped row: every tensor its step allocated (in the arena all tapes share) but its logits, which go to one
    buffer of MAX_ROWS rows all tapes share. With the logits, measured 1.96 MB a row on Gemma 3 270M (formula 1.93),
    3.4 MB on a Llama-1B shape (3.2)."""
    return FLOAT * args.num_layers * layer_row_floats(args)


def _cpu_drafters() -> int:
    """Sessions that may draft in one step on the CPU: more where it multiplies on AMX tiles (as many as a model
    mostly in their formats drafts for; counted for every model, the header does not say which will be)."""
    from kernels.cpu_native import amx_ready

    return max(CPU_DRAFTERS, TILE_SEQUENCES) if amx_ready() else CPU_DRAFTERS


def step_bytes(config: EngineConfig, args: ModelArgs, device: str) -> int:
    """One step's activations at their peak: a layer's for the step's token budget, the residual stream, and the
    logits of its sampled rows (every session's, with drafts where they verify)."""
    drafting = config.max_sessions if device == "cuda" else min(config.max_sessions, _cpu_drafters())
    sampled = min(config.max_sampled_rows, config.max_sessions + drafting * (VERIFY_ROWS - 1))
    if config.speculative == "off":
        sampled = min(config.max_sampled_rows, config.max_sessions)
    return FLOAT * (config.step_tokens * (layer_row_floats(args) + 2 * args.hidden_size) + sampled * args.vocab_size)
