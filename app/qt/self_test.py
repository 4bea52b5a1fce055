"""`parley --self-test`: the real window offscreen, two chats streaming at once on the embedded model."""
from __future__ import annotations

import asyncio
import os
import sys
import time

PROMPTS = ("Write one sentence about the sea.", "Name three colours.")


async def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


async def check(app, timeout: float = 240.0) -> dict:
    """Sends a prompt in each of two chats, checks both stream at the same time and both answer."""
    service, window = app.service, app.window
    chats = [window.current(), window.new_chat()]
    for conv_id in chats:
        service.set_settings(conv_id, service.store.get(conv_id).settings.copy(max_tokens=24, temperature=0.0))
    key = service.store.get(chats[0]).settings.model

    def model_ready() -> bool:
        state = service.models.state(key)
        if state is not None and state.status == "failed":  # say why now, not after the whole timeout
            raise RuntimeError(f"the model did not load: {state.message}")
        return service.models.model_id(key) is not None

    await _wait(model_ready, timeout, "the model")
    for conv_id, prompt in zip(chats, PROMPTS):
        window.open_chat(conv_id)
        assert window.chat.send(prompt), "the composer refused to send"
    overlap = False

    def both_done() -> bool:
        nonlocal overlap
        overlap = overlap or all(service.status(c).state == "streaming" for c in chats)
        return not any(service.busy(c) for c in chats)

    await _wait(both_done, timeout, "both answers")
    answers = [service.store.path(c)[-1] for c in chats]
    bad = [a for a in answers if a.state != "done" or not a.content.strip()]
    if bad:
        raise AssertionError(f"a chat did not answer: {[(a.state, a.error, a.content) for a in bad]}")
    return {"ok": True, "overlap": overlap, "answers": [a.content for a in answers],
            "tokens_per_s": [service.status(c).tokens_per_s for c in chats]}


def run(data_dir: str | None = None, theme: str | None = None) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import qasync

    from app.qt.main import build, qt_app

    qapp = qt_app()
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    app = build(data_dir, theme=theme)  # `parley --self-test --theme dark` checks the dark window
    try:
        with loop:
            result = loop.run_until_complete(check(app))
    except Exception as exc:
        print(f"parley self-test: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        app.close()
    print(f"parley self-test: ok — two chats answered (streamed together: {result['overlap']})")
    for i, answer in enumerate(result["answers"], 1):
        print(f"  chat {i}: {answer.strip()[:100]!r}")
    return 0
