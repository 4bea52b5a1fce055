"""The `parley serve` subcommand: its options and its handler (app/cli.py only registers it)."""
from __future__ import annotations

import argparse
import os
import sys


def add_serve_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions)")
    s.add_argument("--data-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--model", action="append", help="'default' (embedded Gemma 3 270M), a .gguf file or a HF "
                   "folder; may be given several times (default: 'default' unless --remote is given)")
    s.add_argument("--remote", action="append", default=[], metavar="URL[#MODEL]",
                   help="also serve a model of an OpenAI-compatible endpoint, e.g. http://gpu-box:8000/v1#Qwen/Qwen3-32B")
    s.add_argument("--remote-api-key", default=os.environ.get("PARLEY_REMOTE_API_KEY"),
                   help="key for --remote endpoints (default: $PARLEY_REMOTE_API_KEY)")
    s.add_argument("--api-key", default=os.environ.get("PARLEY_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $PARLEY_API_KEY; none: no key needed)")
    s.add_argument("--max-sessions", type=int, default=8, help="requests generating at once per model; more wait")
    s.add_argument("--context", type=int, default=8192, help="tokens per request (prompt + answer)")
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: CUDA when there is a GPU")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bfloat16 on CUDA, else float32")
    s.add_argument("--kv-layout", default="sequence", choices=["cell", "sequence"])
    s.add_argument("--compile", action="store_true", help="CUDA: compile the decode step with torch.compile (15-60 s once per batch size; faster only before Hopper)")
    s.set_defaults(func=serve)
    return s


def serve(args: argparse.Namespace) -> int:
    from app.paths import Paths
    from engine.loading.default_model import resolve_model
    from engine.runtime import EngineConfig
    from server.bridge import EngineBridge
    from server.run import serve_forever

    paths = Paths.resolve(getattr(args, "data_dir", None))
    config = EngineConfig(kv_layout=args.kv_layout, max_sessions=args.max_sessions, max_session_tokens=args.context,
                          device=args.device, dtype=args.dtype, compile_decode=args.compile, cache_dir=paths.cache)
    bridge = EngineBridge(config).start()
    try:
        for spec in args.model or ([] if args.remote else ["default"]):
            m = bridge.load(resolve_model(spec, paths.models), alias=spec)
            print(f"parley: serving {m.id} (context {m.context})", file=sys.stderr)
        for spec in args.remote:
            url, _, name = spec.partition("#")
            m = bridge.add_remote(url, name or None, args.remote_api_key)
            print(f"parley: serving {m.id} from {m.info.get('base_url')}", file=sys.stderr)
        serve_forever(bridge, args.host, args.port, args.api_key)
    finally:
        bridge.shutdown()
    return 0
