"""load_model: a GGUF file or a Hugging Face folder -> a ready model and tokenizer on the chosen device."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from engine.errors import ModelLoadError
from engine.loading import converted, hf_folder
from engine.loading.gguf_file import open_gguf
from engine.loading.gguf_weights import read_gguf_weights, tensor_shapes
from engine.models import architecture
from engine.models.args import ModelArgs
from engine.models.layers import CausalLM
from engine.tokenizer import Tokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir

Progress = Callable[[str, float], None]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class LoadOptions:
    device: str = "cpu"
    dtype: str = "float32"
    cache_dir: Path | None = None  # converted GGUF weights are kept here; None disables the cache

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelLoadError("CUDA was requested but no CUDA device is available.")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclass(slots=True)
class LoadedModel:
    name: str
    source: Path
    args: ModelArgs
    model: CausalLM
    tokenizer: Tokenizer
    timings: dict[str, float] = field(default_factory=dict)


def load_model(source: str | Path, options: LoadOptions | None = None, progress: Progress | None = None) -> LoadedModel:
    """Loads a .gguf file or a HF folder; errors are ModelLoadError/UnsupportedModelError with a clear message."""
    options = options or LoadOptions()
    source = Path(source).expanduser()
    start = time.perf_counter()
    if not source.exists():
        raise ModelLoadError(f"Model not found: {source}")
    if source.is_dir():
        args, weights, tok = _read_hf(source, progress)
        kind = "hf"
    else:
        args, weights, tok, kind = _read_gguf_cached(source, options.cache_dir, progress)
    read_s = time.perf_counter() - start
    model = build_model(args, weights, options.torch_dtype, options.device)
    name = args.name or source.stem
    timings = {"read_s": read_s, "total_s": time.perf_counter() - start}
    return LoadedModel(name=name, source=source, args=args, model=model, tokenizer=tok, timings=timings | {"from": kind})


def build_model(args: ModelArgs, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: str) -> CausalLM:
    arch = architecture(args.model_type)
    with torch.device("meta"):
        model = arch.Model(args)
    expected = model.state_dict().keys()
    missing = sorted(set(expected) - weights.keys())
    unexpected = sorted(weights.keys() - set(expected))
    if missing or unexpected:
        raise ModelLoadError(_mismatch_message(missing, unexpected))
    state = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"The weights do not fit the architecture: {exc}") from exc
    model.reset_buffers(device)
    return model.eval().requires_grad_(False)


def _mismatch_message(missing: list[str], unexpected: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing tensors: {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}")
    if unexpected:
        parts.append(f"unexpected tensors: {', '.join(unexpected[:4])}{' …' if len(unexpected) > 4 else ''}")
    return "The weights do not match the architecture (" + "; ".join(parts) + ")."


def _read_hf(folder: Path, progress: Progress | None):
    config = hf_folder.read_config(folder)
    arch = architecture(hf_folder.model_type(config))
    args = arch.args_from_hf(config)
    args.name = folder.name
    tok = tokenizer_from_hf_dir(folder)
    weights = arch.sanitize(hf_folder.read_weights(folder, progress), args)
    return args, weights, tok


def _read_gguf(path: Path, progress: Progress | None):
    if progress:
        progress("Reading model file", 0.0)
    gf = open_gguf(path)
    arch = architecture(gf.architecture or "(none)")
    args = arch.args_from_gguf(gf.metadata, tensor_shapes(gf))
    tok = tokenizer_from_gguf(gf.metadata)
    weights = read_gguf_weights(gf, arch, args, progress)
    return args, weights, tok


def _read_gguf_cached(path: Path, cache_dir: Path | None, progress: Progress | None):
    if cache_dir is not None:
        hit = converted.load(cache_dir, path)
        if hit is not None:
            return (*hit, "converted-cache")
    args, weights, tok = _read_gguf(path, progress)
    if cache_dir is not None:
        converted.save(cache_dir, path, args, weights, tok)
    return args, weights, tok, "gguf"
