"""Draft model: a smaller model with the same vocabulary drafts k greedy tokens per sequence, batched over every
sequence about to decode, on its own runtime (its own cache slots, the same engine thread).

Each target sequence has a shadow sequence in the draft runtime. Before drafting, the shadow keeps the longest prefix
of the target's tokens it has cached (rejected drafts are rewound away), then runs the rest and k greedy tokens. The
drafts are deterministic, so verification (engine/speculative/verify.py) keeps the target's own tokens exactly.
Shadows of finished chats keep their slots until a new shadow needs one (least recently used first).
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from engine.errors import ParleyError
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence, Status
from engine.session import common_prefix
from engine.speculative.drafter import Paced, Pacing, PacingConfig

log = logging.getLogger(__name__)

PROBE = "Parley drafts: 12,345 naïve cafés — ünïcode, code() {}\n"  # a draft model must tokenise this alike
# rows past the tokenizer's that pad an embedding: Qwen2.5 to 7B has 151,936, from 14B 152,064 (one tokenizer)
PADDING_ROWS = 128


def mismatch(draft, target) -> str | None:
    """Why `draft` (a LoadedModel) cannot draft for `target`: their tokenizers differ; None where it can. Vocabulary
    sizes may differ by padding rows; drafts past the target's are cut (DraftModel's `vocab`)."""
    a, b = draft.args.vocab_size, target.args.vocab_size
    if abs(a - b) > PADDING_ROWS or draft.tokenizer.encode(PROBE) != target.tokenizer.encode(PROBE):
        return f"their tokenizers differ ({a:,} and {b:,} tokens)"
    return None


@dataclass(slots=True)
class _State:
    shadow: Sequence
    pacing: Pacing


class DraftModel(Paced):
    name = "draft"

    def __init__(self, runtime, pacing: PacingConfig | None = None, vocab: int | None = None):
        """`runtime`: the draft model's ModelRuntime, built with keep_finished=True and no drafter of its own; `vocab`:
        the target's vocabulary size, where the draft model's is larger (padding rows the target lacks)."""
        self.runtime, self.vocab = runtime, vocab
        self.pacing = pacing or PacingConfig()
        self.max_sequences = self.pacing.most_sequences
        self._shadows: OrderedDict[int, Sequence] = OrderedDict()  # id(shadow) -> shadow, least recently used first
        self._next_id = 0

    def propose(self, seqs: list[Sequence], room: list[int]) -> None:
        batch = []
        for seq, most in zip(seqs, room):
            state = self._state(seq)
            k = min(state.pacing.length, most, self.runtime.limit - len(seq.token_ids) - 1)
            if k > 0 and state.pacing.due(seq.num_steps) and self._ready(state.shadow, seq, k, batch):
                batch.append((seq, state.shadow, k))
        if not batch:
            return
        try:
            while self.runtime.has_work():
                self.runtime.step()
        except Exception:  # noqa: BLE001 - a failing draft model costs the drafts, never the answer
            log.exception("draft model step failed")
            self.runtime.fail_in_flight()
            return
        for seq, shadow, k in batch:
            seq.draft = self._within_vocab(shadow.generated[:k])

    def _within_vocab(self, draft: list[int]) -> list[int]:
        """The draft up to its first token the target has no row for (it could not even be verified)."""
        for i, token in enumerate(draft):
            if self.vocab is not None and token >= self.vocab:
                return draft[:i]
        return list(draft)

    def _state(self, seq: Sequence) -> _State:
        state = seq.draft_state
        if not isinstance(state, _State):
            shadow = Sequence(self._next_id, [], SamplerState(SamplingParams()), frozenset(),
                              self.runtime.limit)
            shadow.status = Status.FINISHED
            self._next_id += 1
            seq.draft_state = state = _State(shadow, Pacing(self.pacing))
        return state

    def _ready(self, shadow: Sequence, seq: Sequence, k: int, batch: list) -> bool:
        """Points the shadow at the target's tokens (keeping its cached prefix) and schedules k greedy tokens; False
        when no cache slot can be had."""
        rt = self.runtime
        keep = 0
        if shadow.slot is not None:
            keep = min(common_prefix(seq.token_ids, shadow.token_ids[: shadow.num_cached]), len(seq.token_ids) - 1)
        if max(seq.token_ids[keep:]) >= rt.lm.args.vocab_size:
            return False  # a token of the target's padding rows, which the draft model lacks: it cannot run them
        if shadow.slot is not None:
            rt.keep_prefix(shadow, keep)
        else:
            waiting = sum(s.slot is None for _, s, _ in batch)  # earlier shadows of this batch not admitted yet
            while rt.free_slots() <= waiting:
                if not self._evict(busy={id(s) for _, s, _ in batch}):
                    return False
        shadow.new_turn(seq.token_ids)
        shadow.sampler = SamplerState(SamplingParams(max_tokens=k))
        self._shadows[id(shadow)] = shadow
        self._shadows.move_to_end(id(shadow))
        try:
            rt.run(shadow)
        except ParleyError:
            return False
        return True

    def _evict(self, busy: set[int]) -> bool:
        for key, shadow in self._shadows.items():
            if key not in busy and shadow.slot is not None:
                self.runtime.release(shadow)
                del self._shadows[key]
                return True
        return False
