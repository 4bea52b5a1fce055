"""Speculative decoding on CUDA: verify steps (rowwise attention in the Triton kernels, replayed from the decode
graphs as one-row segments) give plain decoding's greedy tokens, bf16 and quantized weights, both KV layouts. On CUDA even plain batching is exact only up to bf16 reduction order (tests/engine/test_cuda_runner.py):
the Triton attention picks its kv splits from the step's shape. So, as there, the check is: every logit row agrees
within a bound while the inputs agree, and a token that differs is a near-tie that the measured gap explains."""
from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from bench.runs import RunConfig, make_batcher
from engine.loading.loader import LoadOptions, load_model
from engine.sampling import SamplingParams
from tests.engine.test_cuda_runner import compare
from tests.engine.test_speculative import ARRIVALS, ScriptedDrafter, _prompts
from tests.support.engine_helpers import run_staggered
from tests.support.tiny_models import ARCHS

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]

PARAMS = SamplingParams(max_tokens=24)  # greedy: the near-tie check reads the raw logits (penalised and sampled
# answers on CUDA: bench/speculative.py's `identical` on the embedded model)


@pytest.fixture(scope="module", params=["bfloat16", "q4"])
def cuda_models(request, tiny_models, tiny_models_q4):
    if request.param == "q4":
        files, weights = tiny_models_q4, "quantized"
    else:
        files, weights = tiny_models, "dequantized"
    opts = LoadOptions(device="cuda", dtype="bfloat16", weights=weights)
    return {a: load_model(files[a].gguf_path, opts) for a in ARCHS}


def _run(layout: str, speculative: str = "off") -> RunConfig:
    return RunConfig(kv_layout=layout, max_seq_len=160, step_tokens=24, chunk_tokens=8, speculative=speculative)


def _recorded(batcher, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Tokens, and per sequence the logit row each of its tokens was chosen from (a verify step's rows on the
    accepted path: a rejected row's position is computed again later and overwrites it)."""
    rows: dict[int, dict[int, torch.Tensor]] = defaultdict(dict)
    run = batcher.runner.run

    def recording(batch):
        logits, argmax = run(batch)
        r, ahead = 0, batch.device_tokens is not None  # a look-ahead step: the last token is not appended yet
        for seq in batch.samplers:
            for j in range(len(seq.draft) + 1):
                rows[seq.seq_id][len(seq.generated) + ahead + j] = logits[r].float().cpu()
                r += 1
        return logits, argmax

    batcher.runner.run = recording
    tokens = run_staggered(batcher, prompts, ARRIVALS, PARAMS)
    return tokens, [[rows[i][d] for d in range(len(t))] for i, t in enumerate(tokens)]


@pytest.mark.parametrize("layout", ["sequence", "cell"])
@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_drafts_give_plain_tokens_up_to_near_ties(cuda_models, arch, layout):
    lm = cuda_models[arch]
    prompts = _prompts(lm.args.vocab_size)
    plain, plain_logits = _recorded(make_batcher(lm, 4, _run(layout)), prompts)
    batcher = make_batcher(lm, 4, _run(layout))
    batcher.drafter = drafter = ScriptedDrafter(dict(enumerate(plain)), wrong=4, vocab=lm.args.vocab_size)
    drafted, drafted_logits = _recorded(batcher, prompts)
    compare(plain, plain_logits, drafted, drafted_logits)
    assert 0 < drafter.accepted < drafter.drafted
    graphs = batcher.runner.graphs  # the sequence layout on the kernels: verify steps replay the decode graphs
    assert graphs is None or graphs.verify_replays > 0
    lookup, lookup_logits = _recorded(make_batcher(lm, 4, _run(layout, "lookup")), prompts)
    compare(plain, plain_logits, lookup, lookup_logits)


@pytest.mark.parametrize("layout", ["sequence", "cell"])
def test_gpu_dflash_drafts_give_plain_tokens_up_to_near_ties(cuda_models, layout):
    """A DFlash drafter serving on CUDA: the decode graphs keep the tap rows its context reads. Trained here on the
    target's own answers, it gets drafts kept, and the tokens are plain decoding's up to near ties."""
    from engine.runtime import dflash_drafter
    from training import dflash as training

    lm, device = cuda_models["llama"], torch.device("cuda")
    prompts = _prompts(lm.args.vocab_size)
    plain_batcher = make_batcher(lm, 4, _run(layout))
    plain, plain_logits = _recorded(plain_batcher, prompts)
    torch.manual_seed(0)
    net = training.new_net(lm, block=6, layers=1).to(device)
    examples = training.build_examples(lm, plain, prompts, net.config.taps, device)
    head = training.dense_head(lm.model).to(device)
    training.train(net, lm, head, examples, steps=300, lr=3e-3, anchors=8, device=device, log=lambda line: None)
    batcher = make_batcher(lm, 4, _run(layout))
    batcher.drafter = dflash_drafter(lm, net, batcher)
    assert batcher.drafter.name == "dflash", lm.notices
    drafted, drafted_logits = _recorded(batcher, prompts)
    compare(plain, plain_logits, drafted, drafted_logits)
    graphs = batcher.runner.graphs
    assert graphs is None or graphs.verify_replays > 0
    assert batcher.steps < plain_batcher.steps, (batcher.steps, plain_batcher.steps)  # drafts were kept
