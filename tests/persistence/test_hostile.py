"""Hostile input end to end: prompts, chat templates and GGUF headers that try to break the app."""
from __future__ import annotations

import json
import shutil
import sqlite3
import struct
import time
import tracemalloc

import gguf
import pytest

from app.core.live import engine_view
from app.core.model_registry import ModelEntry
from app.core.sqlite_registry import SqliteModelRegistry, check_model
from app.core.sqlite_store import SqliteConversationStore
from engine import events as ev
from engine.errors import ModelLoadError
from engine.loading.gguf_file import open_gguf
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.support.engine_client import Client

TINY = EngineConfig(max_sessions=2, max_session_tokens=512, step_tokens=64, chunk_tokens=32)
SURROGATES = "a\ud800b\udfffc"
CONTROL = "ctl \x00\x01\x1b[2J\x7f\u202e\ufeff end"


@pytest.fixture(scope="module")
def client(tiny_models):
    c = Client(TINY)
    c.engine.start()
    c.model_id = c.load(tiny_models["qwen3"].gguf_path)
    yield c
    c.engine.shutdown()


def _turn(client, store, conv_id, sid, text):
    """One chat turn the way the GUI does it: store first, engine second (handed the stored branch, which ends
    with the new user message), the answer saved as it streams."""
    conv = store.get(conv_id)
    user = store.add_message(conv_id, conv.leaf_id, "user", text)
    branch = [{"role": m.role, "content": m.content} for m in engine_view(store.path(conv_id))]
    answer = store.add_message(conv_id, user.id, "assistant", state="waiting")
    chat = client.chats[sid]
    end = client.wait(client.engine.submit(sid, branch, chat.params, chat.system), timeout=60)
    if isinstance(end, ev.Finished):
        store.update_message(answer.id, content=end.text, state="done")
    else:
        store.update_message(answer.id, state="error", error=end.message)
    return end


@pytest.mark.parametrize("overflow", ["stop", "truncate"])
def test_hostile_prompts_get_an_answer_or_a_clear_error(client, tmp_path, overflow):
    store = SqliteConversationStore(tmp_path / "p.db")
    conv = store.create()
    sid = client.open(client.model_id, params=SamplingParams(max_tokens=4, temperature=0), overflow=overflow)
    assert isinstance(_turn(client, store, conv.id, sid, SURROGATES), ev.Finished)
    assert isinstance(_turn(client, store, conv.id, sid, CONTROL), ev.Finished)
    start = time.perf_counter()
    long = _turn(client, store, conv.id, sid, "x" * 200_000)
    assert isinstance(long, ev.Error) and "context holds 512" in long.message and time.perf_counter() - start < 20
    if overflow == "truncate":  # the chat goes on; under "stop" the long message stays until the user edits it
        assert isinstance(_turn(client, store, conv.id, sid, "hello"), ev.Finished)
    store.close()
    client.engine.close(sid)
    rows = [r[0] for r in sqlite3.connect(tmp_path / "p.db").execute("SELECT content FROM message WHERE role = 'user'")]
    assert rows[0] == "a?b?c" and rows[1] == CONTROL and len(rows[2]) == 200_000


def test_hostile_chat_template_is_refused_end_to_end(client, tiny_models, tmp_path):
    folder = tmp_path / "evil"
    shutil.copytree(tiny_models["qwen3"].hf_dir, folder)
    (folder / "chat_template.jinja").write_text(
        "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ cycler.__init__.__globals__.os.system('touch pwned') }}")
    model_id = client.engine.load_model(folder)
    loaded = client.wait_for(lambda e: isinstance(e, (ev.ModelLoaded, ev.ModelFailed)) and e.model_id == model_id)
    if isinstance(loaded, ev.ModelFailed):  # refused at load: fine, as long as it says why
        assert "template" in loaded.message.lower()
        return
    sid = client.open(model_id, params=SamplingParams(max_tokens=2))
    end = client.wait(client.send(sid, "hi"), timeout=60)
    assert isinstance(end, ev.Error) and "template" in end.message.lower()
    assert not (tmp_path / "pwned").exists()
    client.engine.close(sid)


# -- GGUF headers with absurd counts, shapes and offsets
def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf(kvs: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0, tail: bytes = b"\0" * 64) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + tensors + tail


ARCH = _s("general.architecture") + struct.pack("<I", 8) + _s("llama")
ABSURD = {
    "array of 2**62 bytes": _gguf(ARCH + _s("x") + struct.pack("<IIQ", 9, 0, 1 << 62), 2),
    "array of 2**40 strings": _gguf(ARCH + _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 1 << 40), 2),
    "arrays nested 3 deep": _gguf(_s("x") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 9, 1)
                                  + struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 0, 1) + b"\0", 1),
    "2**60 metadata fields": _gguf(ARCH, 1 << 60),
    "string of 2**63 bytes": _gguf(struct.pack("<Q", 1 << 63) + b"key", 1),
    "token of 2**63 bytes": _gguf(ARCH + _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + _s("a")
                                  + struct.pack("<Q", 1 << 63) + b"b", 2),
    "token not UTF-8": _gguf(ARCH + _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + _s("a")
                             + struct.pack("<Q", 2) + b"\xff\xfe", 2),
    "token list cut short": _gguf(ARCH + _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + _s("a")
                                  + _s("b"), 2, tail=b"\0" * 6),  # 24 bytes: room for 3 lengths, not 3 items
    "2**40 tensors": _gguf(ARCH, 1, n_tensors=1 << 40),
    "1000 dimensions": _gguf(ARCH, 1, _s("t") + struct.pack("<I", 1000) + b"\1" * 8000 + struct.pack("<IQ", 0, 0), 1),
    "shape 2**32 x 2**32": _gguf(ARCH, 1, _s("t") + struct.pack("<IQQIQ", 2, 1 << 32, 1 << 32, 0, 0), 1),
    "offset 2**60": _gguf(ARCH, 1, _s("t") + struct.pack("<IQIQ", 1, 4, 0, 1 << 60), 1),
    "unknown tensor type": _gguf(ARCH, 1, _s("t") + struct.pack("<IQIQ", 1, 4, 999, 0), 1),
    "unknown value type": _gguf(_s("x") + struct.pack("<I", 77), 1),
    "alignment 3": _gguf(_s("general.alignment") + struct.pack("<II", 4, 3), 1),
}


@pytest.mark.parametrize("name", list(ABSURD))
def test_absurd_gguf_headers_are_refused_before_allocating(tmp_path, name):
    path = tmp_path / "absurd.gguf"
    path.write_bytes(ABSURD[name])
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="damaged or truncated"):
        open_gguf(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 << 20 and time.perf_counter() - start < 2
    with pytest.raises(ValueError, match="damaged"):
        check_model(path)


def _patch_first_tensor(src, dst, dims=None, offset=None):
    reader = gguf.GGUFReader(src)
    t = reader.tensors[0]
    name_len = len(t.name.encode())
    base = t.field.offset + 8 + name_len + 4  # past the name and n_dims
    data = bytearray(src.read_bytes())
    n_dims = len(t.shape)
    if dims is not None:
        data[base:base + 8 * n_dims] = struct.pack(f"<{n_dims}Q", *dims)
    if offset is not None:
        at = base + 8 * n_dims + 4
        data[at:at + 8] = struct.pack("<Q", offset)
    dst.write_bytes(bytes(data))
    return dst


def test_real_model_with_patched_shape_or_offset(tiny_models, tmp_path):
    src = tiny_models["llama"].gguf_path
    n = len(gguf.GGUFReader(src).tensors[0].shape)
    for path in (_patch_first_tensor(src, tmp_path / "shape.gguf", dims=[1 << 20] * n),
                 _patch_first_tensor(src, tmp_path / "offset.gguf", offset=1 << 59)):
        with pytest.raises(ModelLoadError, match="lies outside the file|impossible shape"):
            open_gguf(path)


# -- the model registry: checked before import, stored in the database
def test_a_mixture_of_experts_without_experts_is_refused_before_import(corrupt_ggufs):
    with pytest.raises(ValueError, match="mixture of 8 experts but holds no expert tensors"):
        check_model(corrupt_ggufs["mixture_of_experts"])


def test_check_model_and_the_registry_in_the_database(tiny_models, tmp_path):
    good = tiny_models["qwen3"]
    assert check_model(good.gguf_path) == "gguf" and check_model(good.hf_dir) == "hf"
    no_tok = tmp_path / "no_tokenizer"
    shutil.copytree(good.hf_dir, no_tok)
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokenizer"):
        check_model(no_tok)
    mamba = tmp_path / "mamba"
    shutil.copytree(good.hf_dir, mamba)
    (mamba / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ValueError, match="not supported"):
        check_model(mamba)
    with pytest.raises(ValueError, match="neither"):
        check_model(tmp_path)

    legacy = tmp_path / "models.json"
    legacy.write_text(json.dumps([{"key": "/old.gguf", "name": "old", "path": "/old.gguf", "kind": "gguf"}]))
    store = SqliteConversationStore(tmp_path / "p.db")
    reg = SqliteModelRegistry(store, legacy_file=legacy)
    assert [e.key for e in reg.entries()] == ["default", "/old.gguf"]
    entry = reg.candidate(good.gguf_path)
    reg.add(entry)
    reg.remove("/old.gguf")
    with pytest.raises(ValueError):
        reg.candidate(no_tok)
    store.close()
    again = SqliteModelRegistry(SqliteConversationStore(tmp_path / "p.db"), legacy_file=legacy)
    assert [e.key for e in again.entries()] == ["default", entry.key]
    assert again.get(entry.key) == entry and again.get("default").kind == "embedded"
    assert isinstance(entry, ModelEntry)
