"""Teacher-forced fidelity against llama.cpp's own logits on the same GGUF: top-1 agreement and |logit difference|.

Each text is tokenized once by Parley (BOS first) and the same ids go to llama.cpp (a fresh context per text,
logits for every position) and to each Parley model (a forward over chunks, logits for every row). Rows are
compared as they are made, so no text's full logits are held twice.

    python -m bench.fidelity [--model PATH] [--weights quantized dequantized cuda-values] [--threads 2]
Prints a header, one JSON line per (weights, text kind) and one per weights overall ("kind": "all").
Each line also counts agreement over the positions where llama.cpp's top-1 leads its top-2 by at least 0.1, 0.25, 0.5
and 1 logit ("by_ref_lead"): a base model's near-ties flip with any rounding, a clear lead should not.
"cuda-values": every matrix at the values the CUDA quantized path holds (4-bit types exactly, other quantized
types re-quantized to int8 rows, F16 as bf16), run in fp32 on the CPU: the weights' part of CUDA's distance from
llama.cpp, without its bf16 activations.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import emit  # noqa: E402

PROSE = """\
The lighthouse keeper on the northern cape kept two logbooks. The first was the official one, with the hours \
the lamp was lit, the state of the weather and the ships that passed; the second was a private notebook in \
which she wrote down everything the first one had no column for. In the private book there were notes on the \
colour of the sea before a storm, on the seabirds that arrived in the same week every spring, and on the long \
conversations she had with the supply boat's captain about whether the fog had a smell.

Over thirty years the second book grew into six volumes. When the light was finally automated, a small museum \
in the harbour town asked for the official logbooks, and she gave them without hesitation. The notebooks she \
kept. She said that the official record described what the lighthouse did, while the notebooks described what \
it was like to be there, and that the two were not the same thing at all.

Historians who later read both sets agree that the private notes are more useful. The official logs record that \
a storm arrived on a certain night; the notebook records that the barometer had been falling for two days, that \
the gulls had moved inland the afternoon before, and that the swell changed direction an hour before the wind. \
Taken together, the entries form a careful description of how weather on that coast behaves, written by someone \
who had no theory to defend and every reason to pay attention.

There is a lesson in this for anyone who keeps records. A form with fixed columns makes the data easy to count, \
but it also decides in advance which observations matter. The most valuable line in a log is often the one that \
did not fit anywhere: the strange noise in the engine, the customer who asked an unexpected question, the test \
that passed but took twice as long as usual. Leaving room for those notes costs very little, and years later it \
may be the only part of the record that anyone still wants to read.

The keeper retired to a cottage a few miles from the cape. Visitors sometimes asked whether she missed the work. \
She answered that she still woke at the hour when the lamp used to be checked, and still looked at the sky \
before anything else, and that in this sense she had never really stopped keeping the light.
"""

CODE = '''\
"""A small inventory module: items, stock levels and a reorder report."""
from __future__ import annotations

import csv
import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Iterator


@dataclasses.dataclass(frozen=True)
class Item:
    sku: str
    name: str
    unit_cost: float
    reorder_level: int


class Inventory:
    def __init__(self, items: Iterable[Item]) -> None:
        self._items = {item.sku: item for item in items}
        self._stock: dict[str, int] = defaultdict(int)

    def receive(self, sku: str, quantity: int) -> None:
        if sku not in self._items:
            raise KeyError(f"unknown SKU {sku!r}")
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self._stock[sku] += quantity

    def ship(self, sku: str, quantity: int) -> None:
        available = self._stock.get(sku, 0)
        if quantity > available:
            raise ValueError(f"only {available} units of {sku} in stock, {quantity} requested")
        self._stock[sku] = available - quantity

    def value(self) -> float:
        return sum(self._items[sku].unit_cost * n for sku, n in self._stock.items())

    def below_reorder_level(self) -> Iterator[tuple[Item, int]]:
        for sku, item in sorted(self._items.items()):
            level = self._stock.get(sku, 0)
            if level < item.reorder_level:
                yield item, item.reorder_level - level


def load_items(path: Path) -> list[Item]:
    with path.open(newline="") as f:
        return [
            Item(row["sku"], row["name"], float(row["unit_cost"]), int(row["reorder_level"]))
            for row in csv.DictReader(f)
        ]


def reorder_report(inventory: Inventory) -> str:
    lines = ["SKU       NAME                 SHORT"]
    for item, short in inventory.below_reorder_level():
        lines.append(f"{item.sku:<9} {item.name[:20]:<20} {short:>5}")
    if len(lines) == 1:
        lines.append("(nothing to reorder)")
    return "\\n".join(lines)


def moving_average(values: list[float], window: int) -> list[float]:
    """Mean of each run of `window` consecutive values; empty when there are fewer values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out


if __name__ == "__main__":
    inv = Inventory([Item("A-100", "hex bolts M6", 0.12, 500), Item("B-220", "wing nuts", 0.08, 300)])
    inv.receive("A-100", 420)
    inv.receive("B-220", 1000)
    inv.ship("B-220", 750)
    print(reorder_report(inv))
    print(f"stock value: {inv.value():.2f}")
    print(moving_average([3.0, 4.0, 8.0, 1.0, 6.0], 2))
'''

CJK = """\
秋天的早晨，山里的空气又冷又清。村口的老槐树下，几位老人一边喝茶，一边讨论今年的收成。\
有人说雨水比去年多，稻子长得特别好；也有人担心下个月会有霜冻，晚熟的蔬菜可能来不及收。\
孩子们背着书包从石桥上跑过，笑声一直传到河对岸的竹林里。

这个村子以前很少有外人来。后来修了公路，城里的游客开始在周末开车过来，看梯田，吃农家饭，\
买当地的蜂蜜和腊肉。村里的年轻人有的回来开了民宿，有的在网上卖山货。生活比以前方便了，\
但老人们常说，最好的东西还是那些不能带走的：清晨的雾，傍晚的炊烟，还有夏夜里满天的星星。

図書館の三階には、窓に面した小さな閲覧席がある。午後になると西日が差し込み、机の上の本が\
少しだけ金色に見える。学生たちは試験の前になるとこの席を取り合うが、普段は近所に住む年配の\
男性が一人で新聞を読んでいることが多い。彼は毎日同じ時間に来て、同じ順番で新聞をめくり、\
最後に短い感想をノートに書いてから帰っていく。

司書の話によると、その人は昔、町の小学校で理科を教えていたそうだ。ノートには天気の変化や\
鳥の鳴き声、川の水位など、身の回りの小さな観察がびっしりと書き込まれているという。

비가 그친 뒤의 시장은 평소보다 조용했다. 상인들은 천막에 고인 물을 털어 내고, 젖은 상자를 \
햇볕에 내놓았다. 생선 가게 주인은 오늘 들어온 고등어가 유난히 싱싱하다며 지나가는 사람들에게 \
큰 소리로 말을 걸었다. 골목 끝의 작은 빵집에서는 갓 구운 빵 냄새가 흘러나왔고, 아이들은 \
엄마의 손을 잡아당기며 그쪽으로 가자고 졸랐다.
"""

CHAT = """\
<start_of_turn>user
I am planning a vegetable garden on a small balcony that gets about five hours of direct sun in the afternoon. \
What could I grow, and how should I arrange the containers?<end_of_turn>
<start_of_turn>model
Five hours of afternoon sun is enough for a productive balcony garden, as long as you choose plants that do not \
need full sun all day. Here is a plan that usually works well.

**What to grow**

1. Leafy greens such as lettuce, spinach, rocket and chard. They tolerate partial sun and can be harvested a few \
leaves at a time for weeks.
2. Herbs: parsley, chives, mint (in its own pot, because it spreads), coriander and thyme.
3. Compact tomatoes and peppers. Look for varieties labelled "patio" or "dwarf"; they stay under a metre tall.
4. Radishes and spring onions, which grow quickly in shallow containers.
5. Climbing beans or peas on a trellis, if you have a wall or railing they can use.

**How to arrange the containers**

- Put the tallest plants, such as tomatoes and climbing beans, at the back or along the side that faces away \
from the sun, so they do not shade everything else.
- Keep greens and herbs in front, where they are easy to reach and get the most light.
- Use pots of at least twenty litres for tomatoes and peppers; greens and herbs are happy in smaller troughs.
- Check the weight limit of the balcony before filling many large pots, since wet soil is heavy.

**Watering and care**

Containers dry out faster than garden beds, especially in the afternoon sun. Water in the morning, feel the soil \
with a finger before watering again, and add a slow-release fertiliser once a month during the growing season.<end_of_turn>
<start_of_turn>user
Thanks! Which of these would be easiest for a complete beginner?<end_of_turn>
<start_of_turn>model
For a first season, start with three plants that forgive mistakes: lettuce, chives and radishes. Lettuce grows \
quickly and tells you at once when it is thirsty, because its leaves droop. Chives come back year after year \
with almost no care. Radishes are ready in about four weeks, so you see results before you have time to lose \
interest. Once those are going well, add a patio tomato next spring.<end_of_turn>
"""

TEXTS = {"prose": PROSE, "code": CODE, "cjk": CJK, "chat": CHAT}
# llama.cpp's top-1 lead over its top-2 (logits): agreement is also counted over the positions whose lead is at least
# each of these, so disagreements on near-ties (where any rounding flips the top-1) show apart from real ones
MARGINS = (0.1, 0.25, 0.5, 1.0)


@dataclass(slots=True)
class Agreement:
    """Running totals of one comparison; `add` takes aligned (rows, vocab) logits."""

    positions: int = 0
    agree: int = 0
    in_top5: int = 0  # positions where llama.cpp's top-1 is among Parley's top 5
    max_gap: float = 0.0  # where top-1s differ: the largest llama.cpp logit gap between its top-1 and ours (ties?)
    max_abs: float = 0.0
    sum_abs: float = 0.0
    elements: int = 0
    margin_positions: list[int] = field(default_factory=lambda: [0] * len(MARGINS))
    margin_agree: list[int] = field(default_factory=lambda: [0] * len(MARGINS))

    def add(self, ours: torch.Tensor, ref: torch.Tensor) -> None:
        diff = (ours - ref).abs()
        top_ref, top_ours = ref.argmax(-1), ours.argmax(-1)
        rows = torch.arange(len(ref))
        gaps = ref[rows, top_ref] - ref[rows, top_ours]
        self.positions += len(ref)
        self.agree += int((top_ours == top_ref).sum())
        self.max_gap = max(self.max_gap, float(gaps.max()))
        self.in_top5 += int((ours.topk(5, -1).indices == top_ref[:, None]).any(-1).sum())
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.sum_abs += float(diff.sum(dtype=torch.float64))
        self.elements += diff.numel()
        top2 = ref.topk(2, -1).values
        lead, agree = top2[:, 0] - top2[:, 1], top_ours == top_ref
        for i, m in enumerate(MARGINS):
            self.margin_positions[i] += int((lead >= m).sum())
            self.margin_agree[i] += int((agree & (lead >= m)).sum())

    def merge(self, other: "Agreement") -> None:
        self.positions += other.positions
        self.agree += other.agree
        self.in_top5 += other.in_top5
        self.max_gap = max(self.max_gap, other.max_gap)
        self.max_abs = max(self.max_abs, other.max_abs)
        self.sum_abs += other.sum_abs
        self.elements += other.elements
        self.margin_positions = [a + b for a, b in zip(self.margin_positions, other.margin_positions)]
        self.margin_agree = [a + b for a, b in zip(self.margin_agree, other.margin_agree)]

    def row(self) -> dict:
        return {"positions": self.positions, "top1_agree_pct": round(100 * self.agree / self.positions, 2),
                "ref_top1_in_top5_pct": round(100 * self.in_top5 / self.positions, 2),
                "max_ref_gap_where_differ": round(self.max_gap, 4),
                "max_abs_diff": round(self.max_abs, 4), "mean_abs_diff": round(self.sum_abs / self.elements, 5),
                "by_ref_lead": {f">={m}": {"positions_pct": round(100 * n / self.positions, 1),
                                           "top1_agree_pct": round(100 * k / n, 2) if n else None}
                                for m, n, k in zip(MARGINS, self.margin_positions, self.margin_agree)}}


def parley_chunks(lm, ids: list[int], chunk: int):
    """Yields (start, logits (n, V)) for every position of `ids`, `chunk` rows per forward, one sequence."""
    from bench.runs import RunConfig, make_batcher
    from engine.step import StepBatch

    b = make_batcher(lm, 1, RunConfig(max_seq_len=len(ids) + 8, step_tokens=chunk, chunk_tokens=chunk,
                                      max_sampled_rows=chunk))
    slot = b.cache.seq_new()
    for start in range(0, len(ids), chunk):
        n = min(chunk, len(ids) - start)
        segs = b.cache.declare_step([(slot, n)])
        batch = StepBatch(torch.tensor(ids[start:start + n]), torch.arange(start, start + n), segs, torch.arange(n),
                          [], [])
        logits = b.runner.run(batch)[0]
        b.cache.commit_step()
        yield start, logits.float()


def llama_logits(llm, ids: list[int]) -> np.ndarray:
    """(len(ids), V) logits of a fresh context (a view into llm.scores: valid until the next eval)."""
    llm.reset()
    llm.eval(ids)
    return llm.scores[:len(ids)]


def llama_chunks(llm, ids: list[int]):
    """The same yield as parley_chunks from a second llama.cpp context: all rows at once."""
    yield 0, torch.from_numpy(llama_logits(llm, ids))


def compare(chunks, ref: np.ndarray) -> Agreement:
    """`chunks` yields (start, logits) against the reference rows from `start` on."""
    acc = Agreement()
    for start, ours in chunks:
        acc.add(ours, torch.from_numpy(ref[start:start + len(ours)]))
    return acc


def token_check(llm, tok, kind: str, text: str, ids: list[int]) -> dict:
    """Whether llama.cpp's own tokenizer (special tokens parsed) gives the same ids; the first difference if not."""
    theirs = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    same = theirs == ids
    first = next((i for i, (x, y) in enumerate(zip(ids, theirs)) if x != y), min(len(ids), len(theirs)))
    row = {"check": "tokens", "kind": kind, "parley_tokens": len(ids), "llamacpp_tokens": len(theirs), "same": same}
    if not same:
        row |= {"first_diff": first, "parley": tok.decode(ids[first:first + 4]), "llamacpp": llm.detokenize(
            theirs[first:first + 4]).decode("utf-8", "replace")}
    return row


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the embedded model)")
    ap.add_argument("--weights", nargs="+", default=["quantized", "dequantized"],
                    choices=["quantized", "dequantized", "cuda-values"])
    ap.add_argument("--cuda-types", nargs="+", default=None,
                    help="cuda-values for matrices of these GGUF types only (the rest stay exact): which types cost")
    ap.add_argument("--no-floor", action="store_true",
                    help="skip llama.cpp against itself: flash attention, an f32 KV cache (its own noise floor)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=256, help="Parley rows per forward")
    ap.add_argument("--max-tokens", type=int, default=1024, help="each text is cut to this many tokens (llama n_ctx)")
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    return ap.parse_args()


def _llama(path: Path, a: argparse.Namespace, **options):
    """llama.cpp on `path`; `options` (flash_attn, type_k, type_v) move it off its defaults."""
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=a.max_tokens, n_threads=a.threads, n_threads_batch=a.threads,
                           logits_all=True, verbose=False, **options)


@dataclass(slots=True)
class Candidate:
    impl: str
    chunks: Callable  # fn(ids) yielding (start, logits (n, V))
    lm: object | None = None  # Parley's LoadedModel, None for llama.cpp


def _candidates(a: argparse.Namespace) -> list[Candidate]:
    """Each Parley weights, and llama.cpp's noise floor unless skipped."""
    from engine.loading.loader import LoadOptions, load_model

    out = []
    for w in a.weights:
        if w == "cuda-values":
            lm = cuda_values(a.model, a.data_dir, a.cuda_types)
        else:
            lm = load_model(a.model, LoadOptions(weights=w, cache_dir=a.data_dir / "cache"))
        out.append(Candidate(f"parley-{w}", partial(parley_chunks, lm, chunk=a.chunk), lm))
    if not a.no_floor:  # the same engine, another attention path or KV precision: how far llama.cpp moves by itself
        out.append(Candidate("llamacpp-flash-attn", partial(llama_chunks, _llama(a.model, a, flash_attn=True))))
        f32 = 0  # GGML_TYPE_F32: the default cache holds K and V in f16
        out.append(Candidate("llamacpp-f32-kv", partial(llama_chunks, _llama(a.model, a, type_k=f32, type_v=f32))))
    return out


def cuda_values(path: Path, data_dir: Path, types: list[str] | None = None):
    """The exact fp32 model with each GGUF matrix (of `types`, default all) replaced by the values of its CUDA-layout
    QuantTensor, built on the CPU as the loader builds it for CUDA (engine/quant/from_gguf.py) and dequantized."""
    from engine.loading.gguf_file import open_gguf
    from engine.loading.gguf_weights import hf_name
    from engine.loading.loader import LoadOptions, load_model
    from engine.models import architecture
    from engine.quant.from_gguf import quantized_matrix, row_order

    lm = load_model(path, LoadOptions(weights="dequantized", cache_dir=data_dir / "cache"))
    gf = open_gguf(path)
    arch = architecture(gf.architecture)
    state = lm.model.state_dict()
    with torch.no_grad():
        for t in gf.tensors:
            kind = t.tensor_type.name
            if len(t.shape) == 2 and kind != "F32" and (types is None or kind in types):  # F32 stays exact on CUDA
                held = quantized_matrix(t, row_order(arch.gguf_fix, t.name, int(t.shape[1]), lm.args), "cuda")
                state[hf_name(t.name, arch)].copy_(held.dequantize())
            gf.release(t)
    return lm


def main() -> None:
    import llama_cpp

    a = _args()
    torch.set_num_threads(a.threads)
    if a.model is None:
        from engine.loading.default_model import default_model_path

        a.model = default_model_path(a.data_dir / "models")
    cands = _candidates(a)
    tok = next(c.lm for c in cands if c.lm is not None).tokenizer
    llm = _llama(a.model, a)
    emit(model=str(a.model), threads=a.threads, llama_cpp=llama_cpp.__version__, reference="llamacpp (flash_attn off)",
         quantization={c.impl: c.lm.quantization() for c in cands if c.lm is not None})
    totals = {c.impl: Agreement() for c in cands}
    for kind, text in TEXTS.items():
        ids = tok.encode(text, add_bos=True)[:a.max_tokens]
        emit(**token_check(llm, tok, kind, text, ids))
        start = time.perf_counter()
        ref = llama_logits(llm, ids)
        for c in cands:
            acc = compare(c.chunks(ids), ref)
            totals[c.impl].merge(acc)
            emit(impl=c.impl, kind=kind, **acc.row())
        emit(kind=kind, seconds=round(time.perf_counter() - start, 1))
    for impl, acc in totals.items():
        emit(impl=impl, kind="all", **acc.row())


if __name__ == "__main__":
    main()
