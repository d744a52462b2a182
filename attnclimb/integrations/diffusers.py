"""A diffusers attention backend named ``"attnclimb"``::

    import attnclimb
    attnclimb.register_diffusers_backend()
    pipe.transformer.set_attention_backend("attnclimb")   # any diffusers ModelMixin

diffusers (0.35 and newer; written against 0.42) picks a model's attention function from a registry keyed
by the enum ``diffusers.models.attention_dispatch.AttentionBackendName``. Neither has a public way to add
a backend, so :func:`register_diffusers_backend` adds a member to the enum and registers the function
with ``_AttentionBackendRegistry.register``, the decorator diffusers uses for its own backends. Both are
private diffusers API: the function checks that they look as expected and raises ``RuntimeError`` (not
a silent misregistration) when a diffusers release changes them. diffusers is an optional dependency
(the ``video`` extra); nothing here is imported by ``import attnclimb``.

Without the registry, ``attnclimb.patch_sdpa()`` around a model on diffusers' default ``"native"`` backend
routes its ``F.scaled_dot_product_attention`` calls to attnclimb as well.

Context parallelism, where diffusers has it (0.42 does, 0.35 does not): the backend is registered with
``supports_context_parallel=True``, so ``model.enable_parallelism(config=ContextParallelConfig(ring_degree=N))``
(or ``ulysses_degree=N``) works on it: diffusers' own ring and Ulysses attention
(``_templated_context_parallel_attention``, private diffusers API like the registry) run, with our kernel
and its LSE as the local attention (:func:`_cp_forward_op`). Forward only: the backward op raises.
``docs/distributed.md`` compares that with :mod:`attnclimb.distributed`.
"""

from __future__ import annotations

import inspect
import threading

BACKEND_NAME = "attnclimb"
_lock = threading.Lock()


def _backend(strict: bool):
    def attnclimb_attention(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
        _parallel_config=None,
    ):
        """diffusers' backend call: ``query`` ``(B, Sq, H, E)``, ``key``/``value`` ``(B, Sk, H_kv, E)`` (BSHD,
        diffusers' layout); returns ``(B, Sq, H, Ev)``, and with ``return_lse`` the pair ``(out, lse)``,
        ``lse`` ``(B, Sq, H)`` fp32 (the layout diffusers' own backends return it in). Runs
        :func:`attnclimb.scaled_dot_product_attention` (``scaled_dot_product_attention_lse`` with
        ``return_lse``) on ``(B, H, S, E)`` views (``transpose(1, 2)``: no copy made here) and returns views
        of its outputs in BSHD. ``is_causal`` and ``enable_gqa`` pass through: the top rung's causal and
        grouped-query variants run them.

        A ``(B, Sk)`` mask (a key-padding mask, which diffusers' backends accept) is viewed as
        ``(B, 1, 1, Sk)`` for SDPA's broadcasting; any mask means torch's SDPA does the work.

        With ``_parallel_config`` (a diffusers ``ParallelConfig`` whose ``context_parallel_config`` is set, as
        ``model.enable_parallelism`` passes it) the call goes to diffusers' ring or Ulysses attention with
        :func:`_cp_forward_op` as the local attention: ``query``/``key``/``value`` are then this rank's
        sequence shards, and so is the output.

        Raises:
            ValueError: ``_parallel_config`` without a ``context_parallel_config``; what diffusers' context
                parallelism refuses (0.42: ``is_causal``, ``enable_gqa``).
            RuntimeError: context parallelism on a diffusers without ``_templated_context_parallel_attention``.
        """
        if _parallel_config is not None:
            return _context_parallel(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale,
                enable_gqa,
                return_lse,
                strict,
                _parallel_config,
            )
        if attn_mask is not None and attn_mask.dim() == 2 and tuple(attn_mask.shape) == (query.shape[0], key.shape[1]):
            attn_mask = attn_mask[:, None, None, :]
        return _bshd_call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, strict)

    return attnclimb_attention


def _bshd_call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, strict):
    """:func:`attnclimb.scaled_dot_product_attention` (with ``return_lse``, the LSE form) on diffusers' BSHD
    tensors, through ``transpose(1, 2)`` views (no copy); returns ``out`` ``(B, Sq, H, D)`` and, with
    ``return_lse``, ``(out, lse)`` with ``lse`` ``(B, Sq, H)``."""
    from .. import sdpa as _sdpa

    fn = _sdpa.scaled_dot_product_attention_lse if return_lse else _sdpa.scaled_dot_product_attention
    out = fn(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        strict=strict,
    )
    if return_lse:
        out, lse = out
        return out.transpose(1, 2), lse.transpose(1, 2)
    return out.transpose(1, 2)


def _cp_forward_op(strict: bool):
    """The local attention diffusers' context parallelism calls (its ``forward_op`` contract, 0.42):
    ``op(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, _save_ctx,
    _parallel_config)`` on BSHD shards (``(B, S, H, D)``); returns ``out`` ``(B, Sq, H, D)``, with
    ``return_lse`` the pair ``(out, lse)``, ``lse`` fp32 ``(B, Sq, H)`` natural log (diffusers' ring asks for
    it at every step and merges the partial outputs with it). Runs
    :func:`attnclimb.sdpa.scaled_dot_product_attention_lse` (the top rung's LSE variant) or
    :func:`attnclimb.scaled_dot_product_attention` on ``transpose(1, 2)`` views; saves nothing for a
    backward (there is none: :func:`_cp_backward_op`)."""

    def attnclimb_cp_forward_op(
        ctx,
        query,
        key,
        value,
        attn_mask=None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
        _save_ctx: bool = True,
        _parallel_config=None,
    ):
        return _bshd_call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, strict)

    return attnclimb_cp_forward_op


def _cp_backward_op(ctx, grad_out, *args, **kwargs):
    """diffusers' ``backward_op`` slot: not implemented (the kernel is a forward kernel; context-parallel
    training would need an LSE-aware backward per ring step)."""
    raise NotImplementedError(
        "the attnclimb diffusers backend runs context parallelism forward only (inference); for training use a "
        "backend with a backward kernel, e.g. 'flash' or '_native_cudnn'"
    )


def _context_parallel(
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, strict, config
):
    """Hand the call to diffusers' context-parallel attention with our forward op (see ``_backend``)."""
    if getattr(config, "context_parallel_config", None) is None:
        raise ValueError(
            "the attnclimb backend takes diffusers' context parallelism through a ParallelConfig with a "
            f"context_parallel_config (model.enable_parallelism), got {type(config).__name__}"
        )
    ad = _dispatcher()
    templated = getattr(ad, "_templated_context_parallel_attention", None)
    if templated is None:
        raise RuntimeError(
            "this diffusers has no _templated_context_parallel_attention: context parallelism with the attnclimb "
            "backend needs a diffusers that has it, such as 0.42 (or use attnclimb.distributed)"
        )
    return templated(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        return_lse,
        forward_op=_cp_forward_op(strict),
        backward_op=_cp_backward_op,
        _parallel_config=config,
    )


def _add_enum_member(enum_cls, name: str, value: str):
    """Add member ``name = value`` to the ``(str, Enum)`` class ``enum_cls`` (idempotent); returns it.

    Python enums are closed once created; a member is a ``str`` instance of the class with ``_name_`` and
    ``_value_`` set, listed in ``_member_names_``, ``_member_map_`` (behind ``__members__``) and
    ``_value2member_map_`` (behind ``enum_cls(value)``), and reachable as a class attribute.
    """
    existing = enum_cls._value2member_map_.get(value)
    if existing is not None:
        return existing
    member = str.__new__(enum_cls, value)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = enum_cls
    member._sort_order_ = len(enum_cls._member_names_)
    enum_cls._member_names_.append(name)
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    type.__setattr__(enum_cls, name, member)  # EnumType.__setattr__ refuses only existing members
    return member


def _dispatcher():
    """diffusers' ``attention_dispatch`` module, checked to have the enum and the registry this module uses.

    Raises:
        ImportError: diffusers is missing or has no dispatcher (before 0.35).
        RuntimeError: the dispatcher does not look like the one this was written against.
    """
    try:
        from diffusers.models import attention_dispatch as ad
    except ImportError as exc:
        raise ImportError(
            "register_diffusers_backend needs diffusers >= 0.35 with its attention dispatcher "
            f"(pip install 'attnclimb[video]'): {exc}"
        ) from exc
    enum_cls = getattr(ad, "AttentionBackendName", None)
    registry = getattr(ad, "_AttentionBackendRegistry", None)
    if (
        enum_cls is None
        or not issubclass(enum_cls, str)
        or not all(hasattr(enum_cls, a) for a in ("_member_names_", "_member_map_", "_value2member_map_"))
        or registry is None
        or not callable(getattr(registry, "register", None))
        or not isinstance(getattr(registry, "_backends", None), dict)
    ):
        raise RuntimeError(
            "diffusers' attention dispatcher (AttentionBackendName, _AttentionBackendRegistry.register) is not "
            "what attnclimb expects; use attnclimb.patch_sdpa() around the model on the 'native' backend instead"
        )
    return ad


def context_parallel_supported() -> bool:
    """Whether this diffusers can run context parallelism on a registered backend: its registry takes
    ``supports_context_parallel`` and it has the ``_templated_context_parallel_attention`` we hand calls to
    (0.42 has both; 0.35 neither). ``False`` without diffusers."""
    try:
        ad = _dispatcher()
    except (ImportError, RuntimeError):
        return False
    params = inspect.signature(ad._AttentionBackendRegistry.register).parameters
    return "supports_context_parallel" in params and callable(
        getattr(ad, "_templated_context_parallel_attention", None)
    )


def register_backend_function(name: str, fn, *, supports_context_parallel: bool = False):
    """Register ``fn`` as the diffusers attention backend ``name`` (idempotent per name; a second call
    replaces the function). ``fn`` takes diffusers' backend arguments (``query``, ``key``, ``value`` as
    ``(B, S, H, E)``, ``attn_mask``, ``dropout_p``, ``is_causal``, ``scale``, ``enable_gqa``,
    ``return_lse``, ``_parallel_config``) and returns ``(B, Sq, H, Ev)``.

    ``supports_context_parallel``: tell diffusers that ``fn`` handles a ``_parallel_config`` (its
    ``enable_parallelism`` refuses other backends); ignored where :func:`context_parallel_supported` is False.

    :func:`register_diffusers_backend` uses it for ``"attnclimb"``; ``python -m attnclimb capstone`` for the
    routes it compares (FlashAttention-4, an attention-free stand-in). Returns the enum member.
    """
    ad = _dispatcher()
    extra = {"supports_context_parallel": True} if supports_context_parallel and context_parallel_supported() else {}
    with _lock:
        member = _add_enum_member(ad.AttentionBackendName, name.upper(), name)
        ad._AttentionBackendRegistry.register(member, constraints=[], **extra)(fn)
    return member


def register_diffusers_backend(*, strict: bool = False):
    """Make ``"attnclimb"`` a diffusers attention backend (idempotent; call it again to change ``strict``).

    Afterwards ``model.set_attention_backend("attnclimb")`` (or diffusers' ``attention_backend("attnclimb")``
    context manager) makes the model's attention call :func:`attnclimb.scaled_dot_product_attention` on
    transposed views of the BSHD tensors diffusers passes, falling back to torch's SDPA (one warning per
    reason) for masks, other dtypes or head dims, CPU tensors and the like.

    With diffusers' context parallelism (``model.enable_parallelism(config=ContextParallelConfig(
    ring_degree=N))`` or ``ulysses_degree=N``, launched with torchrun) diffusers' ring or Ulysses attention
    runs with the kernel and its LSE as the local attention, forward only (where diffusers has it:
    :func:`context_parallel_supported`).

    Args:
        strict: raise :class:`attnclimb.KernelUnsupportedError` instead of falling back.

    Returns:
        The new ``AttentionBackendName`` member.

    Raises:
        ImportError: diffusers is not installed (``pip install attnclimb[video]``) or too old to have an
            attention dispatcher (before 0.35).
        RuntimeError: this diffusers' dispatcher does not look like the one this was written against.
    """
    return register_backend_function(BACKEND_NAME, _backend(strict), supports_context_parallel=True)
