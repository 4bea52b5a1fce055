"""The decode step's end on the device against the host's own table: after the argmax has moved the step
table on, the next decode step of the same sequences sends no table, and what the device holds is what the
host would have sent (positions, ring and flat write slots, kv_end), step after step and across ring wraps."""

from __future__ import annotations

import pytest
import torch

from engine.cache import CacheConfig, make_cache
from kernels import triton_available

pytestmark = pytest.mark.gpu


def _table(inputs) -> list:
    p = inputs.plan
    return [p.seq_info.tolist(), inputs.positions.tolist()] + [s.tolist() for s in p.layer_slots]


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_advanced_table_equals_the_uploaded_one(device):
    from engine.step_inputs import StepInputs
    from kernels.argmax_triton import ArgmaxScratch, argmax_rows_triton
    from kernels.step_advance import HOST_RING, host_ring

    cfg = CacheConfig(layout="sequence", max_seqs=3, max_seq_len=64, capacity=192, dtype="float32", max_step_tokens=4)
    cache = make_cache(cfg, [8, None], 1, 16, device)  # a ring kind (8 + 4 - 1 = 11 rows) and a flat one
    cache.attention_impl = "triton"
    inputs = StepInputs(cache)
    a, b = cache.seq_new(), cache.seq_new()
    cache.declare_step([(a, 4), (b, 3)])  # prefill: the table goes up
    inputs.prepare()
    cache.commit_step()
    ring, scratch = host_ring(4), ArgmaxScratch(4, device)
    sent = []
    send = inputs._buffers.send
    inputs._buffers.send = lambda lo, hi: sent.append((lo, hi)) or send(lo, hi)
    starts = {a: 4, b: 3}
    for step in range(12):  # a passes position 11: its ring slots wrap
        cache.declare_step([(b, 1), (a, 1)])
        inputs.prepare(num_tokens=4, num_segments=4, tokens=None if step else torch.tensor([5, 6]))
        assert (len(sent) == 1) == (step == 0), "only the first decode step sends its table"
        got = _table(inputs)
        cache.abort_step()
        inputs._buffers.table_key = None  # forget what the device holds: the same step is sent in full
        cache.declare_step([(b, 1), (a, 1)])
        inputs.prepare(num_tokens=4, num_segments=4)
        assert got == _table(inputs), f"step {step}: the advanced table differs from the host's"
        sent.clear()
        logits = torch.randn(4, 300, device=device)
        ids = argmax_rows_triton(logits, scratch, out=inputs.tokens, step=inputs.step_advance(ring))
        inputs.advanced()
        cache.commit_step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        assert [ring[starts[s] % HOST_RING, row].item() for row, s in enumerate((b, a))] == ids[:2].tolist()
        starts = {s: p + 1 for s, p in starts.items()}
