"""Cache bookkeeping in plain integers: slots, lengths, ring floors and the pending step."""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from engine.errors import CacheError


@dataclass(frozen=True, slots=True)
class Segment:
    """One sequence's share of a step: query rows q_start..q_start+q_len-1 write positions start..start+q_len-1."""

    slot: int
    q_start: int
    q_len: int
    start: int  # the sequence's cache length when the step was declared
    rowwise: bool = False  # each row attends exactly as a one-token step at its position would (verify steps)


def attention_segments(segments: list[Segment]) -> list[Segment]:
    """The segments attention runs: a rowwise one as single-row segments, so that a verified draft's row computes
    bit for bit what plain decoding computes at its position (greedy speculative output equals plain output)."""
    if not any(s.rowwise for s in segments):
        return segments
    out = []
    for s in segments:
        if s.rowwise:
            out += [Segment(s.slot, s.q_start + j, 1, s.start + j) for j in range(s.q_len)]
        else:
            out.append(s)
    return out


class CacheBook:
    """Which slots are live, how long each sequence is, and how far back a rewind may go."""

    def __init__(self, max_seqs: int, max_seq_len: int, max_step_tokens: int, rings: dict[int, int]):
        self.max_seqs, self.max_seq_len, self.max_step_tokens = max_seqs, max_seq_len, max_step_tokens
        self.rings = rings  # window -> ring rows, only for windows whose ring actually wraps
        self._free = list(range(max_seqs))
        self._length: dict[int, int] = {}
        self._high: dict[int, int] = {}  # highest position ever written + 1: what a ring has overwritten
        self.pending: list[Segment] | None = None

    # -- sequences
    def seq_new(self) -> int:
        if not self._free:
            raise CacheError(f"All {self.max_seqs} cache slots are in use.")
        slot = heapq.heappop(self._free)
        self._length[slot] = self._high[slot] = 0
        return slot

    def seq_clone(self, src: int) -> int:
        self._check_live(src)
        dst = self.seq_new()
        self._length[dst], self._high[dst] = self._length[src], self._high[src]
        return dst

    def seq_rm(self, slot: int) -> None:
        self._check_live(slot)
        self._check_idle()
        del self._length[slot], self._high[slot]
        heapq.heappush(self._free, slot)

    def rewind(self, slot: int, pos: int) -> None:
        self._check_live(slot)
        self._check_idle()
        if not 0 <= pos <= self._length[slot]:
            raise CacheError(f"Cannot rewind to {pos}: the sequence holds {self._length[slot]} tokens.")
        floor = self.floor(slot)
        if pos < floor:
            raise CacheError(
                f"Cannot rewind to {pos}: the sliding-window ring has overwritten what position {pos} needs "
                f"(earliest rewind point is {floor}); re-prefill instead."
            )
        self._length[slot] = pos

    def pos(self, slot: int) -> int:
        self._check_live(slot)
        return self._length[slot]

    def floor(self, slot: int) -> int:
        """Smallest position a rewind may go back to: position p needs keys from p-window+1 intact."""
        high = self._high[slot]
        return max([0] + [high - rows + window - 1 for window, rows in self.rings.items()])

    def live_slots(self) -> list[int]:
        return sorted(self._length)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    # -- steps
    def declare(self, writes: list[tuple[int, int]], rowwise: frozenset[int] = frozenset()) -> list[Segment]:
        """Validates a step's (slot, n_tokens) writes and lays them out on the flat token axis; the slots in
        `rowwise` attend row by row (`attention_segments`)."""
        self._check_idle()
        segments, q_start, seen = [], 0, set()
        for slot, n in writes:
            self._check_live(slot)
            if slot in seen:
                raise CacheError(f"Slot {slot} appears twice in one step.")
            if not 1 <= n <= self.max_step_tokens:
                raise CacheError(f"A step writes 1..{self.max_step_tokens} tokens per sequence, not {n}.")
            if self._length[slot] + n > self.max_seq_len:
                raise CacheError(
                    f"The sequence would hold {self._length[slot] + n} tokens; its context limit is {self.max_seq_len}."
                )
            seen.add(slot)
            segments.append(Segment(slot, q_start, n, self._length[slot], slot in rowwise))
            q_start += n
        self.pending = segments
        return segments

    def commit(self) -> None:
        for s in self.pending or []:
            end = s.start + s.q_len
            self._length[s.slot] = end
            self._high[s.slot] = max(self._high[s.slot], end)
        self.pending = None

    def abort(self) -> None:
        """Forgets a failed step; what it wrote lies beyond the lengths and is never read."""
        for s in self.pending or []:
            if s.slot in self._high:
                self._high[s.slot] = max(self._high[s.slot], s.start + s.q_len)  # ring rows were overwritten
        self.pending = None

    def _check_live(self, slot: int) -> None:
        if slot not in self._length:
            raise CacheError(f"Cache slot {slot} is not in use.")

    def _check_idle(self) -> None:
        if self.pending is not None:
            raise CacheError("A step is in progress: commit or abort it first.")
