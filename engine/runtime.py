"""ModelRuntime: one loaded model with its own KV cache, batcher and runner, behind a few methods.

`build_runtime` is the one place a runtime is assembled: the engine, the command line, tests and benchmarks
all call it, so a choice made here (backend, cache layout, kernels) holds everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from typing import Callable

import torch

from engine.backend import resolve_backend
from engine.batcher import Batcher
from engine.cache import CacheConfig, first_cache_bytes, make_cache
from engine.cache.config import dtype_name
from engine.cache.growth import GROWTH_MARGIN, free_bytes
from engine.constraint.guide import Grammars
from engine.errors import CacheError, CacheMemoryError, ModelLoadError, ParleyError
from engine.loading.loader import LoadedModel
from engine.memory import gb_pair, return_freed_memory
from engine.models.args import ModelArgs
from engine.models.kernel_choice import KernelChoice, choose_kernels
from engine.prefix_cache import PrefixCache
from engine.process import configure_process
from engine.runner import ModelRunner
from engine.sampling import SamplerState, SamplingParams
from engine.scheduler import SchedulerConfig
from engine.sequence import Sequence, Status
from engine.session import common_prefix
from engine.speculative import Drafter, check_mode, make_drafter
from engine.speculative.dflash import DFlashDrafter
from engine.speculative.dflash_net import DFlashNet
from engine.speculative.draft_model import DraftModel, mismatch
from engine.tokenizer.fill_in_middle import fim_markers
from engine.tool_calls import tool_format


NEEDS_DRAFTER = {  # a mode that drafts from a file, without one
    "draft": "speculative 'draft' needs a draft model: a smaller model with the same tokenizer (--draft-model PATH)",
    "dflash": "speculative 'dflash' needs a DFlash drafter trained for the model (--draft-model DRAFTER.safetensors, "
              "made by python -m training.dflash); none is shipped",
}
SNAPSHOT_MIN_TOKENS = 256  # prompts at least this long keep a parked copy when the cache has sliding rings
FOLLOW_MIN_GAIN = 32  # tokens a leader's prefix must save before a turn waits for it (shorter: prefill at once)


@dataclass(slots=True)
class EngineConfig:
    kv_layout: str = "sequence"
    max_sessions: int = 8  # cache slots per model: sessions generating at once; more wait in a queue
    max_session_tokens: int | None = 8192  # each session's context, capped by the model's own (None: the model's)
    step_tokens: int = 512  # token budget of one forward (chunked prefill keeps other chats moving)
    chunk_tokens: int = 256
    max_sampled_rows: int = 64
    device: str = "auto"  # auto: CUDA when there is a GPU, else CPU (MLX on Apple silicon: see backend)
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    backend: str = "auto"  # auto: CUDA torch, else MLX on Apple silicon, else CPU torch
    lookahead: bool | None = None  # launch the next decode step before reading this one's ids; None: with CUDA graphs
    compile_decode: bool = False  # CUDA: torch.compile the decode graphs (~5 % faster than the fused kernels; 15-60 s per batch size, once)
    cache_dir: Path | None = None  # converted GGUF weights
    weights: str = "auto"  # engine/loading/loader.py LoadOptions.weights: "auto", "quantized" or "dequantized"
    quantize: str | None = None  # HF folders: "q8" or "q4" quantizes their matrices at load (CPU)
    prefix_cache: bool = True  # closed chats' caches stay (parked) and any slot's prefix seeds a new turn
    prefix_tokens: int | None = None  # parked tokens at most (the budget; None: half the cache's capacity)
    speculative: str = "auto"  # engine/speculative: "off", "lookup" (prompt lookup drafts, verified per step), "draft"
    # (a smaller model of the same vocabulary drafts: `draft_model`), "dflash" (a DFlash block drafter trained for the
    # model, `draft_model` its .safetensors: training/dflash.py); auto is lookup
    draft_model: Path | None = None

    def __post_init__(self) -> None:
        self.scheduler_config()  # validates
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if self.prefix_tokens is not None and self.prefix_tokens < 0:
            raise ValueError("prefix_tokens must be at least 0")
        check_mode(self.speculative)
        if self.speculative in ("draft", "dflash") and self.draft_model is None:
            raise ValueError(NEEDS_DRAFTER[self.speculative])

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(self.step_tokens, self.chunk_tokens, self.max_sampled_rows)


@dataclass(frozen=True, slots=True)
class RuntimeTuning:
    """Overrides of what build_runtime decides by itself, for benchmarks and kernel tests; None keeps the default."""

    graphs: bool | None = None  # CUDA graphs for decode steps (default: on CUDA with the kernel attention)
    kernels: KernelChoice | None = None  # default: choose_kernels for the device
    attention_impl: str | None = None  # the sequence layout's attention: auto, reference, triton
    step_advance: bool = True  # a replayed greedy step moves the step table on itself
    preallocate: bool = False  # allocate every sequence's whole context up front (no regrowth mid-run)


class ModelRuntime:
    """A model's step machinery. Everything here runs on the engine thread (or the caller's, in benchmarks)."""

    def __init__(self, model_id: int, lm: LoadedModel, backend: str, batcher: Batcher, limit: int,
                 prefixes: PrefixCache | None = None, share_prefixes: bool = True):
        self.model_id, self.lm, self.backend = model_id, lm, backend
        self.batcher, self.limit = batcher, limit
        self.device = torch.device(batcher.device)  # where logits land and samplers draw (the host for MLX)
        self.prefixes = prefixes or PrefixCache(batcher.cache, 0, 0)
        self.share_prefixes = share_prefixes  # turns may start from other slots' prefixes (EngineConfig.prefix_cache)
        self.snapshot_min = SNAPSHOT_MIN_TOKENS
        self.grammars = Grammars(lm.tokenizer, lm.args.vocab_size)  # guides for turns held to a grammar
        self._followers: dict[Sequence, tuple[Sequence, int]] = {}  # held back -> (its leader, prefix it waits for)
        # frees an idle session's slot other than the one given, where no slot is free to copy a prefix into (set by
        # the host that keeps the sessions; None: the copy waits for a free slot)
        self.spare_idle: Callable[[int], bool] | None = None
        # the sequences the last step ended before it ran, their cache unable to grow into the memory that is free:
        # the host reports each one's error on its turn
        self.refused: list[tuple[Sequence, ParleyError]] = []

    @property
    def scheduler(self):
        return self.batcher.scheduler

    @property
    def cache(self):
        return self.batcher.cache

    # -- stepping
    def has_work(self) -> bool:
        return self.batcher.has_work() or bool(self._followers)

    def step(self) -> list[tuple[Sequence, int]]:
        self._unpark_for_waiting()
        self._reserve()
        out = self.batcher.step() if self.batcher.has_work() else []
        ready = [f for f, (source, need) in self._followers.items()
                 if source.num_cached >= need or source.status == Status.FINISHED or source.slot is None]
        if ready:
            if self.batcher.has_ahead():  # the copy below must not race a step queued ahead
                out += self.batcher.settle()
            for seq in ready:
                source, _ = self._followers.pop(seq)
                cached = [(source.slot, source.token_ids[: source.num_cached])] if source.slot is not None else []
                self.reuse_prefix(seq, seq.token_ids, cached)
                self.run(seq)
        prefilled = [seq for seq, _ in out if len(seq.generated) == 1 and self._worth_a_snapshot(seq)]
        if prefilled:
            if self.batcher.has_ahead():
                out += self.batcher.settle()
            for seq in prefilled:
                self._snapshot(seq)
        return out

    def _reserve(self) -> None:
        """Grows the cache before the step for what its sequences will write: a sequence the memory that is free cannot
        hold ends here with its error (`refused`), while the others' step goes on; where the layout pools its memory
        its cells go back for them (it prefills again next turn), else it keeps its cache. Sequences that may verify
        drafts ask for room for them too, where it fits."""
        self.refused = []
        if self.cache.holds(*self._write_bounds()):  # far from the storage's end (most steps): nothing more to look at
            return
        upcoming = self._upcoming_writes()
        if not upcoming or not self.cache.reserve([(start, n + extra) for _, start, n, extra in upcoming]):
            return
        while upcoming:
            refused = self.cache.reserve([(start, n) for _, start, n, _ in upcoming])
            if not refused:
                return
            i, exc = next(iter(refused.items()))  # the write the layout refuses first: the one that needs the most
            seq, start, n, _ = upcoming.pop(i)
            if len(seq.token_ids) - start > n:  # a prompt's chunk: the refusal names what the whole prompt needs
                exc = self.cache.refusal_for(start, len(seq.token_ids) - start)
            self.scheduler.finish(seq, "error", release=self.cache.pooled)
            self.refused.append((seq, exc))

    def _write_bounds(self) -> tuple[int, int]:
        """Bounds on the next step's writes, from two sums over the running sequences: the furthest position written
        (a sequence writes up to its last token, or one past what it holds, plus drafts) and the tokens written in all
        (what each has not cached, at least one, plus drafts; a chunk for each waiting one a free slot admits). A
        chunk past each one's cache bounded them too, but then every step of a cache filled past its half looked at
        every sequence (40 us a step at 64 sessions)."""
        sched, drafts = self.scheduler, self._draft_rows()
        running, chunk = sched.running, sched.config.chunk_tokens
        lengths = list(map(len, map(attrgetter("token_ids"), running)))
        cached = sum(map(attrgetter("num_cached"), running))
        admitted = min(len(sched.waiting), self.cache.book.free_slots)
        furthest = max(max(lengths, default=0) + 1 + drafts, chunk if admitted else 0)
        tokens = sum(lengths) - cached + len(running) * (1 + drafts) + admitted * chunk
        return furthest, min(tokens, sched.config.step_tokens)

    def _draft_rows(self) -> int:
        return getattr(getattr(self.batcher.drafter, "pacing", None), "most", 0)

    def _upcoming_writes(self) -> list[tuple[Sequence, int, int, int]]:
        """(sequence, first position, tokens it surely writes, draft rows it may add) for each sequence the next step
        may run: the running ones and the waiting ones that free slots admit."""
        chunk, drafts = self.scheduler.config.chunk_tokens, self._draft_rows()
        out = []
        for seq in self.scheduler.running:
            start = seq.num_cached
            n = max(1, min(chunk, len(seq.token_ids) - start))
            extra = drafts if n == 1 and seq.sampler.params.speculative else 0
            out.append((seq, start, n, extra))
        for seq in list(self.scheduler.waiting)[: self.cache.book.free_slots]:
            out.append((seq, 0, min(chunk, len(seq.token_ids)), 0))
        return out

    def _worth_a_snapshot(self, seq: Sequence) -> bool:
        """A long prompt just prefilled into a cache with sliding rings: once the answer moves the rings on, its
        slot can no longer seed another chat, so a spare slot keeps a parked copy (evicted first when needed)."""
        if not (self.share_prefixes and self.cache.book.rings and seq.slot is not None
                and seq.num_prompt >= self.snapshot_min and self.prefixes.max_parked > 0
                and self.cache.book.free_slots > len(self.scheduler.waiting)):
            return False
        held = self.prefixes.best([*seq.token_ids[: seq.num_prompt], -1], [])
        return held is None or held.length < seq.num_prompt

    def _snapshot(self, seq: Sequence) -> None:
        n = seq.num_prompt
        if seq.slot is None or self.cache.book.floor(seq.slot) > n or not self.cache.book.free_slots:
            return
        try:
            slot = self.cache.seq_clone(seq.slot)
        except CacheMemoryError:  # a copy the memory cannot hold: the chat goes on without it
            return
        self.cache.rewind(slot, n)
        if not self.prefixes.park(slot, seq.token_ids[:n]):
            self.cache.seq_rm(slot)

    def _unpark_for_waiting(self) -> None:
        """Parked prefixes never keep a waiting sequence out: their slots go first, least recently used first."""
        short = len(self.scheduler.waiting) - self.cache.book.free_slots
        while short > 0 and self.prefixes.evict() is not None:
            short -= 1

    def settle(self) -> list[tuple[Sequence, int]]:
        """Reads any step queued ahead, so sequences can be changed from outside."""
        return self.batcher.settle() if self.batcher.has_ahead() else []

    def fail_in_flight(self) -> list[Sequence]:
        """After a failed step: ends the sequences it held and frees their (half written) cache rows."""
        failed, self.batcher.in_flight = self.batcher.in_flight, []
        for seq in failed:
            self.scheduler.finish(seq, "error", release=True)
        return failed

    # -- sequences
    def free_slots(self) -> int:
        """Slots a sequence can have now: the free ones and the parked ones (given up on demand)."""
        return self.cache.book.free_slots + self.prefixes.parked

    def waiting(self) -> list[Sequence]:
        return list(self.scheduler.waiting)

    def run(self, seq: Sequence) -> None:
        """Schedules a sequence: at once if it still holds a slot, else through admission; a follower (`follow`)
        waits for its leader's prefill first."""
        if seq not in self._followers:
            seq.num_reused = seq.num_cached if seq.slot is not None else 0
            self.scheduler.resume(seq)

    def follow(self, seq: Sequence, others: list[Sequence]) -> bool:
        """Holds `seq` back while another running or waiting sequence is about to compute a longer prefix of its
        prompt than any cache holds (the same prompt sent to several compare columns): once that prefix is
        computed it is copied, so the prompt runs once. True when `seq` now waits for a leader."""
        if not self.share_prefixes or seq.scores_prompt:  # it would copy the leader's prefix, unscored
            return False
        ids, have = seq.token_ids, (seq.num_cached if seq.slot is not None else 0)
        best, need = None, have + FOLLOW_MIN_GAIN
        for other in others:
            if other is seq or not (other in self.scheduler.running or other in self.scheduler.waiting):
                continue  # only a sequence that is scheduled will compute its prompt
            n = min(common_prefix(ids, other.token_ids), len(ids) - 1)
            if n >= need and n > other.num_cached:
                best, need = other, n
        if best is not None:
            self._followers[seq] = (best, need)
            seq.status = Status.WAITING
        return best is not None

    def stop(self, seq: Sequence, reason: str, drop: int = 0) -> None:
        """Ends its generation; the cache keeps what it holds (the session's next turn reuses it). `drop`: its last
        tokens, generated in the same step as the one that ended it (accepted drafts), are taken back."""
        if self._followers.pop(seq, None) is not None:
            seq.status, seq.finish_reason = Status.FINISHED, reason
            return
        if drop:
            seq.drop_last(drop)
            if seq.slot is not None and seq.num_cached >= len(seq.token_ids):
                seq.num_cached = len(seq.token_ids) - 1
                self.cache.rewind(seq.slot, seq.num_cached)
        self.scheduler.finish(seq, reason, release=False)

    def release(self, seq: Sequence) -> None:
        """Gives its cache slot back."""
        self.scheduler.release(seq)

    def park(self, seq: Sequence) -> None:
        """A closed conversation's slot: kept for later turns that share its prefix (within the budget), else freed."""
        if seq.slot is not None and self.prefixes.park(seq.slot, seq.token_ids[: seq.num_cached]):
            seq.slot, seq.num_cached = None, 0
        else:
            self.release(seq)

    def reuse_prefix(self, seq: Sequence, ids: list[int], live: list[tuple[int, list[int]]]) -> int:
        """Before a turn of `ids`: when another slot (`live` (slot, cached tokens) or parked) holds a longer prefix
        than the sequence's own cache, the sequence takes a copy of it. Returns the tokens it now has cached."""
        own = seq.num_cached if seq.slot is not None else 0
        if not self.share_prefixes or seq.scores_prompt:  # a copied prefix has no hidden rows to score it by
            return own
        match = self.prefixes.best(ids, live, exclude=seq.slot)
        if match is None or match.length <= own:
            return own
        if seq.slot is not None:
            self.release(seq)  # its own, shorter prefix makes room for the copy
        elif not self.cache.book.free_slots and not self._unpark_one(keep=match.slot):
            if self.prefixes.holds(match.slot):  # the match is the only parked slot: it becomes the turn's own
                seq.slot, seq.num_cached = self.prefixes.take(match), match.length
                return match.length
            if self.spare_idle is None or not self.spare_idle(match.slot):
                return 0  # no slot to copy into now: it prefills through admission as before
        seq.slot, seq.num_cached = self.prefixes.adopt(match), match.length
        return match.length

    def _unpark_one(self, keep: int) -> bool:
        """Frees one parked slot other than `keep` (least recently used first)."""
        return self.prefixes.evict(skip=keep) is not None

    def fork(self, seq: Sequence, seq_id: int) -> Sequence | None:
        """A finished sequence holding a copy of `seq`'s cached tokens, or None when no slot is free."""
        if seq.slot is None or not self.free_slots():
            return None
        if not self.cache.book.free_slots:
            self._unpark_one(keep=seq.slot)  # a parked prefix gives its slot to the fork
        cached = seq.token_ids[: seq.num_cached]
        child = Sequence(seq_id, list(cached), seq.sampler, seq.stop_ids, seq.max_len)
        child.slot = self.cache.seq_clone(seq.slot)
        child.num_cached, child.status = len(cached), Status.FINISHED
        return child

    def keep_prefix(self, seq: Sequence, keep: int) -> None:
        """Trims the cached tokens to `keep`; a ring that overwrote what `keep` needs drops them all."""
        if seq.slot is None or keep >= seq.num_cached:
            return
        try:
            self.cache.rewind(seq.slot, keep)
            seq.num_cached = keep
        except CacheError:  # rewinding past a sliding-window ring: prefill again from scratch
            self.release(seq)

    # -- lifetime
    def warm_up(self) -> None:
        """A few tokens through the step, greedy and sampled (the app's defaults), whose slots then go back: the first
        step's one-time work (lazy imports, thread pools, first kernel launches) happens at load, not under the first
        requests. On a fresh server 300 clients at once had taken every file descriptor, so that first step's imports
        failed 124 of them."""
        warm = [SamplingParams(max_tokens=2, speculative=False),
                SamplingParams(temperature=0.7, top_k=40, top_p=0.95, repetition_penalty=1.1, max_tokens=2,
                               speculative=False, seed=0)]
        prompt = [1, 2, 3][: max(1, self.limit - 2)]
        for i, params in enumerate(warm):  # one at a time: a cache of one slot holds one
            seq = Sequence(-1 - i, list(prompt), SamplerState(params), max_len=self.limit)
            self.scheduler.add(seq)
            try:
                while self.has_work():
                    self.step()
            finally:
                if seq.slot is not None:
                    self.release(seq)

    def close(self) -> None:
        """Waits for queued device work and drops the model and cache (on the engine thread)."""
        if self.backend == "mlx":
            import mlx.core as mx

            mx.synchronize()
        self.batcher = None
        self.lm.model = None

    def info(self) -> dict:
        a = self.lm.args
        return {"architecture": a.model_type, "backend": self.backend, "context": self.limit, "vocab": a.vocab_size,
                "layers": a.num_layers, "source": str(self.lm.source), "load_s": round(self.lm.timings.get("total_s", 0.0), 2),
                "quantization": self.lm.quantization(), "weights_mb": round(self.lm.weight_bytes() / 1e6, 1),
                "speculative": self.batcher.drafter.name if self.batcher.drafter is not None else "off",
                "thinking_switch": self.lm.tokenizer.thinking_switch(), "notices": list(self.lm.notices),
                "tool_calls": tool_format(self.lm.tokenizer.chat_template.source),
                "fill_in_middle": fim_markers(self.lm.tokenizer)}


def cache_dtype(lm: LoadedModel, device: torch.device, backend: str) -> str:
    return cache_storage(device.type, lm.is_quantized(), backend, next(lm.model.parameters()).dtype)


def cache_storage(device_type: str, quantized: bool, backend: str, weights_dtype: torch.dtype) -> str:
    """The KV cache's storage: fp16 on torch's CPU backend for quantized weights where Parley's library reads and
    writes it (half the bytes a token, as llama.cpp keeps its cache; each value rounded once as written); else the
    weights' dtype (the dequantized fp32 path keeps transformers' numbers; MLX keeps its own)."""
    from kernels.cpu_native import cpu_kernel

    if backend == "torch" and device_type == "cpu" and quantized and cpu_kernel() is not None:
        return "float16"
    return dtype_name(weights_dtype)


def cache_config_for(args: ModelArgs, config: EngineConfig, dtype: str, preallocate: bool = False) -> CacheConfig:
    """The KV cache of a model's runtime: `max_sessions` slots of the session context (capped by the model's own)."""
    limit = args.max_position_embeddings
    if config.max_session_tokens is not None:
        limit = min(config.max_session_tokens, limit)
    return CacheConfig(layout=config.kv_layout, max_seqs=config.max_sessions, max_seq_len=limit,
                       capacity=config.max_sessions * limit, dtype=dtype, max_step_tokens=config.chunk_tokens,
                       initial_capacity=config.max_sessions * limit if preallocate else None)


def build_runtime(lm: LoadedModel, config: EngineConfig, model_id: int = 0, keep_finished: bool = True,
                  tuning: RuntimeTuning = RuntimeTuning(), draft: LoadedModel | DFlashNet | None = None) -> ModelRuntime:
    """The runtime for a loaded model. `keep_finished`: a finished sequence keeps its cache slot (sessions reuse it
    on their next turn); one-shot runs pass False so that queued prompts take the slots of finished ones. `draft`:
    the loaded draft model of speculative "draft" (engine/speculative/draft_model.py), or the DFlash drafter's
    network of "dflash" (engine/speculative/dflash.py)."""
    args = lm.args
    weights_device = next(lm.model.parameters()).device
    backend = resolve_backend(config.backend, str(weights_device))
    cache_config = cache_config_for(args, config, cache_dtype(lm, weights_device, backend), tuning.preallocate)
    limit = cache_config.max_seq_len
    sched = config.scheduler_config()
    release = not keep_finished
    if backend == "mlx":
        batcher = _mlx_batcher(lm, cache_config, sched, release, make_drafter(config.speculative))
    else:
        if weights_device.type == "meta":
            raise ModelLoadError(f"{lm.name}'s weights were handed to the MLX backend; load it again to run it on torch.")
        configure_process(weights_device, config.compile_decode)  # before this process's first GPU matmul
        kernels = tuning.kernels or choose_kernels(weights_device, compile_decode=config.compile_decode,
                                                   quantized=lm.is_quantized())
        check_first_cache(lm, cache_config, weights_device)
        cache = make_cache(cache_config, args.layer_windows(), args.num_kv_heads, args.head_dim, weights_device)
        if tuning.attention_impl is not None:
            cache.attention_impl = tuning.attention_impl
        runner = ModelRunner(lm.model, cache, sched.max_sampled_rows, graphs=tuning.graphs,
                             compile_decode=config.compile_decode, kernels=kernels, step_advance=tuning.step_advance)
        batcher = Batcher(cache, runner, sched, weights_device, release_on_finish=release, lookahead=config.lookahead,
                          drafter=make_drafter(config.speculative, runner.verify_rows, runner.tiled))
        return_freed_memory()  # the runner's prepare may have replaced matrices by fused ones
    if isinstance(draft, DFlashNet):
        batcher.drafter = dflash_drafter(lm, draft, batcher)
    elif draft is not None:
        batcher.drafter = draft_drafter(lm, draft, config)
    parked_tokens = config.prefix_tokens if config.prefix_tokens is not None else cache_config.capacity // 2
    prefixes = PrefixCache(batcher.cache, config.max_sessions if config.prefix_cache else 0, parked_tokens)
    return ModelRuntime(model_id, lm, backend, batcher, limit, prefixes, config.prefix_cache)


def check_first_cache(lm: LoadedModel, cache_config: CacheConfig, device: torch.device) -> None:
    """Refuses, in one line, a model whose first KV cache does not fit in what its weights left: the load keeps 256 MB
    aside, less than 8 chats of an 8B model take at once (302 MB), so the cache took the last of the memory and the
    first message failed ("can't start new thread" under `ulimit -v`) or the kernel killed Parley."""
    args = lm.args
    need = first_cache_bytes(cache_config, args.layer_windows(), args.num_kv_heads, args.head_dim) + GROWTH_MARGIN
    free = free_bytes(device)
    if need > free:
        where = "GPU memory" if device.type == "cuda" else "memory"
        need_gb, free_gb = gb_pair(need, free)
        chats = f"{cache_config.max_seqs} chat{'' if cache_config.max_seqs == 1 else 's'}"
        raise ModelLoadError(f"{lm.name} loaded, but its cache for {chats} at once needs ~{need_gb} GB more, {free_gb} "
                             f"GB of {where} free.")


def draft_drafter(lm: LoadedModel, draft: LoadedModel, config: EngineConfig) -> Drafter | None:
    """The draft model's drafter: its own runtime, as many slots as the target's, no prefix cache, no drafter. A
    draft model whose tokenizer differs cannot draft: the model loads with prompt lookup and a one-line notice."""
    why = mismatch(draft, lm)
    if why is not None:
        lm.notices.append(f"{draft.name} cannot draft for {lm.name}: {why}; drafting from the prompt instead.")
        return make_drafter("lookup")
    own = replace(config, speculative="off", draft_model=None, prefix_cache=False)
    return DraftModel(build_runtime(draft, own, keep_finished=True), vocab=lm.args.vocab_size)


def dflash_drafter(lm: LoadedModel, net: DFlashNet, batcher: Batcher) -> Drafter | None:
    """The DFlash drafter, where it runs: CPU and CUDA (their tapes and graphs keep the taps; not compiled decode
    graphs, and not MLX, which holds its own copy of the model); elsewhere, or for a model it was not trained for,
    prompt lookup and a notice."""
    device = next(lm.model.parameters()).device
    graphs = getattr(batcher.runner, "graphs", None)
    if device.type not in ("cpu", "cuda") or (graphs is not None and graphs.forward is not graphs.model):
        lm.notices.append("DFlash drafting runs on the CPU and CUDA backends without compiled decode graphs so far; "
                          "drafting from the prompt instead.")
        return batcher.drafter
    try:  # drafting for two sequences a step at most, on CUDA too: all eight drafting measured 0.10-0.25x of off
        return DFlashDrafter(net.to(device), lm.model, batcher.cache)
    except ValueError as exc:
        lm.notices.append(f"The DFlash drafter cannot draft for {lm.name}: {exc}; drafting from the prompt instead.")
        return batcher.drafter


def _mlx_batcher(lm: LoadedModel, cache_config: CacheConfig, sched: SchedulerConfig, release: bool,
                 drafter: Drafter | None) -> Batcher:
    """A Batcher whose model, cache and runner are MLX (its weights converted from the loaded torch model).
    Quantized matrices stay quantized, the same weights exactly; the conversion runs once per loaded model and
    releases the torch copy, a float model's too (its modules stay on the meta device: `lm.quantization()`,
    `lm.weight_bytes()` still read them, but the torch backend cannot run that model any more)."""
    from engine.mlx_backend.cache import MLXSequenceKVCache
    from engine.mlx_backend.quantized import held_in_mlx
    from engine.mlx_backend.runner import MLXRunner

    args = lm.args
    dtype = str(next(lm.model.parameters()).dtype).removeprefix("torch.")
    model = held_in_mlx(lm.model, args, dtype)
    cache = MLXSequenceKVCache(cache_config, args.layer_windows(), args.num_kv_heads, args.head_dim)
    runner = MLXRunner(model, cache, sched.max_sampled_rows)
    return Batcher(cache, runner, sched, "cpu", release, drafter=drafter)
