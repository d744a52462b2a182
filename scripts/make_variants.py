"""Write the A/B variants of the top rung, generated from the current source so that they never drift from it:
``python scripts/make_variants.py [OUT_DIR]`` (default ``.ab``) writes, each as ``<name>/<the top rung's file>``
(``rungs.TOP.source.name``, today ``16_pingpong.cu``):

* ``base/…``: the top rung's source as it is, for variants that change only ``Rung`` fields after ``@`` in
  ``ab_rungs.py --variant`` (tile sizes, ``NUM_STAGES``, ``l2_promotion``, ``long_kv_from``; the ``ab-l2``,
  ``ab-d64`` and ``ab-dims`` calls of ``scripts/device_calls.sh``);
* ``nopptop/…``: the top rung without the ping-pong turns (its named barriers; rung 16's page);
* ``sleeptop/…`` + ``mbar_sleep.cuh``: the producer's mbarrier waits for free Q, K and V slots with a suspend-time
  hint (thirteenth session: at head_dim 64 Nsight Compute's instrumented source view counted the producer's retry
  loop 25.5 M times, on an SMSP whose issue slots consumer warps share; FA4's producer waits with the same hint;
  no gain);
* ``treetop/…``: the tile max and softmax row sums in four chains per row (as FA4 writes its row max; thirteenth
  session);
* ``hint/…`` and ``hintq/…`` + ``l2hint.cuh``: the TMA loads with an L2 eviction priority (K/V ``evict_last`` and Q
  ``evict_first``; Q ``evict_first`` only): within the noise (twelfth session, measured on old rung 19, the top
  rung before the re-cut, whose bf16 machine code rung 16's is);
* ``wgarrive18/…`` and ``vfirst18/…``: one arrival per consumer warpgroup on the empty barriers (issue 13's "one
  arrival per warpgroup"), and the previous tile's V waited for before the turn; measured on the staged
  epilogue's rung in the seventh session and not kept (the names are those of its A/B files: old rung 18, then
  19, the top rung before the re-cut);
* ``sonlytop/…``: the turn covering the S group only (sixteenth session; lost against FA3's placement, old rung
  10's page, "Revisited");
* ``headpairs/…`` + ``causal_order.cuh``: the causal order when all heads' K/V exceed L2 with heavy/light pairs
  inside each head and the last rounds heaviest-first in a snake (twenty-first session, from
  ``scripts/causal_order_model.py``; not yet timed: ``device_calls.sh ab-causal-order``);
* ``l2pf/…`` + ``l2prefetch.cuh``: the producer also asks L2 for the K and V tiles ``L2_PREFETCH_AHEAD`` (default 4)
  loads ahead of the one it copies (``cp.async.bulk.prefetch.tensor``), so that the first CTA to reach a tile no
  longer waits for DRAM with the others behind it: a test of why BSHD views cost 5–7 % on Wan2.1-1.3B (twenty-third
  session; not yet timed: ``device_calls.sh ab-bshd``);
* ``hgroup/…`` + ``head_group.cuh``: the non-causal work order in groups of ``HEAD_GROUP`` (default 12) heads, heads
  fastest inside a group (today: one head's m-blocks after another), so that the CTAs in flight read the same key
  positions of several heads at once: in a BSHD view those rows lie side by side (one 3-KB row of all 12 heads at
  Wan2.1-1.3B) where today's order reads 256 B of each; the other test of the BSHD views' cost (twenty-third
  session; not yet timed: ``device_calls.sh ab-bshd``);
* ``dynsched/…`` + ``dyn_sched.cuh`` (on ``hgroup``'s ``head_group.cuh``): causal builds only: each CTA's next
  work tile handed out at run time (an atomic counter, FlashAttention-3's persistent "longest processing time
  first" idea) in the order heaviest m-block first
  within groups of heads whose K and V fit in ``CAUSAL_L2_BYTES``, heads fastest; the producer takes the next
  work once the Q buffer is free (the consumers' last S of the current one) and publishes it with its Q, and the
  turns' last hand-off is taken by one more wait of warpgroup 0. FlashAttention-4's Hopper path orders its causal
  tiles the same way (one CTA per tile, the hardware handing them out). ``scripts/causal_order_model.py``'s
  ``dynamic`` column: +2 to +3 % at head_dim 128 and 256, +3 to +9 % at 64 (twenty-third session; not yet timed:
  ``device_calls.sh ab-causal-order``). The counters are module globals, a pair per slot, that the last CTA of a
  launch resets; the kernel takes its slot as a last argument, which the launch gives per stream and per captured
  launch and never hands on (twenty-fifth session: ``ab_rungs.py --variant dynsched=.ab/dynsched@sched_slot=1``,
  ``Rung.sched_slot``), so launches that may overlap never share counters;
* ``hwsched/…`` + ``dyn_sched.cuh``: ``dynsched``'s causal order without its counter, timed with
  ``Rung.causal_per_tile`` (``ab_rungs.py --variant hwsched=.ab/hwsched@causal_per_tile=1``): one CTA per causal
  work tile, the hardware handing the blocks to SMs as they free up, which is FlashAttention-4's Hopper path's
  causal dispatch exactly, and safe for launches on many streams as it is (its builds leave out the shared
  header's counters). It pays the Q load and first K/V tiles of every tile unoverlapped;
  ``scripts/causal_order_model.py``'s second table, with a fill of one K/V tile: +3.6 to +5.7 % at head_dim 64
  8k/16k, −2.4 % at head_dim 64 4k, −3.4 % and −13.7 % at head_dim 128 4k and 1k, where tiles are short
  (twenty-fifth session; not yet timed: ``device_calls.sh ab-causal-order``);
* ``noload/…``, ``noexp/…`` and ``nomax/…``: DIAGNOSTICS with wrong results, for timing only: without the K/V
  copies after the ring's first fill, without the MUFU.EX2 of the steady loop, and without the row-max chain in
  front of the exponentials (what each part of the work costs; ``device_calls.sh diag``).

Then e.g. ``python scripts/ab_rungs.py --rungs 16 --variant treetop=.ab/treetop`` (``device_calls.sh ab-top
treetop``), or ``--variant l2p256=.ab/base@l2_promotion=256``. The variants of the rungs that the re-cut removed
or renumbered (old rung 14's ``nolfix``, ``nopp``, ``tree``, ``sleep``, ``sleepall``, ``lround`` and ``poly2/4/8``;
old rung 17's ``base17``, ``wgarrive``, ``sleep17``, ``vfirst`` and ``latearrive``; old rung 10's ``sonly10``,
``vfirst10`` and ``latearrive10``; ``epin`` and ``nopp_ladder``) and the generator that wrote them are at commit
8cedb83, which the committed A/B files of those variants name; the ``desc`` variant of the wide-tiles rung, which
became the const-desc rung, is at 34f912e.
Raises ``SystemExit`` when a pattern it rewrites is no longer in the source.
"""

import re
import sys
from pathlib import Path

from attnclimb import rungs

SLEEP_HEADER = """// A/B variant (scripts/make_variants.py): mbarrier waits with a suspend-time hint (PTX ISA
// "mbarrier.test_wait / mbarrier.try_wait": the thread may sleep until the phase completes or the hint,
// in ns, expires). Nsight Compute on the H200 (issue 13) counted 58.5 M executions of one try_wait retry
// loop in old rung 12 at 16k (the producer waiting for free slots: ~300 polls per K/V tile on one SMSP).
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


def treetop(src: str) -> str:
    """The top rung's row reductions in four independent chains per row (as FA4's Hopper path does its row max),
    joined at the end: the tile max before the vote and the row sums of both softmax loops (the path of the
    three-warpgroup builds, head_dim 64 and the long K/V). The exponentials-first loop keeps its chains: four
    there spill 28 B in the two-warpgroup build. Same results but for the order of the fp32 row sums
    (thirteenth session)."""
    src = _sub(
        src,
        """#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
            tile_max[0] = fmaxf(tile_max[0], fmaxf(s[j][0], s[j][1]));
            tile_max[1] = fmaxf(tile_max[1], fmaxf(s[j][2], s[j][3]));
        }
""",
        """        {
            float tm[2][4] = {{NEG_INF, NEG_INF, NEG_INF, NEG_INF}, {NEG_INF, NEG_INF, NEG_INF, NEG_INF}};
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) {
                tm[0][j % 4] = fmaxf(tm[0][j % 4], fmaxf(s[j][0], s[j][1]));
                tm[1][j % 4] = fmaxf(tm[1][j % 4], fmaxf(s[j][2], s[j][3]));
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) tile_max[r] = fmaxf(fmaxf(tm[r][0], tm[r][1]), fmaxf(tm[r][2], tm[r][3]));
        }
""",
        1,
    )
    join = "for (int r = 0; r < 2; ++r) row_sum[r] += (ps[r][0] + ps[r][1]) + (ps[r][2] + ps[r][3]);"
    # both softmax loops (the fp16 slow path's and the common one) sum into four chains, joined before returning
    src = _sub(src, "row_sum[e >> 1] += s[j][e];", "ps[e >> 1][j % 4] += s[j][e];", 2)
    src = _sub(
        src,
        "#pragma unroll\n        for (int r = 0; r < 2; ++r)  // (one FFMA and ex2 of the column max's score)",
        "        float ps[2][4] = {};  // the row sums' four chains\n"
        "#pragma unroll\n        for (int r = 0; r < 2; ++r)  // (one FFMA and ex2 of the column max's score)",
        1,
    )
    src = _sub(
        src,
        "            return rescale;\n",
        "#pragma unroll\n            " + join + "\n            return rescale;\n",
        1,
    )
    src = _sub(
        src,
        "\n        return rescale;\n    };\n",
        "\n#pragma unroll\n        " + join + "\n        return rescale;\n    };\n",
        1,
    )
    return src


CAUSAL_ORDER_HEADER = """// A/B variant (scripts/make_variants.py `headpairs`): the causal work order of the persistent
// grid when all heads' K and V exceed CAUSAL_L2_BYTES (the top rung's `by_pairs` case).
// scripts/causal_order_model.py mirrors it (`head_pairs_then_tail`); its CPU test compiles this header
// with the host compiler and compares the two.
#pragma once
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CAUSAL_ORDER_FN __host__ __device__ __forceinline__
#else
#define CAUSAL_ORDER_FN inline
#endif

namespace causal_order {
struct Tile {
    int head, mb;  // index of the (batch, head) and the m-block
};

// Work w (CTA w % grid) -> its tile, for w < heads * nmb. Pairs inside each head: m-blocks nmb-1-j and j (j <
// nmb/2), pair p = k*grid + c run by CTA c as works 2k*grid + c and (2k+1)*grid + c, for all but the last
// `tail_rounds` whole rounds of pairs; the tiles left (and an odd nmb's middle m-blocks) then heaviest first
// (m-block descending, head ascending), dealt in waves of `grid`, every other whole wave in reverse. The tail's
// tiles of one m-block are the heads after h0 (a = heads - h0 - 1 of them), and h0 too where its pair index j >=
// j0 (h0's pairs below j0 ran in the rounds), and every head for the middle m-block: five runs of equal counts.
CAUSAL_ORDER_FN Tile head_pairs_then_tail(int work, int grid, int heads, int nmb, int tail_rounds) {
    const int half = nmb / 2;  // pairs per head
    int rounds = heads * half / grid - tail_rounds;
    if (rounds < 0) rounds = 0;
    const int w0 = 2 * rounds * grid;
    if (work < w0) {
        const int wave = work / grid, c = work - wave * grid;
        const int p = (wave >> 1) * grid + c, head = p / half, j = p - head * half;
        return {head, (wave & 1) ? j : nmb - 1 - j};
    }
    const int rest = heads * nmb - w0, v = work - w0, wave = v / grid, c = v - wave * grid;
    int u = wave * grid + (((wave & 1) && (wave + 1) * grid <= rest) ? grid - 1 - c : c);
    const int p0 = rounds * grid, h0 = half ? p0 / half : heads, j0 = half ? p0 - h0 * half : 0;
    const int a = heads - h0 - 1, b = a + 1;  // tiles per m-block without / with head h0
    const int n1 = a > 0 ? j0 * a : 0, n2 = b > 0 ? (half - j0) * b : 0;
    if (u < n1) return {h0 + 1 + u % a, nmb - 1 - u / a};  // heaviest: j < j0
    u -= n1;
    if (u < n2) return {h0 + u % b, nmb - 1 - j0 - u / b};  // upper half, j >= j0
    u -= n2;
    if (nmb & 1) {
        if (u < heads) return {u, half};  // the middle m-block of every head
        u -= heads;
    }
    if (u < n2) return {h0 + u % b, half - 1 - u / b};  // lower half, j >= j0
    u -= n2;
    if (u < n1) return {h0 + 1 + u % a, j0 - 1 - u / a};  // lightest: j < j0
    return {heads, 0};  // past the last tile
}
}  // namespace causal_order
"""


def headpairs(src: str) -> str:
    """The causal `by_pairs` order replaced by causal_order.cuh's: heavy/light pairs inside each head (an odd
    m-block count's middle m-block no longer pairs across two heads) for all but the last CAUSAL_TAIL_ROUNDS
    (default 2) rounds, the rest heaviest-first in a snake (twenty-first session: scripts/causal_order_model.py
    puts the busiest CTA within 1-2 % of the mean on the bench's causal shapes, against 3-9 % for the pairs)."""
    src = _sub(src, '#include "wgmma_attn.cuh"', '#include "wgmma_attn.cuh"\n#include "causal_order.cuh"', 1)
    src = _sub(
        src,
        "        if (by_pairs) return 2 * (c + (wave >> 1) * gridDim.x) + (wave & 1);\n",
        "        if (by_pairs) return static_cast<unsigned>(work);  // causal_order.cuh deals the works itself\n",
        1,
    )
    return _sub(
        src,
        """        if (by_pairs) {
            w.bh = tile / num_m_blocks;
            const int r = tile % num_m_blocks;
            mb = r & 1 ? r >> 1 : num_m_blocks - 1 - (r >> 1);
        } else {""",
        """        if (by_pairs) {
#ifndef CAUSAL_TAIL_ROUNDS
#define CAUSAL_TAIL_ROUNDS 2
#endif
            static_assert(CAUSAL_TAIL_ROUNDS >= 0, "whole rounds of pairs left to the tail");
            const causal_order::Tile ct =
                causal_order::head_pairs_then_tail(tile, gridDim.x, bh_count, num_m_blocks, CAUSAL_TAIL_ROUNDS);
            w.bh = ct.head;
            mb = ct.mb;
        } else {""",
        1,
    )


def _sub(text, old, new, count=None, regex=False):
    n = len(re.findall(old, text, flags=re.S)) if regex else text.count(old)
    if n == 0 or (count is not None and n != count):
        raise SystemExit(f"make_variants: expected {count or 'some'} of {old!r} in the source, found {n}")
    return re.sub(old, new, text, flags=re.S) if regex else text.replace(old, new)


def nopp(src: str) -> str:
    """Every ``bar.sync`` / ``bar.arrive`` of the ping-pong turns removed (rung 16, the only rung with them): the
    first arrival before the loop, the syncs before each issue, the arrivals after it and the last turn's
    conditional arrival, whether its ``if`` takes one line (as in old rungs 10-13) or two (rung 16)."""
    first = r"\n[ \t]*if \(wg == [^\n]*\) hop::named_bar_arrive\(1, TURN_THREADS\);[^\n]*"
    src = _sub(src, first, "", 1, regex=True)
    src = _sub(src, r"\n[ \t]*hop::named_bar_sync\(my_turn, TURN_THREADS\);", "", regex=True)
    # the last turn's conditional arrival first (on one line or an `if` over two), then the others
    last = r"\n[ \t]*if \([^\n]*(?:\n[ \t]*)?hop::named_bar_arrive\(other_turn, TURN_THREADS\);[^\n]*"
    src = _sub(src, last, "", 1, regex=True)
    src = _sub(src, r"\n[ \t]*hop::named_bar_arrive\(other_turn, TURN_THREADS\);", "", regex=True)
    if "named_bar_" in src:
        raise SystemExit("make_variants: nopp left a named barrier in place")
    return src


def noload(src: str) -> str:
    """DIAGNOSTIC, wrong results: after the ring's first fill the producer no longer copies K and V, it only
    arrives on the full barriers (the consumers read stale tiles). Its time is the kernel without the L2 → SMEM
    traffic of K/V: how much of the gap to FA4 a K/V multicast (issue 13, item 5) could at most close."""
    for t in ("k", "v"):
        src = _sub(
            src,
            f"                    load_{t}(nb, slot, bh_kv);\n",
            f"                    if (kv < NUM_STAGES) load_{t}(nb, slot, bh_kv);\n"
            f"                    else hop::mbar_arrive(&bar_{t}[slot]);\n",
            1,
        )
    return src


def noexp(src: str) -> str:
    """DIAGNOSTIC, wrong results: P = the FFMA's result, no MUFU.EX2 in the steady loop (bf16 path). Its time is
    the kernel without the exponentials' pipe and latency: what the softmax's MUFU share costs."""
    return _sub(
        src,
        "                s[j][e] = smx::fast_exp2(fmaf(s[j][e], mul[e >> 1], row_neg_ref[e >> 1]));"
        "  // FFMA + MUFU.EX2\n",
        "                s[j][e] = fmaf(s[j][e], mul[e >> 1], row_neg_ref[e >> 1]);  // diagnostic: FFMA only\n",
        1,
    )


def wgarrive(src: str) -> str:
    """One arrival per consumer warpgroup on the empty barriers (Q, K and V) instead of one per consumer warp
    (issue 13's small idea; CUTLASS's TMA pipeline counts its consumers by warpgroup): the first warp of each
    warpgroup arrives after its wgmma wait, which completes the warpgroup's wgmma, and the barriers expect
    CONSUMER_WGS arrivals. A quarter of the arrivals, and a slot is free as soon as its last warpgroup is done."""
    src = _sub(
        src,
        r"hop::mbar_init\((&bar_[qkv]_empty(?:\[st\])?), CONSUMER_WARPS\);",
        r"hop::mbar_init(\1, CONSUMER_WGS);",
        3,
        regex=True,
    )
    return _sub(
        src,
        r"if \(lane == 0\) hop::mbar_arrive\((&bar_[qkv]_empty)",
        r"if (cw % 4 == 0 && lane == 0) hop::mbar_arrive(\1",
        regex=True,
    )


def vfirst(src: str) -> str:
    """The wait for the previous tile's V before the turn's named barrier instead of between the S and the P·V
    wgmmas of the turn (the trace shows 130-220 ns there, with V landed long before): the two wgmma groups of a
    turn are issued back to back, and the other warpgroup's turn comes that much earlier."""
    wait_v = (
        "            TRACE_BEGIN(WAIT_V);\n"
        "            hop::mbar_wait(&bar_v[pv_slot], pv_phase);\n"
        "            TRACE_END(WAIT_V);\n"
    )
    src = _sub(src, "            TRACE_END(S);\n" + wait_v + "            TRACE_BEGIN(S);\n", "", 1)
    k_wait = (
        "            slot = kv % NUM_STAGES;\n"
        "            TRACE_BEGIN(WAIT_K);\n"
        "            hop::mbar_wait(&bar_k[slot], ring.phase);\n"
        "            TRACE_END(WAIT_K);\n"
    )
    return _sub(src, k_wait, k_wait + wait_v, 1)


def sonly(src: str) -> str:
    """The turn covers the S group only: in the loop, a warpgroup arrives on the other one's barrier right after
    issuing S_nb, and waits for V and issues P_{nb-1}·V_{nb-1} after that, outside its turn (sixteenth session,
    old rung 10's page). The other warpgroup's S may then reach the tensor cores before this one's P·V, which this
    one's softmax needs only at its end; and a late V no longer holds the other warpgroup back."""
    src = _sub(
        src,
        r"\n[ \t]*hop::named_bar_arrive\(other_turn, TURN_THREADS\);(\n[ \t]*hop::wgmma_wait<1>\(\);)",
        r"\1",
        1,
        regex=True,
    )
    return _sub(
        src,
        r"(\n([ \t]*)issue_qk\(slot\);)(\n[ \t]*TRACE_END\(S\);\n[ \t]*TRACE_BEGIN\(WAIT_V\);)",
        r"\1\n\2hop::named_bar_arrive(other_turn, TURN_THREADS);\3",
        1,
        regex=True,
    )


def nomax(src: str) -> str:
    """DIAGNOSTIC, wrong results: after a work tile's first K/V tile the thread's own row maxima are taken over
    one n8 column tile instead of all of them (the fast path's test and the l fix see that column only). Its
    time is the kernel without the max chain in front of the exponentials: what computing the exponentials
    against the kept reference before the max (and checking after) could at most gain."""
    return _sub(
        src,
        "        for (int j = 0; j < S_TILES; ++j) {\n"
        "            tile_max[0] = fmaxf(tile_max[0], fmaxf(s[j][0], s[j][1]));\n",
        "        for (int j = 0; j < (first ? S_TILES : 1); ++j) {  // diagnostic: one column tile\n"
        "            tile_max[0] = fmaxf(tile_max[0], fmaxf(s[j][0], s[j][1]));\n",
        1,
    )


L2HINT_HEADER = """// A/B variant (scripts/make_variants.py): TMA tile loads with an L2 eviction priority (PTX ISA
// "createpolicy", "cp.async.bulk.tensor" with .L2::cache_hint): a 64-bit policy made once by createpolicy rides
// along with each copy (the desc[UR] operand of UTMALDG in SASS).
#pragma once
#include "hopper.cuh"

namespace l2h {
__device__ __forceinline__ uint64_t evict_last() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ void tile(unsigned char* dst, const TmaDesc* map, uint64_t* bar, int rows, int box_rows,
                                     int row0, int bh, int panels, uint64_t pol) {
    for (int p = 0; p < panels; ++p)
        for (int r = 0; r < rows; r += box_rows)
            asm volatile(
                "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(smem_addr(dst + (p * rows + r) * hop::PANEL_ROW_BYTES)),
                "l"(reinterpret_cast<uint64_t>(map)), "r"(p * 64), "r"(row0 + r), "r"(bh), "r"(smem_addr(bar)), "l"(pol)
                : "memory");
}
__device__ __forceinline__ void tile_4d(unsigned char* dst, const TmaDesc* map, uint64_t* bar, int rows,
                                        int box_rows, int row0, int head, int batch, int panels, uint64_t pol) {
    for (int p = 0; p < panels; ++p)
        for (int r = 0; r < rows; r += box_rows)
            asm volatile(
                "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;"
                ::"r"(smem_addr(dst + (p * rows + r) * hop::PANEL_ROW_BYTES)),
                "l"(reinterpret_cast<uint64_t>(map)), "r"(p * 64), "r"(row0 + r), "r"(head), "r"(batch),
                "r"(smem_addr(bar)), "l"(pol)
                : "memory");
}
}  // namespace l2h
"""


L2PF_HEADER = """// A/B variant (scripts/make_variants.py `l2pf`): K/V tiles asked of L2 ahead of their loads (PTX ISA
// "cp.async.bulk.prefetch.tensor", sm_90: the box's bytes brought from global memory into L2 through the same
// tensor map; nothing written to shared memory, no mbarrier, no completion to wait for).
#pragma once
#include "hopper.cuh"

#ifndef L2_PREFETCH_AHEAD
#define L2_PREFETCH_AHEAD 4  // in K/V tiles
#endif

namespace l2pf {
// The boxes of hop::tma_load_tile (3-D map: column, row, batch·head) and of hop::tma_load_tile_4d (4-D map:
// column, row, head, batch), prefetched instead of loaded.
__device__ __forceinline__ void tile(const TmaDesc* map, int rows, int box_rows, int row0, int bh, int panels = 2) {
    for (int p = 0; p < panels; ++p)
        for (int r = 0; r < rows; r += box_rows)
            asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];" ::"l"(
                             reinterpret_cast<uint64_t>(map)),
                         "r"(p * 64), "r"(row0 + r), "r"(bh)
                         : "memory");
}
__device__ __forceinline__ void tile_4d(const TmaDesc* map, int rows, int box_rows, int row0, int head, int batch,
                                        int panels = 2) {
    for (int p = 0; p < panels; ++p)
        for (int r = 0; r < rows; r += box_rows)
            asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];" ::"l"(
                             reinterpret_cast<uint64_t>(map)),
                         "r"(p * 64), "r"(row0 + r), "r"(head), "r"(batch)
                         : "memory");
}
}  // namespace l2pf
"""


def l2pf(src: str) -> str:
    """After copying K/V tile nb of a work tile, the producer asks L2 for tile nb + L2_PREFETCH_AHEAD of the same
    work tile (K, then V), through the same maps and boxes as the loads."""
    src = _sub(
        src, '#include "wgmma_desc.cuh"\n', '#include "wgmma_desc.cuh"\n#include "l2prefetch.cuh"  // A/B variant\n', 1
    )
    return _sub(
        src,
        "                    load_v(nb, slot, bh_kv);\n",
        "                    load_v(nb, slot, bh_kv);\n"
        "                    if (nb + L2_PREFETCH_AHEAD < num_n_blocks) {  // A/B variant l2pf\n"
        "                        const int pf_row = (nb + L2_PREFETCH_AHEAD) * BLOCK_N;\n"
        "#if STRIDED\n"
        "                        l2pf::tile_4d(&tmap_k, BLOCK_N, KV_BOX_ROWS, pf_row, bh_kv % (heads_q / kv_group),\n"
        "                                      bh_kv / (heads_q / kv_group), PANELS);\n"
        "                        l2pf::tile_4d(&tmap_v, BLOCK_N, KV_BOX_ROWS, pf_row, bh_kv % (heads_q / kv_group),\n"
        "                                      bh_kv / (heads_q / kv_group), PANELS);\n"
        "#else\n"
        "                        l2pf::tile(&tmap_k, BLOCK_N, KV_BOX_ROWS, pf_row, bh_kv, PANELS);\n"
        "                        l2pf::tile(&tmap_v, BLOCK_N, KV_BOX_ROWS, pf_row, bh_kv, PANELS);\n"
        "#endif\n"
        "                    }\n",
        1,
    )


HEAD_GROUP_HEADER = """// A/B variant (scripts/make_variants.py `hgroup`): the non-causal work order of the persistent
// grid in groups of HEAD_GROUP heads (batch·head indices), the heads fastest inside a group, so that the CTAs
// in flight read the same key positions of several heads at once (side by side in a BSHD view). HEAD_GROUP 1
// is the top rung's order. Its CPU test compiles this header with the host compiler.
#pragma once
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define HEAD_GROUP_FN __host__ __device__ __forceinline__
#else
#define HEAD_GROUP_FN inline
#endif

#ifndef HEAD_GROUP
#define HEAD_GROUP 12
#endif

namespace head_group {
struct Tile {
    int head, mb;  // index of the (batch, head) and the m-block
};

// Tile t < heads * nmb -> (head, m-block): groups of `group` heads (the last one smaller when `group` does not
// divide `heads`), each group's tiles m-block by m-block, its heads fastest.
HEAD_GROUP_FN Tile tile_of(int t, int heads, int nmb, int group) {
    const int full = heads / group, per_group = group * nmb;
    const int g = t / per_group;
    const int base = g < full ? g * group : full * group;  // the group's first head
    const int size = g < full ? group : heads - full * group;
    const int i = t - base * nmb;  // index inside the group
    return Tile{base + i % size, i / size};
}
}  // namespace head_group
"""


def hgroup(src: str) -> str:
    """The non-causal ``work_of``'s head-major order (``bh = tile / num_m_blocks``) replaced by head_group.cuh's."""
    src = _sub(
        src, '#include "wgmma_desc.cuh"\n', '#include "wgmma_desc.cuh"\n#include "head_group.cuh"  // A/B variant\n', 1
    )
    return _sub(
        src,
        "        w.bh = tile / num_m_blocks;\n"
        "        w.m_start = (tile % num_m_blocks) * BLOCK_M;\n"
        "        w.num_n = num_n_blocks_all;\n",
        "        const head_group::Tile hg =  // A/B variant hgroup\n"
        "            head_group::tile_of(tile, num_tiles / num_m_blocks, num_m_blocks, HEAD_GROUP);\n"
        "        w.bh = hg.head;\n"
        "        w.m_start = hg.mb * BLOCK_M;\n"
        "        w.num_n = num_n_blocks_all;\n",
        1,
    )


DYN_SCHED_HEADER = """// A/B variant (scripts/make_variants.py `dynsched`): causal work tiles handed out at run time.
// Each CTA's first work is blockIdx.x; every later one comes from an atomic counter (FlashAttention-3's persistent
// scheduler, its idea: the next tile goes to whichever CTA is free first, the heaviest tiles first). The counters
// are module globals, DYN_SCHED_SLOTS pairs of them (with DYN_SCHED_COUNTERS defined: `hwsched` shares only the
// order); the kernel's last argument picks its pair (its slot), which the launch gives per stream and per captured
// launch, never handed on (Rung.sched_slot, attnclimb.runtime.launch.sched_slot), so launches that may overlap
// never share one. The last CTA of a launch to finish taking works resets its pair for the next launch on the same
// slot (one after it on the same stream, or the next replay of its graph).
#pragma once
#include "head_group.cuh"  // the grouped order with the heads fastest (the `hgroup` variant's)

#define DYN_SCHED_FN HEAD_GROUP_FN
#ifndef DYN_SCHED_SLOTS
#define DYN_SCHED_SLOTS 65536  // attnclimb.runtime.launch.SCHED_SLOTS
#endif

namespace dyn_sched {
using Tile = head_group::Tile;

// How many query heads' K and V fit in `l2_bytes` together (query heads of a GQA group share theirs), from 1 to
// all: `kv_bytes` is the K and V bytes that all `heads` query heads read.
DYN_SCHED_FN int l2_heads(long long kv_bytes, int heads, int kv_group, long long l2_bytes) {
    const long long fit = l2_bytes * kv_group / (kv_bytes / heads);
    return static_cast<int>(fit < 1 ? 1 : fit > heads ? heads : fit);
}

// Work w < heads * nmb -> its tile: head_group.cuh's order (groups of `group` heads, the last one smaller when
// `group` does not divide `heads`, the heads fastest) with the m-blocks reversed: the heaviest (last) first. Its
// CPU test compiles this for the host and compares it with scripts/causal_order_model.py's `dynamic` order.
DYN_SCHED_FN Tile tile_of(int w, int heads, int nmb, int group) {
    Tile t = head_group::tile_of(w, heads, nmb, group);
    t.mb = nmb - 1 - t.mb;
    return t;
}

#if defined(DYN_SCHED_COUNTERS) && (defined(__CUDACC__) || defined(__CUDACC_RTC__))
// Per slot s: [2s] works handed out after the grid's first gridDim.x, [2s + 1] CTAs that will take no more. Zero
// when the module loads (a .global variable without an initializer: PTX ISA Sec. 5.1, Table 7, note 1).
__device__ unsigned int counters[2 * DYN_SCHED_SLOTS];

// The index of the next work for this CTA (>= gridDim.x; the caller stops at the first one past its tiles).
__device__ __forceinline__ int take(int slot) {
    return static_cast<int>(atomicAdd(&counters[2 * slot], 1u)) + static_cast<int>(gridDim.x);
}

// Once per CTA, after its last take(): the last CTA resets the slot's counters (every other one has taken its last).
__device__ __forceinline__ void finish(int slot) {
    __threadfence();  // this CTA's last take() before its count (in practice ordered by the use of its result)
    if (atomicAdd(&counters[2 * slot + 1], 1u) == gridDim.x - 1) {
        __threadfence();
        atomicExch(&counters[2 * slot], 0u);
        atomicExch(&counters[2 * slot + 1], 0u);
    }
}
#endif
}  // namespace dyn_sched
"""


def _causal_or(src: str, old: str, causal: str) -> str:
    """``old`` (once in ``src``) kept for the non-causal builds and ``causal`` in its place for the causal ones:
    the dynsched variant's changes, which apply to causal builds only."""
    return _sub(src, old, f"#if CAUSAL  // A/B variant dynsched\n{causal}#else\n{old}#endif\n", 1)


def _dyn_order(src: str) -> str:
    """The causal work order of ``dynsched`` and ``hwsched``: work w is tile w, tile -> (head, m-block) heaviest
    first within L2-sized groups of heads, heads fastest (``dyn_sched.cuh``)."""
    src = _sub(
        src, '#include "wgmma_desc.cuh"\n', '#include "wgmma_desc.cuh"\n#include "dyn_sched.cuh"  // A/B variant\n', 1
    )
    # the order: work w is tile w; tile -> (head, m-block) heaviest first in groups of heads that fit L2
    return _sub(
        src,
        "#if GQA  // query heads of one group share them: kv_bytes / kv_group > L2 (floored), "
        """without a 64-bit division
    const bool by_pairs = kv_bytes >= (CAUSAL_L2_BYTES + 1) * kv_group && num_tiles >= 2 * (int)gridDim.x;
#else
    const bool by_pairs = kv_bytes > CAUSAL_L2_BYTES && num_tiles >= 2 * (int)gridDim.x;
#endif
    auto tile_of = [&](int work) {
        const int wave = work / gridDim.x, c = work % gridDim.x;
        if (by_pairs) return 2 * (c + (wave >> 1) * gridDim.x) + (wave & 1);
        return (wave & 1) && (wave + 1) * gridDim.x <= num_tiles ? wave * gridDim.x + (gridDim.x - 1 - c)
                                                                 : work;
    };
    auto work_of = [&](int tile) {
        Work w;
        int mb;
        if (by_pairs) {
            w.bh = tile / num_m_blocks;
            const int r = tile % num_m_blocks;
            mb = r & 1 ? r >> 1 : num_m_blocks - 1 - (r >> 1);
        } else {
            w.bh = tile % bh_count;
            mb = num_m_blocks - 1 - tile / bh_count;
        }
""",
        """    // A/B variants dynsched, hwsched: works in the order they are handed out (dyn_sched.cuh): groups of
    // l2_heads heads whose K and V fit in CAUSAL_L2_BYTES (query heads of a GQA group share theirs), in each group
    // the heaviest m-block first, heads fastest.
    const int l2_heads = dyn_sched::l2_heads(kv_bytes, bh_count, GQA ? kv_group : 1, CAUSAL_L2_BYTES);
    auto tile_of = [&](int work) { return work; };
    auto work_of = [&](int tile) {
        Work w;
        const dyn_sched::Tile t = dyn_sched::tile_of(tile, bh_count, num_m_blocks, l2_heads);
        w.bh = t.head;
        const int mb = t.mb;
""",
        1,
    )


def hwsched(src: str) -> str:
    """Causal builds: ``dynsched``'s order without its counter, for a launch of one CTA per causal work tile
    (``ab_rungs.py --variant hwsched=DIR@causal_per_tile=1``): with ``gridDim.x == num_tiles`` each CTA's loop runs
    once, on tile ``blockIdx.x``, and the hardware's block scheduler hands each next block to the first SM that
    frees up: FlashAttention-4's Hopper path's causal dispatch. Non-causal builds are the top rung's."""
    return _dyn_order(src)


def dynsched(src: str) -> str:
    """Causal builds: the static orders (pairs, snake) replaced by works handed out at run time in a heaviest-first
    order within L2-sized groups of heads; the producer publishes the work after the current one with its Q."""
    src = _dyn_order(src)
    src = _sub(
        src,
        '#include "dyn_sched.cuh"',
        '#define DYN_SCHED_COUNTERS 1  // A/B variant dynsched\n#include "dyn_sched.cuh"',
        1,
    )
    # its slot of the counters (Rung.sched_slot: the launch appends it to every build's arguments)
    src = _sub(
        src,
        "long long o_stride_b, long long o_stride_h, long long o_stride_s) {\n",
        "long long o_stride_b, long long o_stride_h, long long o_stride_s,\n"
        "             [[maybe_unused]] int sched_slot) {  // A/B variant dynsched: its counters' slot\n",
        1,
    )
    src = _sub(
        src,
        "    __shared__ float wait_anchor[CONSUMER_WARPS * 32];         // scratch of hop::keep_above_wait\n",
        "    __shared__ float wait_anchor[CONSUMER_WARPS * 32];         // scratch of hop::keep_above_wait\n"
        "#if CAUSAL\n"
        "    __shared__ int sched_work;  // A/B variant dynsched: the work whose Q is in flight; -1: none left\n"
        "#endif\n",
        1,
    )
    # producer: the next work taken once the Q buffer is free (every consumer warp's last S done), published with
    # its Q; past the last one, -1 and a bare arrival on bar_q
    src = _causal_or(
        src,
        "            for (int work = blockIdx.x, it = 0; tile_of(work) < num_tiles; work += gridDim.x, ++it) {\n"
        "                const Work w = work_of(tile_of(work));\n"
        "                const int bh = w.bh, m_start = w.m_start, bh_kv = w.bh_kv, num_n_blocks = w.num_n;\n"
        "                // The Q buffer is free once every consumer warp's last S of the previous work tile is done.\n"
        "                TRACE_BEGIN(WAIT_Q_EMPTY);\n"
        "                if (it > 0) hop::mbar_wait(&bar_q_empty, (it - 1) & 1);\n"
        "                TRACE_END(WAIT_Q_EMPTY);\n",
        "            for (int it = 0;; ++it) {\n"
        "                TRACE_BEGIN(WAIT_Q_EMPTY);\n"
        "                if (it > 0) hop::mbar_wait(&bar_q_empty, (it - 1) & 1);\n"
        "                TRACE_END(WAIT_Q_EMPTY);\n"
        "                const int work = it == 0 ? static_cast<int>(blockIdx.x) : dyn_sched::take(sched_slot);\n"
        "                if (tile_of(work) >= num_tiles) {\n"
        "                    sched_work = -1;\n"
        "                    hop::mbar_arrive(&bar_q);\n"
        "                    break;\n"
        "                }\n"
        "                sched_work = work;\n"
        "                const Work w = work_of(tile_of(work));\n"
        "                const int bh = w.bh, m_start = w.m_start, bh_kv = w.bh_kv, num_n_blocks = w.num_n;\n",
    )
    src = _sub(
        src,
        "                    ring.advance(slot);  // the next use of each slot is its next phase\n"
        "                }\n"
        "            }\n",
        "                    ring.advance(slot);  // the next use of each slot is its next phase\n"
        "                }\n"
        "            }\n"
        "#if CAUSAL  // A/B variant dynsched\n"
        "            dyn_sched::finish(sched_slot);\n"
        "#endif\n",
        1,
    )
    # consumers: each work comes with its Q; the loop ends on -1
    src = _sub(
        src,
        "    for (int work = blockIdx.x, it = 0; tile_of(work) < num_tiles; work += gridDim.x, ++it) {\n"
        "        const Work w = work_of(tile_of(work));\n",
        "#if CAUSAL  // A/B variant dynsched\n"
        "    for (int it = 0;; ++it) {\n"
        "        hop::mbar_wait(&bar_q, it & 1);\n"
        "        const int work = *reinterpret_cast<volatile int*>(&sched_work);\n"
        "        if (work < 0) break;\n"
        "#else\n"
        "    for (int work = blockIdx.x, it = 0; tile_of(work) < num_tiles; work += gridDim.x, ++it) {\n"
        "#endif\n"
        "        const Work w = work_of(tile_of(work));\n",
        1,
    )
    # the turns: the last hand-off to warpgroup 0 always made (whether a next work comes is not known yet) and
    # taken by one more wait of warpgroup 0 after the loop
    src = _causal_or(
        src,
        "        if ((CONSUMER_WGS == 2 ? wg == 0 : wg != CONSUMER_WGS - 1) "
        "|| tile_of(work + gridDim.x) < num_tiles)\n",
        "        if (true)\n",
    )
    return _sub(
        src,
        "        TRACE_END(EPILOGUE);\n    }\n}\n",
        "        TRACE_END(EPILOGUE);\n    }\n"
        "#if CAUSAL  // A/B variant dynsched: the last warpgroup's last hand-off\n"
        "    if (wg == 0) hop::named_bar_sync(my_turn, TURN_THREADS);\n"
        "#endif\n}\n",
        1,
    )


def l2hint(kv_last):
    """The top rung's Q tile loads with L2 evict_first and, with ``kv_last``, its K and V tile loads with
    evict_last (the policies made at the kernel's start): issue 13's "L2 eviction hints on the TMA loads"."""

    def rewrite(src):
        src = _sub(
            src, '#include "wgmma_desc.cuh"\n', '#include "wgmma_desc.cuh"\n#include "l2hint.cuh"  // A/B variant\n', 1
        )
        kv = "l2h::evict_last()" if kv_last else "0"
        src = _sub(
            src,
            "    extern __shared__ unsigned char smem_raw[];\n",
            "    extern __shared__ unsigned char smem_raw[];\n"
            f"    const uint64_t pol_kv = {kv}, pol_q = l2h::evict_first();\n",
            1,
        )
        # Q: the 3-D and the 4-D (strided) load
        src = _sub(
            src, r"hop::tma_load_tile\((s_q, [^;]*?), PANELS\);", r"l2h::tile(\1, PANELS, pol_q);", 1, regex=True
        )
        src = _sub(
            src, r"hop::tma_load_tile_4d\((s_q, [^;]*?), PANELS\);", r"l2h::tile_4d(\1, PANELS, pol_q);", 1, regex=True
        )
        if kv_last:  # K and V, 3-D and 4-D (in load_k and load_v)
            src = _sub(
                src,
                r"hop::tma_load_tile\((s_[kv] \+ [^;]*?), PANELS\);",
                r"l2h::tile(\1, PANELS, pol_kv);",
                2,
                regex=True,
            )
            src = _sub(
                src,
                r"hop::tma_load_tile_4d\((s_[kv] \+ [^;]*?), PANELS\);",
                r"l2h::tile_4d(\1, PANELS, pol_kv);",
                2,
                regex=True,
            )
        return src

    return rewrite


def main(out=".ab"):
    top = rungs.TOP
    for name, fn, extra in (
        ("base", lambda text: text, {}),
        ("noload", noload, {}),
        ("noexp", noexp, {}),
        ("nomax", nomax, {}),
        ("nopptop", nopp, {}),
        ("sleeptop", sleep, {"mbar_sleep.cuh": SLEEP_HEADER}),
        ("treetop", treetop, {}),
        ("hint", l2hint(True), {"l2hint.cuh": L2HINT_HEADER}),
        ("hintq", l2hint(False), {"l2hint.cuh": L2HINT_HEADER}),
        ("wgarrive18", wgarrive, {}),
        ("vfirst18", vfirst, {}),
        ("sonlytop", sonly, {}),
        ("headpairs", headpairs, {"causal_order.cuh": CAUSAL_ORDER_HEADER}),
        ("l2pf", l2pf, {"l2prefetch.cuh": L2PF_HEADER}),
        ("hgroup", hgroup, {"head_group.cuh": HEAD_GROUP_HEADER}),
        ("dynsched", dynsched, {"dyn_sched.cuh": DYN_SCHED_HEADER, "head_group.cuh": HEAD_GROUP_HEADER}),
        ("hwsched", hwsched, {"dyn_sched.cuh": DYN_SCHED_HEADER, "head_group.cuh": HEAD_GROUP_HEADER}),
    ):
        d = Path(out) / name
        d.mkdir(parents=True, exist_ok=True)
        (d / top.source.name).write_text(fn(top.source.read_text()))
        for fname, text in extra.items():
            (d / fname).write_text(text)
        print(f"wrote {d}/")


if __name__ == "__main__":
    main(*sys.argv[1:])
