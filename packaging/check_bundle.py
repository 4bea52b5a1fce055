"""A new user's first session with an unpacked Linux bundle, beyond the window's --self-test: the CLI (a chat template,
the CPU kernels built at first use with the system's compiler, the fallback without one), the server with a JSON
schema (uvicorn, the grammar engine) and, where dpkg is, the .deb's Depends against what the bundle's Qt loads.
Each runs the bundle under a bare environment (PATH, HOME, QT_QPA_PLATFORM only), as build_linux.sh's self-test does.

    python packaging/check_bundle.py dist/Parley/Parley --data-dir DIR   (DIR: one that already holds the model)
"""
from __future__ import annotations

import argparse
import json
import selectors
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import config

TIMEOUT_S = 300
CORE_QT = ("libQt6Gui.so.6", "libQt6Widgets.so.6", "libQt6XcbQpa.so.6", "PySide6/Qt/plugins/platforms/libqxcb.so")
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "ld-linux-x86-64.so.2")
CC_RECORDER = '#!/bin/sh\nprintf "%s\\n" "${LD_LIBRARY_PATH-}" >>"$0.seen"\nexec cc "$@"\n'


def bare_env(data_dir: Path, scratch: Path, path: str = "/usr/bin:/bin", **extra: str) -> dict[str, str]:
    """The environment of a fresh login's launcher: a new HOME, the given PATH, offscreen Qt, the data folder."""
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": path, "HOME": str(home), "QT_QPA_PLATFORM": "offscreen", "PARLEY_HOME": str(data_dir), **extra}


def generate(bundle: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    out = subprocess.run([str(bundle), "generate", "--prompt", "hi", "--max-tokens", "4", "--json"], env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    if out.returncode != 0 or json.loads(out.stdout.splitlines()[0])["completion_tokens"] < 1:
        raise SystemExit(f"generate failed ({out.returncode}): {out.stderr[-2000:]}")
    return out


def check_kernel_build(bundle: Path, data_dir: Path, scratch: Path) -> str:
    """The kernels' C sources ship, the compiler is found and runs without the bundle's libraries, the cache is
    writable: a library is built in a fresh cache folder."""
    cc = scratch / "cc"
    cc.write_text(CC_RECORDER)
    cc.chmod(0o755)
    cache = scratch / "kernels"
    out = generate(bundle, bare_env(data_dir, scratch, CC=str(cc), PARLEY_KERNEL_CACHE=str(cache)))
    built = [p.name for p in cache.glob("*.so")]
    if not built and "lacks" not in out.stderr:  # a CPU without AVX2/FMA/F16C builds none: not the bundle's fault
        raise SystemExit(f"the CPU kernels did not build in the bundle: {out.stderr[-2000:]}")
    seen = Path(f"{cc}.seen").read_text().splitlines() if Path(f"{cc}.seen").exists() else []
    leaked = [line for line in seen if str(bundle.parent) in line]
    if leaked:
        raise SystemExit(f"the compiler ran with the bundle's libraries first: LD_LIBRARY_PATH={leaked[0]}")
    return f"kernels built: {built}, compiler runs: {len(seen)}"


def check_no_compiler(bundle: Path, data_dir: Path, scratch: Path) -> str:
    empty = scratch / "bin"
    empty.mkdir()
    out = generate(bundle, bare_env(data_dir, scratch, path=str(empty), PARLEY_KERNEL_CACHE=str(scratch / "nocc")))
    return "without a compiler: " + (out.stderr.strip().splitlines() or ["(no message)"])[0]


def _listening_url(proc: subprocess.Popen, deadline: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    seen = []
    while time.monotonic() < deadline and sel.select(deadline - time.monotonic()):
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "listening on " in line:
            return line.split("listening on ", 1)[1].strip()
    raise SystemExit(f"serve did not start: {''.join(seen)[-2000:]}")


def _wait_until_accepting(url: str, deadline: float) -> None:
    # server/run.py names the socket once bound; uvicorn calls listen() on it a moment later
    while True:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=10).close()
            return
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def check_serve(bundle: Path, data_dir: Path, scratch: Path) -> str:
    """`serve` on a free port, one chat completion held to a JSON schema (uvicorn's modules, the grammar engine)."""
    proc = subprocess.Popen([str(bundle), "serve", "--port", "0"], env=bare_env(data_dir, scratch),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = _listening_url(proc, time.monotonic() + TIMEOUT_S)
        _wait_until_accepting(url, time.monotonic() + 60)
        schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        body = {"model": "default", "messages": [{"role": "user", "content": "A name as JSON"}], "max_tokens": 8,
                "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}
        request = urllib.request.Request(f"{url}/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            content = json.load(response)["choices"][0]["message"]["content"]
        if not content.lstrip().startswith("{"):
            raise SystemExit(f"the JSON schema did not hold the answer: {content!r}")
        return f"serve: {url}, a JSON-schema answer {content[:40]!r}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def missing_depends(internal: Path) -> list[str]:
    """Packages that provide a library the bundle's core Qt needs but neither ships nor names in its Depends."""
    needed = set()
    for lib in CORE_QT:
        dynamic = subprocess.run(["readelf", "-d", str(internal / lib)], capture_output=True, text=True).stdout
        needed |= {line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line}
    system = sorted(name for name in needed - set(GLIBC) if not (internal / name).exists())
    found = subprocess.run(["dpkg", "-S", *(f"*/{name}" for name in system)], capture_output=True, text=True).stdout
    owners = {line.split(":", 1)[0] for line in found.splitlines()}
    owners |= {soname_package(name) for name in system if name not in found}  # not installed on this machine
    return sorted(owners - {dep.split()[0] for dep in config.DEB_DEPENDS})


def soname_package(name: str) -> str:
    """Debian's name for the package of a library not installed here: libxcb-icccm.so.4 -> libxcb-icccm4."""
    stem, _, number = name.partition(".so.")
    number = number.split(".")[0]
    return (f"{stem}-{number}" if stem[-1].isdigit() else stem + number).lower()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="the unpacked bundle's Parley executable")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--no-depends", action="store_true", help="skip the .deb's Depends (no dpkg here)")
    args = parser.parse_args()
    bundle = args.bundle.resolve()
    checks = [check_kernel_build, check_no_compiler, check_serve]
    for check in checks:
        with tempfile.TemporaryDirectory() as scratch:
            t0 = time.monotonic()
            print(f"{check.__name__}: {check(bundle, args.data_dir, Path(scratch))} ({time.monotonic() - t0:.0f} s)")
    if not args.no_depends:
        missing = missing_depends(bundle.parent / "_internal")
        if missing:
            raise SystemExit(f"the .deb's Depends lack {missing} (packaging/config.py DEB_DEPENDS)")
        print("deb depends: every system library of the bundle's Qt is named")
    print("bundle checks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
