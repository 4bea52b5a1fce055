"""The shared prefix cache at the runtime: a turn seeded from another slot's prefix (live or parked) generates
exactly what it generates from scratch, both layouts, across a sliding window; the parked budget holds; parked
prefixes never keep a waiting sequence out."""
from __future__ import annotations

import pytest
import torch

from engine.loading.loader import LoadOptions, load_model
from engine.runtime import EngineConfig, build_runtime
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence, Status
from engine.session import common_prefix

NEW = 10
KEPT: dict[int, int] = {}  # seq id -> cached tokens its last turn started from
WINDOW = 8  # the tiny gemma3's sliding window (tests/support/tiny_models.py)


@pytest.fixture(scope="module")
def models(tiny_models):
    return {arch: load_model(tiny_models[arch].gguf_path, LoadOptions()) for arch in ("llama", "gemma3")}


def runtime(lm, layout: str, sessions: int = 4, **config):
    cfg = EngineConfig(kv_layout=layout, max_sessions=sessions, max_session_tokens=256, step_tokens=32,
                       chunk_tokens=8, **config)
    return build_runtime(lm, cfg, keep_finished=True)


def prompt(lm, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(6, lm.args.vocab_size, (n,), generator=g).tolist()


def turn(rt, seq_id: int, ids: list[int], seq: Sequence | None = None, live=()) -> Sequence:
    """Runs one greedy turn of `ids` to its end; the sequence keeps its slot. Reuses a prefix from `live` slots or
    parked ones first, as a session's turn does."""
    seq = seq or Sequence(seq_id, [], SamplerState(SamplingParams(max_tokens=NEW)), max_len=rt.limit)
    rt.keep_prefix(seq, min(common_prefix(ids, seq.token_ids[: seq.num_cached]), len(ids) - 1))  # as a session does
    seq.token_ids, seq.generated, seq.num_prompt, seq.finish_reason = list(ids), [], len(ids), None
    seq.sampler = SamplerState(SamplingParams(max_tokens=NEW))
    KEPT[seq_id] = rt.reuse_prefix(seq, ids, [(s.slot, s.token_ids[: s.num_cached]) for s in live if s.slot is not None])
    rt.run(seq)
    while seq.status != Status.FINISHED:
        rt.step()
    return seq


def alone(lm, layout: str, ids: list[int]) -> list[int]:
    return turn(runtime(lm, layout, prefix_cache=False), 99, ids).generated


@pytest.mark.parametrize("layout", ["sequence", "cell"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_live_sessions_prefix_seeds_another_turn_exactly(models, arch, layout):
    lm = models[arch]
    shared = prompt(lm, 21, 1)
    rt = runtime(lm, layout)
    a = turn(rt, 0, shared + prompt(lm, 5, 2))
    b_ids = shared + prompt(lm, 7, 3)
    usable = rt.cache.book.floor(a.slot) <= len(shared)  # a sliding ring that moved on offers nothing
    assert usable or (arch == "gemma3" and layout == "sequence")
    b = turn(rt, 1, b_ids, live=[a])
    assert KEPT[1] == (len(shared) if usable else 0) and b.generated == alone(lm, layout, b_ids)


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_reused_count_is_what_the_turn_skipped(models, layout):
    lm = models["llama"]
    shared = prompt(lm, 30, 4)
    rt = runtime(lm, layout)
    a = turn(rt, 0, shared + prompt(lm, 3, 5))
    b = Sequence(1, [], SamplerState(SamplingParams(max_tokens=NEW)), max_len=rt.limit)
    kept = rt.reuse_prefix(b, shared + prompt(lm, 4, 6), [(a.slot, a.token_ids[: a.num_cached])])
    assert kept == 30 and b.num_cached == 30 and b.slot not in (None, a.slot)


@pytest.mark.parametrize("layout", ["sequence", "cell"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_closed_sessions_parked_prefix_seeds_a_new_chat(models, arch, layout):
    lm = models[arch]
    system = prompt(lm, 25, 7)
    rt = runtime(lm, layout)
    a = turn(rt, 0, system + prompt(lm, 4, 8))
    rt.park(a)  # the chat is closed: its slot stays, parked
    assert a.slot is None and rt.prefixes.parked == 1
    b_ids = system + prompt(lm, 6, 9)
    usable = arch != "gemma3" or layout == "cell"  # 25 + 4 + 10 tokens: the tiny window's ring moved past 25
    b = turn(rt, 1, b_ids)
    assert KEPT[1] == (len(system) if usable else 0) and b.generated == alone(lm, layout, b_ids)


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_regenerate_and_an_edited_branch_reuse_what_they_share(models, layout):
    """A session's own longer history, then another session's branch: each turn equals its run from scratch."""
    lm = models["gemma3"]
    rt = runtime(lm, layout)
    base = prompt(lm, 19, 10)
    a = turn(rt, 0, base + prompt(lm, 5, 11))
    first = a.generated
    again = turn(rt, 0, list(a.token_ids[: a.num_prompt]), seq=a)  # regenerate: the same prompt again
    assert again.generated == first
    edited = base + prompt(lm, 9, 12)  # an earlier message edited: a new branch from `base`
    usable = rt.cache.book.floor(a.slot) <= len(base)
    b = turn(rt, 1, edited, live=[a])
    assert KEPT[1] == (len(base) if usable else 0) and b.generated == alone(lm, layout, edited)


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_a_prefix_whose_ring_moved_on_is_not_reused(models, layout):
    """Sliding window: once the source has run far past the shared prefix, a `sequence` layout's rings no longer
    hold what a continuation from there needs: no reuse (the `cell` layout keeps every row: reused). Either way
    the exact answer."""
    lm = models["gemma3"]
    rt = runtime(lm, layout)
    shared = prompt(lm, 12, 13)
    a = turn(rt, 0, shared + prompt(lm, 120, 14))  # far past the window and the chunk-sized ring slack
    rings = bool(rt.cache.book.rings)
    assert rings == (layout == "sequence") and (rt.cache.book.floor(a.slot) > len(shared)) == rings
    b_ids = shared + prompt(lm, 5, 15)
    match = rt.prefixes.best(b_ids, [(a.slot, a.token_ids[: a.num_cached])])
    assert (match is None) == rings and (rings or match.length == len(shared))
    assert turn(rt, 1, b_ids, live=[a]).generated == alone(lm, layout, b_ids)


def test_parked_budget_and_waiting_sequences_take_parked_slots(models):
    lm = models["llama"]
    rt = runtime(lm, "sequence", sessions=2, prefix_tokens=40)
    big = turn(rt, 0, prompt(lm, 45, 16))
    rt.park(big)  # over the token budget: freed, not parked
    assert rt.prefixes.parked == 0 and rt.cache.book.free_slots == 2
    a, b = turn(rt, 1, prompt(lm, 20, 17)), turn(rt, 2, prompt(lm, 15, 18))
    rt.park(a)
    rt.park(b)  # 20 + 15 + more would pass 40 tokens of budget: a stays only while it fits
    assert rt.prefixes.parked_tokens() <= 40
    assert rt.free_slots() == 2  # parked slots count as available
    c, d = turn(rt, 3, prompt(lm, 9, 19)), turn(rt, 4, prompt(lm, 11, 20))  # both admitted: parked slots given up
    assert c.generated and d.generated and c.slot is not None and d.slot is not None
    assert rt.prefixes.parked == 0


@pytest.mark.parametrize("layout", ["sequence", "cell"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_compare_columns_compute_a_shared_prompt_once(models, arch, layout):
    """The same prompt sent to several columns at once: the first prefills it, the others wait, copy it and run
    only the last token; each answer equals its run from scratch."""
    lm = models[arch]
    rt = runtime(lm, layout)
    ids = prompt(lm, 70, 21)
    seqs = [Sequence(i, list(ids), SamplerState(SamplingParams(max_tokens=NEW)), max_len=rt.limit) for i in range(3)]
    for s in seqs:
        assert rt.follow(s, seqs) == (s is not seqs[0])
        rt.run(s)
    while any(s.status != Status.FINISHED for s in seqs):
        rt.step()
    want = alone(lm, layout, ids)
    assert [s.generated for s in seqs] == [want] * 3
    assert [s.num_reused for s in seqs] == [0, len(ids) - 1, len(ids) - 1]


def test_a_cancelled_follower_ends_and_a_cancelled_leader_frees_its_followers(models):
    lm = models["llama"]
    rt = runtime(lm, "sequence")
    ids = prompt(lm, 60, 22)
    a, b, c = (Sequence(i, list(ids), SamplerState(SamplingParams(max_tokens=NEW)), max_len=rt.limit) for i in range(3))
    rt.run(a)
    assert rt.follow(b, [a]) and rt.follow(c, [a])
    rt.run(b)
    rt.run(c)
    rt.stop(c, "cancelled")
    assert c.status == Status.FINISHED and c.finish_reason == "cancelled"
    rt.stop(a, "cancelled")  # before its prefill ended: b goes on by itself
    while b.status != Status.FINISHED:
        rt.step()
    assert b.generated == alone(lm, "sequence", ids)



def test_a_fork_takes_a_parked_slot_when_none_is_free(models):
    lm = models["llama"]
    rt = runtime(lm, "sequence", sessions=2)
    a = turn(rt, 0, prompt(lm, 12, 23))
    rt.park(turn(rt, 1, prompt(lm, 9, 24)))
    assert rt.cache.book.free_slots == 0 and rt.free_slots() == 1
    child = rt.fork(a, 5)
    assert child is not None and child.num_cached == a.num_cached and rt.prefixes.parked == 0


def test_a_long_prompt_is_snapshotted_before_the_answer_moves_the_rings_on(models):
    """Sliding rings (`sequence` layout): a chat's answer moves its rings past its prompt, so a parked copy taken
    right after the prefill seeds the next chat with the same system prompt, exactly."""
    lm = models["gemma3"]
    rt = runtime(lm, "sequence")
    rt.snapshot_min = 20
    system = prompt(lm, 25, 25)
    a = turn(rt, 0, system + prompt(lm, 4, 26))
    assert rt.cache.book.floor(a.slot) > len(system) and rt.prefixes.parked == 1  # a's own slot offers nothing now
    b_ids = system + prompt(lm, 6, 27)
    b = turn(rt, 1, b_ids, live=[a])
    assert KEPT[1] == len(system) and b.generated == alone(lm, "sequence", b_ids)
    off = runtime(lm, "sequence")  # the default threshold: a 29-token prompt is not copied
    turn(off, 0, system + prompt(lm, 4, 26))
    assert off.prefixes.parked == 0


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_a_parked_prefix_seeds_a_turn_when_no_slot_is_free_to_copy_into(models, layout):
    """Every slot taken, the only parked one holding the new turn's prefix: the turn takes that slot over (it used to
    prefill everything, then evict the very prefix it needed to get a slot)."""
    lm = models["llama"]
    rt = runtime(lm, layout, sessions=2)
    system = prompt(lm, 30, 28)
    rt.park(turn(rt, 0, system + prompt(lm, 4, 29)))
    turn(rt, 1, prompt(lm, 12, 30))  # a live chat holds the other slot
    assert rt.cache.book.free_slots == 0 and rt.prefixes.parked == 1
    c_ids = system + prompt(lm, 6, 31)
    c = turn(rt, 2, c_ids)
    assert KEPT[2] == len(system) and rt.prefixes.parked == 0
    assert c.generated == alone(lm, layout, c_ids)
