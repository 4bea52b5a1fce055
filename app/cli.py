"""The `parley` command: the desktop app (no subcommand), generate, chat (terminal)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from engine import events as ev
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
    p.add_argument("--self-test", action="store_true", help="open the window offscreen, stream two chats at once, exit 0 if both answer")
    p.add_argument("--theme", choices=["system", "light", "dark"], default=None, help="the GUI's colours (default: the saved setting)")
    p.set_defaults(func=_gui)
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
    from server.cli import add_serve_parser  # `parley serve`: its options and handler live in server/

    add_serve_parser(sub)
    return p


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--model", default="default", help="'default' (embedded Gemma 3 270M), a .gguf file or a HF folder")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: CUDA when there is a GPU")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bfloat16 on CUDA, else float32")
    p.add_argument("--kv-layout", default="sequence", choices=["cell", "sequence"])
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "mlx"], help="auto: CUDA, then MLX on Apple silicon, then CPU")
    p.add_argument("--compile", action="store_true", help="CUDA: compile the decode step with torch.compile (15-60 s once per batch size; faster only before Hopper)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)


def open_engine(args: argparse.Namespace, max_sessions: int = 8):
    """Starts the engine thread and loads the chosen model on it, with a progress bar on stderr."""
    from tqdm import tqdm

    from app.engine_cli import EngineCLI
    from app.paths import Paths
    from engine.loading.default_model import resolve_model
    from engine.runtime import EngineConfig

    paths = Paths.resolve(getattr(args, "data_dir", None))
    source = resolve_model(args.model, paths.models)
    config = EngineConfig(
        kv_layout=args.kv_layout,
        max_sessions=max_sessions,
        device=args.device,
        dtype=args.dtype,
        backend=args.backend,
        compile_decode=args.compile,
        cache_dir=paths.cache,
    )
    cli = EngineCLI(config)
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
        model_id, loaded = cli.load(source, progress)
    except BaseException:
        cli.close()
        raise
    finally:
        bar.close()
    return cli, model_id, loaded


def _sampling(args: argparse.Namespace):
    from engine.sampling import SamplingParams

    return SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, max_tokens=args.max_tokens
    )


def _generate(args: argparse.Namespace) -> int:
    cli, model_id, _ = open_engine(args, max_sessions=max(1, len(args.prompt)))
    try:
        params = _sampling(args)
        sessions = [cli.engine.open_session(model_id, params=params, raw=args.raw) for _ in args.prompt]
        stream = not args.json and (len(args.prompt) == 1 or args.sequential)
        on_text = (lambda _turn, text: (sys.stdout.write(text), sys.stdout.flush())) if stream else None
        turns = []
        for sid, prompt in zip(sessions, args.prompt):
            turns.append(cli.engine.submit(sid, prompt))
            if args.sequential:
                cli.run(turns[-1:], on_text)
                if stream:
                    print()
        cli.run(turns, on_text)
        if stream and not args.sequential:
            print()
        for i, turn in enumerate(turns):
            end = cli.result(turn)
            if args.json:
                print(json.dumps({"prompt": i, "token_ids": cli.tokens.get(turn, []), "text": end.text}, ensure_ascii=False))
            elif not stream:
                print(f"--- prompt {i} ({end.reason})\n{end.text}")
    finally:
        cli.close()
    return 0


def _gui(args: argparse.Namespace) -> int:
    """No subcommand: the desktop app on the embedded default model (or its headless self-test)."""
    if args.self_test:
        from app.self_test import run

        return run(args.data_dir)
    from app.main import run_gui

    return run_gui(args.data_dir, args.theme)


def _chat(args: argparse.Namespace) -> int:
    cli, model_id, loaded = open_engine(args, max_sessions=1)
    try:
        sid = cli.engine.open_session(model_id, system_prompt=args.system, params=_sampling(args), overflow="truncate")
        print(f"Parley — {loaded.name}. Empty line or Ctrl-D to quit.", file=sys.stderr)
        while True:
            try:
                line = input("> ").strip()
            except EOFError:
                return 0
            if not line:
                return 0
            turn = cli.engine.submit(sid, line)
            try:
                cli.run([turn], lambda _t, text: (sys.stdout.write(text), sys.stdout.flush()))
            except KeyboardInterrupt:
                cli.engine.cancel(sid)
                cli.run([turn])
            print()
            end = cli.ended[turn]
            if isinstance(end, ev.Error):
                print(f"parley: {end.message}", file=sys.stderr)
                continue
            s = end.stats
            rate = f", {s.tokens_per_s:.1f} tok/s" if s.tokens_per_s else ""
            print(f"[{s.completion_tokens} tokens{rate}, context {s.context_used}/{s.context_limit}]", file=sys.stderr)
    finally:
        cli.close()


if __name__ == "__main__":
    sys.exit(main())
