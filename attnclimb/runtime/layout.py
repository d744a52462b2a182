"""Host-side layout decisions, on plain integers (no torch import, no GPU; unit-tested on the CPU):

- :func:`plan_chunks`: how to split one attention call into launches whose tensors each hold fewer than
  2^31 elements (the kernels' offsets are 32-bit, ``docs/kernel-abi.md``), writing into slices of one
  output;
- :func:`tma_layout_reason`: which strided tensors a TMA tensor map can describe in place, the rule a
  zero-copy path for BSHD and fused-QKV views would use;
- :func:`needs_copy`: which inputs today's kernels take as they are, and which are copied first (it
  reads a tensor's ``is_contiguous()`` and ``data_ptr()``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Most elements one launch's Q, K, V, O (and rung 0's fp32 scores) may hold: 32-bit signed offsets.
INT32_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class Chunk:
    """One launch of a split call: ``batch``, query ``heads``, query ``rows`` and K/V heads (``kv_heads``)
    as ``(start, stop)`` ranges.

    Either ``heads`` covers every head or ``batch`` is one batch entry, and either ``rows`` covers every
    query row or the chunk is one head, so each slice of a contiguous ``(B, H, S, D)`` tensor is itself
    contiguous: the launch reads and writes it in place, through a view. ``kv_heads`` (``None``: the same
    range as ``heads``) are the K/V heads the chunk's query heads read under grouped-query attention (query
    head ``h`` reads K/V head ``h // group``): whole groups, or part of one group and its one K/V head.
    """

    batch: tuple
    heads: tuple
    rows: tuple
    kv_heads: tuple | None = None

    @property
    def q_index(self) -> tuple:
        """Index of this chunk's Q (and O, and the ``(B, H, Sq)`` LSE) in the ``(B, H, Sq, D)`` tensor."""
        return (slice(*self.batch), slice(*self.heads), slice(*self.rows))

    @property
    def kv_index(self) -> tuple:
        """Index of this chunk's K and V in the ``(B, H_kv, Sk, D)`` tensors (every key)."""
        return (slice(*self.batch), slice(*(self.heads if self.kv_heads is None else self.kv_heads)))


def query_rows_fit(seqlen_q: int, head_dim: int, limit: int = INT32_LIMIT) -> bool:
    """Whether one head's Q (and O) fit in one launch, i.e. :func:`plan_chunks` never splits query rows.

    A causal call needs this: the kernels put the diagonal at query row 0 of the launch (they take no row
    offset), so a launch that starts at row ``r > 0`` would mask the wrong keys."""
    return seqlen_q * head_dim <= limit


def plan_chunks(
    batch: int,
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    head_dim: int,
    *,
    heads_kv: int | None = None,
    causal: bool = False,
    score_workspace: bool = False,
    limit: int = INT32_LIMIT,
) -> list:
    """Split a ``(batch, heads, seqlen_q/seqlen_k, head_dim)`` attention call into launches that each hold
    at most ``limit`` elements in every tensor: over batch first (whole batch entries per launch), then
    over heads within one batch entry, then over query rows within one head (rows of Q are independent;
    keys are not, so one head's K and V must fit).

    ``heads_kv`` (grouped-query attention; ``None``: ``heads``) must divide ``heads``: query head ``h`` reads
    K/V head ``h // (heads // heads_kv)``. Head splits then take whole groups of query heads with their K/V
    heads, or, when one group's queries do not fit, part of one group with its one K/V head; each chunk's
    ``kv_heads`` says which.

    ``causal``: the call is causal (torch's ``is_causal=True``), whose diagonal the kernels anchor at the
    launch's first query row; a split over query rows would move it, so it raises instead (see
    :func:`query_rows_fit`).

    ``score_workspace``: rung 0 materialises ``S`` (``heads·seqlen_q·seqlen_k`` fp32 per batch entry),
    which must fit too. Returns a list of :class:`Chunk` in order, one chunk when nothing needs splitting,
    none when a size is zero.

    Raises:
        ValueError: one head's K/V (``seqlen_k·head_dim``), or one query row of ``S`` (``seqlen_k``),
            exceeds ``limit``: no split helps; a causal call needs a split over query rows;
            ``heads_kv`` does not divide ``heads``.
    """
    hkv = heads if heads_kv is None else heads_kv
    if heads > 0 and (hkv < 1 or heads % hkv):
        raise ValueError(f"heads_kv={heads_kv} must divide heads={heads}")
    if min(batch, heads, seqlen_q, seqlen_k, head_dim) <= 0:
        return []
    group = heads // hkv
    kv_head = seqlen_k * head_dim
    row = max(head_dim, seqlen_k if score_workspace else 0)  # elements per query row, per tensor
    if kv_head > limit or row > limit:
        raise ValueError(
            f"one head's keys hold {kv_head} elements (seqlen_k {seqlen_k} x head_dim {head_dim}); the kernels "
            f"use 32-bit offsets and keys cannot be split across launches (at most {limit})"
        )
    q_head = seqlen_q * row  # one query head's Q/O (and S)
    per_batch = max(heads * q_head, hkv * kv_head)
    if per_batch <= limit:
        step = limit // per_batch
        kv = _kv(0, hkv, group)
        return [Chunk((b, min(b + step, batch)), (0, heads), (0, seqlen_q), kv) for b in range(0, batch, step)]
    per_group = max(group * q_head, kv_head)
    if per_group <= limit:  # whole groups of query heads with their K/V heads
        step = limit // per_group
        return [
            Chunk((b, b + 1), (g * group, min(g + step, hkv) * group), (0, seqlen_q), _kv(g, min(g + step, hkv), group))
            for b in range(batch)
            for g in range(0, hkv, step)
        ]
    if q_head <= limit:  # one group's queries are too many: part of one group, its one K/V head
        step = limit // q_head
        return [
            Chunk((b, b + 1), (h, min(h + step, (g + 1) * group)), (0, seqlen_q), _kv(g, g + 1, group))
            for b in range(batch)
            for g in range(hkv)
            for h in range(g * group, (g + 1) * group, step)
        ]
    if causal:
        raise ValueError(
            f"one head's queries hold {q_head} elements (seqlen_q {seqlen_q} x {row}), more than one launch takes "
            f"(at most {limit}); a causal call cannot be split over query rows (the kernels anchor the diagonal "
            "at a launch's first row)"
        )
    step = limit // row
    return [
        Chunk((b, b + 1), (h, h + 1), (r, min(r + step, seqlen_q)), _kv(h // group, h // group + 1, group))
        for b in range(batch)
        for h in range(heads)
        for r in range(0, seqlen_q, step)
    ]


def _kv(start: int, stop: int, group: int) -> tuple | None:
    """A chunk's ``kv_heads``: ``None`` when it equals the query heads (no grouped-query attention)."""
    return None if group == 1 else (start, stop)


# cuTensorMapEncodeTiled's limits (CUDA Driver API reference; PTX ISA "Tensor-map").
TMA_MAX_RANK = 5
TMA_ALIGN_BYTES = 16
TMA_MAX_STRIDE_BYTES = 2**40
TMA_MAX_DIM = 2**32


def tma_layout_reason(shape, strides, data_ptr: int, elem_bytes: int = 2) -> str | None:
    """Why a TMA tensor map cannot describe a strided tensor in place (``None`` when it can).

    ``shape`` and ``strides`` are in elements, outermost first as torch gives them (``t.shape``,
    ``t.stride()``), e.g. a ``(B, H, S, D)`` view of a ``(B, S, H, D)`` buffer has strides
    ``(S·H·D, D, H·D, 1)``; ``data_ptr`` is the address of element 0.

    A tensor map (``cuTensorMapEncodeTiled``) addresses element ``(i_0, …, i_{r-1})`` (innermost first)
    at ``base + i_0·elem_bytes + Σ_{j≥1} i_j·stride_j``, so it can read any strided tensor with:

    - rank 1 to 5;
    - a contiguous innermost dimension (stride 1): the map has no stride for dimension 0;
    - a base address aligned to 16 bytes;
    - every other stride, in bytes, a multiple of 16 and below 2^40;
    - every size at most 2^32.

    A dimension of size 1 is never stepped over, so its stride does not matter (torch gives such
    dimensions arbitrary strides): it is exempt, and the encoder would be given any valid value there.
    Strides need not increase outwards: the map's dimensions are independent, so a BSHD view (heads
    inside sequence rows) and one third of a fused QKV buffer (a row stride of ``3·H·D``) both qualify.
    A stride of 0 (an ``expand``-ed batch or head) is a multiple of 16 and also passes this check; the
    driver's acceptance of it is what ``scripts/dropin_check.py`` probes on a GPU.

    The kernels of the ladder take 3-D maps over contiguous ``(B·H, S, D)`` tensors today (see
    :func:`needs_copy`); a 4-D map over ``(D, S, H, B)`` built with this rule is what a zero-copy path for
    such views needs (``docs/dropin.md``, "Strides").
    """
    rank = len(shape)
    if len(strides) != rank:
        return f"shape {tuple(shape)} and strides {tuple(strides)} differ in rank"
    if not 1 <= rank <= TMA_MAX_RANK:
        return f"rank {rank}; a tensor map has 1 to {TMA_MAX_RANK} dimensions"
    if data_ptr % TMA_ALIGN_BYTES:
        return f"base address {data_ptr:#x} is not {TMA_ALIGN_BYTES}-byte aligned"
    for size in shape:
        if not 1 <= size <= TMA_MAX_DIM:
            return f"size {size} is outside 1..2^32"
    if shape[-1] > 1 and strides[-1] != 1:
        return f"the innermost dimension has stride {strides[-1]}; a tensor map needs it contiguous (stride 1)"
    for size, stride in zip(shape[:-1], strides[:-1]):
        if size == 1:
            continue
        nbytes = stride * elem_bytes
        if nbytes < 0 or nbytes % TMA_ALIGN_BYTES or nbytes >= TMA_MAX_STRIDE_BYTES:
            return (
                f"stride {stride} ({nbytes} bytes) of a dimension of size {size} is not a non-negative "
                f"multiple of {TMA_ALIGN_BYTES} bytes below 2^40"
            )
    return None


def needs_copy(t) -> bool:
    """Whether today's kernels need a copy of tensor ``t`` (Q, K or V): they index them as contiguous
    ``(B·H, S, D)`` arrays (pointer rungs) or read them through 3-D tensor maps over that shape (TMA
    rungs), with 16-byte vector loads and TMA, so they take a tensor as it is only when it is contiguous
    and 16-byte aligned. Everything else is copied to fresh contiguous memory first.

    When the kernels take 4-D tensor maps (and write O through its own strides), this becomes
    ``tma_layout_reason(t.shape, t.stride(), t.data_ptr()) is not None`` for the TMA rungs; the pointer
    rungs (1-4) keep this rule.
    """
    return not t.is_contiguous() or t.data_ptr() % TMA_ALIGN_BYTES != 0
