"""GGUF tensors -> the HF-named state dict of the matching architecture module."""
from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading.gguf_file import GGUFFile, GGUFTensor
from engine.models.args import GLOBAL, ModelArgs, RopeArgs
from engine.quant.from_gguf import is_native, quantized_matrix, row_order
from engine.quant.weight import QuantTensor

TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output_norm.bias": "model.norm.bias",  # a LayerNorm's (StableLM)
    "output.weight": "lm_head.weight",
}
BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# a mixture of experts' (experts, rows, cols) tensors, split into one matrix per expert (`_parts`)
EXPERTS = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.(weight|bias)")  # biases: (experts, rows) (gpt-oss)
EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.(\d+)\.(weight|bias)")


def tensor_shapes(gf: GGUFFile) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(d) for d in reversed(t.shape)) for t in gf.tensors}


def hf_name(name: str, arch: ModuleType) -> str | None:
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    if m := EXPERT.fullmatch(name):
        return f"model.layers.{m.group(1)}.mlp.experts.{m.group(3)}.{m.group(2)}_proj.{m.group(4)}"
    m = BLOCK.fullmatch(name)
    params = getattr(arch, "GGUF_BLOCK_PARAMS", {})  # tensors that are a module's parameter itself (gpt-oss's sinks)
    if m and m.group(3) == "weight" and m.group(2) in params:
        return f"model.layers.{m.group(1)}.{params[m.group(2)]}"
    if m and m.group(2) in arch.GGUF_BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{arch.GGUF_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def read_gguf_weights(gf: GGUFFile, arch: ModuleType, args: ModelArgs, progress=None, quantized: bool = False,
                      notices: list[str] | None = None, device: str = "cpu") -> dict[str, torch.Tensor | QuantTensor]:
    """Every tensor under its HF name; rope_freqs becomes the rope factors. Dequantized to fp32, or with
    `quantized` every matrix kept quantized as a QuantTensor in `device`'s layout, moved there one by one
    (vectors stay fp32 on the CPU); types outside the common quantizations add a line to `notices`."""
    total = len(gf.tensors)
    weights: dict[str, torch.Tensor | QuantTensor] = {}
    odd: dict[str, int] = {}
    for i, parts in enumerate(planned_tensors(gf, arch, args)):
        for t, target in parts:
            if isinstance(target, RopeArgs):
                target.factors = [float(x) for x in gf.tensor(t).flatten()]
            elif quantized and len(t.shape) == 2 and t.tensor_type.name != "F32":  # F32 files stay exact
                weights[target] = _matrix(gf, t, arch, args, device)
                if not is_native(t.tensor_type.name) and not kept_as_is(weights[target]):
                    odd[t.tensor_type.name] = odd.get(t.tensor_type.name, 0) + 1
            else:
                weights[target] = _fixed(gf, t, arch, args)
        if progress:
            progress("Decoding weights", (i + 1) / total)
    if notices is not None:
        notices.extend(requantized_notice(gf.path.name, q, n) for q, n in sorted(odd.items()))
    return weights


def planned_tensors(gf: GGUFFile, arch: ModuleType,
                    args: ModelArgs) -> Iterator[list[tuple[GGUFTensor, str | RopeArgs]]]:
    """Per tensor of the file, from its header alone: what the model reads of it, each as (the tensor or a part of it,
    its HF name or the rope its factors fill); none for a tensor the model skips. A name the architecture does not
    know is an error."""
    rope_target = getattr(arch, "gguf_rope_factors", _rope_freqs)
    skip = getattr(arch, "gguf_skip", None)  # tensors the model does not run (GLM-4.5's next-token prediction layer)
    for whole in gf.tensors:
        if skip is not None and skip(whole.name, args):
            yield []
        elif (rope := rope_target(whole.name, args)) is not None:
            _check_rope_factors(whole, args, rope)
            yield [(whole, rope)]
        else:
            yield [(t, _target(t, arch)) for t in _parts(gf, whole, arch, args)]


def _target(t: GGUFTensor, arch: ModuleType) -> str:
    if (target := hf_name(t.name, arch)) is None:
        raise ModelLoadError(f"{t.file_name}: unexpected tensor {t.name} for architecture {arch.ARCH}.")
    return target


def requantized_notice(source: str, type_name: str, count: int) -> str:
    return f"{source}: {count} tensor(s) of type {type_name} have no kernel of their own: re-quantized to int8."


def kept_as_is(matrix: QuantTensor) -> bool:
    """A type outside the common ones that still has a kernel of its own here (MXFP4 on the CPU's and CUDA's)."""
    return matrix.format == "fp4" or (matrix.format == "blocks" and matrix.code_layout.lut)


def _rope_freqs(name: str, args: ModelArgs) -> RopeArgs | None:
    # llama3 rope scaling: the per-frequency divisors of the global layers' rope
    return args.rope[GLOBAL] if name == "rope_freqs.weight" else None


def _check_rope_factors(t: GGUFTensor, args: ModelArgs, rope: RopeArgs) -> None:
    if tuple(t.shape) != (rope.pairs(args.head_dim),):  # one factor per rotary frequency, else wrong rope silently
        raise ModelLoadError(f"{t.file_name}: {t.name} has shape {list(t.shape)}, expected "
                             f"[{rope.pairs(args.head_dim)}].")


def _parts(gf: GGUFFile, t, arch: ModuleType, args: ModelArgs) -> list:
    """`t`, or the row ranges a fused tensor holds (Phi-3's q/k/v, gate/up) as tensors of their own, or a stacked
    experts tensor's matrices."""
    split = getattr(arch, "gguf_split", None)
    if m := EXPERTS.fullmatch(t.name):
        if len(t.shape) != (3 if m.group(3) == "weight" else 2) or int(t.shape[-1]) != args.num_experts:
            raise ModelLoadError(f"{t.file_name}: tensor {t.name} of shape {list(t.shape)} does not hold the "
                                 f"model's {args.num_experts} experts.")
        return [t.expert(f"blk.{m.group(1)}.ffn_{m.group(2)}_exps.{e}.{m.group(3)}", e)
                for e in range(args.num_experts)]
    try:
        ranges = split(t.name, tuple(int(d) for d in reversed(t.shape)), args) if split else None
        return [t] if ranges is None else [t.rows(name, start, stop) for name, start, stop in ranges]
    except (ValueError, ModelLoadError) as exc:
        raise misfit(t, str(exc)) from None


def _fixed(gf: GGUFFile, t, arch: ModuleType, args: ModelArgs) -> torch.Tensor:
    try:
        return arch.gguf_fix(t.name, gf.tensor(t), args)
    except RuntimeError as exc:  # e.g. Q rows that do not split into the metadata's head count
        raise misfit(t, str(exc).splitlines()[0]) from None


def misfit(t: GGUFTensor, detail: str) -> ModelLoadError:
    """A tensor that the model's metadata cannot place, `detail` saying why."""
    return ModelLoadError(f"{t.file_name}: tensor {t.name} of shape {list(t.shape)} does not fit the model's "
                          f"metadata ({detail}).")


def _expert(name: str) -> bool:
    """A mixture's routed or shared expert's matrix: the one-call expert kernels read its super-blocks in rows."""
    return bool(EXPERT.fullmatch(name)) or "_shexp." in name


def _matrix(gf: GGUFFile, t, arch: ModuleType, args: ModelArgs, device: str) -> QuantTensor:
    try:
        matrix = quantized_matrix(t, row_order(arch.gguf_fix, t.name, int(t.shape[1]), args), device,
                                  tiles=not _expert(t.name))
        return matrix if device == "cpu" else matrix.to(device)
    except NotImplementedError as exc:
        raise UnsupportedModelError(f"{t.file_name}: tensor {t.name} uses quantization type {t.tensor_type.name}, "
                                    "which Parley cannot read yet.") from exc
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"{t.file_name}: tensor {t.name} could not be decoded: {exc}") from exc
