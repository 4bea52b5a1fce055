"""A sparse mixture-of-experts MLP in one library call (kernels/cpu/moe.c): router, top-k, the chosen experts' gated
MLPs over K-quant super-blocks, weighted sum. Plain PyTorch reference beside it (`impl="reference"`)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from kernels import cpu_native
from kernels.cpu_act import ACTS, gated_act_reference
from kernels.cpu_kgemm import KINDS, QK, kgemm_reference


@dataclass(frozen=True, slots=True)
class SharedExpert:
    """A shared expert, which every row takes: its fused gate|up and down super-blocks and its gate (D,) fp32 that
    scales it by σ(x·gate) (Qwen2-MoE's), or None (ERNIE 4.5's, added as it is)."""

    gate_up: torch.Tensor = field(repr=False)
    gate_up_type: str
    down: torch.Tensor = field(repr=False)
    down_type: str
    gate: torch.Tensor | None = field(default=None, repr=False)

    @property
    def inter(self) -> int:
        return _k(self.down, self.down_type)


@dataclass(frozen=True, slots=True)
class ExpertBlocks:
    """A layer's experts as the library takes them: each one's fused gate|up (2I rows) and down (D rows) super-blocks,
    one type per projection, with their addresses gathered once (a step passes them without touching each expert)."""

    gate_up: tuple[torch.Tensor, ...] = field(repr=False)
    gate_up_type: str
    down: tuple[torch.Tensor, ...] = field(repr=False)
    down_type: str
    act: str
    gate_up_at: ctypes.Array = field(repr=False)
    down_at: ctypes.Array = field(repr=False)
    shared: SharedExpert | None = None

    @staticmethod
    def of(gate_up: list[torch.Tensor], gate_up_type: str, down: list[torch.Tensor], down_type: str,
           act: str, shared: SharedExpert | None = None) -> "ExpertBlocks":
        types = {gate_up_type, down_type} | ({shared.gate_up_type, shared.down_type} if shared else set())
        if not types <= set(KINDS) or act not in ACTS:
            raise ValueError(f"experts of {'/'.join(sorted(types))} with {act} are not the library's")
        if shared is not None and shared.gate is not None and (shared.gate.dtype != torch.float32
                                                                 or not shared.gate.is_contiguous()):
            raise ValueError("the shared expert's gate must be contiguous fp32")
        if len(gate_up) != len(down) or any(g.shape != gate_up[0].shape for g in gate_up) \
                or any(d.shape != down[0].shape for d in down):
            raise ValueError("every expert must have the same shapes")
        at = ctypes.c_void_p * len(gate_up)
        return ExpertBlocks(tuple(gate_up), gate_up_type, tuple(down), down_type, act,
                            at(*[g.data_ptr() for g in gate_up]), at(*[d.data_ptr() for d in down]), shared)

    @property
    def inter(self) -> int:
        """I: the experts' intermediate width (the down projection's K)."""
        return _k(self.down[0], self.down_type)


def _k(blocks: torch.Tensor, type_name: str) -> int:
    """The K of a matrix held as rows of `type_name` super-blocks."""
    return blocks.shape[1] // KINDS[type_name][1] * QK


def moe(x: torch.Tensor, router: torch.Tensor, experts: ExpertBlocks, top_k: int, norm_topk: bool,
        select_bias: torch.Tensor | None = None, *, sigmoid: bool = False, scaling: float = 1.0,
        impl: str = "auto") -> torch.Tensor:
    """x (R, D) fp32 -> (R, D) fp32: each row through the `top_k` experts its router (E, D) fp32 scores highest (by
    score + `select_bias` (E,) where given, ERNIE 4.5's and GLM-4.5's), their outputs weighted by the scores (the
    softmax over all experts, or each one's sigmoid with `sigmoid`; renormalised over the chosen with `norm_topk`,
    times `scaling`) and summed, experts ascending, plus the shared expert's (gated) output where there is one. Each
    row alone: its result never depends on the other rows."""
    e, d = router.shape
    if x.shape[-1] != d or len(experts.gate_up) != e or not 1 <= top_k <= e or (
            select_bias is not None and select_bias.shape != (e,)):
        raise ValueError(f"x {list(x.shape)}, router {list(router.shape)}, {len(experts.gate_up)} experts, "
                         f"top {top_k}: they do not fit")
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        return moe_reference(x, router, experts, top_k, norm_topk, select_bias, sigmoid, scaling)
    x, router = x.float().contiguous(), router.float().contiguous()
    bias = select_bias.float().contiguous() if select_bias is not None else None
    out = torch.empty(x.shape, dtype=torch.float32)
    sh = experts.shared
    shared = (sh.gate_up.data_ptr(), KINDS[sh.gate_up_type][0], sh.inter, sh.down.data_ptr(), KINDS[sh.down_type][0],
              sh.gate.data_ptr() if sh.gate is not None else None) if sh is not None else (None, 0, 0, None, 0, None)
    rc = kernel.lib.parley_moe(x.data_ptr(), x.shape[0], d, router.data_ptr(),
                               bias.data_ptr() if bias is not None else None, e, top_k, int(norm_topk), int(sigmoid),
                               scaling,
                               experts.gate_up_at, KINDS[experts.gate_up_type][0], experts.inter, experts.down_at,
                               KINDS[experts.down_type][0], ACTS[experts.act], *shared, out.data_ptr(),
                               torch.get_num_threads())
    if rc == -2:
        raise ValueError(f"the library's experts do not take D = {d}, I = {experts.inter}")
    if rc != 0:
        raise MemoryError(f"no memory for a mixture step of {x.shape[0]} rows")
    return out


def moe_reference(x: torch.Tensor, router: torch.Tensor, experts: ExpertBlocks, top_k: int, norm_topk: bool,
                  select_bias: torch.Tensor | None = None, sigmoid: bool = False, scaling: float = 1.0) -> torch.Tensor:
    """The same arithmetic in plain PyTorch: the products as kgemm_reference's (activations quantized per 32)."""
    x = x.float()
    logits = x @ router.float().t()
    probs = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
    weights, chosen = torch.topk(probs, top_k, dim=-1)
    if select_bias is not None:
        chosen = torch.topk(probs + select_bias.float(), top_k, dim=-1).indices
        weights = probs.gather(-1, chosen)
    if norm_topk:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights * scaling
    out = torch.zeros_like(x)
    inter = experts.inter
    for r in range(x.shape[0]):
        for e, w in sorted(zip(chosen[r].tolist(), weights[r].tolist())):
            gu = kgemm_reference(x[r:r + 1], experts.gate_up[e], experts.gate_up_type)
            act = gated_act_reference(gu[:, :inter], gu[:, inter:], experts.act)
            out[r] += w * kgemm_reference(act, experts.down[e], experts.down_type)[0]
    sh = experts.shared
    if sh is not None:
        gu = kgemm_reference(x, sh.gate_up, sh.gate_up_type)
        act = gated_act_reference(gu[:, :sh.inter], gu[:, sh.inter:], experts.act)
        gate = torch.sigmoid(x @ sh.gate.float())[:, None] if sh.gate is not None else 1.0
        out += gate * kgemm_reference(act, sh.down, sh.down_type)
    return out
