"""The CPU simulator of the kernels' tiled online softmax must match exact attention (float64)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnclimb.reference import attention_exact, attention_tiled, lse_exact, rel_l2


def _qkv(b, h, sq, sk, d=16, seed=0, scale_logits=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=g, dtype=torch.float64) * scale_logits
    k = torch.randn(b, h, sk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, sk, d, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("base2", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (127, 129), (128, 128), (129, 1), (1000, 333), (5, 64)])
def test_tiled_matches_exact(sq, sk, base2):
    q, k, v = _qkv(2, 3, sq, sk, seed=sq * 1000 + sk)
    ref = attention_exact(q, k, v)
    out, lse = attention_tiled(q, k, v, block_m=64, block_n=32, base2=base2, return_lse=True)
    assert (out - ref).abs().max().item() < 1e-12
    assert (lse - lse_exact(q, k)).abs().max().item() < 1e-12


def test_tiled_survives_hostile_logits():
    # logits x30 make exp overflow unless the running max is subtracted first
    q, k, v = _qkv(1, 2, 70, 200, seed=7, scale_logits=30.0)
    out = attention_tiled(q, k, v, block_m=32, block_n=64, base2=True)
    assert torch.isfinite(out).all()
    assert rel_l2(out, attention_exact(q, k, v)) < 1e-12


def test_exact_is_softmax_weighted_mean():
    # one dominant key per row: the output is that key's value row
    q = torch.zeros(1, 1, 4, 8, dtype=torch.float64)
    k = torch.zeros(1, 1, 4, 8, dtype=torch.float64)
    for i in range(4):
        q[0, 0, i, i] = 100.0
        k[0, 0, i, i] = 100.0
    v = torch.arange(32, dtype=torch.float64).reshape(1, 1, 4, 8)
    out = attention_exact(q, k, v, scale=1.0)
    assert torch.allclose(out, v, atol=1e-12)


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = _qkv(1, 1, 9, 11, d=64, seed=3)
    assert torch.allclose(attention_exact(q, k, v), attention_exact(q, k, v, scale=1 / math.sqrt(64)))


def test_rel_l2_flags_nan_and_inf():
    ref = torch.ones(10)
    bad = torch.ones(10)
    bad[3] = float("nan")
    assert rel_l2(bad, ref) == math.inf
    bad[3] = float("inf")
    assert rel_l2(bad, ref) == math.inf
    assert rel_l2(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-5)


def test_tiled_rejects_bad_blocks():
    q, k, v = _qkv(1, 1, 4, 4)
    with pytest.raises(ValueError):
        attention_tiled(q, k, v, block_m=0)


@settings(max_examples=25, deadline=None)
@given(
    sq=st.integers(1, 200),
    sk=st.integers(1, 200),
    bm=st.sampled_from([16, 64, 128]),
    bn=st.sampled_from([16, 64, 176]),
    base2=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_tiled_matches_exact_property(sq, sk, bm, bn, base2, seed):
    q, k, v = _qkv(1, 2, sq, sk, d=8, seed=seed, scale_logits=4.0)
    out = attention_tiled(q, k, v, block_m=bm, block_n=bn, base2=base2)
    assert (out - attention_exact(q, k, v)).abs().max().item() < 1e-12


@pytest.mark.parametrize("scale", [-0.7, 0.0, 1e-30])
def test_tiled_handles_negative_and_zero_scale(scale):
    q, k, v = _qkv(1, 2, 37, 90, seed=11, scale_logits=5.0)
    out = attention_tiled(q, k, v, scale=scale, block_m=16, block_n=32, base2=True)
    assert torch.isfinite(out).all()
    assert (out - attention_exact(q, k, v, scale=scale)).abs().max().item() < 1e-12
