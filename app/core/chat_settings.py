"""Per-chat settings (model, system prompt, sampling, overflow policy) and their mapping to the engine's types."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from engine.errors import ParleyError
from engine.sampling import SamplingParams

OVERFLOW_CHOICES = ("stop", "truncate")
THINKING_CHOICES = ((None, "The model's default"), (True, "Think before answering"), (False, "Answer without thinking"))


@dataclass(slots=True)
class ChatSettings:
    model: str = "default"  # a key of the model registry
    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.0
    repetition_penalty: float = 1.1
    repeat_last_n: int = 64  # the penalty reads the last 64 tokens, as llama.cpp / Ollama: not the chat's earlier turns
    seed: int | None = None
    max_tokens: int = 512
    overflow: str = "truncate"
    speculative: bool = True  # draft ahead where the model's drafter runs (same answer, fewer steps)
    thinking: bool | None = None  # a thinking model (Qwen3, SmolLM3) thinks first or not; None: the model's default

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not isinstance(self.system_prompt, str):
            raise TypeError("model and system_prompt must be text")
        if self.overflow not in OVERFLOW_CHOICES:
            raise ValueError(f"overflow must be one of {OVERFLOW_CHOICES}")
        self.sampling()  # validates the sampling values once, with the engine's own checks

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            repetition_penalty=self.repetition_penalty, repeat_last_n=self.repeat_last_n, seed=self.seed, max_tokens=self.max_tokens,
            speculative=self.speculative, thinking=self.thinking,
        )

    def copy(self, **changes) -> "ChatSettings":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ChatSettings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def readable(cls, data, unread: list[str] | None = None, where: str = "") -> "ChatSettings":
        """Settings from a file that may be damaged or edited by hand: a value that does not read (a wrong type, out
        of range) keeps its default and the others are kept; never raises (one bad value kept the app from opening).
        Each value left out is described in `unread` (as `where`.name), for the notice that says so."""
        settings = cls()
        for f in fields(cls) if isinstance(data, dict) else ():
            if f.name in data:
                try:
                    settings = replace(settings, **{f.name: data[f.name]})
                except (ParleyError, ValueError, TypeError) as exc:
                    if unread is not None:
                        unread.append(unread_value(f"{where}.{f.name}" if where else f.name, data[f.name], exc))
        return settings


def unread_value(name: str, value, why: Exception | str) -> str:
    """One value a settings file held that was not used, for a notice: its name, the value, what it accepts."""
    shown, reason = repr(value), str(why).removeprefix("Invalid sampling setting: ").rstrip(".")
    if len(shown) > 40:
        shown, reason = shown[:39] + "…", reason.replace(shown, shown[:39] + "…")
    if reason.endswith(f"not {shown}"):  # "temperature must be a finite number, not '0.8'" shows it already
        return f"{name} ({reason})"
    return f"{name} {shown} ({reason})"


SHOWN_SETTINGS = (  # (field, short label) for column labels like "B: Qwen3 · T 0.2"
    ("temperature", "T"), ("top_p", "top-p"), ("top_k", "top-k"), ("min_p", "min-p"),
    ("repetition_penalty", "rep"), ("repeat_last_n", "rep window"), ("seed", "seed"), ("max_tokens", "max"), ("system_prompt", "system"),
    ("thinking", "thinking"),
)


DRAW_ONLY = frozenset({"top_p", "top_k", "min_p", "seed"})  # they change nothing in a greedy column (T 0)


def differences(columns: list[ChatSettings]) -> list[list[str]]:
    """Per column, the sampling settings in which the columns differ, e.g. ["T 0.2", "seed 7"]; a greedy column is
    not labelled with settings that only change a draw ("seed random" beside T 0)."""
    out: list[list[str]] = [[] for _ in columns]
    drawn = [not s.sampling().greedy for s in columns]
    for name, label in SHOWN_SETTINGS:
        counted = [i for i in range(len(columns)) if name not in DRAW_ONLY or drawn[i]]
        values = [getattr(columns[i], name) for i in counted]
        if len(set(values)) < 2:
            continue
        for i, value in zip(counted, values):
            out[i].append(_short(label, value))
    return out


def _short(label: str, value) -> str:
    if label == "system":
        return "system: " + (" ".join(str(value).split())[:16] or "none")
    if label == "thinking":
        return {None: "thinking default", True: "thinking on", False: "thinking off"}[value]
    if value is None:
        return f"{label} random"
    if label == "rep window" and value < 0:
        return "rep window all"
    return f"{label} {value:g}" if isinstance(value, float) else f"{label} {value}"
