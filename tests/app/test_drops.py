"""Files dropped on the window: models and chat exports are imported, documents go into the message box."""
from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.core import export
from app.core.conversations import ConversationStore
from app.core.dropped import kind_of


def _drop(target, paths: list[Path]) -> bool:
    """A drag of `paths` from a file manager entering `target` and dropped there; whether the drop was taken."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    mime.setText("\n".join(QUrl.fromLocalFile(str(p)).toString() for p in paths))  # as file managers add
    point, action = QPointF(10, 10), Qt.DropAction.CopyAction
    buttons, keys = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(point.toPoint(), action, mime, buttons, keys)
    QApplication.sendEvent(target, enter)
    drop = QDropEvent(point, action, mime, buttons, keys)
    QApplication.sendEvent(target, drop)
    return enter.isAccepted() and drop.isAccepted()


def test_a_gguf_dropped_on_the_window_is_imported(parley, qtbot, tiny_models):
    path = tiny_models["llama"].gguf_path
    assert _drop(parley.window, [path])
    qtbot.waitUntil(lambda: any(e.path == str(path) for e in parley.models.registry.entries()), timeout=60_000)


def test_a_chat_export_dropped_on_the_window_is_imported(parley, qtbot, tmp_path):
    source = ConversationStore()
    conv = source.create("Dropped in")
    source.add_message(conv.id, None, "user", "hello from elsewhere")
    path = tmp_path / "chats.json"
    path.write_text(export.export_json(source), encoding="utf-8")
    before = len(parley.store.conversations())
    assert _drop(parley.window, [path])
    qtbot.waitUntil(lambda: not parley.extra["persistence"].busy(), timeout=10_000)  # read and added off the GUI thread
    titles = [c.title for c in parley.store.conversations()]
    assert len(titles) == before + 1 and "Dropped in" in titles


def test_a_document_dropped_on_the_message_box_goes_in_as_its_text(parley, qtbot, tmp_path):
    doc = tmp_path / "notes.py"
    doc.write_text("def area(r):\r\n    return 3.14 * r * r\r\n", encoding="utf-8")
    edit = parley.window.chat.composer.edit
    edit.setPlainText("Explain: ")
    edit.moveCursor(edit.textCursor().MoveOperation.End)
    assert _drop(edit.viewport(), [doc])
    # the file's text, not its path (the box's own drop inserted 'file:///…/notes.py')
    assert edit.toPlainText() == "Explain: def area(r):\n    return 3.14 * r * r\n"


def test_a_file_that_is_not_text_is_refused_in_one_line_and_the_box_kept(parley, qtbot, tmp_path):
    blob = tmp_path / "photo.jpg"
    blob.write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)))
    edit = parley.window.chat.composer.edit
    edit.setPlainText("draft")
    assert _drop(parley.window, [blob])
    assert edit.toPlainText() == "draft"
    assert "photo.jpg is not a text file" in parley.window.last_warning.text()


def test_text_dragged_into_the_message_box_is_left_to_the_box(parley):
    mime = QMimeData()
    mime.setText("just words")
    edit = parley.window.chat.composer.edit
    drop = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    assert parley.extra["drops"].eventFilter(edit.viewport(), drop) is False


def test_what_a_dropped_file_is(tmp_path, tiny_models):
    plain_json = tmp_path / "data.json"
    plain_json.write_text(json.dumps({"format": "something-else"}), encoding="utf-8")
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nNot an export.\n", encoding="utf-8")
    store = ConversationStore()
    store.add_message(store.create("A chat").id, None, "user", "hi")
    exported = tmp_path / "chat.md"
    exported.write_text(export.export_markdown(store), encoding="utf-8")
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(json.loads(export.export_json(store)), separators=(",", ":")), encoding="utf-8")
    assert [kind_of(p) for p in (plain_json, notes, exported, compact, tiny_models["llama"].gguf_path, tmp_path)] == \
        ["text", "text", "chats", "chats", "model", "model"]


def test_a_file_copied_in_a_file_manager_and_pasted_gives_its_text(parley, tmp_path):
    doc = tmp_path / "todo.txt"
    doc.write_text("buy milk\n", encoding="utf-8")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(doc))])
    mime.setText(QUrl.fromLocalFile(str(doc)).toString())
    QApplication.clipboard().setMimeData(mime)
    try:
        edit = parley.window.compare.composer.edit
        edit.clear()
        edit.paste()
        assert edit.toPlainText() == "buy milk\n"
    finally:
        QApplication.clipboard().clear()  # mime data the clipboard still held at exit crashed the process (rc 139)
