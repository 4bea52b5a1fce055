"""Parley's own CPU kernels (kernels/cpu/*.c), built once per machine with the system's C compiler into one
library, loaded with ctypes.

The build is cached under the user's cache folder, keyed by the sources, the compiler and the CPU's features (it is
compiled for this CPU: `-march=native`). Without a compiler, on a CPU without AVX2/FMA/F16C, or off x86-64, there is
no library (`cpu_kernel()` is None): weights keep torch's int4/int8 formats and attention stays in torch.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import os
import platform
import queue
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

from kernels.build_lock import build_lock
from kernels.env_switch import switched_off

SOURCE_DIR = Path(__file__).with_name("cpu")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
FULL_DISK_BYTES = 4 << 20  # a build that failed with less than this free where it builds: the disk filled
DISABLE_ENV = "PARLEY_CPU_KERNEL"  # 0 (or off): never build or use the library (torch's formats and ops instead)
AMX_ENV = "PARLEY_AMX"  # 0 (or off): byte-code matrices loaded from then on keep the vector kernels' layout
TERMINATING = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n)]
NEEDS = ("AVX2", "FMA", "F16C")  # the instruction sets every source's intrinsics take: the AVX2 path's floor
_P, _I64, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
SIGNATURES = {  # name: (restype, argtypes)
    "parley_qgemm": (_INT, [_P, _I64, _I64, _P, _P, _P, _INT, _P, _INT, _INT, _I64, _P, _P, _INT]),
    "parley_kgemm": (_INT, [_P, _I64, _I64, _P, _INT, _I64, _P, _P, _INT]),
    "parley_kq_interleave": (None, [_P, _P, _I64, _INT, _INT]),
    "parley_kgemm_grouped": (_INT, [_P, _I64, _I64, _P, _P, _P, _I64, _INT, _I64, _P, _INT]),
    "parley_moe": (_INT, [_P, _I64, _I64, _P, _P, _I64, _INT, _INT, _INT, _F, _P, _INT, _I64, _P, _INT, _INT, _P, _INT,
                          _I64, _P, _INT, _P, _P, _INT]),
    "parley_q8gemm": (_INT, [_P, _I64, _I64, _P, _P, _INT, _I64, _P, _P, _INT]),
    "parley_amxgemm": (_INT, [_P, _I64, _I64, _P, _P, _INT, _I64, _P, _P, _INT]),
    "parley_amx_ready": (_INT, []),
    "parley_amxkgemm": (_INT, [_P, _I64, _I64, _P, _INT, _I64, _P, _P, _INT]),
    "parley_kq_tile": (None, [_P, _P, _I64, _I64, _INT, _INT]),
    "parley_qgemm_grouped": (_INT, [_P, _I64, _I64, _P, _P, _INT, _P, _INT, _INT, _P, _P, _P, _I64, _I64, _P, _INT]),
    "parley_moe_codes": (_INT, [_P, _I64, _I64, _P, _P, _I64, _INT, _INT, _P, _P, _P, _P, _P, _P, _INT, _P, _INT, _I64,
                                _INT, _F, _F, _P, _INT]),
    "parley_clamped_glu": (None, [_P, _P, _I64, _I64, _I64, _F, _F, _P]),
    "parley_attend_rows": (_INT, [_P, _P, _P, _P, _P, _I64, _INT, _INT, _INT, _F, _F, _P, _P, _INT]),
    "parley_attend_rows_f16": (_INT, [_P, _P, _P, _P, _P, _I64, _INT, _INT, _INT, _F, _F, _P, _P, _INT]),
    "parley_rms_norm": (None, [_P, _I64, _INT, _P, _F, _P]),
    "parley_add_norm": (None, [_P, _P, _I64, _INT, _P, _P, _F, _P, _P, _P]),
    "parley_qk_rope_write": (None, [_P, _P, _P, _I64, _I64, _I64, _INT, _INT, _INT, _P, _P, _F, _P, _P, _P, _P, _P, _P]),
    "parley_qk_rope_write_f16": (None, [_P, _P, _P, _I64, _I64, _I64, _INT, _INT, _INT, _P, _P, _F, _P, _P, _P, _P, _P,
                                        _P]),
    "parley_gated_act": (None, [_P, _P, _I64, _I64, _I64, _INT, _P]),
    "parley_argmax_rows": (None, [_P, _I64, _I64, _P, _INT]),
    "parley_top_rows": (_INT, [_P, _I64, _I64, _I64, _P, _P, _P, _P, _INT]),
    "parley_draw_rows": (_INT, [_P, _I64, _I64, _P, _P, _P, _INT]),
    "parley_sample_top": (_INT, [_P, _I64, _I64, _P, _P, _P, _P, _P, _P, _INT]),
    "parley_penalise_rows": (None, [_P, _I64, _I64, _P, _P, _I64, _P, _P, _P, _INT]),
    "parley_qgemm_isa": (ctypes.c_char_p, []),
}


@dataclass(frozen=True)
class CpuKernel:
    lib: ctypes.CDLL
    isa: str
    path: Path | None


def sources() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.c"))


def kernel_dir() -> Path:
    env = os.environ.get("PARLEY_KERNEL_CACHE", "")
    if env.strip():  # a blank one built the library in a folder named " " wherever Parley ran
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("Parley", appauthor=False)) / "kernels"


Call = tuple[Callable, tuple]  # a library function and its arguments, as `recording` notes them
_thread = threading.local()  # the tape a `recording` block on this thread appends to


def cpu_kernel() -> CpuKernel | None:
    """The built library, or None where it cannot run here (see the module's note and `missing_reason`). Inside a
    `recording` block on this thread, its calls are also noted."""
    kernel = _load()[0]
    tape = getattr(_thread, "tape", None)
    if tape is None or kernel is None:
        return kernel
    return CpuKernel(_Recorder(kernel.lib, tape), kernel.isa, kernel.path)


def amx_ready() -> bool:
    """Whether the library multiplies on AMX tiles here (kernels/cpu/amxgemm.c): built for a CPU that has them,
    Linux grants this process their state, and PARLEY_AMX is not off."""
    return not switched_off(AMX_ENV) and _amx_granted()


@lru_cache(maxsize=1)
def _amx_granted() -> bool:
    kernel = _load()[0]
    return kernel is not None and bool(kernel.lib.parley_amx_ready())


@contextmanager
def recording(tape: list[Call]) -> Iterator[None]:
    """Every library call this thread makes inside the block is made and appended to `tape` (engine/cpu_tape.py
    replays them)."""
    with _on_this_thread("tape", tape):
        yield


@contextmanager
def _on_this_thread(name: str, value) -> Iterator[None]:
    """`_thread.<name>` is `value` inside the block, what it was after it."""
    previous = getattr(_thread, name, None)
    setattr(_thread, name, value)
    try:
        yield
    finally:
        setattr(_thread, name, previous)


class _Recorder:
    """The library, seen through a recording: each function call is noted, then made."""

    def __init__(self, lib: ctypes.CDLL, tape: list[Call]):
        self._lib, self._tape = lib, tape

    def __getattr__(self, name: str) -> Callable:
        fn = getattr(self._lib, name)

        def call(*args):
            self._tape.append((fn, args))
            return fn(*args)

        return call


def missing_reason() -> str | None:
    """Why there is no library on this x86-64 machine, in a few words for a notice; None when it is there, switched
    off, or not meant for this CPU."""
    return _load()[1]


def built_privately() -> Path | None:
    """The kernel cache folder this process could not build the library in (read-only, full), which makes every start
    build it again; None when the library is cached there (or not built at all)."""
    kernel = _load()[0]
    return kernel_dir() if kernel is not None and kernel.path is None else None


def builds_first() -> bool:
    """Whether this process's first use of the library compiles it (seconds, once a machine): for a progress line."""
    if _load.cache_info().currsize or not _wanted():
        return False
    compiler = _compiler()
    return compiler is not None and _runs(compiler) and not _usable(_library_path(compiler))


def _wanted() -> bool:
    """Not switched off, and a CPU they are written for (Apple's runs MLX)."""
    return not switched_off(DISABLE_ENV) and platform.machine().lower() in ("x86_64", "amd64")


def _compiler() -> str | None:
    """The compiler's command line: $CC as make reads it (`ccache gcc`, `gcc -m64`), else cc or gcc on the PATH."""
    found = shutil.which("cc") or shutil.which("gcc")
    return os.environ.get("CC", "").strip() or (shlex.quote(found) if found else None)


def _command(compiler: str) -> list[str]:
    """The compiler's words; none where its quotes do not close."""
    try:
        return shlex.split(compiler)
    except ValueError:
        return []


def _runs(compiler: str) -> bool:
    """Whether the compiler's program is there: a CC naming one that is not raised FileNotFoundError mid-load."""
    words = _command(compiler)
    return bool(words) and shutil.which(words[0]) is not None


@lru_cache(maxsize=1)
def _load() -> tuple[CpuKernel | None, str | None]:
    if not _wanted():
        return None, None  # nothing to say
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler was found (install gcc to build them)"
    if not _runs(compiler):
        return None, f"the C compiler CC names ({compiler}) was not found"
    try:
        path = _build(compiler)
        lib = open_library(path)  # after torch: its libgomp serves both (one thread pool)
        if path.parent != kernel_dir():  # a private build: mapped now, so nothing need stay in the temp folder
            shutil.rmtree(path.parent, ignore_errors=True)
            return bind(lib, None), None
        return bind(lib, path), None
    except Unsupported as exc:
        return None, str(exc)
    except subprocess.CalledProcessError as exc:
        return None, _build_failure(compiler, (exc.stderr or b"").decode(errors="replace"))
    except (OSError, subprocess.SubprocessError, AttributeError) as exc:
        return None, f"they could not be built or loaded ({exc})"


def open_library(path: Path) -> ctypes.CDLL:
    """The library loaded from a copy in memory of its own where the system has memfd (Linux): loaded from the cached
    file, its pages stayed mapped, and that file cut short in place while Parley ran (a sync tool, a restored backup,
    truncate) killed the process with SIGBUS mid-answer. Elsewhere the file itself is loaded."""
    if not hasattr(os, "memfd_create") or not Path("/proc/self/fd").is_dir():
        return ctypes.CDLL(str(path))
    data = path.read_bytes()
    if not _elf_whole(io.BytesIO(data), len(data), data[:64]):
        raise OSError(f"{path} changed while it was read")  # rewritten between the check and the copy
    fd = os.memfd_create(path.name, os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
        # the descriptor stays open: dlopen knows a library by its path, and a later one at a reused
        # /proc/self/fd/N would be handed this one
        return ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError:  # memory that may not be executed (vm.memfd_noexec): the file itself, as before
        os.close(fd)
        return ctypes.CDLL(str(path))


def _build_failure(compiler: str, stderr: str) -> str:
    """Why the build failed, in a few words: a full disk as such (the assembler's first line named only its file:
    'cc could not build them (/tmp/ccgBc2NT.s: Assembler messages:)'), else the compiler's first error line."""
    if "No space left on device" in stderr or _free_bytes(kernel_dir()) < FULL_DISK_BYTES:
        return f"the disk holding {kernel_dir()} is full; free some space and start Parley again to build them"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no message")
    return f"{compiler} could not build them ({said})"


def _free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return FULL_DISK_BYTES  # a folder that is not there: nothing to say about its disk


def chosen(impl: str) -> CpuKernel | None:
    """The library for a kernel's `impl`: "auto" it where built, "native" it or an error, "reference" None."""
    if impl not in ("auto", "native", "reference"):
        raise ValueError(f"impl must be auto, native or reference, not {impl!r}")
    kernel = cpu_kernel() if impl != "reference" else None
    if kernel is None and impl == "native":
        raise RuntimeError("the CPU kernel is not available on this machine")
    return kernel


def bind(lib: ctypes.CDLL, path: Path | None) -> CpuKernel:
    for name, (res, args) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return CpuKernel(lib, lib.parley_qgemm_isa().decode(), path)


class Unsupported(Exception):
    """The CPU lacks an instruction set the kernels take."""


def _lacking(compiler: str) -> list[str]:
    """The instruction sets of NEEDS that the compiler's -march=native leaves out here (an Atom-class Celeron or
    Pentium, a CPU before Haswell): the build would only fail, each start, after seconds of compiling."""
    try:
        probe = subprocess.run([*_command(compiler), "-march=native", "-dM", "-E", "-x", "c", "-"], input=b"",
                               capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []  # the build itself says what is wrong
    macros = probe.stdout.decode(errors="replace")
    return [] if probe.returncode else [isa for isa in NEEDS if f"#define __{isa}__ " not in macros]


def build_library(compiler: str, out: str | Path, flags=FLAGS, jobs: int | None = None) -> None:
    """The sources compiled into `out`: one compiler a source on `jobs` cores (all of them), then the link (an idle
    16-core Xeon: 2.3 s instead of 7.4 s as one command; 2 cores 4.1 s). A failure raises CalledProcessError with its
    stderr."""
    out, compile_flags = Path(out), [f for f in flags if f != "-shared"]
    # the objects and the library until it is whole: a process that ends mid-build removes the folder on its way out
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        objs, linked = [Path(work) / f"{src.stem}.o" for src in sources()], Path(work) / out.name
        report = getattr(_thread, "build_report", None) or (lambda done, total: None)
        _run_all([[*_command(compiler), *compile_flags, "-c", str(src), "-o", str(obj)]
                  for src, obj in zip(sources(), objs)], jobs or os.cpu_count() or 1, report)
        _run([*_command(compiler), *flags, *map(str, objs), "-o", str(linked), "-lm"])
        os.replace(linked, out)  # atomic: a process that did not wait (no lock here) gets one of the two, whole


@contextmanager
def build_progress(report: Callable[[int, int], None]) -> Iterator[None]:
    """A build this thread runs inside the block calls `report(done, total)` on this thread as each source compiles
    (the first run's build: 17-39 s with nothing to show but its seconds)."""
    with _on_this_thread("build_report", report):
        yield


def _run_all(commands: list[list[str]], jobs: int, report: Callable[[int, int], None]) -> None:
    """Each command on one of `jobs` daemon threads; once one fails none starts, and the first failure (in order)
    raises. A Ctrl-C kills the compilers running: a pool went on with the other sources. And a window closed mid-build
    ended its process only once every queued source had compiled (22 s later, the work then thrown away): the
    workers of a ThreadPoolExecutor are joined at exit, these are not."""
    todo, failures, lock, done = iter(enumerate(commands)), {}, threading.Lock(), queue.SimpleQueue()

    def work() -> None:
        try:
            while True:
                with lock:
                    i, command = next(todo, (None, None)) if not failures else (None, None)
                if command is None:
                    return
                try:
                    _run(command)
                    done.put(i)
                except BaseException as exc:
                    with lock:
                        failures[i] = exc
        finally:
            done.put(None)  # this worker is through

    threads = [threading.Thread(target=work, daemon=True, name="parley-cc") for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    compiled, through = 0, 0
    while through < len(threads):  # the report on the caller's thread, as each compile ends
        if done.get() is None:
            through += 1
        else:
            compiled += 1
            report(compiled, len(commands))
    for thread in threads:
        thread.join()
    if failures:
        raise failures[min(failures)]


def _run(command: list[str]) -> None:
    with _signals_unblocked():
        subprocess.run(command, check=True, capture_output=True, timeout=180)


@contextmanager
def _signals_unblocked() -> Iterator[None]:
    """Ctrl-C and SIGTERM reach the compiler started inside: a child inherits its thread's signal mask, and the
    engine's threads block them (engine/engine.py), so a first run stopped by Ctrl-C kept both compilers running to
    the end of the build, the process waiting for them (a first run's window closed 18-21 s after Ctrl-C, 2 cores)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINATING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _library_path(compiler: str) -> Path:
    """The cached library for these sources, this compiler, these flags and this CPU."""
    return kernel_dir() / f"parley-cpu-{_build_key(compiler)}.so"


@lru_cache(maxsize=4)
def _build_key(compiler: str) -> str:
    """Once a process: a first load asks `builds_first`, then builds or loads, and each ran the compiler for this."""
    version = subprocess.run([*_command(compiler), "--version"], capture_output=True, timeout=30).stdout
    text = b"".join(p.name.encode() + p.read_bytes() for p in sorted(SOURCE_DIR.glob("*.[ch]")))  # headers too
    return hashlib.sha256(text + version + " ".join(FLAGS).encode() + _cpu_features()).hexdigest()[:16]


def _build(compiler: str) -> Path:
    path = _library_path(compiler)
    if _usable(path):
        return path
    if lacking := _lacking(compiler):
        raise Unsupported(f"this CPU lacks {'/'.join(lacking)}, which they need")
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(path.with_suffix(".lock")):  # two Parleys started at once: one compiles, the other waits for it
        if _usable(path):
            return path
        return _compile(compiler, path)


def _usable(path: Path) -> bool:
    """The cached library is there and whole. One cut short (a full disk or a power cut as it was written, a sync
    tool, a restored backup) was loaded as it was: its pages past the end killed every start with SIGBUS."""
    try:
        with path.open("rb") as f:
            size, head = os.fstat(f.fileno()).st_size, f.read(64)
            return sys.platform != "linux" or _elf_whole(f, size, head)
    except OSError:
        return False


def _elf_whole(f, size: int, head: bytes) -> bool:
    """An ELF file's program and section headers, and the segments the loader maps, lie inside its `size` bytes."""
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return False
    if head[4:6] != b"\x02\x01":  # not 64-bit little-endian: not one this machine built; dlopen judges it
        return True
    ph_off, sh_off = struct.unpack_from("<QQ", head, 32)
    ph_size, ph_num, sh_size, sh_num = struct.unpack_from("<HHHH", head, 54)
    if ph_off + ph_size * ph_num > size or sh_off + sh_size * sh_num > size or ph_size < 56:
        return False
    f.seek(ph_off)
    table = f.read(ph_size * ph_num)
    for i in range(ph_num):
        kind, _, offset, _, _, file_size = struct.unpack_from("<IIQQQQ", table, i * ph_size)
        if kind == 1 and offset + file_size > size:  # PT_LOAD
            return False
    return True


def _compile(compiler: str, path: Path) -> Path:
    """The library built and renamed to `path`, or, where its folder cannot be written, to a private temporary one."""
    try:
        tempfile.TemporaryDirectory(dir=path.parent).cleanup()
    except OSError:  # a cache folder it cannot write (a read-only home, a hardened service): a build of its own
        path = Path(tempfile.mkdtemp(prefix="parley-kernels-")) / path.name
    build_library(compiler, path)
    return path


def _cpu_features() -> bytes:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.encode()
    except OSError:
        pass
    return platform.processor().encode()
