"""Issue 8's features through the public API on a Hopper GPU (skipped otherwise): causal masking,
grouped-query attention and the log-sum-exp of the top rung in attnclimb.attention,
scaled_dot_product_attention (no fallback), the custom ops (opcheck), torch.compile, gradients, the
2^31 split of causal and GQA calls, and the diffusers backend's return_lse. The kernels' own variants
are tested by tests/test_gpu_features.py (run_rung against float64).

Run: python -m pytest -q -m gpu tests/test_features_api_gpu.py
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnclimb
from attnclimb import ops, rungs, sdpa
from attnclimb.reference import attention_exact, lse_exact, rel_l2

pytestmark = pytest.mark.gpu
TOL = 1e-2
GRAD_TOL = 2e-2
LSE_TOL = 1e-3  # fp32 LSE of O(10) values (scores of N(0,1) inputs scaled by 1/sqrt(128)), absolute
BF16 = torch.bfloat16
TOP = rungs.TOP.number


@pytest.fixture(autouse=True)
def _fresh_warnings():
    sdpa.reset_fallback_warnings()
    yield
    sdpa.reset_fallback_warnings()


def _qkv(b, h, hk, sq, sk, *, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, sq, 128, generator=g, device="cuda").to(BF16)
    k = torch.randn(b, hk, sk, 128, generator=g, device="cuda").to(BF16)
    v = torch.randn(b, hk, sk, 128, generator=g, device="cuda").to(BF16)
    return q, k, v


SHAPES = [  # (b, h, h_kv, sq, sk)
    (2, 4, 4, 257, 300),
    (1, 8, 2, 1000, 1000),
    (2, 8, 1, 129, 700),  # MQA, Sq < Sk
    (1, 4, 2, 700, 129),  # Sq > Sk: rows past Sk see every key
    (1, 2, 2, 1, 1000),  # Sq = 1: the row sees key 0 only (causal)
    (2, 32, 8, 2048, 2048),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_sdpa_runs_causal_and_gqa_on_the_kernel(shape, causal):
    _, h, hk, _, _ = shape
    q, k, v = _qkv(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)
        out = attnclimb.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hk != h, strict=True)
    assert out.shape == q.shape and out.dtype == BF16 and out.is_contiguous()
    err = rel_l2(out, attention_exact(q, k, v, causal=causal))
    assert err < TOL, f"rel L2 {err:.3e}"
    assert torch.equal(out, attnclimb.attention(q, k, v, is_causal=causal))  # the same kernel
    kw = {"enable_gqa": True} if hk != h else {}
    assert rel_l2(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw).float()) < TOL


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES[:5], ids=lambda s: "x".join(map(str, s)))
def test_attention_returns_the_lse(shape, causal):
    q, k, v = _qkv(*shape, seed=1)
    o, lse = attnclimb.attention(q, k, v, is_causal=causal, return_lse=True, scale=0.07)
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32 and lse.is_contiguous()
    assert rel_l2(o, attention_exact(q, k, v, 0.07, causal=causal)) < TOL
    err = (lse.double() - lse_exact(q, k, 0.07, causal=causal)).abs().max().item()
    assert err < LSE_TOL, f"LSE error {err:.3e}"
    o2, lse2 = sdpa.scaled_dot_product_attention_lse(
        q, k, v, is_causal=causal, scale=0.07, enable_gqa=True, strict=True
    )
    assert torch.equal(o2, o) and torch.equal(lse2, lse)


def test_lse_of_no_keys_is_minus_inf():
    q, k, v = _qkv(1, 2, 2, 5, 0)
    o, lse = attnclimb.attention(q, k, v, is_causal=True, return_lse=True)
    assert (o == 0).all() and (lse == -math.inf).all()


@pytest.mark.parametrize("number", [0, 5, 9])
def test_lower_rungs_refuse(number):
    q, k, v = _qkv(1, 4, 2, 64, 64)
    with pytest.raises(ValueError, match=f"rung {number}"):
        attnclimb.attention(q, q, q, rung=number, is_causal=True)
    with pytest.raises(ValueError, match="grouped-query"):
        attnclimb.attention(q, k, v, rung=number)
    with pytest.raises(ValueError, match="return_lse"):
        attnclimb.attention(q, q, q, rung=number, return_lse=True)


@pytest.mark.parametrize("grad", [False, True])
def test_opcheck_with_the_features(grad):
    q, k, v = _qkv(2, 6, 2, 130, 170, seed=2)
    k = k.transpose(1, 2).contiguous().transpose(1, 2)  # a strided input too
    if grad:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.attnclimb.attention_fwd.default, (q, k, v, 0.1, TOP, True))
    torch.library.opcheck(torch.ops.attnclimb.attention_fwd_lse.default, (q, k, v, 0.1, TOP, True))
    torch.library.opcheck(torch.ops.attnclimb.attention_fwd_lse.default, (q, k, v, 0.1, TOP, False))


def test_compile_fullgraph_with_the_features():
    torch._dynamo.reset()
    q, k, v = _qkv(2, 8, 2, 300, 300, seed=3)

    def f(q, k, v):
        o = attnclimb.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, strict=True)
        o2, lse = attnclimb.attention(q, k, v, is_causal=True, return_lse=True)
        return o * 2, o2, lse

    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def _grads(fn, inputs, w):
    out = fn(*inputs)
    return torch.autograd.grad((out.float() * w).sum(), inputs)


@pytest.mark.parametrize("shape", [(2, 8, 2, 257, 300), (1, 4, 4, 300, 257)], ids=str)
def test_causal_gqa_gradients_match_math_backend(shape):
    q, k, v = (t.requires_grad_() for t in _qkv(*shape, seed=4))
    w = torch.randn(*q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))

    def ours(a, b, c):
        return attnclimb.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True, strict=True)

    mine = _grads(ours, (q, k, v), w)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        ref = _grads(
            lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True),
            (q64, k64, v64),
            w.double(),
        )
    for name, a, b in zip("qkv", mine, ref):
        assert a.dtype == BF16 and a.shape == b.shape and torch.isfinite(a).all(), name
        assert rel_l2(a, b) < GRAD_TOL, f"d{name}: {rel_l2(a, b):.3e}"
    o, lse = attnclimb.attention(q, k, v, is_causal=True, return_lse=True)
    assert o.requires_grad and not lse.requires_grad  # the LSE carries no gradient


@pytest.mark.parametrize(
    "shape,causal",
    [
        ((3, 8, 2, 600, 500), True),  # batch entries per launch
        ((1, 16, 4, 2000, 300), True),  # whole K/V groups per launch
        ((1, 8, 1, 2000, 300), True),  # MQA: parts of the one group per launch
        ((1, 2, 1, 9000, 300), False),  # query rows per launch (not causal)
    ],
    ids=["batch", "groups", "part_of_group", "rows"],
)
def test_split_launches_equal_one_launch(monkeypatch, shape, causal):
    """The 2^31 planner's splits of GQA and causal calls, with the limit lowered to 2^20 elements: the
    launches together write what one launch writes (O and the LSE). Each row's arithmetic does not depend
    on the launch it is in, but a launch may run another variant (one query head per K/V head: not GQA), so
    the check allows a last-bit difference; a wrong K/V head or diagonal would be off by O(1)."""
    q, k, v = _qkv(*shape, seed=6)
    whole = ops.forward(q, k, v, 0.09, TOP, causal, with_lse=True)
    launches = []
    real = ops._launch.run_rung
    monkeypatch.setattr(ops._launch, "run_rung", lambda *a, **kw: launches.append(1) or real(*a, **kw))
    monkeypatch.setattr(ops, "INT32_LIMIT", 2**20)
    monkeypatch.setattr(ops, "_FAST", {})  # the first call's remembered launch would skip the planner
    split = ops.forward(q, k, v, 0.09, TOP, causal, with_lse=True)
    torch.cuda.synchronize()
    assert len(launches) > 1
    assert rel_l2(split[0], whole[0].float()) < 1e-4
    assert (split[1] - whole[1]).abs().max().item() < 1e-4


def test_causal_gqa_call_over_2_to_the_31_elements():
    """A real 2^31+ causal GQA call: one batch entry's Q holds 160 x 2^17 x 128 > 2^31 elements, split into
    launches of whole K/V groups (never over query rows)."""
    torch.cuda.empty_cache()
    q, k, v = _qkv(1, 160, 40, 2**17, 256, seed=7)
    assert q.numel() >= 2**31
    out = attnclimb.attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    for j in (0, 76, 156):  # heads of the first, a middle and the last launch; the last rows and the first
        qs, kvs = (slice(0, 1), slice(j, j + 4)), (slice(0, 1), slice(j // 4, j // 4 + 1))
        for rows in (slice(0, 2048), slice(2**17 - 2048, 2**17)):
            ref = F.scaled_dot_product_attention(q[qs], k[kvs], v[kvs], is_causal=True, enable_gqa=True)
            assert rel_l2(out[qs][:, :, rows], ref[:, :, rows]) < TOL
    del q, k, v, out
    torch.cuda.empty_cache()


def test_diffusers_backend_causal_gqa_and_lse_on_the_kernel():
    pytest.importorskip("diffusers")
    ad = pytest.importorskip("diffusers.models.attention_dispatch")
    attnclimb.register_diffusers_backend(strict=True)  # a fallback would raise
    try:
        fn = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName("attnclimb")]
        q, k, v = (t.transpose(1, 2) for t in _qkv(2, 8, 2, 300, 300, seed=8))  # BSHD views
        out, lse = fn(q, k, v, is_causal=True, enable_gqa=True, return_lse=True)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        assert out.shape == q.shape and lse.shape == q.shape[:3]
        assert rel_l2(out.transpose(1, 2), attention_exact(qt, kt, vt, causal=True)) < TOL
        err = (lse.transpose(1, 2).double() - lse_exact(qt, kt, causal=True)).abs().max().item()
        assert err < LSE_TOL
        via = ad.dispatch_attention_fn(
            q, k, v, is_causal=True, enable_gqa=True, backend=ad.AttentionBackendName("attnclimb")
        )
        assert torch.equal(via, out)
    finally:
        attnclimb.register_diffusers_backend()
