"""GPU correctness of every rung against float64 attention (needs a Hopper GPU; skipped otherwise).

Each check draws fresh random inputs, poisons the output with NaN, guards the memory after it with a
sentinel, and compares with the float64 reference by relative L2 error (bf16 tolerance 1e-2; typical
~3e-3). Set ATTNCLIMB_ERRLOG=path to write every measured error to a JSON file.
"""

import json
import math
import os

import pytest
import torch

import attnclimb
from attnclimb import rungs
from attnclimb.reference import attention_exact, far_offset_inputs, far_offset_log2, rel_l2
from attnclimb.runtime.launch import run_rung

pytestmark = pytest.mark.gpu
TOL = 1e-2
ERRORS = []
RUNG_IDS = [r.key for r in rungs.RUNGS]
_seed = [int.from_bytes(os.urandom(4), "little")]


@pytest.fixture(scope="session", autouse=True)
def _errlog():
    yield
    path = os.environ.get("ATTNCLIMB_ERRLOG")
    if path and ERRORS:
        with open(path, "w") as f:
            json.dump(ERRORS, f, indent=1)


def _gen():
    _seed[0] += 1
    return torch.Generator(device="cuda").manual_seed(_seed[0])


def _randn(*shape, g):
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32)


def make_inputs(b, h, sq, sk, kind="normal"):
    """Fresh bf16 q, k, v of a value distribution named by ``kind``."""
    g = _gen()
    d = rungs.HEAD_DIM
    q, k, v = _randn(b, h, sq, d, g=g), _randn(b, h, sk, d, g=g), _randn(b, h, sk, d, g=g)
    if kind == "logits_x30":
        q = q * 30.0
    elif kind == "near_constant":  # every key almost the same: near-uniform rows, sums of many equal terms
        k = 0.5 + 1e-3 * k
        q = q.abs() * 4
    elif kind == "dominant_key":  # each query row has one key that takes essentially all the mass
        idx = torch.randint(0, sk, (sq,), generator=g, device="cuda")
        q = q * 0.1
        q = q + 8.0 * k[:, :, idx, :] / k[:, :, idx, :].norm(dim=-1, keepdim=True) * math.sqrt(d)
    elif kind == "heavy_tail":  # outlier channels and Student-t-like tails, as in real activations
        t = _randn(b, h, sq, d, g=g) / (_randn(b, h, sq, d, g=g).abs() + 0.05)
        q = q + 0.1 * t.clamp(-200, 200)
        ch = torch.randint(0, d, (4,), generator=g, device="cuda")
        q[..., ch] *= 20
        k[..., ch] *= 20
        v = v * (1 + 10 * (torch.rand(v.shape, generator=g, device="cuda") < 0.01))
    return tuple(t.to(torch.bfloat16).contiguous() for t in (q, k, v))


def run_checked(rung, q, k, v, scale=None):
    """Run ``rung`` into a NaN-poisoned output with a sentinel guard after it; return (out, rel_l2)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    guard = 4096
    buf = torch.full((q.numel() + guard,), float("nan"), device="cuda", dtype=torch.bfloat16)
    buf[q.numel() :] = 1234.0
    out = buf[: q.numel()].view(q.shape)
    run_rung(rung, q, k, v, out, scale)
    torch.cuda.synchronize()
    assert (buf[q.numel() :] == 1234.0).all(), "kernel wrote past the end of O"
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements unwritten or NaN"
    assert torch.isfinite(out).all(), "output has inf"
    err = rel_l2(out, attention_exact(q, k, v, scale))
    return out, err


def _record(rung, shape, kind, err):
    ERRORS.append({"rung": rung.key, "shape": list(shape), "kind": kind, "rel_l2": err})


SHAPES = [
    (1, 2, 1, 1),
    (1, 2, 127, 127),
    (1, 2, 128, 128),
    (1, 2, 129, 129),
    (2, 3, 1000, 1000),
    (1, 2, 4096, 4096),
    (1, 2, 129, 1000),
    (1, 3, 1000, 129),
    (2, 2, 1, 4096),
    (1, 2, 300, 1),
    (1, 1, 64, 65),
    (1, 1, 200, 176),
    (1, 1, 177, 353),
    # More work tiles than SMs, so that each CTA of a persistent rung (10+) walks several: ragged tails,
    # one K/V tile per work tile, and a long row of them.
    (4, 40, 1000, 300),
    (3, 64, 129, 1),
    (1, 8, 8192, 257),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("key", RUNG_IDS)
def test_rung_matches_float64(key, shape):
    rung = rungs.BY_NUMBER[int(key[4:])]
    q, k, v = make_inputs(*shape)
    _, err = run_checked(rung, q, k, v)
    _record(rung, shape, "normal", err)
    assert err <= TOL, f"{key} {shape}: rel L2 {err:.3e}"


@pytest.mark.parametrize("kind", ["logits_x30", "near_constant", "dominant_key", "heavy_tail"])
@pytest.mark.parametrize("key", RUNG_IDS)
def test_rung_hostile_values(key, kind):
    rung = rungs.BY_NUMBER[int(key[4:])]
    shape = (1, 4, 513, 777)
    q, k, v = make_inputs(*shape, kind=kind)
    _, err = run_checked(rung, q, k, v)
    _record(rung, shape, kind, err)
    assert err <= TOL, f"{key} {kind}: rel L2 {err:.3e}"


@pytest.mark.parametrize("scale", [-0.2, 0.0, 1.0])
@pytest.mark.parametrize("key", RUNG_IDS)
def test_rung_any_finite_scale(key, scale):
    """Negative and zero scales take their own code paths in rungs 2+ (Q negated, scale clamped)."""
    rung = rungs.BY_NUMBER[int(key[4:])]
    shape = (1, 2, 200, 333)
    q, k, v = make_inputs(*shape)
    _, err = run_checked(rung, q, k, v, scale=scale)
    _record(rung, shape, f"scale={scale}", err)
    assert err <= TOL, f"{key} scale {scale}: rel L2 {err:.3e}"


def _sdpa_cudnn_error(q, k, v, scale, ref):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
    except RuntimeError:
        return None
    return rel_l2(out, ref)


# (name, log2 offset as a function of the scale, ties): issue 6's input (p = 11, |s| ~ 2.6e5); |max·c| near
# 2^26 (the largest rounding residual e of the reference that still meets a soft row of these inputs);
# both sides of softmax.cuh's switch to a power-of-two multiplier (|max·c| < 2^29 keeps c, >= 2^30 never
# does); far beyond it (ties and near-one-hot rows); scores at the fp32 limit (max·c overflows fp32 for
# scale 1); and rows of equal scores.
OFFSET_CASES = {
    "issue6": (lambda sc: 11, False),
    "soft_large_residual": (lambda sc: far_offset_log2(sc, 26), False),
    "below_hard_bound": (lambda sc: far_offset_log2(sc, 29), False),
    "above_hard_bound": (lambda sc: far_offset_log2(sc, 30) + 1, False),
    "huge": (lambda sc: 60, False),
    "fp32_limit": (lambda sc: 121, False),
    "ties": (lambda sc: 40, True),
    "ties_soft": (lambda sc: 11, True),
}


@pytest.mark.parametrize("scale", [1.0, None], ids=["scale1", "default_scale"])
@pytest.mark.parametrize("seqlen_k", [4096, 16384])
@pytest.mark.parametrize("case", list(OFFSET_CASES))
@pytest.mark.parametrize("key", RUNG_IDS)
def test_rung_far_offset_logits(key, case, seqlen_k, scale):
    """Issue 6: every logit of a row far from zero (head 0 positive, head 1 negative), exact in fp32.
    Within the bf16 tolerance and no worse than cuDNN on the same input (when cuDNN gives a finite
    answer), whatever the magnitude."""
    rung = rungs.BY_NUMBER[int(key[4:])]
    sc = 1.0 / math.sqrt(rungs.HEAD_DIM) if scale is None else scale
    offset, ties = OFFSET_CASES[case]
    q, k, v = far_offset_inputs(1, 64, seqlen_k, offset(sc), sc, ties=ties, generator=_gen(), device="cuda")
    q, k, v = (t.contiguous() for t in (q, k, v))
    _, err = run_checked(rung, q, k, v, scale=sc)
    ref_cudnn = _sdpa_cudnn_error(q, k, v, sc, attention_exact(q, k, v, sc))
    ERRORS.append(
        {
            "rung": rung.key,
            "shape": [1, 2, 64, seqlen_k],
            "kind": f"offset:{case}:scale={sc:.4g}",
            "rel_l2": err,
            "cudnn_rel_l2": ref_cudnn,
        }
    )
    assert err <= TOL, f"{key} {case} sk={seqlen_k} scale={sc}: rel L2 {err:.3e} (cuDNN {ref_cudnn})"
    if ref_cudnn is not None and math.isfinite(ref_cudnn):
        assert err <= 1.25 * ref_cudnn + 1e-3, f"{key} {case}: rel L2 {err:.3e} vs cuDNN {ref_cudnn:.3e}"


@pytest.mark.parametrize("key", RUNG_IDS)
def test_rung_large_v_near_the_soft_bound(key):
    """A row whose max·c lies 32 above its nearest fp32 (|max·c| just under 2^30, still scaled by c): with
    the reference rounded to nearest, P at the max would be 2^32 and O = sum P·V overflow for V = 1.6e30;
    rounded up, every P <= 1 and O = V, as in the exact softmax (tests/test_reference_cpu.py has the CPU
    model of the same input)."""
    rung = rungs.BY_NUMBER[int(key[4:])]
    d = rungs.HEAD_DIM
    q = torch.zeros(1, 1, 3, d, device="cuda")
    k = torch.zeros(1, 1, 300, d, device="cuda")
    q[..., 0], k[..., 0] = 1.9921875 * 2**10, 1.0  # every score 2040, exactly
    v = 1.6e30 * (1 + 0.1 * _randn(1, 1, 300, d, g=_gen()))
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    _, err = run_checked(rung, q, k, v, scale=362452.233)
    assert err <= TOL


@pytest.mark.parametrize("key", RUNG_IDS)
def test_rung_many_programs(key):
    """batch*heads*m_blocks > 65535 CTAs: the grid must not be limited to gridDim.y/z."""
    rung = rungs.BY_NUMBER[int(key[4:])]
    shape = (33000, 2, 3, 5)
    q, k, v = make_inputs(*shape)
    _, err = run_checked(rung, q, k, v)
    _record(rung, shape, "normal", err)
    assert err <= TOL


@pytest.mark.parametrize("key", RUNG_IDS)
def test_rung_repeatable(key):
    """The same inputs give bit-identical outputs twice (a moving result would be a race)."""
    rung = rungs.BY_NUMBER[int(key[4:])]
    q, k, v = make_inputs(2, 2, 333, 1025)
    a, _ = run_checked(rung, q, k, v)
    b, _ = run_checked(rung, q, k, v)
    assert torch.equal(a, b)


def test_api_matches_sdpa_and_defaults():
    q, k, v = make_inputs(2, 4, 257, 300)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    out = attnclimb.attention(q, k, v)
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert rel_l2(out, ref) < TOL
    out2 = attnclimb.attention(q, k, v, scale=0.05, rung=rungs.TOP.number)
    assert rel_l2(out2, attention_exact(q, k, v, 0.05)) < TOL


def test_api_accepts_non_contiguous_inputs():
    q, k, v = make_inputs(1, 4, 200, 150)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, D) memory, (B, H, S, D) view
    assert not qt.is_contiguous()
    assert rel_l2(attnclimb.attention(qt, k, v), attention_exact(q, k, v)) < TOL


def test_api_misaligned_views_and_side_stream():
    """Inputs at an odd storage offset (not 16-byte aligned) and a non-default current stream."""
    q, k, v = make_inputs(1, 2, 130, 70)
    views = []
    for t in (q, k, v):
        buf = torch.empty(t.numel() + 1, device="cuda", dtype=torch.bfloat16)
        view = buf[1:].view(t.shape)
        view.copy_(t)
        assert view.data_ptr() % 16 != 0
        views.append(view)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = attnclimb.attention(*views)
    side.synchronize()
    assert rel_l2(out, attention_exact(q, k, v)) < TOL


def test_tensor_map_cache_hits_and_stays_correct():
    from attnclimb.runtime.launch import cached_tensor_map

    q, k, v = make_inputs(1, 2, 300, 300)
    a = cached_tensor_map(q.view(2, 300, 128), 128)
    assert cached_tensor_map(q.view(2, 300, 128), 128) is a
    assert cached_tensor_map(q.view(2, 300, 128), 64) is not a
    for _ in range(3):  # fresh tensors, possibly at recycled addresses: results stay right
        q, k, v = make_inputs(1, 2, 300, 300)
        assert rel_l2(attnclimb.attention(q, k, v), attention_exact(q, k, v)) < TOL


def test_api_refuses_unfused_when_s_does_not_fit():
    """Rung 0 materialises S one launch at a time (at most 2^31 fp32 elements, 8 GiB, per launch since
    issue 9's splitting): with less than that free, it refuses instead of running out of memory."""
    q = torch.empty(1, 1, 2**15, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(1, 1, 2**16, 128, device="cuda", dtype=torch.bfloat16)  # S: 2^31 elements, split in two
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    blocker = torch.empty(max(free - 6 * 2**30, 0), device="cuda", dtype=torch.uint8)  # leave ~6 GiB
    try:
        with pytest.raises(ValueError, match="rung 0"):
            attnclimb.attention(q, k, k, rung=0)
    finally:
        del blocker
        torch.cuda.empty_cache()
