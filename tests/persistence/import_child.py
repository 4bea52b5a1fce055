"""The process the import-kill test kills: the window's import (`PersistenceUI.import_from`) of FILE into the chat
database DB, run on the event loop as in the app (`python -m tests.persistence.import_child DB FILE`)."""
from __future__ import annotations

import os
import sys
import types

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QApplication, QMainWindow  # noqa: E402

from app.core.sqlite_store import SqliteConversationStore  # noqa: E402
from app.qt.persist_ui import PersistenceUI  # noqa: E402


def main(db: str, file: str) -> None:
    app = QApplication([])
    store = SqliteConversationStore(db)
    window = QMainWindow()
    service = types.SimpleNamespace(store=store, conversations_changed=types.SimpleNamespace(emit=lambda: None))
    ui = PersistenceUI(window, service)
    ui.import_from(file, lambda ids: app.quit())
    app.exec()
    store.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
