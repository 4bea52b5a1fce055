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

from engine.speculative.dflash_net import DFlashConfig, DFlashNet, load, save  # noqa: E402

TASKS = [
    "Write a short story about {}.", "Explain {} to a ten-year-old.", "List five interesting facts about {}.",
    "Write a poem about {}.", "What are the pros and cons of {}?", "Give me a step-by-step guide to {}.",
    "Summarise the history of {} in a paragraph.", "Write a friendly email inviting a colleague to talk about {}.",
    "Describe {} as if you were a tour guide.", "What questions should a beginner ask about {}?",
    "Write a blog post introduction about {}.", "What are common myths about {}?", "Tell me a joke about {}.",
    "Compare {} with something similar and explain the differences.", "Write a short dialogue between two friends about {}.",
    "Why do people care about {}?", "Give me three creative project ideas involving {}.",
    "Write a product description for a book about {}.", "Explain the science behind {}.",
    "Write a haiku and a limerick about {}.",
]
SUBJECTS = [
    "the ocean", "volcanoes", "learning to cook", "the moon landing", "bicycles", "coffee", "honey bees", "chess",
    "the printing press", "rainforests", "saving money", "public libraries", "electric cars", "photography",
    "ancient Rome", "gardening on a balcony", "the human heart", "winter sports", "jazz music", "recycling",
    "sleep", "mountain hiking", "the internet", "board games", "clouds", "a city at night", "dinosaurs",
    "running a marathon", "baking bread", "the solar system", "trains", "penguins", "learning a new language",
    "the Great Wall of China", "friendship", "time management", "deserts", "robots", "tea ceremonies",
    "the water cycle", "video games", "origami", "climate change", "a small village bakery", "space telescopes",
    "wolves", "first aid", "the stock market", "paper money", "thunderstorms", "knitting", "pirates",
    "the Olympic Games", "mushrooms", "castles", "vaccines", "street food", "the piano", "bridges", "owls",
    "moving to a new city", "coral reefs", "the history of writing", "yoga", "satellites", "rivers",
    "chocolate", "ancient Egypt", "meditation", "airplanes", "the human brain", "museums", "camping",
    "renewable energy", "cats", "dogs", "the Renaissance", "smartphones", "a rainy day", "volunteering",
]
CODE_TASKS = [
    "Write a Python function that {}.", "Write a JavaScript function that {}.", "Explain how to write code that {}.",
    "Write a Python class that {}.", "Write a shell command or script that {}.",
]
CODE_SUBJECTS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a text", "sorts a list of names",
    "reads a CSV file and sums a column", "finds the largest number in a list", "converts Celsius to Fahrenheit",
    "removes duplicates from a list", "computes a factorial", "merges two sorted lists",
    "validates an email address", "computes the Fibonacci numbers", "counts the lines in a file",
    "finds the most common word in a text", "flattens a nested list", "checks whether brackets are balanced",
    "converts a date string to a weekday", "computes the average of a list", "renames files in a folder",
    "downloads a web page and counts its links",
]
HELD_OUT = [
    "Write a short story about a lighthouse keeper.", "Explain how rainbows form.",
    "List five tips for a job interview.", "Write a Python function that checks for palindromes.",
    "What are the pros and cons of working from home?", "Describe a busy market in the morning.",
    "Give me a step-by-step guide to planting tomatoes.", "Write a poem about autumn leaves.",
    "Explain what a database index is.", "Summarise the life of a famous inventor.",
    "Write a JavaScript function that shuffles an array.", "What should I pack for a week of camping?",
    "How do I make a good first impression at a new job?", "Write a bedtime story about a sleepy dragon.",
    "Explain the difference between weather and climate.", "Write a Python function that counts vowels in a string.",
    "What are good habits for staying healthy?", "Describe how a bill becomes a law.",
    "Write a thank-you note to a teacher.", "Give me ideas for a birthday party on a budget.",
    "Explain how a car engine works.", "What is the best way to learn to play the guitar?",
    "Write a short speech for a friend's wedding.", "Explain recursion with an example.",
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


def generate(lm, prompts: list[list[int]], tokens: int, temperature: float, sessions: int,
             seed: int) -> list[list[int]]:
    """The target's answers, batched through Parley's engine (greedy, or sampled with a seed per batch); one batcher
    serves every batch (on CUDA its decode graphs are captured once), sized for the longest prompt."""
    from bench.runs import RunConfig, generate as run, make_batcher
    from engine.sampling import SamplingParams

    run_config = RunConfig(max_seq_len=max(len(p) for p in prompts) + tokens + 8,
                           max_sampled_rows=max(64, sessions), step_tokens=max(512, 4 * sessions))
    batcher = make_batcher(lm, min(sessions, len(prompts)), run_config)
    out = []
    for at in range(0, len(prompts), sessions):
        batch = prompts[at : at + sessions]
        params = SamplingParams(max_tokens=tokens, temperature=temperature, seed=seed + at) if temperature else \
            SamplingParams(max_tokens=tokens)
        out += [s.generated for s in run(lm, batch, params, batcher=batcher)]
    return out


@torch.inference_mode()
def target_taps(lm, seqs: list[list[int]], taps: tuple[int, ...], step_tokens: int = 512,
                chunk: int = 256) -> list[torch.Tensor]:
    """The target's tap outputs (len(ids), len(taps) * hidden) at every position of each of `seqs`, computed through
    the runner as serving computes them (on CUDA it plans the kernels): many sequences per prefill step, each in
    chunks of at most `chunk` rows, up to `step_tokens` rows a step."""
    from bench.runs import RunConfig, make_batcher

    from engine.step import StepBatch

    model, out = lm.model, [None] * len(seqs)
    width = max(1, step_tokens // chunk)  # sequences per step
    run_config = RunConfig(max_seq_len=max(len(s) for s in seqs) + 8, step_tokens=width * chunk, chunk_tokens=chunk)
    b = make_batcher(lm, min(width, len(seqs)), run_config)
    cache = b.cache
    model.tap_layers = taps
    try:
        for at in range(0, len(seqs), width):
            group = list(range(at, min(at + width, len(seqs))))
            slots, rows = [cache.seq_new() for _ in group], {i: [] for i in group}
            for start in range(0, max(len(seqs[i]) for i in group), chunk):
                live = [(i, slot) for i, slot in zip(group, slots) if start < len(seqs[i])]
                sizes = [min(chunk, len(seqs[i]) - start) for i, _ in live]
                segs = cache.declare_step([(slot, n) for (_, slot), n in zip(live, sizes)])
                tokens = torch.tensor([t for (i, _), n in zip(live, sizes) for t in seqs[i][start : start + n]])
                positions = torch.cat([torch.arange(start, start + n) for n in sizes])
                last = torch.tensor([seg.q_start + n - 1 for seg, n in zip(segs, sizes)])
                b.runner.run(StepBatch(tokens, positions, segs, last, [], []))
                cache.commit_step()
                joined = torch.cat(model.last_taps, dim=-1)
                for (i, _), seg, n in zip(live, segs, sizes):
                    rows[i].append(joined[seg.q_start : seg.q_start + n].float())
            for i, slot in zip(group, slots):
                out[i] = torch.cat(rows[i])
                cache.seq_rm(slot)
    finally:
        model.tap_layers, model.last_taps = (), None
    return out


def dense_head(model, ids: torch.Tensor | None = None) -> torch.Tensor:
    """The target's output matrix (V, hidden), or its rows `ids`, as a plain fp32 tensor: the loss's head."""
    ids = torch.arange(model.args.vocab_size) if ids is None else ids.cpu()
    return model.head_rows(ids).detach().float().clone()


def draft_vocabulary(seqs: list[list[int]], size: int) -> torch.Tensor:
    """The `size` tokens most frequent in `seqs` (fewer if fewer occur), in id order: what a drafter with a head over
    part of the vocabulary can draft."""
    counts = torch.bincount(torch.tensor([t for ids in seqs for t in ids]))
    seen = int((counts > 0).sum())
    return counts.topk(min(size, seen)).indices.sort().values


def build_examples(lm, answers: list[list[int]], prompts: list[list[int]], taps: tuple[int, ...],
                   device: torch.device, step_tokens: int = 512, dtype: torch.dtype = torch.float32) -> list[Example]:
    """Examples of the answers with at least 4 tokens; taps kept in `dtype` on `device` (bf16 halves a big set)."""
    kept = [(p + a, len(p)) for p, a in zip(prompts, answers) if len(a) >= 4]
    out = []
    for at in range(0, len(kept), 256):  # a bounded slice of float32 taps at a time
        part = kept[at : at + 256]
        tapped = target_taps(lm, [ids for ids, _ in part], taps, step_tokens)
        for (ids, start), t in zip(part, tapped):
            t = t.to(device=device, dtype=dtype)
            out.append(Example(ids, start, t.clone() if t.is_inference() else t))  # autograd takes normal tensors
    return out


def block_batch(net: DFlashNet, lm, ex: Example, anchors: list[int], device: torch.device):
    """Rows, positions, mask and labels for blocks anchored at `anchors` of one example (see the module doc)."""
    B, S = net.config.block, len(anchors)
    ids = torch.tensor(ex.ids, device=device)
    at = torch.tensor(anchors, device=device)
    with torch.no_grad():
        anchor_h = lm.model.embed(ids[at].to(next(lm.model.parameters()).device))[0].to(device).float()
    rows = torch.cat((anchor_h[:, None, :], net.mask.float().expand(S, B - 1, -1)), 1).reshape(S * B, -1)
    offsets = torch.arange(B, device=device)
    positions = (at[:, None] + offsets).reshape(-1)
    C = max(anchors)  # context: positions before the latest anchor
    block_of = torch.arange(S, device=device).repeat_interleave(B)  # each row's block
    # each row sees the context the target had computed when its anchor was newest, and every row of its own block
    context = torch.arange(C, device=device)[None, :] < at[block_of][:, None]
    own = block_of[:, None] == block_of[None, :]
    mask = torch.cat((context, own), 1)
    labels = ids[at[:, None] + offsets[1:]]  # (S, B - 1)
    return rows, positions, mask, labels, C


def block_logits(net: DFlashNet, lm, head: torch.Tensor, ex: Example, anchors: list[int], device: torch.device):
    rows, positions, mask, labels, C = block_batch(net, lm, ex, anchors, device)
    feats = net.features(ex.taps[:C].float())
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
        right = (net.token_ids(logits.argmax(-1)) == labels).cpu()
        hits += right.float().sum(0)
        kept += int(right.int().cumprod(1).sum())
        blocks += len(anchors)
    tau = kept / max(1, blocks)
    return {"blocks": blocks, "mean_kept": round(tau, 3), "tokens_per_step": round(1 + tau, 3),
            "position_accuracy": [round(float(h) / max(1, blocks), 3) for h in hits]}


def draftable(net: DFlashNet, examples: list[Example]) -> float:
    """The share of the examples' answer tokens that the drafter can draft (all, without a draft vocabulary)."""
    answers = torch.tensor([t for ex in examples for t in ex.ids[ex.start :]])
    if not net.config.draft_vocab or not len(answers):
        return 1.0
    return round(float(torch.isin(answers, net.vocab_ids.cpu()).float().mean()), 4)


def train(net: DFlashNet, lm, head: torch.Tensor, examples: list[Example], steps: int, lr: float, anchors: int,
          device: torch.device, log_every: int = 50, seed: int = 0, log=print, seconds: float = 0.0) -> int:
    """AdamW over random blocks, a short warm-up then a cosine decay over `steps`, or, when `seconds` is given, over
    that much time (the steps it reaches are returned)."""
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    warm = 100 if seconds else max(1, steps // 20)
    rng, start, step = random.Random(seed), time.perf_counter(), 0
    row_of = torch.full((net.config.vocab,), -100, dtype=torch.long, device=device)  # a token's head row; -100: none
    row_of[net.vocab_ids if net.config.draft_vocab else torch.arange(net.config.vocab, device=device)] = \
        torch.arange(head.shape[0], device=device)
    net.train()
    while True:
        done = (time.perf_counter() - start) / seconds if seconds else step / max(1, steps)
        if done >= 1.0:
            break
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * done))
        ex = rng.choice(examples)
        picks = anchors_of(ex, net.config.block, anchors, rng)
        if not picks:
            continue
        logits, labels = block_logits(net, lm, head, ex, picks, device)
        targets = row_of[labels.reshape(-1)]
        if bool((targets < 0).all()):  # no label the drafter can draft
            continue
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets, ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        if step % log_every == 0:
            acc = (net.token_ids(logits.argmax(-1)) == labels).float().mean(0)
            log(json.dumps({"step": step, "s": round(time.perf_counter() - start, 1), "loss": round(loss.item(), 4),
                            "position_accuracy": [round(a, 3) for a in acc.tolist()]}))
        step += 1
    net.eval()
    return step


def new_net(lm, block: int, layers: int, vocab_ids: torch.Tensor | None = None) -> DFlashNet:
    """A drafter sized for the target: its head geometry, the target's final norm as the output norm's start; with
    `vocab_ids`, it drafts those tokens only."""
    a = lm.args
    config = DFlashConfig.for_target(a.hidden_size, a.vocab_size, a.num_layers, layers=layers, block=block,
                                     heads=a.num_heads, kv_heads=a.num_kv_heads, head_dim=a.head_dim,
                                     intermediate=2 * a.hidden_size * 2,
                                     draft_vocab=0 if vocab_ids is None else len(vocab_ids))
    net = DFlashNet(config)
    with torch.no_grad():
        net.out_norm.copy_(lm.model.model.norm.weight.detach().float().cpu())
        if vocab_ids is not None:
            net.vocab_ids.copy_(vocab_ids)
    return net


DEFAULTS = {"prompts": 240, "samples": 1, "tokens": 256, "sessions": 0, "block": 8, "layers": 1, "draft_vocab": 32768}
SHAPE = ("block", "layers", "draft_vocab")  # what --init's drafter brings
DATA = ("prompts", "samples", "tokens", "sessions")  # what an existing --data file's answers were made with


def _refuse_overridden(args: argparse.Namespace) -> None:
    """A flag another one overrides was dropped without a word: --init X --layers 3 trained X's one layer, and
    --prompts 500 with an existing --data file trained on its 240. Refused before the target loads, exit 2."""
    clash = None
    if args.minutes and args.total_minutes:
        clash = ("minutes", "not with --total-minutes, which sets the whole run's length")
    given = [name for name in SHAPE if getattr(args, name) is not None]
    if args.init is not None and given:
        clash = (given[0], "not with --init, whose drafter keeps its own block, layers and draft vocabulary")
    given = [name for name in DATA if getattr(args, name) is not None]
    if args.data is not None and args.data.exists() and given:
        clash = (given[0], f"not with --data {args.data}, which exists: its answers are reused as they were made "
                           "(move it away for new ones)")
    if clash is not None:
        print(f"dflash: argument --{clash[0].replace('_', '-')}: {clash[1]}; give one", file=sys.stderr)
        raise SystemExit(2)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options, defaults filled in; exit 2 for a flag another one would override."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="the target model (.gguf or HF folder)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompts", type=int, help="training prompts (each answered greedily and sampled; 240)")
    ap.add_argument("--samples", type=int, help="sampled answers per training prompt, besides the greedy one (1)")
    ap.add_argument("--tokens", type=int, help="answer length (256)")
    ap.add_argument("--sessions", type=int,
                    help="prompts answered at once (0: 64 on CUDA, its largest decode graph; 8 on the CPU)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--minutes", type=float, default=0.0, help="train for this long instead of --steps")
    ap.add_argument("--total-minutes", type=float, default=0.0,
                    help="train until this long after the start, data included, less a minute to evaluate and save "
                         "(instead of --steps; not with --minutes)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--anchors", type=int, default=32, help="blocks per training step")
    ap.add_argument("--block", type=int, help="tokens a draft block holds, its anchor included (8)")
    ap.add_argument("--layers", type=int, help="the drafter's layers (1)")
    ap.add_argument("--draft-vocab", type=int,
                    help="draft only the this many tokens most frequent in the data (0: the whole vocabulary; 32768)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", type=Path, default=None,
                    help="continue training this drafter (its shape and draft vocabulary: not with --block, --layers, "
                         "--draft-vocab)")
    ap.add_argument("--data", type=Path, default=None,
                    help="keep the generated data (answers and taps) here, and reuse them when the file exists (then "
                         "not with --prompts, --samples, --tokens, --sessions)")
    args = ap.parse_args(argv)
    _refuse_overridden(args)
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)

    from engine.backend import resolve_device
    from engine.loading.loader import LoadOptions, load_model

    device_name, dtype = resolve_device(args.device, "auto")
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    start = time.perf_counter()
    lm = load_model(args.target, LoadOptions(device=device_name, dtype=dtype))
    tok = lm.tokenizer
    sessions = args.sessions or (64 if cuda else 8)
    init = load(args.init) if args.init is not None else None
    taps = init.config.taps if init is not None else new_net(lm, args.block, args.layers).config.taps

    def chat(text: str) -> list[int]:
        return tok.apply_chat_template([{"role": "user", "content": text}])

    if args.data is not None and args.data.exists():
        saved = torch.load(args.data, map_location=device)
        if tuple(saved["taps"]) != taps:
            raise SystemExit(f"{args.data} holds taps of layers {saved['taps']}, this drafter taps {taps}")
        examples, held_examples = [Example(*e) for e in saved["train"]], [Example(*e) for e in saved["held_out"]]
        gen_s = 0.0
    else:
        prompts = [chat(t) for t in training_prompts(args.prompts, args.seed)]
        held_prompts = [chat(t) for t in HELD_OUT]
        def progress(what: str) -> None:  # a long generation on a slow machine shows where it is
            print(json.dumps({"generated": what, "s": round(time.perf_counter() - start, 1)}), flush=True)

        answers = generate(lm, prompts, args.tokens, 0.0, sessions, args.seed)
        progress("greedy")
        for k in range(args.samples):  # varied answers: temperatures from 0.6 up
            temperature = 0.6 + 0.4 * k / max(1, args.samples - 1)
            answers += generate(lm, prompts, args.tokens, temperature, sessions, args.seed + 100_000 * (k + 1))
            progress(f"temperature {temperature:.2f}")
        held = generate(lm, held_prompts, args.tokens, 0.0, sessions, args.seed)
        gen_s = time.perf_counter() - start
        step_tokens, kept = (4096 if cuda else 512), torch.bfloat16 if cuda else torch.float32
        examples = build_examples(lm, answers, prompts * (1 + args.samples), taps, device, step_tokens, kept)
        held_examples = build_examples(lm, held, held_prompts, taps, device, step_tokens, kept)
        if args.data is not None:
            torch.save({"taps": taps, "train": [(e.ids, e.start, e.taps) for e in examples],
                        "held_out": [(e.ids, e.start, e.taps) for e in held_examples]}, args.data)
    print(json.dumps({"data": {"target": lm.name, "device": device_name, "train_sequences": len(examples),
                               "train_tokens": sum(len(e.ids) - e.start for e in examples),
                               "held_out_sequences": len(held_examples), "generate_s": round(gen_s, 1),
                               "taps_s": round(time.perf_counter() - start - gen_s, 1)}}),
          flush=True)
    if init is not None:
        net = init.to(device)
        vocab_ids = net.vocab_ids.cpu() if net.config.draft_vocab else None
    else:
        vocab_ids = draft_vocabulary([e.ids for e in examples], args.draft_vocab) if args.draft_vocab else None
        net = new_net(lm, args.block, args.layers, vocab_ids).to(device)
    head = dense_head(lm.model, vocab_ids).to(device)
    before = acceptance(net, lm, head, held_examples, device)
    t0 = time.perf_counter()
    seconds = max(30.0, 60 * args.total_minutes - (t0 - start) - 60) if args.total_minutes else 60 * args.minutes
    steps = train(net, lm, head, examples, args.steps, args.lr, args.anchors, device, seed=args.seed,
                  log=lambda line: print(line, flush=True), seconds=seconds)
    print(json.dumps({"config": str(net.config), "train_s": round(time.perf_counter() - t0, 1), "steps": steps,
                      "held_out_before": before,
                      "held_out": acceptance(net, lm, head, held_examples, device),
                      "held_out_answers_draftable": draftable(net, held_examples)}), flush=True)
    save(net.cpu(), args.out, target=lm.name)
    print(json.dumps({"saved": str(args.out)}), flush=True)


if __name__ == "__main__":
    main()
