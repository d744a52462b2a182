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
    with pytest.raises(ValueError, match="log-sum-exp"):
        fn(q, k, k, return_lse=True)
    with pytest.raises(ValueError, match="context parallel"):
        fn(q, k, k, _parallel_config=object())


def test_dispatch_attention_fn_reaches_the_backend():
    attnclimb.register_diffusers_backend()
    q = torch.randn(1, 4, 2, 128, dtype=torch.bfloat16)
    with pytest.warns(attnclimb.AttnclimbFallbackWarning, match="cpu"):
        out = ad.dispatch_attention_fn(q, q, q, backend=ad.AttentionBackendName("attnclimb"))
    ref = ad.dispatch_attention_fn(q, q, q, backend=ad.AttentionBackendName.NATIVE)
    assert torch.equal(out, ref)
