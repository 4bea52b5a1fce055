"""SamplingParams and the per-session sampler state; sampling of a whole step is batched on the device.

The order, per row: the penalties (repetition, presence, frequency) over the last `repeat_last_n` tokens of the
context, the prompt's included, as llama.cpp's command line and server count them; the temperature (below
GREEDY_BELOW the argmax instead); then top-k, top-p and min-p as one filter on that tempered softmax (top-p counts
the mass above a token within what top-k keeps, renormalised, as llama.cpp's chain and transformers' processors
apply it; min-p, relative to the first token, is the same either way); the draw among what is kept. As transformers'
processors, the temperature comes before the filters (llama.cpp's chain applies it after top-p and min-p)."""
from __future__ import annotations

import math
import secrets
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.errors import ParleyError
from engine.logprobs import MAX_TOP
from kernels.attention import triton_available
from kernels.cpu_sampling import draw_rows, penalise_rows, sample_top, top_rows

if TYPE_CHECKING:
    from engine.sampling_graphs import SamplingGraphs

# Bounds every value entering from a chat file, the server or settings is checked against: beyond them a value
# cannot mean anything useful and (top_k 1e20, seed 2**70) fails the batched step of every chat sharing it.
MAX_INT32 = 2**31 - 1
MASK64 = 2**64 - 1
MAX_TEMPERATURE = 100.0
MAX_PENALTY = 100.0  # and 1 / MAX_PENALTY the least repetition penalty: 1e-300 is 0 in fp32, and logits / 0 are inf
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000
MAX_GRAMMAR_CHARS = 1_000_000  # a schema past this is no chat's (its compile and masks grow with it)
MAX_BIAS = 100.0  # OpenAI's bound on a logit bias: -100 all but bans a token, 100 all but forces it
MAX_BIASED = 1024  # tokens one turn may bias (OpenAI allows 300)
# below it a temperature decodes greedily: logits / T overflowed fp32 from ~1e-38 (token 0, or an id past the
# vocabulary), and a draw this cold is the argmax all but always (vLLM takes the same bound)
GREEDY_BELOW = 1e-5


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 (and below GREEDY_BELOW) = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # the penalties read the last this many tokens (-1: the whole history; 0: penalties off). llama.cpp, Ollama and
    # GPT4All use 64, so a chat's earlier turns and its template's tokens are not penalised for ever
    repeat_last_n: int = -1
    # False: the window stops at this turn's prompt, so only the answer's own tokens are penalised: OpenAI counts
    # presence / frequency over sampled tokens (a prompt's end-of-turn token penalised made answers run on)
    penalize_prompt: bool = True
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    speculative: bool = True  # draft and verify when the model has a drafter on (engine/speculative)
    # a thinking model's switch, as its chat template's `enable_thinking` (Qwen3, SmolLM3); None: the template's default
    thinking: bool | None = None
    # None: none; else each token's log-probability and this many most likely tokens beside it (engine/logprobs.py)
    logprobs: int | None = None
    # None: none; else each prompt token's log-probability given the tokens before it (the first has none) and this
    # many most likely tokens beside it, computed during prefill (vLLM's prompt_logprobs; engine/prompt_logprobs.py)
    prompt_logprobs: int | None = None
    # the answer follows its prompt's scored echo: an end-of-turn token it ends with is listed among its logprobs (as
    # vLLM lists it). Set with prompt_logprobs and kept by a copy without them: n choices of a prompt score it once,
    # the others are sent the first's entries (server/protocol.py choice_params), and each lists its end alike
    echo: bool = False
    # None: free text; else the grammar the answer must follow, in llguidance's text (engine/constraint/grammar.py)
    grammar: str | None = None
    # token id -> a number added to its logit before everything else (OpenAI's logit_bias: -100 bans, 100 forces)
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        _check_types(self)
        self.echo = self.echo or self.prompt_logprobs is not None
        checks = [
            (0 <= self.temperature <= MAX_TEMPERATURE, f"temperature must be between 0 and {MAX_TEMPERATURE:g}"),
            (0 <= self.top_k <= MAX_INT32, f"top_k must be between 0 and {MAX_INT32}"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p < 1, "min_p must be in [0, 1)"),
            (1 / MAX_PENALTY <= self.repetition_penalty <= MAX_PENALTY,
             f"repetition_penalty must be between {1 / MAX_PENALTY:g} and {MAX_PENALTY:g}"),
            (abs(self.presence_penalty) <= MAX_PENALTY, f"presence_penalty must be between ±{MAX_PENALTY:g}"),
            (abs(self.frequency_penalty) <= MAX_PENALTY, f"frequency_penalty must be between ±{MAX_PENALTY:g}"),
            (-1 <= self.repeat_last_n <= MAX_INT32, f"repeat_last_n must be between -1 (the whole history) and {MAX_INT32}"),
            (self.seed is None or 0 <= self.seed < 2**64, "seed must be between 0 and 2**64 - 1"),
            (1 <= self.max_tokens <= MAX_INT32, f"max_tokens must be between 1 and {MAX_INT32}"),
            (len(self.stop) <= MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings are allowed"),
            (all(0 < len(s) <= MAX_STOP_CHARS for s in self.stop), f"stop strings must hold 1 to {MAX_STOP_CHARS} characters"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_TOP, f"logprobs must be between 0 and {MAX_TOP}"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_TOP,
             f"prompt_logprobs must be between 0 and {MAX_TOP}"),
            (self.grammar is None or 0 < len(self.grammar) <= MAX_GRAMMAR_CHARS,
             f"a grammar must hold 1 to {MAX_GRAMMAR_CHARS:,} characters"),
        ]
        for ok, message in checks:
            if not ok:
                raise ParleyError(f"Invalid sampling setting: {message}.")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def _check_types(p: SamplingParams) -> None:
    """Numbers must be real, finite numbers (ints where counts are meant); NaN and bools are refused."""
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ParleyError(f"Invalid sampling setting: {name} must be a finite number, not {value!r}.")
    unset = ("seed", "logprobs", "prompt_logprobs")  # None allowed
    for name in ("top_k", "repeat_last_n", "max_tokens", *unset):
        value = getattr(p, name)
        if not (value is None and name in unset) and (isinstance(value, bool) or not isinstance(value, int)):
            raise ParleyError(f"Invalid sampling setting: {name} must be an integer, not {value!r}.")
    if not isinstance(p.penalize_prompt, bool):
        raise ParleyError(f"Invalid sampling setting: penalize_prompt must be true or false, not {p.penalize_prompt!r}.")
    if not isinstance(p.echo, bool):
        raise ParleyError(f"Invalid sampling setting: echo must be true or false, not {p.echo!r}.")
    if not isinstance(p.speculative, bool):
        raise ParleyError(f"Invalid sampling setting: speculative must be true or false, not {p.speculative!r}.")
    if p.thinking is not None and not isinstance(p.thinking, bool):
        raise ParleyError(f"Invalid sampling setting: thinking must be true, false or unset, not {p.thinking!r}.")
    _check_bias(p.logit_bias)
    if p.grammar is not None and not isinstance(p.grammar, str):
        raise ParleyError(f"Invalid sampling setting: grammar must be text, not {type(p.grammar).__name__}.")
    if not isinstance(p.stop, list) or not all(isinstance(s, str) for s in p.stop):
        raise ParleyError("Invalid sampling setting: stop must be a list of strings.")


def _check_bias(bias: object) -> None:
    """A logit bias is None or at most MAX_BIASED token ids (ints >= 0), each with a finite number within ±MAX_BIAS."""
    if bias is None:
        return
    if not isinstance(bias, dict) or len(bias) > MAX_BIASED:
        raise ParleyError(f"Invalid sampling setting: logit_bias must map at most {MAX_BIASED} token ids to numbers.")
    for token, value in bias.items():
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ParleyError(f"Invalid sampling setting: logit_bias keys must be token ids (0 or more), not {token!r}.")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= MAX_BIAS:
            raise ParleyError(f"Invalid sampling setting: logit_bias values must be numbers between ±{MAX_BIAS:g}, "
                              f"not {value!r} (token {token}).")


class SamplerState:
    """One per session: its params and the random key of its turn.

    The noise that draws the token at context position p comes from (key, p) alone, never from how many draws came
    before: a token is the same whether it was drawn alone, in a batch, after a dropped look-ahead draw, or as a
    verified draft (engine/speculative/verify.py). The key is the seed when one is set (the same turn draws the same
    tokens), else fresh random bits each turn (a regenerated answer differs)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.key = 0
        self.begin_turn()

    def begin_turn(self) -> None:
        self.key = self.params.seed if self.params.seed is not None else secrets.randbits(64)

    def fork(self) -> "SamplerState":
        """A copy with the same key."""
        child = SamplerState(self.params)
        child.key = self.key
        return child

    def update(self, params: SamplingParams) -> None:
        self.params = params


def _mix(key: int, position: int) -> int:
    """splitmix64 of the pair: distinct positions (and keys) give unrelated seeds."""
    z = (key + (position + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def sample_ids(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int] | array],
               argmax: torch.Tensor | None = None, positions: list[int] | None = None,
               pending: torch.Tensor | None = None, graphs: "SamplingGraphs | None" = None) -> torch.Tensor:
    """logits (R, V) fp32, one row per sampling session -> the chosen ids (R,), on the logits' device: nothing
    waits for the device here. `histories`: each row's tokens (an int64 array is copied fastest: Sequence.history).
    `argmax`: the logits' row argmax when the step computed it already (used unless penalties change the logits).
    `positions`: where each id goes in its context (default: after its history). `pending` (R,), on the device: a
    token each history lacks yet (a look-ahead step's input), penalised as its last. The logits are left as they came
    (penalties are applied in place and taken back). `graphs` (a CUDA runner's): a step with drawn rows replays its
    penalties and draw from a graph (engine/sampling_graphs.py), the same tokens with one copy and one launch."""
    drawing = [i for i, s in enumerate(states) if not s.params.greedy]
    if graphs is not None and drawing:
        at = positions if positions is not None else [len(h) + (pending is not None) for h in histories]
        ids = graphs.sample(logits, states, histories, at, pending, argmax)
        if ids is not None:
            return ids
    with _penalties(logits, states, histories, pending) as (logits, changed):
        if (argmax is None or changed) and (len(drawing) < len(states) or not drawing):  # some row is greedy
            argmax = _argmax(logits)
        if not drawing:
            return argmax
        at = [positions[i] if positions is not None else len(histories[i]) + (pending is not None) for i in drawing]
        if len(drawing) == len(states):
            return _choose(logits, states, at)
        index = _on(drawing, logits.device)  # a device index: a list would be copied up with a wait
        ids = argmax.clone()  # the graph's output buffer is not ours to write
        ids[index] = _choose(logits.index_select(0, index), [states[i] for i in drawing], at)
        return ids


def _choose(rows: torch.Tensor, states: list[SamplerState], positions: list[int]) -> torch.Tensor:
    """Each drawing row's token at its position (`draw` over its `candidates`, or the CPU library's draw). Each kind
    of row (`_groups`) draws apart, so a row's token never depends on what shares its step."""
    groups = _groups(states)
    if len(groups) == 1:
        return _choose_group(rows, states, positions)
    out = torch.empty(len(states), dtype=torch.long, device=rows.device)
    for group in groups:
        index, picked = _on(group, rows.device), [states[i] for i in group]
        out[index] = _choose_group(rows.index_select(0, index), picked, [positions[i] for i in group])
    return out


def _choose_group(rows: torch.Tensor, states: list[SamplerState], positions: list[int]) -> torch.Tensor:
    params, temps = [s.params for s in states], [s.params.temperature for s in states]
    if rows.is_cuda:  # the Triton kernel's draw in one launch (torch's: dozens of launches and copies a step)
        drawn = _gpu_draw(rows, states, positions)
        if drawn is not None:
            return drawn
    if not _filters(params[0]):  # the whole row: the CPU library draws without the softmax written out
        drawn = draw_rows(rows, temps, _uniforms(states, positions))
    else:  # the CPU library's whole filtered draw in one call
        drawn = sample_top(rows, [min(p.top_k, rows.shape[-1]) for p in params], temps, [p.top_p for p in params],
                           [p.min_p for p in params], _uniforms(states, positions))
    return drawn if drawn is not None else draw(*candidates(rows, states), states, positions)


GPU_CANDIDATES = 1024  # the largest top-k the GPU kernel ranks (comparisons of every pair); above it torch's path


def _gpu_draw(rows: torch.Tensor, states: list[SamplerState], positions: list[int]) -> torch.Tensor | None:
    """One group's draw by kernels/sampling_triton.py: top-k rows rank the step's k largest logits, open rows first
    their FIRST_WIDTH largest (the kernel goes on over the whole row where the nucleus lies past them), rows without
    filters none. None without Triton or past GPU_CANDIDATES."""
    vocab, params = rows.shape[-1], [s.params for s in states]
    limits = [min(p.top_k, vocab) for p in params]
    width = candidate_width(params, vocab)
    if width > GPU_CANDIDATES or not triton_available():
        return None
    from kernels.sampling_triton import sample_rows_triton

    rows = rows if rows.dtype == torch.float32 and rows.stride(-1) == 1 else rows.float().contiguous()
    table = [[p.temperature, k, p.top_p, p.min_p, u] for p, k, u in zip(params, limits, _uniforms(states, positions))]
    candidates = rows.topk(width, dim=-1, sorted=False) if width else None
    whole, nucleus = whole_row(params)
    return sample_rows_triton(rows, _on(table, rows.device, torch.float64), candidates, whole=whole, nucleus=nucleus)


def whole_row(params: list[SamplingParams]) -> tuple[bool, bool]:
    """For the GPU's draw: whether some row (one without top-k) may go on over its whole row, and whether one of
    those searches the row for its nucleus (a top-p below 1): the launches it may skip."""
    open_rows = [p for p in params if not p.top_k]
    return bool(open_rows), any(p.top_p < 1 for p in open_rows)


def probabilities(rows: torch.Tensor, states: list[SamplerState]) -> torch.Tensor:
    """What each drawing row samples from, over the whole vocabulary, normalised (`candidates`, spread out)."""
    out = torch.empty_like(rows, dtype=torch.float32)
    for group in _groups(states):
        ids, weights = candidates(rows[group], [states[i] for i in group])
        if ids is not None:
            weights = torch.zeros_like(rows[group], dtype=weights.dtype).scatter(-1, ids, weights)
        out[group] = weights / weights.sum(dim=-1, keepdim=True)
    return out


def _filters(p: SamplingParams) -> bool:
    return p.top_k > 0 or p.top_p < 1 or p.min_p > 0


def candidate_width(params: list[SamplingParams], vocab: int) -> int:
    """Candidates a group of one kind ranks on a GPU: top-k rows their largest k, open rows FIRST_WIDTH, others none."""
    limits = [min(p.top_k, vocab) for p in params]
    return max(limits) if limits[0] else min(FIRST_WIDTH, vocab) if _filters(params[0]) else 0


def _groups(states: list[SamplerState]) -> list[list[int]]:
    return param_groups([s.params for s in states])


def param_groups(params: list[SamplingParams]) -> list[list[int]]:
    """The rows without filters, the rows with a top-k, the rows with other filters only (empty ones left out): each
    kind draws by its own path, whatever shares the step."""
    kind = [0 if not _filters(p) else 1 if p.top_k else 2 for p in params]
    groups = [[i for i, c in enumerate(kind) if c == g] for g in range(3)]
    return [g for g in groups if g]


def candidates(rows: torch.Tensor, states: list[SamplerState]) -> tuple[torch.Tensor | None, torch.Tensor]:
    """What rows draw from: the softmax at each row's temperature; without filters (every row: `_groups`) the whole
    vocabulary's probabilities (ids None); with them, the top-k, top-p and min-p tokens as (ids, weights), in id order
    (ids None where the whole row was ranked), a weight 0 where a filter drops the token (unnormalised: the draw does
    not need it).

    Only the tokens a filter can keep are ranked (a top-k of the row, not a sort of the vocabulary: on a CPU the sort
    of 262,144 probabilities cost 21 ms a row). Rows without top-k widen the ranked set until their nucleus / min-p
    boundary falls inside it (on CUDA, where that check would wait for the device, they rank the whole row)."""
    vocab = rows.shape[-1]
    temps = [s.params.temperature for s in states]
    if not any(_filters(s.params) for s in states):
        return None, _softmax(rows, temps)
    probs = None
    limits = [min(s.params.top_k, vocab) for s in states]
    open_ended = any(k == 0 for k in limits)
    first = max([k for k in limits if k] + ([FIRST_WIDTH] if open_ended else []))
    width = vocab if open_ended and rows.is_cuda else min(vocab, first)
    while True:
        ranked = top_rows(rows, temps, width) if width < vocab else None  # the CPU library's, where built
        if ranked is None:
            probs = _softmax(rows, temps) if probs is None else probs
            ids = _ranked(rows, width)
            ranked = probs.gather(1, ids), ids
        top, ids = ranked
        keep, bounded = _kept(top, states, limits)
        if width == vocab:  # the whole row ranked: back in id order, as the unfiltered rows draw
            return None, torch.zeros_like(top).scatter(1, ids, top * keep)
        if not open_ended or bool(bounded.all()):
            ids, order = ids.sort(dim=-1)  # id order: ties in probability, ranked either way, draw the same token
            return ids, (top * keep).gather(1, order)
        width = min(vocab, width * 8) if width < WIDEST else vocab


def _ranked(rows: torch.Tensor, width: int) -> torch.Tensor:
    """Each row's `width` highest logits' ids, ranked high to low with equal logits by id, as the library ranks them:
    the same tokens whatever the width. torch.topk breaks ties in no fixed order, so a row's top-k could change with
    the width a wider neighbour made its step rank (coarse logits, bf16's, tie often)."""
    if width == rows.shape[-1]:
        return rows.sort(dim=-1, descending=True, stable=True).indices  # stable: equal logits stay in id order
    top, ids = rows.topk(width, dim=-1)
    floor = top[:, -1:]
    # a tie across the cut: topk took some of the tokens equal to the last one ranked, not those of lowest id
    straddles = (rows == floor).sum(dim=-1) > (top == floor).sum(dim=-1)
    if rows.is_cuda or bool(straddles.any()):  # on the CPU the check is cheap: the exact cut only where it is needed
        ids = _lowest_tied(rows, floor, width)
    ids = ids.sort(dim=-1).values
    return ids.gather(1, rows.gather(1, ids).sort(dim=-1, descending=True, stable=True).indices)


def _lowest_tied(rows: torch.Tensor, floor: torch.Tensor, width: int) -> torch.Tensor:
    """The `width` ids above `floor`, then those equal to it of lowest id (id order)."""
    above, tied = rows > floor, rows == floor
    chosen = above | (tied & (tied.cumsum(dim=-1) <= width - above.sum(dim=-1, keepdim=True)))
    index = torch.arange(rows.shape[-1], device=rows.device)
    return torch.where(chosen, index, rows.shape[-1]).topk(width, dim=-1, largest=False).values


def _softmax(rows: torch.Tensor, temperatures: list[float]) -> torch.Tensor:
    return torch.softmax(rows / _on(temperatures, rows.device, torch.float32)[:, None], dim=-1)


FIRST_WIDTH = 256  # tokens ranked first for a row without top-k: a chat model's nucleus at p 0.9-0.95 is mostly inside
WIDEST = 16_384  # widest selection before the whole row is sorted instead (a flat row's nucleus: 37 ms at 131,072)


def _kept(top: torch.Tensor, states: list[SamplerState], limits: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of each row's `top` (sorted probabilities) its filters keep, and per row whether its boundary lies inside
    them (top-k does, or the next token down is dropped: the mass above it reaches top-p, or it is under min-p)."""
    dev = top.device
    top_k = _on([k or top.shape[-1] for k in limits], dev)
    top_p = _on([s.params.top_p for s in states], dev, torch.float32)[:, None]
    min_p = _on([s.params.min_p for s in states], dev, torch.float32)
    rank = torch.arange(top.shape[-1], device=dev)[None, :]
    mass = top.cumsum(dim=-1)
    before = mass - top  # mass strictly above this token
    floor = (min_p * top[:, 0])[:, None]
    open_rows = _on([k == 0 for k in limits], dev)
    in_k = rank < top_k[:, None]
    # top-p over what top-k keeps, renormalised, as llama.cpp's chain and transformers' processors apply it
    nucleus = top_p * torch.where(open_rows, 1.0, (top * in_k).sum(dim=-1))[:, None]
    keep = in_k & ((before < nucleus) | (top_p >= 1)) & (top >= floor)  # p 1: rounding drops none
    keep[:, 0] = True
    return keep, ((mass[:, -1:] >= top_p) & (top_p < 1) | (top[:, -1:] < floor))[:, 0] | ~open_rows


def _on(values: list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small host list on `device`, queued behind the device's work (a blocking copy would wait for it)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def draw(ids: torch.Tensor | None, weights: torch.Tensor, states: list[SamplerState],
         positions: list[int]) -> torch.Tensor:
    """One id per row of `candidates`' (ids, weights): where the weights' cumulative sum passes one uniform number
    per row, which comes from (the turn's key, the position) alone. An exact draw with one number a row (a seeded
    generator's noise over the whole vocabulary cost a launch and 5 ms of the CPU per row)."""
    u = _on(_uniforms(states, positions), weights.device, torch.float64)[:, None]
    at = _inverse_cdf(weights, u)
    return at[:, 0] if ids is None else ids.gather(1, at)[:, 0]


def _uniforms(states: list[SamplerState], positions: list[int]) -> list[float]:
    """Each row's number in [0, 1) for its draw: 53 bits of (the turn's key, the position)."""
    return [(_mix(s.key, p) >> 11) * 2.0**-53 for s, p in zip(states, positions)]


CDF_BLOCK = 512  # weights summed in fp32 blocks of this many: fp64 over a whole 262k row cost 1.1 ms a row on a CPU


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row (R, 1) the first index where the weights' cumulative sum passes u times their total (u in [0, 1), fp64):
    the block found over the fp32 block sums (cumulated in fp64), then the index inside it in fp64. A weight of 0 is
    never chosen."""
    rows, n = weights.shape
    full, tail = divmod(n, CDF_BLOCK)
    sums = [weights[:, : full * CDF_BLOCK].reshape(rows, full, CDF_BLOCK).sum(-1)] if full else []
    if tail:
        sums.append(weights[:, full * CDF_BLOCK :].sum(-1, keepdim=True))
    cum = torch.cat(sums, dim=-1).double().cumsum(dim=-1)
    block, below, target = _passing(cum, u * cum[:, -1:])
    cols = block * CDF_BLOCK + torch.arange(CDF_BLOCK, device=weights.device)
    inside = weights.gather(1, cols.clamp(max=n - 1)).double() * (cols < n)
    within = inside.cumsum(dim=-1)
    mass = cum.gather(1, block) - below  # the block's weight as it was found (> 0: searchsorted passed it)
    at, _, _ = _passing(within, (target - below) / mass * within[:, -1:])
    return block * CDF_BLOCK + at


def _passing(cum: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first index whose cumulative value exceeds `target` (kept below the last value: rounding never passes it),
    the value before that index, and the target used."""
    last = cum[:, -1:]
    target = torch.minimum(target.clamp(min=0), torch.nextafter(last, torch.zeros_like(last)))
    at = torch.searchsorted(cum, target, right=True).clamp_(max=cum.shape[-1] - 1)
    below = torch.where(at > 0, cum.gather(1, (at - 1).clamp(min=0)), torch.zeros_like(target))
    return at, below, target


def _argmax(rows: torch.Tensor) -> torch.Tensor:
    """Each row's first index of its maximum; on the CPU the library's vector argmax where built (torch's is scalar)."""
    if rows.is_cuda:
        return rows.argmax(dim=-1)
    from kernels.argmax import argmax_rows

    return argmax_rows(rows, impl="auto")


def penalise(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int] | array],
             pending: torch.Tensor | None = None) -> torch.Tensor:
    """Repetition, presence and frequency penalties of each row's state over its history's last `repeat_last_n`
    tokens (its `pending` token the newest): a penalised copy of the logits, or `logits` itself when no row has any."""
    rows = _penalised_rows(states, histories, pending)
    if not rows:
        return logits
    out = logits.clone(memory_format=torch.contiguous_format)
    _apply_penalties(out, rows, states, histories, pending)  # a copy: nothing to take back
    return out


@contextmanager
def _penalties(logits: torch.Tensor, states: list[SamplerState], histories: list[list[int] | array],
               pending: torch.Tensor | None) -> Iterator[tuple[torch.Tensor, bool]]:
    """The logits with `penalise`'s penalties, and whether any row has one. Written into the logits themselves and
    the values they replaced put back on exit: a copy of (R, V) logits cost more than the penalties themselves."""
    rows = _penalised_rows(states, histories, pending)
    if not rows:
        yield logits, False
    elif not logits.is_contiguous():
        yield penalise(logits, states, histories, pending), True
    else:
        with torch.inference_mode():  # the runner's logits are inference tensors: written only in that mode
            restore = _apply_penalties(logits, rows, states, histories, pending)
        try:
            yield logits, True
        finally:
            with torch.inference_mode():
                restore()


def _penalised_rows(states: list[SamplerState], histories: list, pending: torch.Tensor | None) -> list[int]:
    return [i for i, s in enumerate(states) if penalised(s.params) and (len(histories[i]) or pending is not None)]


def _apply_penalties(out: torch.Tensor, rows: list[int], states: list[SamplerState], histories: list,
                     pending: torch.Tensor | None) -> Callable[[], object]:
    """Penalises `rows` of `out` (R, V, contiguous) in place, batched on its device with nothing read back (a
    look-ahead step samples before the host knows the previous token); returns what puts the values back."""
    dev, vocab = out.device, out.shape[-1]
    read = [_window(histories[i], states[i].params.repeat_last_n, pending is not None) for i in rows]
    lens = [len(h) for h in read]
    width = max(lens) + (pending is not None)
    pad = array("q", [vocab]) * width  # after every real id when sorted: no real id counts it
    buf = array("q")
    for h, n in zip(read, lens):  # one int64 buffer: an array's bytes are copied, a list's ints converted
        buf.extend(h if isinstance(h, array) else array("q", h))
        buf.extend(pad[: width - n])
    hist = torch.frombuffer(buf, dtype=torch.int64).view(len(rows), width).to(dev, non_blocking=True)
    at = _on(rows, dev)
    if pending is not None:
        hist.scatter_(1, _on(lens, dev)[:, None], pending[at][:, None])
    frequency = any(states[i].params.frequency_penalty for i in rows)
    factors = [penalty_factors(states[i].params) for i in rows]
    if not out.is_cuda:  # the CPU library: one call each way (a dozen torch operations: the sampler 0.22 -> 0.29 ms)
        restore = penalise_rows(out, rows, hist, factors, _counts(hist) if frequency else None)
        if restore is not None:
            return restore
    if out.is_cuda and out.dtype == torch.float32 and triton_available():  # kernels/penalties_triton.py: 2 launches
        from kernels.penalties_triton import penalise_rows_triton, restore_rows_triton

        params = _on(factors, dev, torch.float32)
        original = penalise_rows_triton(out, at, hist, params, _counts(hist).float() if frequency else None)
        return lambda: restore_rows_triton(out, at, hist, original)
    real = hist < vocab
    ids = torch.where(real, hist, hist[:, :1])  # pads repeat the first id, which is real, with its value
    flat = (at[:, None] * vocab + ids).flatten()  # into the (R * V) logits: no other copy of the rows
    original = out.view(-1).take(flat)
    seen = original.view(ids.shape)
    rep, presence, frequencies = _on(factors, dev, out.dtype).T[:, :, None]
    seen = torch.where(seen > 0, seen / rep, seen * rep)
    seen = seen - presence
    if frequency:
        seen = seen - frequencies * _counts(hist).to(seen.dtype)
    seen = torch.where(real, seen, seen[:, :1])
    out.view(-1).scatter_(0, flat, seen.flatten())
    return lambda: out.view(-1).scatter_(0, flat, original)


def penalty_factors(p: SamplingParams) -> tuple[float, float, float]:
    return p.repetition_penalty, p.presence_penalty, p.frequency_penalty


def _window(history: list[int] | array, last_n: int, pending: bool) -> list[int] | array:
    """The history tokens the penalties read: the last `last_n` (-1: all), the pending token counted as the last."""
    if last_n < 0:
        return history
    return history[max(0, len(history) + pending - last_n) :]


def _counts(hist: torch.Tensor) -> torch.Tensor:
    """(P, L) ids -> how often each entry's id occurs in its row: runs of the sorted rows, their lengths scattered
    back (a size known on the host: nothing waits for the device)."""
    ordered, order = hist.sort(dim=-1)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    run = starts.flatten().cumsum(0) - 1  # each row's first entry starts a run
    lengths = torch.zeros(run.numel(), dtype=torch.long, device=hist.device).scatter_add_(0, run, torch.ones_like(run))
    return torch.empty_like(hist).scatter_(1, order, lengths[run].view_as(hist))


def penalised(p: SamplingParams) -> bool:
    some = p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
    return some and p.repeat_last_n != 0
