"""Write the A/B variants of issue 13, generated from the current sources so that they never drift from them:
``python scripts/make_variants.py [OUT_DIR]`` (default ``.ab``) writes

* ``base/<the top rung's file>``: the top rung's source as it is, for variants that change only ``Rung``
  fields after ``@`` in ``ab_rungs.py --variant`` (tile sizes, ``l2_promotion``);
* ``nolfix/14_lazy_rescale.cu``: rung 14 before its l fix (l sums each tile max's P unrounded, while P·V
  rounds it; rung 14's page), to measure what the fix costs;
* ``nopp/14_lazy_rescale.cu``: without the ping-pong turns (rung 10's named barriers), now that each
  warpgroup's own softmax runs under its own P·V (rung 9, fixed in issue 13);
* ``tree/…``: the row max and row sum of a tile in four independent chains per row;
* ``lround/…`` + ``lround.cuh``: l summed from each P rounded as P·V rounds it, instead of the l fix (which
  rounds only the tile max's P; tied maxima keep the rest);
* ``poly2/…``, ``poly4/…``, ``poly8/…`` (on ``lround``): every 2nd / 4th / 8th column block of S
  exponentiated on the FMA pipe (``smx::poly_exp2``) instead of MUFU.EX2;
* ``sleep/…`` and ``sleepall/…`` + ``mbar_sleep.cuh``: the producer's mbarrier waits (or every wait) with a
  suspend-time hint (measured on rung 12: no gain, rung 12's page);
* ``base17/17_uniform_warp.cu``, ``wgarrive/…``, ``sleep17/…``, ``vfirst/…`` and ``latearrive/…``: rung 17 as
  it is, and rewritten with one arrival per consumer warpgroup on the empty barriers (issue 13's "one arrival per
  warpgroup"), with ``sleep``'s producer waits, with the previous tile's V waited for before the turn, and with
  the turn handed over after S completes (measured on rung 17 and not kept: its page, "Tried on this rung");
* ``wgarrive18/19_smem_epilogue.cu`` and ``vfirst18/…``: the same two rewrites of the staged epilogue's rung
  (``VARIANTS_OF_18``; ``scripts/device_calls.sh ab-18b``): on rung 17 ``wgarrive`` gained at 4k and 16k and lost
  causal, ``vfirst`` gained on the Wan shapes only; on the epilogue's rung (rung 18 then: rung 17 + the epilogue)
  both lost (seventh session, rung 19's page, "Tried on this rung"). Since the fifteenth session's re-cut the
  epilogue is rung 19, above the exponentials first (rung 18), and these rewrite rung 19's source;
* ``nopptop/…``: the top rung without the ping-pong turns (``nopp``'s rewrite; twelfth session, rung 10's page,
  "Revisited": they pay at the top, most in the three-warpgroup builds);
* ``sleeptop/…`` + ``mbar_sleep.cuh``: the top rung with ``sleep``'s producer waits (thirteenth session: at
  head_dim 64 Nsight Compute's instrumented source view counted the producer's retry loop 25.5 M times, on an
  SMSP whose issue slots consumer warps share; FA4's producer waits with the same hint; no gain);
* ``treetop/…``: the top rung's tile max and softmax row sums in four chains per row (as FA4 writes its row
  max; thirteenth session);
* ``hint/…`` and ``hintq/…`` + ``l2hint.cuh``: the top rung's TMA loads with an L2 eviction priority (K/V
  ``evict_last`` and Q ``evict_first``; Q ``evict_first`` only): within the noise (twelfth session, rung 19's
  page, "Tried on this rung");
* ``sonly10/…``, ``vfirst10/…``, ``latearrive10/…`` and ``sonlytop/…``: rung 10 with its turn placed otherwise (it
  covers S only; V waited for before it; handed over after S completes) and ``sonly`` on the top rung (sixteenth
  session, ``scripts/device_calls.sh ab-10``; all lost against FA3's placement, rung 10's page, "Revisited");
* ``epin/11_persistent.cu``: ``benchmarks/ab/variants/rung11-epi`` (rung 11 + the staged epilogue) without the turns;
* ``nopp_ladder/…``: every rung from rung 10 (the turns' rung) to the top without the turns (``nopp``), for the
  question of a ladder whose turns come last (thirteenth session, rung 10's page, "Revisited");
* ``noload/…``, ``noexp/…`` and ``nomax/…``: DIAGNOSTICS of the top rung with wrong results, for timing only:
  without the K/V copies after the ring's first fill, without the MUFU.EX2 of the steady loop, and without the
  row-max chain in front of the exponentials (what each part of the work costs).

``base`` and the diagnostics are the top rung's (``rungs.TOP.source.name``); the rung-17 set rewrites rung 17's
source (``VARIANTS_OF_17``) and is timed with ``--rungs 17``; the others, measured on rung 14 and not kept (its
page), rewrite rung 14's source (``VARIANTS_OF``) and are timed with ``--rungs 14``. The
``desc`` variant that this script wrote
for rung 12 (its wgmma descriptors advanced by constant adds) became rung 13, ``13_const_desc.cu``; the
generator as it was is at commit 34f912e, which the committed A/B files of ``desc`` name.

Then ``python scripts/ab_rungs.py --rungs 14 --variant nopp=.ab/nopp --variant l2p256=.ab/base@l2_promotion=256``.
Raises ``SystemExit`` when a pattern it rewrites is no longer in the source.
"""

import re
import sys
from pathlib import Path

from attnclimb import rungs

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


PINGPONG_RUNG = 10  # the rung that brought the turns (named barriers my_turn / other_turn)


def sleep(src: str) -> str:
    """The producer's waits for free slots (Q, K, V "empty" barriers) with a suspend-time hint."""
    src = _sub(src, '#include "wgmma_attn.cuh"', '#include "wgmma_attn.cuh"\n#include "mbar_sleep.cuh"', 1)
    return _sub(src, r"hop::mbar_wait\((&bar_[qkv]_empty)", r"mbar_wait_sleep(\1", regex=True)


def sleepall(src: str) -> str:
    """Every mbarrier wait of the kernel with a suspend-time hint (the consumers' too)."""
    src = _sub(src, '#include "wgmma_attn.cuh"', '#include "wgmma_attn.cuh"\n#include "mbar_sleep.cuh"', 1)
    return _sub(src, r"hop::mbar_wait\(", "mbar_wait_sleep(", regex=True)


def tree(src: str) -> str:
    """The row max and the row sum of each tile in four independent chains per row (j mod 4) joined at the
    end, instead of one serial FMNMX / FADD chain of 2·S_TILES steps (tried on rung 12 before the issue-13
    fix: +1.4 to +2.6 % at 1k, within ±1 % elsewhere; to be re-measured on the top rung after it)."""
    src = _sub(
        src,
        """        float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
            tile_max[0] = fmaxf(tile_max[0], fmaxf(s[j][0], s[j][1]));
            tile_max[1] = fmaxf(tile_max[1], fmaxf(s[j][2], s[j][3]));
        }
""",
        """        float tm[2][4] = {{NEG_INF, NEG_INF, NEG_INF, NEG_INF}, {NEG_INF, NEG_INF, NEG_INF, NEG_INF}};
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
            tm[0][j % 4] = fmaxf(tm[0][j % 4], fmaxf(s[j][0], s[j][1]));
            tm[1][j % 4] = fmaxf(tm[1][j % 4], fmaxf(s[j][2], s[j][3]));
        }
        float tile_max[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) tile_max[r] = fmaxf(fmaxf(tm[r][0], tm[r][1]), fmaxf(tm[r][2], tm[r][3]));
""",
        1,
    )
    join = "for (int r = 0; r < 2; ++r) row_sum[r] += (ps[r][0] + ps[r][1]) + (ps[r][2] + ps[r][3]);\n"
    end_of_rows = (
        "            l_fix[r] = fmaf(l_fix[r], alpha[r], t == 0 ? p_top_rounded - p_top : 0.f);\n#endif\n        }\n"
    )
    src = _sub(src, end_of_rows, end_of_rows + "        float ps[2][4] = {};  // the row sums' four chains\n", 1)
    src = _sub(src, "row_sum[e >> 1] += s[j][e];", "ps[e >> 1][j % 4] += s[j][e];")
    slow_exit = "            return;\n        }\n#endif\n"  # the FP16 slow path's end (absent in older sources)
    if slow_exit in src:
        src = _sub(src, slow_exit, "#pragma unroll\n            " + join + slow_exit, 1)
    return _sub(src, "    };\n    auto issue_qk", "#pragma unroll\n        " + join + "    };\n    auto issue_qk", 1)


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


def nolfix(src: str) -> str:
    """Rung 14 as first landed (a241a2f, before the l fix): l sums the unrounded P, so a key
    that dominates its row above a kept reference weighs 2^x in l but bf16(2^x) in P·V (the rounding the
    page measures). For the fix's cost: per row and tile one FFMA + MUFU.EX2 fewer, and no round trip through
    bf16 (fp16). The +inf start of ``row_err`` stays (it changes no instruction in the loop), and so does
    ``l_fix`` of the LSE variants (0 here)."""
    src = _sub(
        src,
        "            const float t_max = quad_max(tile_max[r]);\n            float m_new = fmaxf(row_max[r], t_max);\n",
        "            float m_new = fmaxf(row_max[r], quad_max(tile_max[r]));\n",
        1,
    )
    return _sub(src, r"\n[ \t]*// P·V sums P rounded.*?p_top_rounded - p_top : 0\.f\);\n#endif", "", 1, regex=True)


LROUND_HEADER = """// A/B variant (make_variants.py, lround): l sums each P rounded to the P·V operand type, as
// pack_p_fragment will round it after the previous P·V's wait, so O = P·V / l uses one set of weights (rung
// 14's page: the l fix corrects only the tile max; tied maxima keep the rest of the rounding).
#pragma once
#include "common.cuh"

// Two adjacent P rounded (to nearest) to T, as pack2<T> rounds them; packing them again is exact.
__device__ __forceinline__ void round_pair(float& lo, float& hi, bf16) {
    const uint32_t packed = pack2<bf16>(lo, hi);  // one F2FP for the pair
    lo = __uint_as_float(packed << 16);
    hi = __uint_as_float(packed & 0xFFFF0000u);
}
// fp16 builds: not rounded (l as in rung 14 without the l fix). Rounding here, by pair or by element, made
// four causal FP16 builds spill; the A/B measures the bf16 build.
__device__ __forceinline__ void round_pair(float&, float&, f16) {}
"""


def lround(src: str) -> str:
    """Rung 14 with l summed from each P rounded as P·V rounds it (``round_pair``, in the softmax under the
    previous P·V: bf16, one F2FP and two integer ops per pair; the FP16 builds do not round, see the header),
    instead of the l fix (only the tile max's P rounded); the LSE variants keep the unrounded sum in
    ``l_lse``. P is packed again after the wait, as in rung 14 (exact: the values are already rounded).
    Keeping the packed pairs from the softmax instead (``p_next``, copied into the A fragment after the wait)
    made ptxas serialise the wgmmas (C7513). Model: ``attention_tiled(..., round_all_p=True)``."""
    src = nolfix(src)
    src = _sub(src, '#include "softmax.cuh"\n', '#include "softmax.cuh"\n#include "lround.cuh"\n', 1)
    src = _sub(
        src,
        "    float l_fix[2];  // what the l fix below added to row_sum (lane t == 0): the LSE leaves it out\n",
        "    float l_lse[2];  // lround: the unrounded sum of P, for the LSE\n",
        1,
    )
    src = _sub(src, "        l_fix[0] = l_fix[1] = 0.f;\n", "        l_lse[0] = l_lse[1] = 0.f;\n", 1)
    src = _sub(
        src,
        "quad_sum(row_sum[r] - l_fix[r]);  // sum P without the l fix's roundings",
        "quad_sum(l_lse[r]);  // the unrounded sum of P",
        1,
    )
    src = _sub(
        src,
        "            row_sum[r] *= alpha[r];\n",
        "            row_sum[r] *= alpha[r];\n#if WRITE_LSE\n            l_lse[r] *= alpha[r];\n#endif\n",
        1,
    )
    # both softmax loops (the fp16 slow path's and the common one): l_lse gets P, row_sum the rounded pairs
    src = _sub(
        src,
        r"(\n(?P<i>[ \t]*)row_sum\[e >> 1\] \+= s\[j\]\[e\];\n(?P<o>[ \t]*)\}\n)",
        lambda m: (
            f"\n#if WRITE_LSE\n{m['i']}l_lse[e >> 1] += s[j][e];\n#endif\n{m['o']}}}\n"
            f"{m['o']}round_pair(s[j][0], s[j][1], elem());  // l sums P as P·V will (lround)\n"
            f"{m['o']}round_pair(s[j][2], s[j][3], elem());\n"
            f"{m['o']}row_sum[0] += s[j][0] + s[j][1];\n{m['o']}row_sum[1] += s[j][2] + s[j][3];\n"
        ),
        regex=True,
    )
    return src


def poly(every: int):
    """Rung 14 with every ``every``-th column block of S (j % every == every − 1: 1/2, 5/22 or 2/22 of the
    exponentials at ``every`` = 2, 4, 8) exponentiated on the FMA pipe (``smx::poly_exp2``, softmax.cuh) and
    the rest on MUFU.EX2 (issue 13, item 6: FlashAttention-4's split of the exponentials between the two
    units). Built on ``lround`` (l from the rounded P, whichever unit computed it: the l fix's tile-max P on
    MUFU would not match a poly block's P). The bf16 loop only; the fp16 slow path and alpha stay on MUFU."""

    def make(src: str) -> str:
        return _sub(
            lround(src),
            """                s[j][e] =
                    smx::fast_exp2(fmaf(s[j][e], rs[e >> 1].mul, rs[e >> 1].neg_ref));  // FFMA + MUFU.EX2
""",
            f"""                const float x = fmaf(s[j][e], rs[e >> 1].mul, rs[e >> 1].neg_ref);
                s[j][e] = j % {every} == {every - 1} ? smx::poly_exp2(x) : smx::fast_exp2(x);  // FMA pipe : MUFU
""",
            1,
        )

    return make


def _sub(text, old, new, count=None, regex=False):
    n = len(re.findall(old, text, flags=re.S)) if regex else text.count(old)
    if n == 0 or (count is not None and n != count):
        raise SystemExit(f"make_variants: expected {count or 'some'} of {old!r} in the source, found {n}")
    return re.sub(old, new, text, flags=re.S) if regex else text.replace(old, new)


def nopp(src: str) -> str:
    """Every ``bar.sync`` / ``bar.arrive`` of the ping-pong turns removed (rungs 10 to the top): the first
    arrival before the loop, the syncs before each issue, the arrivals after it and the last turn's
    conditional arrival, whether its ``if`` takes one line (rungs 10-13) or two (rungs 14 up)."""
    first = r"\n[ \t]*if \(wg == [^\n]*\) hop::named_bar_arrive\(1, TURN_THREADS\);[^\n]*"
    src = _sub(src, first, "", 1, regex=True)
    src = _sub(src, r"\n[ \t]*hop::named_bar_sync\(my_turn, TURN_THREADS\);", "", regex=True)
    # the last turn's conditional arrival first (on one line or, from rung 14, an `if` over two), then the others
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


# The rung whose source the measured (not kept) variants rewrite: they were defined and measured on rung 14 (its
# page), and stay rung 14's so that their A/Bs can be repeated; `base` and the diagnostics follow the top rung.
VARIANTS_OF = 14
# The same for the variants measured on rung 17 in the fourth session (its page, "Tried on this rung").
VARIANTS_OF_17 = 17
# The two of them that gained somewhere on rung 17, again on the staged epilogue's rung (measured there and not
# kept, when it was rung 18; rung 19 since the fifteenth session's re-cut: the name stays that of the A/B files).
VARIANTS_OF_18 = 19


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


def latearrive(src: str, indent: str = " " * 12) -> str:
    """The turn handed to the other warpgroup after this one's S group is complete (after wgmma.wait_group 1)
    rather than right after issuing: the other warpgroup's wgmmas are issued while this one's P·V runs, not
    while they would queue behind both of its groups. ``indent``: the loop body's (12 spaces in the persistent
    rungs' work-tile loop, 8 in rung 10's, ``latearrive10``)."""
    arrive = f"{indent}hop::named_bar_arrive(other_turn, TURN_THREADS);\n"
    wait = f"{indent}hop::wgmma_wait<1>();                                 // the older group, S, is complete\n"
    return _sub(src, arrive + wait, wait + arrive, 1)


def sonly(src: str) -> str:
    """The turn covers the S group only: in the loop, a warpgroup arrives on the other one's barrier right after
    issuing S_nb, and waits for V and issues P_{nb-1}·V_{nb-1} after that, outside its turn (sixteenth session,
    rung 10's page). The other warpgroup's S may then reach the tensor cores before this one's P·V, which this
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


def vfirst10(src: str) -> str:
    """Rung 10's loop with ``vfirst``'s order (measured on rung 17 and the epilogue's rung, not on rung 10): the
    previous tile's V waited for before the turn's named barrier, so a late V no longer holds the turn."""
    wait_v = (
        "        TRACE_BEGIN(WAIT_V);\n        hop::mbar_wait(&bar_v[pv_slot], pv_phase);\n        TRACE_END(WAIT_V);\n"
    )
    src = _sub(src, "        TRACE_END(S);\n" + wait_v + "        TRACE_BEGIN(S);\n", "", 1)
    k_wait = (
        "        TRACE_BEGIN(WAIT_K);\n        hop::mbar_wait(&bar_k[slot], ring.phase);\n        TRACE_END(WAIT_K);\n"
    )
    return _sub(src, k_wait, k_wait + wait_v, 1)


def latearrive10(src: str) -> str:
    """Rung 10's loop with ``latearrive``'s order (measured on rung 17 only): the turn handed over after S is
    complete."""
    return latearrive(src, indent=" " * 8)


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
    top, measured, measured17 = rungs.TOP, rungs.get(VARIANTS_OF), rungs.get(VARIANTS_OF_17)
    for name, fn, extra, rung in (
        ("base", lambda text: text, {}, top),
        ("nolfix", nolfix, {}, measured),
        ("nopp", nopp, {}, measured),
        ("tree", tree, {}, measured),
        ("sleep", sleep, {"mbar_sleep.cuh": SLEEP_HEADER}, measured),
        ("sleepall", sleepall, {"mbar_sleep.cuh": SLEEP_HEADER}, measured),
        ("lround", lround, {"lround.cuh": LROUND_HEADER}, measured),
        ("poly2", poly(2), {"lround.cuh": LROUND_HEADER}, measured),
        ("poly4", poly(4), {"lround.cuh": LROUND_HEADER}, measured),
        ("poly8", poly(8), {"lround.cuh": LROUND_HEADER}, measured),
        ("noload", noload, {}, top),
        ("noexp", noexp, {}, top),
        ("nomax", nomax, {}, top),
        ("nopptop", nopp, {}, top),
        ("sleeptop", sleep, {"mbar_sleep.cuh": SLEEP_HEADER}, top),
        ("treetop", treetop, {}, top),
        ("hint", l2hint(True), {"l2hint.cuh": L2HINT_HEADER}, top),
        ("hintq", l2hint(False), {"l2hint.cuh": L2HINT_HEADER}, top),
        ("base17", lambda text: text, {}, measured17),
        ("wgarrive", wgarrive, {}, measured17),
        ("sleep17", sleep, {"mbar_sleep.cuh": SLEEP_HEADER}, measured17),
        ("vfirst", vfirst, {}, measured17),
        ("latearrive", latearrive, {}, measured17),
        ("wgarrive18", wgarrive, {}, rungs.get(VARIANTS_OF_18)),
        ("vfirst18", vfirst, {}, rungs.get(VARIANTS_OF_18)),
        ("sonly10", sonly, {}, rungs.get(PINGPONG_RUNG)),
        ("vfirst10", vfirst10, {}, rungs.get(PINGPONG_RUNG)),
        ("latearrive10", latearrive10, {}, rungs.get(PINGPONG_RUNG)),
        ("sonlytop", sonly, {}, top),
    ):
        d = Path(out) / name
        d.mkdir(parents=True, exist_ok=True)
        (d / rung.source.name).write_text(fn(rung.source.read_text()))
        for fname, text in extra.items():
            (d / fname).write_text(text)
        print(f"wrote {d}/")
    # rung 11 + the staged epilogue (benchmarks/ab/variants/rung11-epi) without the turns: issue 13's item 3 on rung 9's
    # kernel (scripts/device_calls.sh ab-epi11 and recut, scripts/make_recut.sh; sixteenth session)
    d = Path(out) / "epin"
    d.mkdir(parents=True, exist_ok=True)
    epi = Path(__file__).resolve().parents[1] / "benchmarks" / "ab" / "variants" / "rung11-epi" / "11_persistent.cu"
    (d / epi.name).write_text(nopp(epi.read_text()))
    print(f"wrote {d}/")
    # every rung with turns, without them, in one folder (``--rungs 9,...,TOP --variant nopp=.ab/nopp_ladder``)
    d = Path(out) / "nopp_ladder"
    d.mkdir(parents=True, exist_ok=True)
    for n in range(PINGPONG_RUNG, top.number + 1):
        (d / rungs.get(n).source.name).write_text(nopp(rungs.get(n).source.read_text()))
    print(f"wrote {d}/")


if __name__ == "__main__":
    main(*sys.argv[1:])
