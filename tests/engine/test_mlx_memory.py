"""The MLX KV cache grows inside the memory that is free, as the PyTorch one does (tests/engine/test_kv_memory.py):
past it MLX's allocator ends the process, so a growth that cannot fit is refused in one line and the chat goes on."""
import pytest

from engine import events as ev
from engine.cache import CacheConfig
from engine.cache.growth import GROWTH_MARGIN
from engine.errors import CacheMemoryError
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.engine.test_kv_memory import LONG, OTHER, REFUSAL
from tests.support.engine_client import Client

mx = pytest.importorskip("mlx.core", reason="the MLX backend needs mlx (pip install 'mlx[cpu]' on Linux)")

from engine.mlx_backend.cache import MLXSequenceKVCache  # noqa: E402


def _cache(windows=(None, 512, None), max_seqs: int = 2, max_seq_len: int = 4096) -> MLXSequenceKVCache:
    config = CacheConfig("sequence", max_seqs, max_seq_len, max_seqs * max_seq_len, "float32", max_step_tokens=64)
    return MLXSequenceKVCache(config, list(windows), 2, 64)


def _step(cache: MLXSequenceKVCache, writes: list[tuple[int, int]]) -> None:
    """One step's bookkeeping and storage, K/V of position p filled with p (no model)."""
    segments = cache.declare_step(writes)
    try:
        cache.prepare_step()
        k = mx.concatenate([mx.arange(s.start, s.start + s.q_len, dtype=mx.float32) for s in segments])
        k = mx.broadcast_to(k[:, None, None], (k.shape[0], cache.kv_heads, cache.head_dim))
        outs = [cache.attend(layer, mx.zeros(k.shape), k, k, 1.0) for layer in range(len(cache.windows))]
        mx.eval(outs, *cache.arrays())
    except BaseException:
        cache.abort_step()
        raise
    cache.commit_step()


def _held_bytes(cache: MLXSequenceKVCache) -> int:
    return sum(t.nbytes for t in cache.arrays())


def _fill(cache: MLXSequenceKVCache, slot: int) -> None:
    while cache.pos(slot) < cache.rows:
        _step(cache, [(slot, min(64, cache.rows - cache.pos(slot)))])


def test_growth_costs_what_the_torch_layout_says():
    """A row of every column (max_seqs + 1) of the global layers, a sliding layer's only up to its ring."""
    cache = _cache()
    slot = cache.seq_new()
    before = _held_bytes(cache)
    while cache.pos(slot) < 1024:
        _step(cache, [(slot, 64)])
    per_layer = 2 * 64 * 2 * 4  # a token's K and V in one layer: kv_heads 2, head_dim 64, fp32
    ring = 512 + 64 - 1
    assert cache.rows == 1024
    assert _held_bytes(cache) - before == (2 * (1024 - 256) + (ring - 256)) * 3 * per_layer


def test_a_growth_that_cannot_fit_is_refused_and_the_cache_stays_whole():
    cache = _cache()
    slot = cache.seq_new()
    _fill(cache, slot)
    held, pos = _held_bytes(cache), cache.pos(slot)
    cache.free_memory = lambda: GROWTH_MARGIN + 1000  # nothing more fits
    with pytest.raises(CacheMemoryError) as err:
        _step(cache, [(slot, 64)])
    need, free = (int(x.replace(",", "")) for x in REFUSAL.fullmatch(str(err.value)).groups())
    assert need > free
    assert _held_bytes(cache) == held and cache.pos(slot) == pos and not cache.has_pending_step
    assert cache.reserve([(pos, 1), (pos, 64)]).keys() == {0, 1}  # the engine's check before a step refuses it too
    cache.free_memory = lambda: 1 << 40
    _step(cache, [(slot, 64)])  # the same write once memory is free
    assert cache.pos(slot) == pos + 64
    gather = mx.array([r * cache.columns + slot for r in range(pos + 64)])
    assert cache.k[0][gather][:, 0, 0].tolist() == list(range(pos + 64))  # what it held before, and the new rows


def test_a_turn_whose_mlx_cache_cannot_grow_fails_alone_and_the_chat_goes_on(tiny_models):
    """As on torch: the long prompt's turn ends with one line (code insufficient_memory), the other chat in the same
    steps answers as it would alone, and both chats go on."""
    config = EngineConfig(max_sessions=2, max_session_tokens=2048, step_tokens=64, chunk_tokens=32, speculative="off",
                          backend="mlx")
    c = Client(config)
    with c.engine:
        model = c.load(tiny_models["qwen3"].gguf_path)
        params = SamplingParams(max_tokens=24)
        other = c.open(model, params=params)
        alone = c.tokens(c.ask(other, OTHER).turn_id)
        cache = c.engine._hosts[model].runtime.cache
        assert isinstance(cache, MLXSequenceKVCache)
        cache.free_memory = lambda: GROWTH_MARGIN  # nothing more fits
        again, sid = c.open(model, params=params), c.open(model, params=params)
        turns = [c.send(again, OTHER), c.send(sid, LONG)]
        end, err = c.wait(turns[0]), c.wait(turns[1])
        assert isinstance(end, ev.Finished) and c.tokens(turns[0]) == alone
        assert isinstance(err, ev.Error) and REFUSAL.fullmatch(err.message), err.message
        assert err.code == "insufficient_memory"
        assert c.ask(sid, "short").reason in ("stop", "length")
        cache.free_memory = lambda: 1 << 40
        assert c.ask(c.open(model, params=params), LONG).reason in ("stop", "length")
