"""GPU correctness of the top rung's compile-time variants (issue 8): causal masking, grouped-query
attention and the log-sum-exp output, alone and combined, against float64 (needs a Hopper GPU).

Each check draws fresh inputs, poisons O and the LSE with NaN, and compares O by relative L2 error (bf16
tolerance 1e-2) and the LSE elementwise (fp32 output; tolerance below).
"""

import math

import pytest
import torch
from test_gpu import OFFSET_CASES, TOL, make_inputs

from attnclimb import rungs
from attnclimb.reference import attention_exact, far_offset_inputs, lse_exact, rel_l2
from attnclimb.runtime.launch import feature_variant, run_rung

pytestmark = pytest.mark.gpu
TOP = rungs.TOP


def run_features(q, k, v, scale=None, causal=False, with_lse=False, rung=TOP):
    """Run ``rung`` (the top rung unless given) with the requested features into NaN-poisoned outputs; return
    (o, lse or None)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device, dtype=torch.float32) if with_lse else None
    run_rung(rung, q, k, v, o, scale, causal=causal, lse=lse)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} output elements unwritten or NaN"
    if lse is not None:
        assert not torch.isnan(lse).any(), f"{int(torch.isnan(lse).sum())} LSE elements unwritten or NaN"
    return o, lse


def check_lse(lse, ref, scores_bound):
    """fp32 LSE against float64: the scores are fp32 sums of 128 products (rel. error ~128·2^-24 of
    sum |q·k|), so the tolerance scales with ``scores_bound`` (an upper bound of |scale·s| per row)."""
    tol = 1e-4 + 4e-5 * scores_bound  # a (B, H, Sq) tensor like lse
    assert (torch.isfinite(lse) == torch.isfinite(ref)).all(), "LSE finite where the exact one is not, or back"
    finite = torch.isfinite(ref)
    err = (lse.double() - ref).abs()[finite]
    assert (err <= tol[finite]).all(), f"max LSE error {err.max().item():.3e}"


def _bound(q, k, scale):
    """Per-row bound of |scale · q·k| over the keys, (B, H, Sq): |scale| · |q|_1-ish via max |q|·|k| sums."""
    kk = k.float().abs().amax(dim=2, keepdim=True)  # (B, Hkv, 1, D)
    kk = kk.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return abs(scale) * (q.float().abs() * kk).sum(-1).double()


CAUSAL_SHAPES = [
    (1, 2, 1, 1),
    (1, 2, 1, 1000),  # Sq = 1 < Sk: the one row sees key 0 only
    (1, 2, 128, 128),
    (2, 3, 1000, 1000),
    (1, 2, 1000, 129),  # Sq > Sk: rows past Sk see every key
    (1, 2, 129, 1000),  # Sq < Sk: keys past Sq are never seen
    (1, 2, 4096, 4096),
    (3, 40, 700, 700),  # more work tiles than SMs: the heaviest-first (snake) order and the persistent loop
    (1, 1, 177, 353),
    # K and V of all heads above CAUSAL_L2_BYTES (32 MiB): the head-by-head order in heavy/light pairs, with an
    # odd number of m-blocks per head (71), so that pairs straddle two heads
    (1, 8, 9000, 9000),
]


@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_causal_matches_float64(shape):
    q, k, v = make_inputs(*shape)
    o, _ = run_features(q, k, v, causal=True)
    err = rel_l2(o, attention_exact(q, k, v, causal=True))
    assert err <= TOL, f"causal {shape}: rel L2 {err:.3e}"


@pytest.mark.parametrize("heads_kv", [1, 2, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_matches_float64(heads_kv, causal):
    b, h, sq, sk = 2, 8, 600, 900
    q, _, _ = make_inputs(b, h, sq, sk)
    _, k, v = make_inputs(b, heads_kv, sq, sk)
    o, _ = run_features(q, k, v, causal=causal)
    err = rel_l2(o, attention_exact(q, k, v, causal=causal))
    assert err <= TOL, f"GQA {h}/{heads_kv} causal={causal}: rel L2 {err:.3e}"


@pytest.mark.parametrize("shape", [(1, 2, 1, 1), (2, 3, 1000, 1000), (1, 2, 129, 4096), (1, 2, 300, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 1.0, -0.3])
def test_lse_matches_float64(shape, causal, scale):
    q, k, v = make_inputs(*shape, kind="logits_x30")
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=True)
    assert rel_l2(o, attention_exact(q, k, v, sc, causal=causal)) <= TOL
    check_lse(lse, lse_exact(q, k, sc, causal=causal), _bound(q, k, sc))


@pytest.mark.parametrize("case", list(OFFSET_CASES))
@pytest.mark.parametrize("causal", [False, True])
def test_features_far_offset_logits(case, causal):
    """Issue 6's hostile inputs through the causal and LSE variants: O within the bf16 tolerance, the LSE
    within fp32's (relative to the scores' size), whatever the magnitude."""
    scale = 1.0
    p_of, ties = OFFSET_CASES[case]
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = far_offset_inputs(1, 256, 1024, p_of(scale), scale, ties=ties, generator=g, device="cuda")
    o, lse = run_features(q, k, v, scale=scale, causal=causal, with_lse=True)
    err = rel_l2(o, attention_exact(q, k, v, scale, causal=causal))
    assert err <= TOL, f"{case} causal={causal}: rel L2 {err:.3e}"
    check_lse(lse, lse_exact(q, k, scale, causal=causal), _bound(q, k, scale))


def test_causal_gqa_lse_combined():
    q, _, _ = make_inputs(2, 8, 1100, 1100, kind="heavy_tail")
    _, k, v = make_inputs(2, 2, 1100, 1100)
    o, lse = run_features(q, k, v, causal=True, with_lse=True)
    sc = 1.0 / math.sqrt(128)
    assert rel_l2(o, attention_exact(q, k, v, sc, causal=True)) <= TOL
    check_lse(lse, lse_exact(q, k, sc, causal=True), _bound(q, k, sc))


def test_plain_variant_is_the_rung_itself():
    """All features off is the top rung as benchmarked, not a recompiled copy."""
    assert feature_variant(TOP, False, False, False) is TOP


def _bshd(b, h, s, g):
    """A (B, H, S, 128) view of a (B, S, H, 128)-contiguous bf16 buffer (what diffusers and flash-attn pass)."""
    return torch.randn(b, s, h, 128, generator=g, device="cuda").to(torch.bfloat16).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_kv", [4, 1])
def test_strided_bshd_views_in_place(causal, heads_kv):
    """Issue 9's zero-copy path: BSHD views of Q, K, V read through 4-D tensor maps and O written into a
    BSHD view through its strides; the buffer around O is untouched."""
    g = torch.Generator(device="cuda").manual_seed(11)
    b, h, sq, sk = 2, 4, 777, 1000
    q, k, v = _bshd(b, h, sq, g), _bshd(b, heads_kv, sk, g), _bshd(b, heads_kv, sk, g)
    o_buf = torch.full((b, sq, h + 1, 128), float("nan"), device="cuda", dtype=torch.bfloat16)  # a spare head
    o = o_buf[:, :, :h].transpose(1, 2)
    sc = 1 / math.sqrt(128)
    run_rung(TOP, q, k, v, o, sc, causal=causal)
    torch.cuda.synchronize()
    assert not q.is_contiguous() and not o.is_contiguous()
    assert torch.isnan(o_buf[:, :, h]).all(), "the kernel wrote outside O's view"
    assert not torch.isnan(o).any()
    assert rel_l2(o, attention_exact(q, k, v, sc, causal=causal)) <= TOL


def test_strided_fused_qkv_slices():
    """Q, K, V as thirds of one fused (B, S, 3, H, 128) projection buffer: row stride 3·H·128."""
    g = torch.Generator(device="cuda").manual_seed(12)
    b, s, h = 2, 600, 4
    qkv = torch.randn(b, s, 3, h, 128, generator=g, device="cuda").to(torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    o = torch.full((b, h, s, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    run_rung(TOP, q, k, v, o, 1 / math.sqrt(128))
    torch.cuda.synchronize()
    assert rel_l2(o, attention_exact(q, k, v)) <= TOL


def test_strided_refuses_what_tma_cannot_read():
    q = torch.zeros(1, 2, 64, 130, device="cuda", dtype=torch.bfloat16)[..., :128]  # rows of 260 bytes
    o = torch.empty(1, 2, 64, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="TMA"):
        run_rung(TOP, q, q, q, o, 1.0)


def _randn_bf16(*shape, g):
    return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)


def randn_qkv(b, h, sq, sk, head_dim, g, h_kv=None):
    """Fresh bf16 Q ``(b, h, sq, head_dim)``, K and V ``(b, h_kv or h, sk, head_dim)`` from generator ``g``."""
    h_kv = h if h_kv is None else h_kv
    return (
        _randn_bf16(b, h, sq, head_dim, g=g),
        _randn_bf16(b, h_kv, sk, head_dim, g=g),
        _randn_bf16(b, h_kv, sk, head_dim, g=g),
    )


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 1000, 1000), (1, 2, 129, 700), (1, 2, 1, 1), (2, 40, 300, 300)])
def test_head_dims_match_float64(head_dim, causal, shape):
    """Issue 8: head_dim 64 and 256 (the rung's `head_dims` variants: 1 and 4 panels per row, P·V as
    m64n64k16 / m64n256k16), with the LSE, against float64."""
    g = torch.Generator(device="cuda").manual_seed(head_dim + causal)
    b, h, sq, sk = shape
    q, k, v = randn_qkv(b, h, sq, sk, head_dim, g)
    sc = 1 / math.sqrt(head_dim)
    o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=True)
    assert rel_l2(o, attention_exact(q, k, v, sc, causal=causal)) <= TOL
    check_lse(lse, lse_exact(q, k, sc, causal=causal), _bound(q, k, sc))


@pytest.mark.parametrize("head_dim", [64, 128])
# more work tiles than any persistent grid (132 SMs, one CTA each) at head_dim 64 (192 rows) and 128 (128 rows)
@pytest.mark.parametrize("shape", [(3, 40, 700, 700), (2, 40, 1000, 1000), (4, 40, 129, 1000)])
def test_causal_one_cta_per_tile(shape, head_dim):
    """``Rung.causal_per_tile`` (the launch of the ``hwsched`` A/B, scripts/make_variants.py): a causal call gets
    one CTA per work tile, so each CTA's loop runs once (here on the top rung's own order), against float64; a
    non-causal call keeps the persistent grid."""
    import dataclasses

    rung = dataclasses.replace(TOP, causal_per_tile=True)
    g = torch.Generator(device="cuda").manual_seed(head_dim + shape[2])
    b, h, sq, sk = shape
    q, k, v = randn_qkv(b, h, sq, sk, head_dim, g)
    sc = 1 / math.sqrt(head_dim)
    o, _ = run_features(q, k, v, scale=sc, causal=True, rung=rung)
    assert rel_l2(o, attention_exact(q, k, v, sc, causal=True)) <= TOL
    for causal in (True, False):
        plan = run_rung(rung, q, k, v, torch.empty_like(q), sc, causal=causal)
        tiles = plan.lr.rung.num_m_blocks(sq) * b * h
        assert plan.lr.persistent_grid(tiles) < tiles  # the two launches differ on this shape
        assert plan.grid == (tiles if causal else plan.lr.persistent_grid(tiles),), causal


def test_head_dims_on_recycled_memory():
    """The tensor-map cache keys on head_dim: Q, K, V of head_dim 64 and 256 laid in the very memory of
    earlier head_dim 128 ones with the same (batch·heads, seqlen) must not get their maps (a stale map
    reads every head but the first from the wrong rows; O can still pass when seqlen_k = 1, the LSE cannot).
    Found on the H200 by test_head_dims_match_float64 at (1, 2, 1, 1) once the allocator recycled a block."""
    g = torch.Generator(device="cuda").manual_seed(11)
    b, h, sq, sk = 1, 3, 1, 1
    buf = torch.empty(3, b * h * 256 * max(sq, sk) + 64, device="cuda", dtype=torch.bfloat16)
    for head_dim in (128, 64, 256, 128, 64):
        q, k, v = (buf[i, : b * h * n * head_dim].view(b, h, n, head_dim) for i, n in enumerate((sq, sk, sk)))
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=g, device="cuda"))
        sc = 1 / math.sqrt(head_dim)
        o, lse = run_features(q, k, v, scale=sc, with_lse=True)
        assert rel_l2(o, attention_exact(q, k, v, sc)) <= TOL, head_dim
        check_lse(lse, lse_exact(q, k, sc), _bound(q, k, sc))


@pytest.mark.parametrize("head_dim", [64, 256])
def test_head_dims_strided_gqa(head_dim):
    g = torch.Generator(device="cuda").manual_seed(3 * head_dim)
    b, h, hkv, s = 2, 8, 2, 500
    q = _randn_bf16(b, s, h, head_dim, g=g).transpose(1, 2)
    k, v = (_randn_bf16(b, s, hkv, head_dim, g=g).transpose(1, 2) for _ in range(2))
    o = torch.full((b, h, s, head_dim), float("nan"), device="cuda", dtype=torch.bfloat16)
    run_rung(TOP, q, k, v, o, 1 / math.sqrt(head_dim), causal=True)
    torch.cuda.synchronize()
    assert rel_l2(o, attention_exact(q, k, v, 1 / math.sqrt(head_dim), causal=True)) <= TOL


def test_unsupported_head_dim_is_refused():
    q = torch.zeros(1, 1, 64, 96, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim 96"):
        run_rung(TOP, q, q, q, torch.empty_like(q), 1.0)


# ---------------------------------------------------------------- fp16 (the FP16 variant)

F16 = torch.float16
TOL16 = 3e-3  # fp16 inputs, P and O (11-bit significands): rel. L2 ~3e-4 on these inputs; bf16 P would be ~2e-3+


def _randn_f16(*shape, g, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(F16)


def _f16_qkv(b, h, hk, sq, sk, d=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return _randn_f16(b, h, sq, d, g=g), _randn_f16(b, hk, sk, d, g=g), _randn_f16(b, hk, sk, d, g=g)


def _check_f16(o, q, k, v, sc, causal, lse=None, tol=TOL16):
    assert o.dtype == F16
    err = rel_l2(o, attention_exact(q, k, v, sc, causal=causal))
    assert err <= tol, f"rel L2 {err:.3e}"
    if lse is not None:
        assert lse.dtype == torch.float32
        check_lse(lse, lse_exact(q, k, sc, causal=causal), _bound(q, k, sc))


F16_SHAPES = [
    (1, 2, 1, 1),
    (1, 2, 1, 1000),
    (2, 3, 1000, 1000),
    (1, 2, 1000, 129),
    (1, 2, 129, 1000),
    (3, 40, 700, 700),
]


@pytest.mark.parametrize("shape", F16_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_lse", [False, True])
def test_fp16_matches_float64(shape, causal, with_lse):
    """fp16 Q, K, V (the FP16 variant: fp16 wgmmas, fp16 P, fp16 O), plain and causal (Sq = 1, Sq != Sk, many
    work tiles), with and without the LSE, NaN-poisoned outputs, against float64."""
    b, h, sq, sk = shape
    q, k, v = _f16_qkv(b, h, h, sq, sk, seed=sq + sk + causal)
    sc = 1 / math.sqrt(128)
    o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=with_lse)
    _check_f16(o, q, k, v, sc, causal, lse)


@pytest.mark.parametrize("heads_kv", [1, 2, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_fp16_gqa(heads_kv, causal):
    q, k, v = _f16_qkv(2, 8, heads_kv, 600, 900, seed=heads_kv)
    o, lse = run_features(q, k, v, causal=causal, with_lse=True)
    _check_f16(o, q, k, v, 1 / math.sqrt(128), causal, lse)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 1000, 1000), (1, 2, 129, 700), (1, 2, 1, 1)])
def test_fp16_head_dims(head_dim, causal, shape):
    b, h, sq, sk = shape
    q, k, v = _f16_qkv(b, h, h, sq, sk, d=head_dim, seed=head_dim)
    sc = 1 / math.sqrt(head_dim)
    o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=True)
    _check_f16(o, q, k, v, sc, causal, lse)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_kv", [4, 1])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fp16_strided_bshd_views(causal, heads_kv, head_dim):
    """fp16 BSHD views read in place through 4-D tensor maps of FLOAT16 elements, O written into a BSHD view."""
    g = torch.Generator(device="cuda").manual_seed(21 + heads_kv)
    b, h, sq, sk = 2, 4, 777, 1000
    q = _randn_f16(b, sq, h, head_dim, g=g).transpose(1, 2)
    k, v = (_randn_f16(b, sk, heads_kv, head_dim, g=g).transpose(1, 2) for _ in range(2))
    o_buf = torch.full((b, sq, h + 1, head_dim), float("nan"), device="cuda", dtype=F16)
    o = o_buf[:, :, :h].transpose(1, 2)
    sc = 1 / math.sqrt(head_dim)
    run_rung(TOP, q, k, v, o, sc, causal=causal)
    torch.cuda.synchronize()
    assert torch.isnan(o_buf[:, :, h]).all(), "the kernel wrote outside O's view"
    assert not torch.isnan(o).any()
    _check_f16(o, q, k, v, sc, causal)


def test_fp16_and_bf16_on_recycled_memory():
    """The tensor-map cache keys on the dtype: fp16 tensors in the very memory of bf16 ones of the same shape
    (and back) get maps of their own element type (a stale BFLOAT16 map would decode fp16 bits as bf16)."""
    g = torch.Generator(device="cuda").manual_seed(5)
    buf = torch.empty(3, 2 * 4 * 500 * 128, device="cuda", dtype=F16)
    for dtype in (torch.bfloat16, F16, torch.bfloat16, F16):
        q, k, v = (buf[i].view(dtype).view(2, 4, 500, 128) for i in range(3))
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=g, device="cuda"))
        o, lse = run_features(q, k, v, with_lse=True)
        assert o.dtype == dtype
        assert rel_l2(o, attention_exact(q, k, v)) <= (TOL16 if dtype == F16 else TOL), dtype
        check_lse(lse, lse_exact(q, k), _bound(q, k, 1 / math.sqrt(128)))


def test_fp16_values_near_the_fp16_limit():
    """Q, K, V near ±60000: scores up to 4·60000² (Q has 4 nonzero columns, so that every partial sum is exact
    in fp32 in any order and ties stay ties), with several scales: hard rows of ties at the max (1/sqrt(128),
    -0.5) and soft rows 5.2 units apart (1e-9); O in V's range, the LSE finite and right."""
    g = torch.Generator(device="cuda").manual_seed(8)
    b, h, sq, sk = 1, 4, 300, 500
    q = (torch.randint(-1, 2, (b, h, sq, 128), generator=g, device="cuda") * 60000.0).to(F16)
    q[..., 4:] = 0
    k = (torch.randint(-1, 2, (b, h, sk, 128), generator=g, device="cuda") * 60000.0).to(F16)
    v = ((torch.rand(b, h, sk, 128, generator=g, device="cuda") * 2 - 1) * 60000.0).to(F16)
    for sc in (1 / math.sqrt(128), 1e-9, -0.5):
        for causal in (False, True):
            o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=True)
            assert torch.isfinite(o).all()
            _check_f16(o, q, k, v, sc, causal, lse)


def test_fp16_output_at_fp16_max_stays_finite():
    """V = 65504 (fp16's largest finite) everywhere: O is exactly that. The fp16-rounded P (2^-c just above a
    rounding midpoint, tests/test_reference_cpu.py) push Σ P·V / l past 65520, where the fp16 store would give
    inf without the epilogue's clamp to ±65504."""
    from test_reference_cpu import _overshoot_inputs

    q, k, v, sc = (t.cuda() if torch.is_tensor(t) else t for t in _overshoot_inputs())
    o, _ = run_features(q, k, v, scale=sc)
    assert torch.isfinite(o).all() and bool((o == 65504).all())


@pytest.mark.parametrize("ties", [False, True], ids=["soft", "ties"])
@pytest.mark.parametrize("log2_mc", [24, 25, 27, 28, 29])
@pytest.mark.parametrize("causal", [False, True])
def test_fp16_soft_row_edge(log2_mc, ties, causal):
    """Logits with |max·c| just above 2^24 .. 2^29 (both signs; near-constant rows and rows of ties): rows
    whose P a bare fp16 switch would flush to 0 entirely (k <= -25, checked) come out right, with no zero row,
    and the LSE includes the shift."""
    from test_reference_cpu import _fp16_edge_inputs, _row_facts

    q, k, v, sc = _fp16_edge_inputs(log2_mc, "above", ties, seed=log2_mc, seqlen_k=1000, seqlen_q=256, device="cuda")
    _, hard, shift = _row_facts(q, k, sc)
    if log2_mc >= 28:
        assert bool((shift <= -25).any()) and not bool(hard.all())  # the rows the fix is for are there
    o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=True)
    assert bool((o.double().abs().amax(-1) > 0).all()), "a row came out all zero"
    _check_f16(o, q, k, v, sc, causal, lse)
    if not causal:  # ln 2·(R + k) + ln l: within ~half an fp32 ulp; without k up to 1.4 ulp off (CPU model)
        ref = lse_exact(q, k, sc)
        ulp = torch.exp2(torch.floor(torch.log2(ref.abs())) - 23)
        assert ((lse.double() - ref).abs() / ulp).max().item() < 0.75


@pytest.mark.parametrize("log2_mc", [25, 27, 28, 29])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("number", [10, 11, 12])
def test_fp16_shift_changes_across_tiles(number, causal, log2_mc):
    """Keys sorted ascending by K's last column (_fp16_rising_inputs, built on the CPU so that the checked
    facts are those of these very inputs): the running max of hundreds of rows grows across K/V tiles and
    their shift k changes between tiles, with alpha < 1 rescales (checked with the model for the variant's
    tile width, without the lazy rescale; the unsorted edge inputs above never change k). Rungs 10-12 (rung 12's
    lazy rescale may keep a row's reference and k over several tiles), plain and causal, with the LSE, against
    float64: no zero row, O within fp16's tolerance, the LSE within the usual bound and, without the mask,
    within 0.75 fp32 ulp (the CPU model: tests/test_reference_cpu.py)."""
    from test_reference_cpu import _fp16_rising_inputs, _tile_shifts

    rung = rungs.get(number)
    q, k, v, sc = _fp16_rising_inputs(log2_mc, seed=log2_mc, seqlen_q=1000, seqlen_k=1000)
    block_n = feature_variant(rung, causal, False, True, False, 128, k.shape[2], True).block_n
    changed, rescales = _tile_shifts(q, k, sc, block_n, causal=causal)
    assert changed >= 200 and rescales >= 500, (changed, rescales)  # k changes across tiles on many rows
    q, k, v = (t.cuda() for t in (q, k, v))
    o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=True, rung=rung)
    assert bool((o.double().abs().amax(-1) > 0).all()), "a row came out all zero"
    _check_f16(o, q, k, v, sc, causal, lse, tol=1e-3)
    if not causal:
        ref = lse_exact(q, k, sc)
        ulp = torch.exp2(torch.floor(torch.log2(ref.abs())) - 23)
        assert ((lse.double() - ref).abs() / ulp).max().item() < 0.75


RUNG10_SHAPES = [(2, 3, 1000, 1000), (1, 2, 129, 700), (1, 2, 1, 1), (3, 40, 700, 700)]


@pytest.mark.parametrize(("causal", "with_lse"), [(False, False), (True, True)], ids=["plain", "causal-lse"])
@pytest.mark.parametrize("shape", RUNG10_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp16_rung10_smoke(shape, causal, with_lse):
    """Rung 10's FP16 variant (the lowest rung with it; the top rung's is tested above): fp16 Q, K, V at rung=10
    through the public attnclimb.attention, plain and causal with the LSE, against float64; and run_rung on
    rungs.get(10) into NaN-poisoned outputs."""
    import attnclimb

    b, h, sq, sk = shape
    q, k, v = _f16_qkv(b, h, h, sq, sk, seed=12 + sq + causal)
    sc = 1 / math.sqrt(128)
    res = attnclimb.attention(q, k, v, rung=10, scale=sc, is_causal=causal, return_lse=with_lse)
    o, lse = res if with_lse else (res, None)
    _check_f16(o, q, k, v, sc, causal, lse)
    o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=with_lse, rung=rungs.get(10))
    _check_f16(o, q, k, v, sc, causal, lse)


def _o_at_offset(shape, dtype, offset_bytes):
    """A contiguous NaN-filled O of ``shape`` whose first element lies ``offset_bytes`` past a fresh allocation
    (256-byte aligned): 0 and 16 allow 16-byte stores of O, 4 only 4-byte ones."""
    n = math.prod(shape)
    pad = offset_bytes // torch.tensor([], dtype=dtype).element_size()
    return torch.full((n + pad,), float("nan"), device="cuda", dtype=dtype)[pad:].view(shape)


@pytest.mark.parametrize("offset_bytes", [0, 4, 16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_output_alignment_paths(offset_bytes, head_dim, dtype):
    """The top rung writes O wherever run_rung accepts a contiguous O: 16-byte aligned or only 4-byte aligned (a
    kernel that stores 16-byte chunks must fall back to narrower stores there), at every head_dim and in both
    dtypes, with a ragged last m-block, and nothing written before O."""
    g = torch.Generator(device="cuda").manual_seed(1000 + offset_bytes + head_dim)
    b, h, sq, sk = 2, 3, 333, 517
    q, k, v = (torch.randn(b, h, s, head_dim, device="cuda", generator=g).to(dtype) for s in (sq, sk, sk))
    o = _o_at_offset((b, h, sq, head_dim), dtype, offset_bytes)
    assert o.is_contiguous() and o.data_ptr() % 16 == offset_bytes % 16
    run_rung(TOP, q, k, v, o, 1.0 / math.sqrt(head_dim))
    torch.cuda.synchronize()
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} output elements unwritten or NaN"
    err = rel_l2(o, attention_exact(q, k, v))
    assert err <= TOL, f"offset {offset_bytes} B, head_dim {head_dim}, {dtype}: rel L2 {err:.3e}"
    # the elements before O (the padding) are not written
    base = o.view(-1)
    pad = offset_bytes // o.element_size()
    if pad:
        before = torch.as_strided(base, (pad,), (1,), base.storage_offset() - pad)
        assert torch.isnan(before).all(), "the kernel wrote before O"
