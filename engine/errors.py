"""Errors whose message is written for the user, not for a traceback."""


class ParleyError(Exception):
    """Base of every error Parley reports to the user as one clear sentence."""

    code: str | None = None  # what an API client can branch on (OpenAI's error codes where one fits)

    def __str__(self) -> str:
        return readable(super().__str__())


def readable(text: str) -> str:
    """`text` with a file name's undecodable bytes (Python's surrogate escapes of a name not in the locale's encoding)
    read as UTF-8, or shown as U+FFFD: a terminal printed them as '\\udcff', Qt dropped them from the name shown, and
    UTF-8 cannot encode them at all (a JSON body)."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate that escapes no byte
        return text.encode("utf-8", "replace").decode("utf-8")


class ModelLoadError(ParleyError):
    """A model file or folder that cannot be read: missing, truncated, corrupt or incomplete."""


class LoadStopped(ParleyError):
    """A model's load given up because the engine is closing (the app quit mid-load)."""


class UnsupportedModelError(ModelLoadError):
    """A readable model that Parley cannot run: unknown architecture or tensor type."""


class TokenizerError(ParleyError):
    """A tokenizer that cannot be built from the model's metadata."""


class TemplateError(ParleyError):
    """A chat template that fails to render or tries to leave its sandbox."""


class ContextOverflowError(ParleyError):
    """A prompt or conversation longer than the context a session may use."""

    code = "context_length_exceeded"


class CacheConfigError(ParleyError):
    """A KV cache configuration that could run out of room mid-step."""


class CacheMemoryError(ParleyError):
    """A conversation whose KV cache would need more memory than the machine (or the GPU) has free."""

    code = "insufficient_memory"


class CacheError(ParleyError):
    """A cache operation that would break a sequence: unknown sequence, rewind below a ring floor, full cache."""
