"""The decode step's end on the device against the host's own table: after the argmax has moved the step
table on, the next decode step of the same sequences sends no table, and what the device holds is what the
host would have sent (positions, ring and flat write slots, kv_end), step after step and across ring wraps."""

from __future__ import annotations

import pytest
import torch

from engine.cache import CacheConfig, make_cache
from kernels import triton_available

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def _table(cache) -> list:
    p = cache.plan
    return [p.seq_info.tolist(), p.positions.tolist()] + [s.tolist() for s in p.layer_slots]


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_advanced_table_equals_the_uploaded_one():
    from kernels.argmax_triton import ArgmaxScratch, argmax_rows_triton
    from kernels.step_advance import HOST_RING, host_ring

    cfg = CacheConfig(layout="sequence", max_seqs=3, max_seq_len=64, capacity=192, dtype="float32", max_step_tokens=4)
    cache = make_cache(cfg, [8, None], 1, 16, DEVICE)  # a ring kind (8 + 4 - 1 = 11 rows) and a flat one
    cache.attention_impl = "triton"
    a, b = cache.seq_new(), cache.seq_new()
    cache.declare_step([(a, 4), (b, 3)])  # prefill: the table goes up
    cache.prepare_step()
    cache.commit_step()
    ring, scratch = host_ring(4), ArgmaxScratch(4, DEVICE)
    sent = []
    send = cache._buffers.send
    cache._buffers.send = lambda lo, hi: sent.append((lo, hi)) or send(lo, hi)
    starts = {a: 4, b: 3}
    for step in range(12):  # a passes position 11: its ring slots wrap
        cache.declare_step([(b, 1), (a, 1)])
        cache.prepare_step(num_tokens=4, num_segments=4, tokens=None if step else torch.tensor([5, 6]))
        assert (len(sent) == 1) == (step == 0), "only the first decode step sends its table"
        got = _table(cache)
        cache.abort_step()
        cache._buffers.table_key = None  # forget what the device holds: the same step is sent in full
        cache.declare_step([(b, 1), (a, 1)])
        cache.prepare_step(num_tokens=4, num_segments=4)
        assert got == _table(cache), f"step {step}: the advanced table differs from the host's"
        sent.clear()
        logits = torch.randn(4, 300, device=DEVICE)
        ids = argmax_rows_triton(logits, scratch, out=cache.plan.tokens, step=cache.step_advance(ring))
        cache.advanced()
        cache.commit_step()
        if ON_GPU:
            torch.cuda.synchronize()
        assert [ring[starts[s] % HOST_RING, row].item() for row, s in enumerate((b, a))] == ids[:2].tolist()
        starts = {s: p + 1 for s, p in starts.items()}
