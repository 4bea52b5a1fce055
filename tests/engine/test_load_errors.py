"""Bad model input: one clear ParleyError naming the problem, and no traceback from the CLI."""
import json
import shutil
import subprocess
import sys

import pytest

from cli.main import main
from engine import events as ev
from engine.errors import ModelLoadError, UnsupportedModelError
from engine.loading.loader import load_model


@pytest.mark.parametrize(
    "variant, words",
    [
        ("truncated", "truncated"),
        ("header_only", "damaged"),
        ("bad_magic", "not a GGUF"),
        ("empty", "not a GGUF"),
        ("unsupported_arch", "mamba9000"),
        ("unsupported_tensor_type", "Q8_1"),
        ("mixture_of_experts", "mixture of 8 experts"),
    ],
)
def test_corrupt_gguf(corrupt_ggufs, variant, words):
    with pytest.raises(ModelLoadError) as err:
        load_model(corrupt_ggufs[variant])
    assert words in str(err.value)


def test_unsupported_kinds_are_unsupported_errors(corrupt_ggufs):
    for variant in ("unsupported_arch", "unsupported_tensor_type"):
        with pytest.raises(UnsupportedModelError):
            load_model(corrupt_ggufs[variant])


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope.gguf")


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(tmp_path)


def test_folder_with_unknown_architecture(tiny_models, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"].hf_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "mamba9000"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="mamba9000"):
        load_model(folder)


@pytest.mark.parametrize("change, words", [
    (lambda c: [1, 2], "not a JSON object"),
    # without head_dim, hidden_size // num_attention_heads comes first
    (lambda c: {**{k: v for k, v in c.items() if k != "head_dim"}, "num_attention_heads": 0}, "config.json does not"),
    (lambda c: {**{k: v for k, v in c.items() if k != "head_dim"}, "hidden_size": "abc"}, "config.json does not"),
    (lambda c: {**c, "num_attention_heads": 0}, "num_heads must be a whole number"),
])
def test_a_folder_config_of_the_wrong_shape_is_one_clear_error(tiny_models, tmp_path, change, words):
    """Not AttributeError / ZeroDivisionError / TypeError reprs."""
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"].hf_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(change(config)))
    with pytest.raises((ModelLoadError, UnsupportedModelError), match=words) as err:
        load_model(folder)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("index, words", [
    ("{oops", "not a safetensors index"),
    ("{}", "not a safetensors index"),
    ('{"weight_map": {"w": "../elsewhere/model.safetensors"}}', "outside the folder"),
])
def test_a_bad_safetensors_index_is_one_clear_error(tiny_models, tmp_path, index, words):
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"].hf_dir, folder)
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ModelLoadError, match=words):
        load_model(folder)


def test_folder_without_weights(tiny_models, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"].hf_dir, folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(folder)


def test_damaged_safetensors(tiny_models, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["qwen3"].hf_dir, folder)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match="could not be read"):
        load_model(folder)


def test_cli_reports_one_line_without_traceback(corrupt_ggufs, tmp_path, capsys):
    code = main(["--data-dir", str(tmp_path), "generate", "--model", str(corrupt_ggufs["truncated"]), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("parley: ") and "truncated" in err
    assert "Traceback" not in err


def test_an_error_quoting_a_path_or_an_endpoint_shows_escape_sequences_escaped(tmp_path, capsys):
    code = main(["--data-dir", str(tmp_path), "generate", "--model", str(tmp_path / "x\x1b]0;PWNED\x07.gguf"),
                 "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and "\x1b" not in err and "\\x1b]0;PWNED\\x07" in err


def test_cli_subprocess_missing_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "--data-dir", str(tmp_path), "generate", "--model", str(tmp_path / "x.gguf"), "--prompt", "hi"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "not found" in proc.stderr and "Traceback" not in proc.stderr



@pytest.mark.parametrize("raised", [OSError(12, "Cannot allocate memory"), MemoryError(),
                                    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1")])
def test_a_load_the_memory_cannot_hold_says_so_in_one_line(tiny_models, monkeypatch, raised):
    """Under `ulimit -v` (a limit the load's estimate does not see) the load's mmap or an allocation fails: measured on
    the embedded model, "Could not load …: OSError(12, 'Cannot allocate memory')"."""
    import engine.engine as engine_module
    from tests.support.engine_client import Client

    def out_of_memory(*_args, **_kwargs):
        raise raised

    monkeypatch.setattr(engine_module, "load_model", out_of_memory)
    client = Client()
    client.engine.start()
    try:
        model_id = client.engine.load_model(tiny_models["qwen3"].gguf_path)
        failed = client.wait_for(lambda e: isinstance(e, ev.ModelFailed) and e.model_id == model_id)
    finally:
        client.engine.shutdown()
    assert failed.message == ("Could not load qwen3-f32.gguf: the memory ran out while loading it; close other models "
                              "or programs, or choose a smaller model or quantization.")


TRUNCATE_MID_LOAD = """
import os, sys
from engine.errors import ModelLoadError
from engine.loading import gguf_header
from engine.loading.loader import load_model

path, when = sys.argv[1], sys.argv[2]
def cut():
    os.truncate(path, 4096)
if when == "header":  # the tensor table is being read: the metadata before it is in hand
    read_info = gguf_header._tensor_info
    def _tensor_info(c, gguf):
        cut()
        return read_info(c, gguf)
    gguf_header._tensor_info = _tensor_info
def progress(stage, fraction):
    if when == "weights" and stage == "Decoding weights" and os.path.getsize(path) > 4096:
        cut()
try:
    load_model(path, progress=progress)
except ModelLoadError as exc:
    print(exc)
"""


@pytest.mark.parametrize("when", ["header", "weights"])
def test_a_model_file_cut_short_while_it_loads_is_one_clear_error_not_sigbus(tiny_models, tmp_path, when):
    """A copy or download over the file while it loads truncates it: a mapping's pages past the new end killed the
    process with SIGBUS (a 253 MB model truncated 5 to 9 s into `parley generate`'s load: 5 of 5)."""
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_models["llama"].gguf_path, path)
    run = subprocess.run([sys.executable, "-c", TRUNCATE_MID_LOAD, str(path), when], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "cut short" in run.stdout, run.stdout


@pytest.mark.parametrize("content", [b"# my notes\nnot a model at all\n", b"GGUX" + bytes(64)])
def test_a_file_that_is_no_gguf_is_named_so_by_the_header_check(tmp_path, content):
    """The app's import reads the header first: a text file named .gguf is no model, not a damaged one."""
    from engine.loading.gguf_header import scan_header

    path = tmp_path / "notes.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="notes.gguf is not a GGUF model file") as err:
        scan_header(path)
    assert "damaged" not in str(err.value)
