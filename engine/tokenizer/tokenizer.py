"""The Tokenizer: text <-> ids, chat prompts and streaming text, over a TokenizerBackend."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.errors import TemplateError, TokenizerError
from engine.tokenizer.backend import TokenizerBackend
from engine.tokenizer.chat_template import ChatTemplate
from engine.tokenizer.detokenizer import IncrementalDetokenizer
from engine.tokenizer.harmony import TAGS as HARMONY_TAGS, answer_markup, is_harmony, without_thought
from engine.tokenizer.hf_backend import HFBackend
from engine.tokenizer.sentencepiece_backend import MODEL_FILE as SENTENCEPIECE_FILE, SentencePieceBackend

INFO_FILE = "parley_tokenizer.json"
INFO_VERSION = 2  # 2: the dummy prefix is the SentencePiece backend's alone (no space_prefix here)
SURROGATES = re.compile("[\ud800-\udfff]")  # lone surrogates (pasted invalid UTF-8): `tokenizers` refuses them
PLACEHOLDERS = range(0xF0000, 0xFFFFE)  # private-use characters that stand in for control text typed in messages
# a reasoning model's thought tags stay in streamed text even where the vocabulary types them control (Magistral's
# [THINK]): the app folds the thought they enclose, which would otherwise read as the reply
# (open, close): Qwen3, DeepSeek-R1, QwQ, GLM, SmolLM3 and most others; Magistral; Seed-OSS
THOUGHT_TAGS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"), ("<seed:think>", "</seed:think>"))
SHOWN_CONTROL = tuple(tag for pair in THOUGHT_TAGS for tag in pair)
# tool-call markers some vocabularies type control (Hermes 3's <tool_call>, Mistral's, Llama 3's, Granite's,
# DeepSeek's, GLM's): kept in decoded text too, else a call reads as plain JSON content (engine/tool_calls.py)
TOOL_CALL_MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>",
                     "<|tool_call|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                     "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
THOUGHT_OPEN, THOUGHT_CLOSE = SHOWN_CONTROL[0::2], SHOWN_CONTROL[1::2]
OPENED_TAIL_IDS = 8  # a generation prompt's last ids hold its opening thought tag and the whitespace after it


@dataclass(slots=True)
class TokenizerInfo:
    """What a backend does not record: special ids, flags and the chat template."""

    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    stop_ids: frozenset[int]
    chat_template: str
    bos_token: str = ""
    eos_token: str = ""
    fim_ids: tuple[int, ...] = ()  # a GGUF's fill-in-the-middle markers (prefix, suffix[, middle]); () where none
    version: int = field(default=INFO_VERSION)

    def __post_init__(self) -> None:
        if self.vocab_size <= 0:
            raise TokenizerError(f"A tokenizer needs a positive vocabulary size, not {self.vocab_size}.")
        if self.add_bos and self.bos_id is None:
            raise TokenizerError("The tokenizer asks for a beginning-of-sequence token but defines none.")
        self.stop_ids = frozenset(self.stop_ids)

    def to_json(self) -> str:
        data = asdict(self)
        data["stop_ids"] = sorted(self.stop_ids)
        return json.dumps(data, ensure_ascii=False, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "TokenizerInfo":
        data = json.loads(text)
        if data.get("version") != INFO_VERSION:
            raise TokenizerError(f"Saved tokenizer has format version {data.get('version')}, expected {INFO_VERSION}.")
        data["stop_ids"] = frozenset(data["stop_ids"])
        data["fim_ids"] = tuple(data.get("fim_ids", ()))
        return cls(**data)


class Tokenizer:
    """Encodes and decodes text for one model and renders its chat prompts.

    Special tokens written in text (e.g. "<start_of_turn>") encode to their single ids.
    Built by `tokenizer_from_gguf` or `tokenizer_from_hf_dir`; `save`/`load` cache a built one.
    """

    def __init__(self, backend: TokenizerBackend, info: TokenizerInfo) -> None:
        self._backend = backend
        self._info = info
        self.vocab_size = info.vocab_size
        self.bos_id = info.bos_id
        self.eos_id = info.eos_id
        self.add_bos = info.add_bos
        self.stop_ids = info.stop_ids
        self.fim_ids = info.fim_ids
        self.chat_template = ChatTemplate(info.chat_template, info.bos_token, info.eos_token)
        self.harmony = is_harmony(backend.token_to_id)  # gpt-oss: answers on channels (engine/tokenizer/harmony.py)
        kept = (*SHOWN_CONTROL, *TOOL_CALL_MARKERS, *(HARMONY_TAGS if self.harmony else ()))
        shown = {backend.token_to_id(text) for text in kept} - {None}
        self._shown = frozenset(shown & backend.special_ids)  # control tags that skip_special keeps
        self._own_tags = frozenset(t for t in kept if backend.token_to_id(t) in self._shown)  # their texts

    @property
    def backend(self) -> TokenizerBackend:
        """The backend: `HFBackend` (its `.hf` is the `tokenizers.Tokenizer`) or `SentencePieceBackend`."""
        return self._backend

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids for `text`; `add_bos=None` follows the model's default."""
        ids = self._backend.encode(SURROGATES.sub("\ufffd", text))
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            return [self.bos_id, *ids]
        return ids

    @property
    def max_token_chars(self) -> int:
        """The most characters one token can stand for (its stored form is at least as long as its text):
        text of n characters needs at least n / max_token_chars tokens, known without tokenising it."""
        return self._backend.max_token_chars

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """Text for `ids`; with `skip_special`, control tokens such as <bos> are left out (thought tags stay)."""
        ids = list(ids)
        if skip_special and not self._shown.isdisjoint(ids):
            special = self._backend.special_ids
            return self._backend.decode([i for i in ids if i in self._shown or i not in special], False)
        return self._backend.decode(ids, skip_special)

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry written as stored (e.g. "▁Hello", "<eos>"), or None."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry for an id as stored, or None when out of range."""
        return self._backend.id_to_token(token_id)

    def detokenizer(self, skip_special: bool = True, context: list[int] | tuple[int, ...] = ()) -> IncrementalDetokenizer:
        """A fresh streaming decoder for one answer (`context`: ids it continues, not emitted again)."""
        return IncrementalDetokenizer(self.decode, skip_special, context)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                            continue_final: bool = False, thinking: bool | None = None,
                            tools: tuple[dict, ...] | list[dict] | None = None) -> list[int]:
        """Renders the conversation with the chat template and encodes it, with one bos at most.

        `continue_final` leaves the last message open: the text ends right after its content, with no
        end-of-turn marker, so generation carries on with that message. `thinking` sets the template's
        `enable_thinking` (Qwen3 and SmolLM3 read it; other templates ignore it) and `thinking` (Granite's, as llama.cpp
        passes it), Seed-OSS's `thinking_budget` (0 when off) and harmony's `reasoning_effort` (gpt-oss always reasons:
        off is "low", on "high"); None leaves the template's default. `tools`: OpenAI's tool objects, as the template's
        `tools` (transformers passes them so).
        """
        if self.harmony:  # its template keeps earlier answers' replies only (an answer to continue keeps its thought)
            kept = len(messages) - 1 if continue_final else len(messages)
            messages = [{**m, "content": without_thought(m["content"])} if i < kept and m.get("role") == "assistant"
                        and isinstance(m.get("content"), str) else m for i, m in enumerate(messages)]
        messages, typed = self._defuse(messages)
        extra = thinking_variables(thinking, self.harmony)
        if tools:
            extra["tools"] = [dict(t) for t in tools]
        if continue_final:
            text = self._open_answer(messages, extra)
        else:
            text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **extra)
        bos = self.chat_template.bos_token
        writes_bos = bool(bos) and text.startswith(bos)
        add_bos = False if writes_bos else None
        return self._encode_with_literals(text, typed, add_bos) if typed else self.encode(text, add_bos=add_bos)

    def thinking_switch(self) -> bool:
        """Whether the chat template reads the thinking switch: a prompt rendered with it on and with it off differ
        (not for Gemma's or Llama's, nor a DeepSeek-R1 distill's, which always thinks)."""
        return reads_thinking(self.chat_template, self.harmony)

    def opened_thought(self, prompt_ids: list[int]) -> str:
        """The thought tag a chat prompt ends with, and the whitespace after it (DeepSeek-R1's distills, QwQ and Qwen3's
        thinking-only models open the answer's `<think>` in their generation prompt); "" where it opens none."""
        tail = self.decode(list(prompt_ids[-OPENED_TAIL_IDS:]), skip_special=True)  # Seed-OSS's budget note after it
        body = tail.rstrip()
        return next((tag + tail[len(body):] for tag in THOUGHT_OPEN if body.endswith(tag)), "")

    def _open_answer(self, messages: list[dict[str, str]], extra: dict) -> str:
        """The conversation cut after the last answer's text; where the template does not show that text (DeepSeek-R1's
        and QwQ's drop an answer's thought), the answer after a generation prompt, as a prefill."""
        if self.harmony and len(messages) >= 2:  # the answer's channels, as the model wrote them
            prompt = self.chat_template.render(messages[:-1], add_generation_prompt=True, **extra)
            return prompt + answer_markup(messages[-1]["content"])
        if len(messages) >= 2 and not any(close in messages[-1]["content"] for close in THOUGHT_CLOSE):
            # cut while thinking: a template renders an unclosed thought as a reply (Qwen3's puts an empty thought
            # before it, DeepSeek-R1's drops the `<think>` its generation prompt opened), so it goes on from that prompt
            prompt = self.chat_template.render(messages[:-1], add_generation_prompt=True, **extra)
            if messages[-1]["content"].lstrip().startswith(THOUGHT_OPEN) or prompt.rstrip().endswith(THOUGHT_OPEN):
                return _joined(prompt, messages[-1]["content"])
        try:
            return _open_final_message(self.chat_template.render(messages, add_generation_prompt=False, **extra),
                                       messages)
        except TemplateError:
            if len(messages) < 2:
                raise
            prompt = self.chat_template.render(messages[:-1], add_generation_prompt=True, **extra)
            return _joined(prompt, messages[-1]["content"])

    def _defuse(self, messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, str]]:
        """Messages whose typed control-token text ("<start_of_turn>") is swapped for placeholders, so that only the
        template's own markers become control ids (no role spoofing); returns placeholder -> the text it hides."""
        pattern = self._backend.special_pattern
        if pattern is None or not any(pattern.search(m.get("content") or "") for m in messages):
            return messages, {}
        everything = "".join(m.get("content") or "" for m in messages)
        free = (chr(c) for c in PLACEHOLDERS if chr(c) not in everything)
        typed: dict[str, str] = {}  # text -> placeholder while building
        def swap(match: re.Match) -> str:
            return typed.setdefault(match.group(0), next(free))
        def keep_own(match: re.Match) -> str:  # an answer's thought tags and call markers are the model's own tokens
            return match.group(0) if match.group(0) in self._own_tags else swap(match)
        out = [dict(m, content=pattern.sub(keep_own if m.get("role") == "assistant" else swap, m["content"]))
               if m.get("content") else dict(m) for m in messages]
        return out, {mark: text for text, mark in typed.items()}

    def _encode_with_literals(self, text: str, typed: dict[str, str], add_bos: bool | None) -> list[int]:
        """Encodes `text`, each placeholder as the plain-text tokens of the control text it stands for."""
        ids: list[int] = []
        for i, part in enumerate(re.split(f"([{''.join(typed)}])", text)):
            if part in typed:
                ids += self._backend.encode(typed[part], literal=True, start=i == 0)
            elif part:
                ids += self._backend.encode(SURROGATES.sub("\ufffd", part), start=i == 0)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            return [self.bos_id, *ids]
        return ids

    def save(self, directory: Path) -> None:
        """Writes the backend's files and parley_tokenizer.json so `load` skips rebuilding."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in SentencePieceBackend.FILES:  # `load` picks the backend by these: none may be left from before
            (directory / name).unlink(missing_ok=True)
        self._backend.save(directory)
        (directory / INFO_FILE).write_text(self._info.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> "Tokenizer":
        """Loads a tokenizer written by `save`."""
        directory = Path(directory)
        try:
            kind = SentencePieceBackend if (directory / SENTENCEPIECE_FILE).is_file() else HFBackend
            backend = kind.load(directory)
            info = TokenizerInfo.from_json((directory / INFO_FILE).read_text(encoding="utf-8"))
        except TokenizerError:
            raise
        except Exception as exc:  # missing, truncated or foreign files all mean "rebuild"
            raise TokenizerError(f"No usable saved tokenizer in {directory}: {exc}") from exc
        return cls(backend, info)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


def _open_final_message(text: str, messages: list[dict[str, str]]) -> str:
    """Cuts a rendered conversation right after the last message's content (templates may trim it)."""
    content = messages[-1]["content"] if messages else ""
    for needle in (content, content.strip()):
        at = text.rfind(needle) if needle else -1
        if at >= 0:
            return text[: at + len(needle)]
    raise TemplateError("The chat template does not show the last message's text, so it cannot be continued.")


JOIN_CHARS = 64  # a generation prompt's opening tags are short


def _joined(prompt: str, answer: str) -> str:
    """`answer` after `prompt`, sharing the text the prompt ends with and the answer starts with (a generation prompt
    that opens "<think>\n" and an answer that holds it)."""
    for n in range(min(len(prompt), len(answer), JOIN_CHARS), 0, -1):
        if prompt.endswith(answer[:n]):
            return prompt + answer[n:]
    return prompt + answer


def thinking_variables(thinking: bool | None, harmony: bool) -> dict[str, object]:
    """The template variables the Thinking setting sets (see Tokenizer.apply_chat_template); none for None."""
    if thinking is None:
        return {}
    extra: dict[str, object] = {"enable_thinking": thinking, "thinking": thinking}  # Granite: `thinking`
    if thinking is False:
        extra["thinking_budget"] = 0  # Seed-OSS's switch: a budget of 0 answers at once (unset: unlimited)
    if harmony:
        extra["reasoning_effort"] = "high" if thinking else "low"
    return extra


def reads_thinking(template: ChatTemplate, harmony: bool) -> bool:
    """Whether a chat template renders a prompt with thinking on and with it off differently."""
    probe = [{"role": "user", "content": "Hi"}]
    try:
        return template.render(probe, **thinking_variables(True, harmony)) != template.render(
            probe, **thinking_variables(False, harmony))
    except TemplateError:  # a template that will not render a lone user message: its turns say why
        return True
