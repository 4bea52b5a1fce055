"""Speculative decoding is lossless: greedy tokens equal plain greedy, batched and alone, both layouts; sampled tokens
follow plain sampling's distribution (a chi-squared test that fails when the rejection rule is broken)."""
from dataclasses import replace

import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine.loading.loader import load_model
from engine.sampling import SamplerState, SamplingParams, probabilities, sample_ids
from engine.sequence import Sequence
from engine.speculative import make_drafter, verify
from engine.speculative.drafter import Pacing, PacingConfig
from engine.speculative.lookup import LookupConfig, NgramIndex, PromptLookup
from tests.support.engine_helpers import run_staggered
from tests.support.tiny_models import ARCHS

GREEDY = SamplingParams(max_tokens=24)
ARRIVALS = [0, 0, 1, 3]


def _run(layout: str, speculative: str = "off") -> RunConfig:
    return RunConfig(kv_layout=layout, max_seq_len=160, step_tokens=24, chunk_tokens=8, speculative=speculative)


def _prompts(vocab: int) -> list[list[int]]:
    """Prompts that repeat themselves (what prompt lookup drafts from), and one that does not."""
    g = torch.Generator().manual_seed(3)
    phrase = torch.randint(6, vocab, (7,), generator=g).tolist()
    other = torch.randint(6, vocab, (5,), generator=g).tolist()
    return [phrase * 4, (phrase + other) * 3, other * 6 + phrase, torch.randint(6, vocab, (21,), generator=g).tolist()]


@pytest.fixture(scope="module")
def models(tiny_models):
    return {arch: load_model(tiny_models[arch].gguf_path) for arch in ARCHS}


class ScriptedDrafter:
    """A test drafter: proposes the next tokens of a known answer, with every `wrong`-th draft token changed, so steps
    accept all, part or none of their drafts (exercising every rollback)."""

    name = "scripted"
    max_sequences = 64

    def __init__(self, answers: dict[int, list[int]], wrong: int, vocab: int, length: int = 5):
        self.answers, self.wrong, self.vocab, self.length = answers, wrong, vocab, length
        self.drafted = self.accepted = self.calls = 0

    def may_draft(self, seq):
        return True

    def propose(self, seqs, room):
        for seq, most in zip(seqs, room):
            done = len(seq.generated)
            draft = self.answers[seq.seq_id][done : done + min(self.length, most)]
            self.calls += 1
            seq.draft = [(t + 1) % self.vocab if (self.calls + i) % self.wrong == 0 else t for i, t in enumerate(draft)]

    def observe(self, seq, drafted, accepted):
        self.drafted += drafted
        self.accepted += accepted


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_drafts_right_and_wrong_give_plain_greedy_tokens(models, arch, layout):
    lm = models[arch]
    prompts = _prompts(lm.args.vocab_size)
    plain = run_staggered(make_batcher(lm, 4, _run(layout)), prompts, ARRIVALS, GREEDY)
    batcher = make_batcher(lm, 4, _run(layout))
    batcher.drafter = drafter = ScriptedDrafter(dict(enumerate(plain)), wrong=4, vocab=lm.args.vocab_size)
    assert run_staggered(batcher, prompts, ARRIVALS, GREEDY) == plain
    assert 0 < drafter.accepted < drafter.drafted  # whole, partial and failed drafts all happened
    assert batcher.steps < sum(len(p) for p in plain)  # and steps were saved
    assert not batcher.cache.book.live_slots()  # every slot came back


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_prompt_lookup_batched_and_alone_equal_plain_greedy(models, arch, layout):
    lm = models[arch]
    prompts = _prompts(lm.args.vocab_size)
    plain = [run_staggered(make_batcher(lm, 1, _run(layout)), [p], [0], GREEDY)[0] for p in prompts]
    batcher = make_batcher(lm, 4, _run(layout, "lookup"))
    seqs_before = batcher.steps
    assert run_staggered(batcher, prompts, ARRIVALS, GREEDY) == plain
    alone = [run_staggered(make_batcher(lm, 1, _run(layout, "lookup")), [p], [0], GREEDY)[0] for p in prompts]
    assert alone == plain
    assert batcher.steps - seqs_before < max(ARRIVALS) + sum(len(p) for p in prompts) // 8 + sum(map(len, plain))


def test_lookup_drafts_and_saves_steps_on_repetitive_text(models):
    lm = models["llama"]
    prompt = _prompts(lm.args.vocab_size)[0]
    params = SamplingParams(max_tokens=40)
    plain_batcher = make_batcher(lm, 1, _run("sequence"))
    plain = run_staggered(plain_batcher, [prompt], [0], params)[0]
    batcher = make_batcher(lm, 1, _run("sequence", "lookup"))
    seq = Sequence(0, list(prompt), SamplerState(params))
    batcher.add(seq)
    while batcher.has_work():
        batcher.step()
    assert seq.generated == plain
    assert seq.num_accepted > 0 and seq.num_steps < len(plain)  # random tiny models loop: lookup catches the loop
    assert batcher.steps < plain_batcher.steps


def test_a_stop_token_inside_accepted_drafts_ends_the_answer_there(models):
    lm = models["qwen2"]
    prompt = _prompts(lm.args.vocab_size)[1]
    plain = run_staggered(make_batcher(lm, 1, _run("sequence")), [prompt], [0], GREEDY)[0]
    stop = plain[6]
    expected = plain[: plain.index(stop) + 1]
    batcher = make_batcher(lm, 1, _run("sequence"))
    batcher.drafter = ScriptedDrafter({0: plain}, wrong=1000, vocab=lm.args.vocab_size, length=8)
    got = run_staggered(batcher, [prompt], [0], GREEDY, stop_ids=frozenset({stop}))[0]
    assert got == expected


@pytest.mark.parametrize("layout, window, prompt", [("sequence", -1, True), ("cell", -1, True), ("sequence", 5, True),
                                                   ("cell", -1, False), ("sequence", 5, False)])
def test_penalties_see_each_rows_drafts_so_penalised_greedy_stays_exact(models, layout, window, prompt):
    lm = models["qwen3"]
    prompts = _prompts(lm.args.vocab_size)
    params = SamplingParams(max_tokens=24, repetition_penalty=1.3, frequency_penalty=0.4, repeat_last_n=window,
                            penalize_prompt=prompt)
    plain = run_staggered(make_batcher(lm, 4, _run(layout)), prompts, ARRIVALS, params)
    batcher = make_batcher(lm, 4, _run(layout))
    batcher.drafter = drafter = ScriptedDrafter(dict(enumerate(plain)), wrong=5, vocab=lm.args.vocab_size)
    assert run_staggered(batcher, prompts, ARRIVALS, params) == plain
    assert 0 < drafter.accepted < drafter.drafted


def test_sequences_that_opt_out_are_never_drafted_for(models):
    lm = models["llama"]
    batcher = make_batcher(lm, 1, _run("sequence"))
    batcher.drafter = drafter = ScriptedDrafter({0: [1] * 12}, wrong=1000, vocab=lm.args.vocab_size)
    run_staggered(batcher, [_prompts(lm.args.vocab_size)[0]], [0], SamplingParams(max_tokens=12, speculative=False))
    assert drafter.calls == 0


# -- sampling: a verified row chooses its token exactly as plain sampling would at that position
LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 1.5, 1.0, 0.2, 0.1], [1.0, 1.0, 1.0, 1.0, 1.0]])
PARAMS = SamplingParams(temperature=0.8, top_k=4, max_tokens=8)


def _probs(row: torch.Tensor) -> torch.Tensor:
    return probabilities(row[None], [SamplerState(PARAMS)])[0].double()


def _chi2_pvalue(stat: float, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def _chi2_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of `counts` to `probs`."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token outside top-k was drawn"
    expected = probs[keep] * counts.sum()
    stat = float(((counts[keep].double() - expected) ** 2 / expected).sum())
    return _chi2_pvalue(stat, int(keep.sum()) - 1)


def _states(n: int) -> list[SamplerState]:
    return [SamplerState(replace(PARAMS, seed=1000 + i)) for i in range(n)]


def _check_distribution(rule, draft: list[int], n: int = 4000) -> list[float]:
    """p-values of a verify rule's tokens: the first against p_0, the second (after a kept first draft) against p_1."""
    out = rule(LOGITS.repeat(n, 1), _states(n), [draft] * n, [[7] * 5] * n)
    first = torch.bincount(torch.tensor([o[0] for o in out]), minlength=5)
    after = [o[1] for o in out if o[0] == draft[0] and len(o) > 1]
    if _probs(LOGITS[0])[draft[0]] == 0:  # a draft outside top-k is never kept
        return [_chi2_p(first, _probs(LOGITS[0])), 1.0 if not after else 0.0]
    second = torch.bincount(torch.tensor(after, dtype=torch.long), minlength=5)
    return [_chi2_p(first, _probs(LOGITS[0])), _chi2_p(second, _probs(LOGITS[1]))]


@pytest.mark.parametrize("draft", [[0, 1], [3, 2], [4, 0]])  # likely, unlikely, outside top-k
def test_sampled_verify_gives_plain_sampling_tokens_and_distribution(draft):
    n = 4000
    states, history = _states(n), [7] * 5
    got = verify.accept(LOGITS.repeat(n, 1), states, [draft] * n, [history] * n)
    plain_first = sample_ids(LOGITS[:1].repeat(n, 1), states, [history] * n).tolist()
    assert [o[0] for o in got] == plain_first  # the very token plain sampling draws at that position
    assert min(_check_distribution(verify.accept, draft, n)) > 1e-3


def test_the_chi_squared_check_catches_a_broken_rejection_rule():
    """The same check on a verify rule with the classic bug (keep d with probability p(d), but on a rejection draw
    from p instead of p with d removed): the draft's token is over-drawn and the check fails."""

    def broken(logits, states, drafts, histories):
        out = []
        for i, (state, draft) in enumerate(zip(states, drafts)):
            probs = probabilities(logits[i * 3 : i * 3 + 3], [state] * 3)
            g = torch.Generator().manual_seed(i)
            tokens = []
            for j, d in enumerate(draft + [None]):
                if d is not None and torch.rand(1, generator=g).item() < probs[j, d]:
                    tokens.append(d)
                    continue
                tokens.append(int(torch.multinomial(probs[j], 1, generator=g)))
                break
            out.append(tokens)
        return out

    assert min(_check_distribution(broken, [0, 1])) < 1e-6


@pytest.mark.parametrize("layout, penalties", [("sequence", {}), ("cell", {}),
                                               ("sequence", dict(presence_penalty=0.8, penalize_prompt=False))])
def test_seeded_sampling_with_drafts_gives_plain_sampling_tokens(models, layout, penalties):
    """Sampled answers, with drafts right and wrong and without: token for token the same, batched or alone (with
    the penalties reading the answer alone, a verified row still draws with its own position's noise)."""
    lm = models["gemma3"]
    prompts = _prompts(lm.args.vocab_size)
    each = [SamplingParams(temperature=t, top_p=0.9, seed=s, max_tokens=24, **penalties)
            for t, s in [(0.7, 1), (1.0, 2), (0.4, 3), (1.3, 4)]]
    plain = run_staggered(make_batcher(lm, 4, _run(layout)), prompts, ARRIVALS, each)
    batcher = make_batcher(lm, 4, _run(layout))
    batcher.drafter = drafter = ScriptedDrafter(dict(enumerate(plain)), wrong=4, vocab=lm.args.vocab_size)
    assert run_staggered(batcher, prompts, ARRIVALS, each) == plain
    assert 0 < drafter.accepted < drafter.drafted
    alone = run_staggered(make_batcher(lm, 1, _run(layout, "lookup")), prompts[:1], [0], each[:1])
    assert alone == plain[:1]


def test_sampled_drafts_on_a_model_keep_the_token_distribution(models):
    """End to end over 600 seeds: answers drafted for (the greedy answer's tokens) and not are the same answers."""
    lm = models["gemma3"]
    prompt = _prompts(lm.args.vocab_size)[0]
    params = SamplingParams(temperature=0.7, top_k=6, max_tokens=3)
    guess = run_staggered(make_batcher(lm, 1, _run("sequence")), [prompt], [0], SamplingParams(max_tokens=3))[0]
    drafters = []

    def answers(drafted: bool) -> list[tuple[int, ...]]:
        batcher = make_batcher(lm, 16, _run("sequence"))
        if drafted:
            batcher.drafter = ScriptedDrafter({i: guess for i in range(16)}, wrong=1000, vocab=1)
            drafters.append(batcher.drafter)
        seen = []
        for start in range(0, 600, 16):
            seqs = [Sequence(i, list(prompt), SamplerState(replace(params, seed=start + i))) for i in range(16)]
            for s in seqs:
                batcher.add(s)
            while batcher.has_work():
                batcher.step()
            seen += [tuple(s.generated) for s in seqs]
        return seen

    plain, drafted = answers(False), answers(True)
    assert 0 < drafters[0].accepted < drafters[0].drafted
    assert plain == drafted
    assert len({a[0] for a in plain}) > 1  # the seeds drew different answers


# -- the drafter's parts
def test_ngram_index_finds_the_latest_earlier_occurrence():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    index = NgramIndex(tokens, 2, 3)
    index.update(len(tokens) - 1)
    assert index.continuation((1, 2, 3), 4) == [7, 8, 1, 2]
    tokens.append(5)  # the list grows: the index catches up
    index.update(len(tokens))
    assert index.continuation((2, 3), 2) == [5]


def test_lookup_drafts_from_another_sequence_of_the_pool():
    lookup = PromptLookup()
    answered = Sequence(1, [5, 6, 7, 8, 9, 10, 11], SamplerState(GREEDY))
    lookup.propose([answered], [4])  # registers it
    asking = Sequence(2, [40, 41, 7, 8], SamplerState(GREEDY))
    lookup.propose([asking], [3])
    assert asking.draft == [9, 10, 11]


def test_a_sequence_drafts_from_its_own_text_whatever_looked_up_before_it():
    """Another sequence's lookup in the same step reads this one's index from the pool: it must not index the final
    n-gram, whose latest occurrence (the very end) would hide the earlier one this sequence drafts from."""
    lookup = PromptLookup()
    other = Sequence(1, [50, 51, 52, 53], SamplerState(GREEDY))
    seq = Sequence(2, [7, 8, 9, 7, 8], SamplerState(GREEDY))
    lookup.propose([other, seq], [4, 4])
    assert seq.draft == [9, 7, 8]
    for token in (9, 20, 7, 8):
        seq.append(token)
    later = Sequence(3, [60, 61, 62], SamplerState(GREEDY))  # new, so due: its lookup goes first
    lookup.propose([later, seq], [4, 4])
    assert seq.draft == [9, 20, 7, 8]


def test_a_step_of_many_lookups_drafts_from_3_grams_only_where_configured():
    """With shortest_shared 3, a sequence whose only match is a 2-gram drafts when at most two are due a lookup, and
    not when more are (their verify rows would pay for a 2-gram's guesses)."""
    def due(lookup, n):
        seqs = [Sequence(i, [5, 6, 7, 30 + i, 6, 7], SamplerState(GREEDY)) for i in range(n)]  # only (6, 7) recurs
        lookup.propose(seqs, [4] * n)
        return [s.draft for s in seqs]

    assert due(PromptLookup(LookupConfig(shortest_shared=3)), 2) == [[30, 6, 7], [31, 6, 7]]
    assert due(PromptLookup(LookupConfig(shortest_shared=3)), 3) == [[], [], []]
    assert due(PromptLookup(LookupConfig()), 3) == [[30, 6, 7], [31, 6, 7], [32, 6, 7]]


def test_a_lookup_asks_the_pool_once_not_each_pooled_list(monkeypatch):
    """Asking each of 160 earlier answers cost 0.14 ms a lookup (0.017 ms now: bench/lookup_host.py): the pool keeps one
    map of its n-grams' latest occurrences. Here 50 lists are pooled; the draft comes from the one that holds it."""
    lookup = PromptLookup()
    for i in range(50):
        lookup.propose([Sequence(100 + i, [1000 + 10 * i + j for j in range(10)], SamplerState(GREEDY))], [4])
    asked = []
    continuation = NgramIndex.continuation
    monkeypatch.setattr(NgramIndex, "continuation", lambda self, *a: asked.append(self) or continuation(self, *a))
    seq = Sequence(1, [7, 1203, 1204], SamplerState(GREEDY))  # a 2-gram of the 21st list
    lookup.propose([seq], [4])
    assert seq.draft == [1205, 1206, 1207, 1208]
    assert set(asked) == {seq.draft_state.index}  # its own list's map, then the pool's: no other list asked


def test_the_pool_forgets_a_list_it_drops_and_one_cut_back_and_takes_one_back():
    """A list dropped past the pool's budget drafts nothing (until its own sequence looks up again: then it is back);
    a list cut back (a stop string) drafts from what it holds now, not from what it was."""
    lookup = PromptLookup(LookupConfig(pool_tokens=20))
    old = Sequence(1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], SamplerState(GREEDY))
    lookup.propose([old], [4])
    lookup.propose([Sequence(2, list(range(50, 62)), SamplerState(GREEDY))], [4])  # 22 tokens: `old` goes
    asking = Sequence(3, [90, 3, 4], SamplerState(GREEDY))
    lookup.propose([asking], [4])
    assert asking.draft == []
    old.draft_state.pacing.resume_at = 0
    lookup.propose([old], [4])  # its sequence looks up again: back in the pool, most recent
    asking.draft_state.pacing.resume_at = 0
    lookup.propose([asking], [4])
    assert asking.draft == [5, 6, 7, 8]
    del old.token_ids[2:]  # cut back after 2, then it goes on otherwise
    old.token_ids.extend([30, 3, 4, 55, 56])
    gone = Sequence(4, [91, 5, 6], SamplerState(GREEDY))  # (5, 6) was in it, and is no more
    old.draft_state.pacing.resume_at = asking.draft_state.pacing.resume_at = 0
    lookup.propose([old, asking, gone], [4, 4, 4])
    assert (asking.draft, gone.draft) == ([55, 56], [])


def test_a_cpu_on_amx_tiles_lets_more_sequences_draft():
    from engine.speculative import TILE_SEQUENCES

    tiled, plain = make_drafter("lookup", None, tiled=True), make_drafter("lookup", None)
    assert (tiled.max_sequences, tiled.config.shortest_shared) == (TILE_SEQUENCES, 3)
    assert (plain.max_sequences, plain.config.shortest_shared) == (2, None)
    assert make_drafter("lookup", 64, tiled=True).config.shortest_shared is None  # CUDA graph runners: as before


def test_pacing_backs_off_after_misses_and_recovers():
    pacing = Pacing(PacingConfig(first=4, most=8, max_backoff=32))
    pacing.observe(4, 4)
    assert pacing.length == 6
    pacing.observe(6, 2)
    assert pacing.length == 3 and pacing.skip == 0
    skips = []
    for _ in range(7):
        pacing.observe(pacing.length, 0)
        skips.append(pacing.skip)
    assert skips == [1, 3, 7, 15, 31, 32, 32] and pacing.length == 1
    pacing.observe(1, 1)
    assert pacing.misses == 0


# -- through the engine thread: turns that end inside a verify step's tokens
@pytest.fixture(scope="module")
def clients(tiny_models):
    from engine.runtime import EngineConfig
    from tests.support.engine_client import Client

    out = {}
    for mode in ("off", "lookup"):
        c = Client(EngineConfig(max_sessions=2, max_session_tokens=256, step_tokens=32, chunk_tokens=16, speculative=mode))
        c.engine.start()
        c.model = c.load(tiny_models["llama"].gguf_path)
        out[mode] = c
    yield out
    for c in out.values():
        c.engine.shutdown()


def _answer(client, text: str, params: SamplingParams):
    """A raw document's continuation, asked twice: the second drafts from the first (a regenerated answer)."""
    _ask_raw(client, text, params)
    return _ask_raw(client, text, params)


def _ask_raw(client, text: str, params: SamplingParams):
    sid = client.open(client.model, params=params, raw=True)
    turn = client.send(sid, text)
    end = client.wait(turn)
    return client.tokens(turn), client.text(turn), end


@pytest.mark.parametrize("max_tokens", [9, 10, 11, 30])
def test_engine_turns_end_where_plain_decoding_ends_them(clients, max_tokens):
    text = "one two three four five six " * 6
    params = SamplingParams(max_tokens=max_tokens)
    plain, lookup = (_answer(clients[m], text, params) for m in ("off", "lookup"))
    assert lookup[0] == plain[0] and lookup[1] == plain[1] == lookup[2].text
    assert lookup[2].stats.completion_tokens == len(lookup[0]) == plain[2].stats.completion_tokens
    assert lookup[2].stats.accepted_tokens > 0 and lookup[2].stats.decode_steps < len(lookup[0])


def test_a_stop_string_inside_accepted_drafts_ends_the_turn_there(clients):
    text = "one two three four five six " * 6
    base = _answer(clients["off"], text, SamplingParams(max_tokens=40))
    assert len(base[1]) > 12
    stop = base[1][len(base[1]) // 2 : len(base[1]) // 2 + 3]
    params = SamplingParams(max_tokens=40, stop=[stop])
    plain, lookup = (_answer(clients[m], text, params) for m in ("off", "lookup"))
    assert lookup[2].reason == plain[2].reason == "stop_string"
    assert lookup[1] == plain[1] == lookup[2].text and stop not in lookup[1]
    assert lookup[2].stats.completion_tokens == plain[2].stats.completion_tokens
    assert lookup[2].stats.accepted_tokens > 0
    assert _ask_raw(clients["lookup"], text, params)[1] == plain[1]  # and again, from the pool and prefix cache


def test_a_fault_delivering_one_chats_token_ends_that_turn_alone(clients, monkeypatch):
    from engine import events as ev
    from engine.local_host import LocalHost

    client = clients["lookup"]
    params = SamplingParams(max_tokens=12)
    sids = [client.open(client.model, params=params, raw=True) for _ in range(2)]
    victim = sids[0]
    real = LocalHost._on_token

    def faulty(self, session, seq, token, after=0):
        if session.session_id == victim and len(seq.generated) == 3:
            raise RuntimeError("boom")
        return real(self, session, seq, token, after)

    monkeypatch.setattr(LocalHost, "_on_token", faulty)
    turns = [client.send(sid, "one two three four") for sid in sids]
    ends = [client.wait(t, timeout=30) for t in turns]
    assert isinstance(ends[0], ev.Error) and "boom" in ends[0].message
    assert isinstance(ends[1], ev.Finished) and ends[1].stats.completion_tokens == 12
    monkeypatch.setattr(LocalHost, "_on_token", real)
    assert isinstance(client.wait(client.send(victim, "again"), timeout=30), ev.Finished)  # the chat goes on


# -- the draft model drafter
def _draft_runtime(draft_lm):
    from engine.runtime import EngineConfig, build_runtime

    return build_runtime(draft_lm, EngineConfig(max_sessions=4, max_session_tokens=160, step_tokens=24, chunk_tokens=8,
                                                speculative="off", prefix_cache=False), keep_finished=True)


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_a_draft_model_gives_plain_tokens_and_saves_steps(models, tiny_models_q4, layout):
    """The Q4 copy of a model drafts for its float original (same tokenizer, near weights): most drafts are kept."""
    from engine.speculative.draft_model import DraftModel

    lm = models["qwen2"]
    prompts = _prompts(lm.args.vocab_size)
    plain_batcher = make_batcher(lm, 4, _run(layout))
    plain = run_staggered(plain_batcher, prompts, ARRIVALS, [GREEDY, PARAMS_T, GREEDY, GREEDY])
    batcher = make_batcher(lm, 4, _run(layout))
    batcher.drafter = DraftModel(_draft_runtime(load_model(tiny_models_q4["qwen2"].gguf_path)),
                                 PacingConfig(most_sequences=4))
    seqs_tokens = run_staggered(batcher, prompts, ARRIVALS, [GREEDY, PARAMS_T, GREEDY, GREEDY])
    assert seqs_tokens == plain
    assert batcher.steps < plain_batcher.steps


PARAMS_T = SamplingParams(temperature=0.9, seed=11, max_tokens=24)


def test_draft_model_through_the_engine_and_a_mismatched_one_noticed(tiny_models, tiny_models_q4):
    from engine import events as ev
    from engine.runtime import EngineConfig
    from tests.support.engine_client import Client

    def answer(config):
        c = Client(config)
        with c.engine:
            model = c.load(tiny_models["llama"].gguf_path)
            info = c.wait_for(lambda e: isinstance(e, ev.ModelLoaded)).info
            sid = c.open(model, params=SamplingParams(max_tokens=30), raw=True)
            end = c.ask(sid, "one two three four five six " * 3)
            return info, end

    base = dict(max_sessions=2, max_session_tokens=256, step_tokens=32, chunk_tokens=16)
    _, plain = answer(EngineConfig(**base, speculative="off"))
    info, drafted = answer(EngineConfig(**base, speculative="draft", draft_model=tiny_models_q4["llama"].gguf_path))
    assert info["speculative"] == "draft"
    assert drafted.text == plain.text and drafted.stats.accepted_tokens > 0
    assert drafted.stats.decode_steps < plain.stats.decode_steps
    mismatched, _ = answer(EngineConfig(**base, speculative="draft", draft_model=tiny_models["qwen2"].gguf_path))
    assert mismatched["speculative"] == "lookup"  # it loads, drafting from the prompt, and says why in one line
    assert [n for n in mismatched["notices"] if "cannot draft" in n and "tokenizers differ" in n]
    missing, _ = answer(EngineConfig(**base, speculative="draft", draft_model=tiny_models["qwen2"].gguf_path.parent / "gone.gguf"))
    assert missing["speculative"] == "lookup" and [n for n in missing["notices"] if "draft model could not be loaded" in n]


def test_no_drafts_while_more_sequences_decode_than_the_drafter_takes(models):
    lm = models["llama"]
    prompts = [_prompts(lm.args.vocab_size)[0]] * 3
    batcher = make_batcher(lm, 3, _run("sequence"))
    batcher.drafter = drafter = ScriptedDrafter({i: [1] * 24 for i in range(3)}, wrong=1000, vocab=lm.args.vocab_size)
    drafter.max_sequences = 2
    run_staggered(batcher, prompts, [0, 0, 0], SamplingParams(max_tokens=6))
    assert drafter.calls == 0  # three decode together to the end: one forward already serves them all


def test_verify_rows_stop_at_the_quantized_row_tile():
    """CUDA runners bound a step with drafts by their largest graph, and where the model's matrices run in the
    quantized decode GEMMs by their row tile: past 16 rows those add a dot per 16 rows on every weight."""
    from types import SimpleNamespace

    from engine.quant.weight import QuantTensor
    from engine.runner import _verify_rows

    graphs = SimpleNamespace(buckets=(1, 2, 4, 8, 16, 32, 64))
    int8 = QuantTensor("int8", (4, 8), "Q8_0", codes=torch.zeros(4, 8, dtype=torch.int8), scale=torch.ones(4))
    bf16 = QuantTensor("bf16", (4, 8), "F16", weight=torch.zeros(4, 8, dtype=torch.bfloat16))
    assert _verify_rows(torch.nn.Sequential(torch.nn.Linear(8, 4), int8), graphs) == 16
    assert _verify_rows(torch.nn.Sequential(torch.nn.Linear(8, 4), bf16), graphs) == 64
    assert _verify_rows(torch.nn.Linear(8, 4), graphs) == 64
    assert _verify_rows(torch.nn.Sequential(int8), SimpleNamespace(buckets=(1, 2, 4, 8))) == 8
    assert _verify_rows(torch.nn.Sequential(int8), None) is None


def test_no_drafts_where_the_verify_rows_leave_no_room(models):
    """A step whose sequences already fill the runner's verify rows carries no drafts (and look-ahead steps go on: the
    drafter is not due); the same drafter with room drafts, and both give plain greedy tokens."""
    lm = models["llama"]
    prompts = _prompts(lm.args.vocab_size)[:2]
    plain = run_staggered(make_batcher(lm, 2, _run("sequence")), prompts, [0, 0], GREEDY)
    for rows, drafts in ((2, False), (4, True)):
        batcher = make_batcher(lm, 2, replace(_run("sequence"), lookahead=True))
        batcher.runner.verify_rows = rows
        batcher.drafter = drafter = ScriptedDrafter(dict(enumerate(plain)), wrong=4, vocab=lm.args.vocab_size)
        assert batcher._drafting(2, 2) is drafts and batcher._drafting(1, 1) and not batcher._drafting(2, rows)
        assert run_staggered(batcher, prompts, [0, 0], GREEDY) == plain
        assert (drafter.drafted > 0) is drafts, rows
        assert (batcher.lookahead_steps > 10) is not drafts, rows  # a due drafter stops look-ahead steps
