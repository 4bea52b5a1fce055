"""load_model: a GGUF file or a Hugging Face folder -> a ready model and tokenizer on the chosen device."""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading import converted, hf_folder
from engine.loading.default_model import expand_home
from engine.loading.file_stamp import file_stamp
from engine.loading.gguf_file import GGUFFile, open_gguf
from engine.loading.gguf_header import Span
from engine.loading.gguf_keys import check_against_model, check_counts
from engine.loading.gguf_split import files_name, model_file, shown_name
from engine.loading.gguf_weights import kept_as_is, read_gguf_weights, requantized_notice, tensor_shapes
from engine.loading.tensor_check import check_folder, check_tensors, mismatch_message
from engine.loading.tokenizer_cache import gguf_tokenizer, vocabulary_spans
from engine.memory import (
    LOAD_SCRATCH, available_bytes, check_fits, gguf_estimate, hf_estimate, return_freed_memory,
)
from engine.models import architecture
from engine.models.moe import keeps_fp32
from engine.models.args import ModelArgs, fit_context
from engine.models.layers import CausalLM
from engine.quant.from_float import SCHEMES, quantize_matrix
from engine.quant.mxfp4 import Mxfp4Rows
from engine.quant.weight import QuantTensor, weights_summary
from engine.tokenizer import Tokenizer, tokenizer_from_hf_dir

Progress = Callable[[str, float], None]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS = ("auto", "quantized", "dequantized")
GPU_FLOAT_SHARE = 0.6  # "auto" on CUDA holds floats only while they take at most this share of the free GPU memory
# "auto" on CUDA quantizes models of at least this many matrix weights: one H200, Q4_K_M layouts, decode vs bf16 at
# 1 / 8 sessions: Llama-3.2-1B-shaped 1.73× / 1.61×, 3B 1.73× / 1.55×, 8B 1.82× / 1.78×; below, Gemma 3 270M 1.01× /
# 1.05×: no faster, so floats, exact to the file (CUDA re-quantizes its Q5_0/Q8_0 matrices to int8 rows)
QUANTIZED_FROM_WEIGHTS = 500_000_000


@dataclass(slots=True)
class LoadOptions:
    device: str = "cpu"
    dtype: str = "float32"
    cache_dir: Path | None = None  # dequantized GGUF weights are kept here; None disables the cache
    # GGUF matrices stay "quantized", or "dequantized" to `dtype` (matches transformers); "auto": quantized on the
    # CPU; on CUDA quantized from ~1B weights up (faster there), floats for smaller models that fit (as fast, and exact
    # to the file, where CUDA re-quantizes Q5/Q6/Q8 types to int8 rows; docs/QUANTIZED.md)
    weights: str = "auto"
    quantize: str | None = None  # a HF folder's matrices quantized at load on the CPU: "q8" or "q4"
    context: int | None = None  # the sessions' context (EngineConfig.max_session_tokens): LongRoPE's factors by it
    # what the model's runtime will hold beside its weights, (what, bytes) from its header (engine/runtime_memory.py):
    # counted before any weight is read; None counts the weights alone
    beside: Callable[[ModelArgs, LoadOptions], list[tuple[str, int]]] | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, not {self.weights!r}")
        if self.quantize not in (None, *SCHEMES):
            raise ValueError(f"quantize must be one of {', '.join(SCHEMES)}, not {self.quantize!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelLoadError("CUDA was requested but no CUDA device is available.")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def quantized(self) -> bool:
        """Whether matrices stay quantized: on the CPU and CUDA, which have kernels for them (MLX converts the CPU's);
        "auto" is resolved by `load_model` first (here: the CPU's choice)."""
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            return False
        return self.weights == "quantized" or (self.weights == "auto" and self.device == "cpu")


@dataclass(slots=True)
class LoadedModel:
    name: str
    source: Path
    args: ModelArgs
    model: CausalLM
    tokenizer: Tokenizer
    timings: dict[str, float] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)  # one line each: what the user should know about this load

    def quantization(self) -> str:
        """How the weights are held, e.g. "Q4_K→int4 ×27, Q8_0→int8 ×10" or "float32"."""
        return weights_summary(self.model)

    def is_quantized(self) -> bool:
        return any(isinstance(m, QuantTensor) for m in self.model.modules())

    def weight_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.model.buffers()) + \
            sum(p.numel() * p.element_size() for p in self.model.parameters())


def load_model(source: str | Path, options: LoadOptions | None = None, progress: Progress | None = None) -> LoadedModel:
    """Loads a .gguf file or a HF folder; errors are ModelLoadError/UnsupportedModelError with a clear message."""
    options = options or LoadOptions()
    source = expand_home(source)
    start = time.perf_counter()
    if not source.exists():
        raise ModelLoadError(f"Model not found: {source}")
    source = model_file(source)
    notices: list[str] = []
    try:
        args, weights, tok, shell, kind = _read(source, options, progress, notices)
    except FileNotFoundError as exc:  # the file checked a moment ago
        if source.exists():
            raise
        gone = f"{source.name} was moved or removed while it loaded: load it from where it is now."
        raise ModelLoadError(gone) from exc
    read_s = time.perf_counter() - start
    fitted = fit_context(args, options.context)
    model = build_model(fitted, weights, options.torch_dtype, options.device, shell if fitted is args else None)
    args = fitted
    del weights
    return_freed_memory()
    name = shown_name(args.name, source)
    timings = {"read_s": read_s, "total_s": time.perf_counter() - start}
    return LoadedModel(name=name, source=source, args=args, model=model, tokenizer=tok,
                       timings=timings | {"from": kind}, notices=notices)


def _read(source: Path, options: LoadOptions, progress: Progress | None, notices: list[str]):
    """(args, weights, tokenizer, the module to fill or None, where they came from) of a folder or a GGUF file."""
    if source.is_dir():
        args, weights, tok, shell = _read_hf(source, progress, options, notices)
        if options.quantize and options.device == "cpu":
            weights = _quantized_at_load(weights, options.quantize)
        elif options.weights == "quantized":  # the app's settings.json may ask it of every model
            notices.append(f'Weights "quantized" {quantized_folders(source.name)}.')
        return args, weights, tok, shell, "hf"
    with _OpenOnce(source) as opened:
        if (options := _resolve_weights(source, options, opened)).quantized:
            return *_read_gguf(source, progress, options, notices=notices, opened=opened), "gguf"
        return _read_gguf_cached(source, options, progress, notices, opened)


def quantized_folders(names: str, many: bool = False) -> str:
    """Why weights "quantized" does nothing for Hugging Face folders: the CLI's refusal and the load's notice."""
    what = "are Hugging Face folders" if many else "is a Hugging Face folder"
    return f"keeps a GGUF file's matrices quantized; {names} {what}, whose matrices load as floats"


def _quantized_at_load(weights: dict, scheme: str) -> dict:
    """A folder's matrices quantized, its other tensors copied: a view into the shards' mapping (an fp32 folder's
    norms) would keep the whole file mapped and resident beside the quantized model."""
    return {k: quantize_matrix(v, scheme) if isinstance(v, torch.Tensor) and v.dim() == 2 and k.endswith(".weight")
            else v.clone() if isinstance(v, torch.Tensor) else v for k, v in weights.items()}


class _OpenOnce:
    """A GGUF file opened at most once by one load, however many of its steps read the header (its checks and its
    token strings: ~0.2-0.45 s for a 262,144-token vocabulary); closed when the load is done with it."""

    def __init__(self, path: Path):
        self.path, self.file = path, None

    def __call__(self, skip: dict[str, Span] | None = None) -> GGUFFile:
        """The opened file; its first opening passes over the arrays in `skip` (open_gguf's)."""
        if self.file is None:
            self.file = open_gguf(self.path, skip)
        return self.file

    def __enter__(self) -> "_OpenOnce":
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()


def _resolve_weights(path: Path, options: LoadOptions, opened: Callable[[], GGUFFile] | None = None) -> LoadOptions:
    """`weights="auto"` made concrete for a GGUF file: quantized on the CPU; on CUDA quantized for models of at least
    QUANTIZED_FROM_WEIGHTS matrix weights (the quantized kernels decode them faster) or whose floats would take more
    than GPU_FLOAT_SHARE of the free GPU memory (room left for the KV cache and a second model), else floats."""
    if options.weights != "auto":
        return options
    weights = "quantized"
    if options.device.startswith("cuda"):
        with _OpenOnce(path) if opened is None else nullcontext(opened) as open_file:
            tensors = open_file().tensors  # the header's tensor table is all this needs
        floats = gguf_estimate(tensors, 0, False, options.torch_dtype.itemsize)
        small = _matrix_weights(tensors) < QUANTIZED_FROM_WEIGHTS
        roomy = floats <= GPU_FLOAT_SHARE * available_bytes(options.device)
        weights = "dequantized" if small and roomy else "quantized"
    return replace(options, weights=weights)


def _matrix_weights(tensors) -> int:
    """The weights of a GGUF file's matrices (its 2-D tensors, and a mixture's 3-D experts)."""
    return sum(math.prod(int(d) for d in t.shape) for t in tensors if len(t.shape) in (2, 3))


def build_model(args: ModelArgs, weights: dict[str, torch.Tensor | QuantTensor], dtype: torch.dtype,
                device: str, shell: CausalLM | None = None) -> CausalLM:
    """The architecture's module with `weights` in place; QuantTensor matrices replace their Linear/Embedding.
    `shell`: that module already built on the meta device for `args` (the header's check), filled instead of built
    again (1.7 s of a 48-layer, 128-expert mixture's load)."""
    arch = architecture(args.model_type)
    if shell is None:
        with torch.device("meta"):
            model = arch.Model(args)
    else:
        model = shell
        model.args = args  # it was built before the file's rope factors were read: reset_buffers takes them from here
    expected = model.state_dict().keys()
    missing = sorted(set(expected) - weights.keys())
    unexpected = sorted(weights.keys() - set(expected))
    if missing or unexpected:
        raise ModelLoadError(mismatch_message(missing, unexpected))
    state = {}
    for key, value in weights.items():
        if isinstance(value, QuantTensor):
            model.install_quantized(key.removesuffix(".weight"), value, dtype)
        else:
            state[key] = value.to(device=device, dtype=torch.float32 if keeps_fp32(key, args) else dtype)
    try:
        result = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]  # torch lists one per line
        detail = next((line for line in lines if "mismatch" in line), lines[0] if lines else "")
        raise ModelLoadError(f"The weights do not fit the architecture: {detail}") from exc
    left = [k for k in result.missing_keys if not _quantized_buffer(model, k)]
    if left or result.unexpected_keys:
        raise ModelLoadError(mismatch_message(left, result.unexpected_keys))
    model.reset_buffers(device)
    return model.eval().requires_grad_(False)


def _quantized_buffer(model: CausalLM, key: str) -> bool:
    owner = model.get_submodule(key.rsplit(".", 1)[0]) if "." in key else model
    return isinstance(owner, QuantTensor)


def _check_hf_memory(folder: Path, args: ModelArgs, options: LoadOptions) -> None:
    """Refuses before reading a folder's shards: the CPU's peak (read copy + converted), and the GPU's final size."""
    quantize = options.quantize if options.device == "cpu" else None
    # mapped: a tensor already in the runtime's dtype is used as read from the shard's mapping, not copied
    staging, final = hf_estimate(hf_folder.tensor_shapes(folder), args.vocab_size, options.torch_dtype.itemsize,
                                 quantize, options.device, mxfp4=_keeps_mxfp4(options), mapped=True)
    _check_fits(staging, final, folder.name, args, options)


def _read_hf(folder: Path, progress: Progress | None, options: LoadOptions, notices: list[str]):
    config = hf_folder.read_config(folder)
    arch = architecture(hf_folder.model_type(config))
    try:
        args = arch.args_from_hf(config)
    except (TypeError, ValueError, KeyError, ZeroDivisionError, AttributeError, IndexError) as exc:
        # a value of the wrong type or zero (hidden_size "abc", num_attention_heads 0): named, not a Python error
        raise UnsupportedModelError(f"{folder.name}'s config.json does not describe a model Parley can build: "
                                    f"{type(exc).__name__}: {exc}") from exc
    args.name = folder.name
    shell = check_folder(folder, arch, args)
    _check_hf_memory(folder, args, options)
    tok = tokenizer_from_hf_dir(folder)
    weights = arch.sanitize(hf_folder.read_weights(folder, progress), args)
    keep, requantized = _keeps_mxfp4(options), 0
    for name, value in weights.items():  # a folder's MXFP4 matrices (gpt-oss's experts), one at a time
        if isinstance(value, Mxfp4Rows):
            weights[name] = value.held(options.device).to(options.device) if keep else value.dequantize()
            requantized += keep and not kept_as_is(weights[name])
    if requantized:  # torch's CPU kernels, or scales beyond CUDA's: as a file's MXFP4 says
        notices.append(requantized_notice(folder.name, "MXFP4", requantized))
    return args, weights, tok, shell


def _keeps_mxfp4(options: LoadOptions) -> bool:
    """Whether a folder's MXFP4 matrices stay 4-bit (the CPU's and CUDA's kernels read them exactly) rather than
    becoming `dtype` floats: unless the load asks for dequantized weights."""
    return options.weights != "dequantized" and options.device.split(":")[0] in ("cpu", "cuda")


def _read_gguf(path: Path, progress: Progress | None, options: LoadOptions, notices: list[str] | None = None,
               opened: Callable[[], GGUFFile] | None = None):
    if progress:
        progress("Reading model file", 0.0)
    if progress and options.quantized and options.device == "cpu":
        _build_cpu_kernels(progress)
    # a saved tokenizer: the header is read without its vocabulary
    skip = vocabulary_spans(options.cache_dir, path) if options.quantized else None
    gf = open_gguf(path, skip) if opened is None else opened(skip)
    if notices is not None:
        notices.extend(gf.notices)
    try:
        arch = architecture(gf.architecture or "(none)")
        check_counts(gf.metadata, gf.architecture)
        args = arch.args_from_gguf(gf.metadata, tensor_shapes(gf))
        check_against_model(gf.metadata, gf.architecture, args)
        shell = check_tensors(gf, arch, args)
        _check_memory(gf, args, options, files_name(path))
        # a dequantized load's converted entry holds its tokenizer already: no second copy
        tok = gguf_tokenizer(gf, options.cache_dir if options.quantized else None, notices)
        _check_vocabulary(tok, args, files_name(path))
        weights = read_gguf_weights(gf, arch, args, progress, quantized=options.quantized, notices=notices,
                                    device=options.device)
    finally:
        gf.close()
    if options.quantized and options.device == "cpu" and notices is not None:
        from kernels.cpu_native import built_privately, missing_reason

        if (reason := missing_reason()) is not None:
            notices.append(f"Parley's CPU kernels are not available: {reason}; torch's slower kernels run instead.")
        elif (folder := built_privately()) is not None:  # a read-only home: ~10-30 s more at every start, unsaid
            notices.append(f"Parley's kernel folder {folder} could not be written (read-only or full): its CPU kernels "
                           "are built again at every start, which takes longer.")
    return args, weights, tok, shell


def _check_vocabulary(tok: Tokenizer, args: ModelArgs, name: str) -> None:
    """A GGUF's converter pads its token list to the embedding's rows; more tokens than rows would reach the model as
    ids it cannot embed (a prompt naming one failed its turn with an IndexError)."""
    if tok.vocab_size > args.vocab_size:
        raise ModelLoadError(f"{name} is inconsistent: its tokenizer has {tok.vocab_size:,} tokens but the model "
                             f"embeds {args.vocab_size:,}.")


def _build_cpu_kernels(progress: Progress) -> None:
    """The CPU library compiled up front on its first use here (15 s of CPU on this 2-core Xeon), under its own stage:
    otherwise the load shows 'Decoding weights' at 0 % meanwhile."""
    from kernels.cpu_native import build_progress, builds_first, cpu_kernel

    if builds_first():
        stage = "Building Parley's CPU kernels (once for this computer)"
        progress(stage, 0.0)
        with build_progress(lambda done, total: progress(stage, done / (total + 1))):  # + 1: the link after them
            cpu_kernel()


def _check_memory(gf, args: ModelArgs, options: LoadOptions, name: str) -> None:
    """Refuses before reading weights: the CPU holds the runtime formats (or fp32 while converting; quantized for
    CUDA, one matrix at a time), the GPU its formats or its dtype."""
    cuda = options.device.startswith("cuda")
    staging = gguf_estimate(gf.tensors, args.vocab_size, options.quantized, 4, staged=cuda and options.quantized)
    if not cuda and not options.quantized and options.torch_dtype.itemsize != 4:
        # build_model makes each fp32 tensor a `dtype` copy while the fp32 dict is alive: both at the peak
        staging += gguf_estimate(gf.tensors, 0, False, options.torch_dtype.itemsize) - LOAD_SCRATCH
    final = gguf_estimate(gf.tensors, 0, options.quantized, options.torch_dtype.itemsize, device=options.device)
    _check_fits(staging, final, name, args, options)  # `final` counts on CUDA only


def _check_converted(args: ModelArgs, weights_file: Path, options: LoadOptions, name: str) -> None:
    """Refuses a converted copy that cannot fit, as the file it came from would be (its fp32 tensors are used as read
    when the runtime's dtype is fp32, copied to it otherwise)."""
    try:
        shapes = hf_folder.file_tensor_shapes(weights_file)
    except (ModelLoadError, OSError, KeyError, TypeError, ValueError, AttributeError):
        return  # a damaged entry: the load rebuilds it from the GGUF file, which is checked then
    staging, final = hf_estimate(shapes, args.vocab_size, options.torch_dtype.itemsize, None, options.device,
                                 mapped=True)
    _check_fits(staging, final, name, args, options)


def _check_fits(staging: int, final: int, name: str, args: ModelArgs, options: LoadOptions) -> None:
    """The CPU's peak while loading, and on CUDA the GPU's final size, each with what the runtime will add there (its
    cache, tapes and steps: `options.beside`)."""
    beside = options.beside(fit_context(args, options.context), options) if options.beside is not None else []
    cuda = options.device.startswith("cuda")
    check_fits(staging, "cpu", name, [] if cuda else beside)
    if cuda:
        check_fits(final, options.device, name, beside)


def _read_gguf_cached(path: Path, options: LoadOptions, progress: Progress | None, notices: list[str],
                      opened: Callable[[], GGUFFile] | None = None):
    cache_dir = options.cache_dir
    if cache_dir is not None:
        hit = converted.load(cache_dir, path, lambda args, f: _check_converted(args, f, options, files_name(path)))
        if hit is not None:
            return (*hit, None, "converted-cache")
    stamp = file_stamp(path)  # before the read: a change meanwhile makes the entry another's
    args, weights, tok, shell = _read_gguf(path, progress, options, notices=notices, opened=opened)
    if cache_dir is not None and not converted.save(cache_dir, path, args, weights, tok, stamp):
        notices.append(converted.unwritable(cache_dir, f"{files_name(path)}'s converted copy (weights dequantized)"))
    return args, weights, tok, shell, "gguf"
