"""The drop-in API without a GPU (issue 9): the support check and its reasons, fallback warnings (once per
reason), strict mode, patch_sdpa, the custom op's fake and autograd registrations, torch.compile/export
tracing, zero-length semantics, the 2^31 planner and the TMA stride rule."""

import itertools
import math
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import attnclimb
from attnclimb import ops, rungs, sdpa, support
from attnclimb.runtime.layout import INT32_LIMIT, needs_copy, plan_chunks, tma_layout_reason

BF16 = torch.bfloat16


def _t(*shape, dtype=BF16, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device)


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


# ---------------------------------------------------------------- the support check


def test_supported_call_has_no_reason(hopper):
    _, (q, k) = _fake_cuda((2, 3, 5, 128), (2, 3, 7, 128))
    assert support.unsupported_reason(q, k, k) is None
    assert support.unsupported_reason(q.transpose(1, 2).transpose(1, 2), k, k, scale=0.3, enable_gqa=True) is None
    _, (z,) = _fake_cuda((2, 3, 0, 128))
    assert support.unsupported_reason(z, k, k) is None  # zero sizes are computed, not refused
    assert support.unsupported_reason(q, z, z) is None


@pytest.mark.parametrize(
    "case,key",
    [
        ("mask", "attn_mask"),
        ("dropout", "dropout"),
        ("causal", "is_causal"),
        ("rank3", "rank"),
        ("fp16", "dtype"),
        ("mixed_dtype", "dtype"),
        ("head_dim96", "head_dim"),
        ("v_head_dim", "head_dim"),
        ("batch", "shape"),
        ("heads", "shape"),
        ("gqa", "gqa"),
        ("seqlen_kv", "shape"),
        ("scale_nan", "scale"),
        ("scale_str", "scale"),
        ("keys_too_long", "size"),
    ],
)
def test_each_reason(hopper, case, key):
    shapes = {"q": (1, 4, 8, 128), "k": (1, 4, 8, 128), "v": (1, 4, 8, 128)}
    dtype = {"q": BF16, "k": BF16, "v": BF16}
    kw = {}
    if case == "mask":
        kw["attn_mask"] = torch.ones(8, 8, dtype=torch.bool)
    elif case == "dropout":
        kw["dropout_p"] = 0.1
    elif case == "causal":
        kw["is_causal"] = True
    elif case == "rank3":
        shapes = dict.fromkeys(shapes, (4, 8, 128))
    elif case == "fp16":
        dtype = dict.fromkeys(dtype, torch.float16)
    elif case == "mixed_dtype":
        dtype["k"] = torch.float16
    elif case == "head_dim96":  # 64 and 256 are top-rung variants (Rung.head_dims); 96 is not
        shapes = dict.fromkeys(shapes, (1, 4, 8, 96))
    elif case == "v_head_dim":
        shapes["v"] = (1, 4, 8, 64)
    elif case == "batch":
        shapes["k"] = shapes["v"] = (2, 4, 8, 128)
    elif case == "heads":
        shapes["k"] = shapes["v"] = (1, 3, 8, 128)
    elif case == "gqa":
        shapes["k"] = shapes["v"] = (1, 2, 8, 128)
        kw["enable_gqa"] = True
    elif case == "seqlen_kv":
        shapes["v"] = (1, 4, 9, 128)
    elif case == "scale_nan":
        kw["scale"] = float("nan")
    elif case == "scale_str":
        kw["scale"] = "0.1"
    elif case == "keys_too_long":
        shapes["k"] = shapes["v"] = (1, 4, 2**24, 128)
    mode = FakeTensorMode()
    with mode:
        q, k, v = (torch.empty(*shapes[n], dtype=dtype[n], device="cuda") for n in "qkv")
    if key in ("is_causal", "gqa") or case == "fp16":  # rungs 10 and up have these variants; the rungs below do not
        assert support.unsupported_reason(q, k, v, **kw) is None
        kw["features"] = support.FEATURES_BY_RUNG[9]
    why = support.unsupported_reason(q, k, v, **kw)
    assert why is not None and why.key == key, why
    assert why.exc in (TypeError, ValueError) and why.message


def test_device_and_gpu_reasons():
    q = _t(1, 1, 4, 128)
    assert support.unsupported_reason(q, q, q).key == "device"
    assert support.unsupported_reason(q.to("meta"), q.to("meta"), q.to("meta")).detail == "meta"
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    _, (c,) = _fake_cuda((1, 1, 4, 128))
    why = support.unsupported_reason(c, c, c)
    assert why.key == "gpu" and "GPU" in why.message
    assert support.unsupported_reason(c, q, q).key == "device"  # mixed devices


def test_valid_signature_cache(hopper, monkeypatch):
    """unsupported_reason remembers signatures that passed every check but the GPU's (a bounded cache): what
    it reads of a call is the key, so any change of type, shape, dtype, device, scale or a flag is checked
    afresh, strides are not part of it (any are supported), and the GPU check runs on every call."""
    monkeypatch.setattr(support, "_VALID", {})
    monkeypatch.setattr(support, "_VALID_SIZE", 4)
    mode, (q, k, wide, k96, k1) = _fake_cuda(
        (1, 2, 8, 128), (1, 2, 8, 128), (1, 8, 2, 128), (1, 2, 8, 96), (1, 1, 8, 128)
    )
    _, (q16,) = _fake_cuda((1, 2, 8, 128), dtype=torch.float16)
    with mode:
        q1 = torch.empty(1, 2, 8, 128, dtype=BF16, device="cuda:1")
    assert support.unsupported_reason(q, k, k) is None
    assert len(support._VALID) == 1
    assert support.unsupported_reason(q, k, k) is None and len(support._VALID) == 1  # a hit
    assert support.unsupported_reason(wide.transpose(1, 2), k, k) is None  # other strides: the same key
    assert len(support._VALID) == 1
    # every change of what the checks read misses the cache and gets its documented reason
    assert support.unsupported_reason(q16, k, k).key == "dtype"
    assert support.unsupported_reason(q, k96, k96).key == "head_dim"
    assert support.unsupported_reason(q, k1, k1).key == "shape"  # fewer heads without enable_gqa
    assert support.unsupported_reason(q, k, k, scale=True).key == "scale"  # True == 1.0, but a bool
    assert support.unsupported_reason(q, k, k, scale=math.inf).key == "scale"
    assert support.unsupported_reason(q, _t(1, 2, 8, 128), k).key == "device"
    assert support.unsupported_reason(q, k, k, attn_mask=k).key == "attn_mask"
    assert support.unsupported_reason(q, k, k, dropout_p=0.1).key == "dropout"
    assert support.unsupported_reason(q, k, k, return_lse=True, features=support.FEATURES_BY_RUNG[9]).key == (
        "return_lse"
    )
    assert len(support._VALID) == 1  # none of them was remembered
    why = support.unsupported_reason(q1, q1, q1)  # another device: its own GPU check (no GPU here)
    assert why is not None and why.key == "gpu"
    # the GPU check is not cached with the signature
    monkeypatch.setitem(support._DEVICE_REASONS, 0, "an Ampere GPU")
    why = support.unsupported_reason(q, k, k)
    assert why is not None and (why.key, why.detail) == ("gpu", "an Ampere GPU")
    monkeypatch.setitem(support._DEVICE_REASONS, 0, None)
    # bounded: the oldest signature goes first
    for sq in (1, 2, 3, 4, 5):
        _, (qs,) = _fake_cuda((1, 2, sq, 128))
        assert support.unsupported_reason(qs, k, k, is_causal=True, scale=0.5) is None
    assert len(support._VALID) == 4
    assert support._signature(q, k, k, False, None, False, False)[1] is False  # the first one was dropped
    # a scale other than None or a float is checked every time, never remembered
    assert support.unsupported_reason(q, k, k, scale=1) is None
    assert support._signature(q, k, k, False, 1, False, False) == (None, False)


def test_type_layout_subclass_reasons():
    q = _t(1, 1, 4, 128)
    assert support.unsupported_reason([1], q, q).key == "type"
    assert support.unsupported_reason(q.to_sparse(), q, q).key == "layout"

    class Sub(torch.Tensor):
        pass

    assert support.unsupported_reason(q.as_subclass(Sub), q, q).key == "subclass"
    assert support.unsupported_reason(torch.nn.Parameter(q), q, q).key == "device"  # a Parameter is plain


def test_features_table_decides(hopper):
    """A later kernel feature is one table edit: the same call flips from a reason to None."""
    _, (q, k) = _fake_cuda((1, 4, 8, 128), (1, 2, 8, 128))
    plain = support.BASE
    assert support.unsupported_reason(q, q, q, is_causal=True, features=plain).key == "is_causal"
    assert support.unsupported_reason(q, k, k, enable_gqa=True, features=plain).key == "gqa"
    assert support.unsupported_reason(q, q, q, features=plain, return_lse=True).key == "return_lse"
    more = support.KernelFeatures(
        dtypes=support.FEATURES.dtypes | {torch.float16}, head_dims=frozenset({64, 128}), causal=True, gqa=True
    )
    assert support.unsupported_reason(q, q, q, is_causal=True, features=more) is None
    assert support.unsupported_reason(q, k, k, enable_gqa=True, features=more) is None
    _, (h, g) = _fake_cuda((1, 4, 8, 64), (1, 4, 8, 64), dtype=torch.float16)
    assert support.unsupported_reason(h, g, g, features=plain).key == "dtype"
    assert support.unsupported_reason(h, g, g, features=more) is None


def test_features_per_rung_come_from_the_rung(hopper):
    """Support depends on the rung: the top rung's compile-time variants (Rung.features) are its table's
    causal, gqa and lse; the rungs below have none, and their reasons name the rung and who has it."""
    from attnclimb import rungs

    top = rungs.TOP
    assert {"causal", "gqa", "lse"} <= set(top.features)
    assert support.FEATURES is support.FEATURES_BY_RUNG[top.number]
    assert (support.FEATURES.causal, support.FEATURES.gqa, support.FEATURES.lse) == (True, True, True)
    for r in rungs.RUNGS:
        f = support.FEATURES_BY_RUNG[r.number]
        assert (f.causal, f.gqa, f.lse) == tuple(x in r.features for x in ("causal", "gqa", "lse"))
        # fp16 is the FP16 variant of rungs 10-16 ("fp16" in their features); every other rung is bf16 only
        assert f.dtypes == (support.BASE.dtypes | {torch.float16} if "fp16" in r.features else support.BASE.dtypes)
        assert ("fp16" in r.features) == (r.number >= 10)
        assert f.head_dims == {r.head_dim, *r.head_dims}  # 128 everywhere; the top rung adds its variants
    _, (q, k, k1) = _fake_cuda((2, 8, 16, 128), (2, 2, 24, 128), (2, 1, 24, 128))
    low = support.FEATURES_BY_RUNG[9]
    for kv in (k, k1):  # GQA 8/2 and MQA 8/1, causal and not, with the LSE: all the top rung's
        for causal in (False, True):
            assert support.unsupported_reason(q, kv, kv, is_causal=causal, enable_gqa=True, return_lse=True) is None
    why = support.unsupported_reason(q, q, q, is_causal=True, features=low)
    assert why.key == "is_causal" and "rung 9 (softmax_overlap)" in why.message
    have = ", ".join(str(r.number) for r in rungs.RUNGS if "causal" in r.features)
    assert have.startswith("10, 11") and have.endswith(str(top.number))
    assert f"rungs {have} have it" in why.message
    why = support.unsupported_reason(q, k, k, enable_gqa=True, features=low)
    assert why.key == "gqa" and "8 query heads, 2 key/value heads" in why.message and "rung 9" in why.message
    assert support.unsupported_reason(q, q, q, features=low, return_lse=True).key == "return_lse"
    # fewer K/V heads without enable_gqa, or not a divisor, or K and V differing: torch's SDPA decides
    _, (k3, v4) = _fake_cuda((2, 3, 24, 128), (2, 4, 24, 128))
    why = support.unsupported_reason(q, k, k)
    assert why.key == "shape" and "needs enable_gqa=True" in why.message
    assert support.unsupported_reason(q, k3, k3, enable_gqa=True).key == "shape"
    assert support.unsupported_reason(q, k, v4, enable_gqa=True).key == "shape"


def test_causal_size_reason_only_where_rows_would_split(hopper):
    """A causal call is never split over query rows (the kernels anchor the diagonal at a launch's first
    row): one head's Q of 2^31 elements is the size reason with causal, and fine without."""
    mode = FakeTensorMode()
    with mode:
        big_q = torch.empty(1, 1, 2**24 + 1, 128, dtype=BF16, device="cuda")
        ok_q = torch.empty(1, 1, 2**24 - 1, 128, dtype=BF16, device="cuda")
        k = torch.empty(1, 1, 64, 128, dtype=BF16, device="cuda")
    assert support.unsupported_reason(big_q, k, k) is None  # split over rows: fine without a mask
    why = support.unsupported_reason(big_q, k, k, is_causal=True)
    assert (why.key, why.detail) == ("size", "causal") and "query rows" in why.message
    assert support.unsupported_reason(ok_q, k, k, is_causal=True) is None


# ---------------------------------------------------------------- fallback, warnings, strict


def _sdpa_both(*args, **kw):
    """(ours, torch's) on the same arguments, with the same RNG state (dropout)."""
    torch.manual_seed(1234)
    ours = attnclimb.scaled_dot_product_attention(*args, **kw)
    torch.manual_seed(1234)
    ref = F.scaled_dot_product_attention(*args, **kw)
    return ours, ref


@pytest.mark.parametrize(
    "shapes,kw",
    [
        (((2, 3, 5, 128),) * 3, {}),
        (((2, 3, 5, 64),) * 3, {"scale": 0.3}),
        (((2, 3, 5, 128),) * 3, {"is_causal": True}),
        (((2, 3, 5, 128),) * 3, {"dropout_p": 0.5}),
        (((2, 3, 5, 128),) * 3, {"attn_mask": torch.rand(5, 5) > 0.3}),
        (((2, 4, 5, 128), (2, 2, 6, 128), (2, 2, 6, 128)), {"enable_gqa": True}),
        (((3, 5, 128), (3, 6, 128), (3, 6, 64)), {}),
    ],
)
def test_fallback_equals_torch(shapes, kw):
    args = [_t(*s, dtype=torch.float32) for s in shapes]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ours, ref = _sdpa_both(*args, **kw)
    assert torch.equal(ours, ref)
    assert [x.category for x in w] == [attnclimb.AttnclimbFallbackWarning]


def test_one_warning_per_reason():
    q32, q16, qcpu = _t(1, 1, 4, 128, dtype=torch.float32), _t(1, 1, 4, 128, dtype=torch.float64), _t(1, 1, 4, 128)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            attnclimb.scaled_dot_product_attention(q32, q32, q32)
            attnclimb.scaled_dot_product_attention(q16, q16, q16)
            attnclimb.scaled_dot_product_attention(qcpu, qcpu, qcpu)
            attnclimb.scaled_dot_product_attention(qcpu, qcpu, qcpu, is_causal=True)  # causal: the same reason
            attnclimb.scaled_dot_product_attention(qcpu, qcpu, qcpu, dropout_p=0.5)
    msgs = [str(x.message) for x in w]
    assert len(msgs) == 4, msgs
    assert all(x.category is attnclimb.AttnclimbFallbackWarning for x in w)
    assert "torch.float32" in msgs[0] and "torch.float64" in msgs[1] and "cpu" in msgs[2] and "dropout" in msgs[3]
    sdpa.reset_fallback_warnings()
    with pytest.warns(attnclimb.AttnclimbFallbackWarning, match="float32"):
        attnclimb.scaled_dot_product_attention(q32, q32, q32)


def test_strict_raises_instead():
    q = _t(1, 1, 4, 128, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # strict mode warns about nothing
        with pytest.raises(attnclimb.KernelUnsupportedError, match="float32") as exc:
            attnclimb.scaled_dot_product_attention(q, q, q, strict=True)
    assert isinstance(exc.value, RuntimeError) and exc.value.reason.key == "dtype"
    assert exc.value.reason.exc is TypeError
    with pytest.raises(attnclimb.KernelUnsupportedError, match="attn_mask"):
        attnclimb.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool), strict=True)


def test_invalid_input_gets_torchs_error():
    q, k = _t(1, 2, 4, 128, dtype=torch.float32), _t(1, 3, 5, 128, dtype=torch.float32)
    with pytest.warns(attnclimb.AttnclimbFallbackWarning), pytest.raises(RuntimeError):
        attnclimb.scaled_dot_product_attention(q, k, k)  # 2 query heads, 3 key heads: torch refuses


@pytest.mark.parametrize(
    "qs,ks", [((1, 2, 0, 128), (1, 2, 5, 128)), ((1, 2, 4, 128), (1, 2, 0, 128)), ((0, 2, 4, 128), (0, 2, 5, 128))]
)
def test_zero_lengths_match_torch(qs, ks):
    """The fallback (CPU) and our own zero-size path give what torch's SDPA gives: an empty output, or
    zeros when there are no keys."""
    q, k, v = _t(*qs), _t(*ks), _t(*ks)
    ref = F.scaled_dot_product_attention(q, k, v)
    with pytest.warns(attnclimb.AttnclimbFallbackWarning):
        ours = attnclimb.scaled_dot_product_attention(q, k, v)
    assert ours.shape == ref.shape and torch.equal(ours, ref)
    mine = ops.forward(q, k, v, 0.1, 9)  # returns before any launch: runs on the CPU too
    assert mine.shape == ref.shape and mine.dtype == BF16 and torch.equal(mine, ref)
    if ks[2] == 0 and qs[0] > 0:
        assert mine.numel() > 0 and (mine == 0).all()


# ---------------------------------------------------------------- patch_sdpa


def test_patch_sdpa_patches_and_restores():
    orig = F.scaled_dot_product_attention
    q = _t(1, 1, 4, 128, dtype=torch.float32)
    with attnclimb.patch_sdpa():
        assert F.scaled_dot_product_attention is sdpa._routed_sdpa
        with pytest.warns(attnclimb.AttnclimbFallbackWarning):  # routed through attnclimb (which falls back)
            out = F.scaled_dot_product_attention(q, q, q)
        assert torch.equal(out, orig(q, q, q))
        with attnclimb.patch_sdpa(strict=True):
            with pytest.raises(attnclimb.KernelUnsupportedError):
                F.scaled_dot_product_attention(q, q, q)
        assert F.scaled_dot_product_attention is sdpa._routed_sdpa  # the inner exit did not restore
        F.scaled_dot_product_attention(q, q, q)  # not strict any more
    assert F.scaled_dot_product_attention is orig
    with pytest.raises(KeyError), attnclimb.patch_sdpa():
        raise KeyError("an exception inside the block")
    assert F.scaled_dot_product_attention is orig and sdpa._patch_depth == 0 and sdpa._strict_depth == 0


def test_patch_sdpa_routes_a_model():
    class Attn(torch.nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x, is_causal=True)

    x = _t(1, 2, 6, 128, dtype=torch.float32)
    ref = Attn()(x)
    seen = []
    real = sdpa.scaled_dot_product_attention
    try:
        sdpa.scaled_dot_product_attention = lambda *a, **k: seen.append(a[5]) or real(*a, **k)
        with attnclimb.patch_sdpa(), pytest.warns(attnclimb.AttnclimbFallbackWarning, match="float32"):
            out = Attn()(x)
    finally:
        sdpa.scaled_dot_product_attention = real
    assert seen == [True] and torch.equal(out, ref)


def test_patch_sdpa_threads_overlap():
    orig = F.scaled_dot_product_attention
    inside, leave = threading.Barrier(3), threading.Event()
    seen = []

    def worker():
        with attnclimb.patch_sdpa():
            inside.wait()
            leave.wait()
            seen.append(F.scaled_dot_product_attention is sdpa._routed_sdpa)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert F.scaled_dot_product_attention is sdpa._routed_sdpa  # process-wide, as documented
    leave.set()
    for t in threads:
        t.join()
    assert seen == [True, True] and F.scaled_dot_product_attention is orig


def test_patch_sdpa_leaves_a_foreign_replacement():
    orig = F.scaled_dot_product_attention

    def other(*a, **k):
        return orig(*a, **k)

    try:
        with pytest.warns(RuntimeWarning, match="replaced"), attnclimb.patch_sdpa():
            F.scaled_dot_product_attention = other
        assert F.scaled_dot_product_attention is other
    finally:
        F.scaled_dot_product_attention = orig


# ---------------------------------------------------------------- the custom op


def test_fake_impl_shape_dtype_strides():
    mode, (q, k, z) = _fake_cuda((2, 7, 3, 128), (2, 3, 9, 128), (2, 0, 3, 128))
    with mode:
        out = torch.ops.attnclimb.attention_fwd(q.transpose(1, 2), k, k, 0.1, 9)
        assert out.shape == (2, 3, 7, 128) and out.dtype == BF16 and out.device.type == "cuda"
        assert out.is_contiguous()
        empty = torch.ops.attnclimb.attention_fwd(z.transpose(1, 2), k, k, 0.1, 9)
        assert empty.shape == (2, 3, 0, 128)


def test_op_schema():
    schema = str(torch.ops.attnclimb.attention_fwd.default._schema)
    # torch writes an `int` annotation as SymInt
    assert schema.replace("SymInt", "int") == (
        "attnclimb::attention_fwd(Tensor q, Tensor k, Tensor v, float scale, int rung, bool is_causal=False) -> Tensor"
    )
    schema = str(torch.ops.attnclimb.attention_fwd_lse.default._schema)
    assert schema.replace("SymInt", "int") == (
        "attnclimb::attention_fwd_lse(Tensor q, Tensor k, Tensor v, float scale, int rung, bool is_causal=False) "
        "-> (Tensor, Tensor)"
    )


def test_fake_impls_of_the_lse_op_and_gqa():
    """The LSE op's fake gives a contiguous bf16 O and a contiguous fp32 (B, H, Sq) LSE; with fewer K/V
    heads (GQA) O has Q's heads; is_causal changes no shape."""
    mode, (q, k) = _fake_cuda((2, 7, 8, 128), (2, 9, 2, 128))  # BSHD: q 8 heads, k/v 2 heads
    with mode:
        o, lse = torch.ops.attnclimb.attention_fwd_lse(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), 0.1, 12)
        assert o.shape == (2, 8, 7, 128) and o.dtype == BF16 and o.is_contiguous() and o.device.type == "cuda"
        assert lse.shape == (2, 8, 7) and lse.dtype == torch.float32 and lse.is_contiguous()
        o2 = torch.ops.attnclimb.attention_fwd(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), 0.1, 12, True)
        assert o2.shape == (2, 8, 7, 128)


def test_direct_call_only_when_nothing_observes_it():
    q = _t(1, 1, 4, 128)
    assert ops.direct_call_ok(q, q, q)
    g = q.clone().requires_grad_()
    assert not ops.direct_call_ok(g, q, q)
    with torch.no_grad():
        assert ops.direct_call_ok(g, q, q)
    assert not ops.direct_call_ok(torch.nn.Parameter(q), q, q)
    mode, (f,) = _fake_cuda((1, 1, 4, 128))
    with mode:
        assert not ops.direct_call_ok(f, f, f)


# A CPU stand-in for the op with the real autograd registration (ops._setup_context, ops._backward): the
# backward formula and its traceability are checked without a GPU (the GPU tests run opcheck on the real op).
@torch.library.custom_op("attnclimb_test::attention_fwd_cpu", mutates_args=(), device_types="cpu")
def _cpu_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, rung: int) -> torch.Tensor:
    return ops._TORCH_SDPA(q, k, v, scale=scale).contiguous()


@_cpu_op.register_fake
def _(q, k, v, scale, rung):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


_cpu_op.register_autograd(ops._backward, setup_context=ops._setup_context)


def test_backward_formula_gradcheck_and_opcheck():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, s, 8, dtype=torch.float64, generator=g).requires_grad_() for s in (3, 5, 5))
    assert torch.autograd.gradcheck(lambda a, b, c: _cpu_op(a, b, c, 0.7, 9), (q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # the backward recomputes with torch's SDPA: its backend choice applies
        assert torch.autograd.gradgradcheck(lambda a, b, c: _cpu_op(a, b, c, 0.7, 9), (q, k, v))
    torch.library.opcheck(_cpu_op, (q.float(), k.float(), v.float(), 0.7, 9))
    # only the inputs that need a gradient get one
    k2 = k.detach()
    out = _cpu_op(q, k2, v, 0.7, 9)
    gq, gv = torch.autograd.grad(out.sum(), (q, v))
    assert gq.shape == q.shape and gv.shape == v.shape


def test_backward_formula_under_compile():
    q, k, v = (torch.randn(2, 3, 6, 16, requires_grad=True) for _ in range(3))
    f = torch.compile(lambda a, b, c: _cpu_op(a, b, c, 0.3, 9).square().sum(), fullgraph=True, backend="aot_eager")
    gc = torch.autograd.grad(f(q, k, v), (q, k, v))
    ge = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, scale=0.3).square().sum(), (q, k, v))
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b)


def test_export_traces_the_kernel_path_into_one_op(hopper):
    """Dynamo (strict export) traces scaled_dot_product_attention on BSHD views into a single
    attnclimb::attention_fwd call: no graph break, the check runs at trace time."""

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            o = attnclimb.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            return o.transpose(1, 2) * 2

    _, (q, k) = _fake_cuda((2, 7, 3, 128), (2, 9, 3, 128))
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)
        ep = torch.export.export(M(), (q, k, k), strict=True)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.attnclimb.attention_fwd.default) == 1
    assert torch.ops.aten._scaled_dot_product_efficient_attention.default not in targets


@pytest.mark.parametrize("rung", [None, 3])
def test_export_traces_attention_into_one_op(hopper, rung):
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return attnclimb.attention(q, k, v, scale=0.5, rung=rung) + 1

    _, (q, k) = _fake_cuda((2, 3, 7, 128), (2, 3, 9, 128))
    ep = torch.export.export(M(), (q, k, k), strict=True)
    calls = [n for n in ep.graph.nodes if n.target == torch.ops.attnclimb.attention_fwd.default]
    assert len(calls) == 1
    assert calls[0].args[3:] == (0.5, attnclimb.RUNGS[-1].number if rung is None else rung)


def test_compile_fullgraph_fallback_warns_once():
    def f(q, k, v):
        return attnclimb.scaled_dot_product_attention(q, k, v) + 1

    cf = torch.compile(f, fullgraph=True, backend="eager")
    q = _t(1, 2, 5, 128, dtype=torch.float32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = cf(q, q, q)
        cf(q, q, q)
    assert [x.category for x in w] == [attnclimb.AttnclimbFallbackWarning]
    assert torch.equal(out, F.scaled_dot_product_attention(q, q, q) + 1)


def test_compile_strict_raises():
    cf = torch.compile(lambda q: attnclimb.scaled_dot_product_attention(q, q, q, strict=True), backend="eager")
    q = _t(1, 2, 5, 128, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="KernelUnsupportedError") as exc:
        cf(q)
    assert isinstance(exc.value.__context__, attnclimb.KernelUnsupportedError)


def test_import_is_light():
    code = "import sys, attnclimb; assert 'torch' not in sys.modules; attnclimb.RUNGS; print('ok')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert callable(attnclimb.scaled_dot_product_attention) and callable(attnclimb.register_diffusers_backend)
    with pytest.raises(AttributeError):
        attnclimb.no_such_name  # noqa: B018


def test_raw_stream_handle():
    from attnclimb.runtime.launch import raw_stream_handle

    class CudaStreamLike:
        cuda_stream = 0x1234

    assert raw_stream_handle(CudaStreamLike()) == 0x1234


@pytest.mark.parametrize("number", [0, 3, 9])
def test_run_rung_passes_the_kernel_abi(monkeypatch, number):
    """run_rung's launches (kernel, 1-D grid, block, shared memory, arguments in docs/kernel-abi.md's
    order), with the CUDA side replaced by a recorder: the glue between the planner and cuda.core."""
    from attnclimb import rungs
    from attnclimb.runtime import launch

    rung = rungs.BY_NUMBER[number]
    calls = []

    class FakeLoaded(launch.LoadedRung):
        def __init__(self):  # no cuda.core: the real launch(), through the two seams below
            self.block, self.smem_bytes = (rung.threads,), rung.smem_bytes
            self.kernels = {name: name for name in rung.kernel_names}

        def stream_for_handle(self, handle):
            return ("stream", handle)

    def record(stream, config, kernel, *args):
        calls.append((kernel, *config, stream, args))

    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "_launch_config", lambda grid, block, smem: (grid, block, smem))
    monkeypatch.setattr(launch, "_cuda_launch", record)
    monkeypatch.setattr(launch, "loaded", lambda r, dev: FakeLoaded())
    monkeypatch.setattr(launch, "_ensure_context", lambda lr: None)
    monkeypatch.setattr(launch, "current_stream_handle", lambda dev: 77)
    monkeypatch.setattr(
        launch, "_tensor_map_of", lambda t, bh, rows, box, dev, l2_promotion=0: ("map", t.data_ptr(), bh, rows, box)
    )
    b, h, sq, sk = 2, 3, 300, 200
    q, o = torch.empty(b, h, sq, 128, dtype=BF16), torch.empty(b, h, sq, 128, dtype=BF16)
    k, v = torch.empty(b, h, sk, 128, dtype=BF16), torch.empty(b, h, sk, 128, dtype=BF16)
    launch.run_rung(rung, q, k, v, o, 0.25)
    bh = b * h
    assert all(c[4] == ("stream", 77) for c in calls)
    if rung.abi == "unfused":
        assert [c[0] for c in calls] == ["qk_scores", "row_softmax", "pv_product"]
        tiles_m, tiles_n = -(-sq // rung.block_m), -(-sk // rung.block_n)
        assert [c[1] for c in calls] == [(tiles_n * tiles_m * bh,), (bh * sq,), (tiles_m * bh,)]
        assert calls[0][5][:2] == (q.data_ptr(), k.data_ptr()) and calls[2][5][1:3] == (v.data_ptr(), o.data_ptr())
        assert calls[0][5][2] == calls[1][5][0] == calls[2][5][0]  # one S workspace
        return
    m_blocks = rung.num_m_blocks(sq)
    ((name, grid, block, smem, _, args),) = calls
    assert (name, grid, block, smem) == ("attn_fwd", (m_blocks * bh,), (rung.threads,), rung.smem_bytes)
    assert [int(a) for a in args[4:7]] == [sq, sk, m_blocks] and float(args[7]) == 0.25
    assert args[3] == o.data_ptr()
    if rung.abi == "pointer":
        assert args[:3] == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    else:
        assert args[:3] == (
            ("map", q.data_ptr(), bh, sq, rung.q_box_rows),
            ("map", k.data_ptr(), bh, sk, rung.kv_box_rows),
            ("map", v.data_ptr(), bh, sk, rung.kv_box_rows),
        )


def test_tensor_map_cache_keys_on_head_dim(monkeypatch):
    """A cached TMA map is reused only for the same address, (batch·heads, seqlen), head_dim and box: the
    memory of a freed head_dim 128 tensor reused by a head_dim 64 one gets a fresh map of the new pitch."""
    from attnclimb.runtime import launch

    monkeypatch.setattr(launch, "_TMAP_CACHE", {})
    monkeypatch.setattr(
        launch,
        "_encode_map",
        lambda ptr, shape, strides, box, fp16=False, l2_promotion=0: ("map", ptr, shape, strides, box, fp16),
    )
    buf = torch.empty(2 * 300 * 256, dtype=BF16)
    maps = {d: launch._tensor_map_of(buf[: 600 * d].view(1, 2, 300, d), 2, 300, 128, 0) for d in (128, 64, 256)}
    assert maps[128] is not maps[64]
    assert maps[128][2:4] == ((2, 300, 128), (300 * 128, 128, 1))
    assert maps[64][2:4] == ((2, 300, 64), (300 * 64, 64, 1))
    assert launch._tensor_map_of(buf[: 600 * 64].view(1, 2, 300, 64), 2, 300, 128, 0) is maps[64]  # a hit


def test_tensor_map_cache_keys_on_dtype(monkeypatch):
    """An fp16 tensor in the memory of a freed bf16 one of the same shape gets a fresh map that declares fp16
    elements (TensorMapDataType.FLOAT16), 3-D and 4-D alike; the bf16 map is still served to bf16."""
    from attnclimb.runtime import launch

    monkeypatch.setattr(launch, "_TMAP_CACHE", {})
    monkeypatch.setattr(
        launch,
        "_encode_map",
        lambda ptr, shape, strides, box, fp16=False, l2_promotion=0: ("map", ptr, shape, strides, box, fp16),
    )
    buf = torch.empty(2 * 300 * 128, dtype=BF16)
    bf = buf.view(1, 2, 300, 128)
    half = buf.view(torch.float16).view(1, 2, 300, 128)
    assert bf.data_ptr() == half.data_ptr()
    m_bf, m_half = launch._tensor_map_of(bf, 2, 300, 128, 0), launch._tensor_map_of(half, 2, 300, 128, 0)
    assert m_bf[-1] is False and m_half[-1] is True and m_bf[:-1] == m_half[:-1]
    assert launch._tensor_map_of(bf, 2, 300, 128, 0) is m_bf
    views = (bf.transpose(1, 2).transpose(1, 2), half.transpose(1, 2).transpose(1, 2))
    t_bf, t_half = (launch._tensor_map_4d(t, 128, 0) for t in views)
    assert t_bf[-1] is False and t_half[-1] is True
    # and run_rung's variant: fp16 inputs compile the top rung with FP16=1, bf16 ones run the rung itself
    top = rungs.TOP
    assert launch._checked_variant(top, bf, bf, bf, bf.clone(), False, None) == (top, False)
    v16, strided = launch._checked_variant(top, half, half, half, half.clone(), False, None)
    assert v16.defines()["FP16"] == 1 and not strided
    with pytest.raises(ValueError, match="fp16"):
        launch._checked_variant(rungs.get(9), half, half, half, half.clone(), False, None)


def test_tensor_map_l2_promotion(monkeypatch):
    """Rung.l2_promotion (bytes per L2 fill, a launch-side setting for A/B runs) reaches the tensor map's
    encode, 3-D and 4-D, and is part of the cache key: two rungs that differ only in it never share a map.
    Every allowed value names a member of cuda.core's TensorMapL2Promotion; others are refused."""
    import dataclasses

    from cuda.core._tensor_map import TensorMapL2Promotion

    from attnclimb.runtime import launch

    assert set(launch._L2_PROMOTION_NAMES) == set(rungs.L2_PROMOTIONS)
    assert all(hasattr(TensorMapL2Promotion, n) for n in launch._L2_PROMOTION_NAMES.values())
    assert TensorMapL2Promotion.L2_256B != TensorMapL2Promotion.NONE
    with pytest.raises(ValueError, match="l2_promotion"):
        dataclasses.replace(rungs.TOP, l2_promotion=100)
    assert rungs.TOP.l2_promotion == 0  # today's maps: no promotion
    with pytest.raises(ValueError, match="l2_promotion"):
        launch._encode_map(0, (2, 300, 128), (38400, 128, 1), (1, 128, 64), False, 100)
    monkeypatch.setattr(launch, "_TMAP_CACHE", {})
    monkeypatch.setattr(
        launch, "_encode_map", lambda ptr, shape, strides, box, fp16=False, l2_promotion=0: ("map", l2_promotion)
    )
    t = torch.empty(1, 2, 300, 128, dtype=BF16)
    plain, wide = (launch._tensor_map_of(t, 2, 300, 128, 0, p) for p in (0, 256))
    assert plain == ("map", 0) and wide == ("map", 256) and plain is not wide
    assert launch._tensor_map_of(t, 2, 300, 128, 0, 256) is wide  # a hit
    view = t.transpose(1, 2).transpose(1, 2)
    assert [launch._tensor_map_4d(view, 128, 0, p) for p in (0, 128)] == [("map", 0), ("map", 128)]


def _recording_launch(monkeypatch, rung):
    """run_rung with a CPU stand-in for cuda.core (LoadedRung without a module, launch config and launch
    recorded, tensor maps as tuples) and an empty plan cache; returns the list of launches."""
    from attnclimb.runtime import launch

    calls = []

    class FakeLoaded(launch.LoadedRung):
        def __init__(self, r, dev):
            self.block, self.smem_bytes, self.num_sms, self._resident = (r.threads,), r.smem_bytes, 132, 1
            self.kernels = {name: name for name in r.kernel_names}

        def stream_for_handle(self, handle):
            return ("stream", handle)

    def record(stream, config, kernel, *args):
        calls.append((kernel, *config, stream, args))

    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "_TMAP_CACHE", {})
    monkeypatch.setattr(launch, "_launch_config", lambda grid, block, smem: (grid, block, smem))
    monkeypatch.setattr(launch, "_cuda_launch", record)
    monkeypatch.setattr(launch, "loaded", FakeLoaded)
    monkeypatch.setattr(launch, "_ensure_context", lambda lr: None)
    monkeypatch.setattr(launch, "current_stream_handle", lambda dev: 77)
    monkeypatch.setattr(
        launch,
        "_encode_map",
        lambda ptr, shape, strides, box, fp16=False, l2_promotion=0: ("map", ptr, shape, strides, box, fp16),
    )
    return calls


def test_run_rung_plans_once_per_signature(monkeypatch):
    """run_rung's launch plan is memoised by everything it depends on: a repeated call plans nothing and
    launches with the call's own O and LSE; a changed shape, stride, dtype, address, scale, causal flag or
    LSE plans afresh (and raises as a fresh plan would); the cache is bounded."""
    from attnclimb.runtime import launch

    top = rungs.TOP
    calls = _recording_launch(monkeypatch, top)
    planned = []
    real_plan = launch._plan
    monkeypatch.setattr(launch, "_plan", lambda *a: planned.append(a) or real_plan(*a))
    b, h, s, d = 1, 2, 64, 128
    q, k, v = (torch.randn(b, h, s, d).to(BF16) for _ in range(3))
    o1, o2 = torch.empty_like(q), torch.empty_like(q)
    launch.run_rung(top, q, k, v, o1, 0.25)
    launch.run_rung(top, q, k, v, o2, 0.25)
    assert len(planned) == 1 and len(calls) == 2
    (_, *cfg1, st1, a1), (_, *cfg2, st2, a2) = calls
    assert cfg1 == cfg2 and st1 == st2 == ("stream", 77)
    assert a1[3] == o1.data_ptr() and a2[3] == o2.data_ptr() and a1[:3] == a2[:3] and a1[4:] == a2[4:]
    # every change of what the plan depends on misses the cache
    buf = torch.randn(b, s, h, d).to(BF16)
    lse = torch.empty(b, h, s)
    changed = [
        lambda: launch.run_rung(top, q[:, :, :32], k, v, o1[:, :, :32], 0.25),  # shape
        lambda: launch.run_rung(top, buf.transpose(1, 2), k, v, o1, 0.25),  # strides (a BSHD view)
        lambda: launch.run_rung(top, q.clone(), k, v, o1, 0.25),  # address
        lambda: launch.run_rung(top, *(t.to(torch.float16) for t in (q, k, v, o1)), 0.25),  # dtype
        lambda: launch.run_rung(top, q, k, v, o1, 0.5),  # scale
        lambda: launch.run_rung(top, q, k, v, o1, 0.25, causal=True),
        lambda: launch.run_rung(top, q, k, v, o1, 0.25, lse=lse),
        lambda: launch.run_rung(top, q, k, v, torch.empty(b, s, h, d).to(BF16).transpose(1, 2), 0.25),  # O's strides
    ]
    for i, call in enumerate(changed):
        call()
        assert len(planned) == 2 + i
    assert all(m[-1] is True for m in calls[5][-1][:3]) and all(m[-1] is False for m in calls[0][-1][:3])  # fp16 maps
    assert calls[-2][-1][11] == lse.data_ptr()  # the LSE's address, per call
    keys = {launch._plan_key(top, dev, q, k, v, o1, 0.25, False, None) for dev in (None, 0, 1)}
    assert len(keys) == 3  # each device its own plan
    # a misaligned O of the strided variant is refused, though an aligned one was planned
    o_buf = torch.empty(b * s * h * d + 8, dtype=BF16)
    o_ok = o_buf[:-8].view(b, s, h, d).transpose(1, 2)
    o_bad = o_buf[1:-7].view(b, s, h, d).transpose(1, 2)
    launch.run_rung(top, q, k, v, o_ok, 0.25)
    with pytest.raises(ValueError, match="in place"):
        launch.run_rung(top, q, k, v, o_bad, 0.25)
    with pytest.raises(ValueError, match="every size"):
        launch.run_rung(top, q[:, :, :0], k, v, o1[:, :, :0], 0.25)
    with pytest.raises(ValueError, match="one dtype"):
        launch.run_rung(top, q.to(torch.float16), k, v, o1, 0.25)
    # bounded, oldest first
    monkeypatch.setattr(launch, "_PLANS_SIZE", 3)
    launch._PLANS.clear()
    for scale in (0.1, 0.2, 0.3, 0.4):
        launch.run_rung(top, q, k, v, o1, scale)
    assert [key[-3] for key in launch._PLANS] == [0.2, 0.3, 0.4]


# ---------------------------------------------------------------- sizes: the 2^31 planner


def _check_plan(b, h, sq, sk, d, chunks, limit, workspace=False):
    for c in chunks:
        nb, nh, nr = (c.batch[1] - c.batch[0]), (c.heads[1] - c.heads[0]), (c.rows[1] - c.rows[0])
        assert nb >= 1 and nh >= 1 and nr >= 1
        assert nb * nh * nr * d <= limit and nb * nh * sk * d <= limit  # Q/O and K/V of the launch
        if workspace:
            assert nb * nh * nr * sk <= limit
        # contiguous slices of (B, H, S, D): heads whole or one batch entry; rows whole or one head
        assert c.heads == (0, h) or nb == 1
        assert c.rows == (0, sq) or (nb == 1 and nh == 1)
    # every (batch, head) covered, every query row exactly once
    for i in range(b):
        for j in range(h):
            rows = sorted(c.rows for c in chunks if c.batch[0] <= i < c.batch[1] and c.heads[0] <= j < c.heads[1])
            assert rows[0][0] == 0 and rows[-1][1] == sq
            assert all(a[1] == b_[0] for a, b_ in itertools.pairwise(rows))


def test_plan_fits_in_one_launch():
    assert plan_chunks(2, 16, 4096, 4096, 128) == [plan_chunks(2, 16, 4096, 4096, 128)[0]]
    c = plan_chunks(2, 16, 4096, 4096, 128)[0]
    assert (c.batch, c.heads, c.rows) == ((0, 2), (0, 16), (0, 4096))
    assert plan_chunks(0, 16, 4096, 4096, 128) == [] and plan_chunks(1, 1, 1, 0, 128) == []


@pytest.mark.parametrize(
    "shape,mode",
    [
        ((2, 64, 2**17 + 64, 256, 128), "batch"),  # Q of 2^31+ elements: one launch per batch entry
        ((2, 64, 256, 2**17 + 64, 128), "batch"),  # K/V of 2^31+ elements
        ((1, 160, 2**17, 256, 128), "heads"),  # one batch entry too big: split its heads
        ((1, 1, 2**24 + 1000, 64, 128), "rows"),  # one head's Q too big: split its query rows
        ((300, 16, 4096, 4096, 128), "batch"),
    ],
)
def test_plan_splits_at_2_to_the_31(shape, mode):
    b, h, sq, sk, d = shape
    chunks = plan_chunks(*shape)
    assert len(chunks) > 1
    _check_plan(b, h, sq, sk, d, chunks, INT32_LIMIT)
    if mode == "batch":
        assert all(c.heads == (0, h) and c.rows == (0, sq) for c in chunks)
    elif mode == "heads":
        assert all(c.rows == (0, sq) and c.batch[1] - c.batch[0] == 1 for c in chunks)
    else:
        assert all(c.heads[1] - c.heads[0] == 1 for c in chunks)
    assert chunks[0].q_index == (slice(*chunks[0].batch), slice(*chunks[0].heads), slice(*chunks[0].rows))


def test_plan_refuses_unsplittable_keys():
    with pytest.raises(ValueError, match="32-bit"):
        plan_chunks(1, 1, 16, 2**24, 128)
    with pytest.raises(ValueError, match="32-bit"):
        plan_chunks(4, 2, 16, 100, 8, limit=799)
    assert len(plan_chunks(4, 2, 16, 100, 8, limit=800)) == 8  # exactly one head's keys per launch


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(1, 40),
    st.integers(1, 40),
    st.sampled_from([1, 2, 8]),
    st.integers(8, 4000),
    st.booleans(),
)
def test_plan_property(b, h, sq, sk, d, limit, workspace):
    if sk * d > limit or (workspace and sk > limit):
        with pytest.raises(ValueError):
            plan_chunks(b, h, sq, sk, d, score_workspace=workspace, limit=limit)
        return
    chunks = plan_chunks(b, h, sq, sk, d, score_workspace=workspace, limit=limit)
    _check_plan(b, h, sq, sk, d, chunks, limit, workspace)


@pytest.mark.parametrize(
    "shape,rung,launches",
    [
        ((5, 4, 50, 9), 9, 5),  # a batch entry's Q (4 x 50 x 8 = 1600) per launch
        ((1, 12, 40, 9), 9, 2),  # one batch entry too big (3840): 9 heads per launch
        ((1, 2, 500, 9), 9, 4),  # one head too big (4000): 375 query rows per launch
        ((2, 3, 30, 20), 0, 2),  # rung 0: its 3 x 30 x 20 scores per batch entry count too
    ],
)
def test_forward_splits_into_contiguous_launches(monkeypatch, shape, rung, launches):
    """ops.forward with the 2^31 limit lowered to 3000 elements and a CPU stand-in for the launch: each
    launch gets contiguous views within the limit, and together they write the whole output in place."""
    import contextlib

    limit = 3000
    calls = []

    def fake_run_rung(r, q, k, v, o, scale, causal=False, lse=None):
        assert not causal and lse is None
        assert r.number == rung and all(t.is_contiguous() for t in (q, k, v, o))
        assert max(q.numel(), k.numel(), o.numel()) <= limit
        if r.abi == "unfused":
            assert q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] <= limit
        calls.append(o.data_ptr())
        o.copy_(F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale))

    monkeypatch.setattr(ops._launch, "run_rung", fake_run_rung)
    monkeypatch.setattr(ops, "_device_guard", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(ops, "INT32_LIMIT", limit)
    b, h, sq, sk = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, sq, h, 8, generator=g).to(BF16).transpose(1, 2)  # a BSHD view: copied, then split
    k, v = (torch.randn(b, h, sk, 8, generator=g).to(BF16) for _ in range(2))
    out = ops.forward(q, k, v, 0.3, rung)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.3).to(BF16)
    assert len(calls) == launches and len(set(calls)) == launches
    assert out.is_contiguous() and torch.equal(out, ref)


@pytest.mark.parametrize("rung", [16, 13, 10, 9])
def test_forward_reads_tma_layouts_in_place_on_strided_rungs(monkeypatch, rung):
    """One launch on a rung with the "strided" feature (rungs 10-16): a BSHD view and a fused-QKV slice
    reach the kernel as they are (no copy), an unaligned one is copied; other rungs get contiguous copies."""
    import contextlib

    seen = {}

    def fake_run_rung(r, q, k, v, o, scale, causal=False, lse=None):
        seen.update(q=q, k=k, v=v, o=o)
        o.copy_(F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale))

    monkeypatch.setattr(ops._launch, "run_rung", fake_run_rung)
    monkeypatch.setattr(ops, "_device_guard", lambda index: contextlib.nullcontext())
    g = torch.Generator().manual_seed(1)
    b, s, h, d = 2, 40, 3, 128
    qkv = torch.randn(b, s, 3, h, d, generator=g).to(BF16)
    q = qkv[:, :, 0].transpose(1, 2)  # a slice of a fused QKV buffer: row stride 3·H·D
    k = torch.randn(b, s, h, d, generator=g).to(BF16).transpose(1, 2)  # a BSHD view
    v_buf = torch.randn(b * h * s * d + 1, generator=g).to(BF16)
    v = v_buf[1:].view(b, h, s, d)  # contiguous but 2 bytes off 16-byte alignment: TMA cannot read it
    out = ops.forward(q, k, v, 0.3, rung)
    in_place = "strided" in rungs.BY_NUMBER[rung].features
    assert (seen["q"].data_ptr() == q.data_ptr()) == in_place and (seen["k"] is k) == in_place
    assert all(t.is_contiguous() for t in (seen["q"], seen["k"])) != in_place
    assert seen["v"].data_ptr() != v.data_ptr() and seen["v"].is_contiguous()  # copied either way
    assert seen["o"].is_contiguous()
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.3).to(BF16)
    assert torch.equal(out, ref)


def test_plan_slices_are_contiguous_views():
    q, k = torch.empty(3, 5, 11, 4), torch.empty(3, 5, 2, 4)
    for limit in (40, 100, 300):
        chunks = plan_chunks(3, 5, 11, 2, 4, limit=limit)
        assert len(chunks) > 1
        for c in chunks:
            assert q[c.q_index].is_contiguous() and k[c.kv_index].is_contiguous()


# ---------------------------------------------------------------- strides: what TMA can express


def _layout(t):
    return tuple(t.shape), t.stride(), t.data_ptr()


def test_tma_layout_reason_accepts_views():
    base = torch.empty(2, 33, 4, 128, dtype=BF16)  # (B, S, H, D)
    assert tma_layout_reason(*_layout(base.transpose(1, 2))) is None  # BSHD view as (B, H, S, D)
    qkv = torch.empty(2, 33, 3, 4, 128, dtype=BF16)  # fused QKV projection output
    q = qkv[:, :, 1].transpose(1, 2)
    assert not q.is_contiguous() and tma_layout_reason(*_layout(q)) is None
    assert tma_layout_reason(*_layout(torch.empty(2, 4, 33, 128, dtype=BF16))) is None
    # a size-1 dimension's stride is free
    assert tma_layout_reason((1, 4, 33, 128), (7, 33 * 128, 128, 1), 0) is None
    # an expanded (stride 0) batch passes the rule (the driver's view is probed on the GPU)
    assert tma_layout_reason((3, 4, 33, 128), (0, 33 * 128, 128, 1), 0) is None


@pytest.mark.parametrize(
    "shape,strides,ptr,match",
    [
        ((2, 4, 33, 128), (4 * 33 * 128, 33 * 128, 128, 1), 8, "aligned"),
        ((2, 4, 33, 128), (4 * 33 * 256, 33 * 256, 256, 2), 0, "innermost"),
        ((2, 4, 33, 128), (4 * 33 * 132, 33 * 132, 132, 1), 0, "multiple of 16"),  # rows of 264 bytes
        ((2, 4, 33, 128), (4 * 33 * 128, 33 * 128, -128, 1), 0, "multiple of 16"),
        ((1, 1, 1, 2, 4, 33, 128), (1,) * 7, 0, "rank 7"),
        ((2**33, 128), (128, 1), 0, "outside"),
        ((2, 128), (2**40, 1), 0, "2\\^40"),
    ],
)
def test_tma_layout_reason_refuses(shape, strides, ptr, match):
    assert tma_layout_reason(shape, strides, ptr) is not None
    assert tma_layout_reason(shape, strides, ptr) == tma_layout_reason(list(shape), list(strides), ptr)
    import re

    assert re.search(match, tma_layout_reason(shape, strides, ptr))


def test_needs_copy_today():
    t = torch.empty(2, 4, 33, 128, dtype=BF16)
    assert not needs_copy(t)
    assert needs_copy(torch.empty(2, 33, 4, 128, dtype=BF16).transpose(1, 2))  # a BSHD view: copied today
    assert needs_copy(torch.empty(2 * 4 * 33 * 128 + 1, dtype=BF16)[1:].view(2, 4, 33, 128))  # misaligned
    assert not needs_copy(t[1:])  # a contiguous slice: taken in place
    assert needs_copy(t[:, :, :1])  # rows of several heads, not adjacent
    assert not needs_copy(torch.empty(0, 4, 33, 128, dtype=BF16))
