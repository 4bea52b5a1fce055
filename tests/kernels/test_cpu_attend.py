"""One-row attention over the KV cache in place (kernels/cpu/attend.c): against its torch reference, and each row's
result independent of the other rows of the call (batched == alone, bit for bit); fp16 caches as fp32 ones."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu_attend import attend_rows, attend_rows_reference
from kernels.cpu_native import cpu_kernel

pytestmark = pytest.mark.skipif(cpu_kernel() is None, reason="the CPU kernel does not build here")


def _case(h: int, hkv: int, d: int, counts: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = 64
    k = torch.randn(rows, hkv, d, generator=g)
    v = torch.randn(rows, hkv, d, generator=g)
    q = torch.randn(len(counts) + 1, h, d, generator=g) * 2
    keys, table, at = [], [], 0
    for i, n in enumerate(counts):  # query row i + 1 (row 0 is left to the caller: stays zero)
        keys.append(torch.randperm(rows, generator=g)[:n])
        table.append((i + 1, at, n))
        at += n
    return q, k, v, torch.cat(keys), torch.tensor(table, dtype=torch.long)


@pytest.mark.parametrize("softcap", [0.0, 1.5])  # Gemma 2's tanh cap on every score, low enough to bite here
@pytest.mark.parametrize("h, hkv, d", [(4, 1, 256), (8, 2, 64), (2, 2, 20)])
def test_matches_reference_and_rows_are_independent(h, hkv, d, softcap):
    counts = [1, 7, 33, 64]
    q, k, v, keys, table = _case(h, hkv, d, counts)
    got, ref = torch.zeros_like(q), torch.zeros_like(q)
    attend_rows(q, k, v, keys, table, 0.125, got, softcap=softcap, impl="native")
    attend_rows_reference(q, k, v, keys, table, 0.125, ref, softcap)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    if softcap:
        uncapped = torch.zeros_like(q)
        attend_rows_reference(q, k, v, keys, table, 0.125, uncapped)
        assert (uncapped - ref).abs().max() > 1e-2
    assert torch.equal(got[0], torch.zeros_like(got[0]))  # a row the table does not name is untouched
    for i in range(len(counts)):  # each entry alone, in a call of its own
        alone = torch.zeros_like(q)
        attend_rows(q, k, v, keys, table[i:i + 1], 0.125, alone, softcap=softcap, impl="native")
        assert torch.equal(alone[i + 1], got[i + 1])


@pytest.mark.parametrize("h, hkv, d", [(8, 2, 64), (6, 2, 20)])
def test_sinks_join_the_softmax_as_transformers_computes_them(h, hkv, d):
    """gpt-oss's sinks: a logit per query head appended to each row's scores and dropped after the softmax (as
    transformers' eager attention does it); one sink far above the scores takes nearly all weight from that head."""
    counts = [1, 7, 33, 64]
    q, k, v, keys, table = _case(h, hkv, d, counts)
    sinks = torch.linspace(-2.0, 3.0, h)
    sinks[0] = 40.0
    got, ref = torch.zeros_like(q), torch.zeros_like(q)
    attend_rows(q, k, v, keys, table, 0.125, got, sinks=sinks, impl="native")
    attend_rows_reference(q, k, v, keys, table, 0.125, ref, sinks=sinks)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    row, at, n = table[2].tolist()  # by hand: softmax over [scores, sink], the sink's weight dropped
    for head in range(h):
        kv = head // (h // hkv)
        ks, vs = k[keys[at:at + n], kv], v[keys[at:at + n], kv]
        p = torch.softmax(torch.cat([0.125 * ks @ q[row, head], sinks[head:head + 1]]), 0)[:-1]
        torch.testing.assert_close(got[row, head], p @ vs, atol=1e-5, rtol=1e-5)
    assert got[1:, 0].abs().max() < 1e-6  # the sink at 40 leaves head 0 almost nothing
    plain = torch.zeros_like(q)
    attend_rows(q, k, v, keys, table, 0.125, plain, impl="native")
    assert (plain - got).abs().max() > 1e-2
    for i in range(len(counts)):  # each entry alone
        alone = torch.zeros_like(q)
        attend_rows(q, k, v, keys, table[i:i + 1], 0.125, alone, sinks=sinks, impl="native")
        assert torch.equal(alone[i + 1], got[i + 1])


@pytest.mark.parametrize("h, hkv, d", [(4, 1, 256), (14, 2, 40), (6, 2, 20), (32, 8, 64)])
def test_heads_sharing_a_kv_head_together_equal_each_head_alone(h, hkv, d):
    """A job takes up to four query heads of one KV head (keys and values read once) where every thread still gets
    a job, else one head: the two give the same bits (G = 7 splits into 4 + 3; D not a multiple of 32 too)."""
    q, k, v, keys, table = _case(h, hkv, d, [1, 40])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # S · Hkv >= threads: grouped jobs
        grouped = torch.zeros_like(q)
        attend_rows(q, k, v, keys, table, 0.125, grouped, softcap=1.5, impl="native")
        torch.set_num_threads(2 * hkv + 1)  # fewer (row, KV head) pairs than threads: one head a job
        single = torch.zeros_like(q)
        attend_rows(q, k, v, keys, table, 0.125, single, softcap=1.5, impl="native")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(grouped, single)
    ref = torch.zeros_like(q)
    attend_rows_reference(q, k, v, keys, table, 0.125, ref, 1.5)
    torch.testing.assert_close(grouped, ref, atol=1e-5, rtol=1e-5)


def test_a_non_finite_key_makes_only_the_rows_that_read_it_nan():
    """The vector exp keeps a NaN score NaN (torch's softmax gives a NaN row): a row whose keys hold one is NaN, as the
    reference's, and the rows that do not read it keep their values."""
    q, k, v, keys, table = _case(8, 2, 64, [9, 40])
    first, second = keys[:9].tolist(), set(keys[9:].tolist())
    bad = next(key for key in first if key not in second)  # read by the first query row only
    k[bad, 0, 5] = float("nan")
    got, ref = torch.zeros_like(q), torch.zeros_like(q)
    attend_rows(q, k, v, keys, table, 0.125, got, impl="native")
    attend_rows_reference(q, k, v, keys, table, 0.125, ref)
    for i, (row, at, n) in enumerate(table.tolist()):
        reads = bad in keys[at:at + n].tolist()
        heads = slice(0, 4)  # the query heads of KV head 0
        assert reads == (i == 0)
        assert torch.isnan(got[row, heads]).all() == reads == torch.isnan(ref[row, heads]).all(), i
        assert torch.isfinite(got[row, 4:]).all()
        if not reads:
            torch.testing.assert_close(got[row], ref[row], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("h, hkv, d", [(4, 1, 256), (8, 2, 64), (2, 2, 20)])
def test_fp16_cache_reads_as_the_same_values_in_fp32(h, hkv, d):
    """An fp16 cache (half the bytes) is widened exactly as it is read: the same bits as the fp32 kernel over the
    widened values, rows still independent of each other."""
    counts = [1, 9, 64]
    q, k, v, keys, table = _case(h, hkv, d, counts)
    k16, v16 = k.half(), v.half()
    got, wide = torch.zeros_like(q), torch.zeros_like(q)
    attend_rows(q, k16, v16, keys, table, 0.125, got, softcap=1.5, impl="native")
    attend_rows(q, k16.float(), v16.float(), keys, table, 0.125, wide, softcap=1.5, impl="native")
    assert torch.equal(got, wide)
    ref = torch.zeros_like(q)
    attend_rows_reference(q, k16.float(), v16.float(), keys, table, 0.125, ref, 1.5)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    for i in range(len(counts)):
        alone = torch.zeros_like(q)
        attend_rows(q, k16, v16, keys, table[i:i + 1], 0.125, alone, softcap=1.5, impl="native")
        assert torch.equal(alone[i + 1], got[i + 1])


def test_refuses_other_dtypes():
    q, k, v, keys, table = _case(2, 1, 16, [3])
    with pytest.raises(ValueError, match="fp32"):
        attend_rows(q, k.bfloat16(), v, keys, table, 1.0, torch.zeros_like(q), impl="native")
    with pytest.raises(ValueError, match="fp16"):  # both caches of one type
        attend_rows(q, k.half(), v, keys, table, 1.0, torch.zeros_like(q), impl="native")
