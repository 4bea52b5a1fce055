"""GGUF tensors -> the HF-named state dict of the matching architecture module."""
from __future__ import annotations

import re
from types import ModuleType

import torch

from engine.errors import ModelLoadError
from engine.loading.gguf_file import GGUFFile
from engine.models.args import GLOBAL, ModelArgs

TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def tensor_shapes(gf: GGUFFile) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(d) for d in reversed(t.shape)) for t in gf.reader.tensors}


def hf_name(name: str, arch: ModuleType) -> str | None:
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    m = BLOCK.fullmatch(name)
    if m and m.group(2) in arch.GGUF_BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{arch.GGUF_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def read_gguf_weights(gf: GGUFFile, arch: ModuleType, args: ModelArgs, progress=None) -> dict[str, torch.Tensor]:
    """Dequantizes every tensor to fp32 under its HF name; rope_freqs becomes the rope factors."""
    total = len(gf.reader.tensors)
    weights: dict[str, torch.Tensor] = {}
    for i, (name, tensor) in enumerate(gf.tensors()):
        if name == "rope_freqs.weight":
            args.rope[GLOBAL].factors = [float(x) for x in tensor.flatten()]
        else:
            target = hf_name(name, arch)
            if target is None:
                raise ModelLoadError(f"{gf.path.name}: unexpected tensor {name} for architecture {arch.ARCH}.")
            weights[target] = arch.gguf_fix(name, tensor, args)
        if progress:
            progress("Decoding weights", (i + 1) / total)
    return weights
