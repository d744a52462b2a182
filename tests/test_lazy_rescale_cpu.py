"""Rung 12's lazy rescale on the CPU: the float32 model of its softmax (``attention_tiled(kernel_fp32=True,
rescale_threshold=8.0)``, ``attnclimb/reference.py``) against float64, at the edges of the rule, and the
kernels' constant against the model's (rungs 12-16 carry the rule).

The rule (``12_lazy_rescale.cu``): a row keeps its reference (its running max m) while the new max's P
against it, ``2^((m_new − m)·c + err)``, is at most ``2^RESCALE_THRESHOLD``; only then is alpha exactly 1
and the O rescale skipped. Rung 12 rounds each quad thread's column-max P in l (``round_top_p="thread"``); the
tile-max model (``round_top_p=True``) and the one without any rounding in l are old rung 14's (the lazy rescale
alone, measured before the re-cut merged it with the kept-reference path), kept as models to compare with.
"""

import math
import re

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attnclimb import reference as _reference
from attnclimb import rungs
from attnclimb.reference import (
    LOG2E,
    RESCALE_THRESHOLD,
    attention_exact,
    attention_tiled,
    far_offset_inputs,
    lazy_max_fp32,
    lse_exact,
    rel_l2,
)

TAU = RESCALE_THRESHOLD
F16 = torch.float16


LAZY_NUMBERS = range(12, rungs.TOP.number + 1)  # the lazy rescale's rung (12) and every rung above it


@pytest.mark.parametrize("number", LAZY_NUMBERS)
def test_kernel_threshold_is_the_models(number):
    """The kernels' RESCALE_THRESHOLD is the model's (reference.RESCALE_THRESHOLD, 8) on rung 12 and every rung
    above it, and rung 11 (the rung below the lazy rescale) has none."""
    src = rungs.get(number).source.read_text()
    m = re.search(r"#define RESCALE_THRESHOLD ([0-9.]+)f", src)
    assert m and float(m[1]) == TAU == 8.0
    assert "RESCALE_THRESHOLD" not in rungs.get(11).source.read_text()


def _rising_tiles(step_log2, tiles=8, block_n=128, seqlen_q=16, seed=0):
    """Scores that rise tile by tile by ``step_log2`` in units of c (scale 1, so c = log2 e): Q = e_0, K's
    column 0 holds the score, every key of tile t scores t·δ minus a small spread (bf16 values), V random.
    Each row's max grows at every tile; with a step under the threshold a lazy row keeps its reference for a
    tile and its P reach about 2^step."""
    g = torch.Generator().manual_seed(seed)
    delta = step_log2 / LOG2E
    sk = tiles * block_n
    base = torch.arange(sk, dtype=torch.float64) // block_n * delta
    spread = torch.rand(sk, generator=g, dtype=torch.float64) * 0.25
    q = torch.zeros(1, 1, seqlen_q, 128, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, sk, 128, dtype=torch.float64)
    k[0, 0, :, 0] = base - spread
    v = torch.randn(1, 1, sk, 128, generator=g, dtype=torch.float64)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def _lazy_tiles(q, k, tau, block_n, scale=1.0):
    """The lazy model's walk over the K/V tiles of q·kᵀ (fp32 scores of float64 products; a negative ``scale``
    negates them, as the kernels do): per tile (its scores, the row max before it, the new one, mul, −R)."""
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)).float()
    if scale < 0:
        s = -s
    c = torch.tensor(abs(scale) * LOG2E, dtype=torch.float32)
    m = torch.full(s.shape[:-1] + (1,), _reference.ROW_MAX_INIT)
    err = torch.zeros_like(m)
    for n0 in range(0, s.shape[-1], block_n):
        t = s[..., n0 : n0 + block_n]
        m_new = lazy_max_fp32(m, err, torch.maximum(m, t.amax(-1, keepdim=True)), c, tau)  # the model's rule
        _, mul, neg_ref, err = _reference.online_rescale_fp32(m, err, m_new, c)
        yield t, m, m_new, mul, neg_ref
        m = m_new


def _largest_p(q, k, tau, block_n=128):
    """The largest P the lazy model forms on these inputs (log2), i.e. how far a kept reference lags."""
    worst = -math.inf
    for t, _, _, mul, neg_ref in _lazy_tiles(q, k, tau, block_n):
        worst = max(worst, _reference._fma32(t, mul.expand_as(t), neg_ref.expand_as(t)).max().item())
    return worst


def _long_kv_failing_inputs(case, sk, dtype):
    """Inputs on which the kept-reference vote of the long-K/V tiles (80 keys) fails after the first K/V tile, so
    that their warps take the full path (quad max, lazy test, new reference) on later tiles (the GPU test
    tests/test_long_kv_gpu.py::test_long_kv_failed_votes_match_float64; ``test_long_kv_inputs_move_references``
    checks the premise in the model):
    - ``rising``: scores rising by 16 in log2 units every 80-key tile (every tile fails), one head;
    - ``scale1``: randn at scale 1, four heads (references still move on early tiles: about 2 % of the row-tiles
      in the model, each failing its warp's vote);
    - ``overflow``: small scores, then one key 200 above them at key 3001, four heads (its P against the kept
      reference would be 2^288, past fp32's range).
    Returns (q, k, v, scale)."""
    g = torch.Generator().manual_seed(sk)
    if case == "rising":
        q, k, v = _rising_tiles(16.0, tiles=-(-sk // 80), block_n=80, seqlen_q=200)
        return q, k[..., :sk, :], v[..., :sk, :], 1.0
    q = torch.randn(1, 4, 200, 128, generator=g)
    k, v = torch.randn(1, 4, sk, 128, generator=g), torch.randn(1, 4, sk, 128, generator=g)
    if case == "scale1":
        return q.to(dtype), k.to(dtype), v.to(dtype), 1.0
    if case == "overflow":
        q[..., 0] = 1.0
        k = k * 0.01
        k[:, :, 3001, 0] = 200.0  # scores ~0 elsewhere (|q|·|k|·0.01), 200 at key 3001
        return q.to(dtype), k.to(dtype), v.to(dtype), 1.0
    raise ValueError(case)


def _moved_references(q, k, scale, block_n):
    """Per K/V tile after the first: how many rows' lazy references move in the fp32 model (the tiles where the
    kernel's vote fails for the warps of those rows)."""
    tiles = list(_lazy_tiles(q, k, TAU, block_n, scale))[1:]
    return [int((m_new != m).sum()) for _, m, m_new, _, _ in tiles]


@pytest.mark.skipif(rungs.TOP.long_kv is None, reason="the top rung has no long-K/V tiles")
@pytest.mark.parametrize("case", ["rising", "scale1", "overflow"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_kv_inputs_move_references(case, dtype):
    """The GPU test of the long-K/V full path is only one if its inputs fail the vote: in the lazy model (the
    first 32 rows, the long-K/V tiles' BLOCK_N), ``rising`` moves every row's reference on every tile,
    ``scale1`` on at least 1 % of the row-tiles, ``overflow`` each row's exactly once, at key 3001's tile."""
    bound, tiles = rungs.TOP.long_kv
    q, k, _, scale = _long_kv_failing_inputs(case, bound + 1001, dtype)
    q = q.to(dtype)[..., :32, :]
    moved = _moved_references(q, k.to(dtype), scale, tiles["block_n"])
    rows = q.shape[1] * q.shape[2]
    if case == "rising":
        assert moved == [rows] * len(moved)
    elif case == "scale1":
        assert sum(moved) >= 0.01 * rows * len(moved), moved
    else:
        assert sum(moved) == rows and moved[3001 // tiles["block_n"] - 1] == rows, moved


@pytest.mark.parametrize("step", [7.9, 4.0, 8.5, 16.0])
def test_lazy_model_rising_max(step):
    """The running max rises every tile. A step under the threshold keeps the reference on every other tile,
    so P reach ~2^step (checked: the path is taken); over it, every tile rescales (P <= 1). Either way O and
    the LSE are those of float64 within bf16's tolerance, and the lazy output differs from the eager one
    only by rounding."""
    q, k, v = _rising_tiles(step)
    worst = _largest_p(q, k, TAU)
    assert worst <= TAU
    assert worst > step - 0.5 if step <= TAU else worst <= 0.0
    ref = attention_exact(q, k, v, 1.0)
    out, lse = attention_tiled(q, k, v, 1.0, block_n=128, kernel_fp32=True, rescale_threshold=TAU, return_lse=True)
    eager, eager_lse = attention_tiled(q, k, v, 1.0, block_n=128, kernel_fp32=True, return_lse=True)
    assert rel_l2(out, ref) < 5e-3 and rel_l2(out, eager) < 5e-3
    want = lse_exact(q, k, 1.0)
    assert ((lse - want).abs() / want.abs().clamp(min=1.0)).max().item() < 1e-6
    assert ((lse - eager_lse).abs() / want.abs().clamp(min=1.0)).max().item() < 1e-6


def test_lazy_model_threshold_bounds_p():
    """What the threshold is for: without a bound a kept reference lets P grow with the max. Scores rising by
    2^126 per tile with a threshold of 200 keep a reference for a tile whose 128 P near 2^126 sum past fp32's
    range (l = inf, a NaN output); 8 keeps every P <= 2^8."""
    q, k, v = _rising_tiles(126.0, tiles=3)
    assert torch.isfinite(attention_tiled(q, k, v, 1.0, block_n=128, kernel_fp32=True, rescale_threshold=TAU)).all()
    loose = attention_tiled(q, k, v, 1.0, block_n=128, kernel_fp32=True, rescale_threshold=200.0)
    assert not torch.isfinite(loose).all()


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(0, 121),
    scale=st.sampled_from([1.0, 1 / math.sqrt(128), 0.3, 7.5, 1e-30, 0.0]),
    ties=st.booleans(),
    block_n=st.sampled_from([64, 80, 128]),
    seed=st.integers(0, 2**31 - 1),
)
@example(p=119, scale=7.5, ties=False, block_n=64, seed=0)  # every LSE overflows (scale·s past fp32)
def test_lazy_model_any_magnitude(p, scale, ties, block_n, seed):
    """Scores from 0 to the fp32 limit, both signs, soft and hard rows, ties, tiny scales and scale 0 (raised
    to FLT_MIN), on the rungs' K/V tiles (64 keys at head_dim 256, 80 in the long-K/V tiles, 128): rung 12's model
    (lazy rule, each thread's column-max P rounded in l) is as exact as the eager one, and its LSE agrees with
    the eager model's."""
    q, k, v = far_offset_inputs(1, 4, 600, p, scale, ties=ties, generator=torch.Generator().manual_seed(seed))
    out, lse = attention_tiled(
        q, k, v, scale, block_n=block_n, kernel_fp32=True, rescale_threshold=TAU, round_top_p="thread", return_lse=True
    )
    _, eager_lse = attention_tiled(q, k, v, scale, block_n=block_n, kernel_fp32=True, return_lse=True)
    assert torch.isfinite(out).all()
    assert rel_l2(out, attention_exact(q, k, v, scale)) < 6e-3
    fin = torch.isfinite(eager_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert torch.equal(lse[~fin], eager_lse[~fin])  # both overflow alike (scale·s past fp32: LSE = ±inf)
    if fin.any():
        assert ((lse - eager_lse)[fin].abs() / eager_lse[fin].abs().clamp(min=1.0)).max().item() < 1e-6


@pytest.mark.parametrize("log2_mc", [25, 27, 29])
def test_lazy_fp16_model_rising_keys(log2_mc):
    """The FP16 variant's shift k with the lazy rule (rungs 12-16 carry both): keys in rising order near
    2^log2_mc, 128-key tiles; no zero row, O within fp16's tolerance, LSE within 0.75 fp32 ulp, as for the
    eager model (tests/test_reference_cpu.py)."""
    from test_reference_cpu import _fp16_rising_inputs

    q, k, v, scale = _fp16_rising_inputs(log2_mc)
    ref = attention_exact(q, k, v, scale)
    out, lse = attention_tiled(
        q, k, v, scale, block_n=128, kernel_fp32=True, p_dtype=F16, return_lse=True, rescale_threshold=TAU
    )
    assert rel_l2(out, ref) < 1e-3
    assert bool((out.double().abs().amax(-1) > 0).all())
    want = lse_exact(q, k, scale)
    ulp = torch.exp2(torch.floor(torch.log2(want.abs())) - 23)
    assert ((lse - want).abs() / ulp).max().item() < 0.75


def test_rescale_threshold_needs_the_kernel_model():
    q = torch.zeros(1, 1, 4, 128)
    with pytest.raises(ValueError, match="kernel_fp32"):
        attention_tiled(q, q, q, 1.0, rescale_threshold=TAU)


@pytest.mark.parametrize("step", [0.3, 2.7, 5.3, 7.9])
def test_lazy_model_dominant_key_rounding(step):
    """Where the lazy rescale without the l fix (old rung 14 as first landed) is less exact than the eager
    rescale (rung 11; found in review): a row dominated by one key whose
    score rose by ``step`` (log2 units) over a kept reference has P = 2^step for it, which bf16 rounds (up to
    2^-8 relative), while l sums the unrounded P; rung 11 would have moved the reference and given that key
    P = 1, exact in bf16. The cost is bounded by bf16's unit roundoff, and after O's own rounding to bf16 (what
    the kernel writes) it is under twice rung 11's error on the same rows and under 2^-8. The test pins both
    facts: the eager model is more exact here, and the lazy one stays within those bounds."""
    q, k, v = _two_keys(step, rising=True)  # the first max in tile 0, the dominant key step above it in tile 1
    ref = attention_exact(q, k, v, 1.0)
    lazy = attention_tiled(q, k, v, 1.0, block_n=128, kernel_fp32=True, rescale_threshold=TAU)
    eager = attention_tiled(q, k, v, 1.0, block_n=128, kernel_fp32=True)
    assert rel_l2(eager, ref) < 1e-6 < rel_l2(lazy, ref) < 2**-8
    assert rel_l2(eager.bfloat16(), ref) < rel_l2(lazy.bfloat16(), ref) < min(2 * rel_l2(eager.bfloat16(), ref), 2**-8)


def test_lazy_max_edges():
    """The rule itself at its edges: with err = 0 a scale of 0 (raised to FLT_MIN) would keep even the initial
    −FLT_MAX "max" (c·FLT_MAX ≈ 5.8), 1e-30 would not; rung 12 starts err at +inf, which keeps nothing; an
    infinite new max or one 2^32 units above is never kept; hard rows (|m·c| >= 2^29: neighbouring fp32 maxima
    >= 32 units of s·c apart) never keep theirs."""
    f32 = torch.float32
    init = torch.tensor([[_reference.ROW_MAX_INIT]])
    zero, start = torch.zeros(1, 1), torch.full((1, 1), math.inf)
    for scale, kept in ((torch.finfo(f32).tiny, True), (1e-30, False)):
        c = torch.tensor(scale * LOG2E, dtype=f32)
        assert bool(lazy_max_fp32(init, zero, torch.full((1, 1), 3.0), c, TAU) == init) is kept
        assert lazy_max_fp32(init, start, torch.full((1, 1), 3.0), c, TAU).item() == 3.0
    c = torch.tensor(LOG2E, dtype=f32)
    for m_new in (math.inf, 2.0**32):
        assert lazy_max_fp32(zero, zero, torch.full((1, 1), m_new), c, TAU).item() == m_new
    m = torch.tensor([[2.0**29]], dtype=f32)
    up = torch.nextafter(m, torch.full_like(m, math.inf))
    _, _, _, err = _reference.online_rescale_fp32(m, zero, m, c)
    assert lazy_max_fp32(m, err, up, c, TAU).item() == up.item()  # one fp32 step up: not kept


@pytest.mark.parametrize("scale", [0.0, 1e-39])
def test_lazy_model_scale_zero_is_the_eager_one(scale):
    """Scale 0 (FLT_MIN) and a subnormal scale: the first tile takes its own max (err starts at +inf), every P
    is 1 and the lazy model equals the eager one bit for bit; keeping the initial −FLT_MAX reference (err
    starting at 0, old rung 14 before the fix) gives every P the same rounded 2^5.77, a common error of ~1e-3."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 128, generator=g).bfloat16() for _ in range(3))
    kw = {"block_n": 128, "kernel_fp32": True}
    lazy = attention_tiled(q, k, v, scale, rescale_threshold=TAU, round_top_p="thread", **kw)
    assert torch.equal(lazy, attention_tiled(q, k, v, scale, **kw))
    mean = v.double().mean(dim=2, keepdim=True).expand_as(lazy)
    assert rel_l2(lazy, mean) < 1e-5


def _two_keys(step, rising, seed=1):
    """Rows of two keys that matter, ``step`` apart (log2 units), in tiles 0 and 1 of 128 keys: the larger
    one second (``rising``, the lazy rule keeps the first as the reference) or first."""
    g = torch.Generator().manual_seed(seed)
    q = torch.zeros(1, 1, 16, 128, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 256, 128, dtype=torch.float64)
    k[..., 0] = -40.0
    hi = round(step / LOG2E * 64) / 64
    k[0, 0, 0, 0], k[0, 0, 135, 0] = (0.0, hi) if rising else (hi, 0.0)
    v = torch.randn(1, 1, 256, 128, generator=g, dtype=torch.float64)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


@pytest.mark.parametrize("step", [0.3, 2.7, 5.3, 7.9])
def test_round_top_p_restores_the_eager_exactness(step):
    """Old rung 14's l fix (round_top_p in the model; old rung 14 as first landed was make_variants.py's nolfix
    at 8cedb83): l counts each tile max's P rounded, as P·V does. On rows whose dominant key rose over a kept
    reference (without the fix: 0.7-1.9e-3) the error falls to the bf16 rounding of the weight of the key that
    does not dominate, as in the eager rescale (rung 11) when the same keys come in falling order: with one key
    dominating (steps 5.3, 7.9) below a tenth of the lazy error (measured 7.5e-5 and 4.5e-6), with two
    comparable keys (0.3, 2.7) below 2^-8 / 4 (5.8e-4, 3.3e-4). On random inputs it changes nothing beyond 1 %."""
    ref_of = {}
    for rising in (True, False):
        q, k, v = _two_keys(step, rising)
        ref_of[rising] = (q, k, v, attention_exact(q, k, v, 1.0))
    q, k, v, ref = ref_of[True]
    kw = {"block_n": 128, "kernel_fp32": True, "rescale_threshold": TAU}
    lazy = rel_l2(attention_tiled(q, k, v, 1.0, **kw), ref)
    fixed = rel_l2(attention_tiled(q, k, v, 1.0, round_top_p=True, **kw), ref)
    qf, kf, vf, reff = ref_of[False]
    eager_falling = rel_l2(attention_tiled(qf, kf, vf, 1.0, block_n=128, kernel_fp32=True), reff)
    assert lazy > 5e-4 and fixed <= lazy and fixed < 2**-8 / 4  # bf16 rounding of a weight w: <= 2^-8·w(1−w)
    if step >= 5:  # one key dominates (w -> 1): its rounding cancels in O / l, as in rung 11
        assert fixed < lazy / 10 and fixed < 10 * eager_falling + 1e-5
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 4, n, 128, generator=g).bfloat16() for n in (128, 2048, 2048))
    ref = attention_exact(q, k, v, 1 / math.sqrt(128))
    base = rel_l2(attention_tiled(q, k, v, 1 / math.sqrt(128), **kw), ref)
    fix = rel_l2(attention_tiled(q, k, v, 1 / math.sqrt(128), round_top_p=True, **kw), ref)
    assert abs(fix - base) < 0.01 * base
    # the LSE takes the sum without the fix's roundings (the kernel's l_fix): equal with and without it
    q, k, v = _two_keys(step, rising=True)
    lse_fix = attention_tiled(q, k, v, 1.0, round_top_p=True, return_lse=True, **kw)[1]
    assert torch.equal(lse_fix, attention_tiled(q, k, v, 1.0, return_lse=True, **kw)[1])


def _tied_keys(step, ties, seed=1):
    """_two_keys(step, rising=True) with the dominant key repeated ``ties`` times (keys 135..135+ties−1)."""
    q, k, v = _two_keys(step, rising=True, seed=seed)
    k = k.clone()
    k[0, 0, 136 : 135 + ties] = k[0, 0, 135]
    return q, k, v


@pytest.mark.parametrize("step", [5.3, 7.9])
@pytest.mark.parametrize("ties", [2, 4, 8])
def test_tied_maxima_need_every_p_rounded(step, ties):
    """Found in review: the l fix rounds one P per row and tile, so ``ties`` equal keys risen over a kept
    reference keep (ties − 1)/ties of the lazy rounding (measured 3.5e-4 to 1.7e-3, where the eager model has
    < 1e-6). Summing every P rounded (``round_all_p``, old rung 14's ``lround`` variant) gives one set of weights to
    P·V and l: under 1e-4, a tenth of the l fix's error at least. The LSE is unchanged by either."""
    q, k, v = _tied_keys(step, ties)
    ref = attention_exact(q, k, v, 1.0)
    kw = {"block_n": 128, "kernel_fp32": True, "rescale_threshold": TAU}
    top_fix = rel_l2(attention_tiled(q, k, v, 1.0, round_top_p=True, **kw), ref)
    all_fix, lse = attention_tiled(q, k, v, 1.0, round_all_p=True, return_lse=True, **kw)
    assert top_fix > 3e-4 and rel_l2(all_fix, ref) < min(1e-4, top_fix / 10)
    assert torch.equal(lse, attention_tiled(q, k, v, 1.0, return_lse=True, **kw)[1])


def _kept_rows(scale, shift, seed=5, n=20000):
    """Rows that just took a new reference (rung 12's slow path): their float32 max m, err (``shift``: the fp16
    variant's err − k) and c, with |m·c| spread over 2^-10 .. 2^31 (soft rows and hard ones), both signs."""
    g = torch.Generator().manual_seed(seed)
    c = torch.tensor(scale * LOG2E, dtype=torch.float32)
    mc = torch.exp2(torch.rand(n, 1, generator=g, dtype=torch.float64) * 41 - 10)
    sign = torch.where(torch.rand(n, 1, generator=g) < 0.5, -1.0, 1.0).double()
    m = (sign * mc / c.double()).float()
    init = torch.full_like(m, _reference.ROW_MAX_INIT)
    out = _reference.online_rescale_fp32(init, torch.full_like(m, math.inf), m, c, shift=shift)
    mul, err = out[1], out[-2 if shift else -1]
    return m, err, c, mul


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("scale", [1.0, 1 / math.sqrt(128), 1e-3])
def test_kept_limit_bounds_p(scale, shift):
    """Rung 12's fast path lets a score s through while s <= the row's limit (``kept_limit_fp32``, the kernel's
    fma.rm): the largest such score has P = 2^((s − m)·c + err) <= 2^(8 + 1e-5) in exact arithmetic, on soft rows
    of every magnitude (where one float32 step of s is up to 64 units of s·c) and in the fp16 variant; on hard
    rows the limit is m itself. The same limit rounded to nearest lets P reach 2^31 (bf16 rows, err down to −64;
    2^11.5 in the fp16 variant, whose err is above −1)."""
    m, err, c, mul = _kept_rows(scale, shift)
    limit = _reference.kept_limit_fp32(m, err, c)
    exponent = (limit.double() - m.double()) * c.double() + err.double()
    assert exponent.max().item() <= TAU + 1e-5
    hard = mul != c
    assert hard.any() and torch.equal(limit[hard], m[hard])
    # the next float32 score fails the fast path: the limit is not needlessly low on soft rows of moderate size
    soft = (~hard) & (m.double().abs() * c.double() < 2.0**20)
    nxt = torch.nextafter(limit, torch.full_like(limit, math.inf))
    assert (((nxt.double() - m.double()) * c.double() + err.double())[soft] > TAU - 1e-3).all()
    nearest = ((torch.tensor(TAU) - err).double() * (1 / c).double() + m.double()).float()
    assert ((nearest.double() - m.double()) * c.double() + err.double()).max().item() > TAU + (2 if shift else 16)


@pytest.mark.parametrize("number", LAZY_NUMBERS)
def test_kernel_rounds_the_limit_down(number):
    """Rungs 12-16 compute the limit as the model does: fma rounded down, on the slow path's new reference."""
    src = rungs.get(number).source.read_text()
    assert "row_limit[r] = __fmaf_rd(RESCALE_THRESHOLD - rs.err, inv_scale_log2, m_new);" in src
    assert "inv_scale_log2 = 1.f / scale_log2" in src
