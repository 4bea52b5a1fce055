"""The DFlash block drafter's network: a few transformer layers that predict a block of tokens in one pass,
conditioned on the target model's own hidden states.

The target's outputs of a few of its layers (`taps`) at every position it has computed are joined, projected and
normed into one context feature per position. Every draft layer reads those features as extra keys and values (its
own k/v projections of them, rotated at their positions), so the draft attends to what the target knows without
running it. A block is the sequence's newest token (the anchor, not yet seen by the target) and `block - 1` mask
rows after it; each row attends to every context feature and to every row of its block (non-causal), and the
mask rows' outputs, through the target's final head, predict the tokens after the anchor. The token embedding and
the head are the target's, frozen: the draft owns only its layers, the projection and the mask vector.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

FORMAT = "parley-dflash-1"


@dataclass(frozen=True, slots=True)
class DFlashConfig:
    hidden: int  # the target's hidden size (its embedding and head work on it)
    vocab: int  # the target's vocabulary (a drafter serves one tokenizer)
    taps: tuple[int, ...]  # target layers whose outputs condition the draft (0-based)
    layers: int = 1
    heads: int = 4
    kv_heads: int = 1
    head_dim: int = 128
    intermediate: int = 2048
    block: int = 8  # rows per block: the anchor and block - 1 drafted tokens
    draft_vocab: int = 0  # tokens it can draft (its head's rows: the target's most frequent, `vocab_ids`); 0: all
    rope_theta: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.block < 2 or not self.taps or self.heads % self.kv_heads or not 0 <= self.draft_vocab <= self.vocab:
            raise ValueError(f"invalid DFlash config: {self}")

    @staticmethod
    def for_target(hidden: int, vocab: int, num_layers: int, **overrides) -> "DFlashConfig":
        """Three taps spread over the target's depth (early, middle, late), as the DFlash design does."""
        taps = tuple(sorted({max(0, num_layers // 4 - 1), num_layers // 2 - 1, num_layers - 2}))
        return DFlashConfig(hidden=hidden, vocab=vocab, taps=taps, **overrides)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Half-split rotary embedding of x (T, H, D) at `positions` (T,)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.to(torch.float32)[:, None] * inv[None, :]
    cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None, :].to(x.dtype)
    sin = torch.cat((angles.sin(), angles.sin()), -1)[:, None, :].to(x.dtype)
    half = d // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class DraftLayer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.c = c
        self.in_norm = nn.Parameter(torch.ones(c.hidden))
        self.ctx_norm = nn.Parameter(torch.ones(c.hidden))
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(c.hidden))
        self.gate = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, c.hidden, bias=False)
        for branch_end in (self.o, self.down):  # a new layer passes its input through: training starts from there
            nn.init.zeros_(branch_end.weight)

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values of context features (T, hidden) at `positions`: (T, kv_heads, head_dim)."""
        c = self.c
        x = rms_norm(features, self.ctx_norm, c.eps)
        k = self.k(x).view(-1, c.kv_heads, c.head_dim)
        return rotate(k, positions, c.rope_theta), self.v(x).view(-1, c.kv_heads, c.head_dim)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """h (R, hidden): block rows at `positions`; ctx_k/ctx_v (C, kv_heads, head_dim); mask (R, C + R) bool or
        None (every row sees every key)."""
        return self.forward_blocks(h, positions, [(ctx_k, ctx_v)], mask)

    def forward_blocks(self, h: torch.Tensor, positions: torch.Tensor,
                       contexts: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None = None) -> torch.Tensor:
        """h (S * B, hidden): S blocks of B rows, block s attending to its context `contexts[s]` (keys, values) and to
        its own rows; the projections and the MLP run once for all blocks (their weights read once). `mask`: with
        one block only, as in `forward`."""
        c, blocks = self.c, len(contexts)
        x = rms_norm(h, self.in_norm, c.eps)
        q = rotate(self.q(x).view(-1, c.heads, c.head_dim), positions, c.rope_theta).transpose(0, 1)
        k_new = rotate(self.k(x).view(-1, c.kv_heads, c.head_dim), positions, c.rope_theta)
        v_new = self.v(x).view(-1, c.kv_heads, c.head_dim)
        rows = h.shape[0] // blocks
        out = []
        for s, (ctx_k, ctx_v) in enumerate(contexts):
            own = slice(s * rows, (s + 1) * rows)
            k = torch.cat((ctx_k, k_new[own])).transpose(0, 1)
            v = torch.cat((ctx_v, v_new[own])).transpose(0, 1)
            out.append(F.scaled_dot_product_attention(q[:, own], k, v, attn_mask=mask, scale=1 / math.sqrt(c.head_dim),
                                                      enable_gqa=True))
        out = torch.cat(out, 1) if blocks > 1 else out[0]
        h = h + self.o(out.transpose(0, 1).reshape(-1, c.heads * c.head_dim))
        x = rms_norm(h, self.mlp_norm, c.eps)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


class DFlashNet(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.fuse = nn.Linear(len(config.taps) * config.hidden, config.hidden, bias=False)
        self.mask = nn.Parameter(torch.zeros(config.hidden))
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.layers))
        self.out_norm = nn.Parameter(torch.ones(config.hidden))
        if config.draft_vocab:  # a head over the frequent tokens only: drafting reads a fraction of the target's head
            self.register_buffer("vocab_ids", torch.arange(config.draft_vocab))

    def features(self, taps: torch.Tensor) -> torch.Tensor:
        """Context features (T, hidden) of the target's joined tap outputs (T, len(taps) * hidden)."""
        return self.fuse(taps.to(self.fuse.weight.dtype))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.context_kv(features, positions) for layer in self.layers]

    def block_rows(self, anchor_embedding: torch.Tensor, rows: int) -> torch.Tensor:
        """The block's inputs: the anchor's embedding (hidden,) then rows - 1 mask vectors."""
        mask = self.mask.to(anchor_embedding.dtype).expand(rows - 1, -1)
        return torch.cat((anchor_embedding[None, :], mask))

    def token_ids(self, head_rows: torch.Tensor) -> torch.Tensor:
        """The tokens that rows of the drafting head (argmaxes of `head_rows`' logits) stand for."""
        return self.vocab_ids[head_rows] if self.config.draft_vocab else head_rows

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]],
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Block rows h (R, hidden) -> the normed outputs (R, hidden) the target's head turns into logits."""
        for layer, (k, v) in zip(self.layers, kv):
            h = layer(h, positions, k, v, mask)
        return rms_norm(h, self.out_norm, self.config.eps)

    def forward_blocks(self, h: torch.Tensor, positions: torch.Tensor,
                       contexts: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> torch.Tensor:
        """S blocks of equal size at once, block s over its own context `contexts[s]` (per layer: keys, values):
        what drafting for many sequences in one pass runs (DraftLayer.forward_blocks)."""
        for i, layer in enumerate(self.layers):
            h = layer.forward_blocks(h, positions, [context[i] for context in contexts])
        return rms_norm(h, self.out_norm, self.config.eps)


def save(net: DFlashNet, path: Path, target: str = "") -> None:
    """The weights as safetensors, the config (and the target it was trained on) in its metadata."""
    from safetensors.torch import save_file

    meta = {"format": FORMAT, "config": json.dumps(asdict(net.config)), "target": target}
    tensors = {k: (v.float() if v.is_floating_point() else v).detach().contiguous() for k, v in net.state_dict().items()}
    save_file(tensors, str(path), metadata=meta)


def is_dflash_file(path: Path) -> bool:
    """Whether `path` is a drafter saved by `save` (not a draft model's .gguf or folder)."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".safetensors":
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT
    except Exception:  # noqa: BLE001 - unreadable: not a drafter (the draft model's loader reports it)
        return False


def draft_mode(path: Path) -> str:
    """The speculative mode a --draft-model path implies: "dflash" for a DFlash drafter file, else "draft"."""
    return "dflash" if is_dflash_file(path) else "draft"


def load(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> DFlashNet:
    """A drafter saved by `save`; a file that is not one raises ValueError with what is wrong."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same answer to the user
        raise ValueError(f"{path} is not a safetensors file ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a Parley DFlash drafter (format {meta.get('format')!r})")
    raw = json.loads(meta["config"])
    net = DFlashNet(DFlashConfig(**raw | {"taps": tuple(raw["taps"])}))
    missing, unexpected = net.load_state_dict(load_file(str(path)), strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match its config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return net.to(device=device, dtype=dtype).eval()
