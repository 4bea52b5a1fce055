"""The cache of SentencePiece tokenizers built from GGUF `llama` vocabularies: a later load reads the saved model
instead of building it, and gives the same tokenizer; a damaged entry, a replaced file or an unwritable cache never
fails a load."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.loading import tokenizer_cache
from engine.loading.tokenizer_cache import gguf_tokenizer
from tests.support.gemma import byte_level_metadata, sentencepiece_metadata, train_sentencepiece
from tests.support.gemma import trained_byte_level  # noqa: F401 (a fixture)

TEXT = "Hello world, <start_of_turn>user\n東京 123 ▁ spaces   end"


@pytest.fixture(scope="module")
def metadata() -> dict:
    return sentencepiece_metadata(train_sentencepiece(add_dummy_prefix=True), add_space_prefix=True)


@pytest.fixture
def gguf(tmp_path: Path, metadata: dict) -> SimpleNamespace:
    """What gguf_tokenizer reads of an opened file: its path (the cache's key) and metadata."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF stand-in")
    return SimpleNamespace(path=path, metadata=metadata)


def _no_build(monkeypatch) -> None:
    def fail(metadata):
        raise AssertionError("the tokenizer was built, not read from the cache")

    monkeypatch.setattr(tokenizer_cache, "tokenizer_from_gguf", fail)


def _same(a, b) -> None:
    assert a.encode(TEXT) == b.encode(TEXT) and a.decode(a.encode(TEXT)) == b.decode(b.encode(TEXT))
    assert (a.vocab_size, a.bos_id, a.eos_id, a.stop_ids) == (b.vocab_size, b.bos_id, b.eos_id, b.stop_ids)


def test_a_later_load_reads_the_saved_tokenizer(gguf, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    built = gguf_tokenizer(gguf, cache)
    entries = list((cache / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "complete").exists()
    _no_build(monkeypatch)
    _same(gguf_tokenizer(gguf, cache), built)



LOAD_TWICE = """
import sys
from pathlib import Path
from types import SimpleNamespace
from engine.loading import tokenizer_cache
from tests.support.gemma import sentencepiece_metadata, train_sentencepiece
gguf = SimpleNamespace(path=Path(sys.argv[1]), metadata=sentencepiece_metadata(
    train_sentencepiece(add_dummy_prefix=True), add_space_prefix=True))
tokenizer_cache.gguf_tokenizer(gguf, Path(sys.argv[2]))
tokenizer_cache.tokenizer_from_gguf = None  # the second load must read the entry
tokenizer_cache.gguf_tokenizer(gguf, Path(sys.argv[2]))
"""


def test_a_file_whose_name_the_locale_cannot_encode_is_cached(tmp_path):
    """Under an ASCII locale "Jöse.gguf" reaches Python as surrogate escapes: the entry's key and `source` were
    encoded as UTF-8 text, which raised, and the model did not load."""
    path = tmp_path / "Jöse 模型.gguf"
    path.write_bytes(b"GGUF stand-in")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    proc = subprocess.run([sys.executable, "-c", LOAD_TWICE, str(path), str(tmp_path / "cache")], env=env, cwd=root,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    (entry,) = (tmp_path / "cache" / "tokenizers").iterdir()
    assert (entry / "source").read_bytes() == os.fsencode(path.resolve())


def test_a_damaged_entry_is_rebuilt(gguf, tmp_path):
    cache = tmp_path / "cache"
    built = gguf_tokenizer(gguf, cache)
    (entry,) = (cache / "tokenizers").iterdir()
    model = next(p for p in (entry / "tokenizer").iterdir() if p.suffix == ".model")
    model.write_bytes(model.read_bytes()[:100])  # truncated
    _same(gguf_tokenizer(gguf, cache), built)
    (again,) = (cache / "tokenizers").iterdir()
    assert again == entry and (again / "complete").exists() and model.stat().st_size > 100  # written again


def test_a_replaced_file_gets_a_fresh_entry_in_place_of_the_old(gguf, tmp_path, metadata):
    cache = tmp_path / "cache"
    gguf_tokenizer(gguf, cache)
    other = SimpleNamespace(path=tmp_path / "other.gguf", metadata=metadata)
    other.path.write_bytes(b"another GGUF stand-in")
    gguf_tokenizer(other, cache)
    (old,) = [e for e in (cache / "tokenizers").iterdir() if e.name.startswith("model-")]
    st = gguf.path.stat()
    os.utime(gguf.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    gguf_tokenizer(gguf, cache)
    entries = sorted(e.name for e in (cache / "tokenizers").iterdir())
    assert len(entries) == 2 and old.name not in entries  # the other file's entry stays


def test_an_unwritable_cache_still_loads(gguf, tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    _same(gguf_tokenizer(gguf, blocker), gguf_tokenizer(gguf, None))


def test_byte_level_vocabularies_save_their_arrays_and_build_the_same_tokenizer(
        tmp_path, trained_byte_level, monkeypatch):  # noqa: F811
    """A `gpt2` vocabulary's BPE is built at every load; its entry holds the arrays it is built from (read in a few
    calls, not walked in the header), and a vocabulary whose strings hold the separator is built from the header."""
    from engine.loading import saved_vocabulary

    gf = SimpleNamespace(path=tmp_path / "model.gguf", metadata=byte_level_metadata(trained_byte_level))
    gf.path.write_bytes(b"GGUF stand-in")
    built = gguf_tokenizer(gf, tmp_path / "cache")
    (entry,) = (tmp_path / "cache" / "tokenizers").iterdir()
    assert saved_vocabulary.load_vocabulary(entry) == {k: v for k, v in gf.metadata.items()
                                                       if k in saved_vocabulary.STRINGS + saved_vocabulary.NUMBERS}
    monkeypatch.setattr(tokenizer_cache, "_metadata", lambda gf: pytest.fail("the header's vocabulary was read"))
    _same(gguf_tokenizer(gf, tmp_path / "cache"), built)
    odd = SimpleNamespace(path=tmp_path / "odd.gguf", metadata={
        **gf.metadata, "tokenizer.ggml.tokens": [*gf.metadata["tokenizer.ggml.tokens"], "a\uffffb"],
        "tokenizer.ggml.token_type": [*gf.metadata["tokenizer.ggml.token_type"], 1]})
    odd.path.write_bytes(b"another GGUF stand-in")
    monkeypatch.undo()
    gguf_tokenizer(odd, tmp_path / "cache")
    assert saved_vocabulary.load_vocabulary(next(e for e in (tmp_path / "cache" / "tokenizers").iterdir()
                                                 if e.name.startswith("odd-"))) is None


def test_an_entry_another_parley_wrote_meanwhile_is_kept(tmp_path):
    """Parleys started at once each build and write the entry: the later one replaced the first's (rmtree, rename),
    and a third reading it then found it gone and built its own (every read a build, 11 of 11, with two processes
    writing the embedded model's entry in a loop; 0 of 37 now)."""
    from engine.loading.converted import TMP_PREFIX, write_entry

    d = tmp_path / "tokenizers" / "model-0123456789abcdef"
    write_entry(d, lambda tmp: (tmp / "x").write_text("first"))
    inode = (d / "x").stat().st_ino
    write_entry(d, lambda tmp: (tmp / "x").write_text("second"))
    assert (d / "x").read_text() == "first" and (d / "x").stat().st_ino == inode
    other = tmp_path / "tokenizers" / "other-0123456789abcdef"

    def fill_while_another_finishes(tmp):
        write_entry(other, lambda t: (t / "x").write_text("theirs"))
        (tmp / "x").write_text("mine")

    write_entry(other, fill_while_another_finishes)
    assert (other / "x").read_text() == "theirs"
    assert not list(d.parent.glob(TMP_PREFIX + "*"))


def _walked(monkeypatch) -> list[int]:
    """The counts of the string arrays the GGUF header reader walks from now on, each walked as before."""
    from engine.loading import gguf_header

    walked, real = [], gguf_header._Cursor.strings
    monkeypatch.setattr(gguf_header._Cursor, "strings", lambda c, n, what: walked.append(n) or real(c, n, what))
    return walked


def _spm_llama(tiny_llama: Path, out: Path, meta: dict) -> Path:
    """The tiny Llama's layers under a SentencePiece (`llama`) vocabulary, as Llama 2's and Gemma's files hold one; a
    scalar follows the vocabulary's arrays, which a read that passes over them must still find."""
    import gguf
    import numpy as np

    from engine.loading.gguf_file import open_gguf

    src = open_gguf(tiny_llama)
    n = len(meta["tokenizer.ggml.tokens"])
    w = gguf.GGUFWriter(out, "llama")
    for key, value in src.metadata.items():
        if key.startswith("llama.") and key != "llama.vocab_size":
            (w.add_float32 if isinstance(value, float) else w.add_uint32)(key, value)
    w.add_uint32("llama.vocab_size", n)
    w.add_tokenizer_model("llama")
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_scores(meta["tokenizer.ggml.scores"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    w.add_add_space_prefix(True)
    w.add_string("general.name", "after the vocabulary")
    rng = np.random.default_rng(0)
    for t in src.tensors:
        data = src.tensor(t).numpy()
        if t.name in ("token_embd.weight", "output.weight"):  # one row a token of the new vocabulary
            data = rng.standard_normal((n, data.shape[1])).astype(np.float32)
        w.add_tensor(t.name, data)
    src.close()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_a_load_that_finds_its_tokenizer_reads_the_header_without_the_vocabulary(tmp_path, metadata, tiny_models,
                                                                                  monkeypatch):
    """A load whose tokenizer was saved still read every token string of the header (the embedded Gemma's 262,144:
    0.23-0.31 s of Python a load, beside the app's window, which waited for the interpreter meanwhile); it passes over
    them now where the saved entry says they lie (0.006 s), and the model and its tokenizer are the same."""
    from engine.loading.loader import LoadOptions, load_model

    path = _spm_llama(tiny_models["llama"].gguf_path, tmp_path / "spm-llama.gguf", metadata)
    cache = tmp_path / "cache"
    first = load_model(path, LoadOptions(cache_dir=cache))
    walked = _walked(monkeypatch)
    second = load_model(path, LoadOptions(cache_dir=cache))
    assert walked == []  # the first load walked its n token strings
    assert second.name == first.name == "after the vocabulary" and second.args == first.args
    _same(second.tokenizer, first.tokenizer)


def test_a_byte_level_model_loaded_again_reads_the_header_without_its_vocabulary(tmp_path, tiny_models, monkeypatch):
    """A `gpt2` vocabulary (Qwen's, Llama 3's: 151,300 tokens and 151,000 merges walked in 0.27-0.39 s of Python at
    every load) is read from its entry at a second load; the tokenizer built from it is the same."""
    from engine.loading.loader import LoadOptions, load_model

    cache = tmp_path / "cache"
    first = load_model(tiny_models["llama"].gguf_path, LoadOptions(cache_dir=cache))
    walked = _walked(monkeypatch)
    second = load_model(tiny_models["llama"].gguf_path, LoadOptions(cache_dir=cache))
    assert walked == []  # the first load walked its 406 tokens and 144 merges
    _same(second.tokenizer, first.tokenizer)
    assert second.tokenizer.encode("<|begin_of_text|>Hi") == first.tokenizer.encode("<|begin_of_text|>Hi")


def test_the_template_of_a_model_loaded_before_is_read_without_its_vocabulary(tmp_path, metadata, tiny_models,
                                                                              monkeypatch):
    """The app reads a model's chat template from its file before it loads (Settings greys Thinking): the header read
    walked every token string (the embedded Gemma's: 192-199 ms of Python on the app's worker thread, 18 ms now)."""
    from engine.loading.gguf_file import open_gguf
    from engine.loading.template_probe import template_thinking_switch

    path = _spm_llama(tiny_models["llama"].gguf_path, tmp_path / "spm-llama.gguf", metadata)
    cache = tmp_path / "cache"
    gguf_tokenizer(open_gguf(path), cache)
    walked = _walked(monkeypatch)
    assert template_thinking_switch(path, cache) is False and walked == []
    assert template_thinking_switch(path) is False and walked == [len(metadata["tokenizer.ggml.tokens"])]


def test_spans_that_do_not_fit_the_file_read_it_whole(tmp_path, metadata, tiny_models):
    """Spans of another file, or of a damaged entry, pass over nothing; a tokenizer that must be built again from a
    header read without its vocabulary reads the vocabulary first."""
    from engine.loading.gguf_file import open_gguf
    from engine.loading.gguf_header import Span
    from engine.loading.tokenizer_cache import vocabulary_spans

    path = _spm_llama(tiny_models["llama"].gguf_path, tmp_path / "spm-llama.gguf", metadata)
    cache = tmp_path / "cache"
    assert vocabulary_spans(cache, path) == {}
    whole = open_gguf(path)
    built = gguf_tokenizer(whole, cache)
    spans = vocabulary_spans(cache, path)
    assert set(spans) == {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}
    tokens = spans["tokenizer.ggml.tokens"]
    for wrong in (Span(tokens.start + 1, tokens.end, tokens.length), Span(tokens.start, tokens.end, tokens.length + 1),
                  Span(tokens.start, 1 << 40, tokens.length)):
        gf = open_gguf(path, {"tokenizer.ggml.tokens": wrong})
        assert not gf.skipped and gf.metadata == whole.metadata
    skipped = open_gguf(path, spans)
    assert skipped.skipped == set(spans) and "tokenizer.ggml.tokens" not in skipped.metadata
    assert {k: v for k, v in whole.metadata.items() if k not in spans} == skipped.metadata
    (entry,) = (cache / "tokenizers").iterdir()
    (entry / "tokenizer" / "tokenizer.model").write_bytes(b"damaged")
    _same(gguf_tokenizer(skipped, cache), built)  # rebuilt from the vocabulary, read again
    (entry / "vocabulary_spans.json").unlink()  # an entry saved before entries held spans
    gguf_tokenizer(whole, cache)
    assert vocabulary_spans(cache, path) == spans
