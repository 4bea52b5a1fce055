"""Chat templates: Jinja sources rendered in a sandbox, plus the built-in Gemma and plain formats."""
from __future__ import annotations

import functools
import json
import math
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import Namespace

from engine.errors import TemplateError

# A template comes with the model file: it must not hang or exhaust memory however it is written
# (nested range(100000), 'a' * 4000000000, 9 ** 99999999). Every render gets a budget of time, loop items
# and text; operators, calls and filters that could exceed it are checked before they run.
RENDER_SECONDS = 10.0
RANGE_ITEMS = 2_000_000  # range() items per render, all loops together
MIN_TEXT_CHARS = 1 << 20  # a render may produce this much text, or 4x its messages' text if more
MAX_INT_ARG = 1 << 20  # widths, counts and repeats passed to calls and filters
MAX_INT_BITS = 1 << 16
MAX_STRFTIME_CHARS = 256
WIDE_FORMAT = re.compile(r"[%{][^%{}]*?\d{6,}")  # "%99999999d", "{:>9999999}"

# Gemma 3 GGUFs carry no template; this mirrors the format of Gemma 3's own template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set ns.system = messages[0]['content'] | trim ~ '\n\n' %}"
    "{% set messages = messages[1:] %}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if role not in ('user', 'model') %}"
    "{{ raise_exception('Gemma only knows the roles system, user and assistant, not ' ~ message['role']) }}"
    "{% endif %}"
    "{% set content = message['content'] | trim %}"
    "{% if loop.first and role == 'user' %}{% set content = ns.system ~ content %}{% endif %}"
    "<start_of_turn>{{ role }}\n{{ content }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# For models that ship no template at all: readable by any base model, no special tokens.
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class ChatTemplate:
    """A Jinja chat template compiled once in an immutable sandbox.

    `render` turns a list of {"role", "content"} messages into prompt text. Every failure,
    including a template trying to leave the sandbox, raises TemplateError.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(source)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True, **extra: Any) -> str:
        """Renders the conversation; `extra` adds or overrides template variables (e.g. tools). A template without a
        system role (Gemma 2's refuses one, others drop it) gets the system prompt at the head of the first user
        message, as llama.cpp and Ollama give it. A template that refuses two messages of one role in a row (Gemma,
        Mistral: roles must alternate) gets them joined, as after an answer that failed or a client's two user
        messages."""
        try:
            return self._render_with_system(messages, add_generation_prompt, extra)
        except TemplateRefusal:
            joined = _same_roles_joined(messages)
            if joined is None:
                raise
            return self._render_with_system(joined, add_generation_prompt, extra)

    def _render_with_system(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                            extra: dict[str, Any]) -> str:
        merged = _system_in_first_user(messages)
        if merged is None:
            return self._render(messages, add_generation_prompt, extra)
        try:
            text = self._render(messages, add_generation_prompt, extra)
        except TemplateRefusal:
            return self._render(merged, add_generation_prompt, extra)
        shown = str(messages[0].get("content", "")).strip() in text
        if shown or not self._ignores_system(messages, text, add_generation_prompt, extra):
            return text  # a template may rewrite the system text (SmolLM3 takes "/no_think" out of it)
        return self._render(merged, add_generation_prompt, extra)

    def _ignores_system(self, messages: list[dict[str, str]], text: str, add_generation_prompt: bool,
                        extra: dict[str, Any]) -> bool:
        """Whether the conversation renders as it does without its system message."""
        try:
            return self._render(messages[1:], add_generation_prompt, extra) == text
        except TemplateError:
            return False

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool, extra: dict[str, Any]) -> str:
        variables = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": None,  # as transformers passes them: "tools is not none" must be false without tools
            "documents": None,
            **extra,
        }
        budget = _Budget.for_messages(messages)
        token = _BUDGET.set(budget)
        try:
            return budget.collect(self._template.generate(**variables))
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"The chat template tried an unsafe operation and was stopped: {exc}") from exc
        except Exception as exc:  # any Jinja or Python error inside a template is the template's fault
            raise TemplateError(f"The chat template failed to render: {type(exc).__name__}: {exc}") from exc
        finally:
            _BUDGET.reset(token)

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars)"


class TemplateRefusal(TemplateError):
    """The template's own raise_exception(): it does not take this conversation as given."""


def _system_in_first_user(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The conversation with its leading system message folded into the first user message (left out where it is
    blank), or None where there is none to fold (no system message, or no user message right after it)."""
    if len(messages) < 2 or not all(isinstance(m, dict) for m in messages[:2]):
        return None
    system, first = messages[0], messages[1]
    if system.get("role") != "system" or first.get("role") != "user":
        return None
    if not str(system.get("content", "")).strip():
        return list(messages[1:])
    folded = {**first, "content": f"{system['content']}\n\n{first.get('content', '')}"}
    return [folded, *messages[2:]]


def _same_roles_joined(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The conversation with each run of text messages of one role made one message (blank-line separated), or None
    where no two follow each other."""
    out: list[dict[str, str]] = []
    for m in messages:
        before = out[-1] if out else None
        if before is not None and isinstance(m, dict) and isinstance(before, dict) and m.get("role") == before.get("role") \
                and isinstance(m.get("content"), str) and isinstance(before.get("content"), str):
            out[-1] = {**before, "content": f"{before['content']}\n\n{m['content']}"}
        else:
            out.append(m)
    return out if len(out) < len(messages) else None


class _GenerationTags(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` (SmolLM3's and TRL-saved templates mark an answer's text for training
    with it): the text inside, as it is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[Any]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def gemma_chat_template() -> ChatTemplate:
    """The Gemma 3 turn format, for Gemma GGUFs that carry no template."""
    return ChatTemplate(GEMMA_TEMPLATE, bos_token="<bos>", eos_token="<eos>")


def plain_chat_template(bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    """A "User: …\\nAssistant:" format for models without any template (e.g. base models)."""
    return ChatTemplate(PLAIN_TEMPLATE, bos_token=bos_token, eos_token=eos_token)


@dataclass(slots=True)
class _Budget:
    """What one render may still spend."""

    max_chars: int
    deadline: float = field(default_factory=lambda: time.monotonic() + RENDER_SECONDS)
    range_items: int = RANGE_ITEMS

    @classmethod
    def for_messages(cls, messages: list[dict[str, str]]) -> "_Budget":
        text = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        return cls(max(MIN_TEXT_CHARS, 4 * text))

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"The chat template ran for more than {RENDER_SECONDS:g} s and was stopped.")

    def check_size(self, n: int, what: str = "text") -> None:
        if n > self.max_chars:
            raise TemplateError(f"The chat template tried to build {what} of {n:,} items and was stopped.")

    def collect(self, chunks) -> str:
        out, size = [], 0
        for chunk in chunks:
            size += len(chunk)
            self.check_size(size)
            self.check_time()
            out.append(chunk)
        return "".join(out)

    def range(self, *args: int) -> range:
        """range(), its items counted when it is made: nested loops exhaust the budget, not the clock."""
        items = safe_range(*args)
        self.range_items -= len(items)
        if self.range_items < 0:
            raise TemplateError(f"The chat template looped over more than {RANGE_ITEMS:,} range() items.")
        self.check_time()
        return items


_BUDGET: ContextVar[_Budget | None] = ContextVar("parley_template_budget", default=None)


def _budget() -> _Budget:
    return _BUDGET.get() or _Budget(MIN_TEXT_CHARS)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with operators and calls that could take unbounded time or memory checked."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right, _budget())
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's own signature
        _check_args(args, kwargs)
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        if getattr(method, "__name__", "") in ("format", "format_map") and isinstance(getattr(method, "__self__", None), str):
            _check_format(method.__self__)
        result = super().call(__context, __obj, *args, **kwargs)
        _check_result(result)
        return result


class _BoundedNamespace(Namespace):
    """namespace(): the one mutable value a template has, so the one place text can grow across iterations."""

    def __setitem__(self, name: str, value: Any) -> None:
        _check_result(value)
        _budget().check_time()
        super().__setitem__(name, value)


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else None


def _check_binop(operator: str, left: Any, right: Any, budget: _Budget) -> None:
    budget.check_time()
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**" and ints and right > 0 and abs(left) > 1 and right * math.log2(abs(left)) > MAX_INT_BITS:
        raise TemplateError(f"The chat template tried to compute a {right:,}-th power and was stopped.")
    if operator == "*" and ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
        raise TemplateError("The chat template tried to compute a huge number and was stopped.")
    if operator == "*" and not ints:
        count = right if isinstance(right, int) else left if isinstance(left, int) else None
        size = _sized(left) if isinstance(right, int) else _sized(right)
        if count is not None and size is not None:
            budget.check_size(size * max(count, 0))
    if operator == "+" and _sized(left) is not None and _sized(right) is not None:
        budget.check_size(_sized(left) + _sized(right))
    if operator == "%" and isinstance(left, str):
        _check_format(left)


def _check_args(args: tuple, kwargs: dict) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT_ARG:
            raise TemplateError(f"The chat template passed {value:,} to a call and was stopped.")


def _check_format(text: str) -> None:
    if WIDE_FORMAT.search(text):
        raise TemplateError("The chat template used a format width of a million characters or more and was stopped.")


def _check_result(value: Any) -> None:
    size = _sized(value)
    if size is not None:
        _budget().check_size(size)


def _bounded_filter(name: str, fn):
    """A filter whose int arguments and result size are checked (filters bypass the sandbox's call())."""

    passes_context = getattr(fn, "jinja_pass_arg", None) is not None  # then args[0] is Jinja's, not the template's

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        given = args[1:] if passes_context else args  # (value, *arguments)
        _check_args(given[1:], kwargs)
        if name == "replace" and len(given) >= 3 and all(isinstance(a, str) for a in given[:3]) and given[1]:
            _budget().check_size(len(given[0]) + given[0].count(given[1]) * len(given[2]))
        if name == "format" and given and isinstance(given[0], str):
            _check_format(given[0])
        result = fn(*args, **kwargs)
        _check_result(result)
        return result

    return checked


def _compile(source: str) -> jinja2.Template:
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationTags]
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["range"] = lambda *args: _budget().range(*args)
    env.globals["namespace"] = _BoundedNamespace
    # Jinja's own tojson escapes HTML characters, which templates written for chat do not expect.
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
    try:
        return env.from_string(source)
    except Exception as exc:
        raise TemplateError(f"The chat template is not valid Jinja: {exc}") from exc


def _raise_exception(message: str) -> None:
    raise TemplateRefusal(f"The chat template refused the conversation: {message}")


def _strftime_now(format: str) -> str:
    if not isinstance(format, str) or len(format) > MAX_STRFTIME_CHARS:
        raise TemplateError(f"strftime_now takes a format of at most {MAX_STRFTIME_CHARS} characters.")
    return datetime.now().strftime(format)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False,
            separators: tuple[str, str] | list[str] | None = None) -> str:
    if separators is not None and not (len(separators) == 2 and all(isinstance(p, str) for p in separators)):
        raise TemplateError("tojson's separators are two strings (between items, after keys).")
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys,
                      separators=None if separators is None else tuple(separators))
