"""Decode speed of answers held to a JSON schema (engine/constraint) against free answers, same model, same prompts,
same process, interleaved rounds; and the one-time cost of a model's grammar tokenizer.

    python bench/grammar.py --sessions 1 8 --tokens 64 --rounds 3
    python bench/grammar.py --lookup --sessions 1 8   # a record copied into JSON: guided with prompt lookup vs without
    python bench/grammar.py --gpu-shape --tokenizer DIR   # CUDA: the 270M shape, random bf16 weights, decode graphs;
                                                          # DIR: the embedded model's Tokenizer.save() (real masks)

Prints JSON lines: per round and session count, free and guided decode tokens/s and their ratio (with --lookup:
guided without drafts and with prompt-lookup drafts, their ratio, tokens a step, and whether the answers are the same
tokens)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import embedded_model, emit
from bench.runs import RunConfig, make_batcher
from engine.constraint.grammar import json_grammar
from engine.constraint.guide import Grammars
from engine.sampling import SamplerState, SamplingParams
from engine.sequence import Sequence

# a schema whose answer runs to max_tokens (a string of 4,000 characters at least), so both sides decode the same
# number of tokens
SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                           "story": {"type": "string", "minLength": 4000}},
          "required": ["title", "story"]}
PROMPT = "Write a long story about a lighthouse keeper as JSON with a title and the story."
# input-grounded: a record given in the prompt, asked back as JSON of its fields (what an extraction or a reformatting
# request looks like), whose values the answer copies
RECORD = {"name": "Margaret Okonkwo-Lindqvist", "street": "1418 Harbour View Terrace, Apartment 7B",
          "city": "Port Elizabeth", "country": "South Africa", "email": "m.okonkwo.lindqvist@example.org",
          "note": "Deliver between nine and eleven in the morning; ring the second bell, the first one is broken."}
RECORD_SCHEMA = {"type": "object", "properties": {k: {"type": "string"} for k in RECORD}, "required": list(RECORD)}
RECORD_PROMPT = ("Here is a customer record:\n" + "\n".join(f"{k}: {v}" for k, v in RECORD.items())
                 + "\n\nReturn the record as a JSON object with the fields " + ", ".join(RECORD) + ".")


def decode_rate(new_batcher, prompts: list[list[int]], grammars: Grammars | None, grammar: str, tokens: int,
                clock=time.perf_counter) -> float:
    """Tokens/s of the steps after each sequence's first token (prefill left out), all sequences in one batch, by
    `clock` (wall time; or the process's CPU time, which a machine shared with other work moves less)."""
    batcher = new_batcher(len(prompts), len(prompts[0]) + tokens + 8)
    seqs = [Sequence(i, list(p), SamplerState(SamplingParams(max_tokens=tokens)), frozenset()) for i, p in
            enumerate(prompts)]  # no stop ids: every answer runs to max_tokens
    for seq in seqs:
        seq.guide = grammars.guide(grammar) if grammars is not None else None
        batcher.add(seq)
    while any(not s.generated for s in seqs):
        batcher.step()
    start, first = clock(), sum(len(s.generated) for s in seqs)
    while batcher.has_work():
        batcher.step()
    return (sum(len(s.generated) for s in seqs) - first) / (clock() - start)


def copy_rate(new_batcher, prompts: list[list[int]], grammars: Grammars, grammar: str, tokens: int, lookup: bool,
              clock=time.perf_counter) -> tuple[float, float, list[list[int]]]:
    """Guided answers that end where the grammar does: (decode tokens/s after each first token, tokens a step, the
    answers), with prompt-lookup drafts or without."""
    batcher = new_batcher(len(prompts), len(prompts[0]) + tokens + 8, "lookup" if lookup else "off")
    seqs = [Sequence(i, list(p), SamplerState(SamplingParams(max_tokens=tokens)), frozenset()) for i, p in
            enumerate(prompts)]
    for seq in seqs:
        seq.guide = grammars.guide(grammar)
        batcher.add(seq)
    while any(not s.generated for s in seqs):
        batcher.step()
    start, first, steps = clock(), sum(len(s.generated) for s in seqs), batcher.steps
    while batcher.has_work():
        batcher.step()
    made = sum(len(s.generated) for s in seqs) - first
    return made / (clock() - start), made / max(1, (batcher.steps - steps) * len(seqs)), [s.generated for s in seqs]


def _lookup_rounds(args, new_batcher, tok, vocab, clock) -> None:
    prompt = tok.apply_chat_template([{"role": "user", "content": RECORD_PROMPT}])
    grammar, grammars = json_grammar(RECORD_SCHEMA), Grammars(tok, vocab)
    for n in args.sessions:  # graphs captured, kernels compiled, before anything is timed
        copy_rate(new_batcher, [prompt] * n, grammars, grammar, 8, True, clock)
    ratios: dict[int, list[float]] = {n: [] for n in args.sessions}
    for r in range(args.rounds):
        for n in args.sessions:
            off, off_steps, plain = copy_rate(new_batcher, [prompt] * n, grammars, grammar, args.tokens, False, clock)
            on, on_steps, drafted = copy_rate(new_batcher, [prompt] * n, grammars, grammar, args.tokens, True, clock)
            ratios[n].append(on / off)
            emit(round=r, sessions=n, clock="cpu" if args.cpu_time else "wall", off_tok_s=round(off, 1),
                 lookup_tok_s=round(on, 1), ratio=round(on / off, 3), tokens_per_step=round(on_steps, 2),
                 answer_tokens=len(plain[0]), identical=plain == drafted)
    emit(answer=tok.decode(plain[0]))
    for n, rs in ratios.items():
        emit(sessions=n, workload="record_copy", median_ratio=round(statistics.median(rs), 3), rounds=len(rs))


def _gpu_shape(tokenizer_dir: Path | None):
    """The embedded model's shape on CUDA with random bf16 weights (the engine's decode graphs and look-ahead), and a
    saved tokenizer of the same vocabulary: a step's cost and a mask's are those of the real model."""
    import torch

    from bench.decode_gpu import gemma270m_args, make_batcher as gpu_batcher, parley_model, random_hf_weights
    from engine.tokenizer.tokenizer import Tokenizer

    if tokenizer_dir is None:
        raise SystemExit("--gpu-shape needs --tokenizer DIR (Tokenizer.save of the embedded model's)")
    args = gemma270m_args(max_len=1024)
    model = parley_model(args, random_hf_weights(args, seed=0), torch.bfloat16, "cuda")

    def new_batcher(n: int, max_len: int, speculative: str = "off"):
        return gpu_batcher(model, args, n, max_len, graphs=True, speculative=speculative)
    return "gemma-3-270m shape (random bf16, CUDA graphs)", Tokenizer.load(tokenizer_dir), args.vocab_size, new_batcher


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "parley-bench")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 with --cpu-time: no spinning threads)")
    ap.add_argument("--cpu-time", action="store_true", help="rates by the process's CPU time, not wall time")
    ap.add_argument("--gpu-shape", action="store_true", help="CUDA: the 270M shape with random weights")
    ap.add_argument("--tokenizer", type=Path, help="with --gpu-shape: a saved Tokenizer folder (the masks' vocabulary)")
    ap.add_argument("--lookup", action="store_true", help="a record copied into JSON, with prompt lookup against without")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    if args.gpu_shape:
        name, tok, vocab, new_batcher = _gpu_shape(args.tokenizer)
    else:
        path, lm = embedded_model(args.cache)
        name, tok, vocab = Path(path).name, lm.tokenizer, lm.args.vocab_size

        def new_batcher(n: int, max_len: int, speculative: str = "off"):
            return make_batcher(lm, n, RunConfig(max_seq_len=max_len, speculative=speculative))
    if args.lookup:
        _lookup_rounds(args, new_batcher, tok, vocab, clock)
        return
    prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}])
    grammar = json_grammar(SCHEMA)
    grammars = Grammars(tok, vocab)
    start = time.perf_counter()
    grammars.guide(grammar)
    emit(model=name, grammar_tokenizer_s=round(time.perf_counter() - start, 3))
    for n in args.sessions:  # a first pass captures graphs and compiles: on the device it read 7.8x at one session
        decode_rate(new_batcher, [prompt] * n, grammars, grammar, 8, clock)
        decode_rate(new_batcher, [prompt] * n, None, grammar, 8, clock)
    ratios: dict[int, list[float]] = {n: [] for n in args.sessions}
    for r in range(args.rounds):
        for n in args.sessions:
            free = decode_rate(new_batcher, [prompt] * n, None, grammar, args.tokens, clock)
            guided = decode_rate(new_batcher, [prompt] * n, grammars, grammar, args.tokens, clock)
            ratios[n].append(guided / free)
            emit(round=r, sessions=n, clock="cpu" if args.cpu_time else "wall", free_tok_s=round(free, 1), guided_tok_s=round(guided, 1),
                 ratio=round(guided / free, 3))
    for n, rs in ratios.items():
        emit(sessions=n, median_ratio=round(statistics.median(rs), 3), rounds=len(rs))


if __name__ == "__main__":
    main()
