"""DFlash block drafting (engine/speculative/dflash.py): lossless whatever the drafter proposes, batched and alone,
both layouts; its context follows the target's cache through rejected drafts and new turns; a drafter trained by
training/dflash.py on the target's own answers gets drafts kept; a drafter for another model is refused with a notice."""
from pathlib import Path

import pytest
import torch

from engine.loading.loader import load_model
from engine.runtime import EngineConfig, build_runtime
from engine.sampling import SamplingParams
from engine.speculative.dflash import DFlashDrafter
from engine.speculative.dflash_net import DFlashConfig, DFlashNet, draft_mode, is_dflash_file, load, save
from tests.support.engine_helpers import run_staggered
from training import dflash as training

GREEDY = SamplingParams(max_tokens=24)
ARRIVALS = [0, 0, 1, 3]


@pytest.fixture(scope="module")
def models(tiny_models_q4):
    return {arch: load_model(tiny_models_q4[arch].gguf_path) for arch in ("llama", "gemma3")}


def _prompts(vocab: int, n: int = 4, seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(6, vocab, (5 + 4 * i,), generator=g).tolist() for i in range(n)]


def _net(lm, seed: int = 0, block: int = 6, vocab_ids: torch.Tensor | None = None) -> DFlashNet:
    torch.manual_seed(seed)
    return training.new_net(lm, block=block, layers=1, vocab_ids=vocab_ids)


def _some_tokens(lm, n: int = 40) -> torch.Tensor:
    return torch.randperm(lm.args.vocab_size, generator=torch.Generator().manual_seed(1))[:n].sort().values


def _runtime(lm, net: DFlashNet | None, sessions: int, layout: str = "sequence"):
    config = EngineConfig(kv_layout=layout, max_sessions=sessions, max_session_tokens=160, step_tokens=24,
                          chunk_tokens=8, prefix_cache=False, speculative="dflash" if net else "off",
                          draft_model=Path("drafter.safetensors") if net else None)
    return build_runtime(lm, config, keep_finished=False, draft=net)


def _run(lm, net, prompts, arrivals, sessions, layout="sequence", params=GREEDY):
    rt = _runtime(lm, net, sessions, layout)
    return run_staggered(rt.batcher, prompts, arrivals, params, lm.tokenizer.stop_ids), rt


@pytest.mark.parametrize("layout", ["sequence", "cell"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("part", [False, True], ids=["whole-vocab", "draft-vocab"])
def test_untrained_drafts_leave_greedy_tokens_unchanged_batched_and_alone(models, arch, layout, part):
    lm = models[arch]
    prompts = _prompts(lm.args.vocab_size)
    plain, _ = _run(lm, None, prompts, ARRIVALS, 4, layout)
    net = _net(lm, vocab_ids=_some_tokens(lm) if part else None)
    batched, rt = _run(lm, net, prompts, ARRIVALS, 4, layout)
    assert rt.batcher.drafter.name == "dflash"
    alone = [_run(lm, net, [p], [0], 1, layout)[0][0] for p in prompts]
    assert batched == plain and alone == plain


def test_the_drafters_context_follows_the_cache(models):
    """After every step each sequence's draft context covers exactly its cached positions, through rejected drafts,
    and a new turn that rewinds the cache cuts it back."""
    lm = models["llama"]
    rt = _runtime(lm, _net(lm), 2)
    from engine.sampling import SamplerState
    from engine.sequence import Sequence

    seqs = [Sequence(i, p, SamplerState(GREEDY), lm.tokenizer.stop_ids, max_len=rt.limit)
            for i, p in enumerate(_prompts(lm.args.vocab_size, 2))]
    for s in seqs:
        rt.batcher.add(s)
    drafted, contexts = 0, rt.batcher.drafter.contexts
    while rt.batcher.has_work():
        rt.batcher.step()
        for s in seqs:
            if s.slot is not None and s.slot in contexts:
                assert contexts[s.slot].length == s.num_cached
        drafted = sum(s.num_drafted for s in seqs)
    assert drafted > 0


def test_rows_of_sequences_that_do_not_draft_are_projected_in_runs(models, monkeypatch):
    """Three sequences decoding, a drafter that drafts for two at most: none drafts (until one finishes), so each
    context keeps its tap rows pending, and projects them once MAX_PENDING wait; the keys and values it then holds
    are those of its whole cached text's taps projected at once."""
    from engine.sampling import SamplerState
    from engine.sequence import Sequence
    from engine.speculative import dflash

    monkeypatch.setattr(dflash, "MAX_PENDING", 8)
    lm = models["gemma3"]
    net = _net(lm)
    rt = _runtime(lm, net, 3)
    assert rt.batcher.drafter.max_sequences == 2
    seqs = [Sequence(i, p, SamplerState(GREEDY), lm.tokenizer.stop_ids, max_len=rt.limit)
            for i, p in enumerate(_prompts(lm.args.vocab_size, 3))]
    for s in seqs:
        rt.batcher.add(s)
    contexts, checked = rt.batcher.drafter.contexts, 0
    while rt.batcher.has_work():
        rt.batcher.step()
        for s in seqs:
            context = contexts.get(s.slot) if s.slot is not None else None
            if context is None:
                continue
            assert context.length == s.num_cached and context.length - context.projected < 8
            if context.projected and not checked and all(x.num_drafted == 0 for x in seqs):
                ids = s.token_ids[: context.projected]
                taps = training.target_taps(lm, [ids], net.config.taps)[0]
                with torch.inference_mode():
                    want = net.context_kv(net.features(taps), torch.arange(len(ids)))
                for (k, v), (wk, wv) in zip(context.view(), want):
                    torch.testing.assert_close(k, wk, rtol=1e-4, atol=1e-4)
                    torch.testing.assert_close(v, wv, rtol=1e-4, atol=1e-4)
                checked += 1
    assert checked


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_training_taps_of_many_sequences_per_step_are_each_ones_alone(models, arch):
    """training.target_taps computes many sequences per prefill step, in chunks: each sequence's taps are those it
    gets alone in one chunk (what the drafter sees when serving it)."""
    lm = models[arch]
    seqs = _prompts(lm.args.vocab_size, 5, seed=4)
    seqs[2] = seqs[2] * 3  # one longer than a chunk
    taps = _net(lm).config.taps
    together = training.target_taps(lm, seqs, taps, step_tokens=32, chunk=16)
    for ids, got in zip(seqs, together):
        alone = training.target_taps(lm, [ids], taps, step_tokens=64, chunk=64)[0]
        assert got.shape == (len(ids), len(taps) * lm.args.hidden_size)
        torch.testing.assert_close(got, alone, rtol=0, atol=1e-5)


def test_a_trained_drafter_gets_drafts_kept(models, tmp_path):
    """Trained on the target's own greedy answers, the drafter drafts tokens the target keeps when it serves those
    prompts (the serving taps are the training ones); the answers stay the plain ones. (A tiny random model's
    answers share nothing to generalise from: held-out acceptance is the real model's, training/dflash.py.)"""
    lm = models["llama"]
    prompts = _prompts(lm.args.vocab_size, 8, seed=11)
    answers = training.generate(lm, prompts, 40, 0.0, sessions=8, seed=0)
    vocab_ids = training.draft_vocabulary([p + a for p, a in zip(prompts, answers)], 10_000)
    assert len(vocab_ids) < lm.args.vocab_size  # a head over the tokens the answers use: the part-vocabulary path
    net = _net(lm, vocab_ids=vocab_ids)
    examples = training.build_examples(lm, answers, prompts, net.config.taps, torch.device("cpu"))
    head = training.dense_head(lm.model, vocab_ids)
    torch.manual_seed(0)
    training.train(net, lm, head, examples, steps=200, lr=3e-3, anchors=16, device=torch.device("cpu"),
                   log=lambda line: None)
    assert training.acceptance(net, lm, head, examples, torch.device("cpu"))["mean_kept"] > 0.5
    save(net, tmp_path / "d.safetensors", target=lm.name)
    params = SamplingParams(max_tokens=40)
    plain, plain_rt = _run(lm, None, prompts[:2], [0, 0], 2, params=params)
    got, rt = _run(lm, load(tmp_path / "d.safetensors"), prompts[:2], [0, 0], 2, params=params)
    assert got == plain == answers[:2]
    assert rt.batcher.steps < plain_rt.batcher.steps, (rt.batcher.steps, plain_rt.batcher.steps)  # drafts were kept


def test_a_drafter_file_round_trips_and_others_are_refused(models, tmp_path, tiny_models_q4):
    lm = models["gemma3"]
    net = _net(lm, seed=5, vocab_ids=_some_tokens(lm))
    path = tmp_path / "drafter.safetensors"
    save(net, path, target=lm.name)
    again = load(path)
    assert again.config == net.config
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), again.state_dict().values()))
    assert again.vocab_ids.dtype == torch.long and torch.equal(again.vocab_ids, _some_tokens(lm))
    assert is_dflash_file(path) and draft_mode(path) == "dflash"
    gguf = tiny_models_q4["llama"].gguf_path
    assert not is_dflash_file(gguf) and draft_mode(gguf) == "draft"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a Parley DFlash drafter"):
        load(tmp_path / "other.safetensors")
    (tmp_path / "broken.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a safetensors file"):
        load(tmp_path / "broken.safetensors")


def test_a_drafter_for_another_model_is_refused_with_a_notice(models):
    llama, gemma = models["llama"], models["gemma3"]
    net = _net(gemma)
    if net.config.hidden == llama.args.hidden_size and net.config.vocab == llama.args.vocab_size:
        net = DFlashNet(DFlashConfig(hidden=llama.args.hidden_size + 8, vocab=llama.args.vocab_size, taps=(0,)))
    with pytest.raises(ValueError, match="trained for"):
        DFlashDrafter(net, llama.model, _runtime(llama, None, 1).cache)
    rt = _runtime(llama, net, 2)
    assert rt.batcher.drafter.name == "lookup"
    assert any("DFlash drafter cannot draft" in n for n in llama.notices)
    llama.notices.clear()


def test_the_cli_picks_dflash_for_a_drafter_file(models, tmp_path):
    import argparse

    from cli.options import add_engine_options, engine_config, paths_of

    path = tmp_path / "d.safetensors"
    save(_net(models["llama"]), path)
    p = argparse.ArgumentParser()
    add_engine_options(p)
    args = p.parse_args(["--draft-model", str(path)])
    assert engine_config(args, paths_of(args)).speculative == "dflash"


def test_a_prefix_copied_from_a_parked_chat_brings_its_draft_context(models):
    """A new chat whose prompt starts with a parked chat's tokens copies that slot's cache and its draft context, so
    it drafts from its first decode step; the answer is the one it gives from scratch without drafts."""
    from tests.engine import test_prefix_cache as prefix

    lm = models["llama"]
    config = EngineConfig(max_sessions=3, max_session_tokens=160, step_tokens=24, chunk_tokens=8,
                          speculative="dflash", draft_model=Path("drafter.safetensors"))
    rt = build_runtime(lm, config, keep_finished=True, draft=_net(lm))
    first = prefix.turn(rt, 0, _prompts(lm.args.vocab_size, 1, seed=5)[0])
    rt.park(first)
    ids = first.token_ids + [7, 8, 9]
    second = prefix.turn(rt, 1, ids)
    assert prefix.KEPT[1] > 0  # the prefix came from the parked slot
    assert rt.batcher.drafter.contexts[second.slot].length == second.num_cached
    assert second.num_drafted > 0
    assert second.generated == prefix.turn(_runtime(lm, None, 1), 2, ids).generated


def test_a_draft_vocabulary_is_the_most_frequent_tokens():
    assert training.draft_vocabulary([[5, 5, 5, 2, 9], [2, 7, 5]], 2).tolist() == [2, 5]
    assert training.draft_vocabulary([[3, 3, 1]], 10).tolist() == [1, 3]  # no more than occur
    with pytest.raises(ValueError, match="invalid DFlash config"):
        DFlashConfig(hidden=8, vocab=16, taps=(0,), heads=2, kv_heads=1, head_dim=4, draft_vocab=17)


def test_many_blocks_in_one_pass_are_each_block_alone():
    """Drafting for many sequences runs their blocks through the draft layers at once, each over its own context:
    each block's outputs are those it gets alone."""
    torch.manual_seed(0)
    config = DFlashConfig(hidden=32, vocab=50, taps=(0, 1), layers=2, heads=4, kv_heads=2, head_dim=8,
                          intermediate=64, block=5)
    net = DFlashNet(config)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))  # the branch ends start at zero: give them weights
    lengths = [3, 11, 7]
    contexts = [net.context_kv(net.features(torch.randn(n, 2 * 32)), torch.arange(n)) for n in lengths]
    rows = torch.randn(len(lengths) * config.block, 32)
    positions = torch.cat([torch.arange(n, n + config.block) for n in lengths])
    together = net.forward_blocks(rows, positions, contexts)
    for s, context in enumerate(contexts):
        own = slice(s * config.block, (s + 1) * config.block)
        torch.testing.assert_close(together[own], net(rows[own], positions[own], context), rtol=1e-5, atol=1e-5)


def test_training_for_minutes_and_for_a_total_is_refused(monkeypatch, capsys, tmp_path):
    """`python -m training.dflash --minutes 5 --total-minutes 30` trained to the total, --minutes dropped unread."""
    import pytest

    from training import dflash as trainer

    monkeypatch.setattr("sys.argv", ["dflash", "--target", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "d"),
                                     "--minutes", "5", "--total-minutes", "30"])
    with pytest.raises(SystemExit) as stop:
        trainer.main()
    assert stop.value.code == 2
    assert capsys.readouterr().err == ("dflash: argument --minutes: not with --total-minutes, which sets the whole "
                                       "run's length; give one\n")


def test_flags_that_init_or_existing_data_override_are_refused(capsys, tmp_path):
    """--init d.safetensors --layers 3 --block 4 trained d's 1 layer and block 8, and --prompts 50 --tokens 64 beside
    an existing --data file trained on its 2 answers of 8 tokens, each exit 0 without a word."""
    import pytest

    from training import dflash as trainer

    data = tmp_path / "data.pt"
    data.write_bytes(b"")
    base = ["--target", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "d")]
    cases = [(["--init", "x", "--layers", "3"], "--layers: not with --init, whose drafter keeps its own block, layers "
                                                "and draft vocabulary; give one"),
             (["--block", "4", "--init", "x"], "--block: not with --init"),
             (["--init", "x", "--draft-vocab", "0"], "--draft-vocab: not with --init"),
             (["--data", str(data), "--prompts", "50"], f"--prompts: not with --data {data}, which exists: its answers "
                                                       "are reused as they were made (move it away for new ones); give one"),
             (["--tokens", "64", "--data", str(data)], "--tokens: not with --data"),
             (["--data", str(data), "--sessions", "4"], "--sessions: not with --data")]
    for argv, words in cases:
        with pytest.raises(SystemExit) as stop:
            trainer.main(base + argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(f"dflash: argument {words}") and err.count("\n") == 1, argv
    # a --data file yet to be made takes them all, and defaults fill what was not given (the target is then loaded)
    args = trainer.parse(base + ["--data", str(tmp_path / "new.pt"), "--prompts", "50"])
    assert (args.prompts, args.samples, args.block) == (50, 1, 8)
