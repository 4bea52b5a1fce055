"""Quantized torch models (engine/quant) held quantized in MLX, with the same weights to the last bit.

MLX's affine format: per group of `group_size` along a row, w = q·scale + bias, q unsigned and packed low bits
first into uint32 words (element i of a word in bits [bits·i, bits·(i+1))). The CPU formats map onto it exactly:
  int4  w = (c - 8)·s + z per 32 (torch int4pack)  -> bits 4, group 32: q = c, scale = s, bias = z - 8s
  int8  w = c·s, one s per row, c in -127..127      -> bits 8, the largest group (128, 64, 32) dividing K:
                                                       q = c + 128, scale = s (every group of the row), bias = -128s
  bf16  a plain bf16 matrix
  blocks  w = u·s + o per 32 (x86 only; an Apple CPU never builds it) -> the same bits and group, as they are;
        MXFP4's 4-bit floats (gpt-oss's experts) -> MLX's own "mxfp4" mode (4 bits and an exponent byte per 32)
q·scale is exact in fp32 (4 or 8 bits times bf16's 8) and so is bias whenever it is held exactly, so MLX's q·scale +
bias is the one rounding of the same real number as torch's (c - 8)·s + z: the fp32 weights are identical.
Scales and biases are bf16 (torch's own size) when bf16 holds the bias exactly: int8 always, int4 when z - 8s fits
(Q4_0, whose z is 0); otherwise fp32 (Q4_1, Q4_K: z and 8s are two bf16 numbers whose difference needs more bits),
and a bias even fp32 cannot hold (exponents 16+ apart) is rounded and counted in the report.
In quantized_matmul MLX promotes the scales to the activations' dtype (fp32 here): products use those exact weights.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import torch

from engine.memory import return_freed_memory
from engine.mlx_backend.model import DTYPES, CausalLM, QuantizedEmbedding, QuantizedLinear
from engine.models.args import ModelArgs
from engine.models.layers import QuantEmbedding, QuantLinear
from engine.models.moe import keeps_fp32
from engine.quant.gguf_blocks import GROUP
from engine.quant.weight import QuantTensor, _int4_block

INT8_GROUPS = (128, 64, 32)  # MLX's affine group sizes, largest first: fewest scales for one per-row scale
CHUNK_BYTES = 64 << 20  # int4 codes unpacked at a time (bounds the conversion's scratch)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass(slots=True)
class Matrix:
    """One converted matrix: packed codes with scales and biases (bits set), or a plain bf16 `weight`."""

    weight: mx.array
    bits: int | None = None
    group_size: int = 0
    scales: mx.array | None = None
    biases: mx.array | None = None
    inexact: int = 0  # groups whose bias could not be held exactly
    mode: str = "affine"  # or "mxfp4": 4-bit floats times a power of two per group, no biases

    def rows(self, start: int, stop: int) -> Matrix:
        cut = (lambda a: None if a is None else a[start:stop])
        return Matrix(self.weight[start:stop], self.bits, self.group_size, cut(self.scales), cut(self.biases),
                      self.inexact, self.mode)

    def arrays(self) -> dict[str, mx.array]:
        if self.bits is None:
            return {"weight": self.weight}
        return {"weight": self.weight, "scales": self.scales} | ({} if self.biases is None else {"biases": self.biases})


@dataclass(slots=True)
class ConversionReport:
    formats: dict[str, int] = field(default_factory=dict)  # "int4" / "int8" / "bf16" / "blocks" / "mxfp4" -> count
    fp32_scales: int = 0  # int4 matrices whose biases needed fp32 scales and biases
    inexact_groups: int = 0  # groups whose bias no float32 holds exactly (rounded): 0 for every GGUF type tried


def held_in_mlx(torch_model: torch.nn.Module, args: ModelArgs, dtype: str) -> CausalLM:
    """The model's MLX twin (quantized or float), converted on first use; the torch copy's weights are released then
    (its modules stay, on the meta device, so summaries and byte counts still read them; a float model's copy kept
    beside the twin doubled its memory: +1,036 MB resident for the embedded Gemma dequantized) and the twin is kept
    on it, so later runtimes of the same loaded model reuse it."""
    held = getattr(torch_model, "mlx_model", None)
    if held is None:
        held = from_torch_quantized(args, torch_model, dtype, release=True)
        torch_model.mlx_model = held
        return_freed_memory()
    return held


def from_torch_quantized(args: ModelArgs, torch_model: torch.nn.Module, dtype: str = "float32",
                         release: bool = False) -> CausalLM:
    """The MLX model of a torch model, its QuantLinear/QuantEmbedding matrices held quantized and the rest as floats
    (fused q/k/v and gate/up are split back). `release`: each torch tensor moves to the meta device once converted
    (peak: the model plus one matrix)."""
    if sys.byteorder != "little":
        raise RuntimeError("MLX's packed layout is built here from little-endian bytes.")
    model = CausalLM(args, dtype)
    target = DTYPES[dtype]
    report = ConversionReport()
    weights: dict[str, mx.array] = {}
    for path, module in list(torch_model.named_modules()):
        if isinstance(module, QuantTensor):
            continue  # read through its QuantLinear / QuantEmbedding
        if isinstance(module, (QuantLinear, QuantEmbedding)):
            m = convert(module.qweight)
            kind = "mxfp4" if m.mode == "mxfp4" else module.qweight.format
            report.formats[kind] = report.formats.get(kind, 0) + 1
            report.inexact_groups += m.inexact
            report.fp32_scales += int(m.bits == 4 and m.scales.dtype == mx.float32)
            bias = getattr(module, "bias", None)
            bias = None if bias is None else _float(bias, target)
            new = {}
            for name, part, part_bias in _split(path, m, bias, args):
                _install(model, name, part, part_bias, isinstance(module, QuantEmbedding))
                new.update({f"{name}.{k}": a for k, a in part.arrays().items()})
                if part_bias is not None:
                    new[f"{name}.bias"] = part_bias
        else:
            new = {name: part.weight for key, t in _own_state(module)
                   for name, part, _ in _split(path, Matrix(_float(t, mx.float32 if keeps_fp32(f"{path}.{key}", args)
                                                                  else target)), None, args, leaf=key)}
        weights.update(new)
        if release:
            mx.eval(list(new.values()))
            for sub in module.modules() if isinstance(module, (QuantLinear, QuantEmbedding)) else [module]:
                _release(sub)
    if release:
        for module in torch_model.modules():
            _release(module)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    model.conversion = report
    return model


def convert(qt: QuantTensor) -> Matrix:
    """A QuantTensor in MLX's affine format (or plain bf16), exactly."""
    n, k = qt.shape
    if qt.format == "bf16":
        return Matrix(_bf16(qt.weight))
    if qt.format == "int8":
        group = next(g for g in INT8_GROUPS if k % g == 0)  # int8_fits: k % 32 == 0
        q = (qt.codes.view(torch.uint8) ^ 0x80).numpy()  # two's complement + 128 = the sign bit flipped
        s = qt.scale.double()[:, None].expand(n, k // group)
        scales, biases, inexact = _scales_biases(s, -128 * s)
        return Matrix(mx.array(q.view(np.uint32)), 8, group, scales, biases, inexact)
    if qt.format == "int4":
        packed = np.empty((n, k // 8), dtype=np.uint32)
        step = max(_int4_block(), CHUNK_BYTES // k // _int4_block() * _int4_block())
        for start in range(0, n, step):
            c = _int4_codes(qt.packed, k, start, min(n, start + step))
            packed[start : start + len(c)] = np.ascontiguousarray(c[:, 0::2] | (c[:, 1::2] << 4)).view(np.uint32)
        s = qt.scale_zero[..., 0].t().double()  # (N, K/32)
        z = qt.scale_zero[..., 1].t().double()
        scales, biases, inexact = _scales_biases(s, z - 8 * s)
        return Matrix(mx.array(packed), 4, GROUP, scales, biases, inexact)
    if qt.format == "blocks":
        return _blocks(qt)
    raise ValueError(f"no MLX layout for format {qt.format!r}")


def _blocks(qt: QuantTensor) -> Matrix:
    """The x86 CPU kernel's block codes (w = s·u + o per group): groups of 32 map onto MLX's affine format as they
    are; groups of 16 (Q6_K), which MLX has no size for, are held as their exact fp32 values."""
    from kernels.cpu_qgemm import unpack_codes

    from engine.quant.block_codes import CodeLayout, layout, superblock_codes

    lay, (n, k) = qt.code_layout, qt.shape
    if lay.group != GROUP:
        return Matrix(mx.array(qt.dequantize().numpy()))
    if lay.lut and (held := _mxfp4(qt)) is not None:
        return held
    if lay.raw:  # super-blocks (Q4_K, Q5_K): codes with exact fp32 scales and offsets
        c = superblock_codes(qt.file_blocks(), lay.raw)
        u, s, lay = c.codes, torch.from_numpy(c.scale).double(), layout(lay.raw)
        o = torch.from_numpy(c.offset).double() if c.offset is not None else -lay.zero * s
        lay = CodeLayout(4 if lay.bits == 4 else 8, lay.group, lay.zero)  # Q5_K's 5-bit codes as bytes, as below
    else:
        codes, bits = qt.natural_codes()  # the x86 kernel's order and packing undone
        u = unpack_codes(codes, bits, k).numpy()
        s = qt.natural_scales().double()  # the AMX tiles' grouping undone too
        o = -lay.zero * s if lay.zero >= 0 else qt.offsets.double()
        lay = CodeLayout(bits, lay.group, lay.zero)
    packed = u if lay.bits == 8 else (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
    scales, biases, inexact = _scales_biases(s, o)
    return Matrix(mx.array(np.ascontiguousarray(packed).view(np.uint32)), lay.bits, GROUP, scales, biases, inexact)


def _mxfp4(qt: QuantTensor) -> Matrix | None:
    """MXFP4 rows in MLX's "mxfp4" mode: MLX quantizes the exact values (every block's power of two and 4-bit floats
    are again a power of two and 4-bit floats, whatever exponent MLX picks), then checked to give them back bit for
    bit; None where they do not, or where this MLX has no such mode (the affine bytes serve then)."""
    values = mx.array(qt.dequantize().numpy())
    try:
        weight, scales = mx.quantize(values, group_size=GROUP, bits=4, mode="mxfp4")
        back = mx.dequantize(weight, scales, group_size=GROUP, bits=4, mode="mxfp4", dtype=mx.float32)
    except (TypeError, ValueError):
        return None
    if not mx.array_equal(back, values).item():
        return None
    return Matrix(weight, 4, GROUP, scales, None, mode="mxfp4")


def _int4_codes(packed: torch.Tensor, k: int, start: int, stop: int) -> np.ndarray:
    """Rows start:stop (whole packing blocks) of torch's CPU int4pack as uint8 codes 0..15: in a block of B rows,
    byte (kk, j) holds row j's code in its low nibble and row j + B/2's in its high one (see `_int4_block`)."""
    block = _int4_block()
    view = packed.reshape(-1, k, block // 2)[start // block : stop // block]  # (blocks, k, row in half)
    halves = torch.stack([view & 0x0F, view >> 4], dim=1)  # (blocks, lo/hi, k, row in half)
    return halves.transpose(2, 3).reshape(-1, k).numpy()


def _scales_biases(scale: torch.Tensor, bias: torch.Tensor) -> tuple[mx.array, mx.array, int]:
    """Scales and biases (float64 in, exact values) as bf16 when both fit bf16 exactly, else fp32; the count of
    biases fp32 cannot hold either."""
    b32 = bias.float()
    inexact = int((b32.double() != bias).sum())
    fits_bf16 = inexact == 0 and torch.equal(b32.bfloat16().float(), b32) and \
        torch.equal(scale.float().bfloat16().double(), scale)
    if fits_bf16:
        return _bf16(scale.bfloat16()), _bf16(b32.bfloat16()), 0
    return mx.array(scale.float().numpy()), mx.array(b32.numpy()), inexact


def _split(path: str, m: Matrix, bias: mx.array | None, args: ModelArgs, leaf: str | None = None):
    """(name, matrix rows, bias rows) under the MLX model's names: a fused projection's rows go back to its parts.
    With `leaf` (a plain tensor of a fused module) names are `path.leaf` and the bias slot stays None."""
    parent, _, last = path.rpartition(".")
    parts = FUSED.get(last)
    if parts is None:
        return [(".".join(filter(None, (path, leaf))), m, bias)]
    if last == "qkv_proj":
        q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        sizes = [q, kv, kv]
    else:  # gate and up: halves (a dense MLP's or an expert's)
        sizes = [m.weight.shape[0] // 2] * 2
    out, start = [], 0
    for name, size in zip(parts, sizes):
        stop = start + size
        full = f"{parent}.{name}" if parent else name
        out.append((f"{full}.{leaf}" if leaf else full, m.rows(start, stop),
                    None if bias is None else bias[start:stop]))
        start = stop
    assert start == m.weight.shape[0], f"{path}: {m.weight.shape[0]} rows, parts of {sizes}"
    return out


def _install(model: CausalLM, path: str, m: Matrix, bias: mx.array | None, embedding: bool) -> None:
    """Puts the quantized module at `path`; a bf16 matrix keeps the plain Linear/Embedding (its weight loads)."""
    if m.bits is None:
        return
    if embedding:
        module = QuantizedEmbedding(m.weight, m.scales, m.biases, m.group_size, m.bits)
    else:
        module = QuantizedLinear(m.weight, m.scales, m.biases, m.group_size, m.bits, bias, m.mode)
    parent_path, _, leaf = path.rpartition(".")
    parent = model
    for part in parent_path.split(".") if parent_path else []:
        parent = parent[int(part)] if isinstance(parent, list) else getattr(parent, part)
    old = getattr(parent, leaf)
    if not isinstance(old, nn.Embedding if embedding else nn.Linear):
        raise ValueError(f"{path}: the MLX model has {type(old).__name__} there")
    setattr(parent, leaf, module)


def _own_state(module: torch.nn.Module):
    """A module's own parameters and persistent buffers (what state_dict holds for it)."""
    yield from module.named_parameters(recurse=False)
    for key, b in module.named_buffers(recurse=False):
        if key not in module._non_persistent_buffers_set:
            yield key, b


def _release(module: torch.nn.Module) -> None:
    """Moves the module's own tensors to the meta device: shapes and dtypes stay (byte counts), the memory goes."""
    for key, p in list(module._parameters.items()):
        if p is not None and not p.is_meta:
            module._parameters[key] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
    for key, b in list(module._buffers.items()):
        if b is not None and not b.is_meta:
            module._buffers[key] = torch.empty_like(b, device="meta")


def _float(t: torch.Tensor, target) -> mx.array:
    return mx.array(t.detach().float().numpy()).astype(target)


def _bf16(t: torch.Tensor) -> mx.array:
    return mx.array(t.detach().contiguous().view(torch.int16).numpy()).view(mx.bfloat16)
