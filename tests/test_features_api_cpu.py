"""Issue 8's features through the public API, without a GPU: causal masking, grouped-query attention and
the log-sum-exp of the top rung in attnclimb.attention, scaled_dot_product_attention and the custom ops
(support per rung, errors, op schemas and fakes, the backward with is_causal/enable_gqa, the LSE fallback),
and the 2^31 planner with GQA groups and causal calls. The kernels themselves are checked on the GPU
(tests/test_gpu_features.py, tests/test_dropin_gpu.py)."""

import contextlib
import itertools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import attnclimb
from attnclimb import ops, rungs, sdpa, support
from attnclimb.runtime.layout import plan_chunks

BF16 = torch.bfloat16
TOP = rungs.TOP.number


@pytest.fixture(autouse=True)
def _fresh_warnings():
    sdpa.reset_fallback_warnings()
    yield
    sdpa.reset_fallback_warnings()


@pytest.fixture
def hopper(monkeypatch):
    """Pretend cuda:0 is a Hopper GPU (for tracing with fake CUDA tensors; nothing launches)."""
    monkeypatch.setitem(support._DEVICE_REASONS, 0, None)


def _fake_cuda(*shapes, dtype=BF16):
    mode = FakeTensorMode()
    with mode:
        return mode, [torch.empty(*s, dtype=dtype, device="cuda") for s in shapes]


def _t(*shape, dtype=BF16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _reference(q, k, v, scale, causal):
    """float64 O and LSE of torch's SDPA semantics (top-left causal, GQA by repeat_interleave)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    s = q.double() @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


# ---------------------------------------------------------------- attnclimb.attention: errors per rung


@pytest.mark.parametrize("number", [0, 3, 8, 9])
def test_lower_rungs_refuse_the_features_clearly(number):
    """A rung without the variants raises ValueError naming the rung and the rung that has them (the feature
    check comes before the device check: CPU tensors get this error, not the device one)."""
    q, kv = _t(1, 4, 8, 128), _t(1, 2, 8, 128)
    name = rungs.BY_NUMBER[number].name
    who = "rungs " + ", ".join(str(r.number) for r in rungs.RUNGS if "causal" in r.features) + " have it"
    assert who.startswith("rungs 10, 11") and who.endswith(f"{TOP} have it")
    with pytest.raises(ValueError, match=rf"is_causal=True is not supported by rung {number} \({name}\).*{who}"):
        attnclimb.attention(q, q, q, rung=number, is_causal=True)
    with pytest.raises(
        ValueError, match=rf"grouped-query attention \(4 query heads, 2 key/value heads\).*rung {number}"
    ):
        attnclimb.attention(q, kv, kv, rung=number)
    with pytest.raises(ValueError, match=rf"return_lse=True .* rung {number}"):
        attnclimb.attention(q, q, q, rung=number, return_lse=True)
    with pytest.raises(ValueError, match="CUDA"):  # the plain call gets as far as the device check
        attnclimb.attention(q, q, q, rung=number)


@pytest.mark.parametrize("rung", [None, TOP])
def test_top_rung_takes_the_features(rung):
    """On the top rung causal, GQA (any divisor, MQA included) and the LSE pass the feature checks: CPU
    tensors get as far as the device check."""
    q = _t(1, 8, 8, 128)
    for kv_heads in (8, 4, 2, 1):
        kv = _t(1, kv_heads, 5, 128)
        with pytest.raises(ValueError, match="CUDA"):
            attnclimb.attention(q, kv, kv, rung=rung, is_causal=True, return_lse=True)
    kv3 = _t(1, 3, 5, 128)  # not a divisor of 8
    with pytest.raises(ValueError, match="heads mismatch: q 8, k 3"):
        attnclimb.attention(q, kv3, kv3, rung=rung)
    with pytest.raises(ValueError, match="heads mismatch"):  # K and V must have the same heads
        attnclimb.attention(q, _t(1, 2, 5, 128), _t(1, 4, 5, 128), rung=rung)


@pytest.mark.parametrize("kw", [{"is_causal": 1}, {"is_causal": None}, {"return_lse": "yes"}])
def test_feature_flags_must_be_bools(kw):
    q = _t(1, 1, 4, 128)
    with pytest.raises(TypeError, match="must be a bool"):
        attnclimb.attention(q, q, q, **kw)


def test_attention_passes_the_flags_to_the_op(monkeypatch, hopper):
    """attention() -> ops.call with the default scale, the rung, is_causal and return_lse (a recorder in
    place of the kernels; fake CUDA tensors pass the device check)."""
    seen = []
    monkeypatch.setattr("attnclimb.api._call", lambda *a: seen.append(a) or "out")
    _, (q, kv) = _fake_cuda((2, 8, 16, 128), (2, 2, 16, 128))
    assert attnclimb.attention(q, kv, kv, is_causal=True, return_lse=True) == "out"
    assert attnclimb.attention(q, q, q, scale=0.5, rung=4) == "out"
    (a, b) = seen
    assert a[3:] == (1 / math.sqrt(128), TOP, True, True) and a[1] is kv
    assert b[3:] == (0.5, 4, False, False)


# ---------------------------------------------------------------- scaled_dot_product_attention


def test_sdpa_runs_causal_and_gqa_on_the_kernels(monkeypatch):
    """is_causal and enable_gqa no longer fall back: the call reaches the kernel path (ops.forward, here a
    CPU stand-in) with is_causal passed on, and gives torch's result."""
    monkeypatch.setattr(sdpa, "unsupported_reason", lambda *a, **k: None)  # CPU tensors stand in for CUDA ones
    seen = []

    def fake_forward(q, k, v, scale, rung, is_causal=False, with_lse=False):
        seen.append((rung, is_causal, with_lse, k.shape[1]))
        o, lse = _reference(q, k, v, scale, is_causal)
        return (o.to(q.dtype), lse.float()) if with_lse else o.to(q.dtype)

    monkeypatch.setattr(ops, "forward", fake_forward)
    q, kv = _t(2, 8, 9, 128, dtype=torch.float32), _t(2, 2, 9, 128, dtype=torch.float32, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)
        out = attnclimb.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        _, lse = sdpa.scaled_dot_product_attention_lse(q, kv, kv, is_causal=True, enable_gqa=True, scale=0.2)
    assert seen == [(TOP, True, False, 2), (TOP, True, True, 2)]
    ref = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, _reference(q, kv, kv, 0.2, True)[1].float())


@pytest.mark.parametrize(
    "kw",
    [
        {"is_causal": True},
        {"enable_gqa": True},
        {"is_causal": True, "enable_gqa": True},
        {"attn_mask": "bool"},
        {"attn_mask": "float"},
        {"is_causal": True, "scale": 0.3, "enable_gqa": True},
    ],
)
def test_lse_fallback_matches_torchs_lse(kw):
    """scaled_dot_product_attention_lse on the CPU (the fallback path): O is torch's SDPA, the LSE equals
    the one torch's fused CPU kernel returns (GQA expanded for it), with one warning."""
    kw = dict(kw)
    q, k, v = _t(2, 4, 7, 128, dtype=torch.float32), _t(2, 2, 9, 128, dtype=torch.float32, seed=1), None
    if not kw.get("enable_gqa"):
        k = _t(2, 4, 9, 128, dtype=torch.float32, seed=1)
    v = _t(*k.shape, dtype=torch.float32, seed=2)
    mask = None
    if kw.get("attn_mask") == "bool":
        mask = torch.rand(7, 9, generator=torch.Generator().manual_seed(3)) > 0.3
        mask[:, 0] = True
    elif kw.get("attn_mask") == "float":
        mask = torch.randn(2, 1, 7, 9, generator=torch.Generator().manual_seed(3))
    if mask is not None:
        kw["attn_mask"] = mask
    with pytest.warns(attnclimb.AttnclimbFallbackWarning, match="float32|attn_mask"):
        out, lse = sdpa.scaled_dot_product_attention_lse(q, k, v, **kw)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, **kw))
    assert lse.shape == (2, 4, 7) and lse.dtype == torch.float32 and not lse.requires_grad
    group = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if mask is not None and mask.dtype == torch.bool:  # this kernel takes an additive mask only
        mask = torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
    ref = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, ke, ve, is_causal=kw.get("is_causal", False), attn_mask=mask, scale=kw.get("scale")
    )[1]
    torch.testing.assert_close(lse, ref, atol=1e-5, rtol=1e-5)


def test_lse_strict_raises():
    q = _t(1, 1, 4, 128)
    with pytest.raises(attnclimb.KernelUnsupportedError, match="CUDA"):
        sdpa.scaled_dot_product_attention_lse(q, q, q, strict=True)


# ---------------------------------------------------------------- the custom ops


def test_export_traces_causal_gqa_lse_into_one_op(hopper):
    """Dynamo traces attention(is_causal, return_lse) on GQA inputs into one attention_fwd_lse call and
    sdpa(is_causal, enable_gqa) into one attention_fwd call, the flags as constants."""

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            o, lse = attnclimb.attention(q, k, v, is_causal=True, return_lse=True)
            o2 = attnclimb.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return o + o2, lse

    _, (q, kv) = _fake_cuda((2, 8, 7, 128), (2, 2, 9, 128))
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)
        ep = torch.export.export(M(), (q, kv, kv), strict=True)
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    lse_calls = [n for n in calls if n.target == torch.ops.attnclimb.attention_fwd_lse.default]
    o_calls = [n for n in calls if n.target == torch.ops.attnclimb.attention_fwd.default]
    assert len(lse_calls) == len(o_calls) == 1
    assert lse_calls[0].args[3:] == (1 / math.sqrt(128), TOP, True)
    assert o_calls[0].args[3:] == (1 / math.sqrt(128), TOP, True)
    assert not any("scaled_dot_product" in str(n.target) for n in calls)  # no fallback in the graph


# A CPU stand-in for the LSE op with the real autograd registration (ops._setup_context, ops._backward):
# the backward with is_causal/enable_gqa and the LSE's non-differentiability, checked without a GPU.
@torch.library.custom_op("attnclimb_test::attention_fwd_lse_cpu", mutates_args=(), device_types="cpu")
def _cpu_lse_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, rung: int, is_causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _reference(q, k, v, scale, is_causal)
    return o.to(q.dtype), lse.float()


@_cpu_lse_op.register_fake
def _(q, k, v, scale, rung, is_causal=False):
    return ops._attention_fwd_lse_fake(q, k, v, scale, rung, is_causal)


_cpu_lse_op.register_autograd(ops._backward, setup_context=ops._setup_context)


@torch.library.custom_op("attnclimb_test::attention_fwd_causal_cpu", mutates_args=(), device_types="cpu")
def _cpu_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, rung: int, is_causal: bool = False
) -> torch.Tensor:
    return _reference(q, k, v, scale, is_causal)[0].to(q.dtype)


@_cpu_op.register_fake
def _(q, k, v, scale, rung, is_causal=False):
    return ops._attention_fwd_fake(q, k, v, scale, rung, is_causal)


_cpu_op.register_autograd(ops._backward, setup_context=ops._setup_context)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_backward_recomputes_with_is_causal_and_enable_gqa(causal, kv_heads):
    """The backward's gradients are torch's SDPA's with the call's is_causal and enable_gqa (float64
    gradcheck of the stand-ins, and equality with F.scaled_dot_product_attention's gradients)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, 6, 8, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda a, b, c: _cpu_op(a, b, c, 0.7, TOP, causal), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: _cpu_lse_op(a, b, c, 0.7, TOP, causal)[0], (q, k, v))
    ours = torch.autograd.grad(_cpu_lse_op(q, k, v, 0.7, TOP, causal)[0].square().sum(), (q, k, v))
    kw = {"enable_gqa": True} if kv_heads != 4 else {}
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.7, is_causal=causal, **kw)
    theirs = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    if causal:  # the mask matters: the non-causal recompute would give other gradients
        plain = torch.autograd.grad(_cpu_op(q, k, v, 0.7, TOP, False).square().sum(), (q,))[0]
        assert not torch.allclose(plain, ours[0])


def test_lse_output_is_not_differentiable_and_opchecks():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 5, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 7, 8, generator=g, requires_grad=True) for _ in range(2))
    o, lse = _cpu_lse_op(q, k, v, 0.3, TOP, True)
    assert o.requires_grad and not lse.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        lse.sum().backward()
    (o.sum() + lse.sum()).backward()  # the LSE's part contributes nothing; O's gradients flow
    assert q.grad is not None and q.grad.abs().sum() > 0
    torch.library.opcheck(_cpu_lse_op, (q, k, v, 0.3, TOP, True))
    torch.library.opcheck(_cpu_op, (q, k, v, 0.3, TOP, True))


# ---------------------------------------------------------------- ops.forward: zero sizes, splits


def test_forward_zero_sizes_with_lse():
    q, k = _t(1, 2, 4, 128), _t(1, 2, 0, 128)
    o, lse = ops.forward(q, k, k, 0.1, TOP, True, with_lse=True)  # no keys: zeros and an LSE of -inf
    assert o.shape == (1, 2, 4, 128) and (o == 0).all()
    assert lse.shape == (1, 2, 4) and lse.dtype == torch.float32 and (lse == -math.inf).all()
    ref = torch.logsumexp(torch.empty(1, 2, 4, 0), -1)
    assert torch.equal(lse, ref)  # what torch says the LSE over no keys is
    o, lse = ops.forward(_t(0, 2, 4, 128), _t(0, 1, 5, 128), _t(0, 1, 5, 128), 0.1, TOP, with_lse=True)
    assert o.shape == (0, 2, 4, 128) and lse.shape == (0, 2, 4)


@pytest.mark.parametrize(
    "shape,causal,launches,rows_split",
    [
        ((3, 8, 2, 40, 30), False, 3, False),  # a batch entry (8 x 40 x 8 = 2560) per launch
        ((1, 16, 4, 40, 30), True, 2, False),  # one batch entry too big: 2 K/V groups (8 heads) per launch
        ((1, 16, 2, 40, 30), False, 2, False),  # 8 heads = one group per launch
        ((1, 4, 1, 120, 30), True, 2, False),  # a group's queries too big (3840): 3 of its heads, then 1
        ((1, 2, 1, 500, 30), False, 4, True),  # one head's queries too big (4000): rows, not causal
    ],
)
def test_forward_splits_gqa_and_causal_calls(monkeypatch, shape, causal, launches, rows_split):
    """ops.forward with the 2^31 limit lowered to 3000 elements and a CPU stand-in for the launch that
    computes what the kernel would on its views (GQA from the head counts, the causal diagonal at the
    launch's first row, the LSE into its slice): together the launches give the unsplit reference."""
    limit = 3000
    calls = []

    def fake_run_rung(r, q, k, v, o, scale, causal=False, lse=None):
        assert r.number == TOP and all(t.is_contiguous() for t in (q, k, v, o, lse))
        assert max(q.numel(), k.numel(), o.numel()) <= limit and q.shape[1] % k.shape[1] == 0
        calls.append((o.data_ptr(), q.shape[2]))
        ro, rl = _reference(q, k, v, scale, causal)
        o.copy_(ro)
        lse.copy_(rl)

    monkeypatch.setattr(ops._launch, "run_rung", fake_run_rung)
    monkeypatch.setattr(ops, "_device_guard", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(ops, "INT32_LIMIT", limit)
    b, h, hkv, sq, sk = shape
    q = _t(b, sq, h, 8).transpose(1, 2)  # a BSHD view: copied, then split
    k, v = _t(b, hkv, sk, 8, seed=1), _t(b, hkv, sk, 8, seed=2)
    out, lse = ops.forward(q, k, v, 0.3, TOP, causal, with_lse=True)
    ro, rl = _reference(q, k, v, 0.3, causal)
    assert len(calls) == launches and len({c[0] for c in calls}) == launches
    assert any(rows < sq for _, rows in calls) == rows_split
    torch.testing.assert_close(out, ro.to(BF16), atol=0, rtol=0)
    torch.testing.assert_close(lse, rl.float())


def test_forward_refuses_a_causal_row_split(monkeypatch):
    """Never a wrong answer: a causal call that would need a split over query rows raises (the support
    check refuses it first, see test_causal_size_reason_only_where_rows_would_split)."""
    monkeypatch.setattr(ops._launch, "run_rung", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr(ops, "_device_guard", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(ops, "INT32_LIMIT", 3000)
    q, k = _t(1, 2, 500, 8), _t(1, 1, 30, 8)
    with pytest.raises(ValueError, match="causal call cannot be split over query rows"):
        ops.forward(q, k, k, 0.3, TOP, True)


# ---------------------------------------------------------------- the planner: GQA groups, causal


def _check_gqa_plan(b, h, hkv, sq, sk, d, chunks, limit, causal):
    group = h // hkv
    for c in chunks:
        nb, nh, nr = (c.batch[1] - c.batch[0]), (c.heads[1] - c.heads[0]), (c.rows[1] - c.rows[0])
        kv = c.heads if c.kv_heads is None else c.kv_heads
        nkv = kv[1] - kv[0]
        assert nb >= 1 and nh >= 1 and nr >= 1 and nkv >= 1
        assert nb * nh * nr * d <= limit and nb * nkv * sk * d <= limit  # Q/O and K/V of the launch
        assert (c.kv_heads is None) == (group == 1)
        # the launch's own GQA mapping (its kv_group = nh // nkv) is the global one: local head i of the
        # chunk reads local K/V head i // (nh // nkv), which is global K/V head (heads[0] + i) // group
        assert nh % nkv == 0
        for i in range(nh):
            assert kv[0] + i // (nh // nkv) == (c.heads[0] + i) // group
        # contiguous slices of (B, H, S, D): heads whole or one batch entry; rows whole or one head
        assert c.heads == (0, h) or nb == 1
        assert c.rows == (0, sq) or (nb == 1 and nh == 1)
        assert not causal or c.rows == (0, sq)
    for i in range(b):
        for j in range(h):
            rows = sorted(c.rows for c in chunks if c.batch[0] <= i < c.batch[1] and c.heads[0] <= j < c.heads[1])
            assert rows[0][0] == 0 and rows[-1][1] == sq
            assert all(x[1] == y[0] for x, y in itertools.pairwise(rows))


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 4),
    st.sampled_from([1, 2, 3, 4, 8]),
    st.integers(1, 40),
    st.integers(1, 40),
    st.sampled_from([1, 2, 8]),
    st.integers(8, 4000),
    st.booleans(),
)
def test_plan_gqa_property(b, hkv, group, sq, sk, d, limit, causal):
    h = hkv * group
    if sk * d > limit or (causal and sq * d > limit):
        with pytest.raises(ValueError):
            plan_chunks(b, h, sq, sk, d, heads_kv=hkv, causal=causal, limit=limit)
        return
    chunks = plan_chunks(b, h, sq, sk, d, heads_kv=hkv, causal=causal, limit=limit)
    _check_gqa_plan(b, h, hkv, sq, sk, d, chunks, limit, causal)


def test_plan_gqa_keeps_whole_groups():
    # 32 query heads, 8 K/V heads (groups of 4); one batch entry holds 32 x 100 x 8 = 25600 > limit
    chunks = plan_chunks(2, 32, 100, 50, 8, heads_kv=8, limit=8000)  # a group's Q: 3200, two fit
    assert [(c.batch, c.heads, c.kv_heads) for c in chunks[:4]] == [
        ((0, 1), (0, 8), (0, 2)),
        ((0, 1), (8, 16), (2, 4)),
        ((0, 1), (16, 24), (4, 6)),
        ((0, 1), (24, 32), (6, 8)),
    ]
    assert len(chunks) == 8 and all(c.rows == (0, 100) for c in chunks)
    # MQA: every query head reads K/V head 0; a group's queries do not fit: parts of the group, K/V head 0
    chunks = plan_chunks(1, 6, 100, 50, 8, heads_kv=1, limit=2000)
    assert [(c.heads, c.kv_heads) for c in chunks] == [((0, 2), (0, 1)), ((2, 4), (0, 1)), ((4, 6), (0, 1))]
    # equal head counts: the plan is the one of old, no kv_heads
    assert all(c.kv_heads is None for c in plan_chunks(1, 6, 100, 50, 8, limit=2000))
    assert plan_chunks(1, 6, 100, 50, 8, limit=2000) == plan_chunks(1, 6, 100, 50, 8, heads_kv=6, limit=2000)
    q, k = torch.empty(2, 32, 100, 8), torch.empty(2, 8, 50, 8)
    for c in plan_chunks(2, 32, 100, 50, 8, heads_kv=8, limit=8000):
        assert q[c.q_index].is_contiguous() and k[c.kv_index].is_contiguous()
        assert k[c.kv_index].shape[1] * 4 == q[c.q_index].shape[1]


def test_plan_causal_splits_batch_and_heads_only():
    assert len(plan_chunks(4, 16, 100, 100, 8, causal=True, limit=20000)) == 4  # batch entries
    chunks = plan_chunks(1, 16, 100, 100, 8, causal=True, limit=2000)  # heads: 2 per launch
    assert len(chunks) == 8 and all(c.rows == (0, 100) for c in chunks)
    assert len(plan_chunks(1, 1, 250, 10, 8, limit=1000)) == 2  # rows, without a mask
    with pytest.raises(ValueError, match="causal call cannot be split over query rows"):
        plan_chunks(1, 1, 250, 10, 8, causal=True, limit=1000)
    with pytest.raises(ValueError, match="must divide"):
        plan_chunks(1, 6, 10, 10, 8, heads_kv=4)
    with pytest.raises(ValueError, match="must divide"):
        plan_chunks(1, 6, 10, 10, 8, heads_kv=0)
    assert plan_chunks(1, 0, 10, 10, 8, heads_kv=0) == []
