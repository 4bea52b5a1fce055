"""ModelRuntime: one loaded model with its own KV cache and batcher. The engine thread steps each in turn."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.backend import mlx_batcher, resolve_backend
from engine.batcher import Batcher
from engine.runner import ModelRunner
from engine.cache import CacheConfig, make_cache
from engine.cache.config import dtype_name
from engine.loading.loader import LoadedModel
from engine.scheduler import SchedulerConfig


@dataclass(slots=True)
class EngineConfig:
    kv_layout: str = "sequence"
    max_sessions: int = 8  # cache slots per model: sessions generating at once; more wait in a queue
    max_session_tokens: int = 8192  # each session's context, capped by the model's own
    step_tokens: int = 512  # token budget of one forward (chunked prefill keeps other chats moving)
    chunk_tokens: int = 256
    max_sampled_rows: int = 64
    device: str = "auto"  # auto: CUDA when there is a GPU, else CPU (MLX on Apple silicon: see backend)
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    backend: str = "auto"  # auto: CUDA torch, else MLX on Apple silicon, else CPU torch
    lookahead: bool | None = None  # launch the next decode step before reading this one's ids; None: with CUDA graphs
    compile_decode: bool = False  # CUDA: torch.compile the decode graphs (~5 % faster than the fused kernels; 15-60 s per batch size, once)
    cache_dir: Path | None = None  # converted GGUF weights

    def __post_init__(self) -> None:
        SchedulerConfig(self.step_tokens, self.chunk_tokens, self.max_sampled_rows)  # validates


class ModelRuntime:
    def __init__(self, model_id: int, lm: LoadedModel, config: EngineConfig):
        self.model_id, self.lm = model_id, lm
        args = lm.args
        self.limit = min(config.max_session_tokens, args.max_position_embeddings)
        cache_config = CacheConfig(
            layout=config.kv_layout,
            max_seqs=config.max_sessions,
            max_seq_len=self.limit,
            capacity=config.max_sessions * self.limit,
            dtype=dtype_name(next(lm.model.parameters()).dtype),
            max_step_tokens=config.chunk_tokens,
        )
        sched = SchedulerConfig(config.step_tokens, config.chunk_tokens, config.max_sampled_rows)
        self.backend = resolve_backend(config.backend, str(next(lm.model.parameters()).device))
        if self.backend == "mlx":
            self.batcher = mlx_batcher(lm, cache_config, sched, release_on_finish=False)
            self.device = torch.device("cpu")  # samplers run in torch on the host
            return
        device = self.device = next(lm.model.parameters()).device
        cache = make_cache(cache_config, args.layer_windows(), args.num_kv_heads, args.head_dim, device)
        runner = ModelRunner(lm.model, cache, sched.max_sampled_rows, compile_decode=config.compile_decode)
        self.batcher = Batcher(lm.model, cache, sched, device, release_on_finish=False, runner=runner,
                               lookahead=config.lookahead)

    @property
    def scheduler(self):
        return self.batcher.scheduler

    @property
    def cache(self):
        return self.batcher.cache

    def close(self) -> None:
        """Waits for queued device work and drops the model and cache (on the engine thread)."""
        if self.backend == "mlx":
            import mlx.core as mx

            mx.synchronize()
        self.batcher = None
        self.lm.model = None

    def has_work(self) -> bool:
        return self.batcher.has_work()

    def info(self) -> dict:
        a = self.lm.args
        return {"architecture": a.model_type, "backend": self.backend, "context": self.limit, "vocab": a.vocab_size, "layers": a.num_layers,
                "source": str(self.lm.source), "load_s": round(self.lm.timings.get("total_s", 0.0), 2)}
