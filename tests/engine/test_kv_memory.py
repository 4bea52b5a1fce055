"""The KV cache's growth inside the memory that is free: what it takes, and the refusal when the machine cannot give it."""
from __future__ import annotations

import re

import pytest
import torch

from engine import events as ev
from engine.cache import CacheConfig, make_cache
from engine.cache.growth import GROWTH_MARGIN
from engine.errors import CacheMemoryError
from engine.runtime import EngineConfig
from engine.sampling import SamplingParams
from tests.support.engine_client import Client

REFUSAL = re.compile(r"The conversation needs ~([\d,]+) MB more memory for its cache and ([\d,]+) MB is free; "
                     r"free some memory or shorten the conversation\.")
REFUSED_BY_ALLOCATOR = re.compile(r"The conversation needs ~[\d,]+ MB more memory for its cache, more than this "
                                  r"process may allocate; free some memory or shorten the conversation\.")


def _cache(layout: str, windows=(None, 512, None), max_seqs: int = 2, max_seq_len: int = 4096):
    config = CacheConfig(layout, max_seqs, max_seq_len, max_seqs * max_seq_len, "float32", max_step_tokens=64)
    return make_cache(config, list(windows), 2, 64)


def _step(cache, writes: list[tuple[int, int]]) -> None:
    """One step's bookkeeping and storage, K/V of position p filled with p (no model)."""
    segments = cache.declare_step(writes)
    try:
        cache.prepare_step()
        for layer in range(len(cache.windows)):
            k = torch.cat([torch.arange(s.start, s.start + s.q_len, dtype=torch.float32) for s in segments])
            k = k[:, None, None].expand(-1, cache.kv_heads, cache.head_dim)
            q = torch.zeros(len(k), cache.kv_heads, cache.head_dim)
            cache.attend(layer, q, k, k, 1.0)
    except BaseException:
        cache.abort_step()
        raise
    cache.commit_step()


def _held_bytes(cache) -> int:
    return sum(t.nbytes for t in cache.k + cache.v)


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_growth_costs_what_the_arithmetic_says(layout):
    """Bytes a token adds: layers × kv_heads × head_dim × 2 (K and V) × dtype bytes in the cell pool; in the sequence
    layout a row of every column (max_seqs + 1) of the global layers, a sliding layer's only up to its ring."""
    cache = _cache(layout)
    slot = cache.seq_new()
    before = _held_bytes(cache)
    while cache.pos(slot) < 2048:
        _step(cache, [(slot, 64)])
    grown = _held_bytes(cache) - before
    per_layer = 2 * 64 * 2 * 4  # a token's K and V in one layer: kv_heads 2, head_dim 64, fp32
    if layout == "cell":
        assert cache.cells == 2048 and grown == (2048 - 512) * 3 * per_layer  # the pool starts at max_seqs × 256
    else:
        ring = 512 + 64 - 1  # the window and one step's writes
        assert cache.rows == 2048 and grown == (2 * (2048 - 256) + (ring - 256)) * 3 * per_layer  # 3 columns


def _fill(cache, slot: int, leave: int = 0) -> None:
    """Writes until the first storage is full but for `leave`: 256 rows (sequence), the pool's max_seqs × 256 cells."""
    full = (cache.rows if hasattr(cache, "rows") else cache.cells) - leave
    while cache.pos(slot) < full:
        _step(cache, [(slot, min(64, full - cache.pos(slot)))])


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_a_growth_that_cannot_fit_is_refused_and_the_cache_stays_whole(layout):
    cache = _cache(layout)
    slot = cache.seq_new()
    _fill(cache, slot)
    held, pos = _held_bytes(cache), cache.pos(slot)
    cache.free_memory = lambda: GROWTH_MARGIN + 1000  # nothing more fits
    with pytest.raises(CacheMemoryError) as err:
        _step(cache, [(slot, 64)])
    need, free = (int(x.replace(",", "")) for x in REFUSAL.fullmatch(str(err.value)).groups())
    assert need > free
    assert _held_bytes(cache) == held and cache.pos(slot) == pos and not cache.has_pending_step
    cache.free_memory = lambda: 1 << 40
    _step(cache, [(slot, 64)])  # the same write once memory is free
    assert cache.pos(slot) == pos + 64


def test_doubling_that_does_not_fit_grows_to_what_fits():
    """Near the limit the rows grow to what the free memory holds (at least what is needed), not double or nothing."""
    cache = _cache("sequence", windows=(None,), max_seqs=1)
    slot = cache.seq_new()
    for _ in range(4):
        _step(cache, [(slot, 64)])
    per_row = 2 * 2 * 64 * 4  # columns (max_seqs + 1) × kv_heads × head_dim × fp32, of K or of V
    free = GROWTH_MARGIN + 2 * (400 - 256) * per_row + 256 * per_row  # 400 rows of K and V, the old V while copied
    cache.free_memory = lambda: free
    _step(cache, [(slot, 64)])  # needs 320 rows; doubling to 512 does not fit
    assert 400 - 16 <= cache.rows <= 400


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_reserve_refuses_only_the_writes_that_need_the_growth(layout):
    cache = _cache(layout, max_seqs=3)
    long, short = cache.seq_new(), cache.seq_new()
    _fill(cache, long, leave=32 if layout == "cell" else 0)
    cache.free_memory = lambda: GROWTH_MARGIN
    # the long chat's next chunk needs new rows (sequence) or cells (cell); the short one's decode needs none
    refused = cache.reserve([(cache.pos(short), 1), (cache.pos(long), 64)])
    assert list(refused) == [1] and isinstance(refused[1], CacheMemoryError)


# the tiny model's context is 512: with OTHER's turn, LONG's needs more than the first storage in either layout (256
# rows; 512 cells for two sessions), OTHER's alone does not
LONG, OTHER = "count " * 115, "hello " * 50


@pytest.fixture(params=["sequence", "cell"])
def client(tiny_models, request):
    config = EngineConfig(kv_layout=request.param, max_sessions=2, max_session_tokens=2048, step_tokens=64,
                          chunk_tokens=32, speculative="off")
    c = Client(config)
    c.engine.start()
    c.model = c.load(tiny_models["qwen3"].gguf_path)
    yield c
    c.engine.shutdown()


def test_a_turn_whose_cache_cannot_grow_fails_alone_and_the_chat_goes_on(client):
    """The long prompt's cache needs memory the machine does not have: that turn ends with one line, the other chat in
    the same steps answers as it would alone, and both chats go on (nothing was lost, no traceback)."""
    params = SamplingParams(max_tokens=24)
    other = client.open(client.model, params=params)
    alone = client.tokens(client.ask(other, OTHER).turn_id)
    cache = client.engine._hosts[client.model].runtime.cache
    cache.free_memory = lambda: GROWTH_MARGIN  # nothing more fits
    again = client.open(client.model, params=params)
    sid = client.open(client.model, params=params)
    turns = [client.send(again, OTHER), client.send(sid, LONG)]
    end, err = client.wait(turns[0]), client.wait(turns[1])
    assert isinstance(end, ev.Finished) and client.tokens(turns[0]) == alone
    assert isinstance(err, ev.Error) and REFUSAL.fullmatch(err.message), err.message
    assert err.code == "insufficient_memory"  # what an API client branches on (the server's 503)
    assert client.ask(sid, "short").reason in ("stop", "length")  # the refused chat goes on with a shorter turn
    cache.free_memory = lambda: 1 << 40
    fresh = client.open(client.model, params=params)
    assert client.ask(fresh, LONG).reason in ("stop", "length")  # the long prompt once memory is free


LIMITED = """
import resource, sys
import psutil, torch
from engine.cache import CacheConfig, make_cache
from engine.errors import CacheMemoryError
from tests.engine.test_kv_memory import _step

torch.set_num_threads(1)
layout, seen = sys.argv[1], sys.argv[2] == "seen"
cache = make_cache(CacheConfig(layout, 1, 1 << 16, 1 << 16, "float32", max_step_tokens=256), [None] * 4, 32, 128)  # wide rows: the limit in few, cheap steps
slot = cache.seq_new()
_step(cache, [(slot, 256)])
if not seen:  # a limit the free-memory reading misses: the allocator itself refuses
    cache.free_memory = lambda: 1 << 40
resource.setrlimit(resource.RLIMIT_AS, (psutil.Process().memory_info().vms + (200 << 20), resource.RLIM_INFINITY))
try:
    while True:
        _step(cache, [(slot, 256)])
except CacheMemoryError as exc:
    print(exc)
end = cache.pos(slot)


def intact(n):  # position p's K and V hold p, in every layer
    return all(torch.equal(t.view(t.shape[0], -1)[:n, 0], torch.arange(n, dtype=torch.float32)) for t in cache.k + cache.v)


assert intact(end)
cache.rewind(slot, end - 256)
_step(cache, [(slot, 256)])  # it goes on where the memory holds it
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
_step(cache, [(slot, 256)])  # and past it once memory is free
assert intact(end + 256)
print("went on at", end)
"""


@pytest.mark.parametrize("layout, seen", [("sequence", "missed"), ("cell", "seen")])
def test_under_a_real_memory_limit_growth_is_refused_in_one_line(layout, seen):
    """A process under an address-space limit (`ulimit -v`): the cache grows until the limit, then the growth is refused
    with the one-line error, whether the free-memory reading sees the limit or only the allocator does; the cache keeps
    what it held, every layer alike (a failed growth used to leave some layers at the old size under a larger row count:
    wrong answers, or a write past the storage), and goes on."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", LIMITED, layout, seen], cwd=repo, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    first, last = run.stdout.splitlines()
    assert (REFUSAL if seen == "seen" else REFUSED_BY_ALLOCATOR).fullmatch(first), first
    assert last.startswith("went on at") and int(last.split()[-1]) >= 512


def test_room_asked_past_the_capacity_is_not_an_error():
    """Draft rows asked for near a full pool (sequences at their context) are never written: asking is no failure."""
    cache = _cache("cell", max_seqs=1, max_seq_len=512)
    slot = cache.seq_new()
    while cache.pos(slot) < 511:
        _step(cache, [(slot, min(64, 511 - cache.pos(slot)))])
    assert cache.reserve([(511, 1 + 8)]) == {}


@pytest.mark.parametrize("layout", ["cell", "sequence"])
def test_the_steps_write_bounds_cover_every_write_it_makes(tiny_models, layout):
    """The reservation skips its look at every sequence when the bounds fit the storage: the bounds must cover each
    step's writes (prompts of many lengths, prefills in chunks, decodes, sessions arriving and finishing)."""
    from engine.loading.loader import load_model
    from engine.runtime import build_runtime
    from engine.sampling import SamplerState
    from engine.sequence import Sequence

    lm = load_model(tiny_models["qwen3"].gguf_path)
    rt = build_runtime(lm, EngineConfig(kv_layout=layout, max_sessions=4, max_session_tokens=512, device="cpu",
                                        chunk_tokens=32, speculative="lookup"))
    lengths = [3, 70, 1, 150, 33, 9, 260, 2]
    for step in range(160):
        if step % 20 == 0 and lengths:
            prompt = [1 + (i * 7 + step) % 50 for i in range(lengths.pop())]
            rt.batcher.add(Sequence(step, prompt, SamplerState(SamplingParams(max_tokens=40))))
        furthest, tokens = rt._write_bounds()
        writes = rt._upcoming_writes()
        assert all(start + n + extra <= furthest for _, start, n, extra in writes)
        assert sum(n + extra for *_, n, extra in writes) <= tokens or tokens == rt.scheduler.config.step_tokens
        rt.step()
