"""Decode speed on one GPU, quantized weights (Q4_K_M's layout: int4 groups, int8 rows where the file has Q6_K) vs
the bf16 path, same model shape, same engine runtime (CUDA graphs, fused kernels), in one process.

Random weights (speed does not depend on their values): a Q4_K_M file holds Q4_K for most matrices and Q6_K for
the output matrix, attn_v and ffn_down of llama.cpp's "more bits" layers, and Q5_0 / Q8_0 for matrices whose rows
are not whole 256-wide super-blocks (the embedded 270M's); here Q4_K becomes the int4 layout of
kernels/quant_linear_triton.py and every other type int8 rows, as a loaded GGUF does. Per session count: prompt 128, 128 new
tokens, greedy; the median host-to-host decode step, and the decode's tokens per second (its tokens over its steps'
time: steps that verify prompt-lookup drafts yield more than one token a session). Prints JSON lines: shape, weights,
sessions, ms_per_step, tok_s, weight_mb, and on the quantized rows speedup_vs_bf16 (by tok_s). With --profile, each
run's decode kernels as well (torch's profiler over 16 steps): their GPU µs per step by kernel, the largest first, and
their sum against the step's time. With --cublas, a third run per shape: bf16 with cuBLAS's GEMMs in place of the
engine's Triton decode GEMMs (weights "bf16-cublas"; faster or not, cuBLAS picks its kernel by the row count, so a
row's bits may change with the step's rows: a reference, not an engine path), and speedup_vs_cublas on the others.

    python -m bench.quant_gpu --shapes llama-8b gemma-270m --sessions 1 8 64 [--profile] [--cublas]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

import torch

from bench.decode_gpu import NEW, PROMPT, gemma270m_args, make_batcher, profiled_steps, prompts, run_parley
from engine.models.args import GLOBAL, ModelArgs, RopeArgs
from engine.models import architecture
from engine.quant.weight import CHUNK, QuantTensor


def llama_args(hidden: int, intermediate: int, layers: int, heads: int, head_dim: int, tied: bool,
               max_len: int = 8192) -> ModelArgs:
    """A Llama-3 shape (vocabulary 128,256, 8 KV heads)."""
    return ModelArgs(model_type="llama", vocab_size=128256, hidden_size=hidden, intermediate_size=intermediate,
                     num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=head_dim, rms_norm_eps=1e-5,
                     rope={GLOBAL: RopeArgs(500000.0)}, layer_types=[GLOBAL] * layers, max_position_embeddings=max_len,
                     tie_word_embeddings=tied, hidden_act="silu")


def llama8b_args(max_len: int = 8192) -> ModelArgs:
    return llama_args(4096, 14336, 32, 32, 128, tied=False, max_len=max_len)


def qwen3_moe_args(max_len: int = 8192) -> ModelArgs:
    """Qwen3-30B-A3B's shape: 48 layers, each token through 8 of 128 experts of 768 (3.3B of 30.5B weights a token)."""
    return ModelArgs(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, rms_norm_eps=1e-6,
                     rope={GLOBAL: RopeArgs(1000000.0)}, layer_types=[GLOBAL] * 48, max_position_embeddings=max_len,
                     qk_norm=True, num_experts=128, experts_per_token=8, moe_intermediate_size=768)


SHAPES = {"llama-8b": llama8b_args, "gemma-270m": gemma270m_args, "qwen3-30b-a3b": qwen3_moe_args,
          "llama-1b": lambda: llama_args(2048, 8192, 16, 32, 64, tied=True),  # Llama-3.2-1B
          "llama-3b": lambda: llama_args(3072, 8192, 28, 24, 128, tied=True)}  # Llama-3.2-3B


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M rule for attn_v and ffn_down: Q6_K in the first and last eighth and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_type(name: str, args: ModelArgs, k: int) -> str:
    """The type llama.cpp's Q4_K_M gives a matrix of rows `k` wide: K-quants need whole 256-wide super-blocks, else
    its fallback (Q4_K → Q5_0, Q6_K → Q8_0), as the embedded Gemma 3 270M's 640-wide q/k/v, gate/up and embedding."""
    if name in ("lm_head.weight",) or (name == "model.embed_tokens.weight" and args.tie_word_embeddings):
        kind = "Q6_K"
    elif ".v_proj." in name or ".down_proj." in name:
        kind = "Q6_K" if more_bits(int(name.split(".")[2]), args.num_layers) else "Q4_K"
    else:
        kind = "Q4_K"
    return kind if k % 256 == 0 else {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[kind]


def random_quant(shape: tuple[int, int], type_name: str, device: torch.device, g: torch.Generator) -> QuantTensor:
    n, k = shape
    if type_name == "Q4_K":
        kp = -(-k // CHUNK) * CHUNK  # the layout's padded width (all shapes here are whole chunks)
        words = torch.randint(-2**31, 2**31 - 1, (n, kp // 8), dtype=torch.int32, device=device, generator=g)
        scales = torch.empty(n, kp // 32, dtype=torch.bfloat16, device=device).uniform_(0.001, 0.004, generator=g)
        zeros = torch.empty(n, kp // 32, dtype=torch.bfloat16, device=device).normal_(0, 0.002, generator=g)
        bits = torch.stack([scales, zeros]).view(torch.int16).int() & 0xFFFF
        pairs = (bits[..., 0::4] | bits[..., 2::4] << 16, bits[..., 1::4] | bits[..., 3::4] << 16)  # (2, N, C) each
        pairs = torch.stack([pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1]], dim=-1).contiguous()
        return QuantTensor("int4", (n, k), type_name, words=words, pairs=pairs)
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=device, generator=g)
    scale = torch.full((n,), 0.02 / 127, dtype=torch.bfloat16, device=device)
    return QuantTensor("int8", (n, k), type_name, codes=codes, scale=scale)


def build(args: ModelArgs, quantized: bool, device: torch.device, seed: int = 0):
    """The architecture's module on `device` with random weights: bf16 matrices, or quantized ones."""
    arch = architecture(args.model_type)
    with torch.device("meta"):
        model = arch.Model(args)
    g = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, t in model.state_dict().items():
        if quantized and t.dim() == 2:
            kind = q4_k_m_type(name, args, t.shape[1])
            model.install_quantized(name.removesuffix(".weight"), random_quant(tuple(t.shape), kind, device, g),
                                    torch.bfloat16)
        else:
            std = 0.1 if name.endswith("norm.weight") else 0.02
            state[name] = torch.randn(t.shape, device=device, generator=g, dtype=torch.bfloat16) * std
    model.load_state_dict(state, strict=False, assign=True)
    model.reset_buffers(device)
    return model.eval().requires_grad_(False)


def weight_mb(model) -> float:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def kernel_profile(batcher, prompt_ids: list[list[int]], steps: int = 16, top: int = 24) -> dict:
    """GPU time per decode step by kernel over `steps` steps after the prompts are in (the graphs already captured)."""
    prof = profiled_steps(batcher, prompt_ids, steps, first_id=100)
    us: dict[str, float] = defaultdict(float)
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name[:60]] += e.device_time / steps
            spans.append((e.time_range.start, e.time_range.end, e.name[:40]))
    ranked = sorted(us.items(), key=lambda kv: -kv[1])
    return {"kernel_us_per_step": round(sum(us.values()), 1), **_idle(sorted(spans), steps),
            "top": [[name, round(t, 1)] for name, t in ranked[:top]]}


def _idle(spans: list[tuple[float, float, str]], steps: int) -> dict:
    """The GPU's busy time (the union of its kernels' intervals) per step, and the longest idle gaps with the kernels
    on either side: where a step waits on the host."""
    busy, gaps, end, last = 0.0, [], None, ""
    for start, stop, name in spans:
        if end is None or start > end:
            if end is not None:
                gaps.append((start - end, last, name))
            busy += stop - start
            end, last = stop, name
        elif stop > end:
            busy += stop - end
            end, last = stop, name
    gaps.sort(reverse=True)
    return {"gpu_busy_us_per_step": round(busy / steps, 1), "idle_us_per_step": round(sum(g[0] for g in gaps) / steps, 1),
            "longest_idle": [[round(g, 1), a, b] for g, a, b in gaps[:6]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["llama-8b", "gemma-270m"])
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--rounds", type=int, default=2, help="bf16 and quantized alternate this many times")
    ap.add_argument("--profile", action="store_true", help="also each run's GPU time per decode step by kernel")
    ap.add_argument("--speculative", default="auto", choices=("auto", "off", "lookup"))
    ap.add_argument("--cublas", action="store_true", help="also bf16 through cuBLAS's GEMMs (a reference)")
    ap.add_argument("--verify-rows", type=int, nargs="+", default=[0],
                    help="rows a quantized step with drafts may take (0: the runner's own, ModelRunner.verify_rows); "
                    "each a run against bf16 with its runner's own")
    ap.add_argument("--moe-group-rows", type=int, default=None,
                    help="a mixture's steps group their (row, expert) pairs by expert from this many rows on "
                    "(SparseMoE.group_rows; a huge value: never)")
    opts = ap.parse_args()
    from engine.models.kernel_choice import _pdl
    from engine.models.moe import SparseMoE

    if opts.moe_group_rows is not None:
        SparseMoE.group_rows = opts.moe_group_rows
    from engine.process import configure_process

    device = torch.device("cuda")
    configure_process(device, compile_decode=False)
    tgemm = _pdl(device)
    for shape in opts.shapes:
        args = SHAPES[shape]()
        best: dict[tuple, float] = {}  # the best tok_s per (weights, sessions, verify rows)
        for _ in range(opts.rounds):
            for weights in ("bf16-cublas", "bf16", "quantized") if opts.cublas else ("bf16", "quantized"):
                model = build(args, weights == "quantized", device)
                for n in opts.sessions:
                    for rows in opts.verify_rows if weights == "quantized" else [0]:  # bf16: the runner's own
                        b = make_batcher(model, args, n, PROMPT + NEW + 16, graphs=True, fused_kernels=True,
                                         decode_gemm=tgemm and weights != "bf16-cublas", speculative=opts.speculative)
                        if rows:  # a bench override of the runner's choice, for the drafter too
                            b.runner.verify_rows = rows
                            if b.drafter is not None:
                                b.drafter.max_sequences = rows
                        row = {"shape": shape, "weights": weights, "sessions": n, "verify_rows": b.runner.verify_rows,
                               "speculative": opts.speculative, **timed(b, args, n),
                               "weight_mb": round(weight_mb(model), 1)}
                        if args.num_experts:
                            row["moe_group_rows"] = SparseMoE.group_rows
                        key = weights, n, rows
                        best[key] = max(row["tok_s"], best.get(key, 0.0))
                        if weights == "quantized" and ("bf16", n, 0) in best:
                            row["speedup_vs_bf16"] = round(row["tok_s"] / best["bf16", n, 0], 3)
                        if weights != "bf16-cublas" and ("bf16-cublas", n, 0) in best:
                            row["speedup_vs_cublas"] = round(row["tok_s"] / best["bf16-cublas", n, 0], 3)
                        if opts.profile:
                            row |= kernel_profile(b, prompts(args, n, seed=3))
                        print(json.dumps(row), flush=True)
                        del b
                del model
                torch.cuda.empty_cache()
        for n in opts.sessions:
            for rows in opts.verify_rows:
                if ("quantized", n, rows) in best and ("bf16", n, 0) in best:
                    summary = {"shape": shape, "sessions": n, "verify_rows": rows or "runner's",
                               "best_bf16_tok_s": best["bf16", n, 0],
                               "best_quantized_tok_s": best["quantized", n, rows],
                               "speedup_vs_bf16": round(best["quantized", n, rows] / best["bf16", n, 0], 3)}
                    if ("bf16-cublas", n, 0) in best:
                        cublas = best["bf16-cublas", n, 0]
                        summary |= {"best_cublas_tok_s": cublas,
                                    "speedup_vs_cublas": round(best["quantized", n, rows] / cublas, 3)}
                    print(json.dumps(summary), flush=True)


def timed(batcher, args: ModelArgs, n: int) -> dict:
    """A warm-up run (it captures the graphs), then a timed one: its median step, p90 and decode tokens per second."""
    run_parley(batcher, prompts(args, n))
    generated, times = run_parley(batcher, prompts(args, n, seed=2))
    ms = statistics.median(times) * 1e3
    graphs = batcher.runner.graphs
    decoded = sum(len(g) for g in generated) - n  # the first token of each comes from its prefill step
    row = {"ms_per_step": round(ms, 4), "p90_ms": round(statistics.quantiles(times, n=10)[-1] * 1e3, 4),
           "tok_s": round(decoded / sum(times), 1), "steps": len(times)}
    if graphs is None:  # a mixture of experts: eager steps
        return row | {"graphs": False}
    return row | {"graph_replays": graphs.replays, "verify_replays": graphs.verify_replays,
                  "graph_captures": graphs.captures}


if __name__ == "__main__":
    main()
