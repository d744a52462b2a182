"""Write the A/B variants of the top rung that issue 13 measures next, generated from the current source
so that they never drift from it: ``python scripts/make_variants.py [OUT_DIR]`` (default ``.ab``) writes

* ``nopp/12_wide_tiles.cu``: without the ping-pong turns (rung 10's named barriers), now that each
  warpgroup's own softmax runs under its own P·V (rung 9, fixed in issue 13);
* ``desc/12_wide_tiles.cu`` + ``desc/wgmma_attn_desc.cuh``: the wgmma descriptors built once per work
  tile and advanced by constant adds of their start-address field (the steady loop: 1009 -> 886 SASS
  instructions), tried before the fix without a gain.

Then ``python scripts/ab_rungs.py --rungs 12 --variant nopp=.ab/nopp --variant desc=.ab/desc``.
Raises ``SystemExit`` when a pattern it rewrites is no longer in the source.
"""

import re
import sys
from pathlib import Path

from attnclimb import rungs

DESC_HEADER = """// A/B variant (scripts/make_variants.py): gemm_qk_async / gemm_pv_async on base descriptors advanced
// by constant adds of the start-address field (16-B units; shared addresses < 256 KB never carry out of
// its 14 bits, PTX ISA "Matrix Descriptor Format").
#pragma once
#include "wgmma_attn.cuh"

template <int SIGN, int N>
__device__ __forceinline__ void gemm_qk_async_d(float (&s)[N / 8][4], uint64_t q_desc, uint32_t q_panel,
                                                uint64_t k_desc, uint32_t k_panel) {
    hop::wgmma_fence();
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; ++d) {
        const uint32_t panel = d / 4, koff = (d % 4) * 32;
        hop::wgmma_ss<N, SIGN>(s, q_desc + ((panel * q_panel + koff) >> 4),
                               k_desc + ((panel * k_panel + koff) >> 4), d > 0);
    }
    hop::wgmma_commit();
}

template <int N>
__device__ __forceinline__ void gemm_pv_async_d(float (&o)[HEAD_DIM / 8][4], const uint32_t (&p)[N / 16][4],
                                                uint64_t v_desc) {
    hop::wgmma_fence();
#pragma unroll
    for (int kv = 0; kv < N / 16; ++kv)
        hop::wgmma_rs<HEAD_DIM, 1>(o, p[kv], v_desc + ((kv * 16 * hop::PANEL_ROW_BYTES) >> 4), 1);
    hop::wgmma_commit();
}
"""


SLEEP_HEADER = """// A/B variant (scripts/make_variants.py): mbarrier waits with a suspend-time hint (PTX ISA
// "mbarrier.test_wait / mbarrier.try_wait": the thread may sleep until the phase completes or the hint,
// in ns, expires). Nsight Compute on the H200 (issue 13) counted 58.5 M executions of one try_wait retry
// loop in rung 12 at 16k (the producer waiting for free slots: ~300 polls per K/V tile on one SMSP).
#pragma once
#include "hopper.cuh"

__device__ __forceinline__ bool mbar_try_wait_hint(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\\n"
        ".reg .pred p;\\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\\n"
        "selp.u32 %0, 1, 0, p;\\n"
        "}\\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity), "r"(10000000u)
        : "memory");
    return done != 0;
}

__device__ __forceinline__ void mbar_wait_sleep(uint64_t* bar, uint32_t parity) {
    while (!mbar_try_wait_hint(bar, parity)) {
    }
}
"""


def sleep(src: str) -> str:
    """The producer's waits for free slots (Q, K, V "empty" barriers) with a suspend-time hint."""
    src = _sub(src, '#include "wgmma_attn.cuh"', '#include "wgmma_attn.cuh"\n#include "mbar_sleep.cuh"', 1)
    return _sub(src, r"hop::mbar_wait\((&bar_[qkv]_empty)", r"mbar_wait_sleep(\1", regex=True)


def sleepall(src: str) -> str:
    """Every mbarrier wait of the kernel with a suspend-time hint (the consumers' too)."""
    src = _sub(src, '#include "wgmma_attn.cuh"', '#include "wgmma_attn.cuh"\n#include "mbar_sleep.cuh"', 1)
    return _sub(src, r"hop::mbar_wait\(", "mbar_wait_sleep(", regex=True)


def _sub(text, old, new, count=None, regex=False):
    n = len(re.findall(old, text)) if regex else text.count(old)
    if n == 0 or (count is not None and n != count):
        raise SystemExit(f"make_variants: expected {count or 'some'} of {old!r} in the top rung, found {n}")
    return re.sub(old, new, text) if regex else text.replace(old, new)


def nopp(src: str) -> str:
    src = _sub(src, "    if (wg == 1) hop::named_bar_arrive(1, TURN_THREADS);\n", "", 1)
    src = _sub(src, r"\n[ \t]*hop::named_bar_sync\(my_turn, TURN_THREADS\);", "", regex=True)
    src = _sub(src, r"\n[ \t]*hop::named_bar_arrive\(other_turn, TURN_THREADS\);", "", regex=True)
    last = r"\n[ \t]*if \(wg == 0 \|\| [^\n]*hop::named_bar_arrive\(other_turn, TURN_THREADS\);"
    return _sub(src, last, "", regex=True)


def desc(src: str) -> str:
    src = _sub(src, '#include "wgmma_attn.cuh"', '#include "wgmma_attn_desc.cuh"', 1)
    q_rows = "    const uint32_t q_rows = smem_addr(s_q) + wg * WARPGROUP_ROWS * ROW_BYTES;\n"
    src = _sub(
        src,
        q_rows,
        q_rows
        + "    const uint64_t q_desc = hop::desc_kmajor_sw128(q_rows);\n"
        + "    const uint64_t k_desc0 = hop::desc_kmajor_sw128(smem_addr(s_k));\n"
        + "    const uint64_t v_desc0 = hop::desc_mnmajor_sw128(smem_addr(s_v), KV_PANEL);\n",
        1,
    )
    for sign in ("-1", "1"):
        src = _sub(
            src,
            f"gemm_qk_async<{sign}, BLOCK_N>(s, q_rows, Q_PANEL, s_kt, KV_PANEL);",
            f"gemm_qk_async_d<{sign}, BLOCK_N>(s, q_desc, Q_PANEL, k_desc0 + ((slot * KV_TILE_BYTES) >> 4), KV_PANEL);",
            1,
        )
    return _sub(
        src,
        "gemm_pv_async<BLOCK_N>(o_acc, p_frag, smem_addr(s_v + pv_slot * KV_TILE_BYTES), KV_PANEL);",
        "gemm_pv_async_d<BLOCK_N>(o_acc, p_frag, v_desc0 + ((pv_slot * KV_TILE_BYTES) >> 4));",
    )


def main(out=".ab"):
    top = rungs.TOP
    src = top.source.read_text()
    for name, fn, extra in (
        ("nopp", nopp, {}),
        ("desc", desc, {"wgmma_attn_desc.cuh": DESC_HEADER}),
        ("nopp_desc", lambda text: desc(nopp(text)), {"wgmma_attn_desc.cuh": DESC_HEADER}),
        ("sleep", sleep, {"mbar_sleep.cuh": SLEEP_HEADER}),
        ("sleepall", sleepall, {"mbar_sleep.cuh": SLEEP_HEADER}),
    ):
        d = Path(out) / name
        d.mkdir(parents=True, exist_ok=True)
        (d / top.source.name).write_text(fn(src))
        for fname, text in extra.items():
            (d / fname).write_text(text)
        print(f"wrote {d}/")


if __name__ == "__main__":
    main(*sys.argv[1:])
