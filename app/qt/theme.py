"""Light and dark themes: a Fusion palette, a style sheet from resources/, and SVG icons tinted to match."""
from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QByteArray, QRect, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QGuiApplication, QIcon, QIconEngine, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleFactory

THEMES = ("system", "light", "dark")


def resource_dirs() -> list[Path]:
    """Where resources/ may be: beside the package (a checkout, an editable install, the PyInstaller
    bundle), or under the environment's share/ (a wheel install, which takes it as data files)."""
    return [Path(__file__).resolve().parents[2] / "resources", Path(sys.prefix) / "share" / "parley" / "resources"]


def find_resources() -> Path:
    for folder in resource_dirs():
        if (folder / "light.qss").is_file():
            return folder
    raise FileNotFoundError(f"Parley's resources (style sheets, icons) are missing; looked in "
                            f"{', '.join(map(str, resource_dirs()))}. Reinstall Parley.")


RESOURCES = find_resources()
ICON_METRICS = (QStyle.PixelMetric.PM_SmallIconSize, QStyle.PixelMetric.PM_ButtonIconSize,
                QStyle.PixelMetric.PM_ToolBarIconSize)
ICON_PER_LINE = 16 / 17  # Fusion's 16-px icons beside a 10-pt font's 17-px line

_COLORS = {
    False: {"window": "#f7f7f9", "base": "#ffffff", "alt": "#f0f1f4", "text": "#1f2328", "button": "#eceef2",
            "highlight": "#3b82f6", "link": "#2563eb", "mid": "#c9ced6", "placeholder": "#8a9099"},
    True: {"window": "#1f2127", "base": "#1b1d22", "alt": "#23262d", "text": "#e6e7ea", "button": "#2b2f37",
           "highlight": "#3b82f6", "link": "#7cb4ff", "mid": "#3a3f4a", "placeholder": "#7b818c"},
}


def is_dark(mode: str) -> bool:
    """`mode` is system, light or dark; system follows the platform's colour scheme."""
    if mode == "dark":
        return True
    if mode == "light":
        return False
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def apply_theme(app: QApplication, mode: str) -> bool:
    dark = is_dark(mode)
    app.setStyle(fusion_for(app.font()))
    app.setPalette(palette(dark))
    app.setStyleSheet((RESOURCES / ("dark.qss" if dark else "light.qss")).read_text(encoding="utf-8"))
    return dark


def fusion_for(font: QFont) -> QStyle:
    """Fusion, through FontScaledStyle only where `font`'s lines grow its icons: Qt asks a style hundreds of pixel
    metrics a layout, and each one a Python style answers waits for the GIL that a streaming engine holds (a settings
    dialog and a chat switch beside three streaming chats: 107 ms, 47 ms with Fusion's own)."""
    fusion = QStyleFactory.create("Fusion")
    if round(QFontMetrics(font).height() * ICON_PER_LINE) <= min(fusion.pixelMetric(m) for m in ICON_METRICS):
        return fusion
    return FontScaledStyle(fusion)


class FontScaledStyle(QProxyStyle):
    """Fusion whose icons grow with the font: under a 20-pt font they stayed 16 px beside 31-px lines of text."""

    def pixelMetric(self, metric, option=None, widget=None) -> int:  # noqa: N802 - Qt's name
        size = super().pixelMetric(metric, option, widget)
        if metric not in ICON_METRICS:
            return size
        font = widget.font() if widget is not None else QApplication.font()
        return max(size, round(QFontMetrics(font).height() * ICON_PER_LINE))


def palette(dark: bool) -> QPalette:
    c = {k: QColor(v) for k, v in _COLORS[dark].items()}
    p = QPalette()
    R = QPalette.ColorRole
    for role, key in [(R.Window, "window"), (R.Base, "base"), (R.AlternateBase, "alt"), (R.Text, "text"),
                      (R.WindowText, "text"), (R.ButtonText, "text"), (R.Button, "button"), (R.Highlight, "highlight"),
                      (R.Link, "link"), (R.Mid, "mid"), (R.PlaceholderText, "placeholder"), (R.ToolTipBase, "base"),
                      (R.ToolTipText, "text")]:
        p.setColor(role, c[key])
    p.setColor(R.HighlightedText, QColor("#ffffff"))
    for role in (R.Text, R.WindowText, R.ButtonText):  # set for every group above: a greyed field read as open
        p.setColor(QPalette.ColorGroup.Disabled, role, c["placeholder"])
    return p


def icon(name: str, color: QColor | str | None = None) -> QIcon:
    """An icon from resources/icons, its `currentColor` painted in `color`, or else in the palette's text colour
    at the time it is drawn (a theme switched at runtime recolours every icon already on screen)."""
    svg = (RESOURCES / "icons" / f"{name}.svg").read_text(encoding="utf-8")
    return QIcon(TintedSvgEngine(svg, QColor(color) if color is not None else None))


class TintedSvgEngine(QIconEngine):
    """Draws an SVG whose `currentColor` is a fixed colour or the application palette's text colour."""

    def __init__(self, svg: str, color: QColor | None = None):
        super().__init__()
        self._svg, self._color = svg, color
        self._cache: dict[tuple[str, int, int], QPixmap] = {}

    def color(self, mode: QIcon.Mode = QIcon.Mode.Normal) -> QColor:
        if self._color is not None:
            return self._color
        group = QPalette.ColorGroup.Disabled if mode == QIcon.Mode.Disabled else QPalette.ColorGroup.Active
        return QGuiApplication.palette().color(group, QPalette.ColorRole.WindowText)

    def paint(self, painter: QPainter, rect: QRect, mode: QIcon.Mode, state: QIcon.State) -> None:
        painter.drawPixmap(rect, self.pixmap(rect.size(), mode, state))

    def pixmap(self, size: QSize, mode: QIcon.Mode, state: QIcon.State) -> QPixmap:
        color = self.color(mode).name(QColor.NameFormat.HexArgb)
        key = (color, size.width(), size.height())
        if key not in self._cache:
            renderer = QSvgRenderer(QByteArray(self._svg.replace("currentColor", self.color(mode).name()).encode()))
            pixmap = QPixmap(size)
            pixmap.fill(Qt.GlobalColor.transparent)
            painter = QPainter(pixmap)
            renderer.render(painter)
            painter.end()
            self._cache[key] = pixmap
        return self._cache[key]

    def clone(self) -> QIconEngine:
        return TintedSvgEngine(self._svg, self._color)
