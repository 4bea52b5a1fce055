"""`parley serve`: its options and its handler, which starts the server/ package on an engine."""
from __future__ import annotations

import argparse
import os
import sys

from cli.options import add_context_option, add_engine_options, context_capped, engine_config, paths_of, session_tokens
from engine.errors import ParleyError

SESSIONS = 8  # --max-sessions, as --context, each local model's (a remote endpoint keeps its own)
MIN_BODY_MB = 0.001  # --max-body-mb: server.app.ServerSettings takes 1,024 bytes and more
MAX_SESSIONS = 65536  # far past what one machine batches (vLLM's default is 256), and its books build at once


def add_serve_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    s.add_argument("--port", type=_port, default=8000, help="0 to 65535 (0: any free port)")
    add_engine_options(s, many_models=True)
    s.add_argument("--remote", action="append", default=[], metavar="URL[#MODEL]",
                   help="also serve a model of an OpenAI-compatible endpoint, e.g. http://gpu-box:8000/v1#Qwen/Qwen3-32B")
    s.add_argument("--remote-api-key", default=None,
                   help="key for --remote endpoints (default: $PARLEY_REMOTE_API_KEY); clients' key: --api-key")
    s.add_argument("--api-key", default=os.environ.get("PARLEY_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $PARLEY_API_KEY; none or empty: no key needed)")
    s.add_argument("--max-sessions", type=_sessions, default=SESSIONS,
                   help=f"requests generating at once per local model, 1 to {MAX_SESSIONS:,}; more wait")
    add_context_option(s, "per request to a local model")
    s.add_argument("--max-body-mb", type=_megabytes, default=8.0, help="largest request body accepted (larger: 413)")
    s.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another name the Host header may carry besides --host (e.g. a reverse proxy's); repeatable")
    s.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin whose scripts may call the API (e.g. http://localhost:3000, or * for any); "
                        "repeatable; none by default")
    s.set_defaults(func=serve)
    return s


def _port(text: str) -> int:
    port = int(text) if text.strip().isdecimal() else -1  # isdigit() passed '²', which int() refuses
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 0 to 65535, not {text!r}")
    return port


def _sessions(text: str) -> int:
    """Beyond MAX_SESSIONS the cache's per-slot books alone took minutes to build (2**31: no answer in 90 s, then the
    memory refusal) and 10**20 failed the load with 'OverflowError('Python int too large to convert to C ssize_t')'."""
    n = int(text) if text.strip().isdecimal() else 0
    if not 1 <= n <= MAX_SESSIONS:
        raise argparse.ArgumentTypeError(f"a whole number from 1 to {MAX_SESSIONS:,}, not {text!r}")
    return n


def _megabytes(text: str) -> float:
    try:
        mb = float(text)
    except ValueError:
        mb = float("nan")
    if not MIN_BODY_MB <= mb < 1 << 20:  # NaN fails too; below, the server's own check named its field, in bytes
        raise argparse.ArgumentTypeError(f"a size in MB of at least {MIN_BODY_MB} (1 KB), not {text!r}")
    return mb


def api_key(given: str | None) -> str | None:
    """The key clients must send; an empty one (PARLEY_API_KEY= in a compose file) asks for none."""
    return (given or "").strip() or None


def _remote_key(args: argparse.Namespace) -> str | None:
    """The key sent to --remote endpoints. Given without one, it was taken for the key clients must send (--api-key)
    and the server answered anyone: refused."""
    if args.remote_api_key is None:
        return os.environ.get("PARLEY_REMOTE_API_KEY")
    if not args.remote:
        raise ParleyError("argument --remote-api-key: it is the key sent to --remote endpoints, and none is given; "
                          "the key this server's clients must send is --api-key")
    return args.remote_api_key


def _check_allowed_hosts(args: argparse.Namespace) -> None:
    """--allow-host beside --host 0.0.0.0 (or ::) restricted nothing, though it reads as the names let in: a server
    listening everywhere answers to any name already."""
    from server.app import WILDCARD_HOSTS

    if args.allow_host and args.host.strip().lower() in WILDCARD_HOSTS:
        raise ParleyError(f"argument --allow-host: --host {args.host} answers to any name already (--api-key is its "
                          "guard); leave out --allow-host, or listen on one address")


def _check_distinct(specs: list[str], sources: list) -> None:
    """`--model default --model default` loaded the model twice (twice the memory) and served the copy as
    'Gemma 3 270m (2)'."""
    from engine.loading.gguf_split import model_file

    first: dict = {}
    for spec, source in zip(specs, sources):
        key = model_file(source).resolve()  # a split model's folder and its first part are one model
        if key in first:
            raise ParleyError(f"argument --model: {spec} is the model of --model {first[key]} again; each model "
                              "loads once (--max-sessions serves more requests at once)")
        first[key] = spec


def serve(args: argparse.Namespace) -> int:
    from cli.engine_flags import Target, check_engine_flags
    from cli.first_run import kernel_build_note
    from cli.terminal import printable
    from engine.loading.default_model import resolve_model
    from server.app import ServerSettings
    from server.bridge import ServerBridge
    from server.run import listening_socket, say, serve_forever

    remote_key = _remote_key(args)
    _check_allowed_hosts(args)
    paths = paths_of(args)
    specs = args.model or ([] if args.remote else ["default"])
    sources = [resolve_model(spec, paths.models) for spec in specs]
    _check_distinct(specs, sources)
    target = Target.of(args, sources)
    check_engine_flags(args, target)  # a flag these models or this machine ignore: before the loads
    try:  # checked before any model loads
        settings = ServerSettings(bound_host=args.host, max_body_bytes=int(args.max_body_mb * (1 << 20)),
                                  allowed_hosts=tuple(args.allow_host), cors_origins=tuple(args.cors_origin))
        sock = listening_socket(args.host, args.port)
    except ValueError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return 2
    config = engine_config(args, paths, max_sessions=args.max_sessions,
                           max_session_tokens=session_tokens(args))
    bridge = ServerBridge(config).start()
    if note := kernel_build_note(args, target):
        say(f"parley: {note}")
    try:
        for spec, source in zip(specs, sources):
            m = bridge.load(source, alias=spec)
            for notice in m.info.get("notices", []):  # what generate and the app say of a load (a drafter it cannot use)
                say(f"parley: {printable(notice)}")
            if capped := context_capped(args, printable(m.id), m.context):
                say(f"parley: {capped}")
            say(f"parley: serving {printable(m.id)} (context {m.context})")
        for spec in args.remote:
            url, _, name = spec.partition("#")
            m = bridge.add_remote(url, name or None, remote_key)
            say(f"parley: serving {printable(m.id)} from {printable(m.info.get('base_url'))}")
        serve_forever(bridge, args.host, args.port, api_key(args.api_key), settings, sock)
    finally:
        sock.close()
        bridge.shutdown()
    return 0
