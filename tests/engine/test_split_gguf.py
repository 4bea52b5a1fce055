"""Models split in several GGUF files by gguf-split: any part, or their folder, loads the whole model, and a missing,
foreign or cut-short part is one line naming the file."""
import re
import shutil

import pytest
import torch

from cli.main import main
from engine.errors import ModelLoadError
from engine.loading.loader import LoadOptions, load_model
from tests.support.gguf_split_write import split_gguf


@pytest.fixture(scope="module")
def split(tiny_models_q8, tmp_path_factory):
    """The tiny llama's Q8_0 file (22 tensors) split in 4 parts of at most 7 tensors, in a folder of its own."""
    root = tmp_path_factory.mktemp("split")
    return split_gguf(tiny_models_q8["llama"].gguf_path, root / "parts" / "tiny.gguf", 7)


def _weights(lm) -> dict[str, torch.Tensor]:
    return lm.model.state_dict()


@pytest.mark.parametrize("weights", ["quantized", "dequantized"])
def test_any_part_or_their_folder_loads_the_whole_model(tiny_models_q8, split, weights):
    options = LoadOptions(weights=weights)
    whole = _weights(load_model(tiny_models_q8["llama"].gguf_path, options))
    assert len(split) == 4
    for source in (split[0], split[2], split[0].parent):
        lm = load_model(source, options)
        got = _weights(lm)
        assert got.keys() == whole.keys() and all(torch.equal(got[k], whole[k]) for k in whole), source
        assert lm.source == split[0]


def _copy(split, tmp_path):
    folder = tmp_path / "parts"
    shutil.copytree(split[0].parent, folder)
    return [folder / p.name for p in split]


def _other_split(tiny_models_q8, tmp_path, arch: str, max_tensors: int):
    return split_gguf(tiny_models_q8[arch].gguf_path, tmp_path / "other" / "tiny.gguf", max_tensors)


def _missing(parts, tiny_models_q8, tmp_path):
    parts[2].unlink()
    return parts[2], "is missing: it is part 3 of the 4 files"


def _cut_short(parts, tiny_models_q8, tmp_path):
    parts[1].write_bytes(parts[1].read_bytes()[:-5000])
    return parts[1], "is damaged or truncated"


def _of_another_split(parts, tiny_models_q8, tmp_path):
    other = _other_split(tiny_models_q8, tmp_path, "llama", 6)  # 4 parts too, cut elsewhere
    shutil.copyfile(other[1], parts[1])
    return parts[1], "which tiny-00001-of-00004.gguf holds too"


def _of_another_model(parts, tiny_models_q8, tmp_path):
    other = _other_split(tiny_models_q8, tmp_path, "qwen3", 7)
    shutil.copyfile(other[3], parts[3])
    return parts[3], "does not belong with tiny-00001-of-00004.gguf"


def _count_disagrees(parts, tiny_models_q8, tmp_path):
    other = _other_split(tiny_models_q8, tmp_path, "llama", 5)  # 5 parts
    shutil.copyfile(other[1], parts[1])
    return parts[1], "it is part 2 of 5 of a split of 22 tensors, not part 2 of 4"


@pytest.mark.parametrize("damage", [_missing, _cut_short, _of_another_split, _of_another_model, _count_disagrees])
@pytest.mark.parametrize("given", [0, 3])
def test_a_broken_split_is_one_line_naming_the_file(tiny_models_q8, split, tmp_path, damage, given):
    parts = _copy(split, tmp_path)
    named, words = damage(parts, tiny_models_q8, tmp_path)
    source = parts[given] if parts[given].is_file() else parts[0]
    with pytest.raises(ModelLoadError) as err:
        load_model(source)
    assert named.name in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("no", [2, 3])
def test_a_part_of_another_quantization_loads_and_is_named(tiny_models, split, tmp_path, no):
    """The same model's F32 file split alike: its part has the same tensors, split keys and architecture. The same
    weights in two precisions load and answer, so the load goes on and says which part differs."""
    parts = _copy(split, tmp_path)
    other = split_gguf(tiny_models["llama"].gguf_path, tmp_path / "f32" / "tiny.gguf", 7)
    shutil.copyfile(other[no - 1], parts[no - 1])
    words = (rf"tiny-0000{no}-of-00004.gguf seems to come from another quantization of the model than "
             r"tiny-00001-of-00004.gguf: \d+ of its \d+ layer matrices take a type no earlier layer's has "
             r"\(\w+.weight F32, the earlier parts' Q8_0\)\. It loads as a mix of both")
    for weights in ("quantized", "dequantized"):
        loaded = load_model(parts[3], LoadOptions(weights=weights, cache_dir=tmp_path / weights))
        assert [n for n in loaded.notices if re.match(words, n)], loaded.notices
    assert not [n for n in load_model(split[0]).notices if "another quantization" in n]  # the true split: no word


@pytest.mark.parametrize("given", [0, 2, "folder"])
def test_a_whole_model_named_as_the_first_part_is_named(tiny_models_q8, split, tmp_path, given):
    """The unsplit file under part 1's name beside the split's later parts: loading it alone would leave them unread."""
    parts = _copy(split, tmp_path)
    shutil.copyfile(tiny_models_q8["llama"].gguf_path, parts[0])
    with pytest.raises(ModelLoadError, match=r"tiny-00001-of-00004.gguf holds a whole model \(it has no split keys\), "
                                             "but its name makes it part 1 of 4 beside tiny-00002-of-00004.gguf, "):
        load_model(parts[0].parent if given == "folder" else parts[given])


def test_a_split_of_one_named_as_the_first_of_four_is_named(tiny_models_q8, split, tmp_path):
    """A file gguf-split wrote whole (split.count 1) under part 1 of 4's name, beside the other 3."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    parts = _copy(split, tmp_path)
    reader = GGUFReader(tiny_models_q8["llama"].gguf_path)
    writer = GGUFWriter(parts[0], reader.fields["general.architecture"].contents())
    for key, value, kind in (("split.no", 0, GGUFValueType.UINT16), ("split.count", 1, GGUFValueType.UINT16),
                             ("split.tensors.count", len(reader.tensors), GGUFValueType.INT32)):
        writer.add_key_value(key, value, kind)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    with pytest.raises(ModelLoadError, match=r"tiny-00001-of-00004.gguf holds a whole model \(its split.count is 1\)"):
        load_model(parts[1])


def test_a_whole_model_named_as_a_part_alone_loads(tiny_models_q8, tmp_path):
    alone = tmp_path / "tiny-00001-of-00004.gguf"
    shutil.copyfile(tiny_models_q8["llama"].gguf_path, alone)
    assert load_model(alone).source == alone


def test_the_first_part_missing_is_named_from_a_later_one(split, tmp_path):
    parts = _copy(split, tmp_path)
    parts[0].unlink()
    with pytest.raises(ModelLoadError, match="tiny-00001-of-00004.gguf is missing: it is part 1 of the 4 files"):
        load_model(parts[3])


def test_a_renamed_part_says_why_the_others_cannot_be_found(split, tmp_path):
    lone = tmp_path / "model.gguf"
    shutil.copyfile(split[0], lone)
    with pytest.raises(ModelLoadError, match="model.gguf is part 1 of a model split in 4 files, but its name"):
        load_model(lone)


def test_a_folder_of_two_models_names_them(tiny_models_q8, split, tmp_path):
    parts = _copy(split, tmp_path)
    shutil.copyfile(tiny_models_q8["qwen3"].gguf_path, parts[0].parent / "qwen3.gguf")
    with pytest.raises(ModelLoadError, match="holds 2 GGUF models .qwen3.gguf, tiny-00001-of-00004.gguf."):
        load_model(parts[0].parent)


def test_cli_names_the_missing_part_in_one_line(split, tmp_path, capsys):
    parts = _copy(split, tmp_path)
    parts[1].unlink()
    code = main(["--data-dir", str(tmp_path / "home"), "generate", "--model", str(parts[0]), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "tiny-00002-of-00004.gguf is missing" in err


def test_the_memory_estimate_counts_every_part(tiny_models_q8, split):
    from engine.loading.gguf_file import open_gguf
    from engine.memory import gguf_estimate

    def estimate(path):
        gf = open_gguf(path)
        gf.close()
        return len(gf.tensors), gguf_estimate(gf.tensors, 0, True, 4)

    assert estimate(split[1]) == estimate(tiny_models_q8["llama"].gguf_path)


@pytest.mark.parametrize("weights", ["quantized", "dequantized"])
def test_the_memory_refusal_names_the_whole_split(split, tmp_path, monkeypatch, weights):
    """Given part 3 (or their folder), the refusal names the model and its 4 files, not only the first part."""
    options = LoadOptions(weights=weights, cache_dir=tmp_path / "cache")
    load_model(split[0], options)  # the dequantized load's converted copy is checked on its own path
    monkeypatch.setattr("engine.memory.available_bytes", lambda device: 1 << 20)
    for source in (split[2], split[0].parent):
        with pytest.raises(ModelLoadError, match=r"^tiny \(4 files: tiny-00001-of-00004.gguf to tiny-00004-of-00004.gguf"
                                                 r"\) needs ~"):
            load_model(source, options)


def test_a_replaced_later_part_is_not_read_from_the_converted_copy(split, tmp_path):
    """The converted (dequantized) copy is kept under the first part's name: a later part replaced (here by one with
    the same header, its last weights' low bits flipped: other, finite values) is read afresh, not served from the copy
    of the old one."""
    parts = _copy(split, tmp_path)
    options = LoadOptions(weights="dequantized", cache_dir=tmp_path / "cache")
    assert load_model(parts[0], options).timings["from"] == "gguf"
    data = bytearray(parts[1].read_bytes())
    data[-64:] = bytes(b ^ 1 for b in data[-64:])
    parts[1].write_bytes(bytes(data))
    again = load_model(parts[0], options)
    fresh = _weights(load_model(parts[0], LoadOptions(weights="dequantized")))
    assert again.timings["from"] == "gguf"
    assert all(torch.equal(_weights(again)[k], fresh[k]) for k in fresh)
    assert load_model(parts[0], options).timings["from"] == "converted-cache"


def test_engine_flags_read_a_folder_of_parts_as_a_gguf_model(split, tmp_path, capsys):
    """--weights quantized applies to a split model's folder (it was refused as a Hugging Face folder's), --quantize
    does not (it was let through, and did nothing)."""
    folder = str(split[0].parent)
    home = ["--data-dir", str(tmp_path / "home")]
    common = ["--model", folder, "--raw", "--prompt", "hi", "--max-tokens", "2"]
    assert main([*home, "generate", *common, "--weights", "quantized"]) == 0
    assert main([*home, "generate", *common, "--quantize", "q8"]) == 2
    assert "tiny-00001-of-00004.gguf is a GGUF file" in capsys.readouterr().err


def test_the_model_named_again_as_its_draft_model_is_not_loaded_twice(split, monkeypatch):
    """Its folder as the draft model of its third part: one load, drafting from the prompts (a second copy was loaded
    to draft for it: 905 MiB resident for the embedded model in 3 parts, 590 once)."""
    import engine.engine as engine_module
    from engine import events as ev
    from engine.runtime import EngineConfig
    from tests.support.engine_client import Client

    loads, real = [], engine_module.load_model
    monkeypatch.setattr(engine_module, "load_model", lambda source, *a, **k: loads.append(source) or real(source, *a, **k))
    c = Client(EngineConfig(max_sessions=1, max_session_tokens=128, speculative="draft", draft_model=split[0].parent))
    with c.engine:
        c.load(split[2])
        info = c.wait_for(lambda e: isinstance(e, (ev.ModelLoaded, ev.ModelFailed))).info
    assert loads == [split[2]] and not info["notices"]


@pytest.mark.parametrize("weights", ["quantized", "dequantized"])
def test_a_tensor_that_cannot_be_read_names_the_part_that_holds_it(corrupt_ggufs, tmp_path, weights):
    """blk.0.attn_q.weight in a type Parley cannot read (Q8_1), in part 4 of 8: the error named part 1."""
    from engine.errors import UnsupportedModelError
    from engine.loading.gguf_header import scan_header

    parts = split_gguf(corrupt_ggufs["unsupported_tensor_type"], tmp_path / "odd.gguf", 3)
    holder = next(p for p in parts if any(t.name == "blk.0.attn_q.weight" for t in scan_header(p).tensors))
    assert holder != parts[0]
    with pytest.raises(UnsupportedModelError, match=f"^{holder.name}: tensor blk.0.attn_q.weight uses quantization"):
        load_model(parts[0], LoadOptions(weights=weights))


def test_the_server_answers_to_a_split_model_s_name_without_its_part_number(split):
    """A client sent 'tiny' for tiny-00001-of-00004.gguf and got 404: the file's name and stem answered, not the
    model's."""
    from engine.runtime import EngineConfig
    from server.bridge import ServerBridge

    bridge = ServerBridge(EngineConfig(max_sessions=1, max_session_tokens=64)).start()
    try:
        served = bridge.load(split[0], alias=str(split[0]))
        assert bridge.find("tiny") is served and bridge.find("tiny-00001-of-00004") is served
    finally:
        bridge.shutdown()


def test_a_folder_of_parts_with_the_original_config_json_loads_the_parts(tiny_models, split, tmp_path):
    """GGUF repos often keep the model's config.json beside the files: the folder was read as a Hugging Face folder
    ('... has no .safetensors weights')."""
    parts = _copy(split, tmp_path)
    shutil.copyfile(tiny_models["llama"].hf_dir / "config.json", parts[0].parent / "config.json")
    assert load_model(parts[0].parent).source == parts[0]


def test_the_server_answers_to_a_split_model_s_name_when_given_its_folder(split):
    """'parley serve --model <the parts' folder>' answered to the folder's name only: 'tiny' got 404."""
    from engine.runtime import EngineConfig
    from server.bridge import ServerBridge

    bridge = ServerBridge(EngineConfig(max_sessions=1, max_session_tokens=64)).start()
    try:
        served = bridge.load(split[0].parent, alias=str(split[0].parent))
        assert bridge.find("tiny") is served and bridge.find(split[0].parent.name) is served
    finally:
        bridge.shutdown()
