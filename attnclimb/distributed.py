"""Context-parallel attention over ``torch.distributed``: ring attention and all-to-all ("Ulysses").

A sequence too long for one GPU (Wan2.1-14B at 720p: 75600 tokens per sample) is split along the sequence
over the ``world_size`` ranks of a process group, each rank holding ``(batch, heads, seqlen_local,
head_dim)`` slices of Q, K and V. Two ways to compute exact attention over the whole sequence from there:

* :func:`ring_attention` (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for
  Near-Infinite Context"): Q stays; the K/V blocks travel around the ring of ranks, one hop per step, and
  each rank attends its Q to the block it holds while the next block is in flight (``isend``/``irecv`` to
  the neighbours, posted before the step's attention). Every step gives a partial output O_i with its
  log-sum-exp LSE_i; they are merged exactly in fp32 (:func:`merge_partials`).
* :func:`ulysses_attention` (Jacobs et al. 2023, "DeepSpeed Ulysses"): one all-to-all turns the
  sequence-sharded Q, K, V into head-sharded ones (every rank gets the whole sequence for ``heads /
  world_size`` heads), each rank runs plain attention, and a second all-to-all turns O back.

The local attention is a function argument, ``local_attention(q, k, v, *, scale, is_causal) -> (O, LSE)``:
by default the top rung of attnclimb (:func:`kernel_local_attention`, Hopper GPU, bf16); the CPU tests pass
:func:`exact_local_attention` (float64) and run exactly the same ring and all-to-all code over gloo.

Causal attention needs to know which global positions each rank holds (:data:`LAYOUTS`): ``"contiguous"``
gives rank ``r`` the ``r``-th slice of the sequence; ``"load_balanced"`` cuts the sequence into ``2 *
world_size`` chunks and gives rank ``r`` chunks ``r`` and ``2 * world_size - 1 - r`` (one from each end),
so that under a causal mask every rank does the same work at every ring step (:func:`ring_schedule`). The
helpers :func:`shard_sequence`, :func:`gather_sequence` and :func:`sequence_positions` cut, reassemble and
locate a sequence in either layout. ``docs/distributed.md`` has the design, the per-step masks and the
communication model.

Forward only (inference): the functions record no autograd graph, and with inputs that require grad the
output's backward raises ``NotImplementedError``.

This module is ours; diffusers' context parallelism (its ``TemplatedRingAttention`` and
``TemplatedUlyssesAttention``) runs our kernel through ``attnclimb.register_diffusers_backend()`` instead
(``attnclimb/integrations/diffusers.py``). ``docs/distributed.md`` says what each covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "load_balanced")


# ------------------------------------------------------------------------------------------ layouts


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_split(seqlen: int, world_size: int, layout: str) -> int:
    """The number of equal chunks the layout cuts ``seqlen`` into; ``ValueError`` when it does not divide."""
    _check_layout(layout)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    chunks = world_size if layout == "contiguous" else 2 * world_size
    if seqlen % chunks:
        raise ValueError(
            f"the {layout} layout cuts the sequence into {chunks} equal chunks for world_size {world_size}, "
            f"but seqlen {seqlen} is not a multiple of {chunks}"
        )
    return chunks


def sequence_positions(rank: int, world_size: int, seqlen_local: int, layout: str = "contiguous", device=None):
    """Global positions of the tokens a rank holds, in its local order.

    Args:
        rank: the rank in the process group, ``0 <= rank < world_size``.
        world_size: ranks the sequence is split over.
        seqlen_local: tokens per rank (the whole sequence is ``world_size * seqlen_local`` long); even for
            ``"load_balanced"``, which gives each rank two chunks of ``seqlen_local / 2``.
        layout: ``"contiguous"``: positions ``rank * seqlen_local ...`` in order; ``"load_balanced"``: chunk
            ``rank`` then chunk ``2 * world_size - 1 - rank`` of the ``2 * world_size`` chunks.
        device: of the returned tensor (default CPU).

    Returns:
        An int64 tensor of ``seqlen_local`` positions (e.g. for rotary embeddings of a sharded sequence).

    Raises:
        ValueError: an unknown layout, ``rank`` out of range, or an odd ``seqlen_local`` with ``"load_balanced"``.
    """
    _check_layout(layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if layout == "contiguous":
        return torch.arange(rank * seqlen_local, (rank + 1) * seqlen_local, device=device)
    if seqlen_local % 2:
        raise ValueError(f"the load_balanced layout needs an even seqlen_local (two chunks), got {seqlen_local}")
    chunk = seqlen_local // 2
    head = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    tail_chunk = 2 * world_size - 1 - rank
    tail = torch.arange(tail_chunk * chunk, (tail_chunk + 1) * chunk, device=device)
    return torch.cat([head, tail])


def shard_sequence(x, rank: int, world_size: int, *, layout: str = "contiguous", dim: int = 2):
    """The part of a full sequence that rank ``rank`` holds: ``x`` indexed along ``dim`` by
    :func:`sequence_positions`.

    ``x``: any tensor whose ``dim`` (default 2, the sequence of ``(batch, heads, seqlen, head_dim)``) is the
    whole sequence. Returns a tensor with ``seqlen / world_size`` entries along ``dim`` (a view for
    ``"contiguous"``, a copy for ``"load_balanced"``). ``ValueError`` when the layout does not divide the
    sequence evenly (``world_size`` chunks, or ``2 * world_size`` for ``"load_balanced"``).
    """
    seqlen = x.shape[dim]
    _check_split(seqlen, world_size, layout)
    local = seqlen // world_size
    if layout == "contiguous":
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        return x.narrow(dim, rank * local, local)
    return x.index_select(dim, sequence_positions(rank, world_size, local, layout, device=x.device))


def unshard_sequence(shards, *, layout: str = "contiguous", dim: int = 2):
    """The inverse of :func:`shard_sequence`: the full sequence from every rank's part (a list in rank
    order, equal shapes). Returns a new tensor."""
    world_size = len(shards)
    if world_size < 1:
        raise ValueError("need at least one shard")
    cat = torch.cat(list(shards), dim=dim)
    if layout == "contiguous":
        _check_layout(layout)
        return cat
    local = shards[0].shape[dim]
    positions = torch.cat([sequence_positions(r, world_size, local, layout) for r in range(world_size)])
    return cat.index_select(dim, torch.argsort(positions).to(cat.device))


def gather_sequence(x, *, group=None, layout: str = "contiguous", dim: int = 2):
    """All-gather the sequence shards of the group's ranks into the full sequence, on every rank.

    ``x``: this rank's shard (same shape on every rank). Returns the full tensor (``world_size`` times
    longer along ``dim``) in global order. A collective: every rank of ``group`` must call it (``ValueError``
    on a process outside ``group``, ``RuntimeError`` without a process group).
    """
    group, _, world_size = _group_info(group)
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return unshard_sequence(parts, layout=layout, dim=dim)


# ------------------------------------------------------------------------------------------ LSE merge


def merge_into(out_acc, lse_acc, out_i, lse_i) -> None:
    """Fold one partial result into a running one, in place: the exact softmax merge.

    With ``LSE = log(exp(LSE_acc) + exp(LSE_i))``, ``O_acc <- exp(LSE_acc - LSE) O_acc + exp(LSE_i - LSE) O_i``
    and ``LSE_acc <- LSE``. That is the rescaling of FlashAttention's online softmax (Dao 2023,
    FlashAttention-2, Sec. 3.1; Milakov & Gimelshein 2018) with whole blocks of keys: each partial is a
    softmax-normalised output over its keys, and its LSE carries the normaliser.

    Args:
        out_acc: ``(..., seqlen_q, head_dim)`` fp32 (or float64) running output, updated in place (may be a
            view, e.g. some rows of a larger accumulator).
        lse_acc: ``(..., seqlen_q)`` running LSE, same dtype as ``out_acc``, natural log; ``-inf`` for rows
            that have seen no key yet (with ``out_acc`` 0 there).
        out_i: ``(..., seqlen_q, head_dim)`` the partial output, any float dtype (converted).
        lse_i: ``(..., seqlen_q)`` its LSE, natural log; ``-inf`` for rows without a visible key.

    Rows where both LSEs are ``-inf`` stay ``-inf`` with an output of 0 (no NaN): the shift by the new LSE
    is replaced by 0 there, so both weights are ``exp(-inf) = 0``. Whatever a partial output holds on rows
    whose LSE is ``-inf`` is multiplied by 0, so it must be finite (zeros, as the kernels return).
    """
    dtype = out_acc.dtype
    lse_i = lse_i.to(dtype)
    lse_new = torch.logaddexp(lse_acc, lse_i)
    shift = torch.where(torch.isneginf(lse_new), torch.zeros_like(lse_new), lse_new)
    w_acc = torch.exp(lse_acc - shift).unsqueeze(-1)
    w_i = torch.exp(lse_i - shift).unsqueeze(-1)
    out_acc.mul_(w_acc).addcmul_(out_i, w_i)  # out_i read in its own dtype: no converted copy
    lse_acc.copy_(lse_new)


def merge_partials(partials, dtype=torch.float32):
    """Merge partial attention results over disjoint sets of keys into the result over all of them.

    ``partials``: an iterable of ``(O_i, LSE_i)`` pairs, ``O_i`` ``(..., seqlen_q, head_dim)``, ``LSE_i``
    ``(..., seqlen_q)`` natural log (``-inf`` where a part has no visible key). Returns ``(O, LSE)`` in
    ``dtype`` (fp32 by default): ``LSE = logsumexp_i(LSE_i)``, ``O = sum_i exp(LSE_i - LSE) O_i`` (see
    :func:`merge_into`); rows without any key get ``O = 0``, ``LSE = -inf``. ``ValueError`` when empty.
    """
    out = lse = None
    for out_i, lse_i in partials:
        if out is None:
            out = torch.zeros(out_i.shape, dtype=dtype, device=out_i.device)
            lse = torch.full(lse_i.shape, -math.inf, dtype=dtype, device=lse_i.device)
        merge_into(out, lse, out_i, lse_i)
    if out is None:
        raise ValueError("merge_partials needs at least one partial result")
    return out, lse


# ------------------------------------------------------------------------------------ local attention


def kernel_local_attention(q, k, v, *, scale, is_causal):
    """attnclimb's top rung with its LSE: :func:`attnclimb.attention` ``(..., return_lse=True)``.

    bf16 CUDA tensors ``(batch, heads, seqlen, head_dim)`` on a Hopper GPU; returns ``(O, LSE)``, O bf16
    ``(batch, heads, seqlen_q, head_dim)``, LSE fp32 ``(batch, heads, seqlen_q)`` (natural log).
    ``is_causal`` is torch's top-left aligned mask. Raises what :func:`attnclimb.attention` raises.
    """
    from .api import attention

    return attention(q, k, v, scale=scale, is_causal=is_causal, return_lse=True)


def exact_local_attention(q, k, v, *, scale, is_causal):
    """The float64 reference with its LSE (:func:`attnclimb.reference.attention_exact` and ``lse_exact``):
    any device and float dtype, ``(batch, heads, seqlen, head_dim)``, K/V heads dividing Q's. Returns float64
    ``(O, LSE)``. The CPU tests run the distributed code with it in place of the kernel."""
    from .reference import attention_exact, lse_exact

    return attention_exact(q, k, v, scale=scale, causal=is_causal), lse_exact(q, k, scale=scale, causal=is_causal)


# --------------------------------------------------------------------------------------------- ring


@dataclass(frozen=True)
class RingStep:
    """What one rank computes at one step of the ring.

    Attributes:
        step: ``0 .. world_size - 1``.
        source_rank: the group rank whose K/V block this rank holds during the step (``rank - step`` mod
            ``world_size``: blocks move to ``rank + 1`` after every step).
        q_rows: ``(start, stop)``: the local query rows that attend to the block.
        kv_rows: ``(start, stop)``: the rows of the held K/V block they attend to.
        is_causal: the kernel's top-left causal mask on that ``(q_rows, kv_rows)`` block (a diagonal block
            of equal lengths); else every key is visible.
    """

    step: int
    source_rank: int
    q_rows: tuple
    kv_rows: tuple
    is_causal: bool

    @property
    def skip(self) -> bool:
        """Nothing to compute (a fully masked block)."""
        return self.q_rows[0] >= self.q_rows[1] or self.kv_rows[0] >= self.kv_rows[1]


def ring_schedule(rank: int, world_size: int, seqlen_q: int, seqlen_k: int, *, is_causal: bool, layout: str):
    """The ring's steps for one rank: a list of ``world_size`` :class:`RingStep`.

    Non-causal: every step attends all local Q rows to the whole held block. Causal (``seqlen_q ==
    seqlen_k``, positions from ``layout``); the rank holds query chunk(s) and the block of rank ``s``:

    * ``"contiguous"``: ``s == rank``: the diagonal block (causal); ``s < rank``: all keys lie before all
      queries (full); ``s > rank``: all after (skipped). Rank ``r`` computes ``r + 1/2`` blocks' worth.
    * ``"load_balanced"`` (rank ``r`` holds chunks ``r`` and ``2N-1-r``, chunk length ``L``): ``s == r``:
      the local ``2L x 2L`` block is causal in local order too (chunk ``r`` sees itself diagonally and not
      chunk ``2N-1-r``; chunk ``2N-1-r`` sees chunk ``r`` fully and itself diagonally). ``s < r``: chunk
      ``s`` lies before both query chunks and chunk ``2N-1-s`` after both: all ``2L`` queries attend to the
      first ``L`` keys. ``s > r``: both key chunks lie after chunk ``r`` and before chunk ``2N-1-r``: the
      last ``L`` queries attend to all ``2L`` keys. Every step is ``2 L^2`` score entries on every rank.

    ``ValueError`` for an unknown layout, causal with ``seqlen_q != seqlen_k`` or an odd seqlen with
    ``"load_balanced"``.
    """
    _check_layout(layout)
    if is_causal and seqlen_q != seqlen_k:
        raise ValueError(
            f"causal context parallelism needs seqlen_q == seqlen_k per rank (the mask follows global "
            f"positions), got {seqlen_q} and {seqlen_k}"
        )
    if is_causal and layout == "load_balanced" and seqlen_q % 2:
        raise ValueError(f"the load_balanced layout needs an even local seqlen (two chunks), got {seqlen_q}")
    steps = []
    for t in range(world_size):
        s = (rank - t) % world_size
        q_rows, kv_rows, causal = (0, seqlen_q), (0, seqlen_k), False
        if is_causal:
            half = seqlen_q // 2
            if s == rank:
                causal = True
            elif layout == "contiguous":
                if s > rank:
                    q_rows = kv_rows = (0, 0)
            elif s < rank:
                kv_rows = (0, half)
            else:
                q_rows = (half, seqlen_q)
        steps.append(RingStep(t, s, q_rows, kv_rows, causal))
    return steps


def _group_info(group):
    """``(group, rank in it, its size)``; ``RuntimeError`` without a process group, ``ValueError`` when this
    process is not a member of ``group`` (torch answers rank -1 and size -1 there, which the ring would take
    for an empty schedule and return zeros)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group first")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"this process (global rank {dist.get_rank()}) is not a member of the process group it was given: "
            "only the group's ranks may call a collective on it"
        )
    return group, rank, dist.get_world_size(group)


class _ForwardOnly(torch.autograd.Function):
    """Runs ``fn(q, k, v, **kwargs) -> (O, LSE)`` (autograd off inside, as in any Function's forward) and
    gives ``O`` a backward that raises: the ring and the all-to-alls are not differentiable (the partials'
    LSE carries no gradient, and the K/V blocks of other ranks would need their gradients sent back), so a
    backward must fail loudly rather than return gradients that miss those terms."""

    @staticmethod
    def forward(ctx, fn, name, kwargs, q, k, v):
        ctx.name = name
        out, lse = fn(q, k, v, **kwargs)
        if out._is_view():  # e.g. Ulysses' output reshaped from its receive buffer: autograd forbids in-place
            out = out.clone()  # ops on a view made inside a Function (this path runs only with grad)
        if lse is not None:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            f"{ctx.name} is forward-only (inference): it has no backward. Call it under torch.no_grad() or "
            "torch.inference_mode(), or on inputs that do not require grad"
        )


def _forward_only(fn, name, q, k, v, **kwargs):
    """``fn(q, k, v, **kwargs) -> (O, LSE)`` without recording autograd; when grad mode is on and an input
    requires grad, through :class:`_ForwardOnly` (``O`` then has a grad_fn whose backward raises)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _ForwardOnly.apply(fn, name, kwargs, q, k, v)
    with torch.no_grad():
        return fn(q, k, v, **kwargs)


def _global_rank(group, group_rank: int) -> int:
    return group_rank if group is dist.group.WORLD else dist.get_global_rank(group, group_rank)


def _check_qkv(q, k, v, is_causal, layout, name):
    for n, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {n} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: {n} must be (batch, heads, seqlen_local, head_dim), got shape {tuple(t.shape)}")
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(f"{name}: k and v must have one shape and dtype, got k{tuple(k.shape)} v{tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"{name}: batch and head_dim of q{tuple(q.shape)} and k{tuple(k.shape)} must agree")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{name}: K/V heads ({k.shape[1]}) must divide the query heads ({q.shape[1]})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"{name}: is_causal must be a bool, got {type(is_causal).__name__}")
    _check_layout(layout)


def ring_attention(
    q,
    k,
    v,
    *,
    group=None,
    scale=None,
    is_causal=False,
    layout="contiguous",
    return_lse=False,
    local_attention=None,
):
    """Exact attention over a sequence sharded across the ranks of ``group``, by ring attention.

    Every rank calls it with its own shard (a collective). At step ``t`` a rank holds the K/V block of
    rank ``rank - t`` (mod ``world_size``); it posts the send of that block to ``rank + 1`` and the receive
    of the next one from ``rank - 1`` (``torch.distributed.batch_isend_irecv``, K and V packed in one
    buffer, two buffers alternating), runs ``local_attention`` on the part of the block that
    :func:`ring_schedule` says is visible, merges the partial (O, LSE) into fp32 accumulators
    (:func:`merge_into`), then waits for the receive. So the transfer of the next block can overlap the
    attention of this one (on a GPU NCCL runs it on its own stream; whether it really runs beside the
    persistent top rung, which holds every SM, is to be measured: ``docs/distributed.md``, "Overlap on the
    GPU"). The idea is Liu et al.
    2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context"; the merge is
    FlashAttention's online softmax over whole blocks.

    Args:
        q: ``(batch, heads, seqlen_q_local, head_dim)``, this rank's queries.
        k, v: ``(batch, heads_kv, seqlen_k_local, head_dim)``, this rank's keys and values (one shape and
            dtype; ``heads_kv`` divides ``heads``). Shapes, dtypes and devices must be the same on every
            rank (a mismatch is not detected and fails inside the communication library).
        group: the process group (default: the world).
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        is_causal: causal attention over global positions (needs ``seqlen_q_local == seqlen_k_local``).
        layout: where each rank's tokens lie in the global sequence (:data:`LAYOUTS`; only matters with
            ``is_causal``): ``"load_balanced"`` (see :func:`shard_sequence`) makes every step the same work
            on every rank; ``"contiguous"`` is correct too but rank ``r`` works ``r + 1/2`` steps' worth and
            the ring's time is that of the last rank.
        return_lse: also return the LSE of every local query row over all keys.
        local_attention: ``f(q, k, v, *, scale, is_causal) -> (O, LSE)`` on local blocks, LSE natural log
            ``(batch, heads, rows)``; default :func:`kernel_local_attention` (the top rung: bf16 on a Hopper
            GPU). The CPU tests pass :func:`exact_local_attention`.

    Returns:
        ``O`` ``(batch, heads, seqlen_q_local, head_dim)`` in ``q``'s dtype (merged in fp32, rounded once);
        with ``return_lse`` the pair ``(O, LSE)``, LSE fp32 ``(batch, heads, seqlen_q_local)``.

    Forward only: the attention runs without recording autograd. With grad mode on and an input that
    requires grad, ``O`` carries a grad_fn whose backward raises ``NotImplementedError`` (the merge weights
    and the other ranks' K/V blocks would need gradients this function does not compute); the LSE has none.

    Raises:
        TypeError: an input is not a tensor, or ``is_causal`` not a bool.
        ValueError: wrong ranks or mismatched shapes, an unknown layout, causal with ``seqlen_q_local !=
            seqlen_k_local`` or an odd local seqlen with ``"load_balanced"``, this process not a member of
            ``group``; what ``local_attention`` raises.
        RuntimeError: ``torch.distributed`` is not initialised.
    """
    _check_qkv(q, k, v, is_causal, layout, "ring_attention")
    kw = {"group": group, "scale": scale, "is_causal": is_causal, "layout": layout, "local_attention": local_attention}
    out, lse = _forward_only(_ring, "ring_attention", q, k, v, **kw)
    return (out, lse) if return_lse else out


def _ring(q, k, v, *, group, scale, is_causal, layout, local_attention):
    """The body of :func:`ring_attention` (checked arguments): ``(O, LSE)``."""
    group, rank, world_size = _group_info(group)
    local_attention = kernel_local_attention if local_attention is None else local_attention
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    schedule = ring_schedule(rank, world_size, q.shape[2], k.shape[2], is_causal=is_causal, layout=layout)
    batch, heads, seqlen_q = q.shape[:3]
    out = torch.zeros(batch, heads, seqlen_q, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((batch, heads, seqlen_q), -math.inf, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v))  # (2, batch, heads_kv, seqlen_k, head_dim): one message per step
    spare = torch.empty_like(kv) if world_size > 1 else None
    send_to = _global_rank(group, (rank + 1) % world_size)
    recv_from = _global_rank(group, (rank - 1) % world_size)
    for step in schedule:
        pending = []
        if step.step < world_size - 1:
            pending = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, kv, send_to, group), dist.P2POp(dist.irecv, spare, recv_from, group)]
            )
        if not step.skip:
            (q0, q1), (k0, k1) = step.q_rows, step.kv_rows
            o_i, lse_i = local_attention(
                q[:, :, q0:q1], kv[0, :, :, k0:k1], kv[1, :, :, k0:k1], scale=scale, is_causal=step.is_causal
            )
            if step.step == 0 and (q0, q1) == (0, seqlen_q):  # nothing to merge with yet: a copy
                out.copy_(o_i)
                lse.copy_(lse_i)
            else:
                merge_into(out[:, :, q0:q1], lse[:, :, q0:q1], o_i, lse_i)
        for work in pending:
            work.wait()
        if pending:
            kv, spare = spare, kv
    return out.to(q.dtype), lse


# ------------------------------------------------------------------------------------------ Ulysses


def _all_to_all(send, group):
    """``all_to_all_single`` of a tensor whose dim 0 is ``world_size`` (part ``j`` goes to rank ``j``;
    part ``i`` of the result came from rank ``i``)."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def _seq_to_heads(x, world_size, group):
    """``(B, H, S_local, D)`` sequence-sharded -> ``(B, H / N, N * S_local, D)`` head-sharded, the sequence
    in rank order (rank 0's tokens first)."""
    b, h, s, d = x.shape
    send = x.reshape(b, world_size, h // world_size, s, d).transpose(0, 1).contiguous()
    recv = _all_to_all(send, group)  # (N, B, H/N, S_local, D): [i] = rank i's tokens of my heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // world_size, world_size * s, d)


def _heads_to_seq(x, world_size, group):
    """The inverse of :func:`_seq_to_heads`: ``(B, H / N, N * S_local, D)`` -> ``(B, H, S_local, D)``."""
    b, hn, s_all, d = x.shape
    s = s_all // world_size
    send = x.reshape(b, hn, world_size, s, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = _all_to_all(send, group)  # (N, B, H/N, S_local, D): [i] = my tokens of rank i's heads
    return recv.transpose(0, 1).reshape(b, world_size * hn, s, d)


def ulysses_attention(
    q,
    k,
    v,
    *,
    group=None,
    scale=None,
    is_causal=False,
    layout="contiguous",
    return_lse=False,
    local_attention=None,
):
    """Exact attention over a sequence sharded across the ranks of ``group``, by all-to-all (Ulysses).

    Every rank calls it with its own shard (a collective). An all-to-all per tensor (``all_to_all_single``)
    turns Q, K, V from ``(batch, heads, seqlen_local, head_dim)`` into ``(batch, heads / world_size,
    seqlen, head_dim)``: rank ``r`` gets heads ``r * heads / world_size ...`` for the whole sequence. Each
    rank runs ``local_attention`` on its heads, and one more all-to-all brings O (and the LSE) back to the
    sequence split. Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of
    Extreme Long Sequence Transformer Models".

    Args:
        q: ``(batch, heads, seqlen_local, head_dim)``; ``heads`` a multiple of ``world_size``.
        k, v: ``(batch, heads_kv, seqlen_local, head_dim)``; ``heads_kv`` a multiple of ``world_size``
            dividing ``heads`` (each rank keeps whole K/V groups). Same shapes on every rank.
        group, scale, return_lse, local_attention: as in :func:`ring_attention`.
        is_causal: causal attention over global positions.
        layout: where each rank's tokens lie (:data:`LAYOUTS`). With ``"load_balanced"`` and ``is_causal``
            the gathered sequence is put into global order for the local attention and back afterwards
            (one ``index_select`` each way); otherwise the order needs no change.

    Returns:
        ``O`` ``(batch, heads, seqlen_local, head_dim)`` in ``q``'s dtype; with ``return_lse`` the pair
        ``(O, LSE)``, LSE fp32 ``(batch, heads, seqlen_local)``. Forward only, as :func:`ring_attention`.

    Raises:
        TypeError, RuntimeError: as :func:`ring_attention`.
        ValueError: as :func:`ring_attention`; ``heads`` or ``heads_kv`` not a multiple of ``world_size``;
            ``seqlen_q_local != seqlen_k_local``.
    """
    _check_qkv(q, k, v, is_causal, layout, "ulysses_attention")
    kw = {"group": group, "scale": scale, "is_causal": is_causal, "layout": layout, "local_attention": local_attention}
    out, lse = _forward_only(_ulysses, "ulysses_attention", q, k, v, return_lse=return_lse, **kw)
    return (out, lse) if return_lse else out


def _ulysses(q, k, v, *, group, scale, is_causal, layout, return_lse, local_attention):
    """The body of :func:`ulysses_attention` (checked arguments): ``(O, LSE)``, LSE ``None`` without
    ``return_lse``."""
    group, _, world_size = _group_info(group)
    if q.shape[1] % world_size or k.shape[1] % world_size:
        raise ValueError(
            f"ulysses_attention: query heads ({q.shape[1]}) and K/V heads ({k.shape[1]}) must be multiples of "
            f"world_size ({world_size})"
        )
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"ulysses_attention: seqlen_q_local ({q.shape[2]}) must equal seqlen_k_local ({k.shape[2]})")
    local_attention = kernel_local_attention if local_attention is None else local_attention
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    positions = None
    if is_causal and layout == "load_balanced":  # checked before any communication (ValueError on an odd seqlen)
        local = q.shape[2]
        positions = torch.cat([sequence_positions(r, world_size, local, layout) for r in range(world_size)])
        positions = positions.to(q.device)
    qh, kh, vh = (_seq_to_heads(t, world_size, group) for t in (q, k, v))
    if positions is not None:
        order = torch.argsort(positions)  # rank order -> global order
        qh, kh, vh = (t.index_select(2, order) for t in (qh, kh, vh))
    o, lse = local_attention(qh, kh, vh, scale=scale, is_causal=is_causal)
    o, lse = o.to(q.dtype), lse.to(torch.float32)
    if positions is not None:  # global order -> rank order: entry j of rank order is global position p[j]
        o, lse = o.index_select(2, positions), lse.index_select(2, positions)
    out = _heads_to_seq(o, world_size, group)
    if not return_lse:
        return out, None
    return out, _heads_to_seq(lse.unsqueeze(-1), world_size, group).squeeze(-1)


SCHEMES = {"ring": ring_attention, "ulysses": ulysses_attention}


def context_parallel_attention(q, k, v, *, scheme="ring", **kwargs):
    """:func:`ring_attention` (``scheme="ring"``) or :func:`ulysses_attention` (``"ulysses"``) with the same
    keyword arguments. ``ValueError`` for another scheme."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {tuple(SCHEMES)}, got {scheme!r}")
    return SCHEMES[scheme](q, k, v, **kwargs)
