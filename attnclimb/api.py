"""The kernel entry point :func:`attention` (strict: it raises on what the kernels cannot take) and the
GPU checks. :func:`attnclimb.scaled_dot_product_attention` (``attnclimb/sdpa.py``) is the drop-in for
``torch.nn.functional.scaled_dot_product_attention``, with torch's signature and a fallback."""

from __future__ import annotations

import math

import torch

from . import ops as _ops
from . import rungs as _rungs
from .ops import call as _call
from .support import FEATURES, FEATURES_BY_RUNG, device_reason, unsupported_reason

SUPPORTED_HEAD_DIMS = tuple(sorted(FEATURES.head_dims))


def _hopper_check(device=None) -> tuple:
    """``(ok, reason)``: whether a Hopper GPU (compute capability 9.0) is usable; never raises.

    The answer for a device index is asked once and remembered (:func:`attnclimb.support.device_reason`).
    """
    try:
        if not torch.cuda.is_available():
            return False, "no CUDA GPU is visible (torch.cuda.is_available() is False)"
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            return False, f"{dev} is not a CUDA device"
        index = torch.cuda.current_device() if dev.index is None else dev.index
    except Exception as exc:  # an invalid device string, a broken driver, ...
        return False, f"cannot query CUDA device {device!r}: {exc}"
    why = device_reason(index)
    return (False, why) if why is not None else (True, "")


def hopper_available(device=None) -> bool:
    """``True`` when a Hopper GPU (compute capability 9.0) is usable by this process. Never raises.

    ``device`` defaults to torch's current CUDA device. :func:`hopper_unavailable_reason` says why not.
    """
    return _hopper_check(device)[0]


def hopper_unavailable_reason(device=None) -> str | None:
    """Why :func:`hopper_available` is ``False``, as one line (e.g. no GPU visible, or its compute
    capability); ``None`` when a Hopper GPU is usable. Never raises."""
    ok, why = _hopper_check(device)
    return None if ok else why


def _unfused_memory_check(q, k):
    """Rung 0 materialises S = QKᵀ in fp32 (one launch's worth at a time): refuse when it cannot fit."""
    bhsq = q.shape[0] * q.shape[1] * q.shape[2]
    need = 4 * min(bhsq * k.shape[2], 2**31 - 1)
    # Only what the driver reports free: memory cached by torch's allocator may be split into blocks that
    # cannot hold S (the H200 run that added this line had 2.6 GiB cached, 6 GiB free, and an 8 GiB S).
    free, _ = torch.cuda.mem_get_info(q.device)
    if need > free:
        raise ValueError(
            f"rung 0 (unfused) would materialise S = QK^T in fp32: {need / 2**30:.2f} GiB for "
            f"batch*heads={q.shape[0] * q.shape[1]}, seqlen_q={q.shape[2]}, seqlen_k={k.shape[2]}, but only "
            f"{free / 2**30:.2f} GiB are free; use a fused rung (1+)"
        )


def attention(q, k, v, *, scale=None, rung=None, is_causal=False, return_lse=False):
    """Exact scaled dot-product attention, ``softmax(scale · Q Kᵀ) V``, on a Hopper GPU.

    Args:
        q: ``(batch, heads, seqlen_q, head_dim)`` bf16 CUDA tensor (or fp16 on the top rung: its FP16 variant).
        k: ``(batch, heads_kv, seqlen_k, head_dim)`` bf16 CUDA tensor, same device and batch as ``q``;
            ``heads_kv`` is ``heads``, or a divisor of it for grouped-query attention (query head ``h``
            reads K/V head ``h // (heads // heads_kv)``; top rung only).
        v: ``(batch, heads_kv, seqlen_k, head_dim)`` bf16 CUDA tensor. ``q``, ``k``, ``v`` share one dtype.
        scale: softmax scale (natural-log units); default ``1/sqrt(head_dim)`` as in
            ``torch.nn.functional.scaled_dot_product_attention``.
        rung: which kernel of the ladder to run (``0`` … top); ``None`` picks the top (fastest) rung.
        is_causal: torch SDPA's ``is_causal=True`` mask, top-left aligned (query row ``i`` sees keys
            ``0..i``, for any ``seqlen_q`` and ``seqlen_k``); rungs 10 and up (the top rung among them).
        return_lse: also return the natural-log log-sum-exp of each row's scaled scores; rungs 10 and up.

    ``head_dim`` must be 128, or 64 or 256 on rungs 10 and up (``Rung.head_dims``). Causal masking,
    grouped-query attention, the LSE and head_dim 64/256 are compile-time variants of the top rung and of every
    rung from 10 up (issue 8), each with tiles of its own (``Rung.head_dims``); the top rung's: head_dim 128 two
    consumer warpgroups of 64 query rows and 128-key K/V tiles (non-causal calls with 6 144 keys or more: three
    warpgroups and 80-key tiles, ``Rung.long_kv``), 64 three warpgroups (192-row tiles) and 128-key tiles (fp16:
    two warpgroups), 256 two warpgroups and 64-key tiles (the rungs below it: ``attnclimb/rungs.py``). Rungs 0-9
    compute the plain head_dim-128 case only and raise
    ``ValueError`` for the others. Any sizes work, 0 included: an empty output when batch, heads or
    ``seqlen_q`` is 0, zeros (and an LSE of ``-inf``) when ``seqlen_k`` is 0 (what torch's SDPA returns).
    Tensors of 2^31 elements or more are split into several launches over batch, heads (whole K/V groups)
    and query rows (the kernels' offsets are 32-bit); only one head's K or V of 2^31 elements or more is
    refused, and with ``is_causal`` one head's Q as well (a causal call is never split over query rows).
    Inputs with other strides or an odd alignment are copied to contiguous memory first. The kernel runs
    on the current torch CUDA stream; the call is asynchronous like any torch op, and can be captured into
    a CUDA graph once a first call has compiled the rung (each variant compiles at its first use).

    Autograd: inputs may require grad. The forward is this kernel; the backward recomputes the attention
    with torch's SDPA on the saved inputs (with ``is_causal`` and ``enable_gqa`` as the call had them) and
    differentiates that (``attnclimb/ops.py``). The LSE carries no gradient (as the LSE of torch's and
    flash-attn's kernels). Under ``torch.compile`` the call is the operator
    ``torch.ops.attnclimb.attention_fwd`` (``attention_fwd_lse`` with ``return_lse``; no graph break).

    The first call of a rung compiles it (NVRTC, about a second, then cached on disk): it may raise
    :class:`attnclimb.runtime.CompileError` if the installed NVRTC rejects a kernel.

    Returns:
        ``O``: ``(batch, heads, seqlen_q, head_dim)`` of ``q``'s dtype, contiguous, on ``q``'s device; with
        ``return_lse`` the pair ``(O, LSE)``, ``LSE`` ``(batch, heads, seqlen_q)`` fp32, contiguous.

    Raises:
        TypeError: an input is not a tensor or not bf16 (fp16 too on the top rung), or the dtypes differ;
            ``scale``/``rung``/``is_causal``/``return_lse`` of the wrong type.
        ValueError: a sparse or nested tensor, or a tensor subclass; wrong rank, head_dim, device or GPU
            (not Hopper); mismatched batch/heads/seqlen_k; ``is_causal``, fewer K/V heads or
            ``return_lse`` on a rung without that variant (all but the top rung); one head's K/V (causal:
            or Q) of 2^31 elements or more; an unknown rung; rung 0 when its fp32 ``S`` would not fit in
            free GPU memory; a non-finite ``scale`` or one whose magnitude overflows fp32 once multiplied
            by log2(e).

    :func:`attnclimb.scaled_dot_product_attention` takes torch's full SDPA signature and falls back to
    torch instead of raising. The ideas come from FlashAttention (Dao et al. 2022, Sec. 3.1: tiling +
    online softmax), FlashAttention-2 (Sec. 3) and FlashAttention-3 (Sec. 3); each rung's page in
    ``docs/rungs/`` cites its own.
    """
    fk = None
    if type(is_causal) is bool and type(return_lse) is bool and (scale is None or type(scale) is float):
        if rung is None or type(rung) is int:  # a repeated call skips the checks (attnclimb.ops.fast_call)
            fk = _ops.fast_key(q, k, v, "attention", is_causal, scale, rung, return_lse)
            if fk is not None:
                out = _ops.fast_call(fk, q, k, v)
                if out is not None:
                    return out
    r = _rungs.get(rung)
    for name, flag in (("is_causal", is_causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    why = unsupported_reason(
        q,
        k,
        v,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=True,
        features=FEATURES_BY_RUNG[r.number],
        return_lse=return_lse,
    )
    if why is not None:
        raise why.exc(why.message)
    if r.abi == "unfused" and not torch.cuda.is_current_stream_capturing():
        _unfused_memory_check(q, k)  # advisory; skipped while a CUDA graph is captured
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if fk is None:
        return _call(q, k, v, s, r.number, is_causal, return_lse)
    return _call(q, k, v, s, r.number, is_causal, return_lse, fk)
