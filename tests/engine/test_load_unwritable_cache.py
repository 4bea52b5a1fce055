"""A cache folder Parley cannot write (a read-only PARLEY_HOME, a full disk) cost every load its tokenizer build or its
conversion again, without a word (the embedded model: ~3 s more at each start). The load now says so in a notice."""
from __future__ import annotations

from types import SimpleNamespace

from engine.loading.loader import LoadOptions, load_model
from engine.loading.tokenizer_cache import gguf_tokenizer
from tests.support.gemma import sentencepiece_metadata, train_sentencepiece

SAYS = ("Parley's cache folder {} could not be written (read-only or full): {} is made again at every load, "
        "which takes longer.")


def test_a_tokenizer_it_cannot_save_is_told(tmp_path):
    metadata = sentencepiece_metadata(train_sentencepiece(add_dummy_prefix=True), add_space_prefix=True)
    gf = SimpleNamespace(path=tmp_path / "model.gguf", metadata=metadata)  # what gguf_tokenizer reads of a file
    gf.path.write_bytes(b"GGUF stand-in")
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    notices: list[str] = []
    gguf_tokenizer(gf, blocker, notices)
    assert notices == [SAYS.format(blocker, "model.gguf's tokenizer")]
    gguf_tokenizer(gf, tmp_path / "writable", notices := [])
    gguf_tokenizer(gf, tmp_path / "writable", notices)
    assert notices == []


def test_a_converted_copy_it_cannot_save_is_told(tiny_models, tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    path = tiny_models["llama"].gguf_path
    lm = load_model(path, LoadOptions(weights="dequantized", cache_dir=blocker))
    assert SAYS.format(blocker, f"{path.name}'s converted copy (weights dequantized)") in lm.notices
    assert not any("cache folder" in n for n in load_model(path, LoadOptions(cache_dir=blocker)).notices)  # a BPE's


def test_a_kernel_library_it_cannot_save_is_told(tiny_models, tmp_path, monkeypatch):
    """A read-only home: the CPU kernels were built into a temporary folder at every start (~10 s here), unsaid."""
    from kernels import cpu_native

    monkeypatch.setenv("PARLEY_KERNEL_CACHE", str(tmp_path / "kernels"))
    built = cpu_native.CpuKernel(lib=None, isa="avx2", path=None)  # what _load returns for a private build
    monkeypatch.setattr(cpu_native, "_load", lambda: (built, None))
    assert cpu_native.built_privately() == tmp_path / "kernels"
    monkeypatch.setattr(cpu_native, "_load", lambda: (cpu_native.CpuKernel(None, "avx2", tmp_path / "k.so"), None))
    assert cpu_native.built_privately() is None  # cached where it belongs
    monkeypatch.setattr(cpu_native, "_load", lambda: (None, "no C compiler was found"))
    assert cpu_native.built_privately() is None  # none at all: missing_reason's notice says that
    monkeypatch.undo()
    monkeypatch.setattr(cpu_native, "built_privately", lambda: tmp_path / "kernels")
    monkeypatch.setattr(cpu_native, "missing_reason", lambda: None)
    notices = load_model(tiny_models["llama"].gguf_path, LoadOptions(cache_dir=tmp_path / "cache")).notices
    assert (f"Parley's kernel folder {tmp_path / 'kernels'} could not be written (read-only or full): its CPU kernels "
            "are built again at every start, which takes longer.") in notices
