"""Hostile GGUF files (issue 23): mutants of the tiny model, written here byte by byte, end in one clear error or a
correct load, quickly and without exhausting memory (items 5, 10, 17), including a hypothesis fuzz of the header."""
from __future__ import annotations

import resource
import struct
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ParleyError
from engine.loading.gguf_file import open_gguf
from engine.loading.loader import LoadOptions, load_model
from engine.tokenizer import tokenizer_from_gguf

V = gguf.GGUFValueType
SCALAR_FORMATS = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
                  V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d"}
LOAD_SECONDS = 20.0
RSS_GROWTH = 1 << 30  # what one hostile load may add to the process's peak resident set


@dataclass
class Tensor:
    name: str
    dims: list[int]  # GGUF order: innermost first
    type_id: int
    offset: int  # from the start of the data section


@dataclass
class Layout:
    """A GGUF file as editable parts: metadata (key -> (type, value, item type)), tensor table, data bytes."""

    kv: dict[str, tuple]
    tensors: list[Tensor]
    data: bytes
    alignment: int = 32
    extra_header: bytes = b""

    def set(self, key: str, vtype, value, sub=None) -> "Layout":
        kv = dict(self.kv)
        kv[key] = (vtype, value, sub)
        return replace(self, kv=kv)

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def write(self, path: Path) -> Path:
        out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
        for key, (vtype, value, sub) in self.kv.items():
            out += _string(key) + struct.pack("<I", vtype) + _value(vtype, value, sub)
        for t in self.tensors:
            out += _string(t.name) + struct.pack("<I", len(t.dims)) + b"".join(struct.pack("<Q", d) for d in t.dims)
            out += struct.pack("<IQ", t.type_id, t.offset)
        out += self.extra_header
        out += b"\0" * (-len(out) % self.alignment)
        path.write_bytes(bytes(out) + self.data)
        return path


def _string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype, value, sub=None) -> bytes:
    if vtype == V.STRING:
        return _string(value)
    if vtype == V.ARRAY:
        return struct.pack("<IQ", sub, len(value)) + b"".join(_value(sub, v) for v in value)
    return struct.pack(SCALAR_FORMATS[V(vtype)], value)


def read_layout(path: Path) -> Layout:
    reader = gguf.GGUFReader(path)
    kv = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        sub = f.types[-1] if f.types[0] == V.ARRAY else None
        kv[key] = (f.types[0], f.contents(), sub)
    blob = path.read_bytes()
    start = reader.data_offset
    tensors = [Tensor(t.name, [int(d) for d in t.shape], int(t.tensor_type), int(t.data_offset) - start)
               for t in reader.tensors]
    return Layout(kv, tensors, blob[start:])


@pytest.fixture(scope="module")
def llama(tiny_models) -> Layout:
    return read_layout(tiny_models["llama"].gguf_path)


@pytest.fixture(scope="module")
def gemma(tiny_models) -> Layout:
    return read_layout(tiny_models["gemma3"].gguf_path)


def load_bounded(path: Path):
    """Loads `path`: a clear error or a model, within the time and memory bounds; returns the model or the error."""
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.monotonic()
    try:
        result = load_model(path, LoadOptions())
    except ParleyError as exc:
        result = exc
    took = time.monotonic() - start
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before
    assert took < LOAD_SECONDS, f"{path.name} took {took:.1f} s"
    assert grew < RSS_GROWTH, f"{path.name} grew the peak RSS by {grew >> 20} MB"
    if isinstance(result, ParleyError):
        assert "\n" not in str(result) and str(result), repr(result)
    return result


def test_the_rewriter_writes_a_loadable_copy(llama, tmp_path):
    """The mutants below differ from a file that loads only by what each test changes."""
    lm = load_bounded(llama.write(tmp_path / "same.gguf"))
    assert not isinstance(lm, ParleyError), lm


# -- item 5: counts that would allocate gigabytes before any weight is read
@pytest.mark.parametrize("key, value, words", [
    ("llama.block_count", 2**31 - 1, "block_count"),
    ("llama.block_count", 3, "block_count"),  # one more than the tensors hold
    ("llama.attention.head_count", 0, "head_count"),  # item 17: not a ZeroDivisionError
    ("llama.embedding_length", 0, "embedding_length"),
])
def test_impossible_counts_are_clear_errors(llama, tmp_path, key, value, words):
    result = load_bounded(llama.set(key, V.UINT32, value).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and words in str(result), result
    assert "ZeroDivisionError" not in str(result)


@pytest.mark.parametrize("key, value, words", [
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), "norm epsilon"),
    ("llama.attention.layer_norm_rms_epsilon", 5.0, "norm epsilon"),
    ("llama.rope.freq_base", -1.0, "rotary base"),
    ("llama.rope.freq_base", float("inf"), "rotary base"),
])
def test_float_settings_that_make_every_logit_nan_are_refused(llama, tmp_path, key, value, words):
    """They loaded, and every answer was token 0 (empty text, exit 0)."""
    result = load_bounded(llama.set(key, V.FLOAT32, value).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and words in str(result), result


def test_negative_sliding_window_fails_at_load(gemma, tmp_path):
    """Item 17: not at the first generation."""
    result = load_bounded(gemma.set("gemma3.attention.sliding_window", V.INT32, -5).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and "gemma3.attention.sliding_window" in str(result), result


def test_huge_alignment_is_named_as_too_large_not_as_not_a_power_of_two(llama, tmp_path):
    result = load_bounded(llama.set("general.alignment", V.UINT32, 2**31).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and "larger than" in str(result), result
    assert "not a power of two" not in str(result)


def test_a_one_megabyte_vocabulary_token_is_refused_quickly(llama, tmp_path):
    _, tokens, sub = llama.kv["tokenizer.ggml.tokens"]
    tokens = list(tokens)
    tokens[300] = "a" * (1 << 20)
    result = load_bounded(llama.set("tokenizer.ggml.tokens", V.ARRAY, tokens, sub).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and "characters long" in str(result), result


HOSTILE_TEMPLATES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'a' * 4000000000 }}",
    "{{ 9 ** 99999999 }}",
    "{{ strftime_now('%' * 10**8) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{{ 'a'|center(4000000000) }}",
    "{{ '{:>999999999}'.format(1) }}",
]


@pytest.mark.parametrize("template", HOSTILE_TEMPLATES)
def test_hostile_templates_fail_the_turn_quickly(llama, tmp_path, template):
    path = llama.set("tokenizer.chat_template", V.STRING, template).write(tmp_path / "m.gguf")
    tok = tokenizer_from_gguf(open_gguf(path).metadata)
    start = time.monotonic()
    with pytest.raises(ParleyError, match="chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 2.0


# -- item 10: tensor tables that do not describe the data
def _mutate_tensor(layout: Layout, which: str, **change) -> Layout:
    tensors = [replace(t, **change) if t.name == which else t for t in layout.tensors]
    return replace(layout, tensors=tensors)


def _second(layout: Layout) -> Tensor:
    return sorted(layout.tensors, key=lambda t: t.offset)[1]


@pytest.mark.parametrize("mutation, words", [
    ("overlap", "overlaps"),
    ("misaligned", "alignment"),
    ("retyped", "unused bytes"),
    ("enlarged", "overlaps"),
    ("shrunk", "unused bytes"),
])
def test_corrupt_tensor_layouts_are_refused(llama, tmp_path, mutation, words):
    first, second = sorted(llama.tensors, key=lambda t: t.offset)[:2]
    if mutation == "overlap":
        bad = _mutate_tensor(llama, second.name, offset=first.offset)
    elif mutation == "misaligned":
        bad = _mutate_tensor(llama, second.name, offset=second.offset + 4)
    elif mutation == "retyped":  # F32 -> F16: half the bytes, read as different numbers (past the padding)
        f32 = next(t for t in llama.tensors if t.type_id == 0 and t.dims == [64])
        bad = _mutate_tensor(llama, f32.name, type_id=1)
    elif mutation == "enlarged":
        bad = _mutate_tensor(llama, first.name, dims=[first.dims[0] * 2, *first.dims[1:]])
    else:
        bad = _mutate_tensor(llama, second.name, dims=[second.dims[0] // 2, *second.dims[1:]])
    result = load_bounded(bad.write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and words in str(result), result


# -- the fuzz: any single header mutation ends in a clean error or a load, within the bounds
KEYS = st.sampled_from(["llama.block_count", "llama.attention.head_count", "llama.attention.head_count_kv",
                        "llama.embedding_length", "llama.feed_forward_length", "llama.context_length",
                        "llama.attention.key_length", "llama.rope.freq_base", "general.alignment",
                        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.model",
                        "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                        "tokenizer.chat_template", "llama.attention.layer_norm_rms_epsilon"])
SCALARS = st.one_of(
    st.tuples(st.just(V.UINT32), st.integers(0, 2**32 - 1)),
    st.tuples(st.just(V.INT32), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just(V.UINT64), st.sampled_from([0, 1, 2, 3, 2**31, 2**63, 2**64 - 1])),
    st.tuples(st.just(V.FLOAT32), st.sampled_from([0.0, -1.0, 1e30, float("nan"), float("inf")])),
    st.tuples(st.just(V.BOOL), st.booleans()),
    st.tuples(st.just(V.STRING), st.text(max_size=40)),
)


@st.composite
def mutations(draw):
    kind = draw(st.sampled_from(["value", "tensor_dim", "tensor_type", "tensor_offset", "array"]))
    if kind == "value":
        return kind, draw(KEYS), draw(SCALARS)
    if kind == "array":
        items = draw(st.lists(st.text(max_size=8), max_size=5))
        return kind, draw(KEYS), items
    return kind, draw(st.integers(0, 1000)), draw(st.integers(0, 2**40))


def _apply(layout: Layout, mutation) -> Layout:
    kind, a, b = mutation
    if kind == "value":
        return layout.set(a, b[0], b[1])
    if kind == "array":
        return layout.set(a, V.ARRAY, b, V.STRING)
    t = layout.tensors[a % len(layout.tensors)]
    if kind == "tensor_dim":
        return _mutate_tensor(layout, t.name, dims=[b % (1 << 20) or 1, *t.dims[1:]])
    if kind == "tensor_type":
        return _mutate_tensor(layout, t.name, type_id=b % 40)
    return _mutate_tensor(layout, t.name, offset=b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=mutations())
def test_fuzzed_headers_end_in_a_clean_error_or_a_load(llama, tmp_path, mutation):
    layout = _apply(llama, mutation)
    result = load_bounded(layout.write(tmp_path / "fuzz.gguf"))
    kind = mutation[0]
    changed_layout = kind.startswith("tensor") and layout.tensors != llama.tensors
    if changed_layout and not isinstance(result, ParleyError) and not _a_writer_could_have_made(llama, mutation):
        raise AssertionError(f"a changed tensor table loaded silently: {mutation}")


def _a_writer_could_have_made(layout: Layout, mutation, alignment: int = 32) -> bool:
    """A type change that leaves every tensor where a GGUF writer would have put it (e.g. an 8-value F32 tensor read
    as F16: 16 bytes in its 32-byte aligned slot) makes a valid file, indistinguishable from one written that way."""
    import gguf

    kind, a, b = mutation
    if kind != "tensor_type":
        return False
    t = layout.tensors[a % len(layout.tensors)]
    try:
        new, old = gguf.GGMLQuantizationType(b % 40), gguf.GGMLQuantizationType(t.type_id)
    except ValueError:
        return False

    def slot(qtype) -> int | None:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        count = 1
        for d in t.dims:
            count *= d
        if count % block:
            return None
        nbytes = count // block * size
        return -(-nbytes // alignment) * alignment

    return slot(new) is not None and slot(new) == slot(old)


# -- item 14: names from the file never reach a terminal raw
def test_a_tensor_name_with_an_escape_sequence_is_refused_and_shown_escaped(llama, tmp_path):
    name = sorted(llama.tensors, key=lambda t: t.offset)[0].name
    result = load_bounded(_mutate_tensor(llama, name, name="\x1b]0;pwned\x07\x1b[2J" + name).write(tmp_path / "m.gguf"))
    assert isinstance(result, ParleyError) and "control characters" in str(result), result
    assert "\x1b" not in str(result) and "\x07" not in str(result)


def test_terminal_output_escapes_control_characters():
    from cli.terminal import printable

    assert printable("model \x1b[2J\x07name\u202e") == "model \\x1b[2J\\x07name\\u202e"
    assert printable("two\nlines, ünïcode") == "two\nlines, ünïcode"


def test_a_models_streamed_text_reaches_the_terminal_without_control_sequences(capsys):
    """A model led to emit ESC ] 0 ; … BEL would retitle the terminal: generate and chat stream through `_write`."""
    from cli.terminal import _write, safe_output

    _write(None, "a\x1b]0;PWNED\x07b\rc\r\nd\te")
    assert capsys.readouterr().out == "a\\x1b]0;PWNED\\x07b\\rc\nd\te"
    family = "👨\u200d👩\u200d👧 no\u00a0break, ünïcode, \u05e9\u05dc\u05d5\u05dd"  # joiners, NBSP, RTL pass
    assert safe_output(family) == family
