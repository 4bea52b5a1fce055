"""About's "Loaded now": each model as it is listed, its weights in a word and its size; the breakdown in the details."""
from __future__ import annotations

from app.qt.about import about_html, quantization_summary, show_about


def test_a_weights_breakdown_reads_as_one_word():
    assert quantization_summary("Q4_K→int4 ×27, Q6_K→int8 ×4, Q8_0→int8 ×1") == "mostly Q4_K"
    assert quantization_summary("Q8_0→int8 ×10") == "Q8_0" and quantization_summary("float32") == "float32"
    assert quantization_summary("") == ""


def test_about_names_loaded_models_as_listed_with_their_size_and_the_breakdown_in_details(parley):
    listed = parley.models.registry.get("default").name
    state = parley.models.state("default")
    state.info = {**state.info, "quantization": "Q4_K→int4 ×27, Q6_K→int8 ×4"}  # as a Q4_K_M GGUF's load says
    text = about_html(parley.models)
    assert f"<li>{listed} (mostly Q4_K, " in text and " in memory)</li>" in text  # was 'qwen3 (Q4_K→int4 ×27, …)'
    assert "×27" not in text
    box = show_about(parley.window, parley.models)
    try:
        assert box.detailedText() == f"{listed}: Q4_K→int4 ×27, Q6_K→int8 ×4"
    finally:
        box.close()
