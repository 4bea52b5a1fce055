"""What a model will hold before it is loaded, what the machine has free, and the refusal when it cannot fit."""
from __future__ import annotations

import ctypes
import gc
import sys
import threading
from pathlib import Path

import psutil
import torch

from engine.errors import ModelLoadError
from engine.quant.weight import choose_format, format_bytes, quantize_bytes

# Measured held after the build: SentencePiece (GGUF `llama`, the embedded model's 262,144 tokens) ~234 B a token,
# `tokenizers` BPE (GGUF `gpt2`, Hugging Face folders) ~280 B with one merge a token, ~330 B with two.
TOKENIZER_BYTES_PER_TOKEN = 400
LOAD_SCRATCH = 64 << 20  # a slice of dequantized rows and the allocator's slack while converting
HEADROOM = 256 << 20  # left for the app, the KV cache's first pages and the OS
CGROUP_ROOT, OWN_CGROUP = Path("/sys/fs/cgroup"), Path("/proc/self/cgroup")
V2_FILES = ("memory.max", "memory.current", "inactive_file")
V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
NO_LIMIT = 1 << 60  # a cgroup v1 without a limit reads 2^63 rounded down to a page


def return_freed_memory() -> None:
    """Gives the heap's freed pages back to the OS after a load's scratch and a fusion's replaced matrices: glibc
    keeps them otherwise (measured: +2.5 GB resident after fusing an 8B model's projections)."""
    if threading.current_thread() is threading.main_thread():
        gc.collect()  # off the main thread a full collection can free Qt objects there: PySide6 crashes (seen in CI)
    trim_heap()


def trim_heap() -> None:
    """Gives the heap's free pages back to the OS now (glibc's malloc_trim; nothing elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass  # another libc: only residency is at stake


def resident_bytes() -> int:
    return psutil.Process().memory_info().rss


def available_bytes(device: str) -> int:
    """Free memory where the weights will live: the GPU's free memory on CUDA, else the RAM the OS can give, within
    this process's memory cgroup's limit (a container's or a systemd slice's) where it has one."""
    if device.startswith("cuda"):
        dev = torch.device(device)
        free, _total = torch.cuda.mem_get_info(dev)
        # blocks torch's allocator holds but no tensor uses are free to this process, not to the driver's count
        return int(free) + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    try:
        free = int(psutil.virtual_memory().available)
    except OSError:  # /proc/meminfo cannot be opened (every descriptor taken): unknown, and an allocator still refuses
        free = NO_LIMIT
    limited = cgroup_free_bytes(CGROUP_ROOT, OWN_CGROUP)
    return free if limited is None else min(free, limited)


def address_space_free_bytes() -> int | None:
    """What an address-space limit (`ulimit -v`, RLIMIT_AS: common on shared machines) still lets this process map,
    or None without one: past it an allocation fails whatever the machine has free. The cache's growth and the load
    read it, without the load's headroom: mappings outgrow resident bytes, never the other way."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(0, soft - psutil.Process().memory_info().vms)


def cgroup_free_bytes(root: Path, own: Path) -> int | None:
    """What this process's memory cgroup and its parents still let it take (cgroup v2 or v1), or None where none sets
    a limit. /proc/meminfo shows the whole machine inside a container: past the limit the kernel kills the process
    whatever the machine has free."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    frees = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            frees += [_level_free(d, *V2_FILES) for d in _levels(root, path)]
        elif "memory" in controllers.split(","):
            frees += [_level_free(d, *V1_FILES) for d in _levels(root / "memory", path)]
    frees = [f for f in frees if f is not None]
    return min(frees) if frees else None


def _levels(base: Path, path: str) -> list[Path]:
    """The cgroup's folder and each parent up to the mount (a container sees its own cgroup at the mount)."""
    parts = [p for p in path.strip().split("/") if p and p != ".."]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _level_free(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    """Limit minus usage, counting inactive page cache as free (the kernel reclaims it first); None without a limit."""
    try:
        limit = (folder / limit_file).read_text().strip()
        usage = int((folder / usage_file).read_text())
        stat = (folder / "memory.stat").read_text().splitlines()
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= NO_LIMIT:  # "max" (v2), or v1's page-rounded 2^63
        return None
    inactive = next((int(v) for k, _, v in (ln.partition(" ") for ln in stat) if k == inactive_key and v.isdigit()), 0)
    return max(0, int(limit) - usage + inactive)


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


def check_fits(needed: int, device: str, name: str, beside: list[tuple[str, int]] | tuple = ()) -> None:
    """Refuses, in one line, a model that cannot fit in the memory that is free (never an out-of-memory kill): its
    weights (`needed`) and what its runtime will hold beside them (`beside`, (what, bytes): engine/runtime_memory.py),
    with HEADROOM left of the memory the OS can give; on the CPU also within an address-space limit (`ulimit -v`),
    which counts every mapping, so a model whose resident bytes alone pass it can never load."""
    parts = [("weights", needed), *beside]
    free = available_bytes(device)
    if sum(n for _, n in parts) + HEADROOM > free:
        where = "of GPU memory free" if device.startswith("cuda") else "of memory free"
        raise refusal(name, [*parts, ("room for the rest", HEADROOM)], free, where, detailed=bool(beside))
    mappable = None if device.startswith("cuda") else address_space_free_bytes()
    if mappable is not None and sum(n for _, n in parts) > mappable:
        where = "free under this process's memory limit (ulimit -v)"
        raise refusal(name, parts, mappable, where, detailed=bool(beside))


def refusal(name: str, parts: list[tuple[str, int]], free: int, where: str, detailed: bool) -> ModelLoadError:
    """'NAME needs ~X GB, Y GB of memory free.'; `detailed`: what needs what, in GB."""
    # the need named includes the headroom: "needs ~0.4 GB, 0.6 GB free" read as a refusal of a model that fits
    need, have = gb_pair(sum(n for _, n in parts), free)
    detail = " (" + ", ".join(f"{what} {n / 2**30:.2f}" for what, n in parts) + " GB)" if detailed else ""
    return ModelLoadError(f"{name} needs ~{need} GB{detail}, {have} GB {where}.")


def gb_pair(need: int, free: int) -> tuple[str, str]:
    """Both sizes in GB with one decimal, or more where one would show them equal (0.75 GB vs 0.72 GB)."""
    for digits in (1, 2, 3):
        pair = (f"{need / 2**30:.{digits}f}", f"{free / 2**30:.{digits}f}")
        if pair[0] != pair[1]:
            break
    return pair
