"""The public entry point: :func:`attention`, a drop-in for non-causal
``torch.nn.functional.scaled_dot_product_attention`` on Hopper GPUs."""

from __future__ import annotations

import math
import numbers

from . import rungs as _rungs

SUPPORTED_HEAD_DIMS = (_rungs.HEAD_DIM,)
_INT32_MAX = 2**31 - 1
# The kernels multiply the scale by log2(e) in fp32: it must stay finite there.
_MAX_ABS_SCALE = 3.4028234663852886e38 / 1.4426950408889634


def _hopper_check(device=None) -> tuple:
    """``(ok, reason)``: whether a Hopper GPU (compute capability 9.0) is usable; never raises."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False, "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return False, "no CUDA GPU is visible (torch.cuda.is_available() is False)"
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            return False, f"{dev} is not a CUDA device"
        cap = torch.cuda.get_device_capability(dev)
        if cap != (9, 0):
            name = torch.cuda.get_device_name(dev)
            return False, f"{name} has compute capability {cap[0]}.{cap[1]}; attnclimb needs Hopper (9.0: H100/H200)"
    except Exception as exc:  # an invalid device index, a broken driver, ...
        return False, f"cannot query CUDA device {device!r}: {exc}"
    return True, ""


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


def _validate(q, k, v, scale, rung):
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided or t.is_nested:
            raise ValueError(
                f"{name} has layout {'nested' if t.is_nested else t.layout}; attnclimb supports dense "
                "(torch.strided) tensors only"
            )
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} has dtype {t.dtype}; attnclimb supports torch.bfloat16 only")
        if t.dim() != 4:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} (rank {t.dim()}); expected rank 4: (batch, heads, seqlen, head_dim)"
            )
        if t.shape[-1] not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"{name} has head_dim {t.shape[-1]}; supported head_dim: {SUPPORTED_HEAD_DIMS}")
    if q.shape[0] != k.shape[0] or q.shape[0] != v.shape[0]:
        raise ValueError(f"batch mismatch: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if q.shape[1] != k.shape[1] or q.shape[1] != v.shape[1]:
        raise ValueError(
            f"heads mismatch: q {q.shape[1]}, k {k.shape[1]}, v {v.shape[1]} (grouped-query attention is not supported)"
        )
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k has seqlen_k {k.shape[2]} but v has {v.shape[2]}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if 0 in t.shape:
            raise ValueError(f"{name} has an empty dimension: shape {tuple(t.shape)}; every size must be >= 1")
        if t.numel() > _INT32_MAX:
            raise ValueError(
                f"{name} has {t.numel()} elements; the kernels use 32-bit index math and support at most "
                f"{_INT32_MAX} elements per tensor — split the batch"
            )
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
        try:
            f = float(scale)
        except OverflowError:
            f = math.inf
        if not (math.isfinite(f) and abs(f) <= _MAX_ABS_SCALE):
            raise ValueError(f"scale must be finite and at most {_MAX_ABS_SCALE:.3g} in magnitude (fp32), got {scale}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError(
            "attnclimb computes the forward pass only and would silently drop gradients, but an input requires "
            "grad; call it under torch.no_grad() or pass .detach()ed tensors"
        )
    rung_obj = _rungs.get(rung)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; attnclimb runs on a CUDA (Hopper) device")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    why = hopper_unavailable_reason(q.device)
    if why is not None:
        raise ValueError(f"cannot run attnclimb kernels: {why}")
    if rung_obj.abi == "unfused":
        need = 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
        free, _ = torch.cuda.mem_get_info(q.device)
        free += torch.cuda.memory_reserved(q.device) - torch.cuda.memory_allocated(q.device)
        if need > free:
            raise ValueError(
                f"rung 0 (unfused) would materialise S = QK^T in fp32: {need / 2**30:.2f} GiB for "
                f"batch*heads={q.shape[0] * q.shape[1]}, seqlen_q={q.shape[2]}, seqlen_k={k.shape[2]}, but only "
                f"{free / 2**30:.2f} GiB are free; use a fused rung (1+)"
            )
    return rung_obj


def attention(q, k, v, *, scale=None, rung=None):
    """Exact (non-causal) scaled dot-product attention, ``softmax(scale · Q Kᵀ) V``, on a Hopper GPU.

    Args:
        q: ``(batch, heads, seqlen_q, head_dim)`` bf16 CUDA tensor.
        k: ``(batch, heads, seqlen_k, head_dim)`` bf16 CUDA tensor, same device, batch and heads as ``q``.
        v: ``(batch, heads, seqlen_k, head_dim)`` bf16 CUDA tensor.
        scale: softmax scale (natural-log units); default ``1/sqrt(head_dim)`` as in
            ``torch.nn.functional.scaled_dot_product_attention``.
        rung: which kernel of the ladder to run (``0`` … top); ``None`` picks the top (fastest) rung.

    Any ``seqlen_q >= 1`` and ``seqlen_k >= 1`` are supported, equal or not; ``head_dim`` must be 128.
    Non-contiguous inputs are copied to contiguous memory first. The kernel runs on the current
    torch CUDA stream; the call is asynchronous like any torch op.

    The first call of a rung compiles it (NVRTC, about a second, then cached on disk): it may raise
    :class:`attnclimb.runtime.CompileError` if the installed NVRTC rejects a kernel. There is no
    backward pass (see ``ValueError`` below).

    Returns:
        ``O``: ``(batch, heads, seqlen_q, head_dim)`` bf16, contiguous, on ``q``'s device.

    Raises:
        TypeError: an input is not a tensor or not bf16; ``scale``/``rung`` of the wrong type.
        ValueError: a sparse or nested tensor; an input that requires grad while autograd is on (this is a
            forward-only kernel); wrong rank, head_dim, device or GPU (not Hopper); mismatched batch/heads/seqlen_k;
            an empty dimension; a tensor of 2^31 elements or more (32-bit index math); an unknown rung;
            rung 0 when its fp32 ``S`` would not fit in free GPU memory; a non-finite ``scale`` or one whose
            magnitude overflows fp32 once multiplied by log2(e).

    The ideas come from FlashAttention (Dao et al. 2022, Sec. 3.1: tiling + online softmax),
    FlashAttention-2 (Sec. 3) and FlashAttention-3 (Sec. 3); each rung's page in ``docs/rungs/`` cites its own.
    """
    import torch

    r = _validate(q, k, v, scale, rung)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    # The kernels use 16-byte vector loads and TMA, which need 16-byte aligned bases: a contiguous view
    # with an odd storage offset is copied.
    q, k, v = (
        t.contiguous() if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format) for t in (q, k, v)
    )
    o = torch.empty_like(q)
    from .runtime.launch import run_rung

    with torch.cuda.device(q.device):
        run_rung(r, q, k, v, o, scale)
    return o
