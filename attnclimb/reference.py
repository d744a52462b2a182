"""CPU references: exact float64 attention and a tiled online-softmax simulator.

The simulator follows the same algorithm as the fused kernels (rungs 1+): for each ``BLOCK_M`` rows of Q,
loop over ``BLOCK_N``-row tiles of K/V, keep a running row max ``m`` and row sum ``l``, rescale the output
accumulator by ``exp(m_old - m_new)``, and normalise once at the end (FlashAttention, Dao et al. 2022,
Sec. 3.1; Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"). With ``base2=True`` it
uses the rung-4+ form: ``exp2(s * scale * log2(e) - m * scale * log2(e))`` on raw scores. In float64 it
agrees with :func:`attention_exact` to ~1e-15, which pins the algorithm the kernels implement.
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


def attention_exact(q, k, v, scale=None):
    """Exact attention in float64: ``softmax(scale · Q Kᵀ) V``.

    ``q``: ``(B, H, Sq, D)``, ``k``/``v``: ``(B, H, Sk, D)``, any float dtype, any device (computed on the
    tensors' device in float64). Returns a float64 ``(B, H, Sq, D)`` tensor. ``scale`` defaults to ``1/sqrt(D)``.
    """
    _check(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


def lse_exact(q, k, scale=None):
    """Row log-sum-exp of ``scale · Q Kᵀ`` in float64 (natural log), shape ``(B, H, Sq)``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q.to(torch.float64), k.to(torch.float64).transpose(-1, -2)) * scale
    return torch.logsumexp(s, dim=-1)


def attention_tiled(q, k, v, scale=None, block_m=128, block_n=64, base2=False, dtype=torch.float64,
                    return_lse=False):
    """Tiled online-softmax attention, the kernels' algorithm, simulated on the CPU in ``dtype``.

    Tiles past ``seqlen_k`` are padded with zeros and their scores masked to ``-inf`` exactly as the
    kernels do, so ragged tails are exercised. Returns ``O`` (``(B, H, Sq, D)`` in ``dtype``) and, with
    ``return_lse``, the row log-sum-exp (natural log) as well.

    Raises ``ValueError`` for non-positive tile sizes or incompatible shapes.
    """
    _check(q, k, v)
    if block_m <= 0 or block_n <= 0:
        raise ValueError("block sizes must be positive")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
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
        qt = q[:, :, m0:m0 + block_m]
        rows = qt.shape[2]
        m = torch.full((b, h, rows, 1), -math.inf, dtype=dtype)
        l = torch.zeros((b, h, rows, 1), dtype=dtype)
        acc = torch.zeros((b, h, rows, d), dtype=dtype)
        for n0 in range(0, n_tiles * block_n, block_n):
            s = torch.matmul(qt, k[:, :, n0:n0 + block_n].transpose(-1, -2))  # raw scores
            valid = torch.arange(n0, n0 + block_n) < sk
            s = s.masked_fill(~valid, -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            # m_new is finite: every tile holds >= 1 valid key (n0 < sk), so no (-inf) - (-inf).
            alpha = exp((m - m_new) * c)  # exp(-inf) = 0 on the first tile
            p = exp((s - m_new) * c)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + torch.matmul(p, v[:, :, n0:n0 + block_n])
            m = m_new
        out[:, :, m0:m0 + rows] = acc / l
        lse[:, :, m0:m0 + rows] = (m * scale + torch.log(l)).squeeze(-1)
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
