#!/usr/bin/env bash
# Builds Parley.app and Parley-VERSION-macOS-ARCH.dmg with PyInstaller on macOS, and optionally signs,
# notarises and staples them. Run on the architecture you ship (arm64 bundles include MLX).
#
#   packaging/build_macos.sh                 build dist/Parley.app + the .dmg, run the bundle's --self-test
#   packaging/build_macos.sh --dry-run       print every command instead of running it (works on Linux too)
#
# Signing (skipped unless set):
#   PARLEY_CODESIGN_IDENTITY   "Developer ID Application: Name (TEAMID)"
# Notarisation (skipped unless signing and one of these is set):
#   PARLEY_NOTARY_PROFILE      a keychain profile made with `xcrun notarytool store-credentials`
#   or PARLEY_APPLE_ID + PARLEY_TEAM_ID + PARLEY_APP_PASSWORD (an app-specific password)
# Options: --dry-run, --skip-build, --no-self-test, --python PY
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0 BUILD=1 SELFTEST=1
PY="${PYTHON:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --skip-build) BUILD=0 ;;
        --no-self-test) SELFTEST=0 ;;
        --python) PY="$2"; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "build_macos.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi

# run CMD...: prints the command (shell-quoted); runs it unless --dry-run.
run() {
    printf '+'; printf ' %q' "$@"; printf '\n'
    if [ "$DRY" = 0 ]; then "$@"; fi
}

if [ "$DRY" = 0 ] && [ "$(uname -s)" != Darwin ]; then
    echo "build_macos.sh: needs macOS (hdiutil, codesign, iconutil); try --dry-run" >&2
    exit 1
fi

cd "$ROOT"
VERSION="$("$PY" -c 'import sys; sys.path.insert(0, "packaging"); import config; print(config.version())')"
ARCH="$(uname -m)"
DIST="$ROOT/dist"
WORK="$ROOT/build/packaging"
APP="$DIST/Parley.app"
DMG="$DIST/Parley-$VERSION-macOS-$ARCH.dmg"
ICONSET="$WORK/Parley.iconset"
ICNS="$WORK/Parley.icns"
ENTITLEMENTS="$ROOT/packaging/macos/entitlements.plist"
IDENTITY="${PARLEY_CODESIGN_IDENTITY:-}"
t0=$(date +%s)

# 1. Icon (.icns from the SVG) and the .app.
if [ "$BUILD" = 1 ]; then
    run mkdir -p "$ICONSET"
    run "$PY" packaging/make_icons.py "$WORK/icons" 16 32 64 128 256 512 1024
    for s in 16 32 128 256 512; do
        run cp "$WORK/icons/parley-$s.png" "$ICONSET/icon_${s}x${s}.png"
        run cp "$WORK/icons/parley-$((s * 2)).png" "$ICONSET/icon_${s}x${s}@2x.png"
    done
    run iconutil -c icns "$ICONSET" -o "$ICNS"
    run env PARLEY_ICON="$ICNS" PARLEY_BUILD_DIR="$WORK" "$PY" -m PyInstaller --noconfirm --log-level WARN \
        --workpath "$WORK/pyinstaller" --distpath "$DIST" packaging/parley.spec
fi

# 2. Headless check of the bundle (a temp data dir, offscreen Qt, no venv on PATH).
if [ "$SELFTEST" = 1 ]; then
    if [ "$DRY" = 1 ]; then TMP=/tmp/parley-selftest.XXXXXX; else TMP="$(mktemp -d)"; fi
    run env -i HOME="$TMP" QT_QPA_PLATFORM=offscreen "$APP/Contents/MacOS/Parley" --data-dir "$TMP/data" --self-test
fi

# 3. Sign inside out with the hardened runtime: nested libraries first, then the app.
if [ -n "$IDENTITY" ]; then
    if [ "$DRY" = 0 ]; then
        find "$APP/Contents" -type f \( -name '*.dylib' -o -name '*.so' \) -print0 |
            xargs -0 codesign --force --timestamp --options runtime --sign "$IDENTITY"
    else
        echo "+ find $APP/Contents -type f ( -name '*.dylib' -o -name '*.so' ) -print0 | xargs -0 codesign --force --timestamp --options runtime --sign \"\$PARLEY_CODESIGN_IDENTITY\""
    fi
    run codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" --sign "$IDENTITY" \
        "$APP/Contents/MacOS/Parley"
    run codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" --sign "$IDENTITY" "$APP"
    run codesign --verify --deep --strict --verbose=2 "$APP"
else
    echo "PARLEY_CODESIGN_IDENTITY not set: the app is not signed (Gatekeeper will ask; right-click > Open)"
fi

# 4. The disk image: the app plus a link to /Applications.
STAGE="$WORK/dmg"
run rm -rf "$STAGE" "$DMG"
run mkdir -p "$STAGE"
run cp -R "$APP" "$STAGE/"
run ln -s /Applications "$STAGE/Applications"
run hdiutil create -volname "Parley $VERSION" -srcfolder "$STAGE" -fs HFS+ -format UDZO -ov "$DMG"
if [ -n "$IDENTITY" ]; then
    run codesign --force --timestamp --sign "$IDENTITY" "$DMG"
fi

# 5. Notarise and staple (needs a signed app).
if [ -n "$IDENTITY" ] && [ -n "${PARLEY_NOTARY_PROFILE:-}" ]; then
    run xcrun notarytool submit "$DMG" --keychain-profile "$PARLEY_NOTARY_PROFILE" --wait
elif [ -n "$IDENTITY" ] && [ -n "${PARLEY_APPLE_ID:-}" ]; then
    run xcrun notarytool submit "$DMG" --apple-id "$PARLEY_APPLE_ID" --team-id "${PARLEY_TEAM_ID:?set PARLEY_TEAM_ID}" \
        --password "${PARLEY_APP_PASSWORD:?set PARLEY_APP_PASSWORD}" --wait
else
    echo "notarisation skipped (needs PARLEY_CODESIGN_IDENTITY and PARLEY_NOTARY_PROFILE or PARLEY_APPLE_ID)"
    IDENTITY=""
fi
if [ -n "$IDENTITY" ]; then
    run xcrun stapler staple "$DMG"
    run xcrun stapler validate "$DMG"
    run spctl --assess --type open --context context:primary-signature --verbose "$DMG"
fi

if [ "$DRY" = 0 ]; then
    echo "== Parley $VERSION (macOS $ARCH) in $(( $(date +%s) - t0 )) s"
    echo "app: $(du -sh "$APP" | cut -f1) ($APP)"
    echo "dmg: $(du -h "$DMG" | cut -f1) ($DMG)"
fi
