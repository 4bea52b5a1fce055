"""Rendering, long chats, model import, About box and themes."""
from __future__ import annotations

import re
import time

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QDesktopServices, QGuiApplication

from app.core.markdown_render import link_tip
from tests.app.helpers import configure, wait_idle


def test_thousand_message_chat_opens_and_scrolls_smoothly(parley, qtbot):
    store, w = parley.store, parley.window
    conv = parley.service.new_conversation()
    parent = None
    for i in range(1000):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"Message {i}\n\n```python\nprint({i})\n```" if i % 10 == 1 else f"Message {i}: " + "word " * (i % 40)
        parent = store.add_message(conv, parent, role, text).id
    delegate = w.chat.view.delegate
    renders = delegate.renders
    start = time.perf_counter()
    w.open_chat(conv)
    qtbot.wait(1)
    opened = time.perf_counter() - start
    assert w.chat.view.model().rowCount() == 1000
    assert opened < 2.0, f"opening took {opened:.2f} s"
    assert delegate.renders - renders < 60  # only what is on screen
    bar = w.chat.view.verticalScrollBar()
    assert bar.value() == bar.maximum() > 0
    worst = 0.0
    for value in range(bar.maximum(), 0, -bar.maximum() // 20):
        t = time.perf_counter()
        bar.setValue(value)
        w.chat.view.viewport().repaint()
        worst = max(worst, time.perf_counter() - t)
    assert worst < 0.5, f"a scroll step took {worst * 1000:.0f} ms"


def test_sending_while_scrolled_up_scrolls_to_the_message_sent(parley, qtbot):
    store, w = parley.store, parley.window
    conv = w.current()
    parent = None
    for i in range(30):
        parent = store.add_message(conv, parent, "user" if i % 2 == 0 else "assistant", f"Message {i}: " + "word " * 80).id
    configure(parley, conv, max_tokens=3)
    w.open_chat(conv)
    qtbot.wait(20)
    bar = w.chat.view.verticalScrollBar()
    bar.setValue(bar.maximum() // 2)
    qtbot.keyClicks(w.chat.composer.edit, "one more")
    qtbot.keyClick(w.chat.composer.edit, Qt.Key.Key_Return)
    wait_idle(parley, qtbot, conv)
    qtbot.wait(20)
    assert bar.value() == bar.maximum() > 0, f"left at {bar.value()} of {bar.maximum()}"


def test_markdown_code_block_and_copy_link(parley, qtbot):
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "show code")
    answer = store.add_message(conv, user.id, "assistant", "Here:\n\n```python\ndef f(x):\n    return x\n```\n\n**done**")
    w.open_chat(conv)
    doc, blocks = w.chat.view.delegate.document(answer)
    assert blocks == ["def f(x):\n    return x\n"]
    assert "def f(x):" in doc.toPlainText() and "done" in doc.toPlainText()
    assert "```" not in doc.toPlainText()
    w.chat.view.activate(answer, "copy:0", blocks)
    assert QGuiApplication.clipboard().text() == blocks[0]
    w.chat.view.activate(answer, "copymsg:")
    assert QGuiApplication.clipboard().text() == answer.content


def test_a_single_newline_breaks_the_line(parley):
    """Verse, addresses and pasted lists break lines with one newline; CommonMark alone would join them."""
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "a haiku, please\nthree lines")
    answer = store.add_message(conv, user.id, "assistant", "Old pond\nfrog jumps in\nsound of water\n\n```\na\nb\n```")
    w.open_chat(conv)
    lines = [line.strip() for line in w.chat.view.delegate.document(user)[0].toPlainText().splitlines()]
    assert "a haiku, please" in lines and "three lines" in lines, lines
    doc, blocks = w.chat.view.delegate.document(answer)
    lines = [line.strip() for line in doc.toPlainText().splitlines()]
    start = lines.index("Old pond")
    assert lines[start:start + 3] == ["Old pond", "frog jumps in", "sound of water"], lines
    assert blocks == ["a\nb\n"]


def test_a_users_text_is_shown_as_typed(parley):
    """Pasted code keeps its indentation and `__init__` its underscores (as Markdown it was a bold "init" on one
    line); a fenced block in a user's message is still code, with its copy link."""
    store, w = parley.store, parley.window
    conv = w.current()
    pasted = "why?\nclass A:\n    def __init__(self):\n        return *args\n\n```python\nA()\n```"
    user = store.add_message(conv, None, "user", pasted)
    store.add_message(conv, user.id, "assistant", "**bold** and __init__")
    w.open_chat(conv)
    doc, blocks = w.chat.view.delegate.document(user)
    lines = doc.toPlainText().splitlines()
    assert "    def __init__(self):" in lines and "        return *args" in lines, lines
    assert blocks == ["A()\n"] and "```" not in doc.toPlainText()
    w.chat.view.activate(user, "copy:0", blocks)
    assert QGuiApplication.clipboard().text() == "A()\n"
    answer = store.path(conv)[-1]  # an answer is still Markdown
    assert w.chat.view.delegate.document(answer)[0].toPlainText().splitlines()[-1].strip() == "bold and init"


def test_links_open_in_the_browser_and_never_name_an_action(parley, monkeypatch):
    """A model's `[x](regen:)` must not regenerate when clicked; web links open in the browser, file links never."""
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "links?")
    answer = store.add_message(conv, user.id, "assistant",
                               "[again](regen:) [docs](https://example.org/a?b=1&c=2) [run](file:///bin/sh)")
    w.open_chat(conv)
    body, _ = w.chat.view.delegate.renderer.render(answer.content)
    # markdown-it leaves a file: link as text; were one to come through, `openable` refuses it below
    assert re.findall(r'href="([^"]*)"', body) == ["open:regen:", "open:https://example.org/a?b=1&amp;c=2"]
    opened, regenerated = [], []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    monkeypatch.setattr(w.chat.view.service, "regenerate", lambda *a, **k: regenerated.append(a))
    for href in ("open:regen:", "open:https://example.org/a?b=1&c=2", "open:file:///bin/sh"):
        w.chat.view.activate(answer, href)
    assert opened == ["https://example.org/a?b=1&c=2"] and regenerated == []
    menu = w.chat.view.show_actions(w.chat.view.chat_model.index(1, 0), w.chat.view.mapToGlobal(QPoint(5, 5)))
    opens = [a for a in menu.actions() if a.text().startswith("Open ")]  # keyboard users reach links by the menu
    assert [a.iconText() for a in opens] == ["Open https://example.org/a?b=1&c=2"]  # as shown: "&c" is no shortcut
    opens[0].trigger()
    menu.close()
    assert opened == ["https://example.org/a?b=1&c=2"] * 2 and regenerated == []
    assert link_tip("open:https://example.org/a") == "https://example.org/a"  # hovering shows where a link goes
    assert link_tip("open:regen:") == "regen: (only web and mail links open)" and link_tip("regen:") == ""


def test_raw_html_from_the_model_is_shown_not_run(parley):
    store, w = parley.store, parley.window
    conv = w.current()
    msg = store.add_message(conv, None, "user", "<b>bold?</b> <img src=x>")
    doc, _ = w.chat.view.delegate.document(msg)
    assert "<b>bold?</b>" in doc.toPlainText()


def test_queued_and_error_states_are_shown(parley, qtbot):
    w, service = parley.window, parley.service
    convs = [w.current()] + [w.new_chat() for _ in range(4)]  # 4 cache slots: the fifth chat queues
    for conv in convs:
        configure(parley, conv, temperature=0.0, max_tokens=12)
    seen, notes = set(), set()
    service.message_changed.connect(lambda _c, m: seen.add(parley.store.message(m).state))
    service.message_changed.connect(lambda _c, m: notes.add(parley.store.message(m).error))
    for conv in convs:
        w.open_chat(conv)
        w.chat.send("all at once")
    wait_idle(parley, qtbot, *convs)
    assert "queued" in seen
    assert "Queued: next in line" in notes and "Queued: 1 ahead" not in notes  # the one waiting had none ahead
    # A prompt too long for the 512-token context with overflow=stop comes back to the box, the chat as it was
    conv = convs[0]
    configure(parley, conv, overflow="stop")
    w.open_chat(conv)
    before = parley.store.path(conv)
    w.chat.send("word " * 600)
    wait_idle(parley, qtbot, conv)
    assert parley.store.path(conv) == before and "context" in service.refusal(conv).reason
    assert w.chat.composer.edit.toPlainText() == ("word " * 600).strip()
    # an error that ends a turn shows in its message
    answer = parley.store.add_message(conv, before[-1].id, "assistant", state="error")
    parley.store.update_message(answer.id, error="the model crashed")
    assert "Error: the model crashed" in w.chat.view.delegate.document(answer)[0].toPlainText()


def test_import_validates_models(parley, qtbot, tmp_path, corrupt_ggufs, tiny_models):
    models = parley.models
    failures = []
    models.import_failed.connect(lambda path, msg: failures.append(msg))
    try:
        models.import_path(tmp_path)
        raise AssertionError("an empty folder was accepted")
    except ValueError as exc:
        assert "neither" in str(exc)
    bad = corrupt_ggufs["unsupported_tensor_type"]  # passes the header check, fails the engine's load
    models.import_path(bad)
    qtbot.waitUntil(lambda: bool(failures), timeout=30_000)
    assert models.registry.get(str(bad.resolve())) is None
    assert parley.window.last_warning.isVisible() and "Import failed" in parley.window.last_warning.windowTitle()
    parley.window.last_warning.close()
    key = models.import_path(tiny_models["gemma3"].hf_dir)
    qtbot.waitUntil(lambda: models.registry.get(key) is not None, timeout=60_000)
    assert models.registry.get(key).kind == "hf"
    assert list(parley.store.models) == [key]  # the registry is kept in parley.db
    assert parley.window.chat.picker.findData(key) >= 0


def test_about_box_names_the_gemma_terms(parley):
    from app.qt.about import about_html

    html = about_html(parley.models)
    assert "Gemma 3 270M is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms" in html


def test_themes_switch_and_persist(parley):
    from PySide6.QtGui import QPalette

    w = parley.window
    w._save_theme("dark")
    assert w.dark and QGuiApplication.palette().color(QPalette.ColorRole.Base).lightness() < 80
    assert w.chat.view.delegate.renderer.dark
    w._save_theme("light")
    assert not w.dark
    assert '"theme": "light"' in (parley.paths.data / "settings.json").read_text()


def test_model_list_describes_each_model(parley, qtbot, imported_llama, tiny_models):
    w = parley.window
    qtbot.waitUntil(lambda: getattr(parley.models.state(imported_llama), "own_context", None) is not None)
    w.shortcuts["Ctrl+Shift+M"].trigger()
    dialog = w.models_dialog
    rows = {r[0]: r for r in dialog.rows()}
    llama = parley.models.registry.get(imported_llama).name
    default = parley.models.registry.get("default").name
    size = tiny_models["llama"].gguf_path.stat().st_size
    assert rows[llama][1:5] == ["loaded", "llama", rows[llama][3], "512 of 512"] and rows[llama][3] != "—"
    assert rows[llama][5] == f"{size / 1e6:.1f} MB" and rows[llama][6].endswith("MB")
    assert rows[default][1] == "loaded" and rows[default][2] == "qwen3"
    dialog.table.setCurrentItem(dialog.table.topLevelItem(0))
    assert not dialog.remove_button.isEnabled()  # the embedded model stays
    conv = w.chat.conv_id
    configure(parley, conv, model=imported_llama)  # a chat on the model about to go
    dialog.table.setCurrentItem(dialog.table.topLevelItem(1))
    dialog.remove_button.click()
    assert parley.models.registry.get(imported_llama) is None and w.chat.picker.findData(imported_llama) < 0
    assert dialog.table.topLevelItemCount() == 1
    # its chat moves to the embedded model, the one its picker now names, and the removed model is unloaded
    assert parley.store.get(conv).settings.model == "default" == w.chat.picker.key()
    assert parley.models.state(imported_llama) is None and "1 chat moved to" in w.statusBar().currentMessage()
    dialog.close()


def test_unloading_a_model_frees_it_and_a_chat_loads_it_again(parley, qtbot):
    """Models ▸ Unload: the engine drops the model; the chat's next message loads it again and is answered."""
    from tests.app.helpers import configure, wait_idle

    w, models = parley.window, parley.models
    conv = w.current()
    configure(parley, conv, temperature=0.0, max_tokens=2)
    w.chat.send("first")
    wait_idle(parley, qtbot, conv)
    old_id = models.model_id("default")
    w.shortcuts["Ctrl+Shift+M"].trigger()
    dialog = w.models_dialog
    dialog.table.setCurrentItem(dialog.table.topLevelItem(0))
    assert dialog.unload_button.isEnabled()
    dialog.unload_button.click()
    assert models.model_id("default") is None and dialog.rows()[0][1] == "not loaded"
    qtbot.waitUntil(lambda: old_id not in parley.bridge.engine.inspect()["models"], timeout=30_000)
    dialog.close()
    w.chat.send("second")
    qtbot.waitUntil(lambda: models.model_id("default") is not None, timeout=60_000)
    wait_idle(parley, qtbot, conv)
    answer = parley.store.path(conv)[-1]
    assert answer.role == "assistant" and answer.stats and answer.stats.get("reason") == "length"


def test_a_model_chosen_to_draft_drafts_for_models_loaded_later_and_is_remembered(parley, qtbot):
    """Models ▸ Draft with it: the engine's next loads draft with that model; the choice is kept in the settings
    and the list says which model drafts; Stop drafting goes back to drafting from the prompt."""
    w, models = parley.window, parley.models
    w.shortcuts["Ctrl+Shift+M"].trigger()
    dialog = w.models_dialog
    dialog.table.setCurrentItem(dialog.table.topLevelItem(0))
    key = dialog._selected()
    dialog.draft_button.click()
    engine = parley.bridge.engine
    qtbot.waitUntil(lambda: engine.config.speculative == "draft", timeout=10_000)
    assert engine.config.draft_model is not None and models.draft_key == key
    assert dialog.rows()[0][1].endswith(" · drafts for models loaded from now on")
    assert dialog.draft_button.text() == "Stop drafting with it"
    assert parley.settings.draft_model == key
    dialog.draft_button.click()
    qtbot.waitUntil(lambda: engine.config.speculative == "auto", timeout=10_000)
    assert engine.config.draft_model is None and parley.settings.draft_model == ""
    dialog.close()


def test_the_models_list_says_which_model_drafts_for_which(parley, qtbot, tiny_models_q8):
    """The drafter's row said 'drafts for the others': neither which models nor that those loaded before keep theirs."""
    from app.qt.models_dialog import ModelsDialog

    models = parley.models
    drafter = models.import_path(tiny_models_q8["qwen3"].gguf_path)  # the same tokenizer as the chat model
    qtbot.waitUntil(lambda: models.model_id(drafter) is not None, timeout=60_000)
    models.unload(drafter)
    models.use_as_draft(drafter)
    models.unload("default")
    models.ensure("default")
    qtbot.waitUntil(lambda: models.model_id("default") is not None, timeout=60_000)
    dialog = ModelsDialog(models)
    qtbot.addWidget(dialog)
    rows = {row[0]: row[1] for row in dialog.rows()}
    chat, draft = models.registry.default.name, models.registry.get(drafter).name
    assert rows[chat] == f"loaded · drafted by {draft}"
    assert rows[draft] == f"not loaded · drafts for {chat} and for models loaded from now on"
    models.use_as_draft(None)  # the loaded model keeps its drafter until it loads again
    rows = {row[0]: row[1] for row in dialog.rows()}
    assert rows[chat] == f"loaded · drafted by {draft}" and rows[draft] == "not loaded"
    item = dialog.table.topLevelItem(0)
    assert item.toolTip(1) == item.text(1)  # the whole status, where the column is narrow


def test_a_dflash_drafter_file_drafts_for_models_loaded_later_and_is_remembered(parley, qtbot, tmp_path, monkeypatch):
    """Models ▸ DFlash drafter…: a drafter file makes the next loads draft with it (speculative dflash), the dialog
    says so and the choice is kept; a file that is not a drafter is refused with a message; Stop goes back."""
    from PySide6.QtWidgets import QMessageBox

    from engine.speculative.dflash_net import DFlashConfig, DFlashNet, save

    w, models, engine = parley.window, parley.models, parley.bridge.engine
    w.shortcuts["Ctrl+Shift+M"].trigger()
    dialog = w.models_dialog
    warned = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *args: warned.append(args[2]))
    other = tmp_path / "weights.safetensors"
    other.write_bytes(b"\x00" * 32)
    assert not dialog.choose_dflash(str(other)) and "is not a DFlash drafter" in warned[0]
    assert engine.config.speculative != "dflash"
    path = tmp_path / "drafter.safetensors"
    save(DFlashNet(DFlashConfig(hidden=64, vocab=256, taps=(0,))), path)
    assert dialog.choose_dflash(str(path))
    qtbot.waitUntil(lambda: engine.config.speculative == "dflash", timeout=10_000)
    assert engine.config.draft_model == path and models.dflash_file() == str(path)
    assert dialog.dflash_button.text() == "Stop DFlash drafting" and "drafter.safetensors" in dialog.dflash_label.text()
    assert parley.settings.draft_model == f"dflash:{path}"
    dialog.dflash_button.click()
    qtbot.waitUntil(lambda: engine.config.speculative == "auto", timeout=10_000)
    assert parley.settings.draft_model == "" and dialog.dflash_button.text() == "DFlash drafter…"
    dialog.close()


def test_a_narrow_status_line_ends_in_an_ellipsis_and_keeps_it_all_in_its_tooltip(qtbot):
    from app.core.live import ChatStatus
    from app.qt.status_line import StatusLine

    line = StatusLine()
    qtbot.addWidget(line)
    line.resize(200, 30)  # too narrow even for "streaming · 41.5 tok/s"
    line.show()
    line.show_status(ChatStatus(model="A model with a rather long name", state="streaming", tokens_per_s=41.5,
                                context_used=70, context_limit=4096))
    full = line.text.full_text()
    assert "TTFT …" in full and line.text.toolTip() == full
    assert line.text.text() != full and line.text.text().endswith("…")  # elided, not clipped mid-word
    line.resize(1400, 30)
    qtbot.waitUntil(lambda: line.text.text() == full)


def test_at_800_px_with_the_live_panel_the_status_line_keeps_the_state_and_figures(parley, qtbot):
    """It read "Gemma 3 …" there: the state, tok/s and TTFT were cut for the model's name (the picker shows it)."""
    import time

    from app.core.live import ChatStatus

    w = parley.window
    w.resize(800, 600)
    w.live_panel.show()
    line = w.chat.status
    name = "Gemma 3 270M (embedded, base model)"
    line.show_status(ChatStatus(model=name, state="streaming", tokens_per_s=20.8, ttft_s=0.09, context_used=103,
                                context_limit=4096, since=time.perf_counter()))
    qtbot.waitUntil(lambda: line.text.text() == "streaming · 20.8 tok/s")  # once the layout gave the caption's room
    assert not line.caption.isVisible()  # TTFT goes before the state and tok/s
    assert line.text.toolTip() == line.text.full_text() and name in line.text.full_text()
    line.show_status(ChatStatus(model=name, state="idle", tokens_per_s=20.9, ttft_s=0.106, context_used=150,
                                context_limit=4096))
    assert line.text.text() == "20.9 tok/s · TTFT 106 ms" and w.width() == 800
    w.live_panel.hide()  # the room back: the name (shortened) and the caption with it
    qtbot.waitUntil(lambda: line.text.text().startswith("Gemma") and line.caption.isVisible())
    assert line.text.text().endswith("20.9 tok/s  ·  TTFT 106 ms")


def test_links_the_chat_would_refuse_while_it_answers_are_not_shown(parley, monkeypatch):
    """Regenerate showed in a message while its chat answered, and clicking it did nothing (the service refuses)."""
    store, w = parley.store, parley.window
    conv = w.current()
    user = store.add_message(conv, None, "user", "hello")
    answer = store.add_message(conv, user.id, "assistant", "hi")
    w.open_chat(conv)
    assert 'href="regen:"' in w.chat.view.delegate.document(answer)[0].toHtml()
    monkeypatch.setattr(parley.service, "busy", lambda conv_id: conv_id == conv)
    assert 'href="regen:"' not in w.chat.view.delegate.document(answer)[0].toHtml()
    monkeypatch.undo()
    assert 'href="regen:"' in w.chat.view.delegate.document(answer)[0].toHtml()


def test_a_load_s_shorter_lines_name_its_stage_and_seconds_once():
    """A first run's kernel build, in a narrow status line: the shorter lines read "loading: Building Parley's CPU
    kernels (once for this computer) · loading · 0 …", the word twice and the seconds cut off; now the stage and its
    seconds, the word once."""
    import time

    from app.core.live import ChatStatus
    from app.qt.status_line import shorter

    stage = "loading: Building Parley's CPU kernels (once for this computer)"
    status = ChatStatus(model="Gemma 3 270m", state="loading", since=time.perf_counter() - 12)
    lines = [text for text, _ in shorter(status, stage)[1:]]
    assert lines[-1].startswith(f"{stage} · 12 s"), lines  # the shortest: the stage, its seconds (then "TTFT …")
    assert all(text.count("loading") == 1 and "12 s" in text for text in lines), lines


def test_a_narrow_status_line_shortens_a_long_model_name_before_its_figures(qtbot):
    from app.core.live import ChatStatus
    from app.qt.status_line import StatusLine

    line = StatusLine()
    qtbot.addWidget(line)
    line.resize(520, 30)
    line.show()
    name = "bartowski/Meta-Llama-3.1-8B-Instruct-abliterated-GGUF Q4_K_M (imatrix, 2024-08)"
    line.show_status(ChatStatus(model=name, state="done", tokens_per_s=41.5, ttft_s=0.25, context_used=70,
                                context_limit=4096))
    shown = line.text.text()
    assert "41.5 tok/s" in shown and "TTFT 250 ms" in shown
    assert "…" in shown and shown.startswith("bartowski") and name not in shown
    assert line.text.toolTip() == line.text.full_text()
    line.resize(1600, 30)
    qtbot.waitUntil(lambda: line.text.text() == line.text.full_text())
