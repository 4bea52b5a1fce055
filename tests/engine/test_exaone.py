"""EXAONE 3.x (`exaone`): Llama's math under EXAONE's own tensor names and config keys (its HF code is not in
transformers), so the tiny Llama renamed as EXAONE names it is the model: both sources must give transformers' Llama
logits, and llama.cpp must read the GGUF (Q/K rows as HF has them) the same way."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from engine.loading.loader import load_model
from engine.models import exaone
from tests.support import arch_checks as check
from tests.support.gguf_export import write_gguf
from tests.support.tiny_models import make_tiny_hf

pytestmark = pytest.mark.slow  # needs transformers


def as_exaone(llama_hf: Path, out: Path) -> Path:
    """The tiny Llama folder with EXAONE's tensor names and config keys."""
    out.mkdir(parents=True)
    for f in llama_hf.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, out / f.name)
    cfg = json.loads((llama_hf / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg.update(model_type="exaone", architectures=["ExaoneForCausalLM"], num_layers=cfg.pop("num_hidden_layers"),
               layer_norm_epsilon=cfg.pop("rms_norm_eps"), activation_function=cfg.pop("hidden_act"),
               rope_theta=rope["rope_theta"], rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"})
    (out / "config.json").write_text(json.dumps(cfg))
    renames = [(ours, hf) for hf, ours in exaone.HF_NAMES]
    renames.sort(key=lambda pair: pair[0] == ".self_attn.")  # o_proj's own name before the rest of self_attn
    weights = {}
    for name, tensor in load_file(str(llama_hf / "model.safetensors")).items():
        for ours, hf in renames:
            name = name.replace(ours, hf)
        weights[name] = tensor
    save_file(weights, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("exaone")
    llama_hf = make_tiny_hf("llama", root / "llama")
    folder = as_exaone(llama_hf, root / "exaone")
    return llama_hf, folder, write_gguf(folder, root / "exaone.gguf", "F32")


@pytest.mark.parametrize("source", [1, 2])  # the EXAONE folder, its GGUF
def test_logits_match_transformers_llama(files, source):
    lm = check.assert_matches_transformers(files[0], files[source], "sequence")
    assert lm.args.model_type == "exaone" and lm.args.rope["global"].factors  # llama3 rope read from either


def test_llama_cpp_reads_the_same_model(files):
    pytest.importorskip("llama_cpp")
    got, want = check.against_llama_cpp(files[2])
    assert (got - want).abs().max() < 1e-3 * max(5.0, float(want.abs().max()))
