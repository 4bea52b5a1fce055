"""A GGUF file's tensors against the model its metadata describes, from the header alone: a file whose metadata lies
(token_embd wider than embedding_length, q rows that are not heads x head_dim) is refused before a weight is read, where
build_model found it only once every weight was decoded (2-16 s and ~0.7 GB on Gemma 3 270M)."""
from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import torch

from engine.errors import ModelLoadError
from engine.loading.gguf_file import GGUFFile, GGUFTensor
from engine.loading.gguf_weights import misfit, planned_tensors
from engine.models.args import ModelArgs
from engine.models.layers import CausalLM


def check_tensors(gf: GGUFFile, arch: ModuleType, args: ModelArgs) -> CausalLM:
    """Raises ModelLoadError naming the first tensor the model would not take (a missing or unknown one, or one whose
    shape differs from the one its module has), as build_model would after reading them all. Returns the module it
    built on the meta device, for build_model to fill (a 48-layer mixture of 128 experts builds in ~1.7 s)."""
    with torch.device("meta"):  # the modules' shapes without their memory
        shell = arch.Model(_without_pending(args))
    expected = {key: tuple(value.shape) for key, value in shell.state_dict().items()}
    found = {target: t for parts in planned_tensors(gf, arch, args) for t, target in parts if isinstance(target, str)}
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    if missing or unexpected:
        raise ModelLoadError(mismatch_message(missing, unexpected))
    wrong = [(t, expected[key]) for key, t in found.items() if _shape(t, arch, args) != expected[key]]
    if wrong:
        t, want = wrong[0]
        more = f" (and {len(wrong) - 1:,} more tensors disagree)" if len(wrong) > 1 else ""
        raise ModelLoadError(f"{t.file_name} does not match its own metadata: tensor {t.name} has shape "
                             f"{list(t.shape)}, the metadata's sizes need {list(reversed(want))}{more}.")
    return shell


def _without_pending(args: ModelArgs) -> ModelArgs:
    """`args` without the rope factors still to be read from the file (an empty list until then: rope_freqs), which no
    shape depends on."""
    rope = {kind: replace(r, factors=None) if r.factors == [] else r for kind, r in args.rope.items()}
    return replace(args, rope=rope)


def _shape(t: GGUFTensor, arch: ModuleType, args: ModelArgs) -> tuple[int, ...]:
    """The shape `t` takes in the model: the file's dims (innermost first) reversed, then through the architecture's
    gguf_fix (a vector made a row: Qwen2-MoE's shared expert gate), on a tensor without data."""
    shape = tuple(int(d) for d in reversed(t.shape))
    try:
        return tuple(arch.gguf_fix(t.name, torch.empty(shape, device="meta"), args).shape)
    except RuntimeError as exc:  # e.g. q rows that do not split into the metadata's head count
        raise misfit(t, str(exc).splitlines()[0]) from None


def mismatch_message(missing: list[str], unexpected: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing tensors: {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}")
    if unexpected:
        parts.append(f"unexpected tensors: {', '.join(unexpected[:4])}{' …' if len(unexpected) > 4 else ''}")
    return "The weights do not match the architecture (" + "; ".join(parts) + ")."
