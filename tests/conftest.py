"""Shared fixtures: tiny random models of every supported arch, as HF folders and as GGUF files."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
import pytest

# Every test's --data-dir (and its subprocesses') would otherwise build the CPU library again in its own cache folder
os.environ.setdefault("PARLEY_KERNEL_CACHE", str(Path(platformdirs.user_cache_dir("Parley", appauthor=False)) / "kernels"))

# Session fixtures shared by many modules: the embedded Gemma (file, tokenizer, model, oracles).
pytest.register_assert_rewrite("tests.support.gemma", "tests.support.gemma_model")
pytest_plugins = ["tests.support.gemma", "tests.support.gemma_model"]

from tests.support.gguf_export import write_corrupt_variants, write_gguf
from tests.support.tiny_models import ARCHS, TinyModel, make_tiny_hf

__all__ = ["TinyModel"]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    """arch -> TinyModel(hf_dir, gguf_path) with an F32 GGUF, built once per session."""
    root = tmp_path_factory.mktemp("tiny_models")
    out = {}
    for arch in ARCHS:
        hf_dir = make_tiny_hf(arch, root / arch)
        out[arch] = TinyModel(hf_dir, write_gguf(hf_dir, root / f"{arch}-f32.gguf"))
    return out


@pytest.fixture(scope="session")
def tiny_models_q8(tiny_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    """The same models with their GGUF quantized to Q8_0 (norms, biases and rope_freqs stay F32)."""
    root = tmp_path_factory.mktemp("tiny_models_q8")
    return {arch: TinyModel(m.hf_dir, write_gguf(m.hf_dir, root / f"{arch}-q8_0.gguf", "Q8_0"))
            for arch, m in tiny_models.items()}


@pytest.fixture(scope="session")
def tiny_models_q4(tiny_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    """The same models in Q4_0: every matrix whose rows and shape allow it takes the int4 kernels."""
    root = tmp_path_factory.mktemp("tiny_models_q4")
    return {arch: TinyModel(m.hf_dir, write_gguf(m.hf_dir, root / f"{arch}-q4_0.gguf", "Q4_0"))
            for arch, m in tiny_models.items()}


@pytest.fixture(scope="session")
def corrupt_ggufs(tiny_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Broken or unsupported GGUF files derived from the tiny llama (see write_corrupt_variants)."""
    return write_corrupt_variants(tiny_models["llama"].gguf_path, tmp_path_factory.mktemp("corrupt"))
