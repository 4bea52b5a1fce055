"""DFlash drafting: a block of tokens per sequence from one pass of a small network over the target's own hidden
states (engine/speculative/dflash_net.py), verified by the target like any draft (engine/speculative/verify.py).

The target computes its tap layers' outputs for every row of every step (CausalLM.tap_layers, set by the batcher
around its forwards). After each step `record` keeps the tap rows each sequence now has cached (a verify step's
rejected rows are not); when sequences draft, their new rows become the draft layers' context keys and values in one
pass, and their blocks are drafted in one more: the drafter's own cache, one context per cache slot. The
target's cache tells it of every copy, cut and removal (KVCache.observers), so a context follows its slot through
rewound turns, rejected drafts, forks and prefixes parked and copied into new chats. Drafting is greedy and
deterministic, so the target keeps its own tokens exactly. A slot whose positions the drafter never saw (a step that
failed) drafts nothing until it is rewound below them or removed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.sequence import Sequence
from engine.speculative.dflash_net import DFlashNet
from engine.speculative.drafter import Paced, Pacing, PacingConfig


MAX_PENDING = 256  # tap rows a context keeps unprojected at most


@dataclass(slots=True)
class _Context:
    """One sequence's draft-layer keys and values for its first `projected` positions (storage grows by doubling),
    then the target's tap rows of the positions after, kept until the sequence drafts: a sequence that does not
    draft (pacing, or too many sequences decoding) costs a copy of its rows, not the draft layers' projections."""

    keys: list[torch.Tensor] = field(default_factory=list)  # per draft layer (capacity, kv_heads, head_dim)
    values: list[torch.Tensor] = field(default_factory=list)
    projected: int = 0
    pending: list[torch.Tensor] = field(default_factory=list)  # tap rows (n, len(taps) * hidden), in order

    @property
    def length(self) -> int:
        """The positions the context covers."""
        return self.projected + sum(len(rows) for rows in self.pending)

    def cut(self, length: int) -> None:
        if length <= self.projected:
            self.projected, self.pending = length, []
            return
        keep, pending = length - self.projected, []
        for rows in self.pending:
            if keep <= 0:
                break
            pending.append(rows[:keep])
            keep -= len(rows)
        self.pending = pending

    def copy(self) -> "_Context":
        n = self.projected  # pending rows are never written in place: shared
        return _Context([k[:n].clone() for k in self.keys], [v[:n].clone() for v in self.values], n, list(self.pending))

    def take_pending(self) -> torch.Tensor | None:
        """The pending tap rows, joined (they belong at positions `projected` on), and none pending any more."""
        rows, self.pending = self.pending, []
        return None if not rows else rows[0] if len(rows) == 1 else torch.cat(rows)

    def append(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keys and values (per layer) of the next positions after `projected`."""
        n = kv[0][0].shape[0]
        need = self.projected + n
        if not self.keys or self.keys[0].shape[0] < need:
            cap = max(64, need, 2 * (self.keys[0].shape[0] if self.keys else 0))
            self.keys = [_grown(old, k, cap, self.projected) for old, (k, _) in zip(self.keys or [None] * len(kv), kv)]
            self.values = [_grown(old, v, cap, self.projected)
                           for old, (_, v) in zip(self.values or [None] * len(kv), kv)]
        for store, (k, _) in zip(self.keys, kv):
            store[self.projected : need] = k
        for store, (_, v) in zip(self.values, kv):
            store[self.projected : need] = v
        self.projected = need

    def view(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k[: self.projected], v[: self.projected]) for k, v in zip(self.keys, self.values)]


def _grown(old: torch.Tensor | None, like: torch.Tensor, rows: int, keep: int) -> torch.Tensor:
    new = like.new_empty((rows, *like.shape[1:]))
    if old is not None and keep:
        new[:keep] = old[:keep]
    return new


class DFlashDrafter(Paced):
    name = "dflash"

    def __init__(self, net: DFlashNet, target, cache, pacing: PacingConfig | None = None):
        """`target`: the verifying CausalLM, whose embedding, head and tap layers the drafter uses (the batcher turns
        the taps on around its steps: `tap_layers`); `cache`: its KV cache, which the drafter's contexts follow."""
        self.net, self.target = net, target
        config = net.config
        if config.hidden != target.args.hidden_size or config.vocab != target.args.vocab_size:
            raise ValueError(f"this DFlash drafter was trained for hidden size {config.hidden} and vocabulary "
                             f"{config.vocab}; the model has {target.args.hidden_size} and {target.args.vocab_size}")
        if max(config.taps) >= len(target.model.layers):
            raise ValueError(f"this DFlash drafter taps layer {max(config.taps)}; the model has "
                             f"{len(target.model.layers)} layers")
        self.tap_layers = config.taps
        self.pacing = pacing or PacingConfig(most=config.block - 1)
        self.max_sequences = self.pacing.most_sequences
        self.contexts: dict[int, _Context] = {}  # cache slot -> its draft context
        self.head = _draft_head(net, target)
        cache.observers.append(self)

    # -- the cache's slots
    def on_clone(self, src: int, dst: int) -> None:
        if src in self.contexts:
            self.contexts[dst] = self.contexts[src].copy()

    def on_cut(self, slot: int, length: int) -> None:
        if length == 0:
            self.contexts.pop(slot, None)
        elif slot in self.contexts:
            self.contexts[slot].cut(length)

    # -- the target's rows
    @torch.inference_mode()
    def record(self, scheduled: list[tuple[Sequence, int]], starts: list[int], row_starts: list[int],
               kept: list[int] | None = None) -> None:
        """After a step: sequence i wrote rows row_starts[i] .. + n at positions starts[i] ..; `kept` (verify steps)
        how many of those rows it keeps (the rest were rewound). The kept tap rows are copied out in one gather
        (the next step writes over the model's tap buffers) and wait in each context until it drafts."""
        if self.target.last_taps is None:
            return
        rows, spans = [], []
        for i, (seq, n) in enumerate(scheduled):
            keep = n if kept is None else kept[i]
            context = self.contexts.setdefault(seq.slot, _Context())
            start = starts[i]
            if start > context.length:  # positions the drafter never saw (a failed step): none until cut below
                continue
            context.cut(start)
            if keep:
                spans.append((context, len(rows), keep))
                rows += range(row_starts[i], row_starts[i] + keep)
        if not spans:
            return
        taps = torch.cat(self.target.last_taps, dim=-1)  # (T, len(taps) * hidden), in the drafter's tap order
        kept_rows = taps.index_select(0, torch.tensor(rows).to(taps.device, non_blocking=True))
        for context, first, keep in spans:
            context.pending.append(kept_rows[first : first + keep])
        # tap rows take about twice the memory of their keys and values: a long run without drafting is projected
        self._project([c for c, *_ in spans if c.length - c.projected >= MAX_PENDING])

    def _project(self, contexts: list[_Context]) -> None:
        """Every pending row of `contexts` through the draft layers' context projections, in one pass."""
        rows, positions, spans = [], [], []
        for context in contexts:
            pending = context.take_pending()
            if pending is not None:
                spans.append((context, sum(len(r) for r in rows), len(pending)))
                positions += range(context.projected, context.projected + len(pending))
                rows.append(pending)
        if not rows:
            return
        device = self.net.mask.device
        kv = self.net.context_kv(self.net.features(torch.cat(rows) if len(rows) > 1 else rows[0]),
                                 torch.tensor(positions).to(device, non_blocking=True))
        for context, first, n in spans:
            context.append([(k[first : first + n], v[first : first + n]) for k, v in kv])

    # -- drafting
    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], room: list[int]) -> None:
        """Drafts for every sequence due one: their contexts brought up to date and their blocks drafted, each in one
        pass of the draft layers; their ids read at once."""
        block, due = self.net.config.block, []
        for seq, most in zip(seqs, room):
            pacing = self._pacing(seq)
            k = min(pacing.length, most, block - 1)
            position = len(seq.token_ids) - 1  # the anchor: the newest token, not yet cached
            context = self.contexts.get(seq.slot)
            if k <= 0 or not pacing.due(seq.num_steps) or context is None or context.length != position or position < 1:
                continue
            due.append((seq, k, position, context))
        if not due:
            return
        self._project([c for *_, c in due])
        drafts = self._blocks([seq.token_ids[-1] for seq, *_ in due], [p for *_, p, _ in due],
                              [c.view() for *_, c in due])
        for (seq, k, _, _), ids in zip(due, drafts):
            seq.draft = ids[:k]

    def _blocks(self, anchors: list[int], positions: list[int],
                contexts: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> list[list[int]]:
        """block - 1 greedy drafts after each anchor (at its position, over its context)."""
        net, target, block = self.net, self.target, self.net.config.block
        device = net.mask.device
        h, _ = target.embed(torch.tensor(anchors, device=device))
        rows = torch.cat([net.block_rows(e.to(net.mask.dtype), block) for e in h])
        at = (torch.tensor(positions)[:, None] + torch.arange(block)).reshape(-1).to(device)
        out = net.forward_blocks(rows, at, contexts).view(len(anchors), block, -1)[:, 1:].reshape(-1, net.config.hidden)
        if self.head is None:
            ids = target.head_logits(out.to(h.dtype)).argmax(-1)  # the head takes the model's own rows
        else:
            ids = net.token_ids(self.head(out.float()).argmax(-1))  # the final softcap keeps the argmax: skipped
        return ids.view(len(anchors), block - 1).tolist()

    def _pacing(self, seq: Sequence) -> Pacing:
        if not isinstance(seq.draft_state, _Paced):
            seq.draft_state = _Paced(Pacing(self.pacing))
        return seq.draft_state.pacing


def _draft_head(net: DFlashNet, target) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """Logits over the drafter's own vocabulary (`vocab_ids`), from the target's head rows of those tokens: int8 on the
    CPU (read like the target's own weights), float elsewhere; None: the drafter drafts from the whole head."""
    if not net.config.draft_vocab:
        return None
    rows = target.head_rows(net.vocab_ids.cpu())
    if net.vocab_ids.device.type == "cpu":
        from engine.quant.from_float import quantize_matrix

        matrix = quantize_matrix(rows, "q8")
        return lambda x: matrix(x, torch.float32)
    rows = rows.to(net.vocab_ids.device)
    return lambda x: x @ rows.T


@dataclass(slots=True)
class _Paced:
    pacing: Pacing  # Paced reads `seq.draft_state.pacing`
