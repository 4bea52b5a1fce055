"""Chat templates: Jinja sources rendered in a sandbox, plus the built-in Gemma and plain formats."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import TemplateError

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
        """Renders the conversation; `extra` adds or overrides template variables (e.g. tools)."""
        variables = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
        }
        try:
            return self._template.render(**variables)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"The chat template tried an unsafe operation and was stopped: {exc}") from exc
        except Exception as exc:  # any Jinja or Python error inside a template is the template's fault
            raise TemplateError(f"The chat template failed to render: {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars)"


def gemma_chat_template() -> ChatTemplate:
    """The Gemma 3 turn format, for Gemma GGUFs that carry no template."""
    return ChatTemplate(GEMMA_TEMPLATE, bos_token="<bos>", eos_token="<eos>")


def plain_chat_template(bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    """A "User: …\\nAssistant:" format for models without any template (e.g. base models)."""
    return ChatTemplate(PLAIN_TEMPLATE, bos_token=bos_token, eos_token=eos_token)


def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    # Jinja's own tojson escapes HTML characters, which templates written for chat do not expect.
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except Exception as exc:
        raise TemplateError(f"The chat template is not valid Jinja: {exc}") from exc


def _raise_exception(message: str) -> None:
    raise TemplateError(f"The chat template refused the conversation: {message}")


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)
