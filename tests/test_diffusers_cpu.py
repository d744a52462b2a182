"""The diffusers attention backend on the CPU (the fallback path), with a tiny WanTransformer3DModel.
Skipped when diffusers is not installed (it is the optional `video` extra; the `test` extra installs it)."""

import warnings

import pytest
import torch

import attnclimb
from attnclimb import sdpa

diffusers = pytest.importorskip("diffusers")
ad = pytest.importorskip("diffusers.models.attention_dispatch")


@pytest.fixture(autouse=True)
def _fresh_warnings():
    sdpa.reset_fallback_warnings()
    yield
    sdpa.reset_fallback_warnings()


def _tiny_wan(dtype=torch.float32):
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
    return m.to(dtype).eval()


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 3, 8, 8, generator=g).to(dtype)
    enc = torch.randn(1, 7, 32, generator=g).to(dtype)
    return x, torch.tensor([500]), enc


def test_register_is_idempotent_and_visible():
    member = attnclimb.register_diffusers_backend()
    assert attnclimb.register_diffusers_backend() is member
    assert member == "attnclimb" and ad.AttentionBackendName("attnclimb") is member
    assert "ATTNCLIMB" in ad.AttentionBackendName.__members__ and member in list(ad.AttentionBackendName)
    assert member in ad._AttentionBackendRegistry._backends
    assert {
        "query",
        "key",
        "value",
        "attn_mask",
        "scale",
        "enable_gqa",
    } <= ad._AttentionBackendRegistry._supported_arg_names[member]
    # diffusers' enable_parallelism accepts the backend (0.42 has context parallelism)
    assert ad._AttentionBackendRegistry._is_context_parallel_available(member)


def test_wan_model_on_the_backend_matches_native_and_passes_views(monkeypatch):
    """set_attention_backend("attnclimb") calls our SDPA on transposed views of diffusers' BSHD tensors
    (no copies), falls back on the CPU with one warning, and gives the native backend's output exactly."""
    m = _tiny_wan()
    x, t, enc = _inputs()
    with torch.no_grad():
        ref = m(x, t, enc, return_dict=False)[0]
    attnclimb.register_diffusers_backend()
    calls = []
    real = sdpa.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((tuple(q.shape), q.stride(), q.is_contiguous(), kwargs.get("strict")))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(sdpa, "scaled_dot_product_attention", spy)
    m.set_attention_backend("attnclimb")
    try:
        with warnings.catch_warnings(record=True) as w, torch.no_grad():
            warnings.simplefilter("always")
            out = m(x, t, enc, return_dict=False)[0]
    finally:
        m.set_attention_backend("native")
    assert torch.equal(out, ref)
    assert len(calls) == 4  # 2 layers x (self-attention, cross-attention)
    shape, stride, contiguous, strict = calls[0]
    b, h, s, d = shape
    assert (b, h, d) == (1, 2, 128) and stride == (s * h * d, d, h * d, 1) and not contiguous  # a BSHD view
    assert strict is False
    fallbacks = [x for x in w if x.category is attnclimb.AttnclimbFallbackWarning]
    assert len(fallbacks) == 1 and "float32" in str(fallbacks[0].message)


def test_backend_strict_and_masks():
    attnclimb.register_diffusers_backend(strict=True)
    try:
        fn = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName("attnclimb")]
        q = torch.randn(2, 5, 3, 128)  # (B, S, H, D)
        with pytest.raises(attnclimb.KernelUnsupportedError):
            fn(q, q, q)
    finally:
        attnclimb.register_diffusers_backend()
    fn = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName("attnclimb")]
    q, k = torch.randn(2, 5, 3, 128), torch.randn(2, 6, 3, 128)
    mask = torch.rand(2, 6) > 0.3  # (batch, seq_k) key padding, as diffusers' backends accept
    mask[:, 0] = True
    with pytest.warns(attnclimb.AttnclimbFallbackWarning):
        out = fn(q, k, k, attn_mask=mask)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), attn_mask=mask[:, None, None, :]
    ).transpose(1, 2)
    assert out.shape == (2, 5, 3, 128) and torch.equal(out, ref)
    with pytest.raises(ValueError, match="context parallel"):  # a config without context_parallel_config
        fn(q, k, k, _parallel_config=object())


@pytest.mark.parametrize("causal", [False, True])
def test_backend_return_lse_in_diffusers_layout(causal):
    """return_lse=True, the argument diffusers' backends take (its _native_cudnn backend returns
    (out, lse) with lse in the model layout (B, S, H)): ours does the same, here on the fallback path
    (float32 on the CPU), with torch's SDPA output and the LSE of torch's fused CPU kernel, GQA included."""
    attnclimb.register_diffusers_backend()
    fn = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName("attnclimb")]
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 5, 4, 128, generator=g), torch.randn(2, 6, 2, 128, generator=g), None
    v = torch.randn(2, 6, 2, 128, generator=g)
    with pytest.warns(attnclimb.AttnclimbFallbackWarning):
        out, lse = fn(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    plain = fn(q, k, v, is_causal=causal, enable_gqa=True)
    assert out.shape == (2, 5, 4, 128) and torch.equal(out, plain)
    assert lse.shape == (2, 5, 4) and lse.dtype == torch.float32
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2)))
    ref = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qt, kt, vt, is_causal=causal)[1]
    torch.testing.assert_close(lse, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_dispatch_passes_is_causal_and_enable_gqa(monkeypatch):
    """diffusers' dispatcher hands is_causal and enable_gqa to the backend, which hands them to
    attnclimb.scaled_dot_product_attention (the top rung's causal and GQA variants run them on a Hopper
    GPU); on the CPU the result is the native backend's."""
    attnclimb.register_diffusers_backend()
    seen = []
    real = sdpa.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(args[5:8])  # is_causal, scale, enable_gqa
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa, "scaled_dot_product_attention", spy)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 7, 4, 128, generator=g, dtype=torch.bfloat16)
    kv = torch.randn(1, 7, 2, 128, generator=g, dtype=torch.bfloat16)
    with pytest.warns(attnclimb.AttnclimbFallbackWarning, match="cpu"):
        out = ad.dispatch_attention_fn(
            q, kv, kv, is_causal=True, enable_gqa=True, backend=ad.AttentionBackendName("attnclimb")
        )
    ref = ad.dispatch_attention_fn(q, kv, kv, is_causal=True, enable_gqa=True, backend=ad.AttentionBackendName.NATIVE)
    assert seen == [(True, None, True)] and torch.equal(out, ref)


def test_dispatch_attention_fn_reaches_the_backend():
    attnclimb.register_diffusers_backend()
    q = torch.randn(1, 4, 2, 128, dtype=torch.bfloat16)
    with pytest.warns(attnclimb.AttnclimbFallbackWarning, match="cpu"):
        out = ad.dispatch_attention_fn(q, q, q, backend=ad.AttentionBackendName("attnclimb"))
    ref = ad.dispatch_attention_fn(q, q, q, backend=ad.AttentionBackendName.NATIVE)
    assert torch.equal(out, ref)


def test_cp_forward_op_is_the_backend_in_diffusers_forward_op_contract():
    """The local attention handed to diffusers' ring/Ulysses: BSHD in, BSHD out, and with return_lse the
    LSE in (B, S, H) (what the ring merges with); the backward slot raises."""
    from attnclimb.integrations import diffusers as integ

    op = integ._cp_forward_op(strict=False)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 5, 3, 16, generator=g), torch.randn(2, 7, 3, 16, generator=g)
    with pytest.warns(attnclimb.AttnclimbFallbackWarning):
        out, lse = op(None, q, k, k, None, 0.0, False, None, False, True, _save_ctx=True, _parallel_config=None)
    plain = op(None, q, k, k, return_lse=False)
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, k))).transpose(1, 2)
    assert out.shape == (2, 5, 3, 16) and lse.shape == (2, 5, 3) and torch.equal(plain, out)
    torch.testing.assert_close(out, ref)
    ref_lse = torch.logsumexp(q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / 4.0, dim=-1).transpose(1, 2)
    torch.testing.assert_close(lse, ref_lse)
    with pytest.raises(NotImplementedError, match="forward only"):
        integ._cp_backward_op(None, out)
    assert integ.context_parallel_supported()


@pytest.mark.timeout(300)
def test_diffusers_context_parallelism_runs_our_backend_over_gloo(tmp_path):
    """diffusers' own ring (ring_degree=3) and Ulysses (ulysses_degree=3) attention on the attnclimb
    backend, in 3 spawned processes over gloo: each rank's output and LSE equal float64 attention of the
    whole sequence on its shard, and the local attention that ran was ours (tests/cp_workers.py)."""
    import cp_workers

    results = cp_workers.spawn_cases(3, list(cp_workers.DIFFUSERS_CASES), tmp_path)
    failed = [f"{case}, rank {r}:\n{res}" for case, per in results.items() for r, res in enumerate(per) if res != "ok"]
    assert not failed, "\n".join(failed)
