"""What a model will hold before it is loaded, what the machine has free, and the refusal when it cannot fit."""
from __future__ import annotations

import ctypes
import gc
import sys
import threading

import psutil
import torch

from engine.errors import ModelLoadError
from engine.quant.weight import choose_format, format_bytes, quantize_bytes

# Measured held after the build: SentencePiece (GGUF `llama`, the embedded model's 262,144 tokens) ~234 B a token,
# `tokenizers` BPE (GGUF `gpt2`, Hugging Face folders) ~280 B with one merge a token, ~330 B with two.
TOKENIZER_BYTES_PER_TOKEN = 400
LOAD_SCRATCH = 64 << 20  # a slice of dequantized rows and the allocator's slack while converting
HEADROOM = 256 << 20  # left for the app, the KV cache's first pages and the OS


def return_freed_memory() -> None:
    """Gives the heap's freed pages back to the OS after a load's scratch and a fusion's replaced matrices: glibc
    keeps them otherwise (measured: +2.5 GB resident after fusing an 8B model's projections)."""
    if threading.current_thread() is threading.main_thread():
        gc.collect()  # off the main thread a full collection can free Qt objects there: PySide6 crashes (seen in CI)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass  # another libc: only residency is at stake


def resident_bytes() -> int:
    return psutil.Process().memory_info().rss


def available_bytes(device: str) -> int:
    """Free memory where the weights will live: the GPU's free memory on CUDA, else the RAM the OS can give."""
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return int(psutil.virtual_memory().available)


def matrix_bytes(type_name: str, n: int, k: int, quantized: bool, float_bytes: int, device: str = "cpu") -> int:
    """Resident bytes of an (n, k) GGUF matrix once loaded (engine/quant/weight.py's formats on `device`)."""
    if not quantized:
        return n * k * float_bytes
    if type_name == "F32":
        return 4 * n * k  # F32 files stay exact
    return format_bytes(choose_format(type_name, n, k, device), n, k, type_name)


def gguf_estimate(tensors, vocab_size: int, quantized: bool, float_bytes: int, device: str = "cpu",
                  staged: bool = False) -> int:
    """Bytes a GGUF model will hold resident on `device`: its tensors in the runtime formats, the tokenizer, load
    scratch. `staged`: the matrices only pass through (built here, moved elsewhere one by one): the largest counts."""
    total = LOAD_SCRATCH + vocab_size * TOKENIZER_BYTES_PER_TOKEN
    largest = 0
    for t in tensors:
        dims = list(t.shape)
        if len(dims) in (2, 3):  # a matrix, or a mixture's experts: one matrix each
            size = matrix_bytes(t.tensor_type.name, int(dims[1]), int(dims[0]), quantized, float_bytes, device)
            largest = max(largest, size)
            total += 0 if staged else size * (int(dims[2]) if len(dims) == 3 else 1)
        else:
            n = 1
            for d in dims:
                n *= int(d)
            total += 4 * n
    return total + largest if staged else total


def hf_estimate(shapes: list[tuple[tuple[int, ...], int]], vocab_size: int, float_bytes: int,
                quantize: str | None, device: str, mxfp4: bool = False, mapped: bool = False) -> tuple[int, int]:
    """(CPU bytes at the load's peak, bytes on `device` after it) for a Hugging Face folder's tensors (shape, bytes
    per element as stored): the shards are read whole, then each tensor is converted to the runtime's dtype (or
    quantized, `quantize` "q8"/"q4" on the CPU) while the read copy is still alive. `mxfp4`: MXFP4 tensors (half a
    byte an element as stored) stay 4-bit in the runtime's MXFP4 format. `mapped`: a tensor stored in the runtime's
    dtype is used as read, without a copy (a converted-cache entry's), so it counts once on the CPU."""
    stored = final = kept = 0
    for shape, elem in shapes:
        n = 1
        for d in shape:
            n *= d
        stored += n * elem
        if mxfp4 and elem == 0.5:
            final += matrix_bytes("MXFP4", n // shape[-1], shape[-1], True, float_bytes, device)
        elif quantize and device == "cpu" and len(shape) == 2:
            final += quantize_bytes(quantize, shape[0], shape[1])
        else:
            final += n * float_bytes
            kept += n * float_bytes if mapped and elem == float_bytes else 0
    extra = LOAD_SCRATCH + vocab_size * TOKENIZER_BYTES_PER_TOKEN
    if device == "cpu":
        return stored + final - kept + extra, final
    return stored + extra, final


def check_fits(needed: int, device: str, name: str) -> None:
    """Refuses, in one line, a model that cannot fit in the memory that is free (never an out-of-memory kill)."""
    free = available_bytes(device)
    if needed + HEADROOM > free:
        where = "GPU memory" if device.startswith("cuda") else "memory"
        # the need named includes the headroom: "needs ~0.4 GB, 0.6 GB free" read as a refusal of a model that fits
        need, have = _gb_pair(needed + HEADROOM, free)
        raise ModelLoadError(f"{name} needs ~{need} GB, {have} GB of {where} free.")


def _gb_pair(need: int, free: int) -> tuple[str, str]:
    """Both sizes in GB with one decimal, or two where one would show them equal (0.75 GB vs 0.72 GB)."""
    for digits in (1, 2):
        pair = (f"{need / 2**30:.{digits}f}", f"{free / 2**30:.{digits}f}")
        if pair[0] != pair[1]:
            break
    return pair
