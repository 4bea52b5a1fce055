"""The process the crash test kills: the app's store and engine with several chats streaming.

Run as a zygote (`python -m tests.persistence.crash_child MODEL`): it imports torch and the engine once,
then for each `run DB SIDE SEED` line on stdin forks a child, prints its pid, waits for it and prints
`exit STATUS`. It loads the model once on one thread first, so each fork starts warm (saving seconds
of imports per kill) and no thread pool is copied into the child. The child appends `c ID LEN CRC` to SIDE (fsynced) after every commit,
and `ready` once every chat is streaming.
"""
from __future__ import annotations

import os
import queue
import random
import sys
import time
import zlib

from app.core.live import engine_view
from app.core.sqlite_store import SqliteConversationStore
from engine import events as ev
from engine.engine import Engine
from engine.runtime import EngineConfig

CHATS = 3
PROMPTS = ("Tell me a story.", "Why is the sky blue?", "Count to twenty.", "Name some fish.")
CONFIG = dict(max_sessions=4, max_session_tokens=512, step_tokens=64, chunk_tokens=32)
LIFETIME_S = 20.0  # a child nobody kills ends on its own


def child(model: str, db: str, side: str, seed: int) -> None:
    rng = random.Random(seed)
    out = open(side, "a", encoding="utf-8")

    def note(line: str) -> None:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())

    def committed(msgs) -> None:
        note("\n".join(f"c {m.id} {len(m.content)} {zlib.crc32(m.content.encode('utf-8'))}" for m in msgs))

    store = SqliteConversationStore(db, flush_interval_s=rng.choice((0.02, 0.1, 0.5)))
    store.on_commit = committed
    events: queue.Queue = queue.Queue()
    engine = Engine(EngineConfig(**CONFIG), on_event=events.put).start()
    model_id = engine.load_model(model)
    while not isinstance(e := events.get(), (ev.ModelLoaded, ev.ModelFailed)):
        pass
    assert isinstance(e, ev.ModelLoaded), e
    answer_of: dict[int, int] = {}  # turn -> assistant message
    conv_of: dict[int, int] = {}  # session -> conversation
    params_of: dict[int, object] = {}  # session -> its chat's sampling settings

    def ask(sid: int) -> None:
        """As the app does: each turn hands the engine the stored branch, ending with the new user message."""
        conv = store.get(conv_of[sid])
        user = store.add_message(conv.id, conv.leaf_id, "user", rng.choice(PROMPTS))
        branch = [{"role": m.role, "content": m.content} for m in engine_view(store.path(conv.id))]
        answer = store.add_message(conv.id, user.id, "assistant", state="waiting")
        answer_of[engine.submit(sid, branch, params_of[sid])] = answer.id

    from engine.sampling import SamplingParams
    for i in range(CHATS):
        params = SamplingParams(temperature=1.0, seed=rng.randrange(1 << 30), max_tokens=rng.randrange(8, 80))
        sid = engine.open_session(model_id, overflow="truncate")
        conv_of[sid], params_of[sid] = store.create(f"chat {seed}-{i}").id, params
        ask(sid)
    note("ready")
    deadline = time.monotonic() + LIFETIME_S
    while time.monotonic() < deadline:
        try:
            e = events.get(timeout=0.1)
        except queue.Empty:
            store.flush()
            continue
        msg_id = answer_of.get(getattr(e, "turn_id", None))
        if msg_id is None:
            continue
        if isinstance(e, ev.Started):
            store.update_message(msg_id, state="streaming")
        elif isinstance(e, ev.TokenDelta):
            store.append_text(msg_id, e.text)
        elif isinstance(e, ev.Finished):
            store.update_message(msg_id, content=e.text, state="done", stats={"reason": e.reason})
            ask(e.session_id)
        elif isinstance(e, ev.Error):
            store.update_message(msg_id, state="error", error=e.message)
            ask(e.session_id)
    store.close()
    engine.shutdown()


def zygote(model: str) -> None:
    import torch

    from engine.loading.loader import load_model

    torch.set_num_threads(1)  # no OpenMP pool exists at fork time, so forked children are safe
    load_model(model)  # imports everything a load needs once, here, instead of in every child
    for line in sys.stdin:
        _, db, side, seed = line.split()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                child(model, db, side, int(seed))
            except BaseException as exc:  # reported through the exit status; the parent shows the side file
                with open(side, "a") as f:
                    f.write(f"error {exc!r}\n")
                code = 1
            os._exit(code)
        print(pid, flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {status}", flush=True)


if __name__ == "__main__":
    zygote(sys.argv[1])
