"""Growing the cache's storage inside the memory that is free: doubled where that fits, else the most that fits, else
a refusal in one line before anything is allocated (an out-of-memory kill would lose every chat in progress)."""
from __future__ import annotations

from typing import Callable

import torch

from engine.errors import CacheMemoryError

GROWTH_MARGIN = 64 << 20  # left after a growth for a step's activations and thread stacks, the app and the OS
MB = 1 << 20


def free_bytes(device: torch.device) -> int:
    """The memory a growth may take on `device`: engine/memory.py's reading (the GPU's, or the RAM within the memory
    cgroup's limit) and, on the CPU, what an address-space limit still lets this process map."""
    from engine.memory import address_space_free_bytes, available_bytes  # engine.memory imports the quantized formats

    free = available_bytes(str(device))
    mappable = address_space_free_bytes() if device.type == "cpu" else None
    return free if mappable is None else min(free, mappable)


def choose_size(current: int, needed: int, ceiling: int, cost: Callable[[int], int], free: int, device: torch.device,
                grain: int = 16) -> int:
    """The size (rows or cells) to grow to from `current` so that `needed` fit: doubled (up to `ceiling`) where the
    bytes it adds at its peak (`cost`) fit in `free` with the margin, else the largest that fits (within `grain`),
    else a CacheMemoryError naming what even `needed` would take."""
    needed = min(needed, ceiling)
    doubled = current
    while doubled < needed:
        doubled = min(ceiling, doubled * 2)
    budget = free - GROWTH_MARGIN
    if cost(doubled) <= budget:
        return doubled
    if cost(needed) > budget:
        raise refusal(cost(needed), free, device)
    fits, too_big = needed, doubled
    while too_big - fits > grain:
        mid = (fits + too_big) // 2
        fits, too_big = (mid, too_big) if cost(mid) <= budget else (fits, mid)
    return fits


def peak_bytes(old: list[int], new: list[int]) -> int:
    """Bytes a growth adds at its peak when each tensor (`old` sizes) is replaced by a larger one (`new`) in turn: every
    tensor's increase, and the largest old tensor still alive while its copy is made."""
    grown = [(o, n) for o, n in zip(old, new) if n > o]
    return sum(n - o for o, n in grown) + max((o for o, _ in grown), default=0)


def refusal(need: int, free: int | None, device: torch.device) -> CacheMemoryError:
    """The one line a refused growth ends its turn with; `free` None: the allocator refused what the reading allowed."""
    where = "GPU memory" if device.type == "cuda" else "memory"
    need_mb = -(-(need + GROWTH_MARGIN) // MB)  # the margin counts: the need shown always exceeds the free
    have = ", more than this process may allocate" if free is None else f" and {max(0, free) // MB:,} MB is free"
    return CacheMemoryError(f"The conversation needs ~{need_mb:,} MB more {where} for its cache{have}; free some "
                            "memory or shorten the conversation.")


def allocation_failed(exc: BaseException) -> bool:
    """Whether an exception is an allocator's refusal (a limit the free-memory reading did not see)."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "allocate" in str(exc)
