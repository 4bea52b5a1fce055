"""`parley serve` on the embedded Gemma 3 270M, driven by the openai client (slow: loads the 253 MB GGUF)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine.runtime import EngineConfig
from server.bridge import ServerBridge
from server.run import BackgroundServer

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


@pytest.fixture(scope="module")
def gemma_server(gemma_gguf_path):
    bridge = ServerBridge(EngineConfig(max_sessions=4, max_session_tokens=512)).start()
    try:
        bridge.load(gemma_gguf_path, alias="default")
        with BackgroundServer(bridge) as s:
            yield s
    finally:
        bridge.shutdown()


def complete(c: openai.OpenAI, prompt: str) -> str:
    stream = c.completions.create(model="default", prompt=prompt, temperature=0, max_tokens=8, stream=True)
    return "".join(ch.choices[0].text for ch in stream if ch.choices)


def test_gemma_streams_raw_completions_batched_like_alone(gemma_server):
    c = openai.OpenAI(base_url=gemma_server.url, api_key="x", max_retries=0, timeout=120)
    alone = [complete(c, p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: complete(c, p), PROMPTS))
    assert together == alone
    assert all(t.strip() for t in alone)


def test_gemma_chat_completion_streams(gemma_server):
    c = openai.OpenAI(base_url=gemma_server.url, api_key="x", max_retries=0, timeout=120)
    stream = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "Say hello."}],
                                       temperature=0, max_tokens=8, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.strip() and chunks[-1].usage.completion_tokens <= 8
