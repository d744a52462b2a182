// softmax.cuh — the base-2 online softmax of rungs 4 and up: `ex2.approx` and the running-max
// bookkeeping that keeps it exact at every magnitude of the scores (see Limits). Rungs 0–3 do not
// include it.
//
// Notation, per query row: s = raw score (scale not applied), c = scale·log2(e) > 0, m = running max of
// s. P and the accumulators O, l of a row are kept relative to a reference R ≈ m·c:
//
//     P = 2^(s·c − R),   O = Σ P·V,   l = Σ P,   and on a new max  O, l *= α = 2^(R_old − R_new).
//
// Rung 4's fold computes P with ONE FFMA, P = ex2(fma(s, c, −R)), which needs R as an fp32 number,
// and R differs from m·c by its rounding error e = m·c − R. That is harmless as long as every P, l and α
// of the row use the SAME R: a common factor 2^e cancels in O / l. It is not harmless when α is computed
// against the exact m_old·c while P used the rounded R_old — then every tile multiplies the older tiles'
// weight by 2^e, and the error grows with the number of tiles (the bug of issue 6: rel. error 5e-2 to
// 1e-1 for logits near ±2.6e5 at seqlen_k 4096, NaN once |m·c| passed ~2^31).
//
// So (FlashAttention-2 Sec. 3.1's online softmax, with the reference made consistent), per row and tile,
// with E the binary exponent of m (|m| in [2^E, 2^(E+1))):
//   mul = min(c, 2^(29 − E)),  R = m·mul rounded UP (FMUL.RP),  e = fma(m, mul, −R) (exact: the FFMA
//   residual of a product is representable),  P = ex2(fma(s, mul, −R)),
//   α = ex2(fma(m_old − m_new, c, e_new − e_old)).
// - Soft rows (mul = c, the rows of every real model): then |m·c| < 2^30, so −64 < e ≤ 0 and the row's
//   largest P = 2^e lies in (2^−64, 1]: every P ≤ 1, so l ≤ seqlen_k and O = Σ P·V stays within
//   Σ |V| (no overflow the exact softmax would not have); P below 2^−126 flushes to 0, under 2^−62 of
//   the largest. Each P carries one FFMA rounding of a number of size ≤ |s·c − R|.
// - Hard rows (mul = 2^(29 − E) < c, so |m·c| ≥ 2^29): two distinct fp32 scores are ≥ 2^(E − 24) apart,
//   ≥ 32 units of s·mul and more of s·c: every key below the max weighs < 2^−32 of one at the max, in
//   the exact softmax and here (at most seqlen_k·2^−32 in all, 4e-6 at 16k keys, under bf16's 4e-3),
//   so the row is uniform over its ties at the max. m·mul is exact (e = 0, R = m·c in true units), ties
//   give P = ex2(0) = 1 and nothing can overflow, whatever |m·c|.
// - α = 2^(R_old − R_new) in true units: exactly ex2(0) = 1 when the max did not change, whatever the
//   magnitude. The running max starts at −FLT_MAX instead of −inf (every tile has a valid key, so it is
//   replaced on the first tile): no (−inf) − (−inf) = NaN can appear and no guard is needed; the first
//   tile's α multiplies O = l = 0.
// Limits (found in review, not fixed): with c below ~2^−120 (a scale under ~1e-36, or 0, which the
// kernels raise to FLT_MIN) and raw scores beyond ~1e37, m_old − m_new can overflow to −inf (α = 0 where
// 2^(Δm·c) is not negligible) and FLT_MIN·s is no longer ~0 (P not uniform for scale 0).
// The per-score work stays one FFMA and one MUFU.EX2, branch-free; per row and tile a handful of integer
// and FP32 instructions pick mul and R.
//
// PTX ISA: "Floating Point Instructions: ex2" (ex2.approx.ftz.f32), "fma", "mul" (.rp); IEEE 754 binary32.
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

// mul = min(c, 2^(29 − E)) for c > 0. Positive floats order like their bit patterns, so the min is an
// integer min. The pattern of 2^(29 − E) has biased exponent 283 − biased(m), i.e. it is
// 0x8D800000 − x with x = m's exponent bits; since x ⊆ 0x7F800000, 0x7F800000 − x = ~m & 0x7F800000,
// so the pattern is (~m & 0x7F800000) + 0x0E000000: one LOP3 and one add-and-min (VIADDMNMX) on the
// path from the row max to the first P. When it exceeds the largest float (|m| < 2^−98) it is above
// c's pattern and c wins.
__device__ __forceinline__ float row_multiplier(float m, float c) {
    const unsigned int hard = (~__float_as_uint(m) & 0x7F800000u) + 0x0E000000u;
    return __uint_as_float(min(hard, __float_as_uint(c)));
}

// What one row needs for one tile: P = ex2(fma(s, mul, neg_ref)), O and l *= alpha.
struct RowRescale {
    float alpha;    // 2^(R_old − R_new): exactly 1 when the max did not change
    float mul;      // c, or 2^(29 − E) on hard rows
    float neg_ref;  // −R, R = m_new·mul rounded up
    float err;      // e_new = m_new·c − R (true units); pass it back as err_old on the next tile
};

__device__ __forceinline__ RowRescale online_rescale(float m_old, float err_old, float m_new, float c) {
    RowRescale r;
    r.mul = row_multiplier(m_new, c);
    const float ref = __fmul_ru(m_new, r.mul);  // rounded up: e <= 0, so every P <= 1
    r.neg_ref = -ref;
    r.err = fmaf(m_new, r.mul, -ref);
    r.alpha = fast_exp2(fmaf(m_old - m_new, c, r.err - err_old));
    return r;
}

}  // namespace smx
