"""Trains a DFlash block drafter (engine/speculative/dflash_net.py) for one target model, on the target's own
generations, and reports the acceptance it reaches on held-out prompts.

    python -m training.dflash --target MODEL.gguf --out drafter.safetensors [--device cuda] [--steps 2000]

1. Data: the target answers a set of chat prompts (greedy, and sampled for variety) through Parley's own engine,
   batched; held-out prompts (other subjects, other tasks) are answered greedily.
2. Taps: each prompt + answer runs through the target once more, teacher-forced, with the drafter's tap layers
   reported (CausalLM.tap_layers): the context features a drafter would see when serving.
3. Training: blocks anchored at random answer positions; each block's rows attend to the context before its
   anchor and to one another; cross-entropy of the mask rows against the target's own next tokens, through the
   target's frozen head. The target's embedding and head are never trained.
4. Held-out acceptance: for anchors in the held-out greedy answers, how many of a block's drafts in a row equal the
   target's tokens (what verification keeps), as tokens per verify step (1 + that mean).
Prints JSON lines (data, every `--log-every` steps the loss and per-position accuracy, the held-out result) and saves
the drafter; `parley generate --draft-model drafter.safetensors` then drafts with it.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.speculative.dflash_net import DFlashConfig, DFlashNet, save  # noqa: E402

TASKS = [
    "Write a short story about {}.", "Explain {} to a ten-year-old.", "List five interesting facts about {}.",
    "Write a poem about {}.", "What are the pros and cons of {}?", "Give me a step-by-step guide to {}.",
    "Summarise the history of {} in a paragraph.", "Write a friendly email inviting a colleague to talk about {}.",
    "Describe {} as if you were a tour guide.", "What questions should a beginner ask about {}?",
]
SUBJECTS = [
    "the ocean", "volcanoes", "learning to cook", "the moon landing", "bicycles", "coffee", "honey bees", "chess",
    "the printing press", "rainforests", "saving money", "public libraries", "electric cars", "photography",
    "ancient Rome", "gardening on a balcony", "the human heart", "winter sports", "jazz music", "recycling",
    "sleep", "mountain hiking", "the internet", "board games", "clouds", "a city at night", "dinosaurs",
    "running a marathon", "baking bread", "the solar system",
]
CODE_TASKS = [
    "Write a Python function that {}.", "Write a JavaScript function that {}.", "Explain how to write code that {}.",
]
CODE_SUBJECTS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a text", "sorts a list of names",
    "reads a CSV file and sums a column", "finds the largest number in a list", "converts Celsius to Fahrenheit",
    "removes duplicates from a list", "computes a factorial", "merges two sorted lists",
]
HELD_OUT = [
    "Write a short story about a lighthouse keeper.", "Explain how rainbows form.",
    "List five tips for a job interview.", "Write a Python function that checks for palindromes.",
    "What are the pros and cons of working from home?", "Describe a busy market in the morning.",
    "Give me a step-by-step guide to planting tomatoes.", "Write a poem about autumn leaves.",
    "Explain what a database index is.", "Summarise the life of a famous inventor.",
    "Write a JavaScript function that shuffles an array.", "What should I pack for a week of camping?",
]


@dataclass(slots=True)
class Example:
    ids: list[int]  # prompt and answer
    start: int  # the answer's first position
    taps: torch.Tensor  # (len(ids), len(taps) * hidden): the target's tap outputs at every position


def training_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` chat requests from the task and subject lists (none of HELD_OUT's)."""
    rng = random.Random(seed)
    pairs = [(t, s) for t in TASKS for s in SUBJECTS] + [(t, s) for t in CODE_TASKS for s in CODE_SUBJECTS]
    rng.shuffle(pairs)
    return [t.format(s) for t, s in pairs[:count]]


def generate(lm, prompts: list[list[int]], tokens: int, temperature: float, sessions: int, seed: int) -> list[list[int]]:
    """The target's answers, batched through Parley's engine (greedy, or sampled with a seed per prompt)."""
    from bench.runs import RunConfig, generate as run
    from engine.sampling import SamplingParams

    out = []
    for at in range(0, len(prompts), sessions):
        batch = prompts[at : at + sessions]
        params = SamplingParams(max_tokens=tokens, temperature=temperature, seed=seed + at) if temperature else \
            SamplingParams(max_tokens=tokens)
        seqs = run(lm, batch, params, RunConfig(max_seq_len=max(len(p) for p in batch) + tokens + 8))
        out += [s.generated for s in seqs]
    return out


@torch.inference_mode()
def target_taps(lm, ids: list[int], taps: tuple[int, ...], chunk: int = 256) -> torch.Tensor:
    """The target's tap outputs at every position of `ids` (one sequence through a fresh cache)."""
    from bench.runs import RunConfig, make_batcher

    from engine.step import StepBatch

    model = lm.model
    model.tap_layers = taps
    b = make_batcher(lm, 1, RunConfig(max_seq_len=len(ids) + 8, step_tokens=chunk, chunk_tokens=chunk))
    cache, slot, rows = b.cache, b.cache.seq_new(), []
    try:
        for start in range(0, len(ids), chunk):  # through the runner, as serving runs (on CUDA it plans the kernels)
            n = min(chunk, len(ids) - start)
            segs = cache.declare_step([(slot, n)])
            b.runner.run(StepBatch(torch.tensor(ids[start : start + n]), torch.arange(start, start + n), segs,
                                   torch.tensor([n - 1]), [], []))
            cache.commit_step()
            rows.append(torch.cat(model.last_taps, dim=-1).float())
    finally:
        model.tap_layers, model.last_taps = (), None
    return torch.cat(rows)


def dense_head(model) -> torch.Tensor:
    """The target's output matrix (V, hidden) as a plain tensor (quantized ones dequantized): the loss's head."""
    head = model.model.embed_tokens if model.lm_head is None else model.lm_head
    qweight = getattr(head, "qweight", None)
    return (qweight.dequantize() if qweight is not None else head.weight).detach().float().clone()


def build_examples(lm, answers: list[list[int]], prompts: list[list[int]], taps: tuple[int, ...],
                   device: torch.device) -> list[Example]:
    out = []
    for prompt, answer in zip(prompts, answers):
        ids = prompt + answer
        if len(answer) < 4:
            continue
        out.append(Example(ids, len(prompt), target_taps(lm, ids, taps).to(device).clone()))  # a normal tensor
    return out


def block_batch(net: DFlashNet, lm, ex: Example, anchors: list[int], device: torch.device):
    """Rows, positions, mask and labels for blocks anchored at `anchors` of one example (see the module doc)."""
    B = net.config.block
    ids = torch.tensor(ex.ids, device=device)
    with torch.no_grad():
        anchor_h = lm.model.embed(ids[anchors].to(next(lm.model.parameters()).device))[0].to(device).float().clone()
    rows = torch.cat([net.block_rows(anchor_h[i], B) for i in range(len(anchors))])
    positions = torch.cat([torch.arange(a, a + B, device=device) for a in anchors])
    C = max(anchors)  # context: positions before the latest anchor
    mask = torch.zeros(len(anchors) * B, C + len(anchors) * B, dtype=torch.bool, device=device)
    for i, a in enumerate(anchors):
        mask[i * B : (i + 1) * B, :a] = True  # the context the target had computed when the anchor was newest
        mask[i * B : (i + 1) * B, C + i * B : C + (i + 1) * B] = True  # its own block, every row
    labels = torch.stack([ids[a + 1 : a + B] for a in anchors])  # (S, B - 1)
    return rows, positions, mask, labels, C


def block_logits(net: DFlashNet, lm, head: torch.Tensor, ex: Example, anchors: list[int], device: torch.device):
    rows, positions, mask, labels, C = block_batch(net, lm, ex, anchors, device)
    feats = net.features(ex.taps[:C])
    kv = net.context_kv(feats, torch.arange(C, device=device))
    out = net(rows, positions, kv, mask[None])
    B = net.config.block
    drafted = out.view(len(anchors), B, -1)[:, 1:]  # the mask rows
    logits = drafted @ head.T
    cap = lm.args.final_logit_softcapping
    return (torch.tanh(logits / cap) * cap if cap else logits), labels


def anchors_of(ex: Example, block: int, count: int, rng: random.Random) -> list[int]:
    """Up to `count` distinct anchors in the answer whose whole block of labels exists. An anchor is a sampled token
    (the first answer token on): at a draft, the newest token, which the target has not yet computed."""
    lo, hi = ex.start, len(ex.ids) - block
    if hi < lo:
        return []
    return sorted(rng.sample(range(lo, hi + 1), min(count, hi - lo + 1)))


@torch.no_grad()
def acceptance(net: DFlashNet, lm, head: torch.Tensor, examples: list[Example], device: torch.device,
               anchors_per: int = 32, seed: int = 1) -> dict:
    """Mean drafts kept in a row per block on `examples` (greedy answers: the target's own tokens)."""
    rng, kept, blocks, hits = random.Random(seed), 0, 0, torch.zeros(net.config.block - 1)
    for ex in examples:
        anchors = anchors_of(ex, net.config.block, anchors_per, rng)
        if not anchors:
            continue
        logits, labels = block_logits(net, lm, head, ex, anchors, device)
        right = (logits.argmax(-1) == labels).cpu()
        hits += right.float().sum(0)
        kept += int(right.int().cumprod(1).sum())
        blocks += len(anchors)
    tau = kept / max(1, blocks)
    return {"blocks": blocks, "mean_kept": round(tau, 3), "tokens_per_step": round(1 + tau, 3),
            "position_accuracy": [round(float(h) / max(1, blocks), 3) for h in hits]}


def train(net: DFlashNet, lm, head: torch.Tensor, examples: list[Example], steps: int, lr: float, anchors: int,
          device: torch.device, log_every: int = 50, seed: int = 0, log=print) -> None:
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps)))))
    rng = random.Random(seed)
    net.train()
    for step in range(steps):
        ex = rng.choice(examples)
        picks = anchors_of(ex, net.config.block, anchors, rng)
        if not picks:
            continue
        logits, labels = block_logits(net, lm, head, ex, picks, device)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            acc = (logits.argmax(-1) == labels).float().mean(0)
            log(json.dumps({"step": step, "loss": round(loss.item(), 4),
                            "position_accuracy": [round(a, 3) for a in acc.tolist()]}))
    net.eval()


def new_net(lm, block: int, layers: int) -> DFlashNet:
    """A drafter sized for the target: its head geometry, the target's final norm as the output norm's start."""
    a = lm.args
    config = DFlashConfig.for_target(a.hidden_size, a.vocab_size, a.num_layers, layers=layers, block=block,
                                     heads=a.num_heads, kv_heads=a.num_kv_heads, head_dim=a.head_dim,
                                     intermediate=2 * a.hidden_size * 2)
    net = DFlashNet(config)
    with torch.no_grad():
        net.out_norm.copy_(lm.model.model.norm.weight.detach().float().cpu())
    return net


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="the target model (.gguf or HF folder)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompts", type=int, default=240, help="training prompts (each answered greedily and sampled)")
    ap.add_argument("--tokens", type=int, default=256, help="answer length")
    ap.add_argument("--sessions", type=int, default=0, help="prompts answered at once (0: 64 on CUDA, 8 on the CPU)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--anchors", type=int, default=32, help="blocks per training step")
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=None,
                    help="keep the generated data (answers and taps) here, and reuse them when the file exists")
    args = ap.parse_args()

    from engine.backend import resolve_device
    from engine.loading.loader import LoadOptions, load_model

    device_name, dtype = resolve_device(args.device, "auto")
    device = torch.device(device_name)
    torch.backends.cuda.matmul.allow_tf32 = True
    start = time.perf_counter()
    lm = load_model(args.target, LoadOptions(device=device_name, dtype=dtype))
    tok = lm.tokenizer
    sessions = args.sessions or (64 if device.type == "cuda" else 8)
    net = new_net(lm, args.block, args.layers).to(device)
    taps = net.config.taps

    def chat(text: str) -> list[int]:
        return tok.apply_chat_template([{"role": "user", "content": text}])

    if args.data is not None and args.data.exists():
        saved = torch.load(args.data, map_location=device)
        if tuple(saved["taps"]) != taps:
            raise SystemExit(f"{args.data} holds taps of layers {saved['taps']}, this drafter taps {taps}")
        examples, held_examples = [Example(*e) for e in saved["train"]], [Example(*e) for e in saved["held_out"]]
        gen_s = 0.0
    else:
        texts = training_prompts(args.prompts, args.seed)
        prompts = [chat(t) for t in texts]
        greedy = generate(lm, prompts, args.tokens, 0.0, sessions, args.seed)
        sampled = generate(lm, prompts, args.tokens, 0.8, sessions, args.seed)
        held_prompts = [chat(t) for t in HELD_OUT]
        held = generate(lm, held_prompts, args.tokens, 0.0, sessions, args.seed)
        gen_s = time.perf_counter() - start
        examples = build_examples(lm, greedy + sampled, prompts * 2, taps, device)
        held_examples = build_examples(lm, held, held_prompts, taps, device)
        if args.data is not None:
            torch.save({"taps": taps, "train": [(e.ids, e.start, e.taps) for e in examples],
                        "held_out": [(e.ids, e.start, e.taps) for e in held_examples]}, args.data)
    print(json.dumps({"data": {"target": lm.name, "device": device_name, "train_sequences": len(examples),
                               "train_tokens": sum(len(e.ids) - e.start for e in examples),
                               "held_out_sequences": len(held_examples), "generate_s": round(gen_s, 1),
                               "taps_s": round(time.perf_counter() - start - gen_s, 1), "config": str(net.config)}}),
          flush=True)
    head = dense_head(lm.model).to(device)
    before = acceptance(net, lm, head, held_examples, device)
    t0 = time.perf_counter()
    train(net, lm, head, examples, args.steps, args.lr, args.anchors, device, seed=args.seed,
          log=lambda line: print(line, flush=True))
    print(json.dumps({"train_s": round(time.perf_counter() - t0, 1), "held_out_before": before,
                      "held_out": acceptance(net, lm, head, held_examples, device)}), flush=True)
    save(net.cpu(), args.out, target=lm.name)
    print(json.dumps({"saved": str(args.out)}), flush=True)


if __name__ == "__main__":
    main()
