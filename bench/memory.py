"""Memory a load costs: resident growth and peak against the GGUF file's size, per model and weights mode.

    python bench/memory.py [--models default PATH ...] [--shapes llama-1b llama-8b llama-1b:Q5_K_M]
                           [--modes quantized dequantized]

Each (model, mode) loads in a fresh subprocess that reads its own /proc/self/status: VmRSS before and after
load_model, VmHWM (reset to VmRSS just before the load) for the peak, RssAnon/RssFile to tell owned memory from
mapped file pages. The load gets an empty cache_dir; what it writes there is reported (`--warm`: then a second load
in a fresh process over what the first wrote, as every later start is). A few greedy tokens prove the
model runs; decode_growth_bytes is what building the runtime and decoding add on top. One JSON line per (model,
mode); llama-8b skips dequantized (fp32 would need ~32 GB).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import emit  # noqa: E402

PROMPT = "The history of the printing press begins"
TOO_BIG_TO_DEQUANTIZE = {"llama-8b"}


def proc_status() -> dict[str, int]:
    """The Vm*/Rss* lines of /proc/self/status, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.startswith(("Vm", "Rss")) and value.strip().endswith("kB"):
            out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak() -> bool:
    """VmHWM := VmRSS (Linux's clear_refs 5), so the peak read later is the load's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(path: Path, weights: str, tokens: int, scratch: Path, cache: Path | None = None) -> dict:
    """Runs in the child: load `path` with `weights` (`cache`: a cache_dir kept, else a fresh one), then decode
    `tokens` greedy tokens."""
    import gguf  # noqa: F401  (the load's lazy imports, kept out of its growth)
    import safetensors.torch  # noqa: F401

    before, lm, load_s, cache_bytes = _load(path, weights, scratch, cache)
    after = proc_status()
    generated, decode_s = _decode(lm, tokens)
    file_bytes = path.stat().st_size
    growth, peak = after["VmRSS"] - before["VmRSS"], after["VmHWM"] - before["VmRSS"]
    return dict(file_bytes=file_bytes, weight_bytes=lm.weight_bytes(), quantization=lm.quantization(),
                load_s=round(load_s, 2), rss_before_bytes=before["VmRSS"], growth_bytes=growth, peak_bytes=peak,
                growth_over_file=round(growth / file_bytes, 3), peak_over_file=round(peak / file_bytes, 3),
                anon_growth_bytes=after["RssAnon"] - before["RssAnon"],
                file_rss_growth_bytes=after["RssFile"] - before["RssFile"],
                cache_bytes_written=cache_bytes, notices=lm.notices, decode_tokens=generated,
                decode_s=round(decode_s, 2), decode_growth_bytes=proc_status()["VmRSS"] - after["VmRSS"])


def _load(path: Path, weights: str, scratch: Path, kept: Path | None = None):
    """(status before, model, seconds, bytes in its cache_dir after the load: a fresh one, or `kept`)."""
    from engine.loading.loader import LoadOptions, load_model

    cache = kept or Path(tempfile.mkdtemp(prefix="memory-cache-", dir=scratch))
    try:
        before = proc_status()
        if not reset_peak():
            raise OSError("cannot reset VmHWM (/proc/self/clear_refs): the peak would not be the load's")
        start = time.perf_counter()
        lm = load_model(path, LoadOptions(weights=weights, cache_dir=cache))
        return before, lm, time.perf_counter() - start, dir_bytes(cache)
    finally:
        if kept is None:
            shutil.rmtree(cache, ignore_errors=True)


def _decode(lm, tokens: int) -> tuple[list[int], float]:
    from bench.runs import RunConfig, generate
    from engine.sampling import SamplingParams

    ids = lm.tokenizer.encode(PROMPT, add_bos=True)
    start = time.perf_counter()
    run = RunConfig(max_seq_len=len(ids) + tokens + 8)
    seq = generate(lm, [ids], SamplingParams(max_tokens=tokens), run)[0]
    return seq.generated, time.perf_counter() - start


def run_child(path: Path, weights: str, tokens: int, scratch: Path, cache: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", str(path), "--weights", weights, "--tokens", str(tokens),
           "--data-dir", str(scratch), *(["--cache", str(cache)] if cache else [])]
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return dict(error=f"child exited with {proc.returncode}", child_s=round(time.perf_counter() - start, 1))
    return json.loads(lines[-1]) | dict(child_s=round(time.perf_counter() - start, 1))


def models(specs: list[str], shapes: list[str], data_dir: Path) -> list[tuple[str, Path]]:
    """(label, path): each --models entry ("default" = the embedded GGUF), then each synthetic shape."""
    from bench.synthetic_gguf import synthetic_gguf
    from engine.loading.default_model import resolve_model

    out = [(spec, resolve_model(spec, data_dir / "models")) for spec in specs]
    for shape in shapes:  # "llama-1b", or "llama-1b:Q5_K_M" for another of llama.cpp's mixes
        name, _, kind = shape.partition(":")
        out.append((shape, synthetic_gguf(name, data_dir / "synthetic", kind=kind or "Q4_K_M")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["default"])
    ap.add_argument("--shapes", nargs="*", default=[],
                    help="llama-1b, llama-8b (Q4_K_M), or SHAPE:Q5_K_M for that mix of llama.cpp's quantizer")
    ap.add_argument("--modes", nargs="*", default=["quantized", "dequantized"])
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--weights", help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help="also a second load over the cache the first one wrote")
    a = ap.parse_args()
    a.data_dir.mkdir(parents=True, exist_ok=True)
    if a.child:
        emit(**measure(a.child, a.weights, a.tokens, a.data_dir, a.cache))
        return
    for label, path in models(a.models, a.shapes, a.data_dir):
        for weights in a.modes:
            if weights == "dequantized" and label.partition(":")[0] in TOO_BIG_TO_DEQUANTIZE:
                emit(model=label, weights=weights, skipped="fp32 weights would need ~32 GB")
                continue
            if not a.warm:
                emit(model=label, path=str(path), weights=weights, **run_child(path, weights, a.tokens, a.data_dir))
                continue
            cache = Path(tempfile.mkdtemp(prefix="memory-warm-", dir=a.data_dir))
            try:
                for start in ("cold", "warm"):
                    emit(model=label, path=str(path), weights=weights, cache=start,
                         **run_child(path, weights, a.tokens, a.data_dir, cache))
            finally:
                shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
