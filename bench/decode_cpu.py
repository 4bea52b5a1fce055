"""Single-sequence decode speed on this CPU: Parley vs transformers on the same GGUF, in one process.

    python bench/decode_cpu.py [--tokens 64] [--repeats 3]
Prints JSON lines; the last one is the ratio parley / transformers (decode tokens per second).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import embedded_model, emit  # noqa: E402

PROMPT = "The history of the printing press begins"


def parley_decode(lm, ids: list[int], n: int) -> float:
    """Seconds for n decode steps after the prompt's prefill (first token excluded)."""
    from bench.runs import RunConfig, make_batcher
    from engine.sampling import SamplerState, SamplingParams
    from engine.sequence import Sequence

    batcher = make_batcher(lm, 1, RunConfig(max_seq_len=1024))
    seq = Sequence(0, list(ids), SamplerState(SamplingParams(max_tokens=n + 1)))
    batcher.add(seq)
    batcher.step()  # prefill + first token
    start = time.perf_counter()
    while batcher.has_work():
        batcher.step()
    return time.perf_counter() - start


def hf_decode(model, ids: list[int], n: int) -> float:
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        start = time.perf_counter()
        for _ in range(n):
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM

    path, lm = embedded_model(a.data_dir)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype="float32").eval()
    ids = lm.tokenizer.encode(PROMPT, add_bos=True)
    parley_decode(lm, ids, 4), hf_decode(hf, ids, 4)  # warm-up
    ours_s, theirs_s = [], []
    for _ in range(a.repeats):  # interleaved, so a busy machine slows both alike
        ours_s.append(parley_decode(lm, ids, a.tokens))
        theirs_s.append(hf_decode(hf, ids, a.tokens))
    ours, theirs = a.tokens / statistics.median(ours_s), a.tokens / statistics.median(theirs_s)
    common = dict(threads=torch.get_num_threads(), tokens=a.tokens, dtype="float32", device="cpu")
    emit(impl="parley", tok_s=round(ours, 2), **common)
    emit(impl="transformers", tok_s=round(theirs, 2), **common)
    emit(metric="decode_ratio_parley_over_transformers", ratio=round(ours / theirs, 3))


if __name__ == "__main__":
    main()
