"""A GGUF file's size keys, checked by their own names: before the architecture reads them (a count must be a whole
number in range: int() made a bool a context of 1 token and 4096.5 one of 4096, and a 2**26 leading_dense_block_count
a list of 67 million layers), and after, against the model read from them (a key the reader passes over must still
describe it: llama.cpp builds its tensors from them)."""
from __future__ import annotations

from typing import Any

from engine.errors import UnsupportedModelError
from engine.models.args import MAX_CONTEXT, MAX_COUNT, ModelArgs

# key (after "<arch>.") -> (least, most) of a count. The least holds for a single value; a per-layer list's entries may
# be 0 (a hybrid model's recurrent layers have no attention heads), which the architecture then refuses by name
COUNTS = {
    "context_length": (1, MAX_CONTEXT),
    "rope.scaling.original_context_length": (0, MAX_CONTEXT),
    "embedding_length": (1, MAX_COUNT),
    "block_count": (1, MAX_COUNT),
    "feed_forward_length": (0, MAX_COUNT),  # 0: a mixture of experts' width is expert_feed_forward_length
    "expert_feed_forward_length": (0, MAX_COUNT),
    "expert_shared_feed_forward_length": (0, MAX_COUNT),
    "attention.head_count": (1, MAX_COUNT),
    "attention.head_count_kv": (1, MAX_COUNT),
    "attention.key_length": (1, MAX_COUNT),
    "attention.value_length": (1, MAX_COUNT),
    "attention.sliding_window": (0, MAX_CONTEXT),
    "rope.dimension_count": (1, MAX_COUNT),
    "vocab_size": (1, MAX_COUNT),
    "expert_count": (0, 4096),
    "expert_used_count": (0, 4096),
    "expert_shared_count": (0, 4096),
    "leading_dense_block_count": (0, MAX_COUNT),
    "interleave_moe_layer_step": (0, MAX_COUNT),
    "nextn_predict_layers": (0, MAX_COUNT),
    "expert_gating_func": (0, MAX_COUNT),
}
PER_LAYER = {"feed_forward_length", "attention.head_count", "attention.head_count_kv"}  # llama.cpp reads arrays there


def check_counts(meta: dict[str, Any], arch: str) -> None:
    """Refuses a count of the wrong kind (a float, a bool, a string) or out of range, naming its key."""
    for suffix, (least, most) in COUNTS.items():
        key = f"{arch}.{suffix}"
        if key not in meta:
            continue
        value = meta[key]
        if suffix in PER_LAYER and isinstance(value, list) and value:
            for item in value:
                _count(item, key, 0, most, value)
        else:
            _count(value, key, least, most, value)


def _count(value: Any, key: str, least: int, most: int, whole: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnsupportedModelError(f"The GGUF metadata holds a value of the wrong kind for {key}: {_shown(whole)}, "
                                    "where a whole number belongs.")
    if not least <= value <= most:
        raise UnsupportedModelError(f"The GGUF metadata's {key} must be a whole number from {least:,} to {most:,}, "
                                    f"not {value:,}.")


def _shown(value: Any, chars: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= chars else text[:chars] + "…"


def check_against_model(meta: dict[str, Any], arch: str, args: ModelArgs) -> None:
    """Refuses size keys that the architecture's reader passed over but that say another model than the one it read:
    llama.cpp would build (or refuse) that other model, so the two would not run the same file alike."""
    _rotary_dims(meta.get(f"{arch}.rope.dimension_count"), arch, args)
    _value_width(meta, arch, args)
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is not None and vocab != args.vocab_size:
        raise UnsupportedModelError(
            f"The GGUF metadata's {arch}.vocab_size is {vocab:,} but the model embeds {args.vocab_size:,} tokens.")


def _rotary_dims(rotary: int | None, arch: str, args: ModelArgs) -> None:
    """Most readers rotate the whole head whatever the key says (llama.cpp refuses a Llama whose key differs, and
    rotates that many dims of the others); those of partial rotaries (Phi-3, GLM-4, StableLM) read it."""
    runs = {args.head_dim if rope.rotary_dim is None else rope.rotary_dim
            for rope in args.rope.values() if rope.rotary_dim != 0}  # 0: a layer kind without rotary positions
    if rotary is not None and runs and rotary not in runs:
        raise UnsupportedModelError(
            f"The GGUF metadata's {arch}.rope.dimension_count says {rotary:,} dims of each {args.head_dim}-dim "
            f"attention head rotate; Parley's {args.model_type} rotates {min(runs):,}.")


def _value_width(meta: dict[str, Any], arch: str, args: ModelArgs) -> None:
    """Every architecture here builds its values as wide as its keys, whatever value_length says."""
    values = meta.get(f"{arch}.attention.value_length")
    if values is not None and values != args.head_dim:
        keys = f"{arch}.attention.key_length" if f"{arch}.attention.key_length" in meta else \
            "embedding_length / head_count"
        raise UnsupportedModelError(
            f"The GGUF metadata gives values of {values:,} dims ({arch}.attention.value_length) but keys of "
            f"{args.head_dim:,} ({keys}); Parley needs them alike.")
