#!/usr/bin/env bash
# Builds the Linux bundle of Parley with PyInstaller and checks it:
#   dist/Parley/                               onedir bundle (also an AppDir: AppRun, parley.desktop, parley.png)
#   dist/Parley-VERSION-linux-ARCH.tar.gz      relocatable tarball of that folder
#   dist/parley_VERSION_ARCH.deb               installs to /opt/parley, `parley` on PATH, menu entry + icon
#   dist/Parley-VERSION-ARCH.AppImage          only when appimagetool is found ($APPIMAGETOOL or PATH)
# then unpacks the tarball into an empty temp dir and runs its `--self-test` offscreen under `env -i`
# (no virtual environment, no PYTHONPATH, only the system's libraries), then a user's first session with it
# (packaging/check_bundle.py: the CLI, the CPU kernels' build and fallback, the server, the .deb's Depends), and
# prints sizes and times.
# Options: --skip-build (reuse dist/Parley), --no-deb, --no-tarball, --no-self-test, --python PY
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
BUILD=1 DEB=1 TARBALL=1 SELFTEST=1
while [ $# -gt 0 ]; do
    case "$1" in
        --skip-build) BUILD=0 ;;
        --no-deb) DEB=0 ;;
        --no-tarball) TARBALL=0 ;;
        --no-self-test) SELFTEST=0 ;;
        --python) PY="$2"; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "build_linux.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi

cd "$ROOT"
config() { "$PY" -c "import sys; sys.path.insert(0, 'packaging'); import config; print($1)"; }
VERSION="$(config 'config.version()')"
ARCH="$(uname -m)"
DEB_ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
DIST="$ROOT/dist"
WORK="$ROOT/build/packaging"
APPDIR="$DIST/Parley"
mkdir -p "$DIST" "$WORK"
t0=$(date +%s)

# 1. Icons and the PyInstaller onedir bundle.
if [ "$BUILD" = 1 ]; then
    "$PY" -c 'import PyInstaller' 2>/dev/null || { echo "PyInstaller is missing: pip install -e '.[package]'" >&2; exit 1; }
    "$PY" packaging/make_icons.py "$WORK/icons" 16 32 48 64 128 256 512 >/dev/null
    PARLEY_BUILD_DIR="$WORK" \
        "$PY" -m PyInstaller --noconfirm --log-level WARN \
        --workpath "$WORK/pyinstaller" --distpath "$DIST" packaging/parley.spec
    # AppDir furniture: launcher, desktop entry, icon.
    install -m 755 packaging/linux/AppRun "$APPDIR/AppRun"
    sed -e "s/@EXEC@/Parley/" -e "s/@VERSION@/$VERSION/" packaging/linux/parley.desktop.in >"$APPDIR/parley.desktop"
    cp "$WORK/icons/parley-256.png" "$APPDIR/parley.png"
    ln -sfn parley.png "$APPDIR/.DirIcon"
fi
[ -x "$APPDIR/Parley" ] || { echo "no bundle at $APPDIR (build it first)" >&2; exit 1; }
t_build=$(( $(date +%s) - t0 ))
"$APPDIR/Parley" --version

# 2. Relocatable tarball.
TARBALL_PATH="$DIST/Parley-$VERSION-linux-$ARCH.tar.gz"
t1=$(date +%s)
if [ "$TARBALL" = 1 ]; then
    if command -v pigz >/dev/null; then GZ="pigz -6"; else GZ="gzip -6"; fi
    tar -C "$DIST" -I "$GZ" -cf "$TARBALL_PATH" Parley
fi
t_tar=$(( $(date +%s) - t1 ))

# 3. Debian package: /opt/parley, /usr/bin/parley, menu entry, hicolor icons.
DEB_PATH="$DIST/parley_${VERSION}_${DEB_ARCH}.deb"
t1=$(date +%s)
if [ "$DEB" = 1 ]; then
    if command -v dpkg-deb >/dev/null; then
        STAGE="$WORK/deb/parley_${VERSION}_${DEB_ARCH}"
        rm -rf "$STAGE"
        mkdir -p "$STAGE/DEBIAN" "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications"
        cp -al "$APPDIR" "$STAGE/opt/parley" 2>/dev/null || cp -a "$APPDIR" "$STAGE/opt/parley"
        rm -f "$STAGE/opt/parley/AppRun" "$STAGE/opt/parley/.DirIcon" "$STAGE/opt/parley/parley.desktop"
        ln -s /opt/parley/Parley "$STAGE/usr/bin/parley"
        sed -e "s|@EXEC@|/opt/parley/Parley|" -e "s/@VERSION@/$VERSION/" packaging/linux/parley.desktop.in \
            | grep -v '^X-AppImage' >"$STAGE/usr/share/applications/parley.desktop"
        for s in 16 32 48 64 128 256 512; do
            if [ -f "$WORK/icons/parley-$s.png" ]; then
                install -D -m 644 "$WORK/icons/parley-$s.png" "$STAGE/usr/share/icons/hicolor/${s}x${s}/apps/parley.png"
            fi
        done
        install -D -m 644 resources/icons/parley.svg "$STAGE/usr/share/icons/hicolor/scalable/apps/parley.svg"
        SIZE_KB=$(du -sk "$STAGE" | cut -f1)
        cat >"$STAGE/DEBIAN/control" <<CONTROL
Package: parley
Version: $VERSION
Architecture: $DEB_ARCH
Maintainer: Parley developers <parley@localhost>
Installed-Size: $SIZE_KB
Depends: $(config '", ".join(config.DEB_DEPENDS)')
Recommends: $(config '", ".join(config.DEB_RECOMMENDS)')
Section: utils
Priority: optional
Description: Desktop chat app for local language models
 Parley batches every live conversation into one forward per step. Ships the
 embedded Gemma 3 270M model (Gemma Terms of Use: ai.google.dev/gemma/terms).
CONTROL
        dpkg-deb --root-owner-group -Zgzip -z6 --build "$STAGE" "$DEB_PATH" >/dev/null
    else
        echo "dpkg-deb not found: no .deb" >&2; DEB=0
    fi
fi
t_deb=$(( $(date +%s) - t1 ))

# 4. AppImage, if appimagetool is at hand (it is not on PyPI or in Debian; without FUSE it runs extracted).
APPIMAGE_PATH=""
TOOL="${APPIMAGETOOL:-$(command -v appimagetool || command -v appimagetool-x86_64.AppImage || true)}"
if [ -n "$TOOL" ]; then
    APPIMAGE_PATH="$DIST/Parley-$VERSION-$ARCH.AppImage"
    APPIMAGE_EXTRACT_AND_RUN=1 ARCH="$ARCH" "$TOOL" --no-appstream "$APPDIR" "$APPIMAGE_PATH"
else
    echo "appimagetool not found (set APPIMAGETOOL=...): no AppImage; dist/Parley is a ready AppDir"
fi

# 5. Self-test of the shipped artifact from a clean directory, without the venv or the user's environment.
if [ "$SELFTEST" = 1 ]; then
    TMP="$(mktemp -d)"
    trap 'rm -rf "$TMP"' EXIT
    if [ "$TARBALL" = 1 ]; then
        tar -C "$TMP" -xzf "$TARBALL_PATH"; FROM="unpacked tarball"
    else
        cp -a "$APPDIR" "$TMP/Parley"; FROM="copied bundle"
    fi
    mkdir -p "$TMP/home"
    t1=$(date +%s)
    (cd "$TMP" && env -i HOME="$TMP/home" QT_QPA_PLATFORM=offscreen PATH=/usr/bin:/bin \
        ./Parley/Parley --data-dir "$TMP/home/data" --self-test)
    echo "self-test (clean env, $FROM): ok in $(( $(date +%s) - t1 )) s"
    if [ "$DEB" = 1 ]; then DEPENDS_ARG=(); else DEPENDS_ARG=(--no-depends); fi
    "$PY" packaging/check_bundle.py "$TMP/Parley/Parley" --data-dir "$TMP/home/data" "${DEPENDS_ARG[@]}"
fi

echo "== Parley $VERSION ($ARCH)"
echo "build: ${t_build} s (PyInstaller), tarball: ${t_tar} s, deb: ${t_deb} s, total: $(( $(date +%s) - t0 )) s"
echo "bundle: $(du -sh "$APPDIR" | cut -f1) unpacked ($APPDIR)"
[ "$TARBALL" = 1 ] && echo "tarball: $(du -h "$TARBALL_PATH" | cut -f1) ($TARBALL_PATH)"
[ "$DEB" = 1 ] && echo "deb: $(du -h "$DEB_PATH" | cut -f1) ($DEB_PATH)"
[ -n "$APPIMAGE_PATH" ] && echo "appimage: $(du -h "$APPIMAGE_PATH" | cut -f1) ($APPIMAGE_PATH)"
exit 0
