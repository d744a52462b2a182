"""The kernels as PyTorch operators: ``torch.ops.attnclimb.attention_fwd`` (returns ``O``) and
``torch.ops.attnclimb.attention_fwd_lse`` (returns ``(O, LSE)``), both
``(q, k, v, scale, rung, is_causal=False)``; K/V with fewer heads than Q are grouped-query attention.

Registered with ``torch.library.custom_op`` (PyTorch docs, "Python Custom Operators"), so that
``torch.compile`` sees one opaque operator (no graph break; its ``register_fake`` gives the output's shape,
dtype and strides while tracing), CUDA graphs capture its launches, and autograd differentiates it
through ``register_autograd``. Importing this module registers the operator; ``import attnclimb`` does
not import it (nor torch) until an attention function is first used.

The backward pass recomputes the attention with torch's own SDPA on the saved inputs (with the call's
``is_causal``, and ``enable_gqa`` for fewer K/V heads) and differentiates that (whichever backend torch's
dispatcher picks: cuDNN, flash, memory-efficient or math; ``torch.nn.attention.sdpa_kernel`` applies).
It costs one extra forward pass and never uses our output, so the gradients are those torch's SDPA gives
for the same inputs: the forward is ours, the backward is not yet.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.autograd.forward_ad as _fwAD
from torch import Tensor

from . import rungs as _rungs
from .runtime import launch as _launch
from .runtime.layout import INT32_LIMIT, needs_copy, plan_chunks, tma_layout_reason

# torch's SDPA, captured before anything (attnclimb.patch_sdpa included) can replace the module attribute.
_TORCH_SDPA = torch.nn.functional.scaled_dot_product_attention


def _operand(t: Tensor, in_place: bool = False) -> Tensor:
    """``t`` as the kernels take it: itself when contiguous and 16-byte aligned, else a contiguous copy
    (:func:`attnclimb.runtime.layout.needs_copy` is the rule). With ``in_place`` (a rung with the
    ``"strided"`` feature, one launch) also itself when a TMA tensor map can read it where it lies
    (:func:`attnclimb.runtime.layout.tma_layout_reason`): BSHD views, slices of a fused QKV buffer."""
    if not needs_copy(t):
        return t
    if in_place and tma_layout_reason(tuple(t.shape), t.stride(), t.data_ptr()) is None:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def forward(q: Tensor, k: Tensor, v: Tensor, scale: float, rung: int, is_causal: bool = False, with_lse: bool = False):
    """Launch rung ``rung`` on validated inputs; returns a new contiguous ``(B, H, Sq, Dv)`` tensor, and
    with ``with_lse`` the pair ``(O, LSE)``, ``LSE`` a new contiguous fp32 ``(B, H, Sq)`` tensor.

    Inputs are what :func:`attnclimb.support.unsupported_reason` accepts for the rung (any strides: what
    the kernels cannot read in place is copied; ``k``/``v`` with fewer heads than ``q`` for grouped-query
    attention). Zero sizes never reach a kernel: an empty ``O`` when ``B``, ``H`` or ``Sq`` is 0, zeros (an
    LSE of ``-inf``) when ``Sk`` is 0 (what torch's SDPA returns: a softmax over no keys weighs no values).
    A call whose tensors hold 2^31 elements or more is split over batch, then heads (whole K/V groups),
    then query rows (:func:`attnclimb.runtime.layout.plan_chunks`; never query rows when causal), each
    launch reading and writing contiguous slices in place.

    Host time: a call that launched one planned kernel on its inputs as given is remembered (the key of
    :func:`fast_key`'s kind for this function: Q, K, V, scale, rung, causal, LSE), and a repeat only
    allocates O (and the LSE) and launches (:func:`fast_call`): what the operator and the autograd path run.
    """
    try:
        # fmt: off
        key = (
            "forward",
            q.shape, q.stride(), q.data_ptr(), q.dtype, q.get_device(),
            k.shape, k.stride(), k.data_ptr(), k.dtype, k.get_device(),
            v.shape, v.stride(), v.data_ptr(), v.dtype, v.get_device(),
            is_causal, scale, rung, with_lse,
        )
        # fmt: on
    except Exception:  # nothing to remember it by
        key = None
    else:
        e = _FAST.get(key)
        if e is not None:
            out = _run_fast(e, q, k, v)
            if out is not None:
                _last.plan = e.plan  # for call(), which remembers its own key with it
                return out
    r = _rungs.BY_NUMBER[rung]
    b, h, sq, _ = q.shape
    sk = k.shape[2]
    o = q.new_empty((b, h, sq, v.shape[3]))  # q's dtype and device (torch.empty's keywords cost ~0.3 µs more)
    lse = q.new_empty((b, h, sq), dtype=torch.float32) if with_lse else None
    if b == 0 or h == 0 or sq == 0:
        return (o, lse) if with_lse else o
    if sk == 0:
        if with_lse:
            return o.zero_(), lse.fill_(-math.inf)
        return o.zero_()
    unfused = r.abi == "unfused"
    limit = INT32_LIMIT
    one_launch = o.numel() <= limit and k.numel() <= limit and not (unfused and b * h * sq * sk > limit)
    in_place = one_launch and "strided" in r.features  # read Q, K, V where they lie (O stays contiguous)
    q0, k0, v0 = q, k, v
    q, k, v = _operand(q, in_place), _operand(k, in_place), _operand(v, in_place)
    with _device_guard(q.device.index):
        if one_launch:
            plan = _launch.run_rung(r, q, k, v, o, scale, causal=is_causal, lse=lse)
            if plan is not None and q is q0 and k is k0 and v is v0:  # one planned launch on the inputs as given
                _last.plan = plan
                if key is not None:
                    _remember_fast(key, plan, o, rung, scale, is_causal)
        else:
            chunks = plan_chunks(
                b, h, sq, sk, q.shape[3], heads_kv=k.shape[1], causal=is_causal, score_workspace=unfused, limit=limit
            )
            for c in chunks:
                qi, kvi = c.q_index, c.kv_index
                part = None if lse is None else lse[qi]
                _launch.run_rung(r, q[qi], k[kvi], v[kvi], o[qi], scale, causal=is_causal, lse=part)
    return (o, lse) if with_lse else o


def _device_guard(index: int):
    """``torch.cuda.device(index)`` when it is not the current device already (entering it costs a few
    microseconds), else a no-op context."""
    return torch.cuda.device(index) if index != torch.cuda.current_device() else _NULL_GUARD


class _NullGuard:
    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NULL_GUARD = _NullGuard()


@torch.library.custom_op("attnclimb::attention_fwd", mutates_args=(), device_types="cuda")
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, scale: float, rung: int, is_causal: bool = False) -> Tensor:
    """``softmax(scale · q kᵀ) v`` on rung ``rung`` of the ladder (no mask, no dropout).

    ``q`` ``(B, H, Sq, 128)``, ``k``/``v`` ``(B, H_kv, Sk, 128)`` bf16 (top rung: or fp16) CUDA tensors on a
    Hopper GPU, any strides (``H_kv`` a divisor of ``H``: grouped-query attention); ``scale`` in natural-log
    units; ``is_causal``: torch's top-left-aligned causal mask. Returns a new contiguous ``(B, H, Sq, 128)``
    tensor of ``q``'s dtype. It does not validate: call it through :func:`attnclimb.attention` or
    :func:`attnclimb.scaled_dot_product_attention`, which check the inputs (and the rung's variants) first.
    """
    return forward(q, k, v, scale, rung, is_causal)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, scale, rung, is_causal=False):
    # Same shape, dtype and (contiguous) strides as the real output.
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


@torch.library.custom_op("attnclimb::attention_fwd_lse", mutates_args=(), device_types="cuda")
def attention_fwd_lse(
    q: Tensor, k: Tensor, v: Tensor, scale: float, rung: int, is_causal: bool = False
) -> tuple[Tensor, Tensor]:
    """:func:`attention_fwd` that also returns the log-sum-exp: ``(O, LSE)``, ``LSE`` a new contiguous fp32
    ``(B, H, Sq)`` tensor, ``ln Σ_j exp(scale · q_i·k_j)`` over the keys row ``i`` sees (natural log, as
    torch's and flash-attn's kernels define it; ``-inf`` when there are no keys). Needs a rung with the
    ``"lse"`` variant (the top rung). The LSE carries no gradient (marked non-differentiable)."""
    return forward(q, k, v, scale, rung, is_causal, with_lse=True)


@attention_fwd_lse.register_fake
def _attention_fwd_lse_fake(q, k, v, scale, rung, is_causal=False):
    o = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
    return o, q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    q, k, v, scale, _rung, *rest = inputs
    ctx.save_for_backward(q, k, v)
    ctx.scale = scale
    ctx.is_causal = bool(rest[0]) if rest else False
    if isinstance(output, tuple):  # attention_fwd_lse: the LSE has no gradient
        ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, *_grad_lse):
    """Gradients of ``softmax(scale·q kᵀ) v`` through torch's SDPA, recomputed on the saved inputs with the
    call's ``is_causal`` (and ``enable_gqa`` when K/V have fewer heads than Q; torch's math backend
    supports both in the backward, and so do its flash, memory-efficient and cuDNN backends on CUDA as far
    as they take the shape). The LSE output of :func:`attention_fwd_lse` is non-differentiable: its
    gradient (always zeros) is ignored.

    With ``create_graph=True`` (autograd records the backward) it differentiates through the saved
    inputs themselves, so the gradients it returns carry their own graph back to them and double backward
    is right, as far as the SDPA backend torch picks supports it (the math backend does; the fused ones
    raise). Otherwise it works on detached copies: a small graph of its own, freed on return.
    """
    q, k, v = ctx.saved_tensors
    needs = ctx.needs_input_grad[:3]
    n_rest = len(ctx.needs_input_grad) - 3  # scale, rung (, is_causal)
    if q.numel() == 0 or k.numel() == 0:  # no keys, or nothing to attend: the output is constant (zeros)
        return (*(torch.zeros_like(t) if n else None for t, n in zip((q, k, v), needs)), *([None] * n_rest))
    create_graph = torch.is_grad_enabled()
    if not create_graph:
        q, k, v = (t.detach().requires_grad_(n) for t, n in zip((q, k, v), needs))
    kw = {"scale": ctx.scale, "is_causal": ctx.is_causal}
    if k.shape[1] != q.shape[1]:  # passed only when set: torch < 2.5 has no such argument
        kw["enable_gqa"] = True
    with torch.enable_grad():
        out = _TORCH_SDPA(q, k, v, **kw)
    wanted = [t for t, n in zip((q, k, v), needs) if n]
    grads = iter(torch.autograd.grad(out, wanted, grad_out, create_graph=create_graph)) if wanted else iter(())
    gq, gk, gv = (next(grads) if n else None for n in needs)
    return (gq, gk, gv, *([None] * n_rest))


attention_fwd.register_autograd(_backward, setup_context=_setup_context)
attention_fwd_lse.register_autograd(_backward, setup_context=_setup_context)

_PLAIN = torch.Tensor


def _dispatch_mode_active() -> bool:
    return torch._C._len_torch_dispatch_stack() > 0


def direct_call_ok(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether :func:`call` may skip the operator's dispatch and run :func:`forward` directly: eager mode
    (not inside ``torch.compile`` tracing), plain tensors (not FakeTensors or other subclasses), no input
    that needs a gradient, no ``TorchDispatchMode`` active (which should see the operator) and no forward-mode
    AD level open (whose tangents the direct path would drop)."""
    return (
        not torch.compiler.is_compiling()
        and type(q) is _PLAIN
        and type(k) is _PLAIN
        and type(v) is _PLAIN
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        and not _dispatch_mode_active()
        and _fwAD._current_level < 0  # forward-mode AD: the operator sees the dual tensors (and refuses them)
    )


def call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    rung: int,
    is_causal: bool = False,
    return_lse: bool = False,
    fast_key: tuple | None = None,
):
    """Run the forward on validated inputs: straight to :func:`forward` when :func:`direct_call_ok`,
    else through the operator ``torch.ops.attnclimb.attention_fwd`` (``attention_fwd_lse`` with
    ``return_lse``, which returns ``(O, LSE)``).

    The operator's dispatch (its autograd wrapper, the Python kernel lookup) costs several microseconds a
    call; when nothing can observe the difference, the call skips it and runs the same function the
    operator runs. ``fast_key``: the call's :func:`fast_key` (its caller validated the call): when the
    direct path launched one planned kernel on the inputs as given, the key is remembered for
    :func:`fast_call`.
    """
    if direct_call_ok(q, k, v):
        if fast_key is None:
            return forward(q, k, v, scale, rung, is_causal, return_lse)
        _last.plan = None
        out = forward(q, k, v, scale, rung, is_causal, return_lse)
        plan, _last.plan = _last.plan, None
        if plan is not None:
            _remember_fast(fast_key, plan, out[0] if return_lse else out, rung, scale, is_causal)
        return out
    if return_lse:
        return attention_fwd_lse(q, k, v, scale, rung, is_causal)
    return attention_fwd(q, k, v, scale, rung, is_causal)


# ---------------------------------------------------------------- the fast path of a repeated call
#
# A call the public entry points (scaled_dot_product_attention, its _lse form, attention) validated and
# launched once, as one planned kernel on the inputs as given, is remembered under its fast_key: the entry
# point, the shape, strides, address, dtype and device of Q, K and V, and the call's flags and scale. Those
# determine everything the support check reads (with the exact types the key demands: plain tensors, bool
# flags, a float or None scale) and everything the launch plan depends on, so a repeated call with the
# same key skips both and only allocates O (and the LSE), checks the device and launches
# (runtime.launch.launch_plan). The key is built only where the direct path would run (eager, plain
# tensors, no input needing a gradient, no TorchDispatchMode): everything else takes the full path.

_last = threading.local()  # forward's plan, when it launched one planned kernel on the inputs as given
_FAST: dict = {}
_FAST_SIZE = 256
_fast_lock = threading.Lock()


def fast_key(q, k, v, entry: str, is_causal, scale, flag, with_lse: bool) -> tuple | None:
    """The key of a call for :func:`fast_call`, or ``None`` when the call must take the full path
    (compiling, tensor subclasses, autograd, a dispatch mode, something unreadable: a sparse or nested
    tensor's strides). ``entry`` names the caller, whose checks the key stands for; ``flag`` is its own
    extra argument (``enable_gqa``, the rung). The caller passes only bools for the flags and ``None`` or a
    float for ``scale`` (``True == 1 == 1.0`` as keys)."""
    if (
        torch.compiler.is_compiling()
        or type(q) is not _PLAIN
        or type(k) is not _PLAIN
        or type(v) is not _PLAIN
        or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        or torch._C._len_torch_dispatch_stack()
        or _fwAD._current_level >= 0
    ):
        return None
    try:
        # fmt: off
        return (
            entry,
            q.shape, q.stride(), q.data_ptr(), q.dtype, q.get_device(),
            k.shape, k.stride(), k.data_ptr(), k.dtype, k.get_device(),
            v.shape, v.stride(), v.data_ptr(), v.dtype, v.get_device(),
            is_causal, scale, flag, with_lse,
        )
        # fmt: on
    except Exception:
        return None


class _Fast:
    """A remembered call: its launch plan, O's (and the LSE's) shape, O's alignment as planned, the
    device, and what :func:`attnclimb.runtime.launch.run_rung` needs if O's alignment ever differs."""

    __slots__ = ("causal", "dev", "lse_shape", "o_mod", "o_shape", "plan", "rung", "scale")

    def __init__(self, plan, o: Tensor, rung: int, scale: float, causal: bool, with_lse: bool):
        self.plan, self.rung, self.scale, self.causal = plan, _rungs.BY_NUMBER[rung], scale, causal
        self.dev = plan.lr.device_index
        self.o_shape = tuple(o.shape)
        self.o_mod = o.data_ptr() & 15
        self.lse_shape = self.o_shape[:3] if with_lse else None


def _remember_fast(key: tuple, plan, o: Tensor, rung: int, scale: float, causal: bool) -> None:
    entry = _Fast(plan, o, rung, scale, causal, key[-1])
    with _fast_lock:
        if len(_FAST) >= _FAST_SIZE:
            _FAST.pop(next(iter(_FAST)))  # the oldest first
        _FAST[key] = entry


def fast_call(key: tuple, q: Tensor, k: Tensor, v: Tensor):
    """The result of a remembered call (what :func:`call` returns), or ``None`` when ``key`` was not
    remembered or torch's current device is not the call's (the full path then switches devices)."""
    e = _FAST.get(key)
    return None if e is None else _run_fast(e, q, k, v)


def _run_fast(e: _Fast, q: Tensor, k: Tensor, v: Tensor):
    """Run the remembered call ``e`` on ``q``, ``k``, ``v`` (those of its key); ``None`` when torch's current
    device is not the call's."""
    if torch._C._cuda_getDevice() != e.dev:
        return None
    o = q.new_empty(e.o_shape)
    lse = None if e.lse_shape is None else q.new_empty(e.lse_shape, dtype=torch.float32)
    o_ptr = o.data_ptr()
    if o_ptr & 15 == e.o_mod:
        _launch.launch_plan(e.plan, e.dev, o_ptr, 0 if lse is None else lse.data_ptr())
    else:  # never seen from torch's allocators (aligned blocks); planned afresh as the full path would
        _launch.run_rung(e.rung, q, k, v, o, e.scale, causal=e.causal, lse=lse)
    return o if lse is None else (o, lse)
