"""The off-graph KV cache: bookkeeping in integers, storage in one of two layouts."""
from __future__ import annotations

import torch

from engine.cache.base import KVCache
from engine.cache.book import CacheBook, Segment
from engine.cache.cell_layout import CellKVCache
from engine.cache.config import CacheConfig
from engine.cache.sequence_layout import SequenceKVCache

__all__ = ["CacheBook", "CacheConfig", "CellKVCache", "KVCache", "Segment", "SequenceKVCache", "first_cache_bytes",
           "make_cache"]


def make_cache(
    config: CacheConfig, windows: list[int | None], kv_heads: int, head_dim: int, device: str | torch.device = "cpu"
) -> KVCache:
    cls = CellKVCache if config.layout == "cell" else SequenceKVCache
    return cls(config, windows, kv_heads, head_dim, device)


def first_cache_bytes(config: CacheConfig, windows: list[int | None], kv_heads: int, head_dim: int) -> int:
    """Bytes `make_cache` allocates at once: the same cache built on the meta device, which allocates nothing."""
    cache = make_cache(config, windows, kv_heads, head_dim, "meta")
    return sum(t.numel() * t.element_size() for t in (*cache.k, *cache.v))
