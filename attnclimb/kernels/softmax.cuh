// softmax.cuh — the base-2 online softmax of rungs 4 and up: `ex2.approx` and the running-max
// bookkeeping that keeps it exact at every magnitude of the scores. Rungs 0–3 do not include it.
//
// Notation, per query row: s = raw score (scale not applied), c = scale·log2(e) > 0, m = running max of
// s. P and the accumulators O, l of a row are kept relative to a reference R ≈ m·c:
//
//     P = 2^(s·c − R),   O = Σ P·V,   l = Σ P,   and on a new max  O, l *= α = 2^(R_old − R_new).
//
// Rung 4's fold computes P with ONE FFMA, P = ex2(fma(s, c, −R)), which needs R as an fp32 number.
// R = fl(m·c) differs from m·c by its rounding error e = m·c − R (|e| ≤ ½ ulp(m·c)). That is harmless
// as long as every P, l and α of the row use the SAME R: a common factor 2^e cancels in O / l. It is
// not harmless when α is computed against the exact m_old·c while P used the rounded R_old — then
// every tile multiplies the older tiles' weight by 2^e, and the error grows with the number of tiles
// (the bug of issue 6: rel. error 5.6e-2 for logits near −2.6e5 at seqlen_k 4096).
//
// So (FlashAttention-2 Sec. 3.1's online softmax, with the reference made consistent), per row and tile,
// with E the binary exponent of m (|m| in [2^E, 2^(E+1))):
//   mul = min(c, 2^(30 − E)),  R = fl(m·mul),  e = fma(m, mul, −R) (exact: the FFMA residual of a
//   product is representable),  P = ex2(fma(s, mul, −R)),  α = ex2(fma(m_old − m_new, c, e_new − e_old)).
// - Soft rows (mul = c, the rows of every real model): then |m·c| < 2^31, so |e| ≤ ½ ulp ≤ 64 and the
//   row's largest P = 2^e lies in [2^−64, 2^64]: no overflow, l ≤ seqlen_k·2^64, and each P carries one
//   FFMA rounding of a number of size ≤ |s·c − R| + 64.
// - Hard rows (mul = 2^(30 − E) < c): two distinct fp32 scores are ≥ 2^(E − 24) apart, i.e. ≥ 64 units of
//   s·mul (and more of s·c): every key below the max weighs < 2^−64 of one at the max, in the exact
//   softmax and here, so the row is uniform over its ties at the max to fp32 precision. m·mul is exact
//   (e = 0, R = m·c in true units), ties give P = ex2(0) = 1 and nothing can overflow, whatever |m·c|.
// - α = 2^(R_old − R_new) in true units: exactly ex2(0) = 1 when the max did not change, whatever the
//   magnitude. The running max starts at −FLT_MAX instead of −inf (every tile has a valid key, so it is
//   replaced on the first tile): no (−inf) − (−inf) = NaN can appear and no guard is needed.
// The per-score work stays one FFMA and one MUFU.EX2, branch-free; per row and tile a handful of integer
// and FP32 instructions pick mul and R.
//
// PTX ISA: "Floating Point Instructions: ex2" (ex2.approx.ftz.f32), "fma"; IEEE 754 binary32 layout.
#pragma once

#include <math_constants.h>

namespace smx {

// 2^x on the special-function unit: one MUFU.EX2, no range handling (2^−inf = +0, subnormals -> 0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// The running max before any key: finite, below every finite score that matters (see above).
constexpr float ROW_MAX_INIT = -CUDART_NORM_HUGE_F;  // −FLT_MAX

// mul = min(c, 2^(30 − E)) for c > 0. Positive floats order like their bit patterns, so the min is an
// integer min. The pattern of 2^(30 − E) has biased exponent 284 − biased(m), i.e. it is
// 0x8E000000 − x with x = m's exponent bits; since x ⊆ 0x7F800000, 0x7F800000 − x = ~m & 0x7F800000,
// so the pattern is (~m & 0x7F800000) + 0x0E800000: one LOP3 and one add-and-min (VIADDMNMX) on the
// path from the row max to the first P. When it exceeds the largest float (|m| < 2^−97) it is above
// c's pattern and c wins.
__device__ __forceinline__ float row_multiplier(float m, float c) {
    const unsigned int hard = (~__float_as_uint(m) & 0x7F800000u) + 0x0E800000u;
    return __uint_as_float(min(hard, __float_as_uint(c)));
}

// What one row needs for one tile: P = ex2(fma(s, mul, neg_ref)), O and l *= alpha.
struct RowRescale {
    float alpha;    // 2^(R_old − R_new): exactly 1 when the max did not change, 0-ish on the first tile
    float mul;      // c, or 2^(30 − E) on hard rows
    float neg_ref;  // −R = −fl(m_new·mul)
    float err;      // e_new = m_new·c − R (true units); pass it back as err_old on the next tile
};

__device__ __forceinline__ RowRescale online_rescale(float m_old, float err_old, float m_new, float c) {
    RowRescale r;
    r.mul = row_multiplier(m_new, c);
    const float ref = m_new * r.mul;
    r.neg_ref = -ref;
    r.err = fmaf(m_new, r.mul, -ref);
    r.alpha = fast_exp2(fmaf(m_old - m_new, c, r.err - err_old));  // first tile: 2^−inf or ~2^−huge = 0
    return r;
}

}  // namespace smx
