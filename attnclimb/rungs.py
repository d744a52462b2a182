"""The ladder as data: one :class:`Rung` per kernel file in ``attnclimb/kernels``.

Everything a launch needs that can be computed on the host lives here (tile sizes, threads per CTA,
dynamic shared memory, compile-time macros, which SASS instructions the rung claims), so the ``.cu``
files hold device code only. See ``docs/kernel-abi.md`` for the contract between the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
HEAD_DIM = 128
BF16_BYTES = 2


@dataclass(frozen=True)
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
        smem_bytes: dynamic shared memory per CTA, in bytes.
        extra_defines: further ``-D`` macros (e.g. ``NUM_STAGES``).
        q_box_rows / kv_box_rows: TMA box heights for the tensor-map ABI (0 when unused).
        sass_required: SASS mnemonics the rung claims (CI fails when one is missing).
        max_bench_seqlen: the default bench skips shapes with a longer seqlen_k for slow rungs.
    """

    number: int
    name: str
    idea: str
    abi: str
    block_m: int
    block_n: int
    threads: int
    smem_bytes: int
    extra_defines: dict = field(default_factory=dict)
    q_box_rows: int = 0
    kv_box_rows: int = 0
    sass_required: tuple = ()
    max_bench_seqlen: int | None = None

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

    def defines(self) -> dict:
        d = {
            "HEAD_DIM": HEAD_DIM,
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "NUM_THREADS": self.threads,
        }
        if self.abi == "tma":
            d["Q_BOX_ROWS"] = self.q_box_rows
            d["KV_BOX_ROWS"] = self.kv_box_rows
        d.update(self.extra_defines)
        return d

    def num_m_blocks(self, seqlen_q: int) -> int:
        return -(-seqlen_q // self.block_m)


def _tile_bytes(rows: int) -> int:
    return rows * HEAD_DIM * BF16_BYTES


RUNGS: tuple[Rung, ...] = (
    Rung(0, "unfused", "S = QK^T to HBM, row softmax, O = PV: three plain CUDA kernels", "unfused",
         block_m=64, block_n=64, threads=256, smem_bytes=0, max_bench_seqlen=4096),
    Rung(1, "online_softmax", "fused tiles with an online softmax, on CUDA cores", "pointer",
         block_m=64, block_n=32, threads=256,
         smem_bytes=_tile_bytes(64) + 2 * _tile_bytes(32) + 64 * 32 * 4, max_bench_seqlen=4096),
    Rung(2, "mma_sync", "tensor cores: mma.sync m16n8k16 with ldmatrix, P kept in registers", "pointer",
         block_m=128, block_n=64, threads=256,
         smem_bytes=(128 + 2 * 64) * (HEAD_DIM + 8) * BF16_BYTES,  # padded rows: +8 bf16 each
         sass_required=("HMMA",)),
    Rung(3, "cp_async", "cp.async multi-buffered, swizzled K/V tiles", "pointer",
         block_m=128, block_n=64, threads=256,
         smem_bytes=_tile_bytes(128) + 2 * 2 * _tile_bytes(64), extra_defines={"NUM_STAGES": 2},
         sass_required=("HMMA", "LDGSTS")),
    Rung(4, "fast_softmax", "scale*log2(e) folded into one FFMA before ex2, shuffle reductions", "pointer",
         block_m=128, block_n=64, threads=256,
         smem_bytes=_tile_bytes(128) + 2 * 2 * _tile_bytes(64), extra_defines={"NUM_STAGES": 2},
         sass_required=("HMMA", "LDGSTS")),
)

BY_NUMBER = {r.number: r for r in RUNGS}
TOP = RUNGS[-1]


def get(rung: int | None) -> Rung:
    """Return rung ``rung`` (the top rung when ``None``); ``ValueError`` for an unknown number."""
    if rung is None:
        return TOP
    if isinstance(rung, bool) or not isinstance(rung, int):
        raise TypeError(f"rung must be an int or None, got {type(rung).__name__}")
    if rung not in BY_NUMBER:
        raise ValueError(f"unknown rung {rung}; available: {sorted(BY_NUMBER)}")
    return BY_NUMBER[rung]
