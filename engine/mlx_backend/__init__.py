"""The MLX backend (Apple silicon): the same architectures, names and cache semantics as the PyTorch one."""
from __future__ import annotations


def mlx_available() -> bool:
    try:
        import mlx.core  # noqa: F401
    except ImportError:
        return False
    return True
