"""The per-chat status line: model, tokens/s, time to first token, and the context meter (used / limit)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from PySide6.QtCore import QCoreApplication, QObject, QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app.core.live import ChatStatus
from app.qt.elided_label import ElidedLabel

TICKING = ("loading", "queued", "prefilling")  # phases with no other movement: the seconds count up
TICK_MS = 1000
TICK_SLACK_MS = 20  # just past the second: a timer may fire a little early, and "0.99 s" reads "0 s"


def tr(text: str) -> str:
    return QCoreApplication.translate("StatusLine", text)


class StatusLine(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        # a narrow window shortens the line (its tooltip has it all); a name cut to a few letters gives way entirely
        self.text = ElidedLabel(objectName="statusText", least_head="MMMM…")
        self.text.setAccessibleName(tr("Chat status"))
        self.text.setMinimumWidth(80)
        self.meter = QProgressBar(objectName="contextMeter")
        self.meter.setMaximumHeight(max(14, self.meter.fontMetrics().height()))  # slim, but a large font's figures whole
        self.meter.setTextVisible(True)
        self.meter.setAccessibleName(tr("Context used"))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.addWidget(self.text, 1)
        self.caption = QLabel(tr("Context"))
        layout.addWidget(self.caption)
        layout.addWidget(self.meter)
        self._shown: tuple[ChatStatus, str] = (ChatStatus(), "")
        self.capacity: tuple[int, int | None] = (0, None)  # the engine's chats at once and tokens per chat
        self._ticker = SecondsTicker(self._tick, self)
        self.show_status(ChatStatus())

    def show_status(self, s: ChatStatus, loading: str = "") -> None:
        self._shown = (s, loading)
        limit = max(1, s.context_limit)
        self.meter.setRange(0, limit)
        self.meter.setValue(min(s.context_used, limit))
        self.meter.setFormat(f"{s.context_used:,} / {s.context_limit:,}" if s.context_limit else "—")
        self._describe(s, loading)
        dropped = tr("; %1 oldest messages left out").replace("%1", str(s.dropped_messages)) if s.dropped_messages else ""
        self.meter.setToolTip(tr("This chat's share of the context window") + dropped + self._why_limit(s.context_limit))
        self._ticker.follow(s)

    def _tick(self) -> None:
        self._describe(*self._shown)
        self._ticker.follow(self._shown[0])

    def _describe(self, s: ChatStatus, loading: str) -> None:
        """A narrow line shortens the model's name, then drops the least useful parts (at 800 px with the Live panel it
        read "Gemma 3 …", the state and figures hidden)."""
        lines = shorter(s, loading)
        self.text.setText(describe(s, loading), shorter=lines)  # the full line whole, else the shorter ones
        self._fit(lines)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._fit(shorter(*self._shown))

    def _fit(self, lines: list[tuple[str, int]]) -> None:
        """The meter wide enough for its figures (a large font or a long context), else 110–220 px. Where the state
        and figures would not fit beside them, the "Context" caption goes (the meter's tooltip and accessible name say
        it) and the meter takes only its figures' width."""
        need = self.meter.fontMetrics().horizontalAdvance(self.meter.text()) + 16
        essential = lines[-2][0] if len(lines) > 1 else ""  # the phase in a word and the figures
        spacing = self.layout().spacing()
        room = self.contentsRect().width() - 8 - max(110, need) - self.caption.sizeHint().width() - 2 * spacing
        narrow = room < self.text.fontMetrics().horizontalAdvance(essential)  # 8: the layout's margins
        self.caption.setVisible(not narrow)
        self.meter.setMinimumWidth(need if narrow else max(110, need))
        self.meter.setMaximumWidth(need if narrow else max(220, need))

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


class SecondsTicker(QTimer):
    """Calls back just after each whole second of a phase that counts them ("queued · 3 s"). A plain 1 s timer
    started with the phase fired a few ms early, at 0.99 s, so the line read "0 s" for two seconds."""

    def __init__(self, callback, parent: QObject):
        super().__init__(parent, singleShot=True)
        self.timeout.connect(callback)

    def follow(self, s: ChatStatus) -> None:
        """Armed for the next second while `s` counts them, else stopped."""
        if s.state not in TICKING or s.since is None:
            self.stop()
            return
        elapsed_ms = (time.perf_counter() - s.since) * 1000
        self.start(int(TICK_MS - elapsed_ms % TICK_MS) + TICK_SLACK_MS)


SEPARATOR = "  ·  "
TIGHT = " · "  # a narrow line's


@dataclass(slots=True)
class Parts:
    """The line's parts, by what a narrow line gives up first: extras, the model's name (the picker shows it), the
    phase's words, TTFT; the state and tok/s stay longest."""

    name: str
    doing: list[str]  # the model's load, then what the turn is doing
    figures: list[str]  # tok/s and TTFT, "—" where there are none
    known: list[str]  # of those, the ones with something to say ("TTFT …" while busy)
    extras: list[str]  # tokens/step, the cached prompt


def describe(s: ChatStatus, loading: str = "") -> str:
    p = parts(s, loading)
    return SEPARATOR.join([p.name, *p.doing, *p.figures, *p.extras])


def shorter(s: ChatStatus, loading: str = "") -> list[tuple[str, int]]:
    """The line shorter and shorter, as (text, head: the model's name's length, shortened in the middle first)."""
    p, brief = parts(s, loading), parts(s, loading, brief=True)
    named = [(SEPARATOR.join([p.name, *p.doing, *p.known]), len(p.name))]
    lines = (p.doing + p.known, brief.doing + p.known, brief.doing + p.known[:1])
    return named + [(TIGHT.join(line), 0) for line in lines if line]  # without the name, closer together


def parts(s: ChatStatus, loading: str = "", brief: bool = False) -> Parts:
    busy = s.state in TICKING or s.state == "streaming"
    extras = []
    if s.tokens_per_step and s.tokens_per_step > 1.005 and not busy:  # drafts the model accepted saved steps
        extras.append(tr("%1 tokens/step").replace("%1", f"{s.tokens_per_step:.2f}"))
    reused = s.prompt_tokens - s.prefilled_tokens
    if s.ttft_s is not None and s.prompt_tokens and reused > 0:  # the prefix cache saved this turn's prefill
        extras.append(tr("%1 of %2 prompt tokens cached").replace("%1", f"{reused:,}").replace("%2", f"{s.prompt_tokens:,}"))
    speed = f"{s.tokens_per_s:.1f} tok/s" if s.tokens_per_s else "— tok/s"
    ttft = f"TTFT {s.ttft_s * 1000:.0f} ms" if s.ttft_s is not None else "TTFT …" if busy else "TTFT —"
    known = [f for f, has in ((speed, bool(s.tokens_per_s)), (ttft, s.ttft_s is not None or busy)) if has]
    if brief and loading and s.state == "loading":  # the load's stage and its seconds: "loading" said once
        doing = [loading + _seconds(s)]
    else:
        doing = [d for d in (loading, phase(s, brief)) if d]
    return Parts(model_label(s), doing, [speed, ttft], known, extras)


def model_label(s: ChatStatus) -> str:
    return s.model or tr("model not loaded yet")


def _seconds(s: ChatStatus) -> str:
    return f" · {int(time.perf_counter() - s.since)} s" if s.since is not None else ""


def phase(s: ChatStatus, brief: bool = False) -> str:
    """What a busy chat is doing, with the seconds it has been at it: "reading the prompt (812 tokens) · 4 s"; `brief`
    in a word, for a narrow column: "reading · 4 s"."""
    waited = _seconds(s)
    if s.state == "prefilling":
        size = tr(" (%1 tokens)").replace("%1", f"{s.context_used:,}") if s.context_used else ""
        return (tr("reading") if brief else tr("reading the prompt") + size) + waited
    if s.state == "queued":
        return tr("queued") + waited
    if s.state == "loading":
        return (tr("loading") if brief else tr("waiting for the model")) + waited
    return tr("streaming") if s.state == "streaming" else ""
