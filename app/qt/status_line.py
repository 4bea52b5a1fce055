"""The per-chat status line: model, tokens/s, time to first token, and the context meter (used / limit)."""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app.core.live import ChatStatus


class StatusLine(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.text = QLabel(objectName="statusText")
        self.meter = QProgressBar(objectName="contextMeter")
        self.meter.setFixedWidth(220)
        self.meter.setTextVisible(True)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.addWidget(self.text, 1)
        layout.addWidget(QLabel("Context"))
        layout.addWidget(self.meter)
        self.show_status(ChatStatus())

    def show_status(self, s: ChatStatus, loading: str = "") -> None:
        self.text.setText(describe(s, loading))
        limit = max(1, s.context_limit)
        self.meter.setRange(0, limit)
        self.meter.setValue(min(s.context_used, limit))
        self.meter.setFormat(f"{s.context_used:,} / {s.context_limit:,}" if s.context_limit else "—")
        dropped = f"; {s.dropped_messages} oldest messages left out" if s.dropped_messages else ""
        self.meter.setToolTip(f"This chat's share of the context window{dropped}")


def describe(s: ChatStatus, loading: str = "") -> str:
    parts = [s.model or "no model yet"]
    if loading:
        parts.append(loading)
    if s.state in ("queued", "streaming"):
        parts.append(s.state)
    parts.append(f"{s.tokens_per_s:.1f} tok/s" if s.tokens_per_s else "— tok/s")
    parts.append(f"TTFT {s.ttft_s * 1000:.0f} ms" if s.ttft_s is not None else "TTFT —")
    return "  ·  ".join(parts)
