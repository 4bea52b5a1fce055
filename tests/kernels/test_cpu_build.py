"""The CPU library's first use on a machine (kernels/cpu_native.py): what a CPU the kernels cannot run on is told,
without a build that could only fail; a cache folder it cannot write still gets the library; a load that builds it
says so."""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

from kernels import cpu_native

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or platform.machine().lower() not in ("x86_64", "amd64"),
                              reason="needs cc on x86-64")


@needs_cc
def test_a_cpu_without_avx2_is_told_so_and_nothing_is_compiled(tmp_path, monkeypatch):
    """cc -march=native on a CPU without AVX2 (a Celeron N4020, an Ivy Bridge) targets x86-64-v2: a wrapper makes
    this machine's cc do that. The notice names what is missing, instead of the compiler's first error line after
    seconds of a build that fails again at every start."""
    cc = tmp_path / "cc-v2"
    cc.write_text('#!/bin/sh\nfor a do shift; [ "$a" = -march=native ] && a=-march=x86-64-v2; set -- "$@" "$a"; done\n'
                  'exec cc "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.delenv(cpu_native.DISABLE_ENV, raising=False)
    kernel, reason = cpu_native._load.__wrapped__()
    assert kernel is None and reason == "this CPU lacks AVX2/FMA/F16C, which they need"
    assert not list((tmp_path / "kernels").glob("*"))  # no build was tried


@needs_cc
def test_a_cache_folder_it_cannot_write_gets_a_build_of_its_own(tmp_path, monkeypatch):
    """A read-only cache folder (a service under ProtectHome=read-only, a read-only container) left torch's kernels
    running: the embedded model decoded 3.6x slower here. The library is built in a private temporary folder instead
    (a one-line library stands for the sources here: what is tested is where it goes)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(blocker / "kernels"))  # under a file: it can never be made
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    src = tmp_path / "probe.c"
    src.write_text("int parley_probe(void) { return 7; }\n")
    monkeypatch.setattr(cpu_native, "sources", lambda: [src])
    path = cpu_native._build("cc")
    assert path.parent.parent == tmp_path and path.parent.name.startswith("parley-kernels-")
    assert ctypes.CDLL(str(path)).parley_probe() == 7


@needs_cc
def test_a_first_use_here_is_known_before_it_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv(cpu_native.DISABLE_ENV, raising=False)
    monkeypatch.setattr(cpu_native, "_load", lru_cache(maxsize=1)(cpu_native._load.__wrapped__))  # a new process's
    assert cpu_native.builds_first()  # an empty cache folder
    path = cpu_native._library_path(cpu_native._compiler())
    path.touch()
    assert cpu_native.builds_first()  # an empty file is no library: built again
    monkeypatch.setattr(cpu_native, "sources", lambda: [_probe(tmp_path)])  # a one-line library for the sources
    cpu_native.build_library("cc", path)
    assert not cpu_native.builds_first()  # this machine's library is there
    monkeypatch.setenv(cpu_native.DISABLE_ENV, "0")
    (tmp_path / cpu_native._library_path(cpu_native._compiler()).name).unlink()
    assert not cpu_native.builds_first()  # switched off


def test_a_load_that_builds_the_kernels_says_so_first(monkeypatch, tiny_models_q8):
    """The build ran inside the first matrix's decoding: the load showed 'Decoding weights' at 0 % for 15 s of CPU
    (a minute on a busy 2-core machine). It now has a stage of its own, before the weights."""
    from engine.loading.loader import LoadOptions, load_model

    monkeypatch.setattr(cpu_native, "builds_first", lambda: True)
    stages: list[str] = []
    load_model(tiny_models_q8["llama"].gguf_path, LoadOptions(weights="quantized"),
               progress=lambda stage, fraction: stages.append(stage))
    first = stages.index("Building Parley's CPU kernels (once for this computer)")
    assert stages[first - 1] == "Reading model file" and "Decoding weights" in stages[first + 1:]


def _fork_build(cc: str) -> tuple[int, int]:
    """A second process (forked: no second start-up of its imports) that builds or waits, then loads the library and
    writes back its path and what its probe returns; (pid, read end of the pipe)."""
    import os

    out, into = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            path = cpu_native._build(cc)
            os.write(into, f"{path}\n{ctypes.CDLL(str(path)).parley_probe()}".encode())
        finally:
            os._exit(0)
    os.close(into)
    return pid, out


@needs_cc
def test_two_first_starts_at_once_build_the_library_once(tmp_path, monkeypatch):
    """Two Parleys started together on an empty kernel cache each compiled the library (38 s of CPU instead of 19 s on
    this 2-core VM); the second now waits for the first's build and loads its result. A compiler that logs each
    compile (and takes a second) shows who built; a one-line library stands for the sources."""
    import os

    log, cc = tmp_path / "compiles.log", tmp_path / "cc-logged"
    cc.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*) echo "$$" >> {log}; sleep 1;; esac\nexec cc "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(tmp_path / "kernels"))
    src = tmp_path / "probe.c"
    src.write_text("int parley_probe(void) { return 7; }\n")
    monkeypatch.setattr(cpu_native, "sources", lambda: [src])
    children = [_fork_build(str(cc)) for _ in range(2)]
    results = []
    for pid, out in children:
        with os.fdopen(out) as pipe:
            results.append(pipe.read())
        os.waitpid(pid, 0)
    path = cpu_native._library_path(str(cc))
    assert results == [f"{path}\n7"] * 2  # both working, on the cached library
    assert len(log.read_text().splitlines()) == 1  # before: 2


def test_a_build_lock_held_too_long_is_not_waited_for_forever(tmp_path):
    """A build that hangs (a stuck compiler) holds its lock: another start waits `wait_s`, then builds too; a lock
    file that cannot be made (a read-only cache folder) is not waited for at all."""
    import fcntl
    import os
    import time

    from kernels.build_lock import build_lock

    lock = tmp_path / "lib.lock"
    with build_lock(lock) as held:
        assert held
        start = time.monotonic()
        with build_lock(lock, wait_s=0.2) as second:  # another open file: flock conflicts as between processes
            assert not second and 0.2 <= time.monotonic() - start < 2
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the block ended
    finally:
        os.close(fd)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    start = time.monotonic()
    with build_lock(blocker / "lib.lock") as held:
        assert not held and time.monotonic() - start < 0.1


def _probe(folder) -> "Path":
    src = folder / "probe.c"
    src.write_text("int parley_probe(void) { return 7; }\n")
    return src


DAMAGES = {"cut short": lambda raw: raw[:len(raw) // 2], "emptied": lambda raw: b"",
           "overwritten at its start": lambda raw: bytes(4096) + raw[4096:]}


@needs_cc
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cached_library_is_built_again(tmp_path, monkeypatch, damage):
    """A cached library cut short (a full disk or a power cut as it was written, a sync tool) was loaded as it was:
    the real one truncated to 20,000 or 220,000 of its 228,000 bytes killed every start with SIGBUS, and an emptied
    or overwritten one left torch's slower kernels running at every start ('file too short', 'invalid ELF header')."""
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(cpu_native, "sources", lambda: [_probe(tmp_path)])
    path = cpu_native._build("cc")
    whole = path.read_bytes()
    path.write_bytes(DAMAGES[damage](whole))
    assert cpu_native._build("cc") == path
    assert path.stat().st_size == len(whole)  # before loading it: a library cut short would end pytest with SIGBUS
    assert ctypes.CDLL(str(path)).parley_probe() == 7


@needs_cc
def test_a_cc_of_several_words_builds_and_one_not_found_is_a_notice(tmp_path, monkeypatch):
    """CC="ccache gcc" (a command line, as make reads it) or a CC naming a compiler not installed failed the whole
    load: 'Could not load gemma-3-270m-Q4_K_M.gguf: FileNotFoundError(2, 'No such file or directory')'."""
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv(cpu_native.DISABLE_ENV, raising=False)
    monkeypatch.setattr(cpu_native, "sources", lambda: [_probe(tmp_path)])
    assert ctypes.CDLL(str(cpu_native._build("env cc"))).parley_probe() == 7  # `env` stands for ccache
    monkeypatch.setattr(cpu_native, "_load", lru_cache(maxsize=1)(cpu_native._load.__wrapped__))  # a new process's
    for cc in (str(tmp_path / "no-cc"), "no-such-cc -O2", 'cc "'):
        monkeypatch.setenv("CC", cc)
        assert not cpu_native.builds_first()
        assert cpu_native._load.__wrapped__() == (None, f"the C compiler CC names ({cc}) was not found")


@needs_cc
def test_a_build_on_a_full_disk_says_the_disk_is_full(tmp_path, monkeypatch):
    """On a full disk (a 40 MB tmpfs) the notice named only the assembler's file: 'cc could not build them
    (/tmp/ccgBc2NT.s: Assembler messages:)'; its next line says 'No space left on device'. A compiler that fails as
    the assembler did there stands for the full disk."""
    cc = tmp_path / "cc-full"
    cc.write_text('#!/bin/sh\ncase " $* " in *" -c "*) echo "/tmp/cc1.s: Assembler messages:" >&2; '
                  'echo "/tmp/cc1.s: Fatal error: can\'t write 532 bytes to section .text of x.o: '
                  '\'No space left on device\'" >&2; exit 1;; esac\nexec cc "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.delenv(cpu_native.DISABLE_ENV, raising=False)
    monkeypatch.setattr(cpu_native, "sources", lambda: [_probe(tmp_path)])
    kernel, reason = cpu_native._load.__wrapped__()
    assert kernel is None
    assert reason == (f"the disk holding {tmp_path / 'kernels'} is full; free some space and start Parley again to "
                      "build them")


def test_the_switch_reads_off_as_people_write_it_and_a_blank_cache_folder_is_unset(monkeypatch):
    """PARLEY_CPU_KERNEL=off (or false, no) was read as on: only "0" switched the library off. A blank
    PARLEY_KERNEL_CACHE built it in a folder named " " wherever Parley ran."""
    monkeypatch.setattr(cpu_native.platform, "machine", lambda: "x86_64")
    for off in ("0", "off", "False", " no ", "OFF"):
        monkeypatch.setenv(cpu_native.DISABLE_ENV, off)
        assert not cpu_native._wanted() and cpu_native._load.__wrapped__() == (None, None), off
    for on in ("1", "", "on"):
        monkeypatch.setenv(cpu_native.DISABLE_ENV, on)
        assert cpu_native._wanted(), on
    monkeypatch.delenv("PARLEY_KERNEL_CACHE", raising=False)
    default = cpu_native.kernel_dir()
    monkeypatch.setenv("PARLEY_KERNEL_CACHE", " ")
    assert cpu_native.kernel_dir() == default and default.is_absolute()


@needs_cc
@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd: Linux")
def test_the_cached_library_cut_short_in_place_leaves_a_running_parley_alone(tmp_path, monkeypatch):
    """The library was loaded from the cached file itself: that file truncated while Parley ran (a sync tool, a
    restored backup) killed it with SIGBUS at its next kernel call. It is loaded from a copy in memory now."""
    monkeypatch.setattr(cpu_native, "sources", lambda: [_probe(tmp_path)])
    path = tmp_path / "parley-cpu-test.so"
    cpu_native.build_library("cc", path, ("-shared", "-fPIC"))
    lib = cpu_native.open_library(path)
    assert str(path) not in Path("/proc/self/maps").read_text()
    os.truncate(path, 0)
    assert lib.parley_probe() == 7
