"""CacheConfig: the KV cache's shape and limits, validated once."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import CacheConfigError

LAYOUTS = ("cell", "sequence")
STORAGE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class CacheConfig:
    layout: str
    max_seqs: int  # resident sequences (cache slots)
    max_seq_len: int  # tokens one sequence may hold: its context limit
    capacity: int  # ceiling of token cells over all sequences
    dtype: str  # storage dtype; never guessed
    max_step_tokens: int = 512  # most tokens a sequence writes in one step (ring sizes depend on it)
    initial_capacity: int | None = None  # first allocation; storage grows toward `capacity`

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise CacheConfigError(f"kv_layout must be one of {', '.join(LAYOUTS)}, not {self.layout!r}.")
        if self.dtype not in STORAGE_DTYPES:
            raise CacheConfigError(f"The cache needs a storage dtype ({', '.join(STORAGE_DTYPES)}); got {self.dtype!r}.")
        for name in ("max_seqs", "max_seq_len", "capacity", "max_step_tokens"):
            if getattr(self, name) < 1:
                raise CacheConfigError(f"{name} must be at least 1.")
        need = self.max_seqs * self.max_seq_len
        if need > self.capacity:
            raise CacheConfigError(
                f"max_seqs × max_seq_len = {self.max_seqs} × {self.max_seq_len} = {need:,} tokens exceeds the "
                f"cache capacity of {self.capacity:,}: a full cache would be reachable mid-step."
            )
        if self.initial_capacity is None:
            self.initial_capacity = min(self.capacity, self.max_seqs * 256)
        if not 1 <= self.initial_capacity <= self.capacity:
            raise CacheConfigError("initial_capacity must be between 1 and capacity.")

    @property
    def torch_dtype(self) -> torch.dtype:
        return STORAGE_DTYPES[self.dtype]

    def ring_rows(self, window: int) -> int:
        """Rows a sliding-window layer keeps: the window plus what one step may write before reading."""
        return min(self.max_seq_len, window + self.max_step_tokens - 1)


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32: the name CacheConfig takes."""
    return next(name for name, dt in STORAGE_DTYPES.items() if dt == dtype)
