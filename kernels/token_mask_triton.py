"""A step's grammar masks applied to its logits in one launch: each program reads BLOCK bits of one guided row's
words and writes -inf over the refused tokens. torch's unpacking took a (rows, 32 * words) int32 temporary, a bool
copy and two launches a row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, wait_for_previous

BLOCK = 4096  # tokens a program: 64 programs a row of a 262k vocabulary


@triton.jit
def _refuse_tokens(X, stride_x, Rows, Words, stride_w, V, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_previous(PDL)
    j = tl.program_id(0)
    row = tl.load(Rows + j)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < V
    word = tl.load(Words + j * stride_w + offs // 32, mask=inside, other=-1)
    refused = ((word >> (offs % 32)) & 1) == 0
    tl.store(X + row * stride_x + offs, tl.full([BLOCK], float("-inf"), X.dtype.element_ty), mask=inside & refused)


def refuse_tokens_triton(logits: torch.Tensor, rows: torch.Tensor, words: torch.Tensor, block: int = BLOCK) -> None:
    vocab = logits.shape[-1]
    assert logits.stride(-1) == 1 and words.is_contiguous() and words.shape[1] * 32 >= vocab
    if len(rows) == 0:
        return
    grid = (len(rows), triton.cdiv(vocab, block))
    with torch.inference_mode():  # the runner's logits are inference tensors
        _refuse_tokens[grid](logits, logits.stride(0), rows, words, words.stride(0), vocab, BLOCK=block,
                             num_warps=4, **launch_options(logits))
