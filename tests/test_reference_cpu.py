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
    bn=st.sampled_from([16, 64, 80, 128]),
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


# ---- issue 6: the rung-4+ fold at every magnitude (kernel_fp32 mirrors the kernels' fp32 arithmetic) ----

from attnclimb import reference as _reference  # noqa: E402
from attnclimb.reference import LOG2E, ROW_MAX_INIT, far_offset_inputs, online_rescale_fp32, row_multiplier_fp32  # noqa: E402

F32 = torch.float32
INV_SQRT_D = 1 / math.sqrt(128)


def _legacy_rescale(m_old, err_old, m_new, c):
    """Rungs 4-8 before issue 6: P against fl(m_new·c), but alpha against the exact m_old·c."""
    mc = m_new * c
    alpha = torch.exp2(_reference._fma32(m_old, c.expand_as(m_new), -mc))
    return alpha, c.expand_as(m_new), -mc, torch.zeros_like(m_new)


@pytest.mark.parametrize("seqlen_k", [4096, 16384])
def test_kernel_model_far_offset_logits(seqlen_k, monkeypatch):
    """Issue 6's input: all logits of a row near ±2.6e5, a soft softmax. The fixed fold is exact; the
    rounding model of the old one reproduces the size of the error issue 6 reported from the H200 (5.6e-2
    at 4k, 2.2e-1 at 16k for the default rung)."""
    g = torch.Generator().manual_seed(seqlen_k)
    q, k, v = far_offset_inputs(1, 16, seqlen_k, 11, 1.0, generator=g)
    ref = attention_exact(q, k, v, 1.0)
    fixed = attention_tiled(q, k, v, 1.0, block_n=128, kernel_fp32=True)
    assert rel_l2(fixed, ref) < 3e-3
    monkeypatch.setattr(_reference, "online_rescale_fp32", _legacy_rescale)
    legacy = attention_tiled(q, k, v, 1.0, block_n=128, kernel_fp32=True)
    assert rel_l2(legacy, ref) > 3e-2  # the test above can fail: this is the bug it guards against


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(0, 121),
    scale=st.sampled_from([1.0, INV_SQRT_D, 0.3, 7.5]),
    ties=st.booleans(),
    block_n=st.sampled_from([64, 128]),
    seed=st.integers(0, 2**31 - 1),
)
def test_kernel_model_any_magnitude(p, scale, ties, block_n, seed):
    """Scores anywhere from 0 to the fp32 limit, both signs, on both sides of the slow-row bound."""
    q, k, v = far_offset_inputs(1, 4, 600, p, scale, ties=ties, generator=torch.Generator().manual_seed(seed))
    out, lse = attention_tiled(q, k, v, scale, block_n=block_n, kernel_fp32=True, return_lse=True)
    assert torch.isfinite(out).all()
    assert rel_l2(out, attention_exact(q, k, v, scale)) < 6e-3
    # The LSE is fp32, as the kernel writes it (kernel_lse_fp32): within 1e-6 where the exact LSE fits in
    # fp32, and the infinity of the right sign where it does not (|scale·max| > FLT_MAX).
    ref_lse = lse_exact(q, k, scale)
    fits = ref_lse.abs() <= torch.finfo(torch.float32).max
    assert torch.isfinite(lse[fits]).all()
    assert (((lse - ref_lse).abs() / ref_lse.abs().clamp(min=1.0))[fits] < 1e-6).all()
    assert (lse[~fits] == torch.sign(ref_lse[~fits]) * math.inf).all()


_f32s = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(m=_f32s, dm=_f32s, c=st.floats(1.1754943508222875e-38, 3.4028234663852886e38, width=32))
def test_online_rescale_fp32_properties(m, dm, c):
    """alpha is exactly 1 when the max did not change and equals 2^(R_old − R_new) (float64) when it grew;
    the largest P of a row, 2^(m·mul − R), lies in (2^-64, 1] (exactly 1 where mul != c) and the next score
    below the max weighs <= 2^-32 of it where mul != c; nothing is NaN or inf; any finite max, c in
    [FLT_MIN, FLT_MAX] (alpha's value only for c >= 2^-100: softmax.cuh's documented limit)."""
    c = torch.tensor([c], dtype=F32)
    m_old = torch.tensor([m], dtype=F32)
    m_new = torch.maximum(m_old, m_old + torch.tensor([abs(dm)], dtype=F32))
    m_new = torch.where(torch.isfinite(m_new), m_new, m_old)
    _, _, _, err_old = online_rescale_fp32(torch.tensor([ROW_MAX_INIT]), torch.zeros(1), m_old, c)
    for a, b in ((m_old, m_old), (m_old, m_new)):
        alpha, mul, neg_ref, err = online_rescale_fp32(a, err_old, b, c)
        for x in (alpha, mul, neg_ref, err):
            assert torch.isfinite(x).all()
        if torch.equal(a, b):
            assert alpha.item() == 1.0
        assert 0.0 <= alpha.item() <= 1.0 + 1e-6  # R_old <= R_new: rounding up is monotone
        if c.item() >= 2.0**-100:  # R = m·c − e in float64, from the returned e (exact residuals)
            r_old = a.double() * c.double() - err_old.double()
            r_new = b.double() * c.double() - err.double()
            want = torch.exp2(r_old - r_new).item()
            assert abs(alpha.item() - want) <= 1e-5 * max(want, 2.0**-100)
        p_max = torch.exp2(_reference._fma32(b, mul, neg_ref))
        assert 2.0**-64 < p_max.item() <= 1.0
        if mul.item() != c.item():
            assert p_max.item() == 1.0 and err.item() == 0.0
            below = torch.nextafter(b, torch.tensor([-math.inf]))
            assert torch.exp2(_reference._fma32(below, mul, neg_ref)).item() <= 2.0**-32
        else:
            assert abs((b.double() * c.double()).item()) < 2.0**30 + 2**6
    alpha0, _, _, _ = online_rescale_fp32(torch.tensor([ROW_MAX_INIT]), torch.zeros(1), m_old, c)
    # First tile: O and l are still 0, so alpha need only be finite (it is 0 unless c·FLT_MAX is small).
    assert 0.0 <= alpha0.item() <= 1.0


def test_kernel_model_large_v_does_not_overflow():
    """Every P <= 1 (the reference is rounded up), so O = sum P·V overflows only where the exact sum would.
    A soft row (mul = c) with |max·c| just under 2^30, where round-to-nearest would leave a residual of
    +32 and P = 2^32 at the max, and V = 1.6e30: the exact output is V, and so is the model's."""
    q = torch.zeros(1, 1, 1, 128, dtype=torch.float64)
    k = torch.zeros(1, 1, 2, 128, dtype=torch.float64)
    q[..., 0], k[..., 0] = 1.9921875 * 2**10, 1.0  # m = 2040 exactly; two tied keys
    v = torch.full((1, 1, 2, 128), 1.6e30, dtype=torch.float64).to(torch.bfloat16)
    scale = 362452.233  # c·m lies 32 above its nearest fp32 (whose ulp is 64 there): the worst case
    out = attention_tiled(q, k, v, scale, block_n=64, kernel_fp32=True)
    assert torch.isfinite(out).all()
    assert rel_l2(out, attention_exact(q, k, v, scale)) < 1e-2


@pytest.mark.parametrize(("p", "scale", "hard"), [(11, INV_SQRT_D, False), (30, 1.0, True), (121, 1.0, True)])
def test_kernel_lse_soft_and_hard_rows(p, scale, hard):
    """Both branches of the top rung's LSE formula (kernel_lse_fp32) against float64: soft rows through
    the row reference R, hard rows (where only ties at the max carry weight) through scale·max."""
    q, k, v = far_offset_inputs(1, 4, 300, p, scale, generator=torch.Generator().manual_seed(p))
    _, lse = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, return_lse=True)
    m = torch.matmul(q.double(), k.double().transpose(-1, -2)).amax(-1).float()
    c = torch.tensor(scale, dtype=F32) * torch.tensor(LOG2E, dtype=F32)
    assert bool((row_multiplier_fp32(m, c) != c).all()) == hard  # the case exercises the branch it names
    ref = lse_exact(q, k, scale)
    assert ((lse - ref).abs() / ref.abs().clamp(min=1.0)).max().item() < 1e-6


# ---- the top rung's FP16 variant: fp16 P needs the per-row shift of softmax.cuh ("fp16 P") ----

F16 = torch.float16


def _fp16_edge_inputs(log2_mc, side, ties, seed=0, seqlen_k=600, scale0=INV_SQRT_D, seqlen_q=8, device="cpu"):
    """fp16 far-offset inputs (both signs) whose row maxima put |max·c| just below or above 2^log2_mc: the
    offset p of far_offset_inputs for ``scale0``, then a scale that puts 127·2^p·c at 2^log2_mc·(1 ∓ 2^-8)."""
    p = min(_reference.far_offset_log2(scale0, log2_mc), 30)  # fp16 holds Q and K columns up to 2^15
    scale = 2.0**log2_mc * (1 - 2**-8 if side == "below" else 1 + 2**-8) / (127 * 2.0**p * LOG2E)
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = far_offset_inputs(1, seqlen_q, seqlen_k, p, scale, ties=ties, generator=g, dtype=F16, device=device)
    return q, k, v, scale


def _row_facts(q, k, scale):
    """Per row: |max·c| (float64), whether it is a hard row (mul != c), and the shift k of its final max."""
    q, k = q.cpu(), k.cpu()
    m = torch.matmul(q.double(), k.double().transpose(-1, -2)).amax(-1, keepdim=True).float()
    c = torch.tensor(scale, dtype=F32) * torch.tensor(LOG2E, dtype=F32)
    _, mul, _, _, shift = online_rescale_fp32(torch.full_like(m, ROW_MAX_INIT), torch.zeros_like(m), m, c, shift=True)
    return (m.double() * c.double()).abs(), mul != c, shift


def _unshifted(monkeypatch):
    """The FP16 model without the fix: P rounded to fp16 straight from 2^(s·c − R), as a bare dtype switch."""
    monkeypatch.setattr(_reference, "p_shift_fp32", torch.zeros_like)


EDGES = [(x, side) for x in (24, 25, 27, 28, 29, 30) for side in ("below", "above")]


@pytest.mark.parametrize("ties", [False, True], ids=["soft", "ties"])
@pytest.mark.parametrize(("log2_mc", "side"), EDGES, ids=[f"2^{x}-{s}" for x, s in EDGES])
def test_fp16_model_soft_row_edges(log2_mc, side, ties, monkeypatch):
    """fp16 P at |max·c| around 2^24 .. 2^30, near-constant rows (scores a unit or two apart) and rows of ties,
    both signs of the offset: the shifted model is within fp16's tolerance everywhere, with no zero row.
    Without the shift, rows with e < −24 lose every P (O = 0 while l > 0) from 2^28 on, which this test
    shows, so it can fail; below 2^24 the shift is 0 on every row and the two models agree bit for bit, and
    on hard rows (mul < c, e = 0) the shift is 0 too."""
    q, k, v, scale = _fp16_edge_inputs(log2_mc, side, ties)
    mc, hard, shift = _row_facts(q, k, scale)
    assert bool(((mc < 2.0**log2_mc) if side == "below" else (mc >= 2.0**log2_mc)).all())  # the edge it names
    ref = attention_exact(q, k, v, scale)
    out = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16)
    assert out.dtype == F16
    assert rel_l2(out, ref) < 3e-3
    assert bool((out.double().abs().amax(-1) > 0).all())  # no row flushed to zero
    _unshifted(monkeypatch)
    bare = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16)
    if bool((mc < 2.0**24).all()) or bool(hard.all()):
        assert bool((shift == 0).all()) and torch.equal(bare, out)  # the fix is a no-op there
    if 2.0**log2_mc * (1 if side == "above" else 0.5) >= 2.0**28 and not bool(hard.all()):
        assert bool((shift <= -25).any())  # rows whose every P leaves fp16's range unshifted ...
        assert rel_l2(bare, ref) > 0.1  # ... and the bare dtype switch fails on them
        assert bool((bare.double().abs().amax(-1) == 0).any())


@pytest.mark.parametrize("log2_mc", [24, 25, 26, 28, 29])
def test_fp16_model_lse_carries_the_shift(log2_mc, monkeypatch):
    """With WRITE_LSE the FP16 variant's LSE is ln 2·(R + k) + ln l: within half an fp32 ulp of float64 (plus
    rounding) on rows just above 2^log2_mc; the same epilogue without k is off by up to |k|·ln 2, over an ulp."""
    q, k, v, scale = _fp16_edge_inputs(log2_mc, "above", False)
    ref = lse_exact(q, k, scale)
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs())) - 23)
    _, lse = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16, return_lse=True)
    assert ((lse - ref).abs() / ulp).max().item() < 0.6
    real = _reference.kernel_lse_fp32
    monkeypatch.setattr(_reference, "kernel_lse_fp32", lambda m, sums, s, c, shift=False: real(m, sums, s, c))
    _, no_k = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16, return_lse=True)
    assert ((no_k - ref).abs() / ulp).max().item() > 1.0


@settings(max_examples=400, deadline=None)
@given(m=_f32s, dm=_f32s, c=st.floats(1.1754943508222875e-38, 3.4028234663852886e38, width=32))
def test_online_rescale_fp32_shift_properties(m, dm, c):
    """online_rescale<true> (fp16 P): the row's largest P, 2^(m·mul − R − k), lies in [1/2, 1] (exactly 1 on
    hard rows, where k = 0); k = 0 whenever |m·c| < 2^24; err = e − k is exact and in (−1, 0]; the effective
    reference R + k is m·c rounded up to fp32 below 2^24 and to an integer above; alpha is exactly 1 when the
    max did not change, at most 1 (+ rounding) when it grew, and 2^(R'_old − R'_new) (float64)."""
    c = torch.tensor([c], dtype=F32)
    m_old = torch.tensor([m], dtype=F32)
    m_new = torch.maximum(m_old, m_old + torch.tensor([abs(dm)], dtype=F32))
    m_new = torch.where(torch.isfinite(m_new), m_new, m_old)
    init = (torch.tensor([ROW_MAX_INIT]), torch.zeros(1))
    _, _, _, err_old, _ = online_rescale_fp32(*init, m_old, c, shift=True)
    for a, b in ((m_old, m_old), (m_old, m_new)):
        alpha, mul, neg_ref, err, k = online_rescale_fp32(a, err_old, b, c, shift=True)
        for x in (alpha, mul, neg_ref, err, k):
            assert torch.isfinite(x).all()
        e = _reference._fma32(b, mul, neg_ref)
        assert k.item() == math.ceil(e.item()) <= 0 and err.item() == e.item() - k.item()  # exact
        assert -1.0 < err.item() <= 0.0
        p_max = torch.exp2(e - k).item()
        assert 0.5 <= p_max <= 1.0
        mc = (b.double() * c.double()).item()
        if mul.item() != c.item():
            assert p_max == 1.0 and k.item() == 0.0
        elif abs(mc) >= 2.0**-100:  # (a subnormal m·c has an inexact residual e; the kernel flushes it anyway)
            r_eff = mc - err.double().item()  # R + k: exact in float64
            if abs(-neg_ref.item()) >= 2.0**24:
                assert r_eff == math.ceil(mc)
            else:
                assert k.item() == 0.0 and r_eff == -neg_ref.item()
        if abs(mc) < 2.0**24:
            assert k.item() == 0.0
        if torch.equal(a, b):
            assert alpha.item() == 1.0
        assert 0.0 <= alpha.item() <= 1.0 + 1e-6
        if c.item() >= 2.0**-100:
            r_old = a.double() * c.double() - err_old.double()
            r_new = b.double() * c.double() - err.double()
            want = torch.exp2(r_old - r_new).item()
            assert abs(alpha.item() - want) <= 1e-5 * max(want, 2.0**-100)


def _fp16_rising_inputs(log2_mc, seed=0, seqlen_q=64, seqlen_k=1000, device="cpu"):
    """_fp16_edge_inputs just above 2^log2_mc with the keys sorted ascending by K's last column (the same
    permutation applied to K and V): rows whose Q ends in +1 or +2 then meet their scores in rising order, so
    their running max grows tile after tile (alpha < 1) and with it the shift k changes between tiles, which
    the unsorted inputs (each row's max in the first tile) never exercise."""
    q, k, v, scale = _fp16_edge_inputs(log2_mc, "above", False, seed, seqlen_k, seqlen_q=seqlen_q, device=device)
    idx = k[..., -1].float().argsort(-1)
    k, v = (t.gather(2, idx[..., None].expand_as(t)) for t in (k, v))
    return q, k, v, scale


def _tile_shifts(q, k, scale, block_n=128, causal=False):
    """The model's online softmax over K/V tiles of ``block_n`` keys (the kernels' running max, alpha and k:
    online_rescale_fp32 with the shift; ``causal``: top-left aligned): (rows whose k changes between tiles,
    alpha < 1 rescales after the first tile summed over the rows)."""
    s = torch.matmul(q.cpu().double(), k.cpu().double().transpose(-1, -2)).float()  # exact on these inputs
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    sc = torch.tensor(scale, dtype=F32)
    if sc < 0:
        s, sc = -s, -sc
    c = sc * torch.tensor(LOG2E, dtype=F32)
    m = torch.full(s.shape[:-1] + (1,), ROW_MAX_INIT)
    err = torch.zeros_like(m)
    shifts, rescales = [], 0
    for n0 in range(0, s.shape[-1], block_n):
        m_new = torch.maximum(m, s[..., n0 : n0 + block_n].amax(-1, keepdim=True))
        alpha, _, _, err, shift = online_rescale_fp32(m, err, m_new, c, shift=True)
        rescales += int((alpha < 1).sum()) if n0 else 0
        shifts.append(shift)
        m = m_new
    shifts = torch.cat(shifts, -1)
    return int((shifts != shifts[..., :1]).any(-1).sum()), rescales


def _alpha_without_the_shift(monkeypatch):
    """A kernel bug the rising inputs catch: alpha from e alone, 2^((m_old − m_new)·c + e_new − e_old), as if
    P were relative to R, not R + k: off by 2^(k_new − k_old) whenever k changes between tiles."""
    real = _reference.online_rescale_fp32

    def stale(m_old, err_old, m_new, c, shift=False):
        alpha, mul, neg_ref, err, k = real(m_old, err_old, m_new, c, shift=True)
        k_old = real(m_old, torch.zeros_like(m_old), m_old, c, shift=True)[4]
        return alpha * torch.exp2(k - k_old), mul, neg_ref, err, k

    monkeypatch.setattr(_reference, "online_rescale_fp32", stale)


@pytest.mark.parametrize("log2_mc", [25, 26, 27, 28, 29])
def test_fp16_model_shift_changes_across_tiles(log2_mc, monkeypatch):
    """Keys in rising order (_fp16_rising_inputs: 1000 keys in 128-key tiles, as rungs 10 and 11 take them):
    a good share of the 128 rows has its k change between tiles, with alpha < 1 rescales (checked). The model
    is within fp16's tolerance of float64, with no zero row, and its LSE within 0.75 fp32 ulp. It can fail:
    with the shift forced to 0 rows flush to zero from 2^28 on, and with alpha blind to the change of k (the
    bug these inputs are for) O is off by over 5 % at every magnitude."""
    q, k, v, scale = _fp16_rising_inputs(log2_mc)
    changed, rescales = _tile_shifts(q, k, scale)
    assert changed >= 16 and rescales >= 64, (changed, rescales)  # k does change across tiles
    ref = attention_exact(q, k, v, scale)
    out, lse = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16, return_lse=True)
    assert rel_l2(out, ref) < 1e-3
    assert bool((out.double().abs().amax(-1) > 0).all())  # no row flushed to zero
    want = lse_exact(q, k, scale)
    ulp = torch.exp2(torch.floor(torch.log2(want.abs())) - 23)
    assert ((lse - want).abs() / ulp).max().item() < 0.75
    with monkeypatch.context() as mp:
        _alpha_without_the_shift(mp)
        stale = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16)
        assert rel_l2(stale, ref) > 0.05
    if log2_mc >= 28:
        _unshifted(monkeypatch)
        bare = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16)
        assert rel_l2(bare, ref) > 0.1 and bool((bare.double().abs().amax(-1) == 0).any())


def _overshoot_inputs(seqlen_k=1000):
    """One key with score 0 (P = 1) and the rest at −1 with c chosen so that their P = 2^-c lies just above
    the midpoint 0.5 + 2^-12 between two fp16 numbers: fp16 rounds each up by ~2^-11.4 of itself. V = 65504
    (fp16's max) everywhere, so O = 65504 exactly, but Σ fp16(P)·V / Σ P exceeds 65520, where fp16 rounds
    to inf."""
    c = 1.0 - math.log2(1 + 2**-11 + 2**-13)  # 2^-c = 0.5·(1 + 2^-11 + 2^-13)
    scale = c / LOG2E
    q = torch.zeros(1, 1, 4, 128, dtype=torch.float64)
    k = torch.zeros(1, 1, seqlen_k, 128, dtype=torch.float64)
    q[..., 0] = 1.0
    k[:, :, 1:, 0] = -1.0
    v = torch.full((1, 1, seqlen_k, 128), 65504.0, dtype=torch.float64)
    return q.to(F16), k.to(F16), v.to(F16), scale


def test_fp16_model_output_stays_finite_at_fp16_max(monkeypatch):
    """V at fp16's largest finite value: O is V, and the kernel's clamp of O to ±65504 before the fp16 store
    keeps it finite; without the clamp the fp16-rounded P push O past 65520 and it rounds to inf."""
    q, k, v, scale = _overshoot_inputs()
    out = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16)
    assert torch.isfinite(out).all() and bool((out == 65504).all())
    monkeypatch.setattr(_reference, "F16_MAX", math.inf)
    assert torch.isinf(attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16)).all()


def test_fp16_model_near_fp16_max_inputs():
    """Q, K, V near ±60000 (fp16's range): scores up to 128·60000² in fp32 are hard rows (mul < c), exact."""
    g = torch.Generator().manual_seed(5)
    q = (torch.randint(-1, 2, (1, 2, 64, 128), generator=g) * 60000.0).to(F16)
    k = (torch.randint(-1, 2, (1, 2, 300, 128), generator=g) * 60000.0).to(F16)
    v = ((torch.rand(1, 2, 300, 128, generator=g) * 2 - 1) * 60000.0).to(F16)
    for scale in (INV_SQRT_D, 1e-9, -0.5):
        ref = attention_exact(q, k, v, scale)
        out, lse = attention_tiled(q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16, return_lse=True)
        assert torch.isfinite(out).all() and rel_l2(out, ref) < 3e-3
        want = lse_exact(q, k, scale)
        assert ((lse - want).abs() / want.abs().clamp(min=1.0)).max().item() < 1e-6


def test_fp16_model_rejects_other_p_dtypes_and_inexact_inputs():
    q = torch.zeros(1, 1, 2, 128)
    with pytest.raises(ValueError, match="p_dtype"):
        attention_tiled(q, q, q, kernel_fp32=True, p_dtype=torch.float32)
    with pytest.raises(ValueError, match="not exact"):
        far_offset_inputs(1, 2, 2, 40, 1.0, dtype=F16)
