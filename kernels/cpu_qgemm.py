"""The CPU product over block codes (kernels/cpu/qgemm.c), built once per machine with the system's C compiler,
and its plain PyTorch reference (`impl="reference"`).

The build is cached under the user's cache folder, keyed by the source, the compiler and the CPU's features (it is
compiled for this CPU: `-march=native`). Without a compiler, on a CPU without AVX2/FMA/F16C, or off x86-64, there is
no kernel (`cpu_kernel()` is None) and weights keep torch's int4/int8 formats instead.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu") / "qgemm.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
DISABLE_ENV = "PARLEY_CPU_KERNEL"  # "0": never build or use the kernel (torch's formats instead)
QB = 32  # activation block


@dataclass(frozen=True)
class CpuKernel:
    lib: ctypes.CDLL
    isa: str
    path: Path


def kernel_dir() -> Path:
    env = os.environ.get("PARLEY_KERNEL_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("Parley", appauthor=False)) / "kernels"


@lru_cache(maxsize=1)
def cpu_kernel() -> CpuKernel | None:
    """The built kernel, or None where it cannot run here (see the module's note)."""
    if os.environ.get(DISABLE_ENV) == "0" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        path = _build(compiler)
        lib = ctypes.CDLL(str(path))  # after torch: its libgomp serves both (one thread pool)
    except (OSError, subprocess.SubprocessError):
        return None
    lib.parley_qgemm.restype = ctypes.c_int
    lib.parley_qgemm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                 ctypes.c_void_p, ctypes.c_int]
    lib.parley_qgemm_isa.restype = ctypes.c_char_p
    return CpuKernel(lib, lib.parley_qgemm_isa().decode(), path)


def _build(compiler: str) -> Path:
    source = SOURCE.read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, timeout=30).stdout
    key = hashlib.sha256(source + version + " ".join(FLAGS).encode() + _cpu_features()).hexdigest()[:16]
    out_dir = kernel_dir()
    path = out_dir / f"qgemm-{key}.so"
    if path.exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], check=True, capture_output=True,
                       timeout=120)
        os.replace(tmp, path)  # atomic: a second process building at once gets one of the two, whole
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _cpu_features() -> bytes:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.encode()
    except OSError:
        pass
    return platform.processor().encode()


def qgemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None, bits: int,
          group: int, zero: int, *, impl: str = "auto") -> torch.Tensor:
    """x (R, K) @ Wᵀ -> (R, N) fp32 for W in block codes (engine/quant/block_codes.py): codes (N, K·bits/8) uint8,
    scales and offsets (N, K/group) fp16. `impl` "auto"/"native" runs the C kernel, "reference" plain PyTorch."""
    if impl not in ("auto", "native", "reference"):
        raise ValueError(f"impl must be auto, native or reference, not {impl!r}")
    kernel = cpu_kernel() if impl != "reference" else None
    if kernel is None:
        if impl == "native":
            raise RuntimeError("the CPU kernel is not available on this machine")
        return qgemm_reference(x, codes, scales, offsets, bits, group, zero)
    x = x.float().contiguous()
    r, k = x.shape
    n = codes.shape[0]
    y = torch.empty(r, n, dtype=torch.float32)
    if r == 0:
        return y
    rc = kernel.lib.parley_qgemm(x.data_ptr(), r, k, codes.data_ptr(), scales.data_ptr(),
                                 offsets.data_ptr() if offsets is not None else None, bits, group, zero, n,
                                 y.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise MemoryError(f"no memory for the activations of a {r} × {k} product")
    return y


def quantize_activations(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's activation quantization: per block of 32, d = max|x| / 127 and a = round(x / d) in -127..127;
    also d·Σa per weight group. Returns (a (R, K) float, d (R, K/32), dsum (R, K/group))."""
    r, k = x.shape
    xb = x.float().reshape(r, k // QB, QB)
    amax = xb.abs().amax(-1)
    d = amax / 127
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    a = torch.round(xb * inv[..., None]).clamp_(-127, 127)
    dsum = (a.reshape(r, k // group, group).sum(-1) * d.repeat_interleave(QB // group, dim=1))
    return a.reshape(r, k), d, dsum


def qgemm_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                    bits: int, group: int, zero: int) -> torch.Tensor:
    """The same arithmetic in float64: quantized activations times the dequantized codes, blockwise."""
    r, k = x.shape
    a, d, _ = quantize_activations(x, group)
    u = unpack_codes(codes, bits, k).double()
    s = scales.double().repeat_interleave(group, dim=1)
    o = -zero * s if offsets is None else offsets.double().repeat_interleave(group, dim=1)
    xq = a.double() * d.double().repeat_interleave(QB, dim=1)
    return (xq @ (u * s + o).t()).float()


def unpack_codes(codes: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """(N, K·bits/8) uint8 -> (N, K) codes; 4-bit blocks of 32 hold code j in byte j's low nibble, j + 16 high."""
    if bits == 8:
        return codes
    n = codes.shape[0]
    c = codes.reshape(n, k // QB, QB // 2)
    return torch.cat([c & 0x0F, c >> 4], dim=-1).reshape(n, k)
