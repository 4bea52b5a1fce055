"""A model's tensors against the model its metadata describes, from the headers alone: a GGUF file whose metadata
lies (token_embd wider than embedding_length, q rows that are not heads x head_dim), or a Hugging Face folder whose
config.json disagrees with its shards, is refused before a weight is read, where build_model found it only once every
weight was decoded or read (2-16 s and ~0.7 GB on Gemma 3 270M)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType

import torch

from engine.errors import ModelLoadError, ParleyError
from engine.loading import hf_folder
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


def check_folder(folder: Path, arch: ModuleType, args: ModelArgs) -> CausalLM | None:
    """check_tensors for a Hugging Face folder: its shards' headers, through the architecture's sanitize on tensors
    without data, against the module config.json builds (that module is returned for build_model to fill). An
    architecture whose sanitize needs the values is left to build_model (None)."""
    with torch.device("meta"):
        shell = arch.Model(args)
    expected = {key: tuple(value.shape) for key, value in shell.state_dict().items()}
    files, headers = {}, {}
    for f in hf_folder.safetensor_files(folder):
        for name, info in hf_folder.file_header(f).items():
            files[name], headers[name] = f.name, info
    try:
        found = arch.sanitize({name: _meta_tensor(info) for name, info in headers.items()}, args)
    except ParleyError:
        raise
    except Exception:  # noqa: BLE001 - a sanitize that reads values: the load finds any mismatch as before
        return None
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    if missing or unexpected:
        raise ModelLoadError(f"{folder.name}'s config.json does not match its weights "
                             f"({_listed(missing, unexpected)}).")
    shapes = {key: tuple(value.shape) for key, value in found.items() if hasattr(value, "shape")}
    wrong = [(key, shapes[key], want) for key, want in expected.items() if shapes.get(key, want) != want]
    if wrong:
        key, shape, want = wrong[0]
        more = f" (and {len(wrong) - 1:,} more tensors disagree)" if len(wrong) > 1 else ""
        raise ModelLoadError(f"{folder.name}'s config.json does not match its weights: tensor {key}"
                             f"{' in ' + files[key] if key in files else ''} has shape {list(shape)}, config.json's "
                             f"sizes need {list(want)}{more}.")
    return shell


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}


def _meta_tensor(info: dict) -> torch.Tensor:
    """A header's tensor without its data (an odd dtype as fp32: the shape is what is checked)."""
    shape = tuple(int(d) for d in info["shape"])
    return torch.empty(shape, dtype=SAFETENSORS_DTYPES.get(info.get("dtype"), torch.float32), device="meta")


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
    return f"The weights do not match the architecture ({_listed(missing, unexpected)})."


def _listed(missing: list[str], unexpected: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing tensors: {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}")
    if unexpected:
        parts.append(f"unexpected tensors: {', '.join(unexpected[:4])}{' …' if len(unexpected) > 4 else ''}")
    return "; ".join(parts)
