"""Benchmark shapes and the FLOP count that turns a time into TFLOP/s.

The default run: head_dim 128, bf16, non-causal, equal head counts for q and k/v:

* the FlashAttention papers' sweep: 16 heads, ``batch * seqlen = 16384`` tokens, seqlen 1k .. 16k
  (4k, 8k and 16k are the headline columns);
* three video-DiT shapes of Wan2.1-T2V: the 1.3B model's self-attention at 480p, the 14B model's
  self-attention at 720p, and the 14B model's cross-attention from the 720p video tokens to the 512
  umT5 text tokens.

A :class:`Shape` also carries ``causal``, ``head_dim`` and ``heads_kv`` (grouped-query attention), and
puts them into its name, label and FLOP count the same way everywhere (:func:`fa_shape`).

A second group of columns, ``"features"`` (:data:`FEATURE_SHAPES`, issue 8), runs after those in the
default run: causal masking at head_dim 128 on the FA-paper shapes at 1k, 4k, 8k and 16k (FLOPs halved),
the grouped-query attention of a current LLM (32 query heads, 8 K/V heads, head_dim 128, seqlen 8k,
batch 2), non-causal and causal, and head_dim 64 and 256 at seqlen 8k (batch 2), each non-causal and
causal, with the FA papers' head counts (heads * head_dim = 2048: 32 heads at 64, 8 at 256). Only the
top rung has these variants (``Rung.features`` and ``Rung.head_dims``); the other rungs are skipped on
them with the reason. fp16 (the top rung's FP16 variant) is not in the default run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

HEAD_DIM = 128
FA_HEADS = 16
FA_TOKENS = 16384  # batch * seqlen for the FA-paper sweep
FA_SEQLENS = (1024, 2048, 4096, 8192, 16384)
HEADLINE_SEQLENS = (4096, 8192, 16384)
QUICK_SEQLENS = (4096, 16384)
WAN_KEY = "wan"  # Wan2.1-1.3B 480p self-attention
WAN14B_KEY = "wan14b"  # Wan2.1-14B 720p self-attention
WAN_CROSS_KEY = "wan-cross"  # Wan2.1-14B 720p cross-attention to the text tokens


@dataclass(frozen=True)
class Shape:
    """One attention problem: q ``(batch, heads, seqlen_q, head_dim)``, k/v ``(batch, kv_heads, seqlen_k, head_dim)``.

    Attributes:
        name: stable identifier used in JSON rows and table columns (``"fa-4k"``, ``"wan2.1-1.3b-480p"``).
        label: short column header (``"4k"``, ``"Wan2.1-1.3B 480p"``).
        headline: True for the 4k/8k/16k FA columns (plotted on the chart).
        causal: the mask of torch SDPA's ``is_causal=True`` (query i sees keys 0..i); halves the FLOPs.
        heads_kv: K/V heads for grouped-query attention (must divide ``heads``); ``None`` = ``heads``.
            Query head ``h`` reads K/V head ``h // (heads // kv_heads)``. FLOPs count query heads.
        group: which table the column belongs to: ``"main"`` (:data:`MAIN_GROUP`, the ladder's shapes) or
            ``"features"`` (:data:`FEATURE_GROUP`, causal, GQA and head_dim 64/256 columns, issue 8).
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
    heads_kv: int | None = None
    group: str = "main"

    def __post_init__(self):
        if min(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.head_dim) < 1:
            raise ValueError(f"{self.name}: batch, heads, seqlens and head_dim must be >= 1")
        if self.heads_kv is not None and (self.heads_kv < 1 or self.heads % self.heads_kv):
            raise ValueError(f"{self.name}: heads_kv={self.heads_kv} must divide heads={self.heads}")

    @property
    def kv_heads(self) -> int:
        """Heads of k and v (``heads_kv``, else ``heads``)."""
        return self.heads if self.heads_kv is None else self.heads_kv

    @property
    def gqa(self) -> bool:
        """True when k/v have fewer heads than q."""
        return self.kv_heads != self.heads

    @property
    def seqlen(self) -> int:
        """The longer of the two sequence lengths (what ``Rung.max_bench_seqlen`` is compared with)."""
        return max(self.seqlen_q, self.seqlen_k)

    @property
    def flops(self) -> float:
        """Forward FLOPs of this shape (see :func:`attention_flops`)."""
        return attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.head_dim, self.causal)

    @property
    def detail(self) -> str:
        """The dimensions in a column header: ``"B1 H12 S32760"``, ``"B1 H40 Sq75600 Sk512"``,
        ``"B2 H32/8 S8192 D64"`` (K/V heads after the slash; ``D`` only when head_dim is not 128)."""
        return shape_detail(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.kv_heads, self.head_dim)

    def qkv_bytes(self, elem_bytes: int = 2) -> int:
        """Bytes of one (q, k, v) set at ``elem_bytes`` per element (2 for bf16)."""
        per_batch = (self.heads * self.seqlen_q + 2 * self.kv_heads * self.seqlen_k) * self.head_dim
        return self.batch * per_batch * elem_bytes


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool = False) -> float:
    """FLOPs of one attention forward: ``4 * B * H * Sq * Sk * D`` (two GEMMs, 2 FLOPs per MAC).

    ``heads`` are query heads (grouped-query attention does the same work with fewer K/V heads). The
    softmax is not counted (the FlashAttention papers' convention). Causal masking halves the count (the
    same convention; exact for ``Sq = Sk`` up to the diagonal). Returns a float.
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


def shape_detail(batch, heads, seqlen_q, seqlen_k, heads_kv=None, head_dim=HEAD_DIM) -> str:
    """See :attr:`Shape.detail` (a function so that the report can use it on a results JSON)."""
    h = f"H{heads}" if heads_kv in (None, heads) else f"H{heads}/{heads_kv}"
    s = f"S{seqlen_k}" if seqlen_q == seqlen_k else f"Sq{seqlen_q} Sk{seqlen_k}"
    d = "" if head_dim == HEAD_DIM else f" D{head_dim}"
    return f"B{batch} {h} {s}{d}"


def variant_suffixes(head_dim: int = HEAD_DIM, heads: int | None = None, heads_kv=None, causal: bool = False) -> tuple:
    """``(name_suffix, label_suffix)`` for the ways a shape differs from the default (head_dim 128,
    equal heads, non-causal): ``("", "")`` for the default, ``("-d64-gqa32x8-causal", " d64 GQA 32/8 causal")``
    for all three; every shape builder uses this, so names and labels stay consistent."""
    name, label = "", ""
    if head_dim != HEAD_DIM:
        name, label = name + f"-d{head_dim}", label + f" d{head_dim}"
    if heads_kv is not None and heads_kv != heads:
        name, label = name + f"-gqa{heads}x{heads_kv}", label + f" GQA {heads}/{heads_kv}"
    if causal:
        name, label = name + "-causal", label + " causal"
    return name, label


def fa_shape(
    seqlen: int, head_dim: int = HEAD_DIM, causal: bool = False, heads: int | None = None, heads_kv: int | None = None
) -> Shape:
    """The FA-paper shape at ``seqlen``: ``batch = round(16384 / seqlen)`` (at least 1) and
    ``16 * 128 / head_dim`` heads unless ``heads`` says (16 at head_dim 128, 32 at 64, 8 at 256: the
    FA papers keep the model width 2048). ``ValueError`` for ``seqlen < 1``.

    The default variant is ``fa-4k`` / ``"4k"`` and the headline columns are 4k/8k/16k of it; other
    variants get suffixes from :func:`variant_suffixes` and are not headline columns.
    """
    if seqlen < 1:
        raise ValueError(f"seqlen must be >= 1, got {seqlen}")
    if heads is None:
        heads = max(1, FA_HEADS * HEAD_DIM // head_dim)
    batch = max(1, round(FA_TOKENS / seqlen))
    name_sfx, label_sfx = variant_suffixes(head_dim, heads, heads_kv, causal)
    default_variant = not name_sfx and heads == FA_HEADS
    if heads != FA_HEADS * HEAD_DIM // head_dim and heads_kv in (None, heads):  # GQA names both counts
        name_sfx, label_sfx = f"-h{heads}{name_sfx}", f" H{heads}{label_sfx}"  # a non-standard count: say so
    return Shape(
        name=f"fa-{seqlen_label(seqlen)}{name_sfx}",
        label=f"{seqlen_label(seqlen)}{label_sfx}",
        batch=batch,
        heads=heads,
        seqlen_q=seqlen,
        seqlen_k=seqlen,
        head_dim=head_dim,
        causal=causal,
        headline=default_variant and seqlen in HEADLINE_SEQLENS,
        heads_kv=None if heads_kv in (None, heads) else heads_kv,
    )


# Wan2.1-T2V: the VAE compresses 4x in time and 8x in space, the DiT patchifies 2x2; 81 frames ->
# 1 + 80/4 = 21 latent frames. Heads are 128 wide.
# 1.3B, 480p (832x480): 21 x (480/16) x (832/16) = 21 * 30 * 52 = 32760 tokens; dim 1536 = 12 heads.
WAN_SHAPE = Shape(name="wan2.1-1.3b-480p", label="Wan2.1-1.3B 480p", batch=1, heads=12, seqlen_q=32760, seqlen_k=32760)
# 14B, 720p (1280x720): 21 x (720/16) x (1280/16) = 21 * 45 * 80 = 75600 tokens; dim 5120 = 40 heads.
WAN14B_SHAPE = Shape(name="wan2.1-14b-720p", label="Wan2.1-14B 720p", batch=1, heads=40, seqlen_q=75600, seqlen_k=75600)
# 14B cross-attention: queries are the 75600 video tokens, keys/values the 512 umT5 text tokens
# (the text encoder's output padded to text_len = 512).
WAN_TEXT_TOKENS = 512
WAN_CROSS_SHAPE = Shape(
    name="wan2.1-14b-720p-cross",
    label="Wan2.1-14B 720p cross-attn",
    batch=1,
    heads=40,
    seqlen_q=75600,
    seqlen_k=WAN_TEXT_TOKENS,
)
# One sentence per named shape for the README caption (only shapes added since the 1.3B one, so that
# older results render as they did).
SHAPE_NOTES = {
    WAN14B_SHAPE.name: "the 14B model's self-attention over 81 frames at 1280×720 (21 × 45 × 80 = 75600 tokens)",
    WAN_CROSS_SHAPE.name: "its cross-attention from those 75600 video tokens to the 512 umT5 text tokens",
}
# The drop-in rows (issue 9, attnclimb/bench/dropin.py): a BSHD-view call against the contiguous call on
# the Wan2.1-1.3B shape and the 4k FA shape, and the host overhead per call on a tiny problem whose kernel
# takes a few microseconds, so that the host sets the pace.
BSHD_VIEW_SHAPES = (WAN_SHAPE, fa_shape(4096))
HOST_OVERHEAD_SHAPE = Shape(name="tiny-1x1x128", label="(1, 1, 128, 128)", batch=1, heads=1, seqlen_q=128, seqlen_k=128)
NAMED_SHAPES = {WAN_KEY: WAN_SHAPE, WAN14B_KEY: WAN14B_SHAPE, WAN_CROSS_KEY: WAN_CROSS_SHAPE}  # column order
_ALIASES = {
    WAN_KEY: (WAN_KEY, "wan1.3b", "wan2.1", WAN_SHAPE.name),
    WAN14B_KEY: (WAN14B_KEY, "wan2.1-14b", WAN14B_SHAPE.name),
    WAN_CROSS_KEY: (WAN_CROSS_KEY, "wancross", "wan14b-cross", WAN_CROSS_SHAPE.name),
}

# The feature columns (issue 8): their own table in the report, after the main one.
MAIN_GROUP, FEATURE_GROUP = "main", "features"
CAUSAL_SEQLENS = (1024, 4096, 8192, 16384)
GQA_SEQLEN, GQA_HEADS, GQA_HEADS_KV = 8192, 32, 8  # e.g. Llama-3-8B's attention: 32 query heads, 8 K/V heads
# head_dim 64 and 256 (the top rung's Rung.head_dims): FA-paper shapes at 8k, 32 and 8 heads (model width 2048)
HDIM_SEQLEN, FEATURE_HEAD_DIMS = 8192, (64, 256)


def _feature(shape: Shape) -> Shape:
    return dataclasses.replace(shape, group=FEATURE_GROUP)


FEATURE_SHAPES = {
    s.name: s
    for s in (
        *(_feature(fa_shape(n, causal=True)) for n in CAUSAL_SEQLENS),
        _feature(fa_shape(GQA_SEQLEN, heads=GQA_HEADS, heads_kv=GQA_HEADS_KV)),
        _feature(fa_shape(GQA_SEQLEN, heads=GQA_HEADS, heads_kv=GQA_HEADS_KV, causal=True)),
        *(_feature(fa_shape(HDIM_SEQLEN, head_dim=d, causal=c)) for d in FEATURE_HEAD_DIMS for c in (False, True)),
    )
}  # column order: fa-1k-causal ... fa-16k-causal, fa-8k-gqa32x8, fa-8k-gqa32x8-causal, fa-8k-d64, fa-8k-d64-causal,
# fa-8k-d256, fa-8k-d256-causal
# --seqlens names for groups of feature columns (each column's own name works too)
FEATURE_ALIASES = {
    "causal": tuple(n for n, s in FEATURE_SHAPES.items() if s.causal and not s.gqa and s.head_dim == HEAD_DIM),
    "gqa": tuple(n for n, s in FEATURE_SHAPES.items() if s.gqa),
    "hdim": tuple(n for n, s in FEATURE_SHAPES.items() if s.head_dim != HEAD_DIM),
    FEATURE_GROUP: tuple(FEATURE_SHAPES),
}
SHAPE_KEYS = {alias: key for key, aliases in _ALIASES.items() for alias in aliases}
SHAPE_KEYS.update({name: name for name in FEATURE_SHAPES})
DEFAULT_SEQLENS = (*FA_SEQLENS, *NAMED_SHAPES, *FEATURE_SHAPES)
# --quick: one column per feature, the GQA and head_dim ones causal too; of the head dims, 256 (64-key tiles)
# and 64 (three consumer warpgroups, 192-row tiles): both change the tiles (Rung.head_dims)
QUICK_FEATURES = ("fa-4k-causal", "fa-8k-gqa32x8-causal", "fa-8k-d64-causal", "fa-8k-d256-causal")
QUICK_DEFAULT = (*QUICK_SEQLENS, WAN_KEY, *QUICK_FEATURES)


def parse_seqlens(spec: str) -> tuple:
    """Parse ``--seqlens``: comma-separated ints, ``Nk`` (x1024), the named shapes ``wan`` (Wan2.1-1.3B
    480p), ``wan14b`` (Wan2.1-14B 720p) and ``wan-cross`` (its cross-attention to text), the feature
    columns by name (``fa-4k-causal``, ``fa-8k-gqa32x8``, ``fa-8k-d64``, ...) or by group: ``causal`` (the
    four causal columns at head_dim 128), ``gqa`` (the two GQA columns), ``hdim`` (the four head_dim 64/256
    columns), ``features`` (all ten); a named shape's full name works too.
    Returns ints and/or those keys (a group as its columns' names), first occurrence kept.

    ``ValueError`` on an unparseable or non-positive entry.
    """
    out = []
    for tok in spec.split(","):
        tok = tok.strip().lower()
        if not tok:
            continue
        if tok in FEATURE_ALIASES:
            out += [n for n in FEATURE_ALIASES[tok] if n not in out]
            continue
        if tok in SHAPE_KEYS:
            item = SHAPE_KEYS[tok]
        else:
            try:
                item = int(tok[:-1]) * 1024 if tok.endswith("k") else int(tok)
            except ValueError:
                raise ValueError(
                    f"bad seqlen {tok!r}: use e.g. 4096, 4k, {', '.join(NAMED_SHAPES)}, {', '.join(FEATURE_ALIASES)}"
                ) from None
            if item < 1:
                raise ValueError(f"seqlen must be >= 1, got {item}")
        if item not in out:
            out.append(item)
    if not out:
        raise ValueError("empty --seqlens")
    return tuple(out)


def default_shapes(seqlens=None, quick: bool = False, features: bool = True) -> list:
    """The shapes a bench run times, in column order (FA sweep by seqlen, then the named shapes in
    :data:`NAMED_SHAPES` order, then the feature columns in :data:`FEATURE_SHAPES` order).

    Args:
        seqlens: None for the default set (:data:`DEFAULT_SEQLENS`), else an iterable of ints and/or
            keys of :data:`NAMED_SHAPES` and :data:`FEATURE_SHAPES` (see :func:`parse_seqlens`); ints
            become FA-paper shapes.
        quick: with ``seqlens=None``, only 4k and 16k plus the Wan2.1-1.3B shape, and of the feature
            columns causal 4k, causal GQA and causal head_dim 256 (:data:`QUICK_FEATURES`).
        features: ``False`` leaves the feature columns out (whatever ``seqlens`` names).
    """
    if seqlens is None:
        seqlens = QUICK_DEFAULT if quick else DEFAULT_SEQLENS
    fa = sorted({s for s in seqlens if isinstance(s, int)})
    out = [fa_shape(s) for s in fa] + [shape for key, shape in NAMED_SHAPES.items() if key in seqlens]
    if features:
        out += [shape for name, shape in FEATURE_SHAPES.items() if name in seqlens]
    return out
