"""ChatService: the app's logic. Each turn hands the engine the branch the user is on (the store owns the
conversation; the engine only reuses the tokens its cache holds), and engine events land in the store.

Views call its methods and listen to its signals; they never see the engine or its events. No Qt here: the
bridge and the model manager are passed in (anything with their signals), and the Qt layer subclasses this
with Qt signals (app/qt/chats.py) so that views' connections end with the views.
"""
from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Callable

from app.core.chat_settings import ChatSettings
from app.core.conversations import ConversationStore, Message, failed_unanswered
from app.core.live import ChatStatus, LiveChat, Refusal, TurnInfo, can_continue, engine_messages
from app.core.signals import Signal
from engine.errors import ContextOverflowError
from engine.sampling import MAX_INT32, SamplingParams

TITLE_CHARS = 48
NEW_TITLE = "New chat"  # a chat's title until its first message names it
AGAIN = "loads it again"  # the unload notes' end, said of the model that answered (message_html retargets it)
MODEL_GONE = f"The model was unloaded before it answered. Retry {AGAIN}."
UNLOADED_MID_ANSWER = f"the model was unloaded while it answered; Continue or Regenerate {AGAIN}"


class ChatService:
    conversations_changed = Signal()  # added, removed, renamed, pinned, reordered
    path_changed = Signal(int)  # conversation: the branch shown changed (messages added or switched)
    message_changed = Signal(int, int)  # conversation, message: text or state changed
    status_changed = Signal(int)  # conversation: the status line changed
    turn_done = Signal(int, int)  # conversation, assistant message: finished, stopped or failed
    draft_changed = Signal(int)  # conversation: its draft was changed by the service (a queued message came back)
    settings_changed = Signal(int)  # conversation: its model or sampling settings changed
    refused = Signal(int)  # conversation: the engine refused the message just sent; refusal(conv) says why

    def __init__(self, store: ConversationStore, bridge, models, defaults: ChatSettings | None = None):
        """`bridge`: engine events as signals plus `.engine`; `models`: the model manager (app/qt)."""
        self.store, self.bridge, self.models = store, bridge, models
        self.defaults = defaults or ChatSettings()
        self._live: dict[int, LiveChat] = {}
        self._by_session: dict[int, int] = {}  # engine session -> conversation
        self._drafts: dict[int, str] = {}  # what the user has typed but not sent, per chat
        self._edits: dict[int, tuple[int, str]] = {}  # per chat: the earlier message being edited, the edit's text
        self._trash: list[int] = []  # deleted from view, kept until the undo window closes (empty_trash)
        bridge.turn_started.connect(self._on_started)
        bridge.turn_queued.connect(self._on_queued)
        bridge.text_arrived.connect(self._on_text)
        bridge.turn_finished.connect(self._on_finished)
        bridge.turn_failed.connect(self._on_failed)
        bridge.context_usage.connect(self._on_context)
        models.loaded.connect(self._on_model_loaded)
        models.failed.connect(self._on_model_failed)

    # -- conversations
    def new_conversation(self, settings: ChatSettings | None = None, hidden: bool = False,
                         title: str = NEW_TITLE) -> int:
        conv = self.store.create(title, (settings or self.defaults).copy(), hidden=hidden)
        self._live[conv.id] = LiveChat(conv.id)
        self.models.ensure(conv.settings.model)  # warm the model while the user types
        if not hidden:
            self.conversations_changed.emit()
        return conv.id

    def rename(self, conv_id: int, title: str) -> None:
        self.store.update(conv_id, title=title.strip() or "Untitled")
        self.conversations_changed.emit()

    def set_pinned(self, conv_id: int, pinned: bool) -> None:
        self.store.update(conv_id, pinned=pinned)
        self.conversations_changed.emit()

    def promote(self, conv_id: int, touch: bool = True) -> None:
        """A compare column becomes a normal chat in the sidebar, session and history included; `touch`
        puts it at the top of the list (as the chat just used)."""
        self.store.update(conv_id, hidden=False, **({"updated_at": time.time()} if touch else {}))
        self.conversations_changed.emit()

    def delete(self, conv_id: int) -> None:
        live = self._live.pop(conv_id, None)
        if live is not None and live.session_id is not None:
            self.bridge.engine.close(live.session_id)
            self._by_session.pop(live.session_id, None)
        self._drafts.pop(conv_id, None)
        self._edits.pop(conv_id, None)
        hidden = self.store.get(conv_id).hidden
        self.store.delete(conv_id)
        if not hidden:
            self.conversations_changed.emit()

    # -- deleting with undo: a trashed chat leaves the list at once and is deleted for good later
    def trash(self, conv_id: int) -> None:
        self.stop(conv_id)
        self._trash.append(conv_id)
        self.conversations_changed.emit()

    def restore(self) -> int | None:
        """Brings back the chat trashed last; its id, or None when there is none."""
        while self._trash:
            conv_id = self._trash.pop()
            if self.store.has(conv_id):
                self.conversations_changed.emit()
                return conv_id
        return None

    def trashed(self, conv_id: int) -> bool:
        return conv_id in self._trash

    def in_trash(self) -> list[int]:
        return list(self._trash)

    def empty_trash(self) -> None:
        gone, self._trash = self._trash, []
        for conv_id in gone:
            if self.store.has(conv_id):
                self.delete(conv_id)

    def visible(self, text: str = "", hits: set[int] | None = None) -> list:
        """The sidebar's chats: matching `text` (title or messages), trashed ones left out. `hits`: the chats whose
        messages hold `text` as another thread found them (message_search(text)); the store searches them itself
        without."""
        found = self.store.search(text) if hits is None else self.store.search_with(text, hits)
        if not self._trash:  # as it mostly is: the list as found, not walked again (0.4 ms at 20,000 chats)
            return found
        trash = set(self._trash)
        return [c for c in found if c.id not in trash]

    def message_search(self, text: str) -> Callable[[Callable[[], bool]], set[int]] | None:
        """The `hits` of visible(text) as another thread can find them (given whether they are no longer wanted), or
        None for a store that cannot tell: visible(text) then searches on the calling thread."""
        search = getattr(self.store, "message_search", None)
        return search(text) if search is not None else None

    def untouched(self, conv_id: int) -> bool:
        """A listed chat as New chat made it: no message, title, settings, pin or draft of the user's, nothing running
        (one left for another is not worth keeping)."""
        conv, live = self.store.get(conv_id), self._live.get(conv_id)
        if conv.hidden or conv.pinned or conv.title != NEW_TITLE or conv.settings != self.defaults:
            return False
        if self.draft(conv_id) or live is not None and (live.busy or live.queued or live.refused):
            return False
        return not self.store.children(conv_id, None)

    def refusal(self, conv_id: int) -> Refusal | None:
        return self.live(conv_id).refused

    def dismiss_refusal(self, conv_id: int) -> None:
        self.live(conv_id).refused = None
        self.status_changed.emit(conv_id)

    # -- an earlier message being edited: its text stays with its chat until it is sent or given up
    def open_edit(self, conv_id: int) -> tuple[int, str] | None:
        """(message, text) of the chat's edit in progress; None when there is none (or its message is gone)."""
        edit = self._edits.get(conv_id)
        return edit if edit is not None and self.store.has_message(edit[0]) else None

    def keep_edit(self, conv_id: int, msg_id: int, text: str) -> None:
        self._edits[conv_id] = (msg_id, text)

    def drop_edit(self, conv_id: int) -> None:
        self._edits.pop(conv_id, None)

    def live(self, conv_id: int) -> LiveChat:
        return self._live.setdefault(conv_id, LiveChat(conv_id))

    def live_chats(self) -> list[int]:
        """Chats answering or waiting to (queued, loading their model), oldest turn first."""
        running = [(live.turn.submitted_at, cid) for cid, live in self._live.items()
                   if live.busy and self.store.has(cid)]
        return [cid for _t, cid in sorted(running)]

    def busy(self, conv_id: int) -> bool:
        return self.live(conv_id).busy

    def status(self, conv_id: int) -> ChatStatus:
        """While a turn runs: its live figures. Otherwise: those of the answer on screen (the version shown)."""
        live = self.live(conv_id)
        if live.busy:
            if live.live_rate() is not None:
                live.status.tokens_per_s = live.live_rate()
            return live.status
        if not self.store.has(conv_id):
            return live.status
        return self._as_listed(conv_id, _shown_status(self.store.path(conv_id), live.status))

    def _as_listed(self, conv_id: int, shown: ChatStatus) -> ChatStatus:
        """An answer saved before answers were named as the model list names them has its file's own name ("qwen3"
        beside "qwen3-f32.gguf" in the picker): named as listed where that model is known."""
        listed = self.model_names(conv_id, shown.model)[0]
        return replace(shown, model=listed) if listed != shown.model else shown

    def model_names(self, conv_id: int, saved: str) -> tuple[str, str]:
        """(`saved`, an answer's model name, as the model list names it where known; the chat's model as listed): the
        one wrote the answer, the other answers Retry, Continue and Regenerate."""
        key = self.store.get(conv_id).settings.model
        entry = self.models.registry.get(key)
        return self.models.listed(saved, key), entry.name if entry is not None else key

    # -- drafts and queued messages
    def draft(self, conv_id: int) -> str:
        return self._drafts.get(conv_id, "")

    def set_draft(self, conv_id: int, text: str) -> None:
        if text:
            self._drafts[conv_id] = text
        else:
            self._drafts.pop(conv_id, None)

    def drafts(self) -> dict[int, str]:
        """Every chat's unsent text, queued messages included (what a restart should give back); edits: edits()."""
        out = dict(self._drafts)
        for conv_id in (c for c, live in self._live.items() if live.queued):
            if self.store.has(conv_id):
                out[conv_id] = "\n\n".join([*self.queued(conv_id), out.get(conv_id, "")]).strip()
        return {c: t for c, t in out.items() if self.store.has(c) and t}

    def restore_drafts(self, drafts: dict[int, str]) -> None:
        for conv_id, text in drafts.items():
            if self.store.has(conv_id):
                self.set_draft(conv_id, text)

    def edits(self) -> dict[int, tuple[int, str]]:
        """Every chat's edit in progress, (message, text): a restart opens it again as the edit (it came back as
        plain text in the box, the message no longer marked, Cancel gone)."""
        return {c: edit for c in self._edits if self.store.has(c) and (edit := self.open_edit(c)) is not None}

    def restore_edits(self, edits: dict[int, tuple[int, str]]) -> None:
        """`edits` as edits() gave them; one whose chat or message is gone (or is not that chat's) is dropped."""
        for conv_id, (msg_id, text) in edits.items():
            if self.store.has(conv_id) and self.store.has_message(msg_id):
                msg = self.store.message(msg_id)
                if msg.conversation_id == conv_id and msg.role == "user":
                    self.keep_edit(conv_id, msg_id, text)

    def queued(self, conv_id: int) -> list[str]:
        return list(self.live(conv_id).queued)

    def send_or_queue(self, conv_id: int, text: str) -> bool:
        """Sends now, or, while the chat answers, queues the message to go when the answer is done."""
        if not text.strip():
            return False
        if not self.busy(conv_id):
            return self.send(conv_id, text)
        self.live(conv_id).queued.append(text.strip())
        self.status_changed.emit(conv_id)
        return True

    def unqueue(self, conv_id: int) -> None:
        """Queued messages go back into the chat's draft, nothing lost."""
        live = self.live(conv_id)
        if not live.queued:
            return
        queued, live.queued = live.queued, []
        self._to_draft(conv_id, *queued)

    def _to_draft(self, conv_id: int, *texts: str) -> None:
        """`texts` back in the chat's box, before what it holds (they were written first)."""
        self.set_draft(conv_id, "\n\n".join([*texts, self.draft(conv_id)]).strip())
        self.draft_changed.emit(conv_id)
        self.status_changed.emit(conv_id)

    def set_settings(self, conv_id: int, settings: ChatSettings) -> None:
        """Takes effect on the chat's next turn (a new model means a new engine session)."""
        self.store.update(conv_id, settings=settings)
        live = self.live(conv_id)
        if live.pending is not None:  # a turn waiting for the old model now waits for the new one (maybe loaded)
            self._when_loaded(conv_id, live, live.pending)
        else:
            self.models.ensure(settings.model)
        self.settings_changed.emit(conv_id)
        self.status_changed.emit(conv_id)

    # -- turns
    def send(self, conv_id: int, text: str) -> bool:
        text = text.strip()
        if not text or self.busy(conv_id):
            return False
        conv = self.store.get(conv_id)
        base, leaf = self.store.path(conv_id), conv.leaf_id
        user = self.store.add_message(conv_id, conv.leaf_id, "user", text)
        if conv.title == NEW_TITLE:
            conv.title = _title(text)
        self._begin(conv_id, base, user, "submit", given=TurnInfo(None, 0, user_id=user.id, leaf_before=leaf))
        return True

    def edit(self, msg_id: int, text: str) -> bool:
        """A new version of an earlier user message: a new branch from its parent; the old one stays. While the chat
        answers, the answer stops and the edited message goes once it has."""
        old = self.store.message(msg_id)
        text = text.strip()
        if not text:
            return False
        if self.busy(old.conversation_id):
            self.live(old.conversation_id).edit_after_stop = (msg_id, text)
            self.stop(old.conversation_id)
            return True
        base, leaf = self._path_to(old.conversation_id, old.parent_id), self.store.get(old.conversation_id).leaf_id
        user = self.store.add_message(old.conversation_id, old.parent_id, "user", text)
        given = TurnInfo(None, 0, user_id=user.id, leaf_before=leaf, edit_of=msg_id)
        self._begin(old.conversation_id, base, user, "submit", given=given)
        return True

    def regenerate(self, conv_id: int, msg_id: int | None = None, seed: int | None = None) -> bool:
        """A new version of an answer (the last one by default); earlier versions stay reachable. `seed`:
        sample with this seed (an earlier version's, to get it again), whatever the chat's setting. Without it, a chat
        with a fixed seed draws the k-th version of an answer with seed + k - 1: Regenerate gives another answer (it
        gave the same one again), and the chat repeats as a whole from its setting."""
        if self.busy(conv_id):
            return False
        path = self.store.path(conv_id)
        answers = [m for m in path if m.role == "assistant" and (msg_id is None or m.id == msg_id)]
        users = [m for m in path if m.role == "user"]
        if answers:
            user = self.store.message(answers[-1].parent_id)
            if failed_unanswered(answers[-1]) and not self.store.children(conv_id, answers[-1].id):
                self.store.delete_message(answers[-1].id)  # Retry: a version holding only its error is replaced
        elif users and path[-1].role == "user":
            user = path[-1]
        else:
            return False
        base = self._path_to(conv_id, user.id)
        self._begin(conv_id, base, None, "regenerate", user.id, seed if seed is not None else self._next_seed(user))
        return True

    def _next_seed(self, user: Message) -> int | None:
        """The chat's fixed seed advanced by the answers `user` already has; None: the chat draws a fresh seed."""
        settings = self.store.get(user.conversation_id).settings
        fixed = settings.seed
        if fixed is None or settings.sampling().greedy:  # a greedy answer draws nothing: it names no seed
            return None
        answers = sum(m.role == "assistant" for m in self.store.children(user.conversation_id, user.id))
        return (fixed + answers) % (MAX_INT32 + 1)  # inside the seed field's range

    def continue_answer(self, conv_id: int, msg_id: int) -> bool:
        """Generates more of the last answer in place (one stopped, cut short by max tokens, or interrupted)."""
        if self.busy(conv_id):
            return False
        path = self.store.path(conv_id)
        msg = self.store.message(msg_id)
        if not path or path[-1].id != msg_id or not can_continue(msg):
            return False
        live = self.live(conv_id)
        live.turn = TurnInfo(None, msg_id, previous_state=msg.state)
        self._set_state(conv_id, msg_id, "waiting")
        self._when_loaded(conv_id, live, lambda: self._submit(conv_id, path, None, "continue"))
        return True

    def stop(self, conv_id: int) -> None:
        live = self.live(conv_id)
        self.unqueue(conv_id)  # stopping means "not now": what was queued comes back to the composer
        if live.turn is None:
            return
        if live.turn.turn_id is None:  # still waiting for its model
            live.pending = None
            self._end(conv_id, live, state="stopped")
            return
        self.bridge.engine.cancel(live.session_id)

    def switch_version(self, msg_id: int, step: int) -> None:
        msg = self.store.message(msg_id)
        versions = self.store.versions(msg)
        i = versions.index(msg) + step
        if 0 <= i < len(versions):
            self.store.select(versions[i].id)
            self.path_changed.emit(msg.conversation_id)
            self.status_changed.emit(msg.conversation_id)  # the status line shows the version on screen

    # -- driving the engine
    def _path_to(self, conv_id: int, msg_id: int | None) -> list[Message]:
        path = self.store.path(conv_id)
        if msg_id is None:
            return []
        ids = [m.id for m in path]
        if msg_id in ids:
            return path[: ids.index(msg_id) + 1]
        chain = []
        while msg_id is not None:
            m = self.store.message(msg_id)
            chain.append(m)
            msg_id = m.parent_id
        return chain[::-1]

    def _begin(self, conv_id: int, base: list[Message], user: Message | None, kind: str, parent_id: int | None = None,
               seed: int | None = None, given: TurnInfo | None = None) -> None:
        """`given`: what a sent message's turn knows beforehand (its message, the branch it leaves)."""
        answer = self.store.add_message(conv_id, user.id if user else parent_id, "assistant", state="waiting")
        live = self.live(conv_id)
        live.turn = replace(given or TurnInfo(None, 0), message_id=answer.id, seed=seed)
        live.refused = live.too_long = None  # the next turn: what the last refusal said no longer applies
        self.path_changed.emit(conv_id)
        self.conversations_changed.emit()  # a new message makes the chat the most recent: the list reorders
        self._when_loaded(conv_id, live, lambda: self._submit(conv_id, base, user, kind))

    def _when_loaded(self, conv_id: int, live: LiveChat, submit) -> None:
        """Submits now if the chat's model is loaded, else once it is (the chat shows 'loading')."""
        key = self.store.get(conv_id).settings.model
        live.pending = submit
        _clear_figures(live.status)  # the last turn's figures are not this one's
        self.models.ensure(key)
        if self.models.model_id(key) is not None:
            self._run_pending(live)
        else:
            _enter(live.status, "loading")
            self.status_changed.emit(conv_id)

    def _run_pending(self, live: LiveChat) -> None:
        pending, live.pending = live.pending, None
        if pending is not None:
            pending()

    def _submit(self, conv_id: int, base: list[Message], user: Message | None, kind: str) -> None:
        live = self.live(conv_id)
        settings = self.store.get(conv_id).settings
        sid = self._session_for(conv_id)
        messages = engine_messages(base, continuing=kind == "continue")
        if user is not None:
            messages.append({"role": user.role, "content": user.content})
        self.store.update_message(live.turn.message_id, model=live.status.model)
        params = _seeded(settings.sampling(), live.turn)
        live.turn.submitted_at = time.perf_counter()  # the TTFT shown counts from here
        live.turn.turn_id = self.bridge.engine.submit(sid, messages, params, settings.system_prompt or None,
                                                      continue_final=kind == "continue")
        # its model loaded, the answer starts (its cursor): 'Loading the model…' showed until the engine took the turn,
        # 50-200 ms of every turn in 4 compare columns of the loaded Gemma 3 270M
        self.store.update_message(live.turn.message_id, state="streaming", error="")
        _enter(live.status, "queued")
        self.message_changed.emit(conv_id, live.turn.message_id)
        self.status_changed.emit(conv_id)

    def _session_for(self, conv_id: int) -> int:
        """The chat's engine session, opened (again) when the model or overflow policy changed."""
        live, settings = self.live(conv_id), self.store.get(conv_id).settings
        engine = self.bridge.engine
        model_id = self.models.model_id(settings.model)
        changed = live.model_key != settings.model or live.overflow != settings.overflow or live.model_id != model_id
        if live.session_id is not None and changed:  # another model, policy, or the model was unloaded since
            engine.close(live.session_id)
            self._by_session.pop(live.session_id, None)
            live.session_id = None
        if live.session_id is None:
            live.session_id = engine.open_session(model_id, settings.overflow)
            live.model_key, live.model_id, live.overflow = settings.model, model_id, settings.overflow
            self._by_session[live.session_id] = conv_id
        state = self.models.state(settings.model)
        live.status.model = state.name if state else settings.model
        return live.session_id

    # -- engine events (GUI thread, via the bridge)
    def _turn_of(self, session_id: int, turn_id: int | None) -> tuple[int, LiveChat] | None:
        conv_id = self._by_session.get(session_id)
        live = self._live.get(conv_id) if conv_id is not None else None
        if live is None or live.turn is None or (turn_id is not None and live.turn.turn_id != turn_id):
            return None
        return conv_id, live

    def _on_started(self, session_id: int, turn_id: int) -> None:
        found = self._turn_of(session_id, turn_id)
        if found:
            conv_id, live = found
            _enter(live.status, "prefilling")  # until the first token: the prompt is being read
            _clear_figures(live.status)
            self._set_state(conv_id, live.turn.message_id, "streaming")

    def _on_queued(self, session_id: int, turn_id: int, position: int) -> None:
        found = self._turn_of(session_id, turn_id)
        if found:
            conv_id, live = found
            if live.status.state != "queued":
                _enter(live.status, "queued")
            self.store.update_message(live.turn.message_id, error=queued_note(position))
            self._set_state(conv_id, live.turn.message_id, "queued")

    def _on_text(self, session_id: int, turn_id: int, text: str, tokens: int) -> None:
        found = self._turn_of(session_id, turn_id)
        if not found:
            return
        conv_id, live = found
        t = live.turn
        if t.first_token_at is None and tokens:
            t.first_token_at = time.perf_counter()
            live.status.ttft_s = t.first_token_at - t.submitted_at  # the user's wait: shown now, kept (see _on_finished)
            _enter(live.status, "streaming")
        t.tokens += tokens
        live.status.context_used = live.context_base + t.tokens
        msg = self.store.append_text(t.message_id, text)
        if msg.state != "streaming":
            msg.state, msg.error = "streaming", ""
        self.message_changed.emit(conv_id, t.message_id)
        self.status_changed.emit(conv_id)

    def _on_context(self, session_id: int, used: int, limit: int, dropped: int) -> None:
        conv_id = self._by_session.get(session_id)
        if conv_id is None or conv_id not in self._live:
            return
        live = self._live[conv_id]
        live.context_base = used
        live.status.context_used, live.status.context_limit, live.status.dropped_messages = used, limit, dropped
        self.status_changed.emit(conv_id)

    def _on_finished(self, session_id: int, turn_id: int, reason: str, text: str, stats) -> None:
        found = self._turn_of(session_id, turn_id)
        if not found:
            return
        conv_id, live = found
        msg_id = live.turn.message_id
        st = live.status
        # The TTFT shown since the first token is the app's: Send to the token on screen, what the user waited. The
        # engine's starts when its thread takes the turn (after a step under way) and ends before the token reaches
        # the window, so it reads a little less; kept beside it, not shown, as one answer shows one TTFT.
        st.tokens_per_s, st.ttft_s = stats.tokens_per_s, st.ttft_s if st.ttft_s is not None else stats.ttft_s
        st.context_used, st.context_limit = stats.context_used, stats.context_limit
        st.prompt_tokens, st.prefilled_tokens = stats.prompt_tokens, stats.prefilled_tokens
        st.tokens_per_step = stats.tokens_per_step
        seed = {"seed": live.turn.seed} if live.turn.seed is not None else {}
        # the oldest messages the overflow policy left out: the answer says it was written without them, for good
        unseen = {"dropped_messages": st.dropped_messages} if st.dropped_messages else {}
        # a session closed under a turn whose model is no longer loaded: the model went, not the user's Stop
        gone = reason == "closed" and self._model_gone(live)
        shown = {"ttft_s": st.ttft_s, "engine_ttft_s": stats.ttft_s}
        saved = {"reason": reason, **_stats_dict(stats), **shown, **seed, **unseen}
        self.store.update_message(msg_id, content=text, stats=saved, model=st.model,
                                  error=UNLOADED_MID_ANSWER if gone else "")
        self._end(conv_id, live, "stopped" if reason in ("cancelled", "closed") else "done")

    def _on_failed(self, session_id: int, turn_id: object, message: str, code: str = "") -> None:
        """`code`: the engine's (engine/errors.py): a message too long for the context goes back to the user; any
        other failure (out of memory, the model unloaded, a template error) leaves it in the chat to Retry."""
        found = self._turn_of(session_id, turn_id if isinstance(turn_id, int) else None)
        if not found:
            return
        conv_id, live = found
        if turn_id is None and live.turn.turn_id is None:
            return  # an earlier command's failure (a stale session): this turn, still waiting for its model, sent none
        if turn_id is None:
            # A command failed (not the turn itself): the turn may still run, so only report it.
            self.store.update_message(live.turn.message_id, error=message)
            self.message_changed.emit(conv_id, live.turn.message_id)
            return
        if code == ContextOverflowError.code and self._refused_unanswered(conv_id, live):
            if not self.store.get(conv_id).hidden:
                self._give_back(conv_id, live, message)
                return
            if live.turn.edit_of is None:  # a column keeps it with its error: the comparison decides (take_back)
                live.too_long = (live.turn.user_id, message)
        if self._model_gone(live):
            message = MODEL_GONE  # the engine's 'Chat session 2 does not exist' says less
        self.store.update_message(live.turn.message_id, error=message)
        # a failed continuation leaves the answer as it was (with the error shown), not failed as a whole
        self._end(conv_id, live, live.turn.previous_state or "error")

    def _model_gone(self, live: LiveChat) -> bool:
        """The model the chat's session runs on is no longer loaded under its id: asked of that model, not of the one
        the chat names now (a model picked while it answered is not the one that went)."""
        return self.models.model_id(live.model_key) != live.model_id

    def _refused_unanswered(self, conv_id: int, live: LiveChat) -> bool:
        """The turn of a message the user sent ended before a word of answer."""
        turn = live.turn
        return turn.user_id is not None and turn.tokens == 0 and not self.store.message(turn.message_id).content

    def too_long(self, conv_id: int) -> str | None:
        """Why a compare column refused its last prompt for its length (kept in it with its error), else None."""
        kept = self.live(conv_id).too_long
        return kept[1] if kept is not None else None

    def take_back(self, conv_id: int) -> str | None:
        """A compare column's prompt refused for its length leaves it, as a chat's does (every column refused it: it
        goes back to the comparison's box); its text, or None when there is none to take."""
        live = self.live(conv_id)
        kept, live.too_long = live.too_long, None
        if kept is None or live.busy or not self.store.has_message(kept[0]):
            return None
        user = self.store.message(kept[0])
        self._withdraw(conv_id, user, user.parent_id)
        self.path_changed.emit(conv_id)
        self.status_changed.emit(conv_id)
        return user.content

    def keep_refused(self, conv_id: int) -> None:
        """A compare column's prompt refused for its length stays in it, with its error (other columns answered it)."""
        self.live(conv_id).too_long = None

    def _withdraw(self, conv_id: int, user: Message, leaf_before: int | None) -> None:
        """A refused message leaves its chat (the branch shown before it comes back; a title it gave goes)."""
        self.store.set_leaf(conv_id, leaf_before)
        self.store.delete_message(user.id)  # its answer with it: no trace in the chat or its file
        if leaf_before is None and self.store.get(conv_id).title == _title(user.content):
            self.store.update(conv_id, title=NEW_TITLE)

    def _give_back(self, conv_id: int, live: LiveChat, reason: str) -> None:
        """The refused message leaves the chat and its text goes back to the user: into the box, or into the edit it
        was; the reason is the chat's notice."""
        turn, user = live.turn, self.store.message(live.turn.user_id)
        text = user.content
        self._withdraw(conv_id, user, turn.leaf_before)
        live.turn = None
        _enter(live.status, "idle")
        self.unqueue(conv_id)  # what was queued behind it comes back too, after it
        into_edit = turn.edit_of is not None and self.open_edit(conv_id) is None  # else another edit begun since
        live.refused = Refusal(reason, turn.edit_of if into_edit else None)
        if into_edit:
            self.keep_edit(conv_id, turn.edit_of, text)
        else:
            self._to_draft(conv_id, text)
        self.path_changed.emit(conv_id)
        self.conversations_changed.emit()
        self.status_changed.emit(conv_id)
        self.refused.emit(conv_id)

    def _on_model_loaded(self, key: str) -> None:
        for live in list(self._live.values()):
            if live.pending is not None and self.store.has(live.conv_id) and self.store.get(live.conv_id).settings.model == key:
                self._run_pending(live)

    def _on_model_failed(self, key: str, message: str) -> None:
        for live in list(self._live.values()):
            if live.pending is not None and self.store.has(live.conv_id) and self.store.get(live.conv_id).settings.model == key:
                live.pending = None
                self.store.update_message(live.turn.message_id, error=f"The model did not load: {message}")
                self._end(live.conv_id, live, live.turn.previous_state or "error")

    def _end(self, conv_id: int, live: LiveChat, state: str) -> None:
        msg_id = live.turn.message_id
        live.turn = None
        _enter(live.status, "idle")
        self._set_state(conv_id, msg_id, state)
        self.status_changed.emit(conv_id)
        self.turn_done.emit(conv_id, msg_id)
        edit, live.edit_after_stop = live.edit_after_stop, None
        if edit is not None and self.store.has(conv_id):
            self.edit(*edit)
            return
        self._next_queued(conv_id, live, state)

    def _next_queued(self, conv_id: int, live: LiveChat, state: str) -> None:
        """After a good answer the next queued message goes; after a failure it comes back to the draft."""
        if not live.queued or not self.store.has(conv_id):
            return
        if state != "done":
            self.unqueue(conv_id)
            return
        text = live.queued.pop(0)
        self.send(conv_id, text)

    def _set_state(self, conv_id: int, msg_id: int, state: str) -> None:
        msg = self.store.update_message(msg_id, state=state)
        if state == "streaming":
            msg.error = ""
        self.message_changed.emit(conv_id, msg_id)
        self.status_changed.emit(conv_id)


def _title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def _seeded(params: SamplingParams, turn: TurnInfo) -> SamplingParams:
    """Every sampled turn gets a known seed (the chat's, one asked for, or a fresh one) so it can be repeated."""
    if params.greedy:
        return params
    if turn.seed is None:
        turn.seed = params.seed if params.seed is not None else random.randrange(2**31)
    return replace(params, seed=turn.seed)


def _clear_figures(status: ChatStatus) -> None:
    status.tokens_per_s = status.ttft_s = status.tokens_per_step = None
    status.prompt_tokens = status.prefilled_tokens = 0  # else the last turn's "cached" note shows beside this TTFT
    status.dropped_messages = 0  # this turn's ContextUsage, after its Started, says how many it leaves out


def _enter(status: ChatStatus, state: str) -> None:
    status.state, status.since = state, time.perf_counter()


def _shown_status(path: list[Message], live: ChatStatus) -> ChatStatus:
    """The figures of the last answer on the branch shown (as the engine gave them); `live` when it has none."""
    answer = path[-1] if path and path[-1].role == "assistant" else None
    stats = answer.stats if answer is not None else None
    if not stats or "context_used" not in stats:
        return live
    return ChatStatus(model=answer.model or live.model, tokens_per_s=stats.get("tokens_per_s"),
                      ttft_s=stats.get("ttft_s"), context_used=int(stats.get("context_used") or 0),
                      context_limit=int(stats.get("context_limit") or live.context_limit), state=live.state,
                      prompt_tokens=int(stats.get("prompt_tokens") or 0),
                      prefilled_tokens=int(stats.get("prefilled_tokens") or 0),
                      dropped_messages=unseen_messages(stats), tokens_per_step=_tokens_per_step(stats))


def unseen_messages(stats: dict | None) -> int:
    """How many of the chat's oldest messages the answer was written without (they did not fit the context)."""
    dropped = (stats or {}).get("dropped_messages")
    return dropped if isinstance(dropped, int) and not isinstance(dropped, bool) and dropped > 0 else 0


def _tokens_per_step(stats: dict) -> float | None:
    steps, drafted = stats.get("decode_steps"), stats.get("drafted_tokens")
    done = stats.get("completion_tokens")
    ok = all(isinstance(x, int) and x > 0 for x in (steps, drafted, done))  # a stored chat's stats are untrusted
    return done / steps if ok else None


def _stats_dict(stats) -> dict:
    return {name: getattr(stats, name) for name in stats.__slots__}


def queued_note(position: int) -> str:
    """A waiting turn's place: the engine's position 0 is the next in line (the first waiting read "1 ahead")."""
    return "Queued: next in line" if position == 0 else f"Queued: {position:,} ahead"
