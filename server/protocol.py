"""OpenAI request validation and response shapes: plain data in, plain dicts out (no HTTP here)."""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field

from engine.errors import ParleyError
from engine.logprobs import MAX_TOP
from engine.sampling import MAX_BIAS, MAX_BIASED, MAX_INT32, MAX_STOP_CHARS, SamplingParams
from engine.seed import user_seed
from engine.tokenizer.detokenizer import partial_suffix
from engine.tokenizer.tokenizer import THOUGHT_TAGS  # a reasoning model's, at the start of an answer
from server.api_error import APIError
from server.logprobs import chat_logprobs, completion_logprobs
from server.prompt_logprobs import echo_only
from server.prompts import Prompt, check_answers, completion_prompts
from server.response_format import response_grammar
from server.tools import ToolRequest, assistant_calls, call_dicts, request_tools

RESPONSE_TAGS = ("<response>", "</response>")  # Granite's reply after its thought
FINISH_REASONS = {"stop": "stop", "stop_string": "stop", "length": "length", "context_full": "length",
                  "tool_calls": "tool_calls"}
ENDED = ("stop", "stop_string")  # an answer that ended by itself (not cut short): its calls end it as "tool_calls"
MAX_STOP_STRINGS = 16
REASONING_EFFORTS = {"none": False, "minimal": False, "low": False, "medium": None, "high": True}  # -> thinking
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions without max_tokens
MAX_CHOICES = 128  # OpenAI's bound on `n`; each choice is a session of its own, batched in the same steps
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")  # where a body may hold one: its strings are then read


@dataclass(slots=True)
class TurnRequest:
    """What one HTTP request asks the engine for: a conversation (or a raw document) and sampling settings."""

    params: SamplingParams
    stream: bool
    include_usage: bool
    raw: bool  # /v1/completions: BOS + prompt, no chat template
    system: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)  # user/assistant messages before the last one
    prompt: str = ""  # a chat's last user message, or the answer to continue (a completion's documents: `prompts`)
    continue_final: bool = False  # the last message is the assistant's: the answer goes on from its text
    created: int = field(default_factory=lambda: int(time.time()))  # one value for every chunk of the answer
    n: int = 1  # answers (choices) to the one prompt
    tools: ToolRequest | None = None  # the tools the model is shown, and how its calls are read back
    echo: bool = False  # a completion's text starts with its prompt
    best_of: int = 1  # answers made, of which the `n` with the highest mean log-probability a token are sent
    suffix: str = ""  # a completion's text after the insertion point: the model fills in the middle (the engine
    # builds the prompt around the hole from the model's own markers)
    final: dict | None = None  # the last message's fields beside its content (a tool result's role and call id)
    prompts: tuple[Prompt, ...] = ()  # a completion's documents, text or token ids, each answered `n` times
    prompt_only: bool = False  # `max_tokens: 0` with `echo`: the prompt alone (server/prompt_logprobs.py)

    def messages(self, p: int = 0) -> list[dict[str, str]]:
        """The conversation the engine answers (without the system prompt); a completion's document `p` (none where it
        is token ids), or what goes before the hole where the model fills in the middle."""
        if self.prompts:
            text = self.prompts[p]
            return [] if isinstance(text, tuple) else [{"role": "user", "content": text}]
        last = self.final or {"role": "assistant" if self.continue_final else "user"}
        return [*self.history, {**last, "content": self.prompt}]

    def prompt_ids(self, p: int) -> list[int] | None:
        """Completion prompt `p`'s token ids, where it was sent as ids."""
        ids = self.prompts[p] if self.prompts else None
        return list(ids) if isinstance(ids, tuple) else None

    @property
    def prompt_count(self) -> int:
        """Prompts answered: a completion's array of them, or the one."""
        return len(self.prompts) or 1

    @property
    def made(self) -> int:
        """Answers made: `n`, or `best_of` where more are made than sent."""
        return max(self.n, self.best_of)

    @property
    def ranked(self) -> bool:
        """More answers are made than sent: each one's log-probabilities rank it."""
        return self.best_of > self.n

    def choice_params(self, index: int) -> SamplingParams:
        """Choice `index`'s sampling: a seeded request's choices draw from seed, seed + 1, … (each reproducible, and
        not n copies of one draw); unseeded ones draw from seeds of their own."""
        params = self.params
        if self.ranked and params.logprobs is None:  # the chosen tokens' own, to rank the answers by
            params = dataclasses.replace(params, logprobs=0)
        if index > 0 and params.prompt_logprobs is not None:  # the first choice scores the prompt, the others copy
            params = dataclasses.replace(params, prompt_logprobs=None)  # its cache (one prefill) and share its entries
        if params.seed is None or index == 0:
            return params
        return dataclasses.replace(params, seed=(params.seed + index) % 2**64)


def parse_json(body: bytes) -> dict:
    try:
        data = _loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}.") from None
    except ValueError:  # Python reads no integer of more than 4,300 digits (CVE-2020-10735): it was a 500
        raise APIError(400, "The request body holds a number of more than 4,300 digits.") from None
    except RecursionError:  # json recurses per nesting level: 2,000 brackets deep must not be a 500
        raise APIError(400, "The request body nests JSON too deeply.") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.")
    lone = _lone_surrogate(data) if _SURROGATE_ESCAPE.search(body) else None
    if lone is not None:  # no character: echoed or quoted back, it failed the answer's UTF-8 encoding (a 500)
        raise APIError(400, f"The request body holds \\u{ord(lone):04x}, half of a surrogate pair and no character: "
                            "JSON writes a character past U+FFFF as both halves.")
    return data


def _loads(body: bytes):
    """json.loads with the cyclic collector paused: a body of millions of small arrays set off a full collection every
    few hundred thousand, 4x the parse (an 8 MB body of [1] arrays: 1.6 s, every stream stalled); JSON makes no cycles."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return json.loads(body)
    finally:
        if paused:
            gc.enable()


def _lone_surrogate(data) -> str | None:
    """An unpaired surrogate in the strings (keys too) of parsed JSON, None where there is none (a pair written
    as two \\u escapes reads as its one character)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return item[exc.start]
    return None


def parse_chat(data: dict, context_limit: int, tool_format: str | None = None, model: str = "This model") -> TurnRequest:
    """`tool_format`: how the model writes tool calls (engine/tool_calls.py; None: it takes no tools)."""
    _reject_unsupported(data, chat=True)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty array of messages.", "messages")
    system, turns = [], []
    for i, m in enumerate(messages):
        role, content = _message(m, i)
        if role in ("system", "developer"):
            system.append(content)
        else:
            turns.append({"role": role, "content": content, **_call_fields(m, role, i)})
    if len(turns) > 1 and turns[-1]["role"] == "assistant" and not turns[-1]["content"]:
        turns.pop()  # an empty answer last asks for the answer, as OpenAI reads it
    if not turns:
        raise APIError(400, "The messages need one from the user (or an answer to continue).", "messages")
    req = _common(data, context_limit, raw=False)
    req.system = "\n\n".join(system) or None
    req.history, req.prompt = turns[:-1], turns[-1]["content"]
    req.final = {k: v for k, v in turns[-1].items() if k != "content"} if turns[-1]["role"] == "tool" else None
    req.tools = request_tools(data, tool_format, model)
    if req.tools is not None:
        req.system = req.tools.system(req.system)
    if req.tools is not None and req.tools.grammar is not None:  # a required call: a thought would break its form
        thinking = False if req.params.thinking is None else req.params.thinking
        req.params = dataclasses.replace(req.params, grammar=req.tools.grammar, thinking=thinking)
    req.continue_final = turns[-1]["role"] == "assistant"  # a prefilled answer goes on, as llama.cpp's server does
    if req.continue_final and not req.prompt:
        raise APIError(400, "The messages need one from the user (or an answer to continue).", "messages")
    if req.continue_final and req.params.grammar is not None:  # the grammar would start inside the prefilled text
        field = "tool_choice" if req.tools is not None else "response_format"
        raise APIError(400, f"'{field}' cannot continue a prefilled answer: end the messages with the user's.", field)
    return req


def parse_completion(data: dict, context_limit: int) -> TurnRequest:
    _reject_unsupported(data, chat=False)
    prompts = completion_prompts(data.get("prompt"), context_limit)
    echo = _typed(data, "echo", bool, False)
    data, prompt_only = echo_only(data, echo)
    req = _common(data, context_limit, raw=True)
    req.prompts, req.echo, req.prompt_only = tuple(prompts), echo, prompt_only
    scored = req.echo and req.params.logprobs is not None  # the prompt's own, before the answer's
    # echo set here, not left to SamplingParams' default from prompt_logprobs: choices past the first drop those
    # (choice_params) and must still list an end-of-turn token as the first does
    req.params = dataclasses.replace(req.params, prompt_logprobs=req.params.logprobs if scored else None, echo=scored)
    req.best_of = _best_of(data, req)
    req.suffix = _typed(data, "suffix", str, "")
    if req.suffix and any(isinstance(p, tuple) for p in prompts):  # the markers go around text, then it is tokenised
        raise APIError(400, "'suffix' needs a text prompt: the model's fill-in-the-middle markers are placed around the "
                            "text before and after the hole, and token ids give no text to place them around.", "suffix")
    if req.suffix and scored:  # the tokens scored are the document's: markers and suffix around the prompt
        raise APIError(400, "'echo' with 'logprobs' cannot score a 'suffix' request's prompt: the model reads it inside "
                            "its fill-in-the-middle document (the markers and the suffix around it), not as sent. Send "
                            "'echo' or 'logprobs' alone.", "echo")
    check_answers(len(prompts), req.made)
    return req


def _best_of(data: dict, req: TurnRequest) -> int:
    """`best_of`: answers to make (n at least; the n best are sent, so none can stream before all have ended)."""
    best_of = _number(data, "best_of", int, req.n)
    if not req.n <= best_of <= MAX_CHOICES:
        raise APIError(400, f"'best_of' must be between 'n' ({req.n}) and {MAX_CHOICES}, not {best_of}.", "best_of")
    if best_of > req.n and req.stream:
        raise APIError(400, "'best_of' above 'n' cannot stream: the answers sent are known once all have ended.",
                       "best_of")
    return best_of


def _message(m, i: int) -> tuple[str, str]:
    if not isinstance(m, dict):
        raise APIError(400, f"messages[{i}] must be an object with 'role' and 'content'.", f"messages[{i}]")
    role, content = m.get("role"), m.get("content")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise APIError(400, f"messages[{i}].role must be system, developer, user, assistant or tool, not {role!r}.",
                       f"messages[{i}].role")
    if role == "assistant" and content is None and isinstance(m.get("refusal"), str):
        content = m["refusal"]  # an OpenAI answer that refused: its words are what the model said
    if role == "assistant" and content is None and m.get("tool_calls"):
        content = ""  # an answer that only called tools
    if isinstance(content, list):
        content = "\n".join(_part_text(p, role, i) for p in content)  # one line each, as vLLM and llama.cpp join them
    if not isinstance(content, str):
        raise APIError(400, f"messages[{i}].content must be a string or an array of text parts.",
                       f"messages[{i}].content")
    return role, content


def _call_fields(m: dict, role: str, i: int) -> dict:
    """A message's tool fields as a chat template reads them: an answer's calls, a tool result's call id and name."""
    if role == "assistant" and m.get("tool_calls"):
        return {"tool_calls": assistant_calls(m["tool_calls"], i)}
    if role != "tool":
        return {}
    fields = {key: m[key] for key in ("tool_call_id", "name") if isinstance(m.get(key), str)}
    if "tool_call_id" not in fields:
        raise APIError(400, f"messages[{i}] is a tool result without its 'tool_call_id'.", f"messages[{i}]")
    return fields


def _part_text(part, role: str, i: int) -> str:
    """A content part's text: a text part's, or an answer's refusal part's (OpenAI's assistant parts); no images."""
    kind = part.get("type") if isinstance(part, dict) else None
    kind = kind if isinstance(kind, str) else None
    key = {"text": "text", "refusal": "refusal" if role == "assistant" else None}.get(kind)
    if key is not None and isinstance(part.get(key), str):
        return part[key]
    what = f"a {kind} part without its {key!r} string" if key else f"a part of type {kind!r}" if kind else \
        "a part without a type"
    raise APIError(400, f"messages[{i}].content has {what}: this server reads only text parts.",
                   f"messages[{i}].content")


def _common(data: dict, context_limit: int, raw: bool) -> TurnRequest:
    stream = _typed(data, "stream", bool, False)
    options = _typed(data, "stream_options", dict, {})
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise APIError(400, "'stream_options.include_usage' must be a boolean.", "stream_options")
    n = _number(data, "n", int, 1)
    if not 1 <= n <= MAX_CHOICES:
        raise APIError(400, f"'n' must be between 1 and {MAX_CHOICES}, not {n}.", "n")
    params = sampling(data, context_limit, COMPLETION_MAX_TOKENS if raw else None)
    params = dataclasses.replace(params, logprobs=_logprobs(data, raw), logit_bias=_logit_bias(data))
    grammar = response_grammar(data)
    if grammar is not None:  # a thought before the JSON would have to follow the grammar too: none unless asked
        params = dataclasses.replace(params, grammar=grammar, thinking=False if params.thinking is None else params.thinking)
    return TurnRequest(params, stream, include_usage, raw, n=n)


def _logprobs(data: dict, raw: bool) -> int | None:
    """The most likely tokens the request wants beside each chosen one's log-probability (0: none beside it), or None
    for no log-probabilities: chat's `logprobs` (a boolean) and `top_logprobs`; a completion's `logprobs` (a count)."""
    if raw:
        if data.get("top_logprobs") not in (None, 0):
            raise APIError(400, "'top_logprobs' is a chat field: a completion's 'logprobs' is the count of top tokens.",
                           "top_logprobs")
        if data.get("logprobs") is False:  # what a client that means "none" may send
            return None
        top = _number(data, "logprobs", int, None)
        _top_in_range(top, "logprobs")
        return top
    wanted = _typed(data, "logprobs", bool, False)
    top = _number(data, "top_logprobs", int, None)
    _top_in_range(top, "top_logprobs")
    if top and not wanted:  # OpenAI's rule
        raise APIError(400, "'top_logprobs' needs 'logprobs': true.", "top_logprobs")
    return (top or 0) if wanted else None


def _logit_bias(data: dict) -> dict[int, float] | None:
    """OpenAI's `logit_bias`: token ids (as JSON keys, strings) -> numbers from -100 to 100; None where none is set."""
    bias = _typed(data, "logit_bias", dict, None)
    if not bias:
        return None
    if len(bias) > MAX_BIASED:  # before each entry is read: 600,000 of them took 0.4 s of the event loop
        raise APIError(400, f"'logit_bias' may name at most {MAX_BIASED} tokens, not {len(bias)}.", "logit_bias")
    out = {}
    for key, value in bias.items():
        token = key.strip() if isinstance(key, str) else ""
        if not token.isdigit() or not token.isascii():
            raise APIError(400, f"'logit_bias' keys must be token ids (0 or more), not {key!r}.", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= MAX_BIAS:
            raise APIError(400, f"'logit_bias' values must be numbers from -{MAX_BIAS:g} to {MAX_BIAS:g}, not {value!r} "
                                f"(token {token}).", "logit_bias")
        out[int(token)] = float(value)
    return out


def _top_in_range(top: int | None, name: str) -> None:
    if top is not None and not 0 <= top <= MAX_TOP:
        raise APIError(400, f"'{name}' must be between 0 and {MAX_TOP}, not {top}.", name)


def _penalize_prompt(data: dict, fields: dict) -> bool:
    """Whether the penalties read the prompt: not where presence / frequency penalties are asked without a window,
    as OpenAI (and vLLM) count them over the answer's own tokens; a repetition penalty alone reads the whole text, as
    transformers and vLLM; `repeat_last_n` sent means llama.cpp's rule, the last n tokens of the whole text."""
    answer_only = fields["presence_penalty"] != 0 or fields["frequency_penalty"] != 0
    return "repeat_last_n" in data or not answer_only


def sampling(data: dict, context_limit: int, default_max_tokens: int | None = None) -> SamplingParams:
    """OpenAI sampling fields (plus top_k, min_p, repetition_penalty, repeat_last_n) -> SamplingParams."""
    max_tokens = _max_tokens(data, context_limit, default_max_tokens)
    stop = _stop(data)
    top_k = _number(data, "top_k", int, 0)
    if not -1 <= top_k <= MAX_INT32:
        raise APIError(400, f"'top_k' must be between -1 (off) and {MAX_INT32}, not {top_k}.", "top_k")
    repeat_last_n = _number(data, "repeat_last_n", int, -1)
    if not -1 <= repeat_last_n <= MAX_INT32:
        raise APIError(400, f"'repeat_last_n' must be between -1 (the whole text) and {MAX_INT32}, not "
                            f"{repeat_last_n}.", "repeat_last_n")
    seed = _number(data, "seed", int, None)
    if seed is not None:
        try:
            seed = user_seed(seed)  # the CLI's --seed reads the same
        except ValueError:
            raise APIError(400, f"'seed' must be a 64-bit integer, not {seed}.", "seed") from None
    fields = dict(
        temperature=_ranged(data, "temperature", 1.0, 0.0, 2.0),
        top_p=_ranged(data, "top_p", 1.0, 0.0, 1.0),
        min_p=_ranged(data, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=_ranged(data, "repetition_penalty", 1.0, 0.01, 10.0),
        presence_penalty=_ranged(data, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_ranged(data, "frequency_penalty", 0.0, -2.0, 2.0),
        repeat_last_n=repeat_last_n,  # llama.cpp's and Ollama's name: the penalties read the last n tokens
        top_k=0 if top_k == -1 else top_k,  # vLLM spells "off" as -1
        seed=seed,
        max_tokens=max_tokens,
        stop=stop,
    )
    fields["thinking"] = _thinking(data)
    fields["penalize_prompt"] = _penalize_prompt(data, fields)
    if fields["top_p"] == 0:
        fields["top_p"], fields["temperature"] = 1.0, 0.0  # "only the most likely token"
    if fields["min_p"] == 1:
        fields["min_p"], fields["temperature"] = 0.0, 0.0  # tokens at least as likely as the top one: the top one
    try:
        return SamplingParams(**fields)
    except ParleyError as exc:
        raise APIError(400, str(exc)) from None


def _max_tokens(data: dict, context_limit: int, default: int | None) -> int:
    """`max_completion_tokens` (OpenAI's current name) before `max_tokens`; an error names the one sent."""
    name = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(data, name, int, None)
    if max_tokens is None:  # as OpenAI: chat up to the context (the engine stops when it is full), completions 16
        return min(default or context_limit, context_limit)
    if not 1 <= max_tokens <= context_limit:
        raise APIError(400, f"'{name}' must be between 1 and this model's context of {context_limit} tokens, "
                            f"not {max_tokens}.", name)
    return max_tokens


def _stop(data: dict) -> list[str]:
    """The stop strings; empty ones are dropped, as llama.cpp's server drops them (they would end every answer at
    once)."""
    stop = data.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) for s in stop):
        raise APIError(400, f"'stop' must be a string or an array of at most {MAX_STOP_STRINGS} strings.", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise APIError(400, f"A stop string may hold at most {MAX_STOP_CHARS} characters.", "stop")
    return [s for s in stop if s]


def _thinking(data: dict) -> bool | None:
    """`chat_template_kwargs: {"enable_thinking": false}` (as vLLM and llama.cpp's server take it): whether a thinking
    model (Qwen3, SmolLM3) thinks first; `thinking`, Granite's name for it (as vLLM's Granite docs send it), is the same
    switch. Other template variables are refused rather than silently dropped."""
    kwargs = _typed(data, "chat_template_kwargs", dict, {})
    unknown = sorted(set(kwargs) - {"enable_thinking", "thinking"})
    if unknown:
        raise APIError(400, "'chat_template_kwargs' takes only 'enable_thinking' (or Granite's 'thinking'), not "
                            f"{', '.join(map(repr, unknown))}.", "chat_template_kwargs")
    switches = {_typed(kwargs, name, bool, None) for name in ("enable_thinking", "thinking")} - {None}
    if len(switches) > 1:
        raise APIError(400, "'enable_thinking' and 'thinking' are one switch: send one, or both alike.",
                       "chat_template_kwargs")
    effort = _effort(data)
    if switches and effort is not None and effort not in switches:
        raise APIError(400, "'reasoning_effort' and 'chat_template_kwargs' ask for different thinking.",
                       "reasoning_effort")
    return switches.pop() if switches else effort


def _effort(data: dict) -> bool | None:
    """OpenAI's `reasoning_effort` as the thinking switch, which gpt-oss's template reads as its effort (off "low", on
    "high", unset its "medium"): less than medium is off, high on."""
    effort = _typed(data, "reasoning_effort", str, None)
    if effort is not None and effort not in REASONING_EFFORTS:
        raise APIError(400, f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}, not {effort!r}.",
                       "reasoning_effort")
    return REASONING_EFFORTS.get(effort)


NOTHING = (None, False, [], {}, 0)  # values of an unsupported field that ask for nothing
# where (field, chat) differs: an empty `suffix` asks for none, `best_of` 1 for the one answer
_ABSENT = {("suffix", False): (*NOTHING, ""), ("best_of", False): (*NOTHING, 1), ("best_of", True): (*NOTHING, 1)}


def _asks_nothing(value, absent: tuple) -> bool:
    """`value` is one of `absent`, where false is not 0 (Python's `0 == False` would let a logprobs of 0 by)."""
    return any(isinstance(value, bool) == isinstance(a, bool) and value == a for a in absent)


def _reject_unsupported(data: dict, chat: bool) -> None:
    for name in ("functions",) + (("echo", "best_of", "suffix") if chat else ("tools",)):
        if not _asks_nothing(data.get(name), _ABSENT.get((name, chat), NOTHING)):
            raise APIError(400, f"'{name}' is not supported by this server{'' if chat else ' for completions'}.", name)
    if data.get("function_call") not in (None, "none", "auto"):  # the old form of `tools`: none are taken that way
        raise APIError(400, "'function_call' can only be 'none' or 'auto': send 'tools' and 'tool_choice'.",
                       "function_call")
    if not chat and data.get("tool_choice") not in (None, "none", "auto"):
        raise APIError(400, "'tool_choice' is a chat field.", "tool_choice")


def _typed(data: dict, name: str, kind: type, default):
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        what = {bool: "a boolean", dict: "an object"}.get(kind, kind.__name__)
        raise APIError(400, f"'{name}' must be {what}, not {type(value).__name__}.", name)
    return value


def _number(data: dict, name: str, kind: type, default):
    value = data.get(name)
    if value is None:
        return default
    try:
        real = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an integer of 309 digits or more, which no float holds: it was a 500
        raise APIError(400, f"'{name}' is out of range (an integer of {len(str(abs(value)))} digits).", name) from None
    if not real or (kind is int and value != int(value)):  # NaN and 1e400 (inf) are not numbers here
        raise APIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}, not {value!r}.", name)
    return kind(value)


def _ranged(data: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = _number(data, name, float, default)
    if not lo <= value <= hi:  # the value as sent: `:g` wrote 2.0000001 as "2", an allowed value
        raise APIError(400, f"'{name}' must be between {lo:g} and {hi:g}, not {data[name]!r}.", name)
    return value


# -- responses
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(stats: list, prompts: int = 1) -> dict:
    """One request's counts over its answers' turn stats, prompt by prompt: each prompt once (its answers share it),
    every answer."""
    prompt = sum(s.prompt_tokens for s in stats[::len(stats) // prompts])
    completion = sum(s.completion_tokens for s in stats)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(reason: str) -> str:
    return FINISH_REASONS.get(reason, "stop")


class ReasoningSplit:
    """An answer's text as DeepSeek's API and llama.cpp's server send a reasoning model's: the thought it starts with
    (`<think>…</think>`, `[THINK]…[/THINK]`) in `reasoning_content`, the reply in `content` (without the
    `<response>…</response>` Granite wraps it in after a thought, as llama.cpp's server sends it). Fed as it streams: a
    tag split across pieces is held until it is whole. `prefix`: the answer a request continues (its thought may be
    open)."""

    def __init__(self, prefix: str = "") -> None:
        # state: start, thought, after (the thought's close tag), response (inside Granite's tags), reply
        self._held, self._state, self._close = "", "start", ""
        self._fresh = True  # no thought text yet: whitespace after the opening tag is dropped
        if prefix:
            self.feed(prefix)
            self._held = ""  # the client's own text: only what follows it is sent

    def feed(self, text: str) -> dict[str, str]:
        """The delta for `text`: its `reasoning_content` and `content`, each only where it has some."""
        self._held += text
        if self._state == "start" and not self._read_start():
            return {}
        thought = self._read_thought() if self._state == "thought" else ""
        if self._state == "after":
            self._read_after()
        reply = self._read_response() if self._state == "response" else ""
        if self._state == "reply":
            reply, self._held = reply + self._held, ""
        return {k: v for k, v in (("reasoning_content", thought), ("content", reply)) if v}

    def finish(self) -> dict[str, str]:
        """What is held at the end: a thought's partial close tag is its text, a lone partial opening tag the reply,
        a response's closing tag nothing."""
        held, self._held = self._held, ""
        if self._state == "response" and held.strip() == RESPONSE_TAGS[1]:
            return {}
        key = {"thought": "reasoning_content", "start": "content", "after": "content", "response": "content",
               "reply": "content"}.get(self._state)
        return {key: held} if key and held else {}

    def _read_start(self) -> bool:
        """Whether the answer's start is known: a thought opens (its tag read) or the reply begins."""
        head = self._held.lstrip()
        tag = next(((o, c) for o, c in THOUGHT_TAGS if head.startswith(o)), None)
        if tag is not None:
            self._held, self._state, self._close = head[len(tag[0]):], "thought", tag[1]
            return True
        if not head or any(o.startswith(head) for o, _ in THOUGHT_TAGS):
            return False  # may still open a thought
        self._state = "reply"
        return True

    def _read_after(self) -> None:
        """After the thought: Granite's `<response>` opens the reply's wrapper, other text is the reply."""
        head = self._held.lstrip()
        if head.startswith(RESPONSE_TAGS[0]):
            self._held, self._state, self._fresh = head[len(RESPONSE_TAGS[0]):], "response", True
        elif head and not RESPONSE_TAGS[0].startswith(head):
            self._held, self._state = head, "reply"
        else:
            self._held = head  # nothing yet, or maybe the start of `<response>`

    def _read_response(self) -> str:
        """The reply inside `<response>…</response>`: what may be its closing tag (with the whitespace around it) is
        held; a closing tag with text after it is the reply's own (only the last one, at the end, is dropped)."""
        if self._fresh:
            self._held = self._held.lstrip()
            self._fresh = not self._held
        close, reply = RESPONSE_TAGS[1], ""
        while (at := self._held.find(close)) >= 0 and self._held[at + len(close):].strip():
            reply, self._held = reply + self._held[:at + len(close)], self._held[at + len(close):]
        if at < 0:
            at = len(self._held) - partial_suffix(self._held, (close,))
        at = len(self._held[:at].rstrip())
        reply, self._held = reply + self._held[:at], self._held[at:]
        return reply

    def _read_thought(self) -> str:
        if self._fresh:
            self._held = self._held.lstrip()
            self._fresh = not self._held
        at = self._held.find(self._close)
        if at >= 0:
            thought, self._held, self._state = self._held[:at], self._held[at + len(self._close):], "after"
            return thought
        keep = partial_suffix(self._held, (self._close,))
        thought, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        return thought


def split_answer(text: str, prefix: str = "") -> dict[str, str]:
    """A whole answer's `reasoning_content` (where it has a thought) and `content`."""
    split = ReasoningSplit(prefix)
    parts = [split.feed(text), split.finish()]
    out = {"content": "".join(p.get("content", "") for p in parts)}
    thought = "".join(p.get("reasoning_content", "") for p in parts)  # as the streamed deltas join
    return {**out, "reasoning_content": thought} if thought else out  # an empty thought (thinking off) is none


def chat_response(rid: str, model: str, answers: list[tuple[str, str]], stats: list, created: int,
                  prefix: str = "", logprobs: list[list] | None = None, tools: ToolRequest | None = None) -> dict:
    """`answers`: each choice's (text, reason); `prefix`: the answer the request continued (a text is what came
    after it); `logprobs`: each choice's entries, where the request asked for them; `tools`: the calls are read out
    of each answer's content (the content around them stays)."""
    choices = []
    for i, (text, reason) in enumerate(answers):
        message = {"role": "assistant", **split_answer(text, prefix)}
        if tools is not None:  # an answer cut short keeps the call under way as written, as its stream sends it
            message["content"], calls = tools.read(message["content"])
            if calls:
                message["content"] = message["content"] or None
                message["tool_calls"] = call_dicts(calls, [new_id("call") for _ in calls])
                reason = "tool_calls" if reason in ENDED else reason
        choices.append({"index": i, "message": message,
                        "logprobs": None if logprobs is None else chat_logprobs(logprobs[i]),
                        "finish_reason": finish_reason(reason)})
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage(stats)}


def chat_chunk(rid: str, model: str, req: TurnRequest, delta: dict, reason: str | None = None, stats=None,
               index: int = 0) -> dict:
    """Choice `index`'s delta; with `stats` (every choice's) the closing usage chunk, which has no choices."""
    choices = [] if stats is not None else [
        {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason and finish_reason(reason)}]
    return _chunk({"id": rid, "object": "chat.completion.chunk", "created": req.created, "model": model,
                   "choices": choices}, req, stats)


def completion_response(rid: str, model: str, answers: list[tuple[str, str]], stats: list, created: int,
                        logprobs: list[list] | None = None, echoes: list[str] | None = None, prompts: int = 1,
                        unwritten: list[int] | None = None) -> dict:
    """`answers`: prompt by prompt, `n` each; `stats`: every answer made (best_of counts them all, as OpenAI bills
    them); `echoes`: each answer's prompt, before its text; `unwritten`: each answer's leading entries its echo does
    not write (a text prompt's BOS)."""
    choices = [{"index": i, "text": (echoes[i] if echoes else "") + text,
                "logprobs": None if logprobs is None else completion_logprobs(logprobs[i], 0,
                                                                              unwritten[i] if unwritten else 0),
                "finish_reason": finish_reason(reason)} for i, (text, reason) in enumerate(answers)]
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": usage(stats, prompts)}


def completion_chunk(rid: str, model: str, req: TurnRequest, text: str, reason: str | None = None,
                     stats=None, index: int = 0) -> dict:
    choices = [] if stats is not None else [
        {"index": index, "text": text, "logprobs": None, "finish_reason": reason and finish_reason(reason)}]
    return _chunk({"id": rid, "object": "text_completion", "created": req.created, "model": model,
                   "choices": choices}, req, stats)


def _chunk(chunk: dict, req: TurnRequest, stats) -> dict:
    """With include_usage every chunk carries "usage": null but the last, which carries the counts (as OpenAI)."""
    if stats is not None:
        chunk["usage"] = usage(stats, req.prompt_count)
    elif req.include_usage:
        chunk["usage"] = None
    return chunk
