"""The top rung's long-K/V tiles (``Rung.long_kv``: non-causal calls with many keys take three consumer
warpgroups, 192-row tiles and 80-key K/V tiles) against float64 on the GPU: ragged query and key counts, GQA,
the LSE, BSHD views and fp16, with NaN-poisoned outputs (needs a Hopper GPU)."""

import math

import pytest
import torch
from test_gpu import TOL
from test_gpu_features import _bound, check_lse
from test_lazy_rescale_cpu import _long_kv_failing_inputs

from attnclimb import rungs
from attnclimb.reference import attention_exact, lse_exact, rel_l2
from attnclimb.runtime.launch import feature_variant, run_rung

pytestmark = pytest.mark.gpu
TOP = rungs.TOP
LONG = TOP.long_kv[0] if TOP.long_kv else None


def _check_long_tiles(q, k, v, scale, strided):
    """Run the top rung's long-K/V tiles (asserted to be what runs) on q, k, v into NaN-poisoned O and LSE, and
    check both against float64 (bf16: TOL, fp16: 3e-3 rel. L2; the LSE by ``check_lse``)."""
    dtype, sk = q.dtype, k.shape[2]
    r = feature_variant(TOP, False, q.shape[1] != k.shape[1], True, strided, seqlen_k=sk, fp16=dtype == torch.float16)
    assert r.threads == 512 and r.block_n == TOP.long_kv[1]["block_n"]  # the long tiles are what runs
    o = torch.full(q.shape, float("nan"), device="cuda", dtype=dtype)
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    run_rung(TOP, q, k, v, o, scale, lse=lse)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    err = rel_l2(o, attention_exact(q, k, v, scale))
    assert err <= (TOL if dtype == torch.bfloat16 else 3e-3), err
    check_lse(lse, lse_exact(q, k, scale), _bound(q, k, scale))


@pytest.mark.skipif(LONG is None, reason="the top rung has no long-K/V tiles")
@pytest.mark.parametrize(
    ("b", "h", "h_kv", "sq", "extra_k", "dtype", "strided"),
    [
        (1, 2, 2, 300, 0, torch.bfloat16, False),  # seqlen_k exactly at the bound
        (2, 4, 1, 193, 1001, torch.bfloat16, True),  # MQA, one row past a 192-row tile, BSHD views
        (1, 6, 3, 1, 79, torch.float16, False),  # one query row, a 1-key last K/V tile
        (1, 3, 3, 577, 7777, torch.float16, True),
    ],
)
def test_long_kv_tiles_match_float64(b, h, h_kv, sq, extra_k, dtype, strided):
    sk = LONG + extra_k
    g = torch.Generator(device="cuda").manual_seed(sq + sk)
    q = torch.randn(b, h, sq, 128, generator=g, device="cuda").to(dtype)
    k, v = (torch.randn(b, h_kv, sk, 128, generator=g, device="cuda").to(dtype) for _ in range(2))
    if strided:
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    _check_long_tiles(q, k, v, 1 / math.sqrt(128), strided)


@pytest.mark.skipif(LONG is None, reason="the top rung has no long-K/V tiles")
@pytest.mark.parametrize(
    ("case", "dtype", "negative", "gqa_strided"),
    [
        ("rising", torch.bfloat16, False, False),
        ("rising", torch.bfloat16, True, False),  # a negative scale: the S wgmmas negate Q
        ("rising", torch.float16, False, False),
        ("scale1", torch.bfloat16, False, False),
        ("scale1", torch.bfloat16, False, True),
        ("scale1", torch.float16, True, True),
        ("overflow", torch.bfloat16, False, False),
        ("overflow", torch.float16, False, True),
    ],
)
def test_long_kv_failed_votes_match_float64(case, dtype, negative, gqa_strided):
    """The long-K/V tiles (three consumer warpgroups, one P buffer) on inputs whose kept references move after
    the first K/V tile (``test_lazy_rescale_cpu._long_kv_failing_inputs``; a CPU test there checks that they
    do): O and the LSE against float64, NaN-poisoned outputs; a negative scale (the S wgmmas negate Q), fp16,
    GQA and BSHD views on that path too. (The other long-K/V tests use randn at 1/sqrt(128), where no vote fails
    after the first tile. In the twelfth session these inputs also ran the in-place exponentials with S
    computed again from shared memory, tried on old rung 19, the top rung before the re-cut, and not kept: its
    page, docs/history/before-recut/19-smem-epilogue.md.)"""
    sk = LONG + 1001
    q, k, v, scale = _long_kv_failing_inputs(case, sk, dtype)
    q, k, v = (t.to(dtype).cuda() for t in (q, k, v))
    if negative:
        k, scale = -k, -scale  # the same scaled scores
    if gqa_strided:
        assert k.shape[1] % 2 == 0, "GQA needs an even number of heads"
        k, v = k[:, : k.shape[1] // 2], v[:, : v.shape[1] // 2]  # two query heads per K/V head
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    _check_long_tiles(q, k, v, scale, gqa_strided)
