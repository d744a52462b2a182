"""Benchmark shapes and the FLOP count that turns a time into TFLOP/s.

Two families of shapes, all head_dim 128, bf16, non-causal:

* the FlashAttention papers' sweep: 16 heads, ``batch * seqlen = 16384`` tokens, seqlen 1k .. 16k
  (4k, 8k and 16k are the headline columns);
* one real video-DiT shape: Wan2.1-T2V-1.3B at 480p, 81 frames -> batch 1, 12 heads, seqlen 32760.
"""

from __future__ import annotations

from dataclasses import dataclass

HEAD_DIM = 128
FA_HEADS = 16
FA_TOKENS = 16384  # batch * seqlen for the FA-paper sweep
FA_SEQLENS = (1024, 2048, 4096, 8192, 16384)
HEADLINE_SEQLENS = (4096, 8192, 16384)
QUICK_SEQLENS = (4096, 16384)
WAN_KEY = "wan"


@dataclass(frozen=True)
class Shape:
    """One attention problem: q is ``(batch, heads, seqlen_q, head_dim)``, k/v ``(batch, heads, seqlen_k, head_dim)``.

    Attributes:
        name: stable identifier used in JSON rows and table columns (``"fa-4k"``, ``"wan2.1-1.3b-480p"``).
        label: short column header (``"4k"``, ``"Wan2.1-1.3B 480p"``).
        headline: True for the 4k/8k/16k FA columns (plotted on the chart).
    """

    name: str
    label: str
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int = HEAD_DIM
    causal: bool = False
    headline: bool = False

    @property
    def seqlen(self) -> int:
        """The longer of the two sequence lengths (what ``Rung.max_bench_seqlen`` is compared with)."""
        return max(self.seqlen_q, self.seqlen_k)

    @property
    def flops(self) -> float:
        """Forward FLOPs of this shape (see :func:`attention_flops`)."""
        return attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.head_dim, self.causal)

    def qkv_bytes(self, elem_bytes: int = 2) -> int:
        """Bytes of one (q, k, v) set at ``elem_bytes`` per element (2 for bf16)."""
        per_head = (self.seqlen_q + 2 * self.seqlen_k) * self.head_dim
        return self.batch * self.heads * per_head * elem_bytes


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool = False) -> float:
    """FLOPs of one attention forward: ``4 * B * H * Sq * Sk * D`` (two GEMMs, 2 FLOPs per MAC).

    The softmax is not counted (the FlashAttention papers' convention). Causal masking halves the count.
    Returns a float (the products overflow nothing in Python, but callers divide anyway).
    """
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return f / 2 if causal else f


def tflops(flops: float, ms: float) -> float:
    """Throughput in TFLOP/s for ``flops`` FLOPs done in ``ms`` milliseconds. ``ValueError`` if ``ms <= 0``."""
    if not ms > 0:
        raise ValueError(f"time must be positive, got {ms!r} ms")
    return flops / (ms * 1e-3) / 1e12


def seqlen_label(seqlen: int) -> str:
    """``4096 -> "4k"``, ``1000 -> "1000"`` (only exact multiples of 1024 get the ``k`` suffix)."""
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def fa_shape(seqlen: int) -> Shape:
    """The FA-paper shape at ``seqlen``: 16 heads, ``batch = round(16384 / seqlen)`` (at least 1);
    ``ValueError`` for ``seqlen < 1``."""
    if seqlen < 1:
        raise ValueError(f"seqlen must be >= 1, got {seqlen}")
    batch = max(1, round(FA_TOKENS / seqlen))
    return Shape(
        name=f"fa-{seqlen_label(seqlen)}",
        label=seqlen_label(seqlen),
        batch=batch,
        heads=FA_HEADS,
        seqlen_q=seqlen,
        seqlen_k=seqlen,
        headline=seqlen in HEADLINE_SEQLENS,
    )


# Wan2.1-T2V-1.3B, 480p (832x480), 81 frames: the VAE compresses 4x in time and 8x in space, the DiT
# patchifies 2x2 -> 21 latent frames x (60/2) x (104/2) = 21 * 30 * 52 = 32760 tokens; dim 1536 = 12 heads x 128.
WAN_SHAPE = Shape(name="wan2.1-1.3b-480p", label="Wan2.1-1.3B 480p", batch=1, heads=12, seqlen_q=32760, seqlen_k=32760)


def parse_seqlens(spec: str) -> tuple:
    """Parse ``--seqlens``: comma-separated ints, ``Nk`` (x1024) or ``wan``. Returns ints and/or ``"wan"``.

    ``ValueError`` on an unparseable or non-positive entry.
    """
    out = []
    for tok in spec.split(","):
        tok = tok.strip().lower()
        if not tok:
            continue
        if tok in (WAN_KEY, "wan2.1", WAN_SHAPE.name):
            item = WAN_KEY
        else:
            try:
                item = int(tok[:-1]) * 1024 if tok.endswith("k") else int(tok)
            except ValueError:
                raise ValueError(f"bad seqlen {tok!r}: use e.g. 4096, 4k or wan") from None
            if item < 1:
                raise ValueError(f"seqlen must be >= 1, got {item}")
        if item not in out:
            out.append(item)
    if not out:
        raise ValueError("empty --seqlens")
    return tuple(out)


def default_shapes(seqlens=None, quick: bool = False) -> list:
    """The shapes a bench run times, in column order (FA sweep by seqlen, then Wan).

    Args:
        seqlens: None for the default set, else an iterable of ints and/or ``"wan"`` (see
            :func:`parse_seqlens`); ints become FA-paper shapes.
        quick: with ``seqlens=None``, only 4k and 16k plus the Wan shape.
    """
    if seqlens is None:
        seqlens = (*(QUICK_SEQLENS if quick else FA_SEQLENS), WAN_KEY)
    fa = sorted({s for s in seqlens if s != WAN_KEY})
    shapes = [fa_shape(s) for s in fa]
    if WAN_KEY in seqlens:
        shapes.append(WAN_SHAPE)
    return shapes
