"""Sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral): a router picks each token's top-k experts among gated MLPs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.args import ModelArgs
from engine.models.layers import ClampedGLU, GatedMLP, Linear, QuantLinear, mlp
from engine.quant.weight import QuantTensor

if TYPE_CHECKING:
    from kernels.cpu_moe import CodeExperts, ExpertBlocks


class SparseMoE(nn.Module):
    """Each token's row goes through the `top_k` experts its router scores highest; their outputs are summed with the
    router's softmax weights (renormalised over the chosen ones with `norm_topk`).

    Experts run in ascending order, each on the rows that chose it, gathered: a row's result depends only on the row
    (every product here is row-wise), so greedy batched == alone holds as for a dense MLP. On the CPU library's
    super-block formats the whole layer is one library call (kernels/cpu_moe.py): routing is data there, not a host
    sync, so CPU decode steps are taped (super-blocks: `parley_moe`; the codes layout, gpt-oss's MXFP4 with its biases:
    `parley_moe_codes`). On CUDA's fused kernels the experts are stacked and every (row, expert) pair
    runs by index on the device (`_on_device`): steps replay as graphs."""

    # steps of at least this many rows group their (row, expert) pairs by expert on the device (H200, Qwen3-30B-A3B
    # shape, quantized: one row 262.6 tok/s apart, 256.5 grouped; 8 rows 1,029 -> 1,187; 64 rows 1,772 -> 4,310)
    group_rows = 2

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate = Linear(args.hidden_size, args.num_experts, bias=args.router_bias)
        glu = ClampedGLU(args.glu_alpha, args.glu_limit) if args.glu_limit is not None else None
        self.experts = nn.ModuleList(
            GatedMLP(args.hidden_size, args.moe_intermediate_size, args.hidden_act, args.expert_bias, glu)
            for _ in range(args.num_experts))
        self.top_k, self.norm_topk = args.experts_per_token, args.norm_topk_prob
        self.sigmoid, self.scaling = args.router_sigmoid, args.routed_scaling  # GLM-4.5's scores and weights' scale
        # ERNIE 4.5, GLM-4.5: a per-expert bias added to the scores for the choice only (the weights stay the scores)
        self.select = SelectBias(args.num_experts) if args.expert_select_bias else None
        self.shared_expert = self.shared_expert_gate = None
        if args.shared_expert_size:  # one more expert every row takes; Qwen2-MoE scales it by sigmoid(its gate)
            self.shared_expert = GatedMLP(args.hidden_size, args.shared_expert_size, args.hidden_act)
            if args.shared_expert_gated:
                self.shared_expert_gate = Linear(args.hidden_size, 1, bias=False)
        self._held: tuple = (None, None)  # (what it was found for, ExpertBlocks or None): `_library`
        self._stacked: StackedExperts | None = None  # on CUDA's fused kernels: every expert in one tensor per buffer

    @property
    def tapeable(self) -> bool:
        """Whether a CPU step through this layer is one library call (a CPU tape can replay it)."""
        return self._library() is not None

    @property
    def replayable(self) -> bool:
        """Whether a step through this layer can be captured in a CUDA graph: the routing stays on the device."""
        return self._stacked is not None

    def prepare_experts(self, fused: bool) -> None:
        """On CUDA's fused kernels (`CausalLM.prepare`), stacks the experts for `_on_device`; elsewhere nothing."""
        held = next(iter(self.experts[0].state_dict().values()), None)
        if fused and self._stacked is None and held is not None and held.is_cuda:
            self._stacked = StackedExperts.stack(self.experts)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (T, k) fp32, chosen experts (T, k)) of rows x (T, D), best first."""
        gate = self.gate
        if type(gate) is Linear and gate.weight.dtype == torch.float32 and x.dtype != torch.float32:
            logits = F.linear(x.float(), gate.weight, gate.bias)  # an fp32 router (keeps_fp32) in a bf16 model
        else:
            logits = gate(x).float()
        probs = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, dim=-1)
        if self.select is None:
            weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        else:
            chosen = torch.topk(probs + self.select.bias.float(), self.top_k, dim=-1).indices
            weights = probs.gather(-1, chosen)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights * self.scaling if self.scaling != 1.0 else weights), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        library = self._library() if x.device.type == "cpu" and x.dtype == torch.float32 else None
        if library is not None:  # routing, experts, shared expert and sums in one library call: steps are taped
            from kernels.cpu_moe import CodeExperts, moe, moe_codes

            if isinstance(library, CodeExperts):  # experts in the codes layout (gpt-oss's MXFP4)
                return moe_codes(x.reshape(-1, x.shape[-1]), self.gate.weight, self.gate.bias, library, self.top_k,
                                 self.norm_topk, impl="native").reshape(x.shape)
            return moe(x.reshape(-1, x.shape[-1]), self.gate.weight, library, self.top_k, self.norm_topk,
                       self.select.bias if self.select is not None else None, sigmoid=self.sigmoid,
                       scaling=self.scaling, impl="native").reshape(x.shape)
        out = self._routed(x)
        if self.shared_expert is None:
            return out
        shared = _whole(self.shared_expert(x), x.dtype)
        if self.shared_expert_gate is None:
            return out + shared
        return out + torch.sigmoid(self.shared_expert_gate(x)) * shared

    def _routed(self, x: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum, in x's dtype."""
        lead, x2 = x.shape[:-1], x.reshape(-1, x.shape[-1])
        weights, chosen = self.route(x2)
        if self._stacked is not None and x.is_cuda and not torch.compiler.is_compiling():
            return self._on_device(x2, weights, chosen).reshape(*lead, -1)
        if x2.shape[0] == 1:
            return self._one_row(x2, weights, chosen).reshape(*lead, -1)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (row, slot) pairs grouped by expert, rows ascending within each
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()  # the one host sync
        rows, slots = order // self.top_k, order % self.top_k
        out = torch.zeros(x2.shape, dtype=torch.float32, device=x.device)  # the k outputs summed in fp32
        start = 0
        for e, n in enumerate(counts):
            if n:
                r = rows[start:start + n]
                y = _whole(self.experts[e](x2.index_select(0, r)), x.dtype).float()
                out.index_add_(0, r, y * weights[r, slots[start:start + n], None])
            start += n
        return out.to(x.dtype).reshape(*lead, -1)

    def _on_device(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """Every (row, expert) pair in one launch per projection, the experts read by index on the device (no host
        sync: steps replay as CUDA graphs); each row's experts summed in ascending order, as everywhere. From
        `group_rows` rows on, an expert's pairs run side by side (`pair_tiles`), reading it once per 16 of them: the
        same bits per row."""
        from kernels.moe import experts_linear, pair_tiles, weighted_rows
        from kernels.norms import act_mul

        chosen, order = chosen.sort(dim=-1)
        weights, flat, held = weights.gather(-1, order), chosen.reshape(-1), self._stacked
        tiles = pair_tiles(flat, len(self.experts)) if x.shape[0] >= self.group_rows else None
        gate_up = experts_linear(x, held.gate_up_format, held.gate_up, flat, self.top_k, tiles=tiles)
        if held.gate_up_bias is not None:  # gpt-oss: each pair's expert's bias, gathered on the device
            gate_up = gate_up + held.gate_up_bias.index_select(0, flat)
        if held.glu is not None:  # gpt-oss's clamped activation: element-wise ops, captured with the rest
            act = held.glu(*gate_up.chunk(2, dim=-1))
        else:
            act = act_mul(gate_up, held.act, impl="triton" if x.is_cuda else "reference")
        down = experts_linear(act, held.down_format, held.down, flat, 1, tiles=tiles)
        if held.down_bias is not None:
            down = down + held.down_bias.index_select(0, flat)
        return weighted_rows(down, weights)

    def _one_row(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """`forward` of one row (a lone session's decode step) without the gathers: the same products and sums in
        the same order (0 + a is a), so its bits are the batched path's."""
        picks = sorted(zip(chosen[0].tolist(), range(self.top_k)))  # ascending experts, as the batched path runs
        out = None
        for e, slot in picks:
            y = _whole(self.experts[e](x), x.dtype).float() * weights[:, slot, None]
            out = y if out is None else out + y
        return out.to(x.dtype)

    def _library(self) -> "ExpertBlocks | CodeExperts | None":
        """The router and experts as the CPU library's one-call mixture takes them (kernels/cpu_moe.py: super-blocks,
        or the codes layout), or None; found once the model is prepared (the experts' `native` flag and fused gate|up,
        `CausalLM.prepare`)."""
        first = self.experts[0]
        key = (first.native, id(first.gate_up_proj))
        if self._held[0] != key:
            routers = [self.gate] + [g for g in (self.shared_expert_gate,) if g is not None]
            held = None
            if all(map(_plain_router, routers)):
                held = _expert_blocks(self.experts, self.shared_expert, self.shared_expert_gate)
            if held is None and self.select is None and not self.sigmoid and self.scaling == 1.0 \
                    and self.shared_expert is None and _plain_router(self.gate, biased=True):
                held = _code_experts(self.experts)
            self._held = (key, held)
        return self._held[1]


class SelectBias(nn.Module):
    """A router's per-expert selection bias (its GGUF name: exp_probs_b.bias), held fp32 in every dtype: choices
    between near scores must not round (transformers and llama.cpp keep it fp32 too)."""

    def __init__(self, experts: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(experts), requires_grad=False)


def keeps_fp32(name: str, args: ModelArgs) -> bool:
    """Whether the weight `name` stays fp32 whatever the model's dtype: a router's selection bias, gpt-oss's attention
    sinks, and the router of a model that has one (transformers keeps both fp32 for ERNIE 4.5 and GLM-4.5: choices between near scores)."""
    return name.endswith((".mlp.select.bias", ".self_attn.sinks")) or \
        (args.expert_select_bias and name.endswith(".mlp.gate.weight"))


def _plain_router(gate: nn.Module, biased: bool = False) -> bool:
    """A router the library reads: fp32 weights on the CPU (GGUF files keep it F32), no bias (`biased`: an fp32 one
    allowed, gpt-oss's)."""
    bias_ok = gate.bias is None or (biased and gate.bias.dtype == torch.float32)
    return type(gate) is Linear and bias_ok and gate.weight.dtype == torch.float32 and gate.weight.device.type == "cpu"


def _code_experts(experts: nn.ModuleList) -> "CodeExperts | None":
    """Every expert's fused gate|up and down in the codes layout (one symmetric layout of groups of 32 for all, the
    library's qgemm), their biases stacked, for parley_moe_codes; None where they are held otherwise."""
    from kernels.cpu_moe import CodeExperts

    first = experts[0]
    if not first.native or not (first.act_kernel or first.glu is not None):
        return None
    mats = [(e.gate_up_proj, e.down_proj) for e in experts]
    if not all(isinstance(m, QuantLinear) and m.qweight.format == "blocks" for pair in mats for m in pair):
        return None
    held = [(_expert_rows(g.qweight), _expert_rows(d.qweight)) for g, d in mats]
    lay = held[0][0][2]
    if lay.raw or lay.units or lay.tiles or lay.bits == 5 or lay.zero < 0 or lay.group != 32 \
            or any(m[2] != lay for pair in held for m in pair):
        return None
    biases = _stacked_biases(experts)
    if biases is None:
        return None
    from engine.quant.weight import FP4_LUT

    glu = first.glu
    return CodeExperts.of([g[:2] for g, _ in held], [d[:2] for _, d in held],
                          *(b.float() if b is not None else None for b in biases), lay.bits, lay.zero,
                          FP4_LUT if lay.lut else None, "clamped" if glu is not None else first.act_kernel,
                          *((glu.alpha, glu.limit) if glu is not None else ()))


def _expert_rows(q: QuantTensor) -> tuple[torch.Tensor, torch.Tensor, "CodeLayout"]:
    """(codes, scales, layout) of an expert's matrix as parley_moe_codes reads them: byte codes in the AMX tiles'
    groups (kernels/cpu/amxgemm.c) back in rows where K is not whole units of 128 (the rows they were loaded as)."""
    from engine.quant.block_codes import CodeLayout

    lay = q.code_layout
    if lay.tiles and lay.bits == 8 and q.shape[1] % 128:
        return q.natural_codes()[0], q.natural_scales(), CodeLayout(8, 32, 128)
    return getattr(q, "codes", None), getattr(q, "scales", None), lay


def _stacked_biases(experts: nn.ModuleList) -> list[torch.Tensor | None] | None:
    """The experts' gate|up and down biases, each stacked (experts, rows), or None for a projection without; None
    where only some experts have them."""
    out = []
    for proj in ("gate_up_proj", "down_proj"):
        held = [getattr(e, proj).bias for e in experts]
        if any((b is None) != (held[0] is None) for b in held):
            return None
        out.append(None if held[0] is None else torch.stack(held))
    return out


def _expert_blocks(experts: nn.ModuleList, shared: GatedMLP | None, shared_gate: Linear | None) -> "ExpertBlocks | None":
    """Every expert's fused gate|up and down super-blocks (one type each across the layer, as a GGUF file stacks
    them), the activation and the shared expert if any, or None where they are held otherwise."""
    from kernels.cpu_moe import ExpertBlocks, SharedExpert

    parts = [_library_blocks(e) for e in [*experts, *([shared] if shared is not None else [])]]
    if any(p is None for p in parts) or not experts[0].act_kernel:
        return None
    routed = parts[:len(experts)]
    kinds = [{p[i] for p in routed} for i in (1, 3)]
    if any(len(k) != 1 for k in kinds):
        return None  # types differ across the layer's experts: module by module
    held = None
    if shared is not None:
        gu, gu_type, dn, dn_type = parts[-1]
        held = SharedExpert(gu, gu_type, dn, dn_type,
                            shared_gate.weight.reshape(-1).contiguous() if shared_gate is not None else None)
    return ExpertBlocks.of([p[0] for p in routed], kinds[0].pop(), [p[2] for p in routed], kinds[1].pop(),
                           experts[0].act_kernel, held)


def _library_blocks(mlp: GatedMLP) -> tuple[torch.Tensor, str, torch.Tensor, str] | None:
    """(gate|up blocks, type, down blocks, type) of a gated MLP held in the CPU library's super-blocks, or None."""
    if not (mlp.native and mlp.act_kernel) or not all(
            isinstance(m, QuantLinear) and m.bias is None for m in (mlp.gate_up_proj, mlp.down_proj)):
        return None
    from kernels.cpu_kgemm import KINDS

    gu, dn = mlp.gate_up_proj.qweight, mlp.down_proj.qweight
    if any(q.format != "blocks" or q.code_layout.raw not in KINDS or q.code_layout.tiles for q in (gu, dn)):
        return None  # not super-blocks in rows: module by module
    return gu.blocks, gu.code_layout.raw, dn.blocks, dn.code_layout.raw


@dataclass(frozen=True, slots=True)
class StackedExperts:
    """Every expert's fused gate|up and down buffers stacked along a first axis (kernels/moe.py's formats), the experts'
    own modules left holding views of them (no second copy)."""

    gate_up_format: str
    gate_up: dict[str, torch.Tensor]
    down_format: str
    down: dict[str, torch.Tensor]
    act: str | None
    glu: ClampedGLU | None = None  # gpt-oss's activation (in place of `act`)
    gate_up_bias: torch.Tensor | None = None  # (experts, 2I): gpt-oss's biases, stacked
    down_bias: torch.Tensor | None = None  # (experts, H)

    @staticmethod
    def stack(experts: nn.ModuleList) -> "StackedExperts | None":
        first = experts[0]
        if not (first.act_kernel or first.glu is not None) or first.gate_up_proj is None:
            return None
        biases = _stacked_biases(experts)
        if biases is None:
            return None
        gate_up = _stack([e.gate_up_proj for e in experts])
        down = _stack([e.down_proj for e in experts]) if gate_up is not None else None
        if down is None:
            return None
        return StackedExperts(gate_up[0], gate_up[1], down[0], down[1], first.act_kernel, first.glu, *biases)


BUFFERS = {"int4": ("words", "pairs"), "fp4": ("words", "pairs"), "int8": ("codes", "scale"), "bf16": ("weight",)}


def _stack(linears: list[nn.Module]) -> tuple[str, dict[str, torch.Tensor]] | None:
    """(format, buffers stacked) of same-shaped, same-format matrices (their biases are the caller's), each module then
    holding a view of its slice; None where they differ or a format has no stacked kernel."""
    if all(type(m) is Linear for m in linears):
        fmt, owners = "bf16", linears
    elif all(isinstance(m, QuantLinear) and isinstance(m.qweight, QuantTensor) for m in linears):
        fmt, owners = linears[0].qweight.format, [m.qweight for m in linears]
        if fmt not in BUFFERS or any(q.format != fmt for q in owners):
            return None
    else:
        return None
    stacked = {}
    for name in BUFFERS[fmt]:
        parts = [getattr(o, name) for o in owners]
        if any(p.shape != parts[0].shape or p.dtype != parts[0].dtype for p in parts):
            return None
    for name in BUFFERS[fmt]:
        parts = [getattr(o, name) for o in owners]
        out = torch.empty((len(parts), *parts[0].shape), dtype=parts[0].dtype, device=parts[0].device)
        for i, (owner, part) in enumerate(zip(owners, parts)):
            out[i].copy_(part)
            if isinstance(owner, Linear):  # the module keeps a view: the old tensor goes
                owner.weight = nn.Parameter(out[i], requires_grad=False)
            else:
                owner._buffers[name] = out[i]
        stacked[name] = out
    return fmt, stacked


def _whole(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An expert's output, its split-K partials (a CUDA decode GEMM's, S × T × N) summed when it returned those."""
    if y.dim() == 3:
        from kernels.norms import sum_partials

        return sum_partials(y, dtype)
    return y


def feed_forward(args: ModelArgs, layer_id: int) -> nn.Module:
    """Layer `layer_id`'s MLP: the experts where the model routes, else the dense one."""
    return SparseMoE(args) if args.sparse_layer(layer_id) else mlp(args)
