"""Prompt log-probabilities (vLLM's `prompt_logprobs`; lm-evaluation-harness scores a continuation with them).

Prompt token i's log-probability given the tokens before it comes from the final-normed hidden row of position i - 1,
computed by the prefill step that runs that position anyway: the model keeps its last layer's normed rows for the step
(`CausalLM.tap_layers`), and the LM head runs on the asked rows a chunk at a time, each chunk's log-softmax read for the
token and its top-k and dropped (a 500-token prompt's logits at 262,144 tokens a row are 524 MB in fp32). Steps where no
sequence asks tap nothing and pay nothing.

A sequence that asks starts from an empty cache: a cached prefix (its own or another slot's) holds keys and values but
no hidden rows, so its positions' numbers would be missing (engine/runtime.py `reuse_prefix`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.logprobs import TokenLogprob, row_logprobs
from engine.sequence import Sequence
from engine.step import StepBatch

CHUNK_ELEMENTS = 1 << 24  # logits of one chunk: rows × vocabulary at most this (64 MB of fp32), at least one row


@dataclass(frozen=True, slots=True)
class PromptRows:
    """One sequence's rows of a step whose next prompt token it wants scored."""

    seq: Sequence
    first: int  # the position of the first row: its entry is seq.prompt_logprobs[first]
    rows: list[int]  # rows of the step's token axis
    targets: list[int]  # the prompt token each row predicts


def prompt_rows(batch: StepBatch) -> list[PromptRows]:
    """The rows of `batch` that predict a prompt token of a sequence whose params ask for prompt log-probabilities
    (a prefill chunk's rows, bar the prompt's last, which predicts the answer's first token)."""
    wanted = []
    for (seq, n), seg in zip(batch.scheduled, batch.segments):
        if seq.sampler.params.prompt_logprobs is None or seq.draft:
            continue
        first, end = seq.num_cached, min(seq.num_cached + n, seq.num_prompt - 1)  # positions first .. end - 1
        if end > first:
            wanted.append(PromptRows(seq, first, list(range(seg.q_start, seg.q_start + end - first)),
                                     seq.token_ids[first + 1 : end + 1]))
    return wanted


def score_prompts(model, hidden: torch.Tensor, wanted: list[PromptRows]) -> None:
    """Each sequence's entries for its `wanted` rows of `hidden` (T, hidden), the step's final-normed rows, stored in
    its `prompt_logprobs` from the chunk's first position on (a step run again replaces what it wrote)."""
    per_chunk = max(1, CHUNK_ELEMENTS // model.args.vocab_size)
    for want in wanted:
        top = want.seq.sampler.params.prompt_logprobs
        found: list[TokenLogprob] = []
        for at in range(0, len(want.rows), per_chunk):
            rows = torch.tensor(want.rows[at : at + per_chunk], device=hidden.device)
            logits = model.head_logits(hidden.index_select(0, rows))  # (C, V) fp32, dropped after this chunk
            targets = want.targets[at : at + per_chunk]
            found += row_logprobs(logits, list(range(len(targets))), targets, [top] * len(targets))
        del want.seq.prompt_logprobs[want.first :]
        want.seq.prompt_logprobs += found
