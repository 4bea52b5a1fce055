"""CPU decode tapes (engine/cpu_tape.py): replayed steps give exactly the eager steps' tokens, on every tiny
architecture in the blocks format, as sessions come and go (new row counts), across a K/V storage that regrows; a
model whose step computes outside the library is refused and stays eager."""
from __future__ import annotations

import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine import cpu_tape
from engine.loading.loader import LoadOptions, load_model
from engine.quant import weight
from engine.sampling import SamplingParams
from tests.support.engine_helpers import run_staggered
from tests.support.tiny_models import ARCHS

pytestmark = pytest.mark.skipif(not weight.blocks_available(), reason="the CPU kernel does not build here")


@pytest.fixture(scope="module")
def blocks_models(tiny_models_q4):
    return {arch: load_model(tiny_models_q4[arch].gguf_path, LoadOptions(weights="quantized")) for arch in ARCHS}


def _prompts(lm, lengths=(3, 11, 29, 40)):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(6, lm.args.vocab_size, (n,), generator=g).tolist() for n in lengths]


def _run(lm, taped: bool, run: RunConfig, prompts, arrivals, params):
    batcher = make_batcher(lm, len(prompts), run)
    if taped:
        assert batcher.runner.tapes is not None  # on by default on the library's kernels
    else:
        batcher.runner.tapes = None
    return run_staggered(batcher, prompts, arrivals, params), batcher.runner.tapes


@pytest.mark.parametrize("arch", ARCHS)
def test_replayed_steps_equal_eager_steps(blocks_models, arch):
    lm = blocks_models[arch]
    prompts = _prompts(lm)
    params = [SamplingParams(max_tokens=n) for n in (14, 6, 10, 12)]  # they end apart: row counts 4, 3, 2, 1
    run = RunConfig(max_seq_len=128, step_tokens=16, chunk_tokens=8)
    eager, _ = _run(lm, False, run, prompts, [0, 0, 2, 5], params)
    taped, tapes = _run(lm, True, run, prompts, [0, 0, 2, 5], params)
    assert taped == eager
    assert tapes.refused is None and len(tapes.tapes) >= 2  # steps were recorded, for more than one row count


@pytest.fixture
def recorded(monkeypatch) -> list[int]:
    """The row count of each tape recorded, in order."""
    widths: list[int] = []
    real = cpu_tape.DecodeTapes._record

    def counting(self, t, h, ropes):
        widths.append(t)
        return real(self, t, h, ropes)

    monkeypatch.setattr(cpu_tape.DecodeTapes, "_record", counting)
    return widths


def test_tapes_follow_a_regrown_storage(blocks_models, recorded):
    """The cache starts small and regrows mid-decode: the old tapes go, new ones record, the tokens stay."""
    lm = blocks_models["llama"]
    prompts = _prompts(lm, (236,))
    params = SamplingParams(max_tokens=40)
    run = RunConfig(max_seq_len=1024)  # 256 rows a sequence at first: the decode crosses them and the storage doubles
    eager, _ = _run(lm, False, run, prompts, [0], params)
    taped, tapes = _run(lm, True, run, prompts, [0], params)
    assert taped == eager
    assert recorded.count(1) >= 2  # recorded again over the regrown storage


def test_a_step_that_computes_outside_the_library_is_refused(blocks_models, monkeypatch):
    lm = blocks_models["gemma3"]
    prompts = _prompts(lm, (4, 9))
    params = SamplingParams(max_tokens=8)
    run = RunConfig(max_seq_len=64)
    eager, _ = _run(lm, False, run, prompts, [0, 0], params)
    real = type(lm.model).forward_hidden

    def with_torch_op(self, h, x, ropes, cache, rows):
        return real(self, h * 1.0, x, ropes, cache, rows)  # a multiply a replay would skip

    monkeypatch.setattr(type(lm.model), "forward_hidden", with_torch_op)
    taped, tapes = _run(lm, True, run, prompts, [0, 0], params)
    assert taped == eager
    assert tapes.refused == "mul" and not tapes.tapes


def _widths(lm, n: int):
    """n sessions of which one ends every other step: decode steps of n rows down to 1."""
    prompts = _prompts(lm, tuple(range(3, 3 + n)))
    return prompts, [0] * n, [SamplingParams(max_tokens=2 + 2 * i) for i in range(n)]


def test_every_width_stays_taped_in_the_memory_of_the_widest(blocks_models, recorded):
    """Twelve widths (78 rows) stay taped: the tapes' tensors share one arena, as large as the widest tape needs, so
    a second turn records none of them again (kept within 64 rows, each tape with its own memory, it recorded
    several again: summarise's two drafting sessions, widths 2 to 17, re-recorded 17 of 47 steps)."""
    lm = blocks_models["qwen3"]
    prompts, arrivals, params = _widths(lm, 12)
    batcher = make_batcher(lm, 12, RunConfig(max_seq_len=64))
    taped = run_staggered(batcher, prompts, arrivals, params)
    tapes = batcher.runner.tapes
    eager, _ = _run(lm, False, RunConfig(max_seq_len=64), prompts, arrivals, params)
    assert taped == eager
    assert sorted(tapes.tapes) == list(range(1, 13)) and sorted(recorded) == list(range(1, 13))
    assert tapes.arena.memory.numel() == max(tape.size for tape in tapes.tapes.values()) == tapes.tapes[12].size
    recorded.clear()
    assert run_staggered(batcher, prompts, arrivals, params) == eager
    assert recorded == []


def test_tapes_share_one_logits_buffer_and_keep_none_of_their_own(blocks_models):
    """Every tape's logits are the first rows of one buffer, not in the arena of the tapes' own tensors (the logits
    were 1 MB a row at a 262k vocabulary), and the replayed steps still give the eager tokens."""
    lm = blocks_models["gemma3"]
    prompts, arrivals, params = _widths(lm, 5)
    taped, tapes = _run(lm, True, RunConfig(max_seq_len=64), prompts, arrivals, params)
    eager, _ = _run(lm, False, RunConfig(max_seq_len=64), prompts, arrivals, params)
    assert taped == eager and len(tapes.tapes) >= 3
    shared = tapes.logits.data_ptr()
    for t, tape in tapes.tapes.items():
        assert tape.logits.data_ptr() == shared and tape.logits.shape == (t, lm.args.vocab_size)
    arena = tapes.arena.memory
    assert not arena.data_ptr() <= shared < arena.data_ptr() + arena.numel()


def test_a_turn_of_many_widths_again_records_no_tape(blocks_models, recorded):
    """A drafting session's steps take up to nine widths (decode's, verify steps' of 2 to 9 rows). Kept as four tapes at
    most, three of a sampled open chat's five widths recorded again each turn (0.949x of lookup off)."""
    lm = blocks_models["qwen3"]
    prompts, arrivals, params = _widths(lm, 6)
    batcher = make_batcher(lm, 6, RunConfig(max_seq_len=64))
    first = run_staggered(batcher, prompts, arrivals, params)
    assert sorted(recorded) == [1, 2, 3, 4, 5, 6]
    recorded.clear()
    assert run_staggered(batcher, prompts, arrivals, params) == first
    assert recorded == []


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_verify_steps_are_taped_and_lossless(blocks_models, arch, monkeypatch):
    """Prompt lookup on a looping tiny model: verify steps (rowwise segments) replay tapes too, and the tokens stay
    those of plain greedy decoding."""
    lm = blocks_models[arch]
    g = torch.Generator().manual_seed(2)
    motif = torch.randint(6, lm.args.vocab_size, (6,), generator=g).tolist()
    prompts = [motif * 4, (motif[::-1] * 3)[:15]]
    params = SamplingParams(max_tokens=24)
    plain, _ = _run(lm, False, RunConfig(max_seq_len=128), prompts, [0, 1], params)
    replayed = []
    real = cpu_tape._Tape.replay

    def counting(self):
        replayed.append(self.logits.shape[0])
        return real(self)

    monkeypatch.setattr(cpu_tape._Tape, "replay", counting)
    batcher = make_batcher(lm, 2, RunConfig(max_seq_len=128, speculative="lookup"))
    drafted = run_staggered(batcher, prompts, [0, 1], params)
    assert drafted == plain
    seqs_rows = set(replayed)
    assert any(r > 2 for r in seqs_rows), seqs_rows  # steps of more rows than sequences: verify steps, replayed


def test_a_replayed_step_reports_the_tap_outputs_of_an_eager_one(blocks_models):
    """With tap layers on (a DFlash drafter's), tapes still record (the taps are the library's own outputs) and each
    replay hands back its buffers, holding what an eager step computes."""
    lm = blocks_models["gemma3"]
    model, prompts = lm.model, _prompts(lm, (5, 9))
    run = RunConfig(max_seq_len=64, step_tokens=16, chunk_tokens=8)
    seen = {}
    for taped in (False, True):
        batcher = make_batcher(lm, 2, run)
        if not taped:
            batcher.runner.tapes = None
        real, rows = batcher.runner.run, []

        def run_and_keep(batch, real=real, rows=rows):
            out = real(batch)
            rows.append(torch.cat(model.last_taps, -1).clone())
            return out

        batcher.runner.run = run_and_keep
        model.tap_layers = (0, 1)
        try:
            # one row, then two, then one again: the one-row tape replays after the two-row one recorded
            run_staggered(batcher, prompts, [0, 3], [SamplingParams(max_tokens=12), SamplingParams(max_tokens=4)])
        finally:
            model.tap_layers, model.last_taps = (), None
        seen[taped] = rows
        if taped:
            assert batcher.runner.tapes.refused is None and batcher.runner.tapes.tapes
    assert len(seen[True]) == len(seen[False])
    assert all(torch.equal(a, b) for a, b in zip(seen[True], seen[False]))


def test_loading_and_taped_decoding_leave_torchs_compiler_unimported(tiny_models_q4, tmp_path):
    """A fresh process loads a model and decodes through recorded tapes without importing torch._dynamo: it would
    cost every start ~2 s and ~130 MB resident (measured on the embedded model)."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "child.py"
    script.write_text(
        "import sys\n"
        "from bench.runs import RunConfig, generate, make_batcher\n"
        "from engine.loading.loader import LoadOptions, load_model\n"
        "from engine.sampling import SamplingParams\n"
        f"lm = load_model({str(tiny_models_q4['llama'].gguf_path)!r}, LoadOptions(weights='quantized'))\n"
        "b = make_batcher(lm, 2, RunConfig(max_seq_len=64))\n"
        "generate(lm, [[5, 6, 7], [8, 9]], SamplingParams(max_tokens=8), batcher=b)\n"
        "assert b.runner.tapes and b.runner.tapes.tapes, 'no tape was recorded'\n"
        "print('dynamo' if 'torch._dynamo' in sys.modules else 'clean')\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "clean"


def test_a_verify_width_is_a_multiple_of_the_row_step_with_several_sequences():
    width = cpu_tape.DecodeTapes.width
    assert [width(8, r) for r in (8, 9, 11, 12, 15, 16, 17, 30)] == [8, 8, 8, 12, 12, 16, 17, 30]
    assert [width(5, r) for r in (5, 7, 9)] == [5, 5, 8]
    assert [width(3, r) for r in (4, 7, 11)] == [4, 7, 11]  # fewer sequences: untrimmed


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_several_drafting_sequences_verify_at_few_widths_and_stay_lossless(blocks_models, arch, recorded):
    """Eight looping sequences all drafting (lookup for every sequence): each verify step's drafts are trimmed to a
    width of a multiple of 4 (taped once each, not again at every width from 9 to 16), and the tokens stay plain
    greedy decoding's."""
    from engine.speculative import LookupConfig, PacingConfig, PromptLookup

    lm = blocks_models[arch]
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(6, lm.args.vocab_size, (5,), generator=g).tolist() * 4 for _ in range(8)]
    params = SamplingParams(max_tokens=20)
    plain, _ = _run(lm, False, RunConfig(max_seq_len=128), prompts, [0] * 8, params)
    batcher = make_batcher(lm, 8, RunConfig(max_seq_len=128, speculative="lookup"))
    batcher.drafter = PromptLookup(LookupConfig(pacing=PacingConfig(most_sequences=8)))
    widths = []
    real = batcher.runner.run

    def run(batch):
        widths.append((len(batch.tokens), len(batch.segments), batch.verifies))
        return real(batch)

    batcher.runner.run = run
    drafted = run_staggered(batcher, prompts, [0] * 8, params)
    assert drafted == plain
    verify = [t for t, n, v in widths if v and n >= cpu_tape.ROW_STEP and t <= cpu_tape.MAX_ROWS]
    assert verify and all(t % cpu_tape.ROW_STEP == 0 for t in verify), widths
