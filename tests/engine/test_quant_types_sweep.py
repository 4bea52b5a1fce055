"""Model files users bring: a replaced file's caches, quantization types and shapes the common files do not have."""
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.loading.loader import LoadOptions, load_model
from tests.support.gguf_export import write_gguf
from tests.support.tiny_models import make_tiny_hf


@pytest.fixture(scope="module")
def two_llamas(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny llama GGUFs of the same size and different weights."""
    root = tmp_path_factory.mktemp("two_llamas")
    a, b = (write_gguf(make_tiny_hf("llama", root / f"hf{seed}", seed=seed), root / f"{seed}.gguf")
            for seed in (0, 1))
    assert a.stat().st_size == b.stat().st_size
    return a, b


def _embedding(path: Path, cache: Path) -> tuple[torch.Tensor, str]:
    lm = load_model(path, LoadOptions(weights="dequantized", cache_dir=cache))
    return lm.model.state_dict()["model.embed_tokens.weight"], lm.timings["from"]


def test_a_file_replaced_with_its_date_kept_is_not_read_from_the_stale_cache(two_llamas, tmp_path):
    """cp -p / rsync -a put another model of the same size and mtime at the path: its own weights, not the cached."""
    a, b = two_llamas
    target, cache = tmp_path / "model.gguf", tmp_path / "cache"
    shutil.copy2(a, target)
    first, _ = _embedding(target, cache)
    assert _embedding(target, cache)[1] == "converted-cache"
    shutil.copy2(b, target)
    os.utime(target, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    replaced, source = _embedding(target, cache)
    assert source == "gguf"
    assert torch.equal(replaced, _embedding(b, None)[0]) and not torch.equal(replaced, first)


def test_a_replaced_file_leaves_one_converted_entry(two_llamas, tmp_path):
    """The older version's fp32 copy (four bytes a weight) is removed once the new one is written."""
    a, b = two_llamas
    target, cache = tmp_path / "model.gguf", tmp_path / "cache"
    shutil.copy(a, target)
    _embedding(target, cache)
    shutil.copy(b, target)
    _embedding(target, cache)
    assert len(list((cache / "converted").iterdir())) == 1


def test_a_full_cache_disk_only_costs_the_entry(two_llamas, tmp_path):
    """Writing the converted copy fails (a file size limit: what a full disk does to the write): the model still
    loads, and no half-written entry is left."""
    code = ("import sys; from engine.loading.loader import LoadOptions, load_model; "
            "load_model(sys.argv[1], LoadOptions(weights='dequantized', cache_dir=sys.argv[2]))")
    limit = two_llamas[0].stat().st_size // 2
    done = subprocess.run([sys.executable, "-c", code, str(two_llamas[0]), str(tmp_path)], capture_output=True,
                          text=True, cwd=Path(__file__).parents[2], timeout=300,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert done.returncode == 0, done.stderr[-500:]
    assert list((tmp_path / "converted").iterdir()) == []


def test_a_type_newer_than_parley_is_unsupported_not_damaged(two_llamas, tmp_path):
    """llama.cpp's Q2_0 (type 42, after gguf-py's list): a valid file Parley cannot read yet, not a damaged one."""
    import ctypes

    import gguf

    llama_cpp = pytest.importorskip("llama_cpp")
    if not hasattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_Q2_0") or hasattr(gguf.GGMLQuantizationType, "Q2_0"):
        pytest.skip("needs a llama.cpp with Q2_0 and a gguf-py without it")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_0, 1
    out = tmp_path / "q2_0.gguf"
    assert llama_cpp.llama_model_quantize(str(two_llamas[0]).encode(), str(out).encode(), ctypes.byref(params)) == 0
    with pytest.raises(UnsupportedModelError, match="does not know") as err:
        load_model(out)
    assert "damaged" not in str(err.value)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings (Linux)")
def test_an_fp32_folder_quantized_at_load_keeps_no_mapping_of_its_shards(tmp_path):
    """Its norms were views into the shards' mapping, which kept the whole file resident beside the quantized model
    (an fp32 folder with --quantize q8: 124 MB resident for 24 MB of weights)."""
    folder = make_tiny_hf("llama", tmp_path / "hf")
    lm = load_model(folder, LoadOptions(quantize="q8"))
    shards = [str(f) for f in folder.glob("*.safetensors")]
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if any(s in line for s in shards)]
    assert lm.is_quantized() and mapped == []
