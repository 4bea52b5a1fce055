"""Llama-architecture GGUF files of real models' shapes with random weights, quantized to Q4_K_M (Q5_K_M, Q6_K, Q8_0) by
llama.cpp; and gpt-oss-architecture ones (its biases, sinks, 128-key windows, YaRN), their experts quantized to MXFP4 as
llama.cpp writes gpt-oss (`--kind MXFP4_MOE`), or written as random MXFP4 blocks beside F16 (`--raw-mxfp4`).

    python bench/synthetic_gguf.py --shape llama-1b [--out-dir DIR] [--f16] [--kind Q5_K_M|Q6_K|Q8_0]

Writes <out-dir>/synthetic-<shape>-<kind>.gguf (skipped when it exists) through an F16 file next to it, deleted
afterwards (`--f16`: the F16 file is the result, synthetic-<shape>-F16.gguf; no llama.cpp needed, as on the device) (llama-8b: ~16 GB of disk for a while). Tensors are generated and written one at a time, so memory holds
one tensor (at most the 1 GB F16 embedding of llama-8b). The vocabulary is a byte-level BPE of the model's size:
256 byte tokens, byte pairs, byte triples and Llama 3's special tokens, enough for llama.cpp and Parley to tokenize.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import tempfile
import time
import zlib
from dataclasses import dataclass
from itertools import islice, product
from pathlib import Path

import gguf
import numpy as np
import torch

STD = 0.02
N_SPECIAL = 256  # Llama 3's <|begin_of_text|>, <|end_of_text|>, reserved tokens, <|eot_id|>
BOS, EOS, EOT = 128000, 128001, 128009


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool
    rope_factor: float  # llama3 rope scaling, stored as the rope_freqs tensor like the converter does
    head_dim: int = 64
    vocab: int = 128256
    rope_theta: float = 500000.0
    context: int = 8192
    rms_eps: float = 1e-5
    experts: int = 0  # a mixture of experts (Mixtral's layout: "llama" with stacked experts; `ffn` each expert's)
    experts_used: int = 0
    arch: str = "llama"  # or "gpt-oss": biases on attention, router and experts, sinks, alternating 128-key windows


SHAPES = {
    "llama-1b": Shape(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, tied=True, rope_factor=32.0),
    "llama-draft": Shape(hidden=256, layers=4, heads=4, kv_heads=2, ffn=768, tied=True, rope_factor=32.0),  # drafts
    # for the others (same vocabulary and tokenizer): the cost side of speculative "draft" (bench/speculative.py)
    # Gemma 3 270M's layer widths and depth in Llama form, with the others' vocabulary: the issue's device draft
    "llama-270m": Shape(hidden=640, layers=18, heads=10, kv_heads=2, ffn=2048, tied=True, rope_factor=32.0),
    # a small mixture of experts: 32 experts of 768, 4 per token (Qwen3-30B-A3B: 128 of 768, 8 per token)
    "moe-mini": Shape(hidden=1024, layers=16, heads=16, kv_heads=4, ffn=768, tied=True, rope_factor=32.0, experts=32,
                      experts_used=4),
    # Qwen3-30B-A3B's layers (2048 wide, 32 heads of 128 over 4 KV heads, 128 experts of 768, 8 per token), 6 of its 48
    "moe-30b-slice": Shape(hidden=2048, layers=6, heads=32, kv_heads=4, ffn=768, tied=False, rope_factor=32.0,
                           head_dim=128, experts=128, experts_used=8),
    "llama-8b": Shape(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, tied=False, rope_factor=8.0,
                      head_dim=128),
    # gpt-oss-20b's layers (2880 wide, 64 heads of 64 over 8 KV heads, 32 experts of 2880, 4 per token), 8 of its 24
    "gpt-oss-20b-slice": Shape(hidden=2880, layers=8, heads=64, kv_heads=8, ffn=2880, tied=False, rope_factor=32.0,
                               experts=32, experts_used=4, arch="gpt-oss", rope_theta=150000.0, context=131072),
    # gpt-oss-20b's 24 layers (with the others' 128,256-token vocabulary, not its 201,088: the synthetic byte-level
    # vocabulary stops short of it); `--raw-mxfp4` writes it without llama.cpp
    "gpt-oss-20b": Shape(hidden=2880, layers=24, heads=64, kv_heads=8, ffn=2880, tied=False, rope_factor=32.0,
                         experts=32, experts_used=4, arch="gpt-oss", rope_theta=150000.0, context=131072),
}
MXFP4_EXPONENTS = (119, 122)  # random MXFP4 blocks' scales 2^-8 .. 2^-6: weights of about STD's size


FTYPES = {"Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",  # llama.cpp's quantizer mixes
          "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "MXFP4_MOE": "LLAMA_FTYPE_MOSTLY_MXFP4_MOE"}


def synthetic_gguf(shape: str, out_dir: Path, quantize: bool = True, kind: str = "Q4_K_M",
                   raw_mxfp4: bool = False) -> Path:
    """The `kind` (a key of FTYPES) file of `shape` (a key of SHAPES) in `out_dir` (`quantize` False: the F16 file;
    `raw_mxfp4`: F16 with the experts written as random MXFP4 blocks, no quantizer run), written unless it is there."""
    out_dir = Path(out_dir)
    target = out_dir / f"synthetic-{shape}-{'F16-MXFP4' if raw_mxfp4 else kind if quantize else 'F16'}.gguf"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    if not quantize or raw_mxfp4:
        part = out_dir / f".{target.name}.part"
        write_f16(SHAPES[shape], part, f"synthetic-{shape}", raw_mxfp4)
        os.replace(part, target)
        return target
    f16 = out_dir / f".synthetic-{shape}-F16.gguf"
    part = out_dir / f".synthetic-{shape}-{kind}.gguf.part"
    try:
        write_f16(SHAPES[shape], f16, f"synthetic-{shape}")
        quantize_mix(f16, part, kind)
        os.replace(part, target)  # only a finished file counts as cached
    finally:
        f16.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return target


def quantize_mix(src: Path, dst: Path, kind: str = "Q4_K_M", threads: int | None = None) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[kind])
    params.nthread = threads or os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} (code {rc})")


# -- the F16 file


def write_f16(s: Shape, path: Path, name: str, raw_mxfp4: bool = False) -> None:
    """Header, vocab and tensor table first, then each tensor generated and written in turn (`raw_mxfp4`: the experts'
    matrices as random MXFP4 blocks)."""
    w = gguf.GGUFWriter(path, s.arch)
    _write_header(w, s, name)
    tensors = [(t, dims, "mxfp4" if raw_mxfp4 and kind == "matrix" and "_exps." in t else kind)
               for t, dims, kind in _tensors(s)]
    for tname, dims, kind in tensors:
        if kind == "mxfp4":
            shape = (*dims[:-1], dims[-1] // 32 * 17)
            w.add_tensor_info(tname, shape, np.dtype(np.uint8), math.prod(shape),
                              raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            continue
        dtype = np.float16 if kind == "matrix" else np.float32
        w.add_tensor_info(tname, dims, np.dtype(dtype), math.prod(dims) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, dims, kind in tensors:
        w.write_tensor_data(_mxfp4_values(tname, dims) if kind == "mxfp4" else _values(s, tname, dims, kind))
    w.close()


def _mxfp4_values(name: str, dims: tuple[int, ...]) -> np.ndarray:
    """Random MXFP4 blocks of a (…, K) matrix: (…, K/32 · 17) bytes, each an exponent byte then 16 of nibbles."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    blocks = rng.integers(0, 256, (*dims[:-1], dims[-1] // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(*MXFP4_EXPONENTS, blocks.shape[:-1], dtype=np.uint8)
    return blocks.reshape(*dims[:-1], -1)


def _tensors(s: Shape):
    """(name, numpy shape, kind) in the converter's order; kind: matrix (random F16), norm (ones), rope."""
    if s.arch == "gpt-oss":
        yield from _gpt_oss_tensors(s)
        return
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    yield "rope_freqs.weight", (s.head_dim // 2,), "rope"
    yield "token_embd.weight", (s.vocab, s.hidden), "matrix"
    for i in range(s.layers):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (s.hidden,), "norm"
        yield f"{b}.attn_q.weight", (q, s.hidden), "matrix"
        yield f"{b}.attn_k.weight", (kv, s.hidden), "matrix"
        yield f"{b}.attn_v.weight", (kv, s.hidden), "matrix"
        yield f"{b}.attn_output.weight", (s.hidden, q), "matrix"
        yield f"{b}.ffn_norm.weight", (s.hidden,), "norm"
        if s.experts:  # the router stays F32, as the converter and llama.cpp's quantizer keep it
            yield f"{b}.ffn_gate_inp.weight", (s.experts, s.hidden), "router"
            yield f"{b}.ffn_gate_exps.weight", (s.experts, s.ffn, s.hidden), "matrix"
            yield f"{b}.ffn_up_exps.weight", (s.experts, s.ffn, s.hidden), "matrix"
            yield f"{b}.ffn_down_exps.weight", (s.experts, s.hidden, s.ffn), "matrix"
            continue
        yield f"{b}.ffn_gate.weight", (s.ffn, s.hidden), "matrix"
        yield f"{b}.ffn_up.weight", (s.ffn, s.hidden), "matrix"
        yield f"{b}.ffn_down.weight", (s.hidden, s.ffn), "matrix"
    yield "output_norm.weight", (s.hidden,), "norm"
    if not s.tied:
        yield "output.weight", (s.vocab, s.hidden), "matrix"


def _gpt_oss_tensors(s: Shape):
    """gpt-oss's tensors in llama.cpp's names: every projection with its bias, sinks, experts apart (gate, up, down)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    yield "token_embd.weight", (s.vocab, s.hidden), "matrix"
    for i in range(s.layers):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (s.hidden,), "norm"
        for name, rows, cols in (("attn_q", q, s.hidden), ("attn_k", kv, s.hidden), ("attn_v", kv, s.hidden),
                                 ("attn_output", s.hidden, q)):
            yield f"{b}.{name}.weight", (rows, cols), "matrix"
            yield f"{b}.{name}.bias", (rows,), "bias"
        yield f"{b}.attn_sinks.weight", (s.heads,), "bias"
        yield f"{b}.post_attention_norm.weight", (s.hidden,), "norm"
        yield f"{b}.ffn_gate_inp.weight", (s.experts, s.hidden), "router"
        yield f"{b}.ffn_gate_inp.bias", (s.experts,), "bias"
        for name, rows, cols in (("gate", s.ffn, s.hidden), ("up", s.ffn, s.hidden), ("down", s.hidden, s.ffn)):
            yield f"{b}.ffn_{name}_exps.weight", (s.experts, rows, cols), "matrix"
            yield f"{b}.ffn_{name}_exps.bias", (s.experts, rows), "bias"
    yield "output_norm.weight", (s.hidden,), "norm"
    yield "output.weight", (s.vocab, s.hidden), "matrix"


def _values(s: Shape, name: str, dims: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "norm":
        return np.ones(dims, dtype=np.float32)
    if kind == "rope":
        return llama3_rope_factors(s)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))  # the same file every time
    if kind == "router":
        return torch.empty(dims, dtype=torch.float32).normal_(0.0, 1.0, generator=g).numpy() / math.sqrt(dims[1])
    if kind == "bias":
        return torch.empty(dims, dtype=torch.float32).normal_(0.0, 0.1, generator=g).numpy()
    return torch.empty(dims, dtype=torch.float16).normal_(0.0, STD, generator=g).numpy()


def llama3_rope_factors(s: Shape, low: float = 1.0, high: float = 4.0, old_ctx: int = 8192) -> np.ndarray:
    """The per-frequency divisors llama.cpp stores as rope_freqs.weight for llama3 rope scaling."""
    freqs = 1.0 / (s.rope_theta ** (np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim))
    wavelen = 2 * math.pi / freqs
    smooth = np.clip((old_ctx / wavelen - low) / (high - low), 0.0, 1.0)
    return (1 / ((1 - smooth) / s.rope_factor + smooth)).astype(np.float32)


def _write_header(w: gguf.GGUFWriter, s: Shape, name: str) -> None:
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_block_count(s.layers)
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ffn)
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_vocab_size(s.vocab)
    w.add_rope_dimension_count(s.head_dim)
    if s.arch == "gpt-oss":  # GptOssModel's keys: the window, the experts' width, YaRN over 4,096 positions
        w.add_sliding_window(128)
        w.add_expert_feed_forward_length(s.ffn)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s.rope_factor)
        w.add_rope_scaling_orig_ctx_len(4096)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, merges = byte_level_vocab(s.vocab)
    types = [gguf.TokenType.NORMAL] * (s.vocab - N_SPECIAL) + [gguf.TokenType.CONTROL] * N_SPECIAL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_eot_token_id(EOT)
    w.add_add_bos_token(True)


# -- vocab


def byte_level_vocab(size: int) -> tuple[list[str], list[str]]:
    """(tokens, merges): bytes, then pairs and triples of GPT-2's byte characters (letters and space first), each
    reachable through its merge, then N_SPECIAL Llama 3 special tokens at the end."""
    chars = _byte_chars()
    order = sorted(chars, key=_priority)
    n_normal = size - N_SPECIAL
    pairs = [a + b for a, b in product(order, order)]
    triples = list(islice(product(order[:40], order[:40], order[:40]), n_normal - 256 - len(pairs)))
    if len(triples) < n_normal - 256 - len(pairs):
        raise ValueError(f"a vocab of {size} tokens needs more triples than this scheme makes")
    tokens = chars + pairs + [a + b + c for a, b, c in triples]
    merges = [f"{a} {b}" for a, b in product(order, order)] + [f"{a}{b} {c}" for a, b, c in triples]
    specials = [f"<|reserved_special_token_{i}|>" for i in range(N_SPECIAL)]
    specials[0], specials[1], specials[EOT - BOS] = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
    return tokens + specials, merges


def _byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest map to 256 + n in byte order."""
    keep = {*range(33, 127), *range(161, 173), *range(174, 256)}
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _priority(c: str) -> tuple[int, str]:
    if c.islower() and c.isascii():
        return 0, c
    if c == "Ġ":  # the space byte
        return 1, c
    if c.isascii() and c.isalnum():
        return 2, c
    return (3 if c.isascii() else 4), c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench" / "synthetic")
    ap.add_argument("--f16", action="store_true", help="keep the F16 file; skip llama.cpp's quantizer")
    ap.add_argument("--kind", choices=sorted(FTYPES), default="Q4_K_M")
    ap.add_argument("--raw-mxfp4", action="store_true",
                    help="F16 with the experts as random MXFP4 blocks, written directly (no llama.cpp)")
    a = ap.parse_args()
    start = time.perf_counter()
    path = synthetic_gguf(a.shape, a.out_dir, quantize=not a.f16, kind=a.kind, raw_mxfp4=a.raw_mxfp4)
    print(json.dumps(dict(shape=a.shape, path=str(path), file_bytes=path.stat().st_size,
                          seconds=round(time.perf_counter() - start, 1))), flush=True)


if __name__ == "__main__":
    main()
