"""The per-chat status line: model, tokens/s, time to first token, and the context meter (used / limit)."""
from __future__ import annotations

import time

from PySide6.QtCore import QCoreApplication, QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app.core.live import ChatStatus
from app.qt.elided_label import ElidedLabel

TICKING = ("loading", "queued", "prefilling")  # phases with no other movement: the seconds count up
TICK_MS = 1000


def tr(text: str) -> str:
    return QCoreApplication.translate("StatusLine", text)


class StatusLine(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.text = ElidedLabel(objectName="statusText")  # a narrow window elides the line (its tooltip has it all)
        self.text.setAccessibleName(tr("Chat status"))
        self.text.setMinimumWidth(80)
        self.meter = QProgressBar(objectName="contextMeter")
        self.meter.setMaximumHeight(max(14, self.meter.fontMetrics().height()))  # slim, but a large font's figures whole
        self.meter.setTextVisible(True)
        self.meter.setAccessibleName(tr("Context used"))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.addWidget(self.text, 1)
        layout.addWidget(QLabel(tr("Context")))
        layout.addWidget(self.meter)
        self._shown: tuple[ChatStatus, str] = (ChatStatus(), "")
        self.capacity: tuple[int, int | None] = (0, None)  # the engine's chats at once and tokens per chat
        self._ticker = QTimer(self, interval=TICK_MS)
        self._ticker.timeout.connect(lambda: self._describe(*self._shown))
        self.show_status(ChatStatus())

    def show_status(self, s: ChatStatus, loading: str = "") -> None:
        self._shown = (s, loading)
        self._describe(s, loading)
        limit = max(1, s.context_limit)
        self.meter.setRange(0, limit)
        self.meter.setValue(min(s.context_used, limit))
        self.meter.setFormat(f"{s.context_used:,} / {s.context_limit:,}" if s.context_limit else "—")
        self._fit_meter()
        dropped = tr("; %1 oldest messages left out").replace("%1", str(s.dropped_messages)) if s.dropped_messages else ""
        self.meter.setToolTip(tr("This chat's share of the context window") + dropped + self._why_limit(s.context_limit))
        if s.state in TICKING and not self._ticker.isActive():
            self._ticker.start()
        elif s.state not in TICKING:
            self._ticker.stop()

    def _describe(self, s: ChatStatus, loading: str) -> None:
        """A narrow line shortens the model's name before the figures after it (a long name hid tok/s and TTFT)."""
        self.text.setText(describe(s, loading), head=len(model_label(s)))

    def _fit_meter(self) -> None:
        """Wide enough for its figures (a large font or a long context), else 110–220 px."""
        need = self.meter.fontMetrics().horizontalAdvance(self.meter.text()) + 16
        self.meter.setMinimumWidth(max(110, need))
        self.meter.setMaximumWidth(max(220, need))

    def _why_limit(self, limit: int) -> str:
        """Why a chat holds `limit` tokens (the terminal chat holds more: it has the memory to itself)."""
        sessions, per_chat = self.capacity
        if not limit or not sessions:
            return ""
        if per_chat is not None and limit >= per_chat:
            return "\n" + tr("Each chat holds up to %1 tokens: Parley keeps room for %2 chats answering at once. "
                             "`parley chat` holds one conversation, so it allows more.").replace(
                "%1", f"{limit:,}").replace("%2", str(sessions))
        return "\n" + tr("Up to %1 tokens: the model's own context length.").replace("%1", f"{limit:,}")


def describe(s: ChatStatus, loading: str = "") -> str:
    parts = [model_label(s)]
    if loading:
        parts.append(loading)
    doing = phase(s)
    if doing:
        parts.append(doing)
    parts.append(f"{s.tokens_per_s:.1f} tok/s" if s.tokens_per_s else "— tok/s")
    busy = s.state in TICKING or s.state == "streaming"
    parts.append(f"TTFT {s.ttft_s * 1000:.0f} ms" if s.ttft_s is not None else "TTFT …" if busy else "TTFT —")
    if s.tokens_per_step and s.tokens_per_step > 1.005 and not busy:  # drafts the model accepted saved steps
        parts.append(tr("%1 tokens/step").replace("%1", f"{s.tokens_per_step:.2f}"))
    reused = s.prompt_tokens - s.prefilled_tokens
    if s.ttft_s is not None and s.prompt_tokens and reused > 0:  # the prefix cache saved this turn's prefill
        parts.append(tr("%1 of %2 prompt tokens cached").replace("%1", f"{reused:,}").replace("%2", f"{s.prompt_tokens:,}"))
    return "  ·  ".join(parts)


def model_label(s: ChatStatus) -> str:
    return s.model or tr("model not loaded yet")


def phase(s: ChatStatus, brief: bool = False) -> str:
    """What a busy chat is doing, with the seconds it has been at it: "reading the prompt (812 tokens) · 4 s"; `brief`
    in a word, for a narrow column: "reading · 4 s"."""
    waited = f" · {int(time.perf_counter() - s.since)} s" if s.since is not None else ""
    if s.state == "prefilling":
        size = tr(" (%1 tokens)").replace("%1", f"{s.context_used:,}") if s.context_used else ""
        return (tr("reading") if brief else tr("reading the prompt") + size) + waited
    if s.state == "queued":
        return tr("queued") + waited
    if s.state == "loading":
        return (tr("loading") if brief else tr("waiting for the model")) + waited
    return tr("streaming") if s.state == "streaming" else ""
