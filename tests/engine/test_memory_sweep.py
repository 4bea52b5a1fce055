"""Memory estimates and refusals, as a user with too little memory meets them."""
from __future__ import annotations

import re

import pytest

from engine.errors import ModelLoadError


def _sizes(message: str) -> tuple[float, float]:
    m = re.fullmatch(r"\S+ needs ~(\d+\.\d+) GB, (\d+\.\d+) GB of memory free\.", message)
    assert m, message
    return float(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("needed_gb, free_gb", [(0.4, 0.6), (2.0, 2.2), (0.5, 0.74)])
def test_refusal_names_a_need_larger_than_what_is_free(monkeypatch, needed_gb, free_gb):
    """A refusal whose two numbers read "needs ~0.4 GB, 0.6 GB free" tells the user the model fits: the need named
    is what the check compares, headroom included, and it shows larger than the free memory."""
    from engine.memory import check_fits

    monkeypatch.setattr("engine.memory.available_bytes", lambda device: int(free_gb * 2**30))
    with pytest.raises(ModelLoadError) as err:
        check_fits(int(needed_gb * 2**30), "cpu", "m.gguf")
    need, free = _sizes(str(err.value))
    assert need > free


def test_dequantized_bfloat16_on_the_cpu_counts_the_fp32_read_and_its_copy(tiny_models_q8, monkeypatch):
    """`--weights dequantized --dtype bfloat16` on the CPU holds the fp32 tensors read from the file and their bf16
    copies at once (measured on a Llama-1B-shaped Q4_K_M file: 7.5 GB at the peak, estimated 5.1): free memory that
    covers only the fp32 read is refused, not an out-of-memory kill halfway through."""
    from engine.loading.gguf_file import open_gguf
    from engine.loading.loader import LoadOptions, load_model
    from engine.memory import HEADROOM, gguf_estimate

    path = tiny_models_q8["llama"].gguf_path
    lm = load_model(path, LoadOptions(weights="dequantized", dtype="bfloat16"))
    fp32 = gguf_estimate(open_gguf(path).tensors, lm.args.vocab_size, False, 4)
    monkeypatch.setattr("engine.memory.available_bytes", lambda device: fp32 + HEADROOM + lm.weight_bytes() // 2)
    with pytest.raises(ModelLoadError, match="needs"):
        load_model(path, LoadOptions(weights="dequantized", dtype="bfloat16"))
    load_model(path, LoadOptions(weights="dequantized", dtype="float32"))  # the fp32 load alone still fits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_converted_copy_is_refused_as_its_file_is(tiny_models_q8, tmp_path, monkeypatch, dtype):
    """A dequantized model read back from the converted cache was loaded without any estimate (on CUDA straight
    onto a GPU that may not hold it): it is refused as the GGUF file is, and its entry stays for a later load."""
    from engine.loading.loader import LoadOptions, load_model

    path, cache = tiny_models_q8["llama"].gguf_path, tmp_path / "cache"
    options = LoadOptions(weights="dequantized", dtype=dtype, cache_dir=cache)
    assert load_model(path, options).timings["from"] == "gguf"
    monkeypatch.setattr("engine.memory.available_bytes", lambda device: 1 << 20)
    with pytest.raises(ModelLoadError, match=r"needs ~.* GB of memory free\."):
        load_model(path, options)
    monkeypatch.undo()
    assert load_model(path, options).timings["from"] == "converted-cache"


def test_a_converted_copy_estimate_covers_what_it_holds(tiny_models_q8, tmp_path):
    """The cache's fp32 tensors are used as read by an fp32 load (counted once), copied by a bf16 one."""
    from engine.loading import converted, hf_folder
    from engine.loading.loader import LoadOptions, load_model
    from engine.memory import LOAD_SCRATCH, hf_estimate

    path, cache = tiny_models_q8["llama"].gguf_path, tmp_path / "cache"
    lm = load_model(path, LoadOptions(weights="dequantized", cache_dir=cache))
    shapes = hf_folder.file_tensor_shapes(converted.entry_dir(cache, path) / "model.safetensors")
    fp32, _ = hf_estimate(shapes, 0, 4, None, "cpu", mapped=True)
    bf16, _ = hf_estimate(shapes, 0, 2, None, "cpu", mapped=True)
    assert abs(fp32 - LOAD_SCRATCH - lm.weight_bytes()) <= 0.05 * lm.weight_bytes()
    assert abs(bf16 - LOAD_SCRATCH - 1.5 * lm.weight_bytes()) <= 0.05 * lm.weight_bytes()


@pytest.mark.parametrize("damage", [b"\xff" * 8, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json", b""])
def test_a_damaged_converted_copy_is_rebuilt_not_refused(tiny_models_q8, tmp_path, damage):
    """Sizing a converted entry reads its safetensors header: a damaged one is rebuilt from the GGUF, as before."""
    from engine.loading import converted
    from engine.loading.loader import LoadOptions, load_model

    path, cache = tiny_models_q8["llama"].gguf_path, tmp_path / "cache"
    options = LoadOptions(weights="dequantized", cache_dir=cache)
    load_model(path, options)
    (converted.entry_dir(cache, path) / "model.safetensors").write_bytes(damage)
    assert load_model(path, options).timings["from"] == "gguf"
    assert load_model(path, options).timings["from"] == "converted-cache"


GiB = 1 << 30


def _cgroup(folder, limit: str, usage: int, stat: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    v2 = "inactive_file" in stat and "total_" not in stat
    (folder / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(limit + "\n")
    (folder / ("memory.current" if v2 else "memory.usage_in_bytes")).write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(stat)


def test_cgroup_v2_limit_and_its_parents(tmp_path):
    """cgroup v2 (systemd slices, Docker, Podman): the tightest of the cgroup's and its parents' limits, less what
    they use, the inactive page cache counting as free; "max" is no limit."""
    from engine.memory import cgroup_free_bytes

    root, own = tmp_path / "sys", tmp_path / "cgroup"
    own.write_text("0::/user.slice/app.scope\n")
    _cgroup(root / "user.slice/app.scope", str(2 * GiB), GiB + GiB // 2, f"anon 1\ninactive_file {GiB // 4}\n")
    _cgroup(root / "user.slice", "max", 5 * GiB, "inactive_file 0\n")
    assert cgroup_free_bytes(root, own) == GiB // 2 + GiB // 4
    _cgroup(root / "user.slice", str(3 * GiB), 3 * GiB - GiB // 8, "inactive_file 0\n")
    assert cgroup_free_bytes(root, own) == GiB // 8
    (root / "user.slice/app.scope/memory.max").write_text("max\n")
    (root / "user.slice/memory.max").write_text("max\n")
    assert cgroup_free_bytes(root, own) is None


def test_cgroup_v1_container_sees_its_own_cgroup_at_the_mount(tmp_path):
    """cgroup v1 in Docker: /proc/self/cgroup names /docker/<id>, while the mount shows that cgroup itself; a v1 cgroup
    without a limit reads 2^63 rounded to a page."""
    from engine.memory import cgroup_free_bytes

    root, own = tmp_path / "sys", tmp_path / "cgroup"
    own.write_text("12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    _cgroup(root / "memory", str(4 * GiB), 3 * GiB, f"cache 9\ntotal_inactive_file {GiB}\n")
    assert cgroup_free_bytes(root, own) == 2 * GiB
    (root / "memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_free_bytes(root, own) is None
    assert cgroup_free_bytes(root, tmp_path / "absent") is None


def test_a_model_larger_than_the_containers_limit_is_refused(tiny_models_q8, tmp_path, monkeypatch):
    """Inside a container /proc/meminfo shows the host's memory: a model over the container's limit passed the check
    and the kernel killed Parley mid-load. The free memory is the limit's, and the refusal one line."""
    import engine.memory as memory
    from engine.loading.loader import LoadOptions, load_model

    own = tmp_path / "cgroup"
    own.write_text("0::/\n")
    _cgroup(tmp_path / "sys", str(GiB), GiB - (100 << 20), "inactive_file 0\n")
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path / "sys")
    monkeypatch.setattr(memory, "OWN_CGROUP", own)
    assert memory.available_bytes("cpu") == 100 << 20
    with pytest.raises(ModelLoadError, match=r"^\S+ needs ~\d+\.\d+ GB, 0\.1 GB of memory free\.$"):
        load_model(tiny_models_q8["llama"].gguf_path, LoadOptions(weights="quantized"))


def _float32_folder(tiny_models, out):
    """The tiny Llama's tokenizer with 4 layers 512 wide: ~60 MB of fp32 safetensors."""
    import json
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    src = tiny_models["llama"].hf_dir
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors*"))
    config = json.loads((src / "config.json").read_text())
    config.update(hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).float().save_pretrained(out, safe_serialization=True)
    return out


def test_a_folder_in_the_runtime_dtype_counts_once(tiny_models, tmp_path, monkeypatch):
    """An fp32 folder loaded as fp32 on the CPU is used as read from its shards' mapping (resident growth ~0 at load;
    measured 15 MB for 733 MB of shards), yet it was estimated at twice its size: refused with room for it and more.
    A folder converted to another dtype still counts both copies."""
    from engine.loading.hf_folder import safetensor_files
    from engine.loading.loader import LoadOptions, load_model
    from engine.memory import HEADROOM, LOAD_SCRATCH, TOKENIZER_BYTES_PER_TOKEN, resident_bytes

    folder = _float32_folder(tiny_models, tmp_path / "llama-fp32")
    size = sum(f.stat().st_size for f in safetensor_files(folder))
    room = size + size // 4 + LOAD_SCRATCH + 1024 * TOKENIZER_BYTES_PER_TOKEN + HEADROOM
    monkeypatch.setattr("engine.memory.available_bytes", lambda device: room)
    before = resident_bytes()
    lm = load_model(folder, LoadOptions())
    assert resident_bytes() - before < size // 2 and lm.weight_bytes() > 0.9 * size
    with pytest.raises(ModelLoadError, match="needs"):
        load_model(folder, LoadOptions(dtype="bfloat16"))


def test_free_memory_is_read_as_unknown_when_no_descriptor_is_left(tmp_path):
    """A server with every descriptor taken by clients: reading /proc/meminfo raised OSError(24) at a cache growth,
    and every turn of that step failed ("Generation failed: OSError(24, 'Too many open files')")."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.descriptors import TAKE_EVERY_DESCRIPTOR

    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from engine.memory import available_bytes
{TAKE_EVERY_DESCRIPTOR}
print(available_bytes("cpu") > 0)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "True", run.stderr[-500:]


def test_a_model_whose_first_cache_does_not_fit_is_refused_in_one_line(tiny_models_q8, monkeypatch):
    """The load keeps 256 MB aside, less than the first cache of 8 chats of an 8B model (302 MB): a model that fit
    with no room for it loaded, then its first message failed ('can't start new thread' under `ulimit -v`) or the
    kernel killed Parley. The cache is counted, exactly as it is then allocated, before it is."""
    from engine.cache import first_cache_bytes
    from engine.cache.growth import GROWTH_MARGIN
    from engine.loading.loader import LoadOptions, load_model
    from engine.runtime import EngineConfig, build_runtime

    lm = load_model(tiny_models_q8["qwen3"].gguf_path, LoadOptions(weights="quantized"))
    config = EngineConfig(max_sessions=8, max_session_tokens=512)
    cache = build_runtime(lm, config).batcher.cache
    first = sum(t.numel() * t.element_size() for t in (*cache.k, *cache.v))
    args = lm.args
    assert first_cache_bytes(cache.config, args.layer_windows(), args.num_kv_heads, args.head_dim) == first
    monkeypatch.setattr("engine.memory.available_bytes", lambda device: GROWTH_MARGIN + first // 2)
    with pytest.raises(ModelLoadError) as err:
        build_runtime(lm, config)
    m = re.fullmatch(r"\S+ loaded, but its cache for 8 chats at once needs ~(\d\.\d+) GB more, (\d\.\d+) GB of memory "
                     r"free\.", str(err.value))
    assert m and float(m.group(1)) > float(m.group(2)), err.value
    monkeypatch.setattr("engine.memory.available_bytes", lambda device: GROWTH_MARGIN + first)
    build_runtime(lm, config)  # room for the cache and the margin: it builds


def _peak_growth(fn) -> int:
    """Bytes the process's peak resident set rose above its resident set while `fn` ran (Linux: VmHWM reset)."""
    import psutil

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak starts again from the resident set now
    before = psutil.Process().memory_info().rss
    fn()
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM"))
    return hwm - before


@pytest.mark.skipif(not __import__("os").access("/proc/self/clear_refs", __import__("os").W_OK),
                    reason="needs Linux's resettable peak resident set")
def test_fusing_projections_frees_each_layers_parts_as_it_goes(tiny_models):
    """The runner fuses q/k/v and gate/up into one matrix each before the model serves: every replaced part stayed
    alive until the last layer was fused (a list of all modules held them), and the heap's holes were not given back,
    so the load peaked at the model plus a copy of those matrices (a Llama-1B-shaped Q4_K_M: +388 MB over a 72 MB
    cache; an 8B: +2.5 GB). The parts now go layer by layer."""
    import copy
    import json

    import torch

    from engine.loading.loader import build_model
    from engine.memory import return_freed_memory
    from engine.models import architecture
    from engine.models.kernel_choice import choose_kernels
    from engine.quant.from_float import quantize_matrix

    config = json.loads((tiny_models["llama"].hf_dir / "config.json").read_text())
    config.update(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=8, head_dim=128)
    arch = architecture("llama")
    args = arch.args_from_hf(config)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in arch.Model(args).state_dict().items()}
    torch.manual_seed(0)
    one = {s: quantize_matrix(torch.randn(s) * 0.02, "q8") for s in set(shapes.values()) if len(s) == 2}
    weights = {k: copy.deepcopy(one[s]) if len(s) == 2 else torch.ones(s) for k, s in shapes.items()}
    model = build_model(args, weights, torch.float32, "cpu")
    del weights, one
    return_freed_memory()  # as the load ends: the heap's free pages go back, the fusion's allocations are new pages
    parts = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    fused = sum(b.numel() * b.element_size() for name, m in model.named_modules() if name.endswith(parts)
                for b in m.buffers())
    grew = _peak_growth(lambda: model.prepare(choose_kernels(torch.device("cpu"), quantized=True)))
    assert model.model.layers[0].self_attn.qkv_proj is not None  # fused
    assert grew < fused // 3, (grew >> 20, fused >> 20)
