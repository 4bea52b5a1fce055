"""A sparse mixture-of-experts MLP in one library call (kernels/cpu/moe.c): router, top-k, the chosen experts' gated
MLPs over K-quant super-blocks (`moe`) or the codes layout (`moe_codes`: gpt-oss's MXFP4, with biases and its clamped
activation), weighted sum. Plain PyTorch references beside them (`impl="reference"`)."""
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
    e, d = _check_routing(x, router, len(experts.gate_up), top_k, select_bias)
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
    return _checked(rc, out, experts.inter)


def _check_routing(x: torch.Tensor, router: torch.Tensor, experts: int, top_k: int,
                   bias: torch.Tensor | None) -> tuple[int, int]:
    """(E, D) of a router that fits x, its experts, top_k and a per-expert bias (E,) or None; else ValueError."""
    e, d = router.shape
    if x.shape[-1] != d or experts != e or not 1 <= top_k <= e or (bias is not None and bias.shape != (e,)):
        raise ValueError(f"x {list(x.shape)}, router {list(router.shape)}, {experts} experts, top {top_k}: they do "
                         "not fit")
    return e, d


def _checked(rc: int, out: torch.Tensor, inter: int) -> torch.Tensor:
    """A library mixture's result, or its failure as an exception."""
    if rc == -2:
        raise ValueError(f"the library's experts do not take D = {out.shape[-1]}, I = {inter}")
    if rc != 0:
        raise MemoryError(f"no memory for a mixture step of {out.shape[0]} rows")
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


CODE_ACTS = {"silu": 0, "gelu_tanh": 1, "clamped": 2}  # parley_moe_codes' act: "clamped" is gpt-oss's


@dataclass(frozen=True, slots=True)
class CodeExperts:
    """A layer's experts in the codes layout (kernels/cpu/qgemm.c's symmetric codes in groups of 32, one layout for
    every matrix: MXFP4's 4-bit indices with their `lut`, Q4_0's or Q8_0's codes) as parley_moe_codes takes them: each
    one's fused gate|up (2I rows) and down (D rows) codes and fp16 scales, their biases stacked fp32 (or None), the
    activation ("clamped": gpt-oss's, with `alpha` and `limit`), the addresses gathered once."""

    gate_up: tuple[tuple[torch.Tensor, torch.Tensor], ...] = field(repr=False)  # (codes, scales) per expert
    down: tuple[tuple[torch.Tensor, torch.Tensor], ...] = field(repr=False)
    gate_up_bias: torch.Tensor | None = field(repr=False)  # (E, 2I)
    down_bias: torch.Tensor | None = field(repr=False)  # (E, D)
    bits: int
    zero: int
    lut: torch.Tensor | None = field(repr=False)
    act: str
    alpha: float
    limit: float
    at: tuple[ctypes.Array, ...] = field(repr=False)  # gate|up codes, scales; down codes, scales

    @staticmethod
    def of(gate_up: list[tuple[torch.Tensor, torch.Tensor]], down: list[tuple[torch.Tensor, torch.Tensor]],
           gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, bits: int, zero: int,
           lut: torch.Tensor | None, act: str, alpha: float = 1.702, limit: float = 7.0) -> "CodeExperts":
        if act not in CODE_ACTS or bits not in (4, 8) or (lut is not None and (bits != 4 or lut.shape != (16,))):
            raise ValueError(f"experts of {bits}-bit codes with {act} are not the library's")
        if len(gate_up) != len(down) or any(g[0].shape != gate_up[0][0].shape for g in gate_up) \
                or any(d[0].shape != down[0][0].shape for d in down):
            raise ValueError("every expert must have the same shapes")
        for b in (gate_up_bias, down_bias):
            if b is not None and (b.dtype != torch.float32 or not b.is_contiguous() or b.shape[0] != len(gate_up)):
                raise ValueError("the experts' biases must be one contiguous fp32 row each")
        at = ctypes.c_void_p * len(gate_up)
        arrays = tuple(at(*[t[i].data_ptr() for t in parts]) for parts in (gate_up, down) for i in (0, 1))
        return CodeExperts(tuple(gate_up), tuple(down), gate_up_bias, down_bias, bits, zero, lut, act, alpha, limit,
                           arrays)

    @property
    def inter(self) -> int:
        """I: the experts' intermediate width (the down projection's K)."""
        return self.down[0][0].shape[1] * 8 // self.bits


def moe_codes(x: torch.Tensor, router: torch.Tensor, router_bias: torch.Tensor | None, experts: CodeExperts,
              top_k: int, norm_topk: bool, *, impl: str = "auto") -> torch.Tensor:
    """x (R, D) fp32 -> (R, D) fp32: as `moe`, over experts in the codes layout, the router's logits plus
    `router_bias` (E,) where given, each expert's biases added after its products (gpt-oss). Each row alone."""
    e, d = _check_routing(x, router, len(experts.gate_up), top_k, router_bias)
    kernel = cpu_native.chosen(impl)
    if kernel is None:
        return moe_codes_reference(x, router, router_bias, experts, top_k, norm_topk)
    x, router = x.float().contiguous(), router.float().contiguous()
    rb = router_bias.float().contiguous() if router_bias is not None else None
    out = torch.empty(x.shape, dtype=torch.float32)

    def ptr(t: torch.Tensor | None):
        return t.data_ptr() if t is not None else None

    rc = kernel.lib.parley_moe_codes(x.data_ptr(), x.shape[0], d, router.data_ptr(), ptr(rb), e, top_k,
                                     int(norm_topk), experts.at[0], experts.at[1], ptr(experts.gate_up_bias),
                                     experts.at[2], experts.at[3], ptr(experts.down_bias), experts.bits,
                                     ptr(experts.lut), experts.zero, experts.inter, CODE_ACTS[experts.act],
                                     experts.alpha, experts.limit, out.data_ptr(), torch.get_num_threads())
    return _checked(rc, out, experts.inter)


def moe_codes_reference(x: torch.Tensor, router: torch.Tensor, router_bias: torch.Tensor | None,
                        experts: CodeExperts, top_k: int, norm_topk: bool) -> torch.Tensor:
    """The same arithmetic in plain PyTorch: the products as qgemm_reference's (activations quantized per 32)."""
    from kernels.cpu_qgemm import qgemm_reference

    x = x.float()
    logits = x @ router.float().t() + (router_bias.float() if router_bias is not None else 0.0)
    weights, chosen = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    if norm_topk:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out, inter = torch.zeros_like(x), experts.inter

    def product(rows: torch.Tensor, held: tuple[torch.Tensor, torch.Tensor], bias: torch.Tensor | None, e: int):
        y = qgemm_reference(rows, held[0], held[1], None, experts.bits, 32, experts.zero, experts.lut)
        return y if bias is None else y + bias[e]

    for r in range(x.shape[0]):
        for e, w in sorted(zip(chosen[r].tolist(), weights[r].tolist())):
            gu = product(x[r:r + 1], experts.gate_up[e], experts.gate_up_bias, e)
            gate, up = gu[:, :inter], gu[:, inter:]
            if experts.act == "clamped":
                gate, up = gate.clamp(max=experts.limit), up.clamp(-experts.limit, experts.limit)
                act = gate * torch.sigmoid(experts.alpha * gate) * (up + 1)
            else:
                act = gated_act_reference(gate, up, experts.act)
            out[r] += w * product(act, experts.down[e], experts.down_bias, e)[0]
    return out
