"""A turn's text as it streams: detokenised, with stop strings found and held back until they cannot match."""
from __future__ import annotations

from engine.tokenizer import Tokenizer
from engine.tokenizer.detokenizer import joined, partial_suffix
from engine.tokenizer.harmony import HarmonyText


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stop: list[str], context: list[int] | tuple[int, ...] = (),
                 opened: str = ""):
        """`opened`: a thought tag the prompt ended with (an R1 distill's `<think>\n`): the answer's text starts with
        it, as the model's thought does."""
        self.detok = tokenizer.detokenizer(skip_special=True, context=context)
        self.harmony = HarmonyText() if tokenizer.harmony else None  # gpt-oss's channels
        self.stop = [s for s in stop if s]
        self._released: list[str] = [opened] if opened else []  # joined when read: `str +=` copies it all each time
        self._unsent = opened  # released with the first piece
        self._held = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Returns the newly releasable text; sets `stopped` when a stop string completes."""
        piece = self.detok.push(token_id)
        return self._sent(self._feed(self.harmony.feed(piece) if self.harmony is not None else piece))

    def finish(self) -> str:
        piece = self.detok.flush()
        if self.harmony is not None:
            piece = self.harmony.feed(piece) + self.harmony.finish()
        out = self._feed(piece)
        if not self.stopped:
            out += self._release(self._held)
            self._held = ""
        return self._sent(out)

    def _sent(self, out: str) -> str:
        out, self._unsent = self._unsent + out, ""
        return out

    @property
    def text(self) -> str:
        """Everything released so far."""
        return joined(self._released)

    def _feed(self, piece: str) -> str:
        if self.stopped or not piece and not self._held:
            return ""
        pending = self._held + piece
        cut = min((i for i in (pending.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return self._release(pending[:cut])
        keep = partial_suffix(pending, self.stop)
        self._held = pending[len(pending) - keep :] if keep else ""
        return self._release(pending[: len(pending) - keep])

    def _release(self, text: str) -> str:
        self._released.append(text)
        return text
