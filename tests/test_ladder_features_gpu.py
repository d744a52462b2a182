"""GPU correctness of the compile-time variants of the rungs below the top (needs a Hopper GPU).

Since the twentieth session's re-cut, rungs 10-15 carry the features (causal, GQA, LSE, strided views, fp16,
head_dim 64 and 256) without the ping-pong turns, and rungs 12-15 take three consumer warpgroups without them
(head_dim 64 bf16, and the long-K/V tiles from 32 000 keys): builds that never ran before the re-cut, which the
top rung's own tests (test_gpu_features.py, test_long_kv_gpu.py) do not reach. Each case draws fresh inputs,
poisons O and the LSE with NaN, and compares O with float64 attention (relative L2) and the LSE elementwise.
The long-K/V tiles are forced onto short K/V (``dataclasses.replace(rung, **rung.long_kv[1])``, as
``scripts/sanitize_small.py long`` does), with K of size 1e4 (rows whose kept-reference votes fail on later
K/V tiles) and 30.
"""

import dataclasses

import pytest
import torch
from test_gpu import TOL
from test_gpu_features import TOL16, _bound, _randn_bf16, _randn_f16, check_lse

from attnclimb import rungs
from attnclimb.reference import attention_exact, lse_exact, rel_l2
from attnclimb.runtime.launch import run_rung

pytestmark = pytest.mark.gpu
BELOW_TOP = [r for r in rungs.RUNGS if r.features and r is not rungs.TOP]

# name -> (b, h, h_kv, sq, sk, head_dim, dtype, causal, lse, strided, long_kv, q_scale)
CASES = {
    "causal-gqa-lse": (2, 8, 2, 600, 900, 128, torch.bfloat16, True, True, False, False, 1.0),
    "strided-gqa": (1, 4, 2, 257, 700, 128, torch.bfloat16, False, False, True, False, 1.0),
    "d64": (2, 3, 3, 1000, 1000, 64, torch.bfloat16, False, False, False, False, 1.0),
    "d64-causal-lse": (1, 2, 2, 129, 700, 64, torch.bfloat16, True, True, False, False, 1.0),
    "d256-causal": (2, 3, 3, 300, 300, 256, torch.bfloat16, True, False, False, False, 1.0),
    "big-causal-lse": (1, 4, 4, 128, 700, 128, torch.bfloat16, True, True, False, False, 1e4),
    "fp16": (2, 3, 3, 1000, 1000, 128, torch.float16, False, False, False, False, 1.0),
    "fp16-causal-gqa-lse": (1, 4, 2, 129, 700, 128, torch.float16, True, True, False, False, 1.0),
    "fp16-d64-strided": (1, 2, 2, 257, 300, 64, torch.float16, False, False, True, False, 1.0),
    "fp16-shifted-lse": (1, 2, 2, 129, 200, 128, torch.float16, False, True, False, False, 1e4),
    "long": (1, 4, 4, 200, 700, 128, torch.bfloat16, False, False, False, True, 1e4),
    "long-lse-strided-gqa": (1, 4, 2, 257, 300, 128, torch.bfloat16, False, True, True, True, 30.0),
    "long-fp16": (1, 4, 4, 200, 700, 128, torch.float16, False, False, False, True, 1e4),
}


def _inputs(b, h, h_kv, sq, sk, d, dtype, strided, q_scale, g):
    randn = _randn_f16 if dtype == torch.float16 else _randn_bf16
    q = (randn(b, h, sq, d, g=g).float() * q_scale).to(dtype)
    k, v = randn(b, h_kv, sk, d, g=g), randn(b, h_kv, sk, d, g=g)
    if strided:  # BSHD views, as a model hands them over
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    return q, k, v


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("rung", BELOW_TOP, ids=lambda r: r.key)
def test_rung_features_match_float64(rung, case):
    b, h, h_kv, sq, sk, d, dtype, causal, with_lse, strided, long_kv, q_scale = CASES[case]
    if dtype == torch.float16 and "fp16" not in rung.features:
        pytest.skip(f"{rung.key} has no fp16 variant")
    if long_kv and rung.long_kv is None:
        pytest.skip(f"{rung.key} has no long-K/V tiles")
    r = dataclasses.replace(rung, **rung.long_kv[1]) if long_kv else rung
    g = torch.Generator(device="cuda").manual_seed(int.from_bytes(case.encode()[:4], "little") + rung.number)
    q, k, v = _inputs(b, h, h_kv, sq, sk, d, dtype, strided, q_scale, g)
    scale = d**-0.5
    o = torch.full((b, h, sq, d), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((b, h, sq), float("nan"), device="cuda") if with_lse else None
    run_rung(r, q, k, v, o, scale, causal=causal, lse=lse)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} output elements unwritten or NaN"
    err = rel_l2(o, attention_exact(q, k, v, scale, causal=causal))
    tol = TOL16 if dtype == torch.float16 and q_scale == 1.0 else TOL
    assert err <= tol, f"{rung.key} {case}: rel L2 {err:.3e} (tolerance {tol:.0e})"
    if with_lse:
        assert not torch.isnan(lse).any(), f"{int(torch.isnan(lse).sum())} LSE elements unwritten or NaN"
        check_lse(lse, lse_exact(q, k, scale, causal=causal), _bound(q, k, scale))


def test_below_top_covers_the_three_warpgroup_builds():
    """The cases above reach the turn-free three-warpgroup builds: rungs 12-15 at head_dim 64 (bf16) and with
    the long-K/V tiles."""
    from attnclimb.runtime.launch import feature_variant

    three = [r for r in BELOW_TOP if feature_variant(r, False, False, False, head_dim=64).threads == 512]
    assert [r.number for r in three] == [12, 13, 14, 15]
    assert all(r.long_kv and r.long_kv[1]["threads"] == 512 for r in three)
