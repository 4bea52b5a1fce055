"""Property tests of the cache: random new/clone/rm/rewind/step interleavings, speculative verify steps (drafts
written, partly kept, the rest rolled back, through ring wrap-arounds), and the prefix cache's park/match/adopt/evict,
against a list-of-values oracle (a slot's values stand for its tokens).

A mirror of every slot's values, kept only from what the cache tells its observers (KVCache.observers: copies, cuts,
removals) and the steps' own writes, must equal the oracle after every rule: what a DFlash drafter's per-slot context
relies on.

Every K is zero and every query is zero, so attention is the plain mean of the visible V values: any
value from another sequence, a stale ring row or a wrong window changes the mean and fails the check.
"""
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.cache import CacheConfig, KVCache, make_cache
from engine.errors import CacheConfigError, CacheError
from engine.prefix_cache import PrefixCache
from engine.session import common_prefix

MAX_SEQS, MAX_LEN, STEP = 4, 24, 4


class SlotMirror:
    """A cache observer holding each slot's values as a per-slot drafter context would (engine/speculative/dflash.py)."""

    def __init__(self):
        self.rows: dict[int, list[float]] = {}

    def on_clone(self, src: int, dst: int) -> None:
        if src in self.rows:
            self.rows[dst] = list(self.rows[src])

    def on_cut(self, slot: int, length: int) -> None:
        if length == 0:
            self.rows.pop(slot, None)
        elif slot in self.rows:
            del self.rows[slot][length:]
WINDOWS = [None, 3]  # layer 0 global, layer 1 sliding window 3 (a ring of 6 rows in the sequence layout)


class CacheMachine(RuleBasedStateMachine):
    layout = "sequence"

    @initialize()
    def setup(self):
        cfg = CacheConfig(self.layout, MAX_SEQS, MAX_LEN, MAX_SEQS * MAX_LEN, "float32", STEP, initial_capacity=8)
        self.cache = make_cache(cfg, WINDOWS, kv_heads=1, head_dim=2)
        self.values: dict[int, list[float]] = {}  # oracle: slot -> value at each position
        self.counter = 0.0
        self.prefixes = PrefixCache(self.cache, MAX_SEQS, 10**6)
        self.parked: set[int] = set()  # slots the prefix cache holds for closed conversations
        self.mirror = SlotMirror()
        self.cache.observers.append(self.mirror)

    def _active(self) -> list[int]:
        return sorted(set(self.values) - self.parked)

    def _fresh(self) -> float:
        self.counter += 1.0
        return self.counter

    @rule()
    def new(self):
        if len(self.values) == MAX_SEQS:
            with pytest.raises(CacheError):
                self.cache.seq_new()
            return
        slot = self.cache.seq_new()
        assert slot not in self.values
        self.values[slot] = []

    @precondition(lambda self: self._active())
    @rule(data=st.data())
    def clone(self, data):
        if len(self.values) == MAX_SEQS:
            return
        src = data.draw(st.sampled_from(self._active()))
        dst = self.cache.seq_clone(src)
        assert dst not in self.values
        self.values[dst] = list(self.values[src])

    @precondition(lambda self: self._active())
    @rule(data=st.data())
    def remove(self, data):
        slot = data.draw(st.sampled_from(self._active()))
        self.cache.seq_rm(slot)
        del self.values[slot]

    @precondition(lambda self: self._active())
    @rule(data=st.data())
    def rewind(self, data):
        slot = data.draw(st.sampled_from(self._active()))
        pos = data.draw(st.integers(0, len(self.values[slot])))
        floor = self.cache.book.floor(slot)
        if pos < floor:
            with pytest.raises(CacheError, match="ring"):
                self.cache.rewind(slot, pos)
        else:
            self.cache.rewind(slot, pos)
            del self.values[slot][pos:]

    @precondition(lambda self: self._active())
    @rule(data=st.data(), pad=st.integers(0, 2))
    def step(self, data, pad):
        writes = []
        for slot in self._chosen(data):
            room = MAX_LEN - len(self.values[slot])
            if room:
                writes.append((slot, data.draw(st.integers(1, min(STEP, room)))))
        if writes:
            self._run_step(writes, frozenset(), pad)
            self.cache.commit_step()

    @precondition(lambda self: self._active())
    @rule(data=st.data())
    def verify(self, data):
        """A speculative step: each sequence writes its last token and k drafts (rows attending one by one, or as a
        segment), then keeps the first a of the drafts: the rejected rows roll back, which the rings always allow."""
        writes = []
        for slot in self._chosen(data):
            room = MAX_LEN - len(self.values[slot])
            if room:
                writes.append((slot, 1 + data.draw(st.integers(0, min(STEP, room) - 1))))
        if not writes:
            return
        rowwise = frozenset(data.draw(st.sets(st.sampled_from([slot for slot, _ in writes]))))
        segments = self._run_step(writes, rowwise, 0)
        self.cache.commit_step()
        for seg in segments:
            keep = seg.start + 1 + data.draw(st.integers(0, seg.q_len - 1))
            assert self.cache.book.floor(seg.slot) <= keep, "a rejected draft could not be rolled back"
            self.cache.rewind(seg.slot, keep)
            del self.values[seg.slot][keep:]

    def _chosen(self, data) -> list[int]:
        live = self._active()
        return data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))

    def _run_step(self, writes: list[tuple[int, int]], rowwise: frozenset[int], pad: int):
        """Declares, prepares and attends a step of fresh values; checks every row saw exactly its visible values."""
        segments = self.cache.declare_step(writes, rowwise)
        total = sum(n for _, n in writes)
        self.cache.prepare_step(total + pad)
        new_vals = torch.tensor([self._fresh() for _ in range(total + pad)])
        kv = torch.zeros(total + pad, 1, 2)
        v = new_vals[:, None, None].expand(-1, 1, 2).contiguous()
        q = torch.zeros(total + pad, 2, 2)  # 2 query heads over 1 KV head: grouped-query
        outs = [self.cache.attend(layer, q, kv, v, scale=1.0) for layer in range(len(WINDOWS))]
        for seg in segments:
            self.values[seg.slot] += new_vals[seg.q_start : seg.q_start + seg.q_len].tolist()
            rows = self.mirror.rows.setdefault(seg.slot, [])
            del rows[seg.start :]  # as a drafter's record does: the step's rows follow what the slot held
            rows += new_vals[seg.q_start : seg.q_start + seg.q_len].tolist()
        for layer, window in enumerate(WINDOWS):
            for seg in segments:
                vals = self.values[seg.slot]
                for i in range(seg.q_len):
                    p = seg.start + i
                    lo = max(0, p - window + 1) if window else 0
                    want = sum(vals[lo : p + 1]) / (p + 1 - lo)
                    got = outs[layer][seg.q_start + i]
                    assert torch.allclose(got, torch.full_like(got, want)), (layer, seg, i)
            assert torch.all(outs[layer][total:] == 0)  # padding rows: no segment covers them
        return segments

    # -- the prefix cache
    @precondition(lambda self: self._active())
    @rule(data=st.data())
    def park(self, data):
        slot = data.draw(st.sampled_from(self._active()))
        before = set(self.prefixes._parked)
        if self.prefixes.park(slot, self.values[slot]):
            for gone in before - set(self.prefixes._parked):  # parking past the budget evicts the oldest
                self.parked.discard(gone)
                del self.values[gone]
            self.parked.add(slot)
        else:
            assert not self.values[slot]  # only an empty sequence is refused (the budget here is large)

    @rule()
    def evict(self):
        slot = self.prefixes.evict()
        assert (slot is None) == (not self.parked)
        if slot is not None:
            self.parked.remove(slot)
            del self.values[slot]

    @precondition(lambda self: self.values)
    @rule(data=st.data())
    def match(self, data):
        """A prompt sharing a prefix with some slot: the longest usable match over live and parked slots (rings
        checked), then copied into a new slot whose values the next steps' attention checks."""
        src = data.draw(st.sampled_from(sorted(self.values)))
        query = self.values[src][: data.draw(st.integers(0, len(self.values[src])))] + [-1.0, -2.0]
        active = [(slot, self.values[slot]) for slot in self._active()]
        got = self.prefixes.best(query, active)
        usable = [min(common_prefix(query, vals), len(query) - 1) for slot, vals in self.values.items()
                  if min(common_prefix(query, vals), len(query) - 1) >= max(1, self.cache.book.floor(slot))]
        assert (got.length if got else 0) == max(usable, default=0)
        if got is not None and len(self.values) < MAX_SEQS:
            slot = self.prefixes.adopt(got)
            self.values[slot] = self.values[got.slot][: got.length]

    @invariant()
    def bookkeeping(self):
        if not hasattr(self, "cache"):
            return
        book = self.cache.book
        assert sorted(book.live_slots()) == sorted(self.values)
        assert book.free_slots + len(self.values) == MAX_SEQS
        assert set(self.prefixes._parked) == self.parked and self.prefixes.parked_tokens() == sum(
            len(self.values[s]) for s in self.parked)
        for slot, vals in self.values.items():
            assert self.cache.pos(slot) == len(vals)
            assert self.mirror.rows.get(slot, []) == vals, slot
        assert set(self.mirror.rows) <= set(self.values), "the mirror kept a removed slot"
        if self.layout == "cell":
            owned = [c for cells in self.cache._cells_of.values() for c in cells]
            assert len(owned) == len(set(owned)), "a cell belongs to two sequences"
            assert not set(owned) & set(self.cache._free), "a used cell is on the free list"
            assert len(owned) == sum(len(v) for v in self.values.values()) <= self.cache.config.capacity
        else:
            assert all(t.shape[0] <= MAX_LEN for t in self.cache.k)


class CellCacheMachine(CacheMachine):
    layout = "cell"


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))
TestSequenceCache = CacheMachine.TestCase
TestSequenceCache.settings = SETTINGS
TestCellCache = CellCacheMachine.TestCase
TestCellCache.settings = SETTINGS


def test_capacity_below_sessions_times_context_is_rejected():
    with pytest.raises(CacheConfigError, match="exceeds the cache capacity"):
        CacheConfig("sequence", max_seqs=8, max_seq_len=4096, capacity=8 * 4096 - 1, dtype="float32")


def test_storage_dtype_is_required():
    with pytest.raises(CacheConfigError, match="storage dtype"):
        CacheConfig("cell", 1, 16, 16, dtype=None)


def test_context_limit_is_a_clear_error():
    cache = make_cache(CacheConfig("sequence", 1, 8, 8, "float32", 4), [None], 1, 2)
    slot = cache.seq_new()
    for _ in range(2):
        cache.declare_step([(slot, 4)])
        cache.commit_step()
    with pytest.raises(CacheError, match="context limit is 8"):
        cache.declare_step([(slot, 1)])


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_abort_is_safe_without_a_pending_step(layout):
    cache = make_cache(CacheConfig(layout, 2, 8, 16, "float32", 4), [None, 3], 1, 2)
    slot = cache.seq_new()
    cache.abort_step()  # nothing pending: nothing happens
    cache.declare_step([(slot, 2)])
    assert cache.has_pending_step
    cache.prepare_step()
    cache.abort_step()
    cache.abort_step()
    assert not cache.has_pending_step and cache.pos(slot) == 0
    cache.declare_step([(slot, 3)])  # the slot takes a step again
    cache.commit_step()
    assert cache.pos(slot) == 3


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_a_rows_attention_does_not_depend_on_other_sequences(layout, monkeypatch):
    """Through torch's attention (as on CUDA; not the CPU library's rows): a sequence's rows attend to bit-identical
    values whether its keys were written alone or interleaved with another sequence's in the same steps (a cell
    pool once attended over every cell with a mask, which summed a row's keys in pool order)."""
    monkeypatch.setattr(KVCache, "native_rows", lambda self: False)
    heads, kv_heads, dim, length = 4, 2, 64, 1100
    g = torch.Generator().manual_seed(0)
    rows = {name: torch.randn(length, heads + 2 * kv_heads, dim, generator=g) for name in ("x", "y")}

    def last_rows(with_neighbour: bool) -> torch.Tensor:
        cache = make_cache(CacheConfig(layout, 2, 2048, 4096, "float32", 128), [None, 256], kv_heads, dim)
        slots = {"x": cache.seq_new(), "y": cache.seq_new()}
        names = ("y", "x") if with_neighbour else ("x",)
        for start in range(0, length, 100):
            n = min(100, length - start)
            cache.declare_step([(slots[name], n) for name in names])
            cache.prepare_step()
            step = torch.cat([rows[name][start : start + n] for name in names])
            q, k, v = step[:, :heads], step[:, heads : heads + kv_heads], step[:, heads + kv_heads :]
            outs = [cache.attend(layer, q, k, v, dim ** -0.5)[-n:] for layer in range(2)]  # x's rows
            cache.commit_step()
        return torch.stack(outs)

    assert torch.equal(last_rows(False), last_rows(True))
