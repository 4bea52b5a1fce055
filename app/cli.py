"""The `parley` command: generate, chat (terminal), and the app itself."""
from __future__ import annotations

import argparse
import json
import sys
import time

from engine.errors import ParleyError


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ParleyError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="parley", description="Chat with local language models.")
    p.add_argument("--data-dir", help="keep all data here (default: the platform's user folders, or $PARLEY_HOME)")
    p.set_defaults(func=_chat_default)
    sub = p.add_subparsers(dest="command")
    g = sub.add_parser("generate", help="complete one or more prompts")
    _model_options(g)
    g.add_argument("--prompt", action="append", required=True, help="may be given several times")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--raw", action="store_true", help="BOS + text, no chat template")
    g.add_argument("--json", action="store_true", help="one JSON line per prompt at the end")
    g.add_argument("--sequential", action="store_true", help="run prompts one after another (fresh state each)")
    g.set_defaults(func=_generate)
    c = sub.add_parser("chat", help="a conversation in the terminal")
    _model_options(c)
    c.add_argument("--max-tokens", type=int, default=512)
    c.add_argument("--system", default=None, help="system prompt")
    c.set_defaults(func=_chat)
    return p


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--model", default="default", help="'default' (embedded Gemma 3 270M), a .gguf file or a HF folder")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--kv-layout", default="sequence", choices=["cell", "sequence"])
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)


def load(args: argparse.Namespace):
    """Loads the chosen model with a progress bar on stderr."""
    from tqdm import tqdm

    from app.paths import Paths
    from engine.loading.default_model import resolve_model
    from engine.loading.loader import LoadOptions, load_model

    paths = Paths.resolve(getattr(args, "data_dir", None))
    source = resolve_model(args.model, paths.models)
    bar = tqdm(total=100, desc="Loading", file=sys.stderr, leave=False, disable=not sys.stderr.isatty())

    shown = {"stage": None, "percent": -1}

    def progress(stage: str, fraction: float) -> None:
        percent = int(fraction * 100)
        if (stage, percent) != (shown["stage"], shown["percent"]):
            shown.update(stage=stage, percent=percent)
            bar.set_description(stage, refresh=False)
            bar.n = percent
            bar.refresh()

    try:
        return load_model(source, LoadOptions(args.device, args.dtype, paths.cache), progress)
    finally:
        bar.close()


def _sampling(args: argparse.Namespace):
    from engine.sampling import SamplingParams

    return SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, max_tokens=args.max_tokens
    )


def _generate(args: argparse.Namespace) -> int:
    from engine.generate import RunConfig, generate

    lm = load(args)
    tok = lm.tokenizer
    prompts = [tok.encode(p, add_bos=True) if args.raw else tok.apply_chat_template([{"role": "user", "content": p}]) for p in args.prompt]
    params, run = _sampling(args), RunConfig(kv_layout=args.kv_layout)
    stream = None if args.json or (len(prompts) > 1 and not args.sequential) else _Streamer(tok)
    on_token = stream.push if stream else None
    if args.sequential:
        seqs = [s for p in prompts for s in generate(lm, [p], params, run, on_token)]
        for i, s in enumerate(seqs):
            s.seq_id = i
    else:
        seqs = generate(lm, prompts, params, run, on_token)
    for s in seqs:
        text = tok.decode([t for t in s.generated if t not in tok.stop_ids])
        if args.json:
            print(json.dumps({"prompt": s.seq_id, "token_ids": s.generated, "text": text}, ensure_ascii=False))
        elif not stream:
            print(f"--- prompt {s.seq_id} ({s.finish_reason})\n{text}")
    return 0


class _Streamer:
    """Prints each token's text as it arrives; a new prompt starts on a new line."""

    def __init__(self, tok):
        self.tok, self.current, self.detok = tok, None, None

    def push(self, index: int, token: int) -> None:
        if index != self.current:
            if self.detok is not None:
                print(self.detok.flush(), flush=True)
            self.current, self.detok = index, self.tok.detokenizer()
        sys.stdout.write(self.detok.push(token))
        sys.stdout.flush()

    def close(self) -> None:
        if self.detok is not None:
            print(self.detok.flush(), flush=True)


def _chat_default(args: argparse.Namespace) -> int:
    args = build_parser().parse_args(["chat"] + (["--data-dir", args.data_dir] if args.data_dir else []))
    return _chat(args)


def _chat(args: argparse.Namespace) -> int:
    from engine.generate import RunConfig, generate

    lm = load(args)
    tok = lm.tokenizer
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print(f"Parley — {lm.name}. Empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            return 0
        if not line:
            return 0
        messages.append({"role": "user", "content": line})
        stream = _Streamer(tok)
        started = time.perf_counter()
        seq = generate(lm, [tok.apply_chat_template(messages)], _sampling(args), RunConfig(args.kv_layout), stream.push)[0]
        stream.close()
        answer = tok.decode([t for t in seq.generated if t not in tok.stop_ids], skip_special=True)
        messages.append({"role": "assistant", "content": answer})
        rate = len(seq.generated) / (time.perf_counter() - started)
        print(f"[{len(seq.generated)} tokens, {rate:.1f} tok/s]", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
