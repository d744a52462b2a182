"""Can the kernels take this call? One table of what they support (:data:`BASE`, completed per rung by the
rung's compile-time variants ``Rung.features``: :func:`features_of`, :data:`FEATURES_BY_RUNG`) and one
function that says why not (:func:`unsupported_reason`), shared by :func:`attnclimb.attention` (which
raises the reason), :func:`attnclimb.scaled_dot_product_attention` (which falls back to torch's SDPA with
a warning, or raises with ``strict=True``) and the diffusers backend.

What every rung computes is :data:`BASE`; a rung whose ``features`` name ``"causal"``, ``"gqa"`` or
``"lse"`` (rungs 10 to 16, the top rung; issue 8) also takes ``is_causal=True``, fewer K/V heads and the
log-sum-exp output.
:data:`FEATURES` is the top rung's table, the one ``scaled_dot_product_attention`` runs. A kernel feature
of a later issue (another dtype, another GPU generation) slots in by editing :data:`BASE` or a
rung's ``features``, once the launch path can run it: every caller and every fallback message follows.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import threading
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import rungs as _rungs
from .runtime.layout import INT32_LIMIT, query_rows_fit

# The kernels multiply the scale by log2(e) in fp32: it must stay finite there.
MAX_ABS_SCALE = 3.4028234663852886e38 / 1.4426950408889634


@dataclass(frozen=True)
class KernelFeatures:
    """What the kernels of the ladder can compute.

    Attributes:
        dtypes: element types of Q, K, V (all three the same; O has the same type).
        head_dims: supported ``head_dim`` (the last dimension of Q and K).
        value_head_dim_may_differ: whether V's last dimension may differ from Q's (torch allows it).
        attn_mask: an ``attn_mask`` tensor (boolean or additive).
        dropout: ``dropout_p > 0``.
        causal: ``is_causal=True`` (torch's convention: the upper-left-aligned lower triangle).
        gqa: ``enable_gqa=True`` with fewer K/V heads than Q heads (a divisor of them).
        lse: the log-sum-exp output (``attnclimb.attention(..., return_lse=True)``).
        compute_capabilities: GPUs the kernels are built for, as ``(major, minor)``.
        name: who the table describes, in messages (``"rung 3 (cp_async)"``).
    """

    dtypes: frozenset
    head_dims: frozenset
    value_head_dim_may_differ: bool = False
    attn_mask: bool = False
    dropout: bool = False
    causal: bool = False
    gqa: bool = False
    lse: bool = False
    compute_capabilities: frozenset = frozenset({(9, 0)})
    name: str = "the kernels"


#: What every rung of the ladder computes. Edit it when a kernel feature lands on every rung.
BASE = KernelFeatures(dtypes=frozenset({torch.bfloat16}), head_dims=frozenset({128}))


def features_of(rung) -> KernelFeatures:
    """:data:`BASE` with the compile-time variants of ``rung`` (``Rung.features``: ``"causal"``, ``"gqa"``,
    ``"lse"``, ``"fp16"`` (fp16 among the dtypes); ``Rung.head_dims``), named after the rung for the messages.
    (``"strided"``, reading non-contiguous tensors in place, changes no support: the drop-in layer copies what
    it does not use it for.)"""
    f = rung.features
    name = f"rung {rung.number} ({rung.name})"
    head_dims = frozenset({rung.head_dim, *rung.head_dims})  # the head_dim variants (Rung.head_dims)
    dtypes = BASE.dtypes | {torch.float16} if "fp16" in f else BASE.dtypes  # the FP16 variant
    return dataclasses.replace(
        BASE, causal="causal" in f, gqa="gqa" in f, lse="lse" in f, head_dims=head_dims, dtypes=dtypes, name=name
    )


#: The table of each rung, by number (derived: edit :data:`BASE` or ``Rung.features``).
FEATURES_BY_RUNG = {r.number: features_of(r) for r in _rungs.RUNGS}
#: The top rung's table: what :func:`attnclimb.scaled_dot_product_attention` runs on the kernels.
FEATURES = FEATURES_BY_RUNG[_rungs.TOP.number]


def _who_has(feature: str) -> str:
    """Which rungs have ``feature``, for a message: ``"rung 16 has it"``, ``"rungs 15, 16 have it"``."""
    have = [f"{r.number}" for r in _rungs.RUNGS if feature in r.features]
    if not have:
        return "no rung has it yet"
    return f"{'rung' if len(have) == 1 else 'rungs'} {', '.join(have)} {'has' if len(have) == 1 else 'have'} it"


class Unsupported(NamedTuple):
    """Why the kernels cannot take a call.

    Attributes:
        key: the category: ``"type"``, ``"layout"``, ``"subclass"``, ``"attn_mask"``, ``"dropout"``,
            ``"is_causal"``, ``"rank"``, ``"dtype"``, ``"head_dim"``, ``"shape"``, ``"gqa"``, ``"scale"``,
            ``"device"``, ``"gpu"`` or ``"size"``; ``attnclimb.sdpa`` adds ``"autocast"`` (``docs/dropin.md`` has
            the table).
        detail: the value that decided it (``"torch.float16"``, ``"64"``, ``"cpu"``, ...), or ``""``;
            one fallback warning is emitted per distinct ``(key, detail)``.
        message: one sentence for a person.
        exc: the exception type :func:`attnclimb.attention` raises for it (``TypeError`` or ``ValueError``).
    """

    key: str
    detail: str
    message: str
    exc: type


_MISSING = object()
_DEVICE_REASONS: dict = {}


def _query_device(index: int) -> str | None:
    try:
        if not torch.cuda.is_available():
            return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
        cap = torch.cuda.get_device_capability(index)
        if tuple(cap) not in FEATURES.compute_capabilities:
            name = torch.cuda.get_device_name(index)
            return f"{name} has compute capability {cap[0]}.{cap[1]}; attnclimb needs Hopper (9.0: H100/H200)"
    except Exception as exc:  # an invalid device index, a broken driver, ...
        return f"cannot query CUDA device {index!r}: {exc}"
    return None


def device_reason(index: int) -> str | None:
    """Why CUDA device ``index`` cannot run the kernels (``None`` when it can); asked once per device and
    remembered (a device's compute capability does not change while the process runs). Never raises."""
    why = _DEVICE_REASONS.get(index, _MISSING)
    if why is _MISSING:
        why = _query_device(index)
        _DEVICE_REASONS[index] = why
    return why


# torch.compile: Dynamo calls a function so marked once at trace time (its arguments are constants here)
# and uses the result as a constant, instead of tracing torch.cuda's device queries. This is the attribute
# torch.compiler.assume_constant_result sets; set directly, it saves importing torch._dynamo (~1 s) here.
device_reason._dynamo_marked_constant = True


def _plain_tensor_types() -> frozenset:
    types = {torch.Tensor, torch.nn.Parameter}
    try:  # the tensors torch's own tracing (FakeTensorMode, functionalization) hands to Python code
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor

        types |= {FakeTensor, FunctionalTensor}
    except ImportError:  # pragma: no cover - both exist in every supported torch
        pass
    return frozenset(types)


_PLAIN_TYPES = _plain_tensor_types()
_STRIDED = torch.strided


def _scale_reason(scale) -> Unsupported | None:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        msg = f"scale must be a real number or None, got {type(scale).__name__}"
        return Unsupported("scale", "", msg, TypeError)
    try:
        f = float(scale)
    except OverflowError:
        f = math.inf
    if not (math.isfinite(f) and abs(f) <= MAX_ABS_SCALE):
        msg = f"scale must be finite and at most {MAX_ABS_SCALE:.3g} in magnitude (fp32), got {scale}"
        return Unsupported("scale", "", msg, ValueError)
    return None


def unsupported_reason(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    features: KernelFeatures = FEATURES,
    return_lse: bool = False,
) -> Unsupported | None:
    """Why the kernels cannot compute ``torch.nn.functional.scaled_dot_product_attention`` of these
    arguments (the first reason found), or ``None`` when they can. Never raises; cheap (attribute reads).

    The arguments are SDPA's: ``query`` ``(B, H, Sq, E)``, ``key`` ``(B, H, Sk, E)``, ``value``
    ``(B, H, Sk, Ev)`` tensors (``(B, H_kv, Sk, ·)`` with ``enable_gqa``); ``attn_mask``, ``dropout_p``,
    ``is_causal``, ``scale``, ``enable_gqa`` as in torch. ``features``: the table of the rung that would run
    (default the top rung's, :data:`FEATURES`; :data:`FEATURES_BY_RUNG` has each rung's). ``return_lse``: the
    caller also wants the log-sum-exp (the ``"return_lse"`` feature).

    Checked in this order: the features (mask, dropout, causal, LSE); for Q, K, V in turn their type,
    layout (sparse, nested), tensor subclass, rank, dtype and head_dim; equal dtypes and head_dims; shapes
    (batch, heads, seqlen_k of K vs V; fewer K/V heads, a divisor of Q's, with ``enable_gqa`` is the
    ``"gqa"`` feature); scale; device; GPU generation; size (one head's K or V must hold fewer than 2^31
    elements: the kernels' offsets are 32-bit and a head's keys cannot be split across launches, while
    batch, heads and query rows can, see :func:`attnclimb.runtime.layout.plan_chunks`; a causal call
    cannot be split over query rows either, so one head's Q must hold fewer than 2^31 elements too).

    Sizes of zero (empty batch, heads or sequences) are supported: they never reach a kernel.

    Host time: with the top rung's table (the default), no mask and no dropout, a call whose signature
    (:func:`_signature`: types, layouts, shapes, dtypes and devices of Q, K, V; causal, scale, GQA, LSE) passed
    every check but the GPU's before skips them; the GPU check (:func:`device_reason`) runs on every call.
    """
    sig = None
    if features is FEATURES and attn_mask is None and dropout_p == 0.0 and not torch.compiler.is_compiling():
        sig, seen = _signature(query, key, value, is_causal, scale, enable_gqa, return_lse)
        if seen:
            return _gpu_reason(query.device.index)
    why = _first_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, features, return_lse)
    if why is None and sig is not None:
        with _valid_lock:
            if len(_VALID) >= _VALID_SIZE:
                _VALID.pop(next(iter(_VALID)))  # the oldest first (dicts keep insertion order)
            _VALID[sig] = True
    return why


# Signatures of calls that passed every check but the GPU's (FEATURES, no mask, no dropout), oldest first.
_VALID: dict = {}
_VALID_SIZE = 256
_valid_lock = threading.Lock()


def _signature(query, key, value, is_causal, scale, enable_gqa, return_lse) -> tuple:
    """``(signature, seen)``: everything :func:`_first_reason` reads of a call without mask or dropout, as a
    hashable key (the type, layout, nestedness, shape, dtype and device of Q, K and V, not their strides or
    addresses: any are supported; the truth of ``is_causal``, ``enable_gqa`` and ``return_lse``; ``scale``),
    and whether it is in :data:`_VALID`. ``(None, False)`` for a ``scale`` other than ``None`` or a float, or
    when a part cannot be read or hashed (not a tensor, a nested tensor's sizes, symbolic sizes): the full
    check decides those."""
    if scale is not None and type(scale) is not float:
        return None, False
    try:
        # fmt: off
        sig = (
            type(query), query.layout, query.is_nested, query.shape, query.dtype, query.device,
            type(key), key.layout, key.is_nested, key.shape, key.dtype, key.device,
            type(value), value.layout, value.is_nested, value.shape, value.dtype, value.device,
            bool(is_causal),
            scale,
            bool(enable_gqa),
            bool(return_lse),
        )
        # fmt: on
        return sig, sig in _VALID
    except Exception:
        return None, False


def _gpu_reason(index) -> Unsupported | None:
    """The ``"gpu"`` reason of CUDA device ``index`` (``None`` when it runs the kernels)."""
    why = device_reason(index)
    if why is not None:
        return Unsupported("gpu", why, f"cannot run attnclimb kernels: {why}", ValueError)
    return None


def _first_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, features, return_lse):
    """:func:`unsupported_reason`'s checks, in its order, without the cache."""
    if attn_mask is not None and not features.attn_mask:
        return Unsupported("attn_mask", "", "an attn_mask is not supported by the kernels", ValueError)
    if dropout_p != 0.0 and not features.dropout:
        return Unsupported("dropout", "", f"dropout_p={dropout_p} is not supported (only 0.0)", ValueError)
    if is_causal and not features.causal:
        msg = f"is_causal=True is not supported by {features.name} ({_who_has('causal')})"
        return Unsupported("is_causal", "", msg, ValueError)
    if return_lse and not features.lse:
        msg = f"return_lse=True (the log-sum-exp output) is not supported by {features.name} ({_who_has('lse')})"
        return Unsupported("return_lse", "", msg, ValueError)
    # One pass per tensor (this runs on every call: attribute reads only).
    for name, t in (("q", query), ("k", key), ("v", value)):
        if not isinstance(t, torch.Tensor):
            msg = f"{name} must be a torch.Tensor, got {type(t).__name__}"
            return Unsupported("type", type(t).__name__, msg, TypeError)
        if t.layout is not _STRIDED or t.is_nested:
            layout = "nested" if t.is_nested else str(t.layout)
            msg = f"{name} has layout {layout}; attnclimb supports dense (torch.strided) tensors only"
            return Unsupported("layout", layout, msg, ValueError)
        if type(t) not in _PLAIN_TYPES:
            tname = type(t).__name__
            msg = f"{name} is a {tname}, a tensor subclass; attnclimb runs on plain tensors only"
            return Unsupported("subclass", tname, msg, ValueError)
        shape = t.shape
        if len(shape) != 4:
            msg = f"{name} has shape {tuple(shape)} (rank {len(shape)}); expected rank 4: (batch, heads, seqlen, dim)"
            return Unsupported("rank", str(len(shape)), msg, ValueError)
        if t.dtype not in features.dtypes:
            allowed = " or ".join(sorted(str(d) for d in features.dtypes))
            msg = f"{name} has dtype {t.dtype}; attnclimb supports {allowed} only"
            return Unsupported("dtype", str(t.dtype), msg, TypeError)
        if shape[3] not in features.head_dims:
            msg = f"{name} has head_dim {shape[3]}; supported head_dim: {tuple(sorted(features.head_dims))}"
            return Unsupported("head_dim", str(shape[3]), msg, ValueError)
    qs, ks, vs = query.shape, key.shape, value.shape
    if not (query.dtype == key.dtype == value.dtype):
        msg = f"q, k, v have different dtypes: {query.dtype}, {key.dtype}, {value.dtype}"
        return Unsupported("dtype", "mixed", msg, TypeError)
    if qs[3] != ks[3] or (vs[3] != qs[3] and not features.value_head_dim_may_differ):
        msg = f"head_dim differs: q {qs[3]}, k {ks[3]}, v {vs[3]}"
        return Unsupported("head_dim", "mixed", msg, ValueError)
    b, h = qs[0], qs[1]
    if ks[0] != b or vs[0] != b:
        msg = f"batch mismatch: q {b}, k {ks[0]}, v {vs[0]}"
        return Unsupported("shape", "", msg, ValueError)
    hk = ks[1]
    if hk != h or vs[1] != h:
        if enable_gqa and hk == vs[1] and hk > 0 and h % hk == 0:
            if not features.gqa:
                msg = (
                    f"grouped-query attention ({h} query heads, {hk} key/value heads) is not supported by "
                    f"{features.name} ({_who_has('gqa')})"
                )
                return Unsupported("gqa", "", msg, ValueError)
        else:
            need = "enable_gqa=True and " if not enable_gqa and hk == vs[1] and hk > 0 and h % hk == 0 else ""
            msg = (
                f"heads mismatch: q {h}, k {hk}, v {vs[1]} (grouped-query attention needs {need}K and V with "
                "the same number of heads, a divisor of Q's)"
            )
            return Unsupported("shape", "", msg, ValueError)
    if ks[2] != vs[2]:
        msg = f"k has seqlen_k {ks[2]} but v has {vs[2]}"
        return Unsupported("shape", "", msg, ValueError)
    if scale is not None:
        why = _scale_reason(scale)
        if why is not None:
            return why
    dev = query.device
    if dev.type != "cuda":
        return Unsupported("device", dev.type, f"q is on {dev}; attnclimb runs on a CUDA (Hopper) device", ValueError)
    kdev, vdev = key.device, value.device
    if kdev != dev or vdev != dev:
        for name, d in (("k", kdev), ("v", vdev)):
            if d.type != "cuda":
                msg = f"{name} is on {d}; attnclimb runs on a CUDA (Hopper) device"
                return Unsupported("device", d.type, msg, ValueError)
        msg = f"q, k, v are on different devices: {dev}, {kdev}, {vdev}"
        return Unsupported("device", "mixed", msg, ValueError)
    why = _gpu_reason(dev.index)
    if why is not None:
        return why
    per_head = ks[2] * ks[3]  # V has the same (checked above)
    if per_head > INT32_LIMIT:
        msg = (
            f"k and v hold {per_head} elements per head (seqlen_k {ks[2]}); the kernels use 32-bit "
            f"index math, and one head's keys cannot be split across launches (at most {INT32_LIMIT})"
        )
        return Unsupported("size", "", msg, ValueError)
    if is_causal and not query_rows_fit(qs[2], max(qs[3], vs[3])):
        msg = (
            f"q holds {qs[2] * qs[3]} elements per head (seqlen_q {qs[2]}); a causal call cannot be split over "
            f"query rows (the kernels anchor the diagonal at a launch's first row), so one head's queries must "
            f"fit the kernels' 32-bit index math (at most {INT32_LIMIT} elements)"
        )
        return Unsupported("size", "causal", msg, ValueError)
    return None
