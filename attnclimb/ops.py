"""The kernels as a PyTorch operator: ``torch.ops.attnclimb.attention_fwd``.

Registered with ``torch.library.custom_op`` (PyTorch docs, "Python Custom Operators"), so that
``torch.compile`` sees one opaque operator (no graph break; its ``register_fake`` gives the output's shape,
dtype and strides while tracing), CUDA graphs capture its launches, and autograd differentiates it
through ``register_autograd``. Importing this module registers the operator; ``import attnclimb`` does
not import it (nor torch) until an attention function is first used.

The backward pass recomputes the attention with torch's own SDPA on the saved inputs and
differentiates that (whichever backend torch's dispatcher picks: cuDNN, flash, memory-efficient or math;
``torch.nn.attention.sdpa_kernel`` applies). It costs one extra forward pass and never uses our output,
so the gradients are those torch's SDPA gives for the same inputs: the forward is ours, the backward is
not yet.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import rungs as _rungs
from .runtime import launch as _launch
from .runtime.layout import INT32_LIMIT, needs_copy, plan_chunks

# torch's SDPA, captured before anything (attnclimb.patch_sdpa included) can replace the module attribute.
_TORCH_SDPA = torch.nn.functional.scaled_dot_product_attention


def _operand(t: Tensor) -> Tensor:
    """``t`` as the kernels take it: itself when contiguous and 16-byte aligned, else a contiguous copy
    (:func:`attnclimb.runtime.layout.needs_copy` is the rule)."""
    if needs_copy(t):
        return t.clone(memory_format=torch.contiguous_format)
    return t


def forward(q: Tensor, k: Tensor, v: Tensor, scale: float, rung: int) -> Tensor:
    """Launch rung ``rung`` on validated inputs; returns a new contiguous ``(B, H, Sq, Dv)`` tensor.

    Inputs are what :func:`attnclimb.support.unsupported_reason` accepts (any strides: what the kernels
    cannot read in place is copied). Zero sizes never reach a kernel: an empty ``O`` when ``B``, ``H``
    or ``Sq`` is 0, zeros when ``Sk`` is 0 (what torch's SDPA returns: a softmax over no keys weighs no
    values). A call whose tensors hold 2^31 elements or more is split over batch, then heads, then query
    rows (:func:`attnclimb.runtime.layout.plan_chunks`), each launch reading and writing contiguous
    slices in place.
    """
    r = _rungs.BY_NUMBER[rung]
    b, h, sq, _ = q.shape
    sk = k.shape[2]
    o = torch.empty((b, h, sq, v.shape[3]), dtype=q.dtype, device=q.device)
    if b == 0 or h == 0 or sq == 0:
        return o
    if sk == 0:
        return o.zero_()
    q, k, v = _operand(q), _operand(k), _operand(v)
    unfused = r.abi == "unfused"
    limit = INT32_LIMIT
    with _device_guard(q.device.index):
        if o.numel() <= limit and k.numel() <= limit and not (unfused and b * h * sq * sk > limit):
            _launch.run_rung(r, q, k, v, o, scale)
            return o
        for c in plan_chunks(b, h, sq, sk, q.shape[3], score_workspace=unfused, limit=limit):
            qi, kvi = c.q_index, c.kv_index
            _launch.run_rung(r, q[qi], k[kvi], v[kvi], o[qi], scale)
    return o


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
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, scale: float, rung: int) -> Tensor:
    """``softmax(scale · q kᵀ) v`` on rung ``rung`` of the ladder (non-causal, no mask, no dropout).

    ``q`` ``(B, H, Sq, 128)``, ``k``/``v`` ``(B, H, Sk, 128)`` bf16 CUDA tensors on a Hopper GPU, any
    strides; ``scale`` in natural-log units; returns a new contiguous ``(B, H, Sq, 128)`` bf16 tensor.
    It does not validate: call it through :func:`attnclimb.attention` or
    :func:`attnclimb.scaled_dot_product_attention`, which check the inputs first.
    """
    return forward(q, k, v, scale, rung)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, scale, rung):
    # Same shape, dtype and (contiguous) strides as the real output.
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def _setup_context(ctx, inputs, output):
    q, k, v, scale, _rung = inputs
    ctx.save_for_backward(q, k, v)
    ctx.scale = scale


def _backward(ctx, grad_out):
    """Gradients of ``softmax(scale·q kᵀ) v`` through torch's SDPA, recomputed on the saved inputs.

    With ``create_graph=True`` (autograd records the backward) it differentiates through the saved
    inputs themselves, so the gradients it returns carry their own graph back to them and double backward
    is right, as far as the SDPA backend torch picks supports it (the math backend does; the fused ones
    raise). Otherwise it works on detached copies: a small graph of its own, freed on return.
    """
    q, k, v = ctx.saved_tensors
    needs = ctx.needs_input_grad[:3]
    if q.numel() == 0 or k.numel() == 0:  # no keys, or nothing to attend: the output is constant (zeros)
        return (*(torch.zeros_like(t) if n else None for t, n in zip((q, k, v), needs)), None, None)
    create_graph = torch.is_grad_enabled()
    if not create_graph:
        q, k, v = (t.detach().requires_grad_(n) for t, n in zip((q, k, v), needs))
    with torch.enable_grad():
        out = _TORCH_SDPA(q, k, v, scale=ctx.scale)
    wanted = [t for t, n in zip((q, k, v), needs) if n]
    grads = iter(torch.autograd.grad(out, wanted, grad_out, create_graph=create_graph)) if wanted else iter(())
    gq, gk, gv = (next(grads) if n else None for n in needs)
    return gq, gk, gv, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)

_PLAIN = torch.Tensor


def _dispatch_mode_active() -> bool:
    return torch._C._len_torch_dispatch_stack() > 0


def direct_call_ok(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether :func:`call` may skip the operator's dispatch and run :func:`forward` directly: eager mode
    (not inside ``torch.compile`` tracing), plain tensors (not FakeTensors or other subclasses), no input
    that needs a gradient, and no ``TorchDispatchMode`` active (which should see the operator)."""
    return (
        not torch.compiler.is_compiling()
        and type(q) is _PLAIN
        and type(k) is _PLAIN
        and type(v) is _PLAIN
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        and not _dispatch_mode_active()
    )


def call(q: Tensor, k: Tensor, v: Tensor, scale: float, rung: int) -> Tensor:
    """Run the forward on validated inputs: straight to :func:`forward` when :func:`direct_call_ok`,
    else through the operator ``torch.ops.attnclimb.attention_fwd``.

    The operator's dispatch (its autograd wrapper, the Python kernel lookup) costs several microseconds a
    call; when nothing can observe the difference, the call skips it and runs the same function the
    operator runs.
    """
    if direct_call_ok(q, k, v):
        return forward(q, k, v, scale, rung)
    return attention_fwd(q, k, v, scale, rung)
