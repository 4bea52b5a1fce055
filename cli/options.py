"""The engine options every subcommand shares, declared once, and the EngineConfig / SamplingParams built from them."""
from __future__ import annotations

import argparse
from pathlib import Path

from cli.paths import Paths, data_dir_arg, keep_kernels_under
from engine.seed import SEED_RULE, user_seed

MODEL_HELP = "'default' (embedded Gemma 3 270M), a .gguf file or a HF folder"
CONTEXT = 8192  # --context: tokens of each prompt with its answer, capped by the model's own


def add_engine_options(p: argparse.ArgumentParser, many_models: bool = False) -> None:
    """--model (once, or several times with `many_models`), the device options, and the hidden --data-dir."""
    p.add_argument("--data-dir", type=data_dir_arg, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    if many_models:
        p.add_argument("--model", action="append", type=_model, help=f"{MODEL_HELP}; may be given several times "
                       "(default: 'default' unless --remote is given)")
    else:
        p.add_argument("--model", default="default", type=_model, help=MODEL_HELP)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: CUDA when there is a GPU")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bfloat16 on CUDA, else float32")
    p.add_argument("--kv-layout", default="sequence", choices=["cell", "sequence"])
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "mlx"], help="auto: CUDA, then MLX on Apple silicon, then CPU")
    p.add_argument("--weights", default="auto", choices=["auto", "quantized", "dequantized"],
                   help="quantized: GGUF matrices stay quantized (int4/int8 kernels on the CPU and CUDA, ~1/4 the memory "
                   "of fp32); dequantized: float weights, the path that matches transformers; auto: quantized on the "
                   "CPU and, on CUDA, for models of ~1B weights and up (faster there); smaller ones as floats while "
                   "they fit in 60%% of the free GPU memory")
    p.add_argument("--quantize", default=None, choices=["q8", "q4"],
                   help="a Hugging Face folder's matrices quantized at load on the CPU (GGUF files keep their own)")
    p.add_argument("--speculative", default="auto", choices=["auto", "off", "lookup", "draft", "dflash"],
                   help="speculative decoding, output unchanged: lookup drafts tokens from the prompt and earlier output "
                   "(n-gram matches), draft and dflash from --draft-model; the model verifies them in one step; auto: "
                   "lookup")
    p.add_argument("--draft-model", default=None, type=_model, help="a smaller .gguf or HF folder with the same tokenizer that "
                   "drafts tokens, or a DFlash drafter (.safetensors, training/dflash.py) trained for the model "
                   "(implies --speculative draft or dflash)")
    p.add_argument("--compile", action="store_true", help="CUDA: compile the decode step with torch.compile (15-60 s once per batch size; faster only before Hopper)")


def add_context_option(p: argparse.ArgumentParser, what: str) -> None:
    # default None: a --context given is told apart from the default, which a smaller model caps without a word
    p.add_argument("--context", type=_at_least_one, default=None,
                   help=f"tokens {what} (prompt + answer; default: {CONTEXT}, at most the model's own)")


def session_tokens(args: argparse.Namespace) -> int:
    """The context each session asks for: --context, or its default."""
    return CONTEXT if args.context is None else args.context


def context_capped(args: argparse.Namespace, name: str, context: int) -> str | None:
    """The line that tells a --context given above the model's own context that it was capped (the cache holds
    the smaller of the two); None where it was not given or fits."""
    if args.context is None or args.context <= context:
        return None
    return f"--context {args.context:,} is more than {name} holds: its sessions get its own {context:,} tokens"


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-p", type=_fraction, default=1.0, help="0: only the most likely token (greedy)")
    p.add_argument("--top-k", type=_count_or_off, default=0, help="0 or -1: off")
    p.add_argument("--min-p", type=_fraction, default=0.0, help="1: only the most likely token (greedy)")
    p.add_argument("--repetition-penalty", "--repeat-penalty", type=float, default=1.0,
                   help="divides the logits of tokens seen in the last --repeat-last-n tokens (1 is off)")
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--repeat-last-n", type=int, default=64,
                   help="how many of the latest tokens the penalties read (-1: all, 0: none; llama.cpp's default 64)")
    p.add_argument("--seed", type=_seed, default=None, help=f"{SEED_RULE}; the server takes the same")
    p.add_argument("--thinking", default=None, choices=["on", "off"],
                   help="whether a thinking model (Qwen3, SmolLM3) thinks before answering; default: the model's own "
                   "(off with --json-schema or --grammar)")
    held = p.add_mutually_exclusive_group()
    held.add_argument("--json-schema", default=None, metavar="FILE|object",
                      help="hold each answer to JSON: a JSON schema file, or 'object' for any JSON object (every token "
                      "is masked to what the schema allows)")
    held.add_argument("--grammar", default=None, metavar="FILE", type=Path,
                      help="hold each answer to a Lark grammar file (llguidance's dialect: regex terminals, %%json)")


# The flags below take values the engine's own checks refuse (top-p 0, min-p 1, top-k and seed -1), so their ranges
# are checked here: the engine's message ("min_p must be in [0, 1)") would refuse a value the flag accepts.
def _fraction(text: str) -> float:
    value = _number(text, float)
    if not 0 <= value <= 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"a number from 0 to 1, not {text!r}")
    return value


def _count_or_off(text: str) -> int:
    value = _number(text, int)
    if value < -1:
        raise argparse.ArgumentTypeError(f"0 or -1 (off), or a number of tokens, not {text!r}")
    return value


def _at_least_one(text: str) -> int:
    n = int(text) if text.strip().isdecimal() else 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, not {text!r}")
    return n


def _model(text: str) -> str:
    """A blank --model read as the working folder ('. has no config.json'), a blank --draft-model as none at all."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{MODEL_HELP}, not {text!r}")
    return text


def _seed(text: str) -> int | None:
    """The server's rule (engine/seed.py): it wrapped -5 while this flag refused it."""
    try:
        return user_seed(_number(text, int))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{SEED_RULE}, not {text!r}") from None


def _number(text: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{'a whole number' if kind is int else 'a number'}, not {text!r}") from None


def paths_of(args: argparse.Namespace) -> Paths:
    paths = Paths.resolve(getattr(args, "data_dir", None))
    keep_kernels_under(paths)
    return paths


def engine_config(args: argparse.Namespace, paths: Paths, **sizes):
    """The EngineConfig of the parsed device options; `sizes` are max_sessions, max_session_tokens..."""
    from engine.runtime import EngineConfig

    from engine.errors import ParleyError

    from engine.loading.default_model import resolve_model

    draft = resolve_model(args.draft_model, paths.models) if args.draft_model else None  # 'default' too, as --model
    if draft is not None and not draft.exists():  # the engine drafts from the prompt instead: a typo ran, exit 0
        raise ParleyError(f"argument --draft-model: no file or folder {args.draft_model}")
    try:
        return EngineConfig(kv_layout=args.kv_layout, device=args.device, dtype=args.dtype, backend=args.backend,
                            compile_decode=args.compile, cache_dir=paths.cache, weights=args.weights,
                            quantize=args.quantize, draft_model=draft,
                            speculative=speculative_mode(args.speculative, draft), **sizes)
    except ValueError as exc:  # options that do not go together: one line, as for any other bad input
        raise ParleyError(str(exc)) from exc


def speculative_mode(requested: str, draft: Path | None) -> str:
    """The mode of --speculative with --draft-model: the one the file implies (draft, or dflash for a DFlash drafter)
    where --speculative is auto or names it; any other mode would silently not be what was asked, so it is refused."""
    from engine.speculative.dflash_net import draft_mode

    if draft is None:
        return requested
    implied = draft_mode(draft)
    if requested in ("auto", implied):
        return implied
    if requested == "dflash":
        raise ValueError(f"--speculative dflash needs a DFlash drafter file (training/dflash.py); {draft} is not one")
    kind = "a DFlash drafter" if implied == "dflash" else "a draft model"
    raise ValueError(f"--speculative {requested} does not go with --draft-model ({draft.name} is {kind}: "
                     f"--speculative {implied}, or leave --speculative out)")


def sampling_params(args: argparse.Namespace):
    """The SamplingParams of the flags; a value the engine refuses is one line naming its flag."""
    from engine.errors import ParleyError
    from engine.sampling import SamplingParams

    thinking = getattr(args, "thinking", None)
    grammar = answer_grammar(args)
    # top-k -1 (off), seed -1 (a random one), top-p 0 and min-p 1 (the most likely token) read as the server reads them
    greedy = args.top_p == 0 or args.min_p == 1
    try:
        return SamplingParams(
            temperature=0.0 if greedy else args.temperature, top_p=1.0 if greedy else args.top_p,
            top_k=0 if args.top_k == -1 else args.top_k, min_p=0.0 if greedy else args.min_p,
            repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty, repeat_last_n=args.repeat_last_n,
            seed=args.seed,
            max_tokens=args.max_tokens, grammar=grammar,
            # a thought before the answer would have to follow the grammar too: none unless asked for
            thinking=(None if grammar is None else False) if thinking is None else thinking == "on",
        )
    except ParleyError as exc:  # "max_tokens must be between 1 and …" named a field, not the flag given
        raise ParleyError(_as_flag(str(exc), args)) from None


def answer_grammar(args: argparse.Namespace) -> str | None:
    """The grammar of --json-schema or --grammar (engine/constraint/grammar.py), or None; a file that cannot be read
    or compiled is one line naming the flag."""
    from engine.errors import ParleyError

    schema, lark = getattr(args, "json_schema", None), getattr(args, "grammar", None)
    if schema is None and lark is None:
        return None
    from engine.constraint.grammar import json_grammar, lark_grammar, schema_from_text

    flag, path = ("--grammar", lark) if lark is not None else ("--json-schema", Path(schema))
    try:
        if lark is None and schema == "object":
            return json_grammar()
        text = path.read_text(encoding="utf-8")
        return lark_grammar(text) if lark is not None else json_grammar(schema_from_text(text))
    except (OSError, UnicodeDecodeError) as exc:
        raise ParleyError(f"argument {flag}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    except ParleyError as exc:
        raise ParleyError(f"argument {flag}: {exc}") from None


def _as_flag(message: str, args: argparse.Namespace) -> str:
    """The engine's 'Invalid sampling setting: max_tokens must be …' as argparse says it: 'argument --max-tokens: must
    be …, not 0'."""
    head, sep, rest = message.partition("Invalid sampling setting: ")
    name, _, why = rest.partition(" must ")
    if head or not sep or not hasattr(args, name):
        return message
    why = why.rstrip(".")
    return f"argument --{name.replace('_', '-')}: must {why}{'' if ', not ' in why else f', not {getattr(args, name)}'}"
