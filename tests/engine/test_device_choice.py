"""Which device and dtype a model loads on: the GPU in bf16 when there is one, else the CPU in fp32."""
import pytest
import torch

from engine.backend import resolve_backend, resolve_device
from engine.errors import ParleyError


@pytest.mark.parametrize("cuda,expected", [(True, ("cuda", "bfloat16")), (False, ("cpu", "float32"))])
def test_auto_picks_the_gpu_when_there_is_one(monkeypatch, cuda, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto", "auto") == expected
    assert resolve_device("auto", "float32")[1] == "float32"  # an explicit dtype is kept
    assert resolve_device("cpu", "auto") == ("cpu", "float32")
    if cuda:
        assert resolve_backend("auto", "cuda:0") == "torch"


def test_cuda_without_a_gpu_and_unknown_names_are_clear_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ParleyError, match="No CUDA device"):
        resolve_device("cuda", "auto")
    with pytest.raises(ParleyError, match="Unknown device"):
        resolve_device("tpu", "auto")
    with pytest.raises(ParleyError, match="Unknown dtype"):
        resolve_device("cpu", "float8")


def test_engine_reports_an_unusable_device_as_a_failed_load(tiny_models, monkeypatch):
    from engine import events as ev
    from engine.runtime import EngineConfig
    from tests.support.engine_client import Client

    c = Client(EngineConfig(device="cuda" if not torch.cuda.is_available() else "tpu"))
    c.engine.start()
    try:
        model = c.engine.load_model(tiny_models["qwen3"].gguf_path)
        failed = c.wait_for(lambda e: isinstance(e, ev.ModelFailed) and e.model_id == model)
        assert "CUDA" in failed.message or "Unknown device" in failed.message
    finally:
        c.engine.shutdown()
