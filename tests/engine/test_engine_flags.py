"""Engine flags that act on one kind of model, device or backend only: where the models or the machine make one do
nothing, the command refuses it in one line (the user's choice) or says so on stderr (the machine's), never ignores it."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cli import main as cli
from cli.engine_flags import Target, check_engine_flags
from engine.errors import ParleyError


@pytest.fixture
def gguf(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")  # refused before any load: its contents are never read
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    path = tmp_path / "hf-model"
    path.mkdir()
    return path


def _args(*flags: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["generate", *flags])


def _check(args, models, device="cpu", backend="torch", mlx_device="cpu") -> list[str]:
    notices = []
    check_engine_flags(args, Target(tuple(models), device, backend, mlx_device if backend == "mlx" else ""),
                       notices.append)
    return notices


@pytest.mark.parametrize("flags, says", [
    (["--quantize", "q8"], "argument --quantize: it quantizes a Hugging Face folder's matrices at load; model.gguf is "
                           "a GGUF file"),
    (["--compile", "--device", "cpu"], "argument --compile: it compiles the CUDA decode step; --device cpu runs it on "
                                       "the CPU"),
])
def test_a_flag_the_model_or_device_ignores_is_refused_before_the_load(gguf, capsys, flags, says):
    """`parley generate --quantize q4` on a GGUF loaded it as it was, and --compile on the CPU ran uncompiled: exit 0,
    not a word."""
    assert cli.main(["generate", "--data-dir", str(gguf.parent), "--model", str(gguf), "--prompt", "x", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"parley: {says}") and err.count("\n") == 1


def test_local_model_flags_with_remote_models_alone_are_refused(capsys, tmp_path):
    """`parley serve --remote URL --quantize q8` loads no model here: the flag did nothing."""
    assert cli.main(["serve", "--data-dir", str(tmp_path), "--remote", "http://127.0.0.1:9/v1", "--quantize", "q8",
                     "--port", "0"]) == 2
    assert capsys.readouterr().err == ("parley: argument --quantize: no local model loads (--remote alone; add "
                                       "--model)\n")
    for sizes in (["--max-sessions", "64"], ["--context", "32768"]):  # each local model's; an endpoint keeps its own
        assert cli.main(["serve", "--data-dir", str(tmp_path), "--remote", "http://127.0.0.1:9/v1", *sizes]) == 2
        assert capsys.readouterr().err.startswith(f"parley: argument {sizes[0]}: no local model loads")


def test_quantize_names_the_files_it_skips_among_folders(gguf, folder):
    """serve with a GGUF and a folder: the folder is quantized, the file keeps its own: said, not refused."""
    notices = _check(_args("--quantize", "q4"), [gguf, folder])
    assert len(notices) == 1 and notices[0].startswith("parley: --quantize q4 does nothing here: ") and \
        "model.gguf is a GGUF file" in notices[0]
    assert _check(_args("--quantize", "q4"), [folder]) == []


def test_quantize_on_cuda_is_refused_when_chosen_and_said_when_the_machine_chose(folder):
    with pytest.raises(ParleyError, match="^argument --quantize: it quantizes at load on the CPU; on cuda"):
        _check(_args("--quantize", "q8", "--device", "cuda"), [folder], device="cuda")
    assert "on cuda a folder's matrices load as floats" in _check(_args("--quantize", "q8"), [folder],
                                                                    device="cuda")[0]


def test_weights_quantized_on_a_folder_says_how_a_folder_is_quantized(gguf, folder):
    with pytest.raises(ParleyError, match="hf-model is a Hugging Face folder, whose matrices load as floats "
                                          r"\(--quantize q8\|q4"):
        _check(_args("--weights", "quantized"), [folder])
    assert _check(_args("--weights", "quantized", "--quantize", "q8"), [folder]) == []
    assert len(_check(_args("--weights", "quantized"), [gguf, folder])) == 1  # the file's flag: a notice
    with pytest.raises(ParleyError, match="^argument --weights: --quantize q8 quantizes hf-model"):
        _check(_args("--weights", "dequantized", "--quantize", "q8"), [folder])


def test_compile_without_cuda_is_said_when_the_machine_chose(gguf):
    assert _check(_args("--compile"), [gguf]) == [
        "parley: --compile does nothing here: it compiles the CUDA decode step; there is no CUDA device here"]
    assert _check(_args("--compile"), [gguf], device="cuda") == []
    with pytest.raises(ParleyError, match="^argument --compile: it compiles the decode step's CUDA graphs, which run "
                                          "on the sequence cache; --kv-layout cell runs without them"):
        _check(_args("--compile", "--kv-layout", "cell"), [gguf], device="cuda")
    with pytest.raises(ParleyError, match="the MLX backend runs the model"):
        _check(_args("--compile", "--backend", "mlx"), [gguf], backend="mlx")


def test_a_cell_cache_on_mlx_is_refused(gguf):
    with pytest.raises(ParleyError, match="^argument --kv-layout: the MLX backend keeps its own cache"):
        _check(_args("--kv-layout", "cell", "--backend", "mlx"), [gguf], backend="mlx")
    assert "--kv-layout cell does nothing here" in _check(_args("--kv-layout", "cell"), [gguf], backend="mlx")[0]
    assert _check(_args("--kv-layout", "cell"), [gguf]) == []


def test_a_device_mlx_does_not_run_on_is_refused_or_said(gguf):
    """MLX runs on its own device: --device cpu on a Mac picked MLX on the GPU (auto), --device cuda with --backend mlx
    ran on MLX's device; --device cpu where MLX runs on the CPU is what it says."""
    with pytest.raises(ParleyError, match=r"^argument --device: the MLX backend runs the model on its own device "
                                          r"\(here the CPU\); --backend torch runs it on cuda"):
        _check(_args("--device", "cuda", "--backend", "mlx"), [gguf], device="cuda", backend="mlx", mlx_device="cpu")
    assert _check(_args("--device", "cpu", "--backend", "mlx"), [gguf], backend="mlx", mlx_device="cpu") == []
    assert _check(_args("--device", "cpu"), [gguf], backend="mlx", mlx_device="gpu") == [
        "parley: --device cpu does nothing here: the MLX backend runs the model on its own device (here the GPU); "
        "--backend torch runs it on cpu"]


def test_dflash_where_it_cannot_draft_is_refused(gguf):
    """--speculative dflash with --backend mlx, or with --compile on CUDA, loaded and drafted from the prompt instead
    (a notice after the load): both flags chosen, neither done."""
    with pytest.raises(ParleyError, match="^argument --speculative: DFlash drafts on the torch backend only"):
        _check(_args("--speculative", "dflash", "--backend", "mlx"), [gguf], backend="mlx")
    with pytest.raises(ParleyError, match="^argument --speculative: DFlash drafts without compiled decode graphs"):
        _check(_args("--speculative", "dflash", "--compile"), [gguf], device="cuda")
    assert _check(_args("--speculative", "dflash"), [gguf], device="cuda") == []
    assert _check(_args("--speculative", "dflash"), [gguf], backend="mlx", mlx_device="cpu") == []  # the load says
