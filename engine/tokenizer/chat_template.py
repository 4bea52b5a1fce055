"""Chat templates: Jinja sources rendered in a sandbox, plus the built-in Gemma and plain formats."""
from __future__ import annotations

from typing import Any

import jinja2
import jinja2.ext

from engine.errors import TemplateError
from engine.tokenizer.template_sandbox import BUDGET, Budget, bounded_environment

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
        budget = Budget.for_messages(messages)
        token = BUDGET.set(budget)
        try:
            return budget.collect(self._template.generate(**variables))
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"The chat template tried an unsafe operation and was stopped: {exc}") from exc
        except Exception as exc:  # any Jinja or Python error inside a template is the template's fault
            raise TemplateError(f"The chat template failed to render: {type(exc).__name__}: {exc}") from exc
        finally:
            BUDGET.reset(token)

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


def _compile(source: str) -> jinja2.Template:
    env = bounded_environment(["jinja2.ext.loopcontrols", _GenerationTags])
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(source)
    except Exception as exc:
        raise TemplateError(f"The chat template is not valid Jinja: {exc}") from exc


def _raise_exception(message: str) -> None:
    raise TemplateRefusal(f"The chat template refused the conversation: {message}")


