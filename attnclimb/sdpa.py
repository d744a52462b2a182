"""torch's SDPA signature on the attnclimb kernels: :func:`scaled_dot_product_attention`, a fallback to
torch for what the kernels cannot take (one :class:`~attnclimb.AttnclimbFallbackWarning` per reason), and
:func:`patch_sdpa`, which routes a whole model's ``torch.nn.functional.scaled_dot_product_attention``
calls to it. ``docs/dropin.md`` has the fallback table and the notes on torch.compile, CUDA graphs and
autograd.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings

import torch

from . import ops as _ops
from . import rungs as _rungs
from .errors import AttnclimbFallbackWarning, KernelUnsupportedError
from .support import Unsupported, unsupported_reason

_TORCH_SDPA = _ops._TORCH_SDPA  # torch's own, whatever patch_sdpa has installed since
_TOP = _rungs.TOP.number

_warned: set = set()
_warned_lock = threading.Lock()


def _warn_fallback(key: str, detail: str, message: str) -> None:
    """Warn once per process for each distinct ``(key, detail)``."""
    if (key, detail) in _warned:
        return None
    with _warned_lock:
        if (key, detail) in _warned:
            return None
        _warned.add((key, detail))
    warnings.warn(
        f"attnclimb: {message}; this call and every later one for the same reason run "
        "torch.nn.functional.scaled_dot_product_attention instead (warned once per reason)",
        AttnclimbFallbackWarning,
        stacklevel=3,
    )
    return None


# torch.compile: Dynamo runs a function so marked at trace time (its arguments are constant strings) and
# takes its result (None) as a constant, so the warning is emitted while tracing instead of breaking the
# graph (warnings.warn cannot be traced). The attribute is what torch.compiler.assume_constant_result
# sets; set directly, it saves importing torch._dynamo on import.
_warn_fallback._dynamo_marked_constant = True


def _raise_unsupported(key: str, detail: str, message: str, exc_name: str) -> None:
    """``strict=True``: raise :class:`KernelUnsupportedError` for this reason."""
    exc = TypeError if exc_name == "TypeError" else ValueError
    raise KernelUnsupportedError(Unsupported(key, detail, message, exc))


# Run at trace time under torch.compile, like _warn_fallback: Dynamo cannot trace the raise (with
# fullgraph=True it would report only "observed exception"), so it calls this eagerly and reports the error
# as its own InternalTorchDynamoError (a RuntimeError) whose message starts with ours, with ours as its
# __context__.
_raise_unsupported._dynamo_marked_constant = True


def reset_fallback_warnings() -> None:
    """Forget which fallback reasons were warned about, so the next call for each warns again."""
    with _warned_lock:
        _warned.clear()


def _autocast_reason(query) -> Unsupported | None:
    """Under ``torch.autocast`` on CUDA with another dtype than the inputs', torch's SDPA would run in the
    autocast dtype (it is on autocast's lower-precision list): the call falls back so that the result, and
    its dtype, are torch's. Checked before the fast path, whose key does not hold the autocast state."""
    if torch.is_autocast_enabled("cuda") and isinstance(query, torch.Tensor) and query.device.type == "cuda":
        want = torch.get_autocast_dtype("cuda")
        if want != query.dtype:
            return Unsupported(
                "autocast",
                str(want),
                f"torch.autocast to {want} is active and the inputs are {query.dtype}: torch's SDPA runs the call",
                TypeError,
            )
    return None


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    strict=False,
):
    """``torch.nn.functional.scaled_dot_product_attention`` with its signature and semantics, on the
    attnclimb kernels (the top rung) where they can compute it, and on torch's SDPA where they cannot.

    Args:
        query: ``(B, H, Sq, E)`` tensor.
        key: ``(B, H, Sk, E)`` tensor (``(B, Hkv, Sk, E)`` with ``enable_gqa``).
        value: ``(B, H, Sk, Ev)`` tensor.
        attn_mask, dropout_p, is_causal, scale, enable_gqa: as in torch; ``scale`` defaults to
            ``1/sqrt(E)`` and is in natural-log units (``softmax(scale · Q Kᵀ)``).
        strict: raise :class:`attnclimb.KernelUnsupportedError` instead of falling back.

    The kernels take bf16 or fp16 CUDA tensors (one dtype for all three; fp16 is the top rung's FP16 variant)
    on a Hopper GPU (compute capability 9.0) with ``E = Ev = 128``,
    no mask and ``dropout_p == 0``; ``is_causal=True`` and ``enable_gqa=True`` with K/V heads dividing
    Q's run the top rung's causal and grouped-query variants; any strides (what they cannot read in
    place is copied first), any sizes including 0 (an empty output, or zeros when ``Sk == 0``, as torch
    returns) and tensors of 2^31 elements or more (split into several launches; causal calls over
    batch and heads only). :data:`attnclimb.support.FEATURES` is the table (the top rung's);
    :func:`attnclimb.support.unsupported_reason` decides. Anything else goes to torch's SDPA, with one
    :class:`attnclimb.AttnclimbFallbackWarning` per distinct reason per process (``docs/dropin.md`` lists
    them); torch then raises its own errors for inputs that are invalid rather than unsupported.

    Autograd works: the forward is ours; the backward recomputes through torch's SDPA on the saved
    inputs (see :mod:`attnclimb.ops`). Under ``torch.compile`` the kernel is one opaque operator,
    ``torch.ops.attnclimb.attention_fwd``, and ``fullgraph=True`` holds on the kernel path and on the
    fallback path (the warning is emitted at trace time). The launch can be captured into a CUDA graph.

    Returns:
        ``(B, H, Sq, Ev)`` tensor of ``query``'s dtype on its device; on the kernel path a new contiguous
        tensor.

    Raises:
        KernelUnsupportedError: ``strict=True`` and the kernels cannot take the call (inside
            ``torch.compile``, Dynamo raises it as its own ``InternalTorchDynamoError``, a ``RuntimeError``
            whose message starts with ours, with ours as ``__context__``).
        Whatever torch's SDPA raises, on the fallback path.
        attnclimb.runtime.CompileError: the installed NVRTC rejects a kernel at first use.

    The kernels' ideas: FlashAttention (Dao et al. 2022), FlashAttention-2 and -3; the signature is
    torch's (``torch.nn.functional.scaled_dot_product_attention``).
    """
    fk = None
    autocast = _autocast_reason(query)
    if (
        autocast is None
        and attn_mask is None
        and dropout_p == 0.0
        and type(is_causal) is bool
        and type(enable_gqa) is bool
        and (scale is None or type(scale) is float)
    ):  # a repeated call skips the checks and the planning (attnclimb.ops.fast_call)
        fk = _ops.fast_key(query, key, value, "sdpa", is_causal, scale, enable_gqa, False)
        if fk is not None:
            out = _ops.fast_call(fk, query, key, value)
            if out is not None:
                return out
    why = autocast or unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if why is None:
        s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        return _ops.call(query, key, value, s, _TOP, bool(is_causal), False, fk)
    if strict:
        _raise_unsupported(why.key, why.detail, why.message, why.exc.__name__)
    _warn_fallback(why.key, why.detail, why.message)
    if enable_gqa:  # passed only when set: torch < 2.5 has no such argument
        return _TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=True)
    return _TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)


def scaled_dot_product_attention_lse(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    strict=False,
):
    """:func:`scaled_dot_product_attention` that also returns the log-sum-exp: ``(O, LSE)``, ``LSE`` fp32
    ``(B, H, Sq)``, the natural-log ``logsumexp`` over the keys of each row's scaled scores (after the mask
    and the causal triangle, before dropout), as torch's fused kernels and flash-attn define it.

    On the kernel path the top rung writes the LSE (its ``"lse"`` variant). On the fallback path (one
    :class:`attnclimb.AttnclimbFallbackWarning` per reason, as :func:`scaled_dot_product_attention`) ``O`` is
    torch's SDPA and the LSE is computed in float32 from the scores (which materialises them: the fallback
    is for correctness, not speed). The diffusers backend uses it for ``return_lse=True``. The LSE carries
    no gradient.
    """
    fk = None
    autocast = _autocast_reason(query)
    if (
        autocast is None
        and attn_mask is None
        and dropout_p == 0.0
        and type(is_causal) is bool
        and type(enable_gqa) is bool
        and (scale is None or type(scale) is float)
    ):
        fk = _ops.fast_key(query, key, value, "sdpa", is_causal, scale, enable_gqa, True)
        if fk is not None:
            out = _ops.fast_call(fk, query, key, value)
            if out is not None:
                return out
    why = autocast or unsupported_reason(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse=True
    )
    if why is None:
        s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        return _ops.call(query, key, value, s, _TOP, bool(is_causal), True, fk)
    if strict:
        _raise_unsupported(why.key, why.detail, why.message, why.exc.__name__)
    _warn_fallback(why.key, why.detail, why.message)
    kw = {"scale": scale, "enable_gqa": True} if enable_gqa else {"scale": scale}
    out = _TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, **kw)
    return out, _lse_math(query, key, attn_mask, is_causal, scale)


def _lse_math(query, key, attn_mask, is_causal, scale):
    """float32 ``logsumexp`` of the masked, scaled scores, ``(..., Sq)``: torch SDPA's semantics (a boolean
    mask keeps ``True``, a float mask is added, ``is_causal`` is the top-left lower triangle; K with fewer
    heads than Q is grouped-query attention), without gradient."""
    with torch.no_grad():
        q = query.float()
        k = key.float()
        if k.dim() == q.dim() and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))
        if is_causal:
            keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~keep, -math.inf)
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.float()
        return torch.logsumexp(s, dim=-1)


# patch_sdpa's state: how many contexts are open (process-wide), how many of them are strict, and what
# torch.nn.functional.scaled_dot_product_attention was before the outermost one.
_patch_lock = threading.Lock()
_patch_depth = 0
_strict_depth = 0
_patch_saved = None


def _routed_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """What ``torch.nn.functional.scaled_dot_product_attention`` is while :func:`patch_sdpa` is active."""
    return scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, strict=_strict_depth > 0
    )


@contextlib.contextmanager
def patch_sdpa(*, strict: bool = False):
    """Route every ``torch.nn.functional.scaled_dot_product_attention`` call made inside the ``with``
    block to :func:`attnclimb.scaled_dot_product_attention`, e.g. a whole model's attention::

        with attnclimb.patch_sdpa():
            out = model(x)

    It replaces the module attribute ``torch.nn.functional.scaled_dot_product_attention`` and restores
    what was there when the outermost block exits, also on an exception. Calls that look the function
    up at call time (``F.scaled_dot_product_attention(...)``, as Hugging Face transformers and diffusers'
    native backend do) are routed; a reference bound earlier (``from torch.nn.functional import
    scaled_dot_product_attention``) or ``torch._C._nn.scaled_dot_product_attention`` is not. Fallbacks
    call torch's own SDPA, never the function that was installed before the block.

    Nesting and threads: the blocks nest (a depth count: only the outermost exit restores). The patch is
    process-wide, like the attribute it replaces: while any thread is inside a block, every thread's
    calls are routed, and ``strict=True`` applies to every routed call while any strict block is open.
    Entering and leaving are serialised by a lock, so blocks in several threads may overlap; the original
    comes back when the last one exits. If other code replaces the attribute inside the block, the exit
    leaves its replacement in place and warns. Code compiled with ``torch.compile`` inside the block is
    recompiled outside it (Dynamo guards on the function it traced).

    Args:
        strict: raise :class:`attnclimb.KernelUnsupportedError` instead of falling back to torch's SDPA.
    """
    global _patch_depth, _strict_depth, _patch_saved
    F = torch.nn.functional
    with _patch_lock:
        if _patch_depth == 0:
            _patch_saved = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _routed_sdpa
        _patch_depth += 1
        _strict_depth += bool(strict)
    try:
        yield
    finally:
        with _patch_lock:
            _strict_depth -= bool(strict)
            _patch_depth -= 1
            if _patch_depth == 0:
                if F.scaled_dot_product_attention is _routed_sdpa:
                    F.scaled_dot_product_attention = _patch_saved
                else:
                    warnings.warn(
                        "attnclimb.patch_sdpa: torch.nn.functional.scaled_dot_product_attention was replaced by "
                        "other code inside the block; leaving that replacement in place",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                _patch_saved = None
