"""The ladder as data: one :class:`Rung` per kernel file in ``attnclimb/kernels``.

Everything a launch needs that can be computed on the host lives here (tile sizes, threads per CTA,
dynamic shared memory, compile-time macros, which SASS instructions the rung claims), so the ``.cu``
files hold device code only. See ``docs/kernel-abi.md`` for the contract between the two.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
HEAD_DIM = 128
BF16_BYTES = 2


L2_PROMOTIONS = (0, 64, 128, 256)  # Rung.l2_promotion: bytes per L2 fill from DRAM (0: no promotion)


@dataclass(frozen=True, eq=False)  # identity hash: a Rung keys the loaded-module cache
class Rung:
    """One kernel of the ladder.

    Attributes:
        number: position on the ladder (0 = unfused baseline).
        name: short name; the kernel file is ``kernels/NN_<name>.cu`` and the page
            ``docs/rungs/NN-<name with dashes>.md``.
        idea: the one optimisation this rung adds over the rung below.
        abi: ``"unfused"`` (rung 0's three kernels), ``"pointer"`` (``attn_fwd`` on raw pointers) or
            ``"tma"`` (``attn_fwd`` on three TMA tensor maps); see ``docs/kernel-abi.md``.
        block_m: rows of Q per CTA (``BLOCK_M``).
        block_n: rows of K/V per inner-loop tile (``BLOCK_N``).
        threads: threads per CTA (``NUM_THREADS``).
        smem_layout: how the kernel carves its dynamic shared memory, a key of :data:`SMEM_LAYOUTS`;
            ``smem_bytes`` (a property) derives the size from it, the tile sizes and ``NUM_STAGES``, and
            the kernel receives it as ``SMEM_BYTES`` and ``static_assert``s that its own layout matches.
        extra_defines: further ``-D`` macros (e.g. ``NUM_STAGES``).
        q_box_rows / kv_box_rows: TMA box heights for the tensor-map ABI (0 when unused).
        sass_required: SASS mnemonics the rung claims (CI fails when one is missing).
        max_bench_seqlen: the default bench skips shapes whose seqlen_q or seqlen_k is longer (slow rungs).
        persistent: the grid is ``min(#tiles, #SMs x resident CTAs per SM)`` CTAs that loop over the
            ``num_m_blocks * batch * heads`` work tiles, which the kernel receives as a last argument
            ``num_tiles`` (``docs/kernel-abi.md``); otherwise one CTA per work tile.
        features: the compile-time variants the kernel has (issues 8 and 9): ``"causal"``, ``"gqa"``,
            ``"lse"``, ``"strided"``, ``"fp16"`` (macros ``CAUSAL``, ``GQA``, ``WRITE_LSE``, ``STRIDED``, ``FP16``:
            fp16 Q, K, V and O instead of bf16); such a kernel takes
            six more arguments, ``heads_q``, ``kv_group``, ``lse`` and O's batch, head and row strides
            (``docs/kernel-abi.md``). Rungs 10 and up have them; the lower rungs are left as
            they are.
        head_dim: ``HEAD_DIM`` the kernel is compiled for (128 on every rung of the ladder).
        head_dims: the other head dims the kernel can be compiled for, each with the ``Rung`` fields its
            variant changes (tile sizes), e.g. ``{256: {"block_n": 64, "kv_box_rows": 64}}``; see
            ``runtime.launch.feature_variant``.
        fp16_head_dims: ``head_dims`` entries that the fp16 variant takes instead (e.g. ``{64: {}}``: the rung's
            own tiles), where its slow path needs registers that the bf16 tiles leave no room for.
        causal_short: ``(max_seqlen_k, fields)``: causal calls of ``head_dim`` with ``seqlen_k <= max_seqlen_k``
            compile with these ``Rung`` fields instead (tile sizes: short causal rows waste more of a wide
            tile above the diagonal); ``None``: one causal tile for every length.
        long_kv: ``(min_seqlen_k, fields)``: non-causal calls of ``head_dim`` with ``seqlen_k >= min_seqlen_k``
            compile with these ``Rung`` fields instead (rungs 12-16: three consumer warpgroups, 192-row tiles and
            80-key K/V tiles, which win only where a work tile has many K/V tiles); ``None``: one tile for all.
        l2_promotion: the L2 fetch size its TMA tensor maps ask for on a miss, in bytes (0: none, the default;
            64, 128 or 256: ``CU_TENSOR_MAP_L2_PROMOTION_L2_*``, CUDA Driver API ``cuTensorMapEncodeTiled``).
            A launch-side setting (the kernel source is the same); the tensor maps' cache keys hold it.
        causal_per_tile: a persistent rung's causal launches get one CTA per work tile (``gridDim.x ==
            num_tiles``, so each CTA's loop runs once) instead of the persistent grid, and the hardware's block
            scheduler hands each next tile to the first SM that frees up (FlashAttention-4's Hopper path's
            causal dispatch); a launch-side setting for A/B variants (``scripts/make_variants.py`` ``hwsched``).
            False on every rung.
        sched_slot: the kernel takes one more ``int`` argument after O's strides, its scheduler slot: the index
            of the pair of module-global counters that its causal builds take their work tiles from
            (``scripts/make_variants.py`` ``dynsched``); the launch gives each stream its own slot and each launch
            captured into a CUDA graph one of its own (``runtime.launch.sched_slot``). False on every rung.
    """

    number: int
    name: str
    idea: str
    abi: str
    block_m: int
    block_n: int
    threads: int
    smem_layout: str
    extra_defines: dict = field(default_factory=dict)
    q_box_rows: int = 0
    kv_box_rows: int = 0
    sass_required: tuple = ()
    max_bench_seqlen: int | None = None
    persistent: bool = False
    features: tuple = ()
    head_dim: int = HEAD_DIM
    head_dims: dict = field(default_factory=dict)
    fp16_head_dims: dict = field(default_factory=dict)
    causal_short: tuple | None = None
    l2_promotion: int = 0
    long_kv: tuple | None = None
    causal_per_tile: bool = False
    sched_slot: bool = False

    def __post_init__(self):
        if self.smem_layout not in SMEM_LAYOUTS:
            raise ValueError(f"smem_layout must be one of {sorted(SMEM_LAYOUTS)}, got {self.smem_layout!r}")
        if self.l2_promotion not in L2_PROMOTIONS:
            raise ValueError(f"l2_promotion must be one of {sorted(L2_PROMOTIONS)} (bytes), got {self.l2_promotion!r}")

    def takes_long_kv(self, seqlen_k: int | None) -> bool:
        """Whether a non-causal call with ``seqlen_k`` keys takes the ``long_kv`` tiles."""
        return self.long_kv is not None and seqlen_k is not None and seqlen_k >= self.long_kv[0]

    def takes_causal_short(self, seqlen_k: int | None) -> bool:
        """Whether a causal call with ``seqlen_k`` keys takes the ``causal_short`` tiles."""
        return self.causal_short is not None and seqlen_k is not None and seqlen_k <= self.causal_short[0]

    @property
    def key(self) -> str:
        return f"rung{self.number:02d}"

    @property
    def source(self) -> Path:
        return KERNEL_DIR / f"{self.number:02d}_{self.name}.cu"

    @property
    def page(self) -> str:
        return f"docs/rungs/{self.number:02d}-{self.name.replace('_', '-')}.md"

    @property
    def kernel_names(self) -> tuple:
        if self.abi == "unfused":
            return ("qk_scores", "row_softmax", "pv_product")
        return ("attn_fwd",)

    @property
    def stages(self) -> int:
        """K/V ring depth (``NUM_STAGES``; 1 for the rungs without a ring)."""
        return int(self.extra_defines.get("NUM_STAGES", 1))

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per CTA in bytes, from ``smem_layout``: the one place it is computed."""
        return SMEM_LAYOUTS[self.smem_layout](self.block_m, self.block_n, self.stages, self.head_dim)

    def defines(self) -> dict:
        """The ``-D`` macros this rung is compiled with (name -> int), see ``docs/kernel-abi.md``."""
        d = {
            "HEAD_DIM": self.head_dim,
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "NUM_THREADS": self.threads,
            "SMEM_BYTES": self.smem_bytes,
        }
        if self.abi == "tma":
            d["Q_BOX_ROWS"] = self.q_box_rows
            d["KV_BOX_ROWS"] = self.kv_box_rows
        d.update(self.extra_defines)
        return d

    def num_m_blocks(self, seqlen_q: int) -> int:
        """CTAs per (batch, head): ``ceil(seqlen_q / BLOCK_M)``."""
        return -(-seqlen_q // self.block_m)


def _tile_bytes(rows: int, head_dim: int = HEAD_DIM) -> int:
    return rows * head_dim * BF16_BYTES


def tma_smem_bytes(block_m: int, block_n: int, stages: int, head_dim: int = HEAD_DIM) -> int:
    """Dynamic smem of the TMA rungs (5+): Q tile + ``stages`` x (K tile + V tile) + 1 KB slack.

    128-byte-swizzled TMA destinations must start on a 1024-byte boundary; the kernels round the
    dynamic smem base up by hand (it is only 16-B aligned), which costs up to 1 KB. mbarriers live in
    static shared memory (ptxas reports them separately).
    """
    return 1024 + _tile_bytes(block_m, head_dim) + stages * 2 * _tile_bytes(block_n, head_dim)


# Each layout: (block_m, block_n, stages, head_dim) -> bytes. The kernels compute the same sum from their macros
# and static_assert it equals SMEM_BYTES, so a sweep that changes BLOCK_N or NUM_STAGES (with
# dataclasses.replace) gets the right size or a compile error, never a silent overrun.
SMEM_LAYOUTS = {
    # rung 0: static shared memory only
    "none": lambda bm, bn, st, d=HEAD_DIM: 0,
    # rung 1: fp32 Q and K tiles with rows padded by 4 floats, an unpadded V tile; P reuses K's space
    "fp32_tiles": lambda bm, bn, st, d=HEAD_DIM: 4 * ((bm + bn) * (d + 4) + bn * d),
    # rung 2: bf16 Q, K, V tiles with rows padded by 8 bf16
    "padded_bf16": lambda bm, bn, st, d=HEAD_DIM: (bm + 2 * bn) * (d + 8) * BF16_BYTES,
    # rungs 3-4: dense swizzled bf16 tiles, Q + stages x (K, V)
    "swizzled_ring": lambda bm, bn, st, d=HEAD_DIM: _tile_bytes(bm, d) + st * 2 * _tile_bytes(bn, d),
    # rungs 5+: the same behind 1 KB of alignment slack
    "tma_ring": tma_smem_bytes,
    # rungs 10+: and a BLOCK_M x head_dim staging tile for O where it fits (head_dim <= 128; SMEM_EPILOGUE)
    "tma_ring_staged_o": lambda bm, bn, st, d=HEAD_DIM: (
        tma_smem_bytes(bm, bn, st, d) + (bm * d * BF16_BYTES if d <= 128 else 0)
    ),
}


# Rungs 10-16: each entry is the one below it with only what its own idea changes (RUNGS lists them in order).
# Rung 10: the persistent grid and the staged epilogue, with the compile-time features. 128-key tiles, 2 stages:
# 1 024 + 32 KB (Q) + 2 x 2 x 32 KB (K/V ring) + 32 KB (O staging) = 197 632 B of shared memory.
_PERSISTENT_EPILOGUE = Rung(
    10,
    "persistent_epilogue",
    "a persistent grid (next Q and K/V load under the last P.V) and O stored through shared memory in whole lines",
    "tma",
    block_m=128,
    block_n=128,
    threads=384,
    smem_layout="tma_ring_staged_o",
    extra_defines={"NUM_STAGES": 2},
    q_box_rows=128,
    kv_box_rows=128,
    sass_required=("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG"),
    persistent=True,
    features=("causal", "gqa", "lse", "strided", "fp16"),
    # head_dim 64: the same tiles; 256: O takes 128 registers, so 64-key tiles (S 32 + P 16 registers),
    # 1 024 + 64 KB + 2 x 2 x 32 KB = 197 632 B, and no staging tile (it would not fit: SMEM_EPILOGUE 0).
    head_dims={64: {}, 256: {"block_n": 64, "kv_box_rows": 64}},
)

# Rung 10's kernel with its wgmma descriptors built once and advanced by constant adds (the kernel source
# changes, not the launch).
_CONST_DESC = replace(
    _PERSISTENT_EPILOGUE,
    number=11,
    name="const_desc",
    idea="wgmma descriptors built once per slot and advanced by constant adds of their start-address field",
)

# Rung 11's kernel with a lazy rescale: a row keeps its softmax reference until its max grows by more than 2^8 in
# P, a warp skips the O rescale when no row of it changed (a vote), and a warp whose rows all keep their references
# skips the row-max reduction (own-column maxima against a per-row limit, one vote). Same launch, except:
# - head_dim 64: three consumer warpgroups (192-row tiles, 512 threads, 160 registers each) and 128-key tiles
#   (S 64 + P 32 + O 32 registers); the fp16 variant keeps the two-warpgroup tiles, where its slow path has the
#   registers it needs (rung 12's page, "head_dim 64: three consumer warpgroups");
# - non-causal from 32 000 keys: three consumer warpgroups with 80-key K/V tiles (S 40 + P 20 + O 64 registers),
#   which win only where a work tile has many K/V tiles (rung 12's page, "Long K/V").
_LAZY_RESCALE = replace(
    _CONST_DESC,
    number=12,
    name="lazy_rescale",
    idea=(
        "a row keeps its softmax reference until P would exceed 2^8; warps whose rows all keep theirs skip the"
        " row-max reduction and the O rescale"
    ),
    sass_required=(*_CONST_DESC.sass_required, "VOTE"),
    head_dims={
        64: {"block_m": 192, "threads": 512, "block_n": 128, "kv_box_rows": 128, "q_box_rows": 192},
        256: {"block_n": 64, "kv_box_rows": 64},
    },
    fp16_head_dims={64: {}},
    long_kv=(32000, {"block_m": 192, "threads": 512, "block_n": 80, "kv_box_rows": 80, "q_box_rows": 192}),
)

# Rung 12's kernel with P in two A-fragment buffers, packed under the previous tile's P.V (the three-warpgroup
# tiles keep one: P_DOUBLE_BUFFER 0 in the kernel). Rung 12's launch in every respect.
_P_DOUBLE_BUFFER = replace(
    _LAZY_RESCALE,
    number=13,
    name="p_double_buffer",
    idea="P in two A-fragment buffers: the softmax packs P_j while P_{j-1}·V_{j-1} still reads the other",
)

# Rung 15's kernel with the ping-pong turns. Its long-K/V tiles (three warpgroups, 192 x 80) start at 6 144 keys,
# not 32 000: over the two-warpgroup 128 x 128 tiles they measured -1.6 / -1.7 % at 4k, +4.0 % at 6k,
# +2.0 / +2.0 % at 8k, +3.0 / +3.4 % at 16k and +5.5 % at B2 H32 8k with the turns (benchmarks/ab/ab-18b-*.json,
# ab-wg3-*.json), and without the turns they lose at 8k and 16k (rung 16's page).
_PINGPONG = replace(
    _P_DOUBLE_BUFFER,
    number=16,
    name="pingpong",
    idea="the consumer warpgroups take turns issuing wgmmas (named barriers: ping-pong)",
    sass_required=(*_P_DOUBLE_BUFFER.sass_required, "BAR"),
    long_kv=(6144, _P_DOUBLE_BUFFER.long_kv[1]),
)

RUNGS: tuple[Rung, ...] = (
    Rung(
        0,
        "unfused",
        "S = QK^T to HBM, row softmax, O = PV: three plain CUDA kernels",
        "unfused",
        block_m=64,
        block_n=64,
        threads=256,
        smem_layout="none",
        max_bench_seqlen=4096,
    ),
    # fp32 tiles in smem: Q and K rows padded by 4 floats, V unpadded; P reuses the K tile's space.
    Rung(
        1,
        "online_softmax",
        "fused tiles with an online softmax, on CUDA cores",
        "pointer",
        block_m=64,
        block_n=64,
        threads=256,
        smem_layout="fp32_tiles",
        max_bench_seqlen=4096,
    ),
    Rung(
        2,
        "mma_sync",
        "tensor cores: mma.sync m16n8k16 with ldmatrix, P kept in registers",
        "pointer",
        block_m=128,
        block_n=64,
        threads=128,
        smem_layout="padded_bf16",
        sass_required=("HMMA", "LDSM"),
    ),
    Rung(
        3,
        "cp_async",
        "cp.async multi-buffered, swizzled K/V tiles",
        "pointer",
        block_m=128,
        block_n=64,
        threads=128,
        smem_layout="swizzled_ring",
        extra_defines={"NUM_STAGES": 2},
        sass_required=("HMMA", "LDSM", "LDGSTS"),
    ),
    Rung(
        4,
        "fast_softmax",
        "scale*log2(e) folded into one FFMA before ex2, shuffle reductions",
        "pointer",
        block_m=128,
        block_n=64,
        threads=128,
        smem_layout="swizzled_ring",
        extra_defines={"NUM_STAGES": 2},
        sass_required=("HMMA", "LDSM", "LDGSTS"),
    ),
    # Rungs 5+ take TMA tensor maps (docs/kernel-abi.md): Q box (64, q_box_rows, 1), K/V box
    # (64, kv_box_rows, 1), 128-B swizzle, zero OOB fill; a tile is two 64-column panels.
    Rung(
        5,
        "tma",
        "TMA tile loads (cp.async.bulk.tensor, 128-B swizzle) completing on mbarriers; mma.sync compute",
        "tma",
        block_m=128,
        block_n=64,
        threads=128,
        smem_layout="tma_ring",
        extra_defines={"NUM_STAGES": 2},
        q_box_rows=128,
        kv_box_rows=64,
        sass_required=("HMMA", "LDSM", "UTMALDG", "SYNCS"),
    ),
    Rung(
        6,
        "wgmma",
        "wgmma.mma_async: S = QK^T from smem descriptors (SS), O += PV with P in registers (RS)",
        "tma",
        block_m=128,
        block_n=64,
        threads=256,
        smem_layout="tma_ring",
        extra_defines={"NUM_STAGES": 2},
        q_box_rows=128,
        kv_box_rows=64,
        sass_required=("HGMMA", "UTMALDG", "SYNCS"),
    ),
    # 384 threads: warpgroup 0 = TMA producer (setmaxnreg 24), warpgroups 1-2 = consumers (240), 64 rows each.
    Rung(
        7,
        "warp_specialized",
        "producer warpgroup (TMA) + 2 consumer warpgroups, full/empty mbarriers, setmaxnreg",
        "tma",
        block_m=128,
        block_n=64,
        threads=384,
        smem_layout="tma_ring",
        extra_defines={"NUM_STAGES": 2},
        q_box_rows=128,
        kv_box_rows=64,
        sass_required=("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG"),
    ),
    # Sweepable: BLOCK_N in {64, 128, 176, 192} (kv_box_rows = BLOCK_N or a divisor that is a multiple
    # of 8, <= 256) and NUM_STAGES in {2, 3}; smem_bytes follows, and must stay <= 227 KB (232448 B)
    # minus ~100 B of static mbarriers: 128 x 3 stages = 230400 fits, 176/192 only with 2 stages.
    Rung(
        8,
        "kv_pipeline",
        "NUM_STAGES-deep K/V ring, K and V released separately, BLOCK_N 128",
        "tma",
        block_m=128,
        block_n=128,
        threads=384,
        smem_layout="tma_ring",
        extra_defines={"NUM_STAGES": 2},
        q_box_rows=128,
        kv_box_rows=128,
        sass_required=("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG"),
    ),
    Rung(
        9,
        "softmax_overlap",
        "each consumer warpgroup overlaps its softmax with its own P.V wgmmas (wgmma.wait_group 1)",
        "tma",
        block_m=128,
        block_n=128,
        threads=384,
        smem_layout="tma_ring",
        extra_defines={"NUM_STAGES": 2},
        q_box_rows=128,
        kv_box_rows=128,
        sass_required=("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG"),
    ),
    _PERSISTENT_EPILOGUE,
    _CONST_DESC,
    _LAZY_RESCALE,
    _P_DOUBLE_BUFFER,
    # Rung 13's kernel with the warp index read through __shfl_sync: the Q descriptor in uniform registers. Rung
    # 13's launch in every respect.
    replace(
        _P_DOUBLE_BUFFER,
        number=14,
        name="uniform_warp",
        idea="a warp-uniform warp index: the Q descriptor stays in uniform registers (no R2UR before the S wgmmas)",
    ),
    # Rung 14's kernel with the kept-reference path computing P first and voting on its largest P afterwards
    # (EXP_FIRST, the builds with two P buffers: two consumer warpgroups; the three-warpgroup ones are rung 14's).
    # Rung 14's launch in every respect.
    replace(
        _P_DOUBLE_BUFFER,
        number=15,
        name="exp_first",
        idea="kept references compute P first and vote on the largest P after: no row-max loop before the exponentials",
    ),
    _PINGPONG,
)


BY_NUMBER = {r.number: r for r in RUNGS}
TOP = RUNGS[-1]


def get(rung: int | None) -> Rung:
    """Return rung ``rung`` (the top rung when ``None``).

    Raises ``TypeError`` for a non-integer (bool included) and ``ValueError`` for an unknown number."""
    if rung is None:
        return TOP
    if isinstance(rung, bool):
        raise TypeError("rung must be an int or None, got bool")
    try:
        rung = operator.index(rung)  # int, numpy integers
    except TypeError:
        raise TypeError(f"rung must be an int or None, got {type(rung).__name__}") from None
    if rung not in BY_NUMBER:
        raise ValueError(f"unknown rung {rung}; available: {sorted(BY_NUMBER)}")
    return BY_NUMBER[rung]
