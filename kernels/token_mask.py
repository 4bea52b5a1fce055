"""`refuse_tokens(logits, rows, words)`: a grammar's bit masks applied in place, with the same implementation switch
as the other ops: `impl="triton"` one launch for all rows (kernels/token_mask_triton.py), `impl="reference"` torch."""

from __future__ import annotations

import torch

from kernels.attention import IMPLS

BITS = 32  # llguidance's masks: one bit per token id, in 32-bit words, bit b of word w is token 32 w + b


def refuse_tokens(logits: torch.Tensor, rows: torch.Tensor, words: torch.Tensor, *, impl: str = "auto") -> None:
    """Sets logits[rows[j], v] to -inf wherever bit v of words[j] is 0. logits (R, V) float; rows (M,) int64;
    words (M, ceil(V / 32)) int32, all on the logits' device."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton" or (impl == "auto" and logits.is_cuda):
        from kernels.token_mask_triton import refuse_tokens_triton

        refuse_tokens_triton(logits, rows, words)
        return
    refused = unpack_refused(words, logits.shape[-1])
    with torch.inference_mode():  # the runner's logits are inference tensors: written only in that mode
        for j, r in enumerate(rows.tolist()):  # in place, a row at a time: a masked copy of (R, V) cost 3x as much
            logits[r].masked_fill_(refused[j], float("-inf"))


def unpack_refused(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """(M, W) int32 words -> (M, vocab) bools, True where the token is refused (its bit is 0)."""
    if words.device.type == "cpu":  # numpy's unpackbits: 0.03 ms a 262k row, where torch's shifts took 0.5
        import numpy as np

        bits = np.unpackbits(words.numpy().view(np.uint8), axis=1, count=vocab, bitorder="little")
        return torch.from_numpy(bits == 0)
    shifts = torch.arange(BITS, dtype=torch.int32, device=words.device)
    return ((words[:, :, None] >> shifts) & 1).view(len(words), -1)[:, :vocab] == 0
