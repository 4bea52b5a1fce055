"""A GGUF file whose experts are MXFP4 (gpt-oss) on one GPU, loaded twice in one process: the experts as fp4 words,
then as int8 rows (what CUDA held before fp4). Per format: the load's seconds, the GPU memory the model holds, and
decode at each session count (prompt 128, 128 new tokens, greedy, speculation off; a warm-up run first): the median
step and tokens per second. Prints JSON lines; the int8 rows carry fp4_speedup (tok/s), a last line fp4_memory_vs_int8.

    python -m bench.synthetic_gguf --shape gpt-oss-20b --raw-mxfp4 --out-dir /tmp/syn
    python -m bench.gpt_oss_cuda --model /tmp/syn/synthetic-gpt-oss-20b-F16-MXFP4.gguf --sessions 1 8 [--formats fp4]
"""
from __future__ import annotations

import argparse
import gc
import json
import time
from contextlib import contextmanager, nullcontext

import torch

from bench.quant_gpu import timed
from bench.runs import RunConfig, make_batcher
from engine.loading.loader import LoadOptions, load_model


@contextmanager
def _int8_experts():
    """MXFP4 held as int8 rows on CUDA (the format before fp4) while loading."""
    import engine.memory as memory
    import engine.quant.from_gguf as from_gguf
    import engine.quant.weight as weight

    default = weight.choose_format

    def choose(type_name: str, n: int, k: int, device: str = "cpu") -> str:
        return "int8" if type_name == "MXFP4" and device.startswith("cuda") else default(type_name, n, k, device)
    from_gguf.choose_format = memory.choose_format = choose
    try:
        yield
    finally:
        from_gguf.choose_format = memory.choose_format = default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--formats", nargs="+", choices=("fp4", "int8"), default=["fp4", "int8"])
    opts = ap.parse_args()
    results = {}
    for fmt in opts.formats:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        with _int8_experts() if fmt == "int8" else nullcontext():
            lm = load_model(opts.model, LoadOptions(device="cuda", dtype="bfloat16", weights="quantized"))
        row = {"format": fmt, "load_s": round(time.perf_counter() - start, 1),
               "gpu_gb": round((torch.cuda.memory_allocated() - before) / 2**30, 2), "weights": lm.quantization()}
        print(json.dumps(row), flush=True)
        for n in opts.sessions:
            batcher = make_batcher(lm, n, RunConfig(max_seq_len=512))
            results[fmt, n] = timed(batcher, lm.args, n) | {"sessions": n}
            line = {"format": fmt} | results[fmt, n]
            if fmt == "int8" and ("fp4", n) in results:
                line["fp4_speedup"] = round(results["fp4", n]["tok_s"] / results[fmt, n]["tok_s"], 3)
            print(json.dumps(line), flush=True)
            del batcher
        results[fmt] = row["gpu_gb"]
        del lm
        gc.collect()
    if len(opts.formats) == 2:
        print(json.dumps({"fp4_memory_vs_int8": round(results["fp4"] / results["int8"], 3)}), flush=True)


if __name__ == "__main__":
    main()
