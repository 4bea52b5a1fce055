"""`argmax_rows(logits)` — greedy ids of a step — with the same implementation switch as the other ops:
`impl="triton"` is the one-launch kernel of kernels/argmax_triton.py, `impl="reference"` torch.argmax."""

from __future__ import annotations

import torch

from kernels.attention import IMPLS


def argmax_rows(logits: torch.Tensor, scratch=None, *, impl: str = "triton",
                out: torch.Tensor | None = None, step=None) -> torch.Tensor:
    """logits (R, V) -> (R,) int64, the first index of each row's maximum (into `out` when given). `scratch`:
    a reusable kernels.argmax_triton.ArgmaxScratch of at least R rows (made per call when None). `step`: a
    kernels.step_advance.StepAdvance, Triton only — the ids also go to the host and the step table moves on."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference" or (impl == "auto" and not logits.is_cuda):
        assert step is None, "the step advance is part of the Triton kernel"
        ids = _cpu_argmax(logits) if impl == "auto" else None
        ids = logits.argmax(dim=-1) if ids is None else ids
        return ids if out is None else out.copy_(ids)
    from kernels.argmax_triton import ArgmaxScratch, argmax_rows_triton

    return argmax_rows_triton(logits, scratch or ArgmaxScratch(logits.shape[0], logits.device), out=out, step=step)


def _cpu_argmax(logits: torch.Tensor) -> torch.Tensor | None:
    """The CPU library's argmax (kernels/cpu/argmax.c, 8 lanes: torch's is scalar) for fp32 rows; None where it
    does not apply."""
    from kernels.cpu_native import cpu_kernel

    kernel = cpu_kernel() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
    if kernel is None or logits.dim() != 2 or logits.shape[1] == 0:
        return None
    logits = logits.contiguous()
    ids = torch.empty(logits.shape[0], dtype=torch.int64)
    kernel.lib.parley_argmax_rows(logits.data_ptr(), logits.shape[0], logits.shape[1], ids.data_ptr(),
                                  torch.get_num_threads())
    return ids
