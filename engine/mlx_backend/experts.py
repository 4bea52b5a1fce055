"""A mixture's experts stacked per projection for MLX's gathered products (`mx.gather_qmm`, `mx.gather_mm`): every
(row, expert) pair multiplies by index inside the step's graph, so the routing never goes back to the host (reading
it there, as a per-expert loop must, ends the lazy graph at every layer).

Each pair is its own one-row product (the rows are batched as (T, 1, 1, D) against (T, k) indices, never sorted into
shared tiles), so a row's result does not depend on the other rows of the step: greedy batched == alone holds."""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn


@dataclass(frozen=True)
class StackedProjection:
    """One projection of every expert: packed codes (E, N, K·bits/32) with scales (and, affine, biases), or floats
    (E, K, N)."""

    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    group_size: int = 0
    bits: int | None = None
    mode: str = "affine"  # or "mxfp4" (no biases)

    @staticmethod
    def of(modules: list[nn.Module]) -> StackedProjection | None:
        """The modules' matrices stacked, each module then holding a view of its slice (no second copy); None where
        they differ in shape or format, or carry a bias."""
        first = modules[0]
        if any("bias" in m for m in modules):
            return None
        if all(isinstance(m, nn.QuantizedLinear) for m in modules):
            if any((m.bits, m.group_size, m.mode, m.weight.shape, m.scales.shape) !=
                   (first.bits, first.group_size, first.mode, first.weight.shape, first.scales.shape) for m in modules):
                return None
            # bf16 scales widen to fp32 exactly where the experts differ (the products promote them to fp32 anyway)
            dtype = first.scales.dtype if all(m.scales.dtype == first.scales.dtype for m in modules) else mx.float32
            affine = first.mode == "affine"
            held = StackedProjection(mx.stack([m.weight for m in modules]),
                                     mx.stack([m.scales.astype(dtype) for m in modules]),
                                     mx.stack([m.biases.astype(dtype) for m in modules]) if affine else None,
                                     first.group_size, first.bits, first.mode)
            mx.eval(held.weight, held.scales, *([held.biases] if affine else []))
            for e, m in enumerate(modules):
                m.weight, m.scales = held.weight[e], held.scales[e]
                if affine:
                    m.biases = held.biases[e]
            return held
        if all(type(m) is nn.Linear for m in modules) and all(m.weight.shape == first.weight.shape for m in modules):
            held = StackedProjection(mx.stack([m.weight.T for m in modules]))
            mx.eval(held.weight)
            for e, m in enumerate(modules):
                m.weight = held.weight[e].T
            return held
        return None

    def __call__(self, x: mx.array, experts: mx.array) -> mx.array:
        """x (..., 1, K) against each pair's expert, `experts` broadcasting with x's leading dims -> (..., 1, N)."""
        if self.bits is None:
            return mx.gather_mm(x, self.weight, rhs_indices=experts)
        return mx.gather_qmm(x, self.weight, self.scales, self.biases, rhs_indices=experts, transpose=True,
                             group_size=self.group_size, bits=self.bits, mode=self.mode).astype(x.dtype)


@dataclass(frozen=True)
class StackedExperts:
    """A layer's experts' gate, up and down projections stacked."""

    gate: StackedProjection
    up: StackedProjection
    down: StackedProjection

    @staticmethod
    def of(experts: list[nn.Module]) -> StackedExperts | None:
        parts = {}
        for name in ("gate_proj", "up_proj", "down_proj"):
            parts[name] = StackedProjection.of([getattr(e, name) for e in experts])
            if parts[name] is None:
                return None
        return StackedExperts(parts["gate_proj"], parts["up_proj"], parts["down_proj"])

    def __call__(self, x: mx.array, experts: mx.array, act) -> mx.array:
        """(T, k, D): row t through its experts experts[t] (T, k), in the given order."""
        h = x[:, None, None, :]
        y = self.down(act(self.gate(h, experts)) * self.up(h, experts), experts)
        return y[:, :, 0, :]
