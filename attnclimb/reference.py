"""CPU references: exact float64 attention and a tiled online-softmax simulator.

The simulator follows the same algorithm as the fused kernels (rungs 1+): for each ``BLOCK_M`` rows of Q,
loop over ``BLOCK_N``-row tiles of K/V, keep a running row max ``m`` and row sum ``l``, rescale the output
accumulator by ``exp(m_old - m_new)``, and normalise once at the end (FlashAttention, Dao et al. 2022,
Sec. 3.1; Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"). With ``base2=True`` it
uses the rung-4+ form: ``exp2(s * scale * log2(e) - m * scale * log2(e))`` on raw scores. In float64 it
agrees with :func:`attention_exact` to ~1e-15, which pins the algorithm the kernels implement.

With ``kernel_fp32=True`` it also mirrors the kernels' *arithmetic* (rungs 4+): fp32 scores, the FFMA fold
``P = ex2(fma(s, c, -R))`` against the fp32 reference ``R`` of ``attnclimb/kernels/softmax.cuh``
(:func:`online_rescale_fp32`), P rounded to bf16 for the P·V product, fp32 row sums and accumulators, so
that a rounding model of the kernels can be tested on the CPU. ``p_dtype=torch.float16`` models the top
rung's FP16 variant instead: P rounded to fp16 after the per-row power-of-two shift of ``softmax.cuh``
("fp16 P"; :func:`p_shift_fp32`), O written as fp16.
"""

from __future__ import annotations

import math

import torch

LOG2E = 1.4426950408889634


def _check(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be (batch, heads, seqlen, head_dim)")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"incompatible shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")


def _expand_kv(q, t):
    """K or V with its heads repeated to match Q's (grouped-query attention: head h reads h // group)."""
    hq, hkv = q.shape[1], t.shape[1]
    if hq == hkv:
        return t
    if hkv == 0 or hq % hkv:
        raise ValueError(f"heads of q ({hq}) must be a multiple of the K/V heads ({hkv})")
    return t.repeat_interleave(hq // hkv, dim=1)


def _scores(q, k, scale, causal):
    s = torch.matmul(q.to(torch.float64), _expand_kv(q, k).to(torch.float64).transpose(-1, -2)) * scale
    if causal:  # torch's is_causal=True: top-left aligned, query i sees keys 0..i
        sq, sk = s.shape[-2], s.shape[-1]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def attention_exact(q, k, v, scale=None, causal=False):
    """Exact attention in float64: ``softmax(scale · Q Kᵀ) V``.

    ``q``: ``(B, H, Sq, D)``, ``k``/``v``: ``(B, H_kv, Sk, D)`` with ``H`` a multiple of ``H_kv`` (query head
    h reads K/V head ``h // (H // H_kv)``), any float dtype, any device (computed on the tensors' device in
    float64). ``causal``: torch's ``is_causal=True`` mask (top-left aligned). Returns a float64
    ``(B, H, Sq, D)`` tensor. ``scale`` defaults to ``1/sqrt(D)``.
    """
    _check(q, _expand_kv(q, k), _expand_kv(q, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    p = torch.softmax(_scores(q, k, scale, causal), dim=-1)
    return torch.matmul(p, _expand_kv(q, v).to(torch.float64))


def lse_exact(q, k, scale=None, causal=False):
    """Row log-sum-exp of ``scale · Q Kᵀ`` in float64 (natural log), shape ``(B, H, Sq)``; K/V heads and
    ``causal`` as in :func:`attention_exact`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.logsumexp(_scores(q, k, scale, causal), dim=-1)


def _fma32(a, b, c):
    """``fl32(a·b + c)`` of float32 tensors, as one FFMA: the product of two float32 numbers is exact in
    float64 (24 + 24 bits), so only the final sum is rounded (twice: to float64, then float32; the
    double rounding differs from one rounding only on rare exact ties)."""
    return (a.double() * b.double() + c.double()).float()


ROW_MAX_INIT = -torch.finfo(torch.float32).max  # softmax.cuh: the running max before any key
RESCALE_THRESHOLD = 8.0  # rung 12's RESCALE_THRESHOLD (12_lazy_rescale.cu): P against a kept reference <= 2^8

# softmax.cuh's poly_exp2: 2^f ≈ 1 + f·(c1 + f·(c2 + f·c3)) on [−0.5, 0.5] (p(0) = 1 exactly)
POLY_EXP2_C = (1.0, 0.6932829022407532, 0.24221009016036987, 0.05500851944088936)


def poly_exp2_fp32(x):
    """Float32 mirror of ``smx::poly_exp2`` (``attnclimb/kernels/softmax.cuh``): 2^x on the FMA pipe.

    ``x``: a float32 tensor. Clamps at −127 (NaN stays NaN), rounds x to an integer j by adding
    ``M = 1.5·2^23 + 127`` (one float32 add), evaluates the degree-3 polynomial :data:`POLY_EXP2_C` at
    ``f = x − j`` in float32 Horner (FFMAs), and scales by ``2^j`` taken from the bits of ``x + M`` (0 for
    j = −127). Returns float32; relative error <= 1.02e-4 against 2^x for −126 <= x < 127.5, +0 below −127.
    """
    f32 = torch.float32
    x = torch.where(x < -127.0, torch.full_like(x, -127.0), x)  # max.NaN: NaN compares false, stays
    magic = torch.tensor(12583039.0, dtype=f32)
    t = (x + magic).to(f32)
    f = (x - (t - magic)).to(f32)
    c0, c1, c2, c3 = (torch.tensor(c, dtype=f32) for c in POLY_EXP2_C)
    p = _fma32(_fma32(_fma32(c3.expand_as(f), f, c2.expand_as(f)), f, c1.expand_as(f)), f, c0.expand_as(f))
    bits = (t.view(torch.int32).to(torch.int64) << 23) & 0xFFFFFFFF  # the shift of a 32-bit pattern
    scale = bits.to(torch.int64).where(bits < 2**31, bits - 2**32).to(torch.int32).view(f32)
    return (p * scale).to(f32)


def _mul32_up(a, b):
    """``a·b`` rounded toward +inf in float32 (``__fmul_ru``, FMUL.RP): the float64 product of two float32
    numbers is exact, then the float32 nearest is stepped up when it lies below it."""
    exact = a.double() * b.double()
    near = exact.float()
    return torch.where(near.double() < exact, torch.nextafter(near, torch.full_like(near, math.inf)), near)


def row_multiplier_fp32(m, c):
    """``min(c, 2^(29 − E))`` of ``softmax.cuh`` (``E``: binary exponent of each ``m``), by its bit trick."""
    hard = 0x8D800000 - (m.view(torch.int32).to(torch.int64) & 0x7F800000)
    bits = torch.minimum(c.view(torch.int32).to(torch.int64).expand_as(hard), hard)
    return bits.to(torch.int32).view(torch.float32)


def p_shift_fp32(err):
    """``k = ceil(e)`` of ``softmax.cuh``'s fp16 P (``online_rescale<true>``): the power of two a row's P is
    scaled by before it is rounded to fp16 (``P = 2^(s·c − R − k)``); 0 unless ``|m·c| >= 2^24``."""
    return torch.ceil(err)


def online_rescale_fp32(m_old, err_old, m_new, c, shift=False):
    """Float32 mirror of ``smx::online_rescale`` (``attnclimb/kernels/softmax.cuh``).

    ``m_old``, ``m_new``: float32 tensors of running row maxima of raw scores (``ROW_MAX_INIT`` before any
    key); ``err_old``: the ``err`` this function returned for ``m_old`` (0 at the start); ``c``: a float32
    scalar tensor, ``scale·log2(e) > 0``. Returns float32 ``(alpha, mul, neg_ref, err)``:
    ``P = 2^fma(s, mul, neg_ref)``; ``alpha = 2^(R_old − R_new)`` rescales O and l (exactly 1 when
    ``m_old == m_new``); ``mul`` is ``c``, or a power of two on rows where only ties at the max carry
    weight; ``err = m_new·c − R`` in units of ``c`` (``R`` rounded up, so ``err <= 0`` and every P <= 1).

    ``shift=True`` mirrors ``online_rescale<true>`` (fp16 P) and returns ``(alpha, mul, neg_ref, err, k)``:
    ``k = ceil(e)`` (:func:`p_shift_fp32`), ``P = 2^(fma(s, mul, neg_ref) − k)``, and ``err = e − k`` (exact),
    the error against ``R + k`` from which ``alpha`` is computed (pass it back as ``err_old``).
    """
    mul = row_multiplier_fp32(m_new, c)
    ref = _mul32_up(m_new, mul)
    err = _fma32(m_new, mul, -ref)
    if shift:
        k = p_shift_fp32(err)
        err = err - k  # float32, exact (Sterbenz: e in (k − 1, k])
    alpha = torch.exp2(_fma32(m_old - m_new, c.expand_as(m_new), err - err_old))
    return (alpha, mul, -ref, err, k) if shift else (alpha, mul, -ref, err)


def lazy_max_fp32(m_old, err_old, m_new, c, threshold):
    """Float32 mirror of rung 12's lazy rule (``12_lazy_rescale.cu``): the running max a row goes on with.

    ``m_old``, ``err_old``: the row's reference max and its ``err`` (:func:`online_rescale_fp32`); ``m_new``:
    ``max(m_old, tile max)``; ``c``: ``scale·log2 e``. The new max's P against the kept reference is
    ``2^fma(m_new − m_old, c, err_old)`` (``m_new − m_old`` a float32 subtraction, as in the kernel); while that
    exponent is at most ``threshold`` the row keeps ``m_old`` (so alpha is exactly 1), else it takes ``m_new``.
    """
    keep = _fma32(m_new - m_old, c.expand_as(m_old), err_old) <= threshold
    return torch.where(keep, m_old, m_new)


def kept_limit_fp32(m, err, c, threshold=RESCALE_THRESHOLD):
    """Float32 mirror of rung 12's per-row score limit (``12_lazy_rescale.cu``, the kept-reference fast path):
    the largest float32 score s whose P against the kept reference, ``2^((s − m)·c + err)``, the kernel lets
    through its fast path, ``fma.rm(threshold − err, 1/c, m)``: ``m + (threshold − err)/c`` rounded down, with
    ``threshold − err`` and ``1/c`` float32 operations (``m``, ``err``: float32 tensors as
    :func:`online_rescale_fp32` leaves them, ``c``: the float32 ``scale·log2 e``). Rounded to nearest instead,
    a score at the limit could pass the bound by half a grid step of s (``tests/test_lazy_rescale_cpu.py``)."""
    f32 = torch.float32
    t = torch.tensor(threshold, dtype=f32) - err
    inv = torch.tensor(1.0, dtype=f32) / c
    exact = t.double() * inv.double() + m.double()  # the product is exact in float64; the sum rounds once
    y = exact.float()
    return torch.where(y.double() > exact, torch.nextafter(y, torch.full_like(y, -math.inf)), y)


F16_MAX = 65504.0


def _attention_tiled_fp32(
    q,
    k,
    v,
    scale,
    block_m,
    block_n,
    return_lse,
    p_dtype=torch.bfloat16,
    rescale_threshold=None,
    round_top_p=False,
    round_all_p=False,
):
    """The kernels' arithmetic (see the module docstring); float32 results (fp16 O with fp16 P)."""
    f32 = torch.float32
    fp16 = p_dtype == torch.float16
    if p_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"p_dtype must be torch.bfloat16 or torch.float16, got {p_dtype}")
    q, k, v = (t.to(torch.float64) for t in (q, k, v))  # bf16 (fp16) values: exact in float64
    scale32 = torch.tensor(scale, dtype=f32)
    if scale32 < 0:
        q, scale32 = -q, -scale32
    scale32 = torch.clamp(scale32, min=torch.finfo(f32).tiny)
    c = scale32 * torch.tensor(LOG2E, dtype=f32)
    b, h, sq, d = q.shape
    sk = k.shape[2]
    out = torch.empty(b, h, sq, d, dtype=torch.float16 if fp16 else f32)
    lse = torch.empty(b, h, sq, dtype=torch.float64)
    for m0 in range(0, sq, block_m):
        qt = q[:, :, m0 : m0 + block_m]
        rows = qt.shape[2]
        m = torch.full((b, h, rows, 1), ROW_MAX_INIT, dtype=f32)
        # rung 12 starts each row at err = +inf: its first tile always takes its own max as the reference
        err = torch.full((b, h, rows, 1), math.inf if rescale_threshold is not None else 0.0, dtype=f32)
        l = torch.zeros((b, h, rows, 1), dtype=f32)
        l_exact = torch.zeros((b, h, rows, 1), dtype=f32)  # l without round_top_p's roundings: the LSE's
        acc = torch.zeros((b, h, rows, d), dtype=f32)
        for n0 in range(0, sk, block_n):
            kt, vt = k[:, :, n0 : n0 + block_n], v[:, :, n0 : n0 + block_n]
            s = torch.matmul(qt, kt.transpose(-1, -2)).to(f32)  # fp32 scores (exact for exact-score inputs)
            if kt.shape[2] < block_n:  # the last tile: keys past seqlen_k are -inf
                s = torch.cat([s, s.new_full((b, h, rows, block_n - kt.shape[2]), -math.inf)], dim=-1)
                vt = torch.cat([vt, vt.new_zeros(b, h, block_n - vt.shape[2], d)], dim=2)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            if rescale_threshold is not None:  # rung 12: keep the reference while the new max's P <= 2^τ
                m_new = lazy_max_fp32(m, err, m_new, c, rescale_threshold)
            if fp16:  # P·2^−k (softmax.cuh, "fp16 P"): one FADD after the FFMA, in fp32
                alpha, mul, neg_ref, err, shift = online_rescale_fp32(m, err, m_new, c, shift=True)
                p = torch.exp2(_fma32(s, mul.expand_as(s), neg_ref.expand_as(s)) - shift)
            else:
                alpha, mul, neg_ref, err = online_rescale_fp32(m, err, m_new, c)
                p = torch.exp2(_fma32(s, mul.expand_as(s), neg_ref.expand_as(s)))
            p_sum = p.sum(dim=-1, keepdim=True)
            l_exact = l_exact * alpha + p_sum
            # round_all_p: l sums P as P·V does, each P rounded to p_dtype
            l = l * alpha + (p.to(p_dtype).to(f32).sum(dim=-1, keepdim=True) if round_all_p else p_sum)
            if round_top_p:  # the tile max's P counted in l as P·V counts it: rounded to p_dtype
                if round_top_p == "thread":  # rungs 12-16: each thread of the quad rounds its own columns' max's P
                    # (thread t of a quad holds the columns 8j + 2t and 8j + 2t + 1 of the tile)
                    tops = s.reshape(b, h, rows, block_n // 8, 4, 2).amax(dim=(-1, -3))
                else:
                    tops = s.amax(dim=-1, keepdim=True)
                top = _fma32(tops, mul.expand_as(tops), neg_ref.expand_as(tops))
                top = torch.exp2(top - shift) if fp16 else torch.exp2(top)
                l = l + (top.to(p_dtype).to(f32) - top).sum(dim=-1, keepdim=True)
            pv = torch.matmul(p.to(p_dtype).to(torch.float64), vt).to(f32)
            acc = acc * alpha + pv
            m = m_new
        inv_l = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))
        o = acc * inv_l
        if fp16:  # the epilogue's clamp_f16: finite values to ±65504 (fp16-rounded P can overshoot V's range)
            o = torch.where(o.abs() < math.inf, o.clamp(-F16_MAX, F16_MAX), o)
        out[:, :, m0 : m0 + rows] = o.to(out.dtype)
        lse[:, :, m0 : m0 + rows] = kernel_lse_fp32(m, l_exact, scale32, c, shift=fp16).double().squeeze(-1)
    return (out, lse) if return_lse else out


LN2_F32 = torch.tensor(math.log(2.0), dtype=torch.float32)


def kernel_lse_fp32(m, l, scale, c, shift=False):
    """Float32 mirror of the top rung's LSE epilogue (``WRITE_LSE`` in ``16_pingpong.cu``, as in rungs 10-15).

    ``m``: the rows' final running max of raw scores, ``l``: their row sums of P (float32 tensors),
    ``scale``: the float32 scale (``> 0``, after the kernels' negation and FLT_MIN clamp), ``c = scale·log2 e``.
    Soft rows (``mul == c``): ``LSE = fma(R, ln 2, ln l)`` with the row's ``R = m·c`` rounded up; hard rows:
    ``LSE = fma(m, scale, ln l)`` (natural units, finite wherever the exact LSE is). ``shift=True`` (the FP16
    variant, whose P and l are relative to ``R + k``): ``ln l`` becomes ``fma(k, ln 2, ln l)``,
    ``k = ceil(fma(m, mul, −R))`` (0 on hard rows).
    """
    mul = row_multiplier_fp32(m, c)
    log_l = torch.log(l.double()).float()
    if shift:
        k = p_shift_fp32(_fma32(m, mul, -_mul32_up(m, mul)))
        log_l = _fma32(k, LN2_F32.expand_as(m), log_l)
    soft = _fma32(_mul32_up(m, mul), LN2_F32.expand_as(m), log_l)
    hard = _fma32(m, scale.expand_as(m), log_l)
    return torch.where(mul == c, soft, hard)


def attention_tiled(
    q,
    k,
    v,
    scale=None,
    block_m=128,
    block_n=64,
    base2=False,
    dtype=torch.float64,
    return_lse=False,
    kernel_fp32=False,
    p_dtype=torch.bfloat16,
    rescale_threshold=None,
    round_top_p=False,
    round_all_p=False,
):
    """Tiled online-softmax attention, the kernels' algorithm, simulated on the CPU in ``dtype``.

    Tiles past ``seqlen_k`` are padded with zeros and their scores masked to ``-inf`` exactly as the
    kernels do, so ragged tails are exercised. Returns ``O`` (``(B, H, Sq, D)`` in ``dtype``) and, with
    ``return_lse``, the row log-sum-exp (natural log) as well. ``kernel_fp32=True`` mirrors the rung-4+
    kernels' fp32 arithmetic instead (``base2`` and ``dtype`` are then ignored; ``O`` is float32, the
    LSE float64): inputs should hold bf16 values. With it, ``p_dtype=torch.float16`` models the top rung's
    FP16 variant (inputs holding fp16 values; P shifted per row and rounded to fp16, ``softmax.cuh``; ``O``
    is then float16, as the kernel writes it). ``rescale_threshold`` (with ``kernel_fp32``; rung 12's
    ``RESCALE_THRESHOLD``, 8.0) models the lazy rescale: a row keeps its reference (its running max) while
    the new max's P against it, ``2^((m_new − m)·c + err)``, is at most ``2^rescale_threshold`` (a row's
    first tile always rescales: ``err`` starts at +inf). ``round_top_p`` (with ``kernel_fp32``) adds to l, per
    row and tile, the rounding of the tile max's P to ``p_dtype``, so that the key that sets the max weighs in
    l exactly as in P·V (the LSE still takes the unrounded sum). Old rung 14 (the lazy rescale alone, before
    the re-cut merged it with the kept-reference path into rung 12) is ``rescale_threshold=8.0,
    round_top_p=True``; without ``round_top_p`` the model is old rung 14 as first landed (its ``nolfix`` A/B
    variant, ``scripts/make_variants.py`` at commit 8cedb83). ``round_top_p="thread"`` rounds, instead, the P of
    each quad thread's own column max (thread t holds the columns ``8j + 2t`` and ``8j + 2t + 1`` of a tile;
    ``block_n`` a multiple of 8): four P per row and tile, the row max's among them. Rungs 12-16 are
    ``rescale_threshold=8.0, round_top_p="thread"`` (their fast path for kept references decides on each
    thread's own maxima and takes the same references as old rung 14). ``round_all_p`` (with ``kernel_fp32``;
    old rung 14's ``lround`` A/B variant) sums
    every P into l rounded to ``p_dtype``, exactly the weights P·V uses; the LSE again takes the unrounded sum.

    Raises ``ValueError`` for non-positive tile sizes, incompatible shapes, another ``p_dtype``, or a
    ``rescale_threshold`` without ``kernel_fp32``.
    """
    _check(q, k, v)
    if block_m <= 0 or block_n <= 0:
        raise ValueError("block sizes must be positive")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if round_top_p and round_all_p:
        raise ValueError("round_top_p and round_all_p are two models of l: pass one")
    if round_top_p not in (False, True, "thread"):
        raise ValueError(f"round_top_p must be False, True or 'thread', got {round_top_p!r}")
    if round_top_p == "thread" and block_n % 8:
        raise ValueError(f"round_top_p='thread' needs block_n a multiple of 8 (n8 column tiles), got {block_n}")
    if kernel_fp32:
        return _attention_tiled_fp32(
            q, k, v, scale, block_m, block_n, return_lse, p_dtype, rescale_threshold, round_top_p, round_all_p
        )
    if rescale_threshold is not None or round_top_p or round_all_p:
        raise ValueError(
            "rescale_threshold, round_top_p and round_all_p model the kernels' fp32 arithmetic: pass kernel_fp32=True"
        )
    q, k, v = (t.to(dtype) for t in (q, k, v))
    # As the kernels do: a negative scale negates Q (softmax(scale·S) = softmax(|scale|·(−S))), so the
    # running max of raw scores is the max of scaled ones; a zero scale becomes the smallest normal
    # float (the same uniform P, while −inf · scale stays −inf for masked keys).
    if scale < 0:
        q, scale = -q, -scale
    scale = max(scale, torch.finfo(dtype).tiny)
    b, h, sq, d = q.shape
    sk = k.shape[2]
    n_tiles = -(-sk // block_n)
    pad = n_tiles * block_n - sk
    if pad:
        k = torch.cat([k, k.new_zeros(b, h, pad, d)], dim=2)
        v = torch.cat([v, v.new_zeros(b, h, pad, d)], dim=2)
    out = torch.empty(b, h, sq, d, dtype=dtype)
    lse = torch.empty(b, h, sq, dtype=dtype)
    c = scale * LOG2E if base2 else scale
    exp = torch.exp2 if base2 else torch.exp
    for m0 in range(0, sq, block_m):
        qt = q[:, :, m0 : m0 + block_m]
        rows = qt.shape[2]
        m = torch.full((b, h, rows, 1), -math.inf, dtype=dtype)
        l = torch.zeros((b, h, rows, 1), dtype=dtype)
        acc = torch.zeros((b, h, rows, d), dtype=dtype)
        for n0 in range(0, n_tiles * block_n, block_n):
            s = torch.matmul(qt, k[:, :, n0 : n0 + block_n].transpose(-1, -2))  # raw scores
            valid = torch.arange(n0, n0 + block_n) < sk
            s = s.masked_fill(~valid, -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            # m_new is finite: every tile holds >= 1 valid key (n0 < sk), so no (-inf) - (-inf).
            alpha = exp((m - m_new) * c)  # exp(-inf) = 0 on the first tile
            p = exp((s - m_new) * c)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + torch.matmul(p, v[:, :, n0 : n0 + block_n])
            m = m_new
        out[:, :, m0 : m0 + rows] = acc / l
        lse[:, :, m0 : m0 + rows] = (m * scale + torch.log(l)).squeeze(-1)
    return (out, lse) if return_lse else out


def rel_l2(out, ref) -> float:
    """Relative L2 error ``‖out − ref‖ / ‖ref‖``, in float64 on ``ref``'s device.

    ``inf`` if ``out`` has any NaN or inf; for an all-zero ``ref``: 0 when ``out`` is zero too, else inf.
    """
    ref64 = ref.detach().to(torch.float64)
    out64 = out.detach().to(device=ref64.device, dtype=torch.float64)
    if not torch.isfinite(out64).all():
        return math.inf
    num = float(torch.linalg.vector_norm(out64 - ref64))
    den = float(torch.linalg.vector_norm(ref64))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def far_offset_log2(scale, log2_mc):
    """The largest ``log2_offset`` of :func:`far_offset_inputs` whose scores ``127·2^p`` keep
    ``|max·scale·log2(e)|`` under ``2^log2_mc`` (to aim a test at a magnitude of ``max·c``)."""
    return math.floor(log2_mc - math.log2(127 * abs(scale) * LOG2E))


def far_offset_inputs(
    batch,
    seqlen_q,
    seqlen_k,
    log2_offset,
    scale,
    head_dim=128,
    ties=False,
    generator=None,
    device="cpu",
    dtype=torch.bfloat16,
):
    """bf16 Q, K, V whose scores all sit near ``±127·2^log2_offset`` yet differ by a few units of softmax.

    The hostile input of issue 6, generalised to any magnitude: ``(batch, 2, seqlen, head_dim)`` tensors
    where head 0's scores are ``+127·2^p + δ`` and head 1's ``−127·2^p + δ`` (``p = log2_offset``). Columns
    ``0..head_dim−2`` of Q are ``2^⌈p/2⌉``, of K ``±2^⌊p/2⌋``; the last column of Q is one of ``{±1, ±2}`` per
    row, of K a multiple of the unit ``u = 2^(p−17)`` per key (``ulp(127·2^p)``), so every score and every
    partial sum of it is exact in fp32, in any summation order. The multiples span about ±4 in units of
    ``scale·log2(e)·δ`` (a soft softmax) while ``u`` allows it, and collapse to ties and near-one-hot rows
    at large ``p``. ``ties=True`` makes the last column of K zero: every score of a row equal. V is standard
    normal. Needs ``0 <= p <= 121`` (the largest score ``127·2^121`` is finite in fp32) and ``head_dim >= 2``.
    ``dtype=torch.float16`` gives fp16 tensors of the same values, which needs them to be fp16 numbers
    (``p <= 30`` and the last column of K within ±65504).

    Raises ``ValueError`` outside those ranges.
    """
    if not 0 <= log2_offset <= 121:
        raise ValueError(f"log2_offset must be in [0, 121], got {log2_offset}")
    if head_dim < 2:
        raise ValueError("head_dim must be >= 2")
    g = generator
    p = int(log2_offset)
    unit = 2.0 ** (p - 17)
    c = abs(scale) * LOG2E if scale else LOG2E
    reach = int(min(64, max(1, round(4.0 / (unit * c)))))
    shape_q, shape_k = (batch, 2, seqlen_q, head_dim), (batch, 2, seqlen_k, head_dim)
    kw = {"dtype": torch.float64, "device": device}
    q = torch.full(shape_q, 2.0 ** (p - p // 2), **kw)
    k = torch.full(shape_k, 2.0 ** (p // 2), **kw)
    k[:, 1] *= -1
    choices = torch.tensor([1.0, -1.0, 2.0, -2.0], **kw)
    q[..., -1] = choices[torch.randint(0, 4, shape_q[:3], generator=g, device=device)]
    if ties:
        k[..., -1] = 0.0
    else:
        k[..., -1] = unit * torch.randint(-reach, reach + 1, shape_k[:3], generator=g, device=device).to(torch.float64)
    v = torch.randn(shape_k, generator=g, **kw)
    out = tuple(t.to(dtype) for t in (q, k, v))
    if any(not torch.equal(o.to(torch.float64), t) for o, t in zip(out[:2], (q, k))):
        raise ValueError(f"log2_offset {p} with scale {scale}: Q or K is not exact in {dtype}")
    return out
