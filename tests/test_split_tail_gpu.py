"""Rung 20's split tail on the GPU (needs a Hopper GPU): work tiles of a launch's last, partial wave cut into
K/V ranges on many CTAs, each leaving a partial O, l and max in the workspace, the last warp of each row group
merging them. Every check asserts first that its call did split (else it would test rung 19's path), then
compares against float64 with fresh inputs and NaN-poisoned outputs, as the rest of the GPU suite does.
"""

import math

import pytest
import torch
from test_gpu import OFFSET_CASES, TOL, make_inputs
from test_gpu_features import _bound, check_lse

from attnclimb import rungs
from attnclimb.reference import attention_exact, far_offset_inputs, lse_exact, rel_l2
from attnclimb.runtime import launch

pytestmark = pytest.mark.gpu
SPLIT = rungs.get(20)

# (B, H, Sq, Sk): every one splits (asserted). Tiles fewer than the CTAs (the whole launch is tail), whole
# rounds plus a tail, Sq and Sk off the tile sizes (masked rows and keys inside pieces), the three-warpgroup
# long-K/V tiles (>= 6144 keys: 192 x 80) with a masked last K/V tile.
SHAPES = [
    (1, 2, 129, 4096),
    (1, 2, 1000, 3000),
    (3, 45, 256, 2048),
    (1, 2, 500, 8192),
    (2, 70, 192, 6500),
]


def _run(q, k, v, scale, *, lse=False, o=None):
    """Rung 20 into NaN-poisoned O (and LSE); asserts that the launch split its tail."""
    o = torch.full_like(q, float("nan")) if o is None else o.fill_(float("nan"))
    out_lse = torch.full(q.shape[:3], float("nan"), device=q.device, dtype=torch.float32) if lse else None
    plan = launch.run_rung(SPLIT, q, k, v, o, scale, lse=out_lse)
    torch.cuda.synchronize()
    assert plan.ws_bytes, f"no split for q {tuple(q.shape)}, k {tuple(k.shape)}: the test would not test rung 20"
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} output elements unwritten or NaN"
    if lse:
        assert not torch.isnan(out_lse).any(), f"{int(torch.isnan(out_lse).sum())} LSE elements unwritten or NaN"
    return o, out_lse


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["normal", "logits_x30", "near_constant", "dominant_key"])
def test_split_matches_float64(shape, kind):
    q, k, v = make_inputs(*shape, kind=kind)
    sc = 1.0 / math.sqrt(q.shape[-1])
    o, _ = _run(q, k, v, sc)
    err = rel_l2(o, attention_exact(q, k, v, sc))
    assert err <= TOL, f"rel L2 {err:.3e}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("scale", [None, 1.0, -0.3])
def test_split_lse_matches_float64(shape, scale):
    """The merged LSE (the pieces' exact sums, without the l fix) within fp32's tolerance."""
    q, k, v = make_inputs(*shape, kind="logits_x30")
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = _run(q, k, v, sc, lse=True)
    assert rel_l2(o, attention_exact(q, k, v, sc)) <= TOL
    check_lse(lse, lse_exact(q, k, sc), _bound(q, k, sc))


@pytest.mark.parametrize("case", list(OFFSET_CASES))
def test_split_far_offset_logits(case):
    """Issue 6's hostile magnitudes, split: the pieces' references are merged with rung 14's alpha, exact
    in true units whatever |m·c| (hard rows included)."""
    p_of, ties = OFFSET_CASES[case]
    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = far_offset_inputs(1, 256, 4096, p_of(1.0), 1.0, ties=ties, generator=g, device="cuda")
    o, lse = _run(q, k, v, 1.0, lse=True)
    err = rel_l2(o, attention_exact(q, k, v, 1.0))
    assert err <= TOL, f"{case}: rel L2 {err:.3e}"
    check_lse(lse, lse_exact(q, k, 1.0), _bound(q, k, 1.0))


def test_split_key_maximum_in_one_piece_only():
    """Each row's largest score sits in one piece and rises far above the others' (by 2^10 in log2 units):
    every other piece's weight underflows to 0 against it, and O is that key's V."""
    b, h, sq, sk = 1, 2, 129, 4096
    q, k, v = make_inputs(b, h, sq, sk)
    q = q * 0.05
    k[:, :, 3000] = 0.0
    q[..., 0] = 1.0
    k[:, :, 3000, 0] = 1000.0  # scale 1: this key leads by ~1000 natural units in every row
    o, _ = _run(q, k, v, 1.0)
    err = rel_l2(o, attention_exact(q, k, v, 1.0))
    assert err <= TOL, f"rel L2 {err:.3e}"


@pytest.mark.parametrize("heads_kv", [1, 2])
def test_split_gqa(heads_kv):
    q, _, _ = make_inputs(1, 8, 300, 4000)
    _, k, v = make_inputs(1, heads_kv, 300, 4000)
    sc = 1.0 / math.sqrt(128)
    o, lse = _run(q, k, v, sc, lse=True)
    assert rel_l2(o, attention_exact(q, k, v, sc)) <= TOL
    check_lse(lse, lse_exact(q, k, sc), _bound(q, k, sc))


def test_split_strided_bshd_views():
    """BSHD views read and written in place (the strided variant), split."""
    g = torch.Generator(device="cuda").manual_seed(3)
    b, s, h, sk = 1, 300, 4, 5000
    q = torch.randn(b, s, h, 128, generator=g, device="cuda").bfloat16().transpose(1, 2)
    k = torch.randn(b, sk, h, 128, generator=g, device="cuda").bfloat16().transpose(1, 2)
    v = torch.randn(b, sk, h, 128, generator=g, device="cuda").bfloat16().transpose(1, 2)
    o = torch.empty(b, s, h, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    o, _ = _run(q, k, v, 1.0 / math.sqrt(128), o=o)
    assert rel_l2(o, attention_exact(q, k, v, 1.0 / math.sqrt(128))) <= TOL


@pytest.mark.parametrize("head_dim", [64, 256])
def test_split_head_dims(head_dim):
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(1, 2, 500, head_dim, generator=g, device="cuda").bfloat16()
    k = torch.randn(1, 2, 4000, head_dim, generator=g, device="cuda").bfloat16()
    v = torch.randn(1, 2, 4000, head_dim, generator=g, device="cuda").bfloat16()
    sc = 1.0 / math.sqrt(head_dim)
    o, lse = _run(q, k, v, sc, lse=True)
    assert rel_l2(o, attention_exact(q, k, v, sc)) <= TOL
    check_lse(lse, lse_exact(q, k, sc), _bound(q, k, sc))


def test_split_fp16():
    g = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = (torch.randn(1, 2, s, 128, generator=g, device="cuda").half() for s in (300, 4000, 4000))
    sc = 1.0 / math.sqrt(128)
    o, lse = _run(q, k, v, sc, lse=True)
    assert o.dtype == torch.float16
    assert rel_l2(o, attention_exact(q, k, v, sc)) <= TOL
    check_lse(lse, lse_exact(q, k, sc), _bound(q, k, sc))


def test_split_repeats_bit_for_bit_and_matches_unsplit():
    """The counters are zero again after every launch: ten launches on one stream give the same O bit for bit
    (a counter left non-zero would skip or repeat a merge: rows of NaN or of one piece). The unsplit launch
    (rung 19's schedule: no workspace) agrees within rounding."""
    q, k, v = make_inputs(2, 70, 192, 6500)
    sc = 1.0 / math.sqrt(128)
    first, _ = _run(q, k, v, sc)
    first = first.clone()
    for _ in range(9):
        o, _ = _run(q, k, v, sc)
        assert torch.equal(o, first)
    o19 = torch.full_like(q, float("nan"))
    launch.run_rung(rungs.get(19), q, k, v, o19, sc)
    torch.cuda.synchronize()
    assert rel_l2(first, o19) < 4e-3


def test_split_on_two_streams_at_once():
    """Two streams each get their own workspace: the same call launched on both, interleaved, is right on
    both."""
    q, k, v = make_inputs(1, 2, 1000, 3000)
    sc = 1.0 / math.sqrt(128)
    want = attention_exact(q, k, v, sc)
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [torch.full_like(q, float("nan")) for _ in range(2)]
    torch.cuda.synchronize()
    for _ in range(5):
        for s, o in zip(streams, outs):
            with torch.cuda.stream(s):
                launch.run_rung(SPLIT, q, k, v, o, sc)
    torch.cuda.synchronize()
    for o in outs:
        assert rel_l2(o, want) <= TOL
