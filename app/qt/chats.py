"""QtChatService: the app's logic (app/core/chats.py) with Qt signals, so a view's connections end with the view."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.core.chat_settings import ChatSettings
from app.core.chats import ChatService
from app.core.conversations import ConversationStore
from app.qt.bridge import EngineBridge
from app.qt.model_manager import ModelManager


class QtChatService(ChatService, QObject):
    conversations_changed = Signal()
    path_changed = Signal(int)
    message_changed = Signal(int, int)
    status_changed = Signal(int)
    turn_done = Signal(int, int)
    draft_changed = Signal(int)
    settings_changed = Signal(int)
    refused = Signal(int)

    def __init__(self, store: ConversationStore, bridge: EngineBridge, models: ModelManager,
                 defaults: ChatSettings | None = None, parent: QObject | None = None):
        QObject.__init__(self, parent)
        ChatService.__init__(self, store, bridge, models, defaults)
