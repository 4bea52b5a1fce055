"""Renders resources/icons/parley.svg to square PNGs (Linux icons; the macOS .iconset): make_icons.py OUT_DIR [SIZES]."""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import config  # noqa: E402


def render(out_dir: Path, sizes: list[int]) -> list[Path]:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([])
    renderer = QSvgRenderer(str(config.ICON_SVG))
    if not renderer.isValid():
        raise SystemExit(f"cannot read {config.ICON_SVG}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for size in sizes:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        path = out_dir / f"parley-{size}.png"
        if not image.save(str(path)):
            raise SystemExit(f"cannot write {path}")
        written.append(path)
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1])
    sizes = [int(s) for s in sys.argv[2:]] or [16, 32, 48, 64, 128, 256, 512, 1024]
    for p in render(out, sizes):
        print(p)
