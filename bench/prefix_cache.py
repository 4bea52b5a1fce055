"""The shared prefix cache on the embedded model, through the engine as the app drives it, with and without the
cache in one process.

    python bench/prefix_cache.py [--prompt-tokens 2000] [--system-tokens 1500] [--columns 4]

Cases:
  alone    one chat, a ~2,000-token prompt: its time to first token (TTFT), the baseline
  compare  the same prompt sent to N columns on one model at once: each column's TTFT, the prompt tokens each
           computed (prefilled) and the sum; ratio = the slowest column's TTFT / alone's
  system   a chat with a ~1,500-token system prompt, then a second new chat with the same system prompt and
           another question: TTFT of each and second / first
Prints one JSON line per (case, prefix_cache on/off).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import emit  # noqa: E402
from bench.common_text import long_prompt  # noqa: E402

NEW = 4  # tokens per answer: the figures are about the prompt


def run_case(cli, model_id: int, case: str, text: str, system: str, columns: int) -> dict:
    from engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=NEW)
    engine = cli.engine

    def turns(sessions: list[int], messages: list[dict], system_prompt: str | None = None) -> list:
        ids = [engine.submit(s, messages, params, system_prompt) for s in sessions]
        cli.run(ids)
        return [cli.result(t).stats for t in ids]

    if case == "alone":
        (s,) = turns([engine.open_session(model_id)], [{"role": "user", "content": text}])
        return {"ttft_s": round(s.ttft_s, 3), "prompt_tokens": s.prompt_tokens, "prefilled": s.prefilled_tokens}
    if case == "compare":
        stats = turns([engine.open_session(model_id) for _ in range(columns)], [{"role": "user", "content": text}])
        return {"ttft_s": [round(s.ttft_s, 3) for s in stats], "max_ttft_s": round(max(s.ttft_s for s in stats), 3),
                "prompt_tokens": stats[0].prompt_tokens, "prefilled": [s.prefilled_tokens for s in stats],
                "prefilled_total": sum(s.prefilled_tokens for s in stats)}
    first, = turns([engine.open_session(model_id)], [{"role": "user", "content": "Summarise the notes above."}], system)
    second, = turns([engine.open_session(model_id)], [{"role": "user", "content": "What is the second topic?"}],
                    system)
    return {"first_ttft_s": round(first.ttft_s, 3), "second_ttft_s": round(second.ttft_s, 3),
            "second_over_first": round(second.ttft_s / first.ttft_s, 3), "prompt_tokens": second.prompt_tokens,
            "second_prefilled": second.prefilled_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--columns", type=int, default=4)
    ap.add_argument("--kv-layout", default="sequence", choices=["sequence", "cell"])
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    a = ap.parse_args()
    from cli.engine_cli import EngineCLI
    from engine.loading.default_model import default_model_path
    from engine.runtime import EngineConfig

    path = default_model_path(a.data_dir / "models")
    results: dict[tuple[str, bool], dict] = {}
    for share in (False, True):
        config = EngineConfig(kv_layout=a.kv_layout, max_sessions=max(8, a.columns + 2), max_session_tokens=4096,
                              prefix_cache=share, device="cpu")
        cli = EngineCLI(config)
        try:
            model_id, _ = cli.load(path)
            tok = cli.engine.loaded_model(model_id).tokenizer
            text = tok.decode(long_prompt(tok, a.prompt_tokens))
            system = tok.decode(long_prompt(tok, a.system_tokens))
            for case in ("alone", "compare", "system"):
                # each case opens with its own line: no case starts from another case's cached prompt
                lead = f"Notes for the {case} case.\n"
                results[case, share] = row = run_case(cli, model_id, case, lead + text, lead + system, a.columns)
                if case == "compare":
                    row["max_ttft_over_alone"] = round(row["max_ttft_s"] / results["alone", share]["ttft_s"], 3)
                emit(case=case, prefix_cache=share, layout=a.kv_layout, **row)
        finally:
            cli.close()


if __name__ == "__main__":
    main()
