"""Issue 9 on a Hopper GPU (skipped otherwise): the SDPA drop-in on its kernel path and its fallbacks,
opcheck, torch.compile(fullgraph=True), CUDA-graph capture and replay, gradients against torch's math
backend, tensors of 2^31+ elements, zero lengths, strided views, streams and threads, diffusers.

Run: python -m pytest -q -m gpu tests/test_dropin_gpu.py
"""

import math
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnclimb
from attnclimb import rungs, sdpa
from attnclimb.reference import attention_exact, lse_exact, rel_l2

pytestmark = pytest.mark.gpu
TOL = 1e-2
GRAD_TOL = 2e-2
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _fresh_warnings():
    sdpa.reset_fallback_warnings()
    yield
    sdpa.reset_fallback_warnings()


def _qkv(b, h, sq, sk, d=128, *, seed=0, dtype=BF16, hk=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hk = h if hk is None else hk
    q = torch.randn(b, h, sq, d, generator=g, device="cuda").to(dtype)
    k = torch.randn(b, hk, sk, d, generator=g, device="cuda").to(dtype)
    v = torch.randn(b, hk, sk, d, generator=g, device="cuda").to(dtype)
    return q, k, v


# ---------------------------------------------------------------- kernel path and fallbacks


@pytest.mark.parametrize("shape", [(2, 4, 257, 300), (1, 2, 1, 1), (3, 5, 1000, 129)], ids=str)
def test_sdpa_kernel_path(shape):
    q, k, v = _qkv(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)
        out = attnclimb.scaled_dot_product_attention(q, k, v, strict=True)
        out_s = attnclimb.scaled_dot_product_attention(q, k, v, scale=0.05)
    assert out.shape == q.shape and out.dtype == BF16 and out.is_contiguous()
    assert rel_l2(out, attention_exact(q, k, v)) < TOL
    assert rel_l2(out_s, attention_exact(q, k, v, 0.05)) < TOL
    assert torch.equal(out, attnclimb.attention(q, k, v))  # the same kernel (the top rung)
    assert rel_l2(out, F.scaled_dot_product_attention(q, k, v).float()) < TOL


def test_sdpa_on_bshd_and_fused_qkv_views():
    b, s, h, d = 2, 333, 4, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(b, s, 3, h, d, generator=g, device="cuda").to(BF16)  # a fused QKV projection's output
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, S, D) views, not contiguous
    assert not q.is_contiguous()
    ref = attnclimb.attention(*(t.contiguous() for t in (q, k, v)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)
        assert torch.equal(attnclimb.scaled_dot_product_attention(q, k, v), ref)
        bshd = x[:, :, 0].contiguous()  # a plain (B, S, H, D) tensor seen as (B, H, S, D)
        assert torch.equal(attnclimb.scaled_dot_product_attention(bshd.transpose(1, 2), k, v), ref)  # same values as q
    assert torch.equal(q, x[:, :, 0].transpose(1, 2))  # inputs untouched


@pytest.mark.parametrize(
    "case,key",
    [
        ("fp32", "dtype"),
        ("head_dim96", "head_dim"),
        ("mask", "attn_mask"),
        ("dropout", "dropout"),
    ],
)
def test_fallbacks_on_gpu(case, key):
    """(Causal and GQA run the top rung's variants since issue 8: tests/test_features_api_gpu.py; fp16 its FP16
    variant: test_sdpa_fp16_runs_on_the_kernel.)"""
    dtype = {"fp16": torch.float16, "fp32": torch.float32}.get(case, BF16)
    d = 96 if case == "head_dim96" else 128  # 64 and 256 run on the kernel since issue 8
    q, k, v = _qkv(2, 4, 100, 120, d, dtype=dtype)
    kw = {
        "mask": {"attn_mask": torch.rand(100, 120, device="cuda") > 0.2},
        "dropout": {"dropout_p": 0.3},
    }.get(case, {})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.manual_seed(7)
        out = attnclimb.scaled_dot_product_attention(q, k, v, **kw)
        torch.manual_seed(7)
        out2 = attnclimb.scaled_dot_product_attention(q, k, v, **kw)
    torch.manual_seed(7)
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    fallbacks = [x for x in w if x.category is attnclimb.AttnclimbFallbackWarning]
    assert len(fallbacks) == 1, [str(x.message) for x in w]  # once, although called twice
    assert torch.equal(out, ref) and torch.equal(out2, ref)
    with pytest.raises(attnclimb.KernelUnsupportedError) as exc:
        attnclimb.scaled_dot_product_attention(q, k, v, **kw, strict=True)
    assert exc.value.reason.key == key


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hk", [4, 1])
def test_sdpa_fp16_runs_on_the_kernel(causal, hk):
    """fp16 Q, K, V run the top rung's FP16 variant (no fallback): fp16 O, fp32 LSE, against float64 and torch's
    own fp16 SDPA; a BSHD view and torch.compile(fullgraph=True) give the same bits."""
    f16 = torch.float16
    q, k, v = _qkv(2, 4, 257, 300, dtype=f16, hk=hk, seed=4)
    gqa = hk != q.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)
        out = attnclimb.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa, strict=True)
        o2, lse = attnclimb.attention(q, k, v, is_causal=causal, return_lse=True)
        view = attnclimb.scaled_dot_product_attention(
            q.transpose(1, 2).contiguous().transpose(1, 2), k, v, is_causal=causal, enable_gqa=gqa
        )
    assert out.dtype == f16 and out.shape == q.shape and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    assert torch.equal(out, o2) and torch.equal(out, view)
    assert rel_l2(out, attention_exact(q, k, v, causal=causal)) < 3e-3
    assert (lse.double() - lse_exact(q, k, causal=causal)).abs().max().item() < 1e-3
    assert rel_l2(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa).float()) < 1e-2
    torch._dynamo.reset()
    f = torch.compile(
        lambda a, b, c: attnclimb.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=gqa),
        fullgraph=True,
    )
    assert torch.equal(f(q, k, v), out)


def test_mixed_dtypes_are_refused_like_torch():
    """q fp16 with bf16 k, v: torch's SDPA raises, and so does the drop-in (its fallback is torch's SDPA);
    strict names the reason, attnclimb.attention raises TypeError."""
    q, _, _ = _qkv(1, 2, 64, 64, dtype=torch.float16)
    _, k, v = _qkv(1, 2, 64, 64)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", attnclimb.AttnclimbFallbackWarning)
        with pytest.raises(RuntimeError):
            attnclimb.scaled_dot_product_attention(q, k, v)
    with pytest.raises(attnclimb.KernelUnsupportedError) as exc:
        attnclimb.scaled_dot_product_attention(q, k, v, strict=True)
    assert exc.value.reason.key == "dtype" and exc.value.reason.detail == "mixed"
    with pytest.raises(TypeError, match="different dtypes"):
        attnclimb.attention(q, k, v)


def test_patch_sdpa_routes_to_the_kernel():
    q, k, v = _qkv(1, 2, 200, 300)
    with attnclimb.patch_sdpa(strict=True):
        out = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(out, attnclimb.attention(q, k, v))


# ---------------------------------------------------------------- torch.library, torch.compile, CUDA graphs


@pytest.mark.parametrize("grad", [False, True])
def test_opcheck(grad):
    q, k, v = _qkv(2, 3, 130, 70, seed=1)
    k = k.transpose(1, 2).contiguous().transpose(1, 2)  # a strided input too
    if grad:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.attnclimb.attention_fwd.default, (q, k, v, 0.1, rungs.TOP.number))


def test_compile_fullgraph_matches_eager():
    """The issue's repro (torch.compile of a function calling attnclimb on (1, 2, 1000, 128) bf16 CUDA
    tensors raised "'torch.Stream' object has no attribute 'cuda_stream'"), plus a module on BSHD views."""
    torch._dynamo.reset()
    q, k, v = _qkv(1, 2, 1000, 1000, seed=2)
    f = torch.compile(lambda a, b, c: attnclimb.attention(a, b, c), fullgraph=True)
    assert torch.equal(f(q, k, v), attnclimb.attention(q, k, v))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(128, 128, device="cuda", dtype=BF16)

        def forward(self, x):  # x: (B, S, H, D)
            qh, kh, vh = (t.transpose(1, 2) for t in (x, x * 0.5, x))
            o = attnclimb.scaled_dot_product_attention(qh, kh, vh, strict=True)
            return self.proj(o.transpose(1, 2))

    m = Block()
    x = torch.randn(2, 300, 4, 128, device="cuda", dtype=BF16)
    with torch.no_grad():
        eager = m(x)
        compiled = torch.compile(m, fullgraph=True)(x)
    # the same attention kernel; inductor may round the Linear's bias add differently (bf16)
    assert rel_l2(compiled, eager) < TOL


def test_compile_backward_matches_eager():
    torch._dynamo.reset()
    q, k, v = (t.requires_grad_() for t in _qkv(1, 3, 200, 250, seed=4))

    def loss(a, b, c):
        return attnclimb.scaled_dot_product_attention(a, b, c).float().square().mean()

    ge = torch.autograd.grad(loss(q, k, v), (q, k, v))
    gc = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(gc, ge):
        assert rel_l2(a, b) < 1e-2


@pytest.mark.parametrize("rung", [rungs.TOP.number, 3, 0])
def test_cuda_graph_capture_and_replay(rung):
    q, k, v = _qkv(2, 3, 300, 200, seed=5)
    qv = torch.empty(2, 300, 3, 128, device="cuda", dtype=BF16).transpose(1, 2)  # a BSHD view: copied in-graph
    qv.copy_(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compiles and loads the rung) outside the capture
        for _ in range(2):
            attnclimb.attention(qv, k, v, rung=rung)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attnclimb.attention(qv, k, v, rung=rung)
    q2, k2, v2 = _qkv(2, 3, 300, 200, seed=6)
    qv.copy_(q2)
    k.copy_(k2)
    v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, attnclimb.attention(q2, k2, v2, rung=rung))
    assert rel_l2(out, attention_exact(q2, k2, v2)) < TOL


def test_cuda_graph_of_the_sdpa_call():
    q, k, v = _qkv(1, 4, 512, 512, seed=8)
    attnclimb.scaled_dot_product_attention(q, k, v)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attnclimb.scaled_dot_product_attention(q, k, v, strict=True)
    for seed in (9, 10):
        for t, n in zip((q, k, v), _qkv(1, 4, 512, 512, seed=seed)):
            t.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, attnclimb.attention(q, k, v))


# ---------------------------------------------------------------- autograd


def _grads(out_fn, inputs, w):
    out = out_fn(*inputs)
    return torch.autograd.grad((out.float() * w).sum(), inputs)


@pytest.mark.parametrize("shape", [(2, 3, 257, 300), (1, 2, 64, 1000)], ids=str)
def test_gradients_match_math_backend(shape):
    q, k, v = (t.requires_grad_() for t in _qkv(*shape, seed=11))
    w = torch.randn(*q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(12))
    ours = _grads(attnclimb.scaled_dot_product_attention, (q, k, v), w)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        ref = _grads(F.scaled_dot_product_attention, (q64, k64, v64), w.double())
    for name, a, b in zip("qkv", ours, ref):
        assert a.dtype == BF16 and torch.isfinite(a).all(), name
        assert rel_l2(a, b) < GRAD_TOL, f"d{name}: {rel_l2(a, b):.3e}"
    # also with attnclimb.attention, for one input only, and with torch's math backend chosen for the recompute
    q.grad = None
    (gq,) = _grads(lambda a: attnclimb.attention(a, k.detach(), v.detach()), (q,), w)
    assert rel_l2(gq, ref[0]) < GRAD_TOL
    with sdpa_kernel(SDPBackend.MATH):
        (gq_math,) = _grads(lambda a: attnclimb.attention(a, k.detach(), v.detach()), (q,), w)
    assert rel_l2(gq_math, ref[0]) < GRAD_TOL


def test_gradients_of_zero_length_keys_are_zero():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 5, 0, seed=13))
    out = attnclimb.scaled_dot_product_attention(q, k, v, strict=True)
    (gq,) = torch.autograd.grad(out.float().sum(), (q,))
    assert (out == 0).all() and (gq == 0).all()


# ---------------------------------------------------------------- sizes


def _check_big(q, k, v, out, slices):
    """Compare ``out`` with torch's SDPA slice by slice: ``slices`` holds (Q/O index, K/V index) pairs."""
    for qi, kvi in slices:
        ref = F.scaled_dot_product_attention(q[qi], k[kvi], v[kvi])
        err = rel_l2(out[qi], ref)
        assert err < TOL, f"slice {qi}: rel L2 {err:.3e}"


@pytest.mark.parametrize(
    "shape,how",
    [
        ((2, 64, 2**17 + 64, 256), "q over 2^31: one launch per batch entry"),
        ((2, 64, 256, 2**17 + 64), "k/v over 2^31: one launch per batch entry"),
        ((1, 160, 2**17, 256), "one batch entry over 2^31: split over heads"),
        ((1, 1, 2**24 + 1000, 64), "one head's q over 2^31: split over query rows"),
    ],
    ids=["batch_q", "batch_kv", "heads", "rows"],
)
def test_tensors_of_2_to_the_31_elements(shape, how):
    b, h, sq, sk = shape
    torch.cuda.empty_cache()
    q, k, v = _qkv(b, h, sq, sk, seed=14)
    assert max(q.numel(), k.numel()) >= 2**31
    out = attnclimb.attention(q, k, v)
    torch.cuda.synchronize()
    every = (slice(None), slice(None))
    if sq > 2**20:  # one head, its rows split near 2^24: the first and last rows and across the split
        rows = [slice(0, 4096), slice(2**24 - 3000, 2**24 + 3000), slice(sq - 5000, sq)]
        slices = [((*every, r), every) for r in rows]
    else:
        slices = [((slice(i, i + 1), slice(j, j + 16)),) * 2 for i in range(b) for j in range(0, h, 16)]
    _check_big(q, k, v, out, slices)
    del q, k, v, out
    torch.cuda.empty_cache()


def test_rung0_scores_over_2_to_the_31_are_split():
    q, k, v = _qkv(1, 8, 4096, 65600, seed=15)  # S = 8 x 4096 x 65600 fp32 > 2^31 elements
    out = attnclimb.attention(q, k, v, rung=0)
    _check_big(q, k, v, out, [((slice(0, 1), slice(j, j + 2)),) * 2 for j in range(0, 8, 2)])
    del q, k, v, out
    torch.cuda.empty_cache()


@pytest.mark.parametrize(
    "qs,ks", [((1, 2, 0, 128), (1, 2, 5, 128)), ((1, 2, 4, 128), (1, 2, 0, 128)), ((0, 2, 4, 128), (0, 2, 5, 128))]
)
def test_zero_lengths_on_the_kernel_path(qs, ks):
    q = torch.randn(*qs, device="cuda", dtype=BF16)
    k, v = (torch.randn(*ks, device="cuda", dtype=BF16) for _ in range(2))
    out = attnclimb.scaled_dot_product_attention(q, k, v, strict=True)
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v)
    ref_cpu = F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu())
    assert out.shape == ref.shape == ref_cpu.shape
    assert torch.equal(out.cpu(), ref_cpu) and torch.equal(out, ref)


# ---------------------------------------------------------------- streams, threads, diffusers


def test_generic_torch_stream_object():
    from attnclimb.runtime.launch import loaded, raw_stream_handle

    cs = torch.cuda.Stream()
    generic = torch.Stream(stream_id=cs.stream_id, device_index=cs.device_index, device_type=cs.device_type)
    assert not hasattr(generic, "cuda_stream") or generic.cuda_stream == cs.cuda_stream
    assert raw_stream_handle(generic) == cs.cuda_stream
    wrapped = loaded(rungs.TOP, torch.cuda.current_device()).stream(generic)
    assert int(wrapped.handle) == cs.cuda_stream
    q, k, v = _qkv(1, 2, 100, 100, seed=16)
    cs.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(cs):
        out = attnclimb.attention(q, k, v)
    cs.synchronize()
    assert rel_l2(out, attention_exact(q, k, v)) < TOL


def test_call_from_a_new_thread():
    q, k, v = _qkv(1, 2, 300, 300, seed=17)
    ref = attnclimb.attention(q, k, v)
    result = {}

    def run():
        try:
            result["out"] = attnclimb.scaled_dot_product_attention(q, k, v, strict=True)
            torch.cuda.synchronize()
        except Exception as exc:  # surfaced below
            result["exc"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert "exc" not in result, result.get("exc")
    assert torch.equal(result["out"], ref)


def test_diffusers_backend_on_the_kernel():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    m = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=128,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        rope_max_seq_len=32,
    )
    m = m.to("cuda", BF16).eval()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, 4, 5, 16, 16, device="cuda", generator=g).to(BF16)
    enc = torch.randn(1, 7, 32, device="cuda", generator=g).to(BF16)
    t = torch.tensor([500], device="cuda")
    with torch.no_grad():
        ref = m(x, t, enc, return_dict=False)[0]
        attnclimb.register_diffusers_backend(strict=True)  # a fallback would raise
        try:
            m.set_attention_backend("attnclimb")
            out = m(x, t, enc, return_dict=False)[0]
        finally:
            m.set_attention_backend("native")
            attnclimb.register_diffusers_backend()
    assert rel_l2(out, ref) < 2 * TOL


def test_scale_default_is_torchs():
    q, k, v = _qkv(1, 1, 64, 64, seed=18)
    a = attnclimb.scaled_dot_product_attention(q, k, v)
    b = attnclimb.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(128))
    assert torch.equal(a, b)
