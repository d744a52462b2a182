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
// Rung 12 (lazy rescale) passes a row's old max back in as m_new while the new max's P against it stays
// <= 2^8: then α = 1 exactly, and the bounds above hold with 2^8 in place of 1 (every P <= 2^8, l <=
// 2^8·seqlen_k, O within 2^8·Σ|V|); its page (docs/rungs/12-lazy-rescale.md) has the argument.
//
//
// fp16 P (the top rung's FP16 variant). P is rounded to the input type for the P·V MMA. bf16 keeps
// fp32's exponent range, so a row whose largest P is 2^e with e near −64 is fine; fp16 is not (normal
// from 2^−14, subnormal down to 2^−24): every P of a soft row with e < −24 would round to 0 while l > 0,
// an O of 0 for the row. e ≤ −1 needs ulp(R) ≥ 2, i.e. |m·c| ≥ 2^24 (e ∈ (−ulp(R), 0]), so ordinary
// rows never see it. online_rescale<true> therefore also returns the integer k = ceil(e) ≤ 0 (k = 0
// whenever e > −1, so always when |m·c| < 2^24) and the row keeps
//     P = 2^(s·c − R − k) = ex2(fma(s, mul, −R) − k),   err = e − k,
// i.e. R is replaced by R' = R + k (a real number; not an fp32 one in general, hence the FADD).
// - e − k is exact: for k ≤ −1, e ∈ (k − 1, k] ⊂ [2k, k/2], Sterbenz's lemma; for k = 0 it is e.
// - The row's largest P is 2^(e − k) ∈ (1/2, 1]: normal in fp16, never above 1 (l ≤ seqlen_k, as before).
// - R' is "m·c rounded up to the grid fp32 ∪ Z": below 2^24 the fp32 grid holds every integer (and k = 0,
//   R' = R); above it every fp32 number is an integer, so R + ceil(m·c − R) = ceil(m·c). Rounding up to a
//   fixed grid is monotone in m, so R'_old ≤ R'_new and α ≤ 1 still; when the max does not change,
//   k and err do not either and α = ex2(0) = 1 exactly.
// - P, l and α share R': l sums the stored P (the same fp32 values that are packed), and α is computed
//   from err = m·c − R' exactly as before from e, so α = 2^(R'_old − R'_new) and the invariant above
//   (a common 2^err factor cancels in O / l) holds unchanged.
// - Hard rows (mul < c): e = 0, k = 0: nothing changes.
// - Cost: per row and tile one FRND.CEIL and one FADD; per score one FADD, only on a warp-uniform slow
//   path (the caller branches on __any_sync over the warp of k != 0), so ordinary rows run the bf16
//   variant's loop. The LSE adds k: ln Σ exp(scale·s) = (R + k)·ln 2 + ln l.
// - After the shift, fp16's subnormal range (below 2^−14) still costs accuracy, as in any kernel with
//   fp16 P: a P at or below 2^−25 rounds to 0 (the exact softmax's weights under ~3e-8 of the row's
//   largest), and a P in (2^−25, 2^−14) keeps up to 2^−25 of absolute rounding error (half the subnormal
//   step 2^−24). Both are absolute: each P loses at most 2^−25, while l is only guaranteed >= 1/2 (the
//   largest P), so the bound relative to l is seqlen_k·2^−25 / (1/2) = seqlen_k·2^−24 (about 1e-3 at
//   16k keys). Rows with many keys near the row's max have a larger l and lose correspondingly less.
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

// 2^x on the FMA pipe instead of the special-function unit, for a share of a tile's exponentials (the idea of
// FlashAttention-4's Blackwell softmax; issue 13, item 6). Range reduction by one rounding add: with
// M = 1.5·2^23 + 127, t = x + M is an fp32 number in [2^23, 2^24), whose ulp is 1, so t = M + round(x) and
// the low bits of its pattern hold round(x) + 127; j = t − M and f = x − j ∈ [−0.5, 0.5] are exact. 2^f is a
// degree-3 polynomial with p(0) = 1 exactly (so a key at the reference gets P = 1, as from MUFU), fitted for
// the relative error: <= 1.02e-4 = 2^−13.3 in fp32 Horner over [−0.5, 0.5], a twentieth of bf16's rounding
// of P (coefficients: reference.POLY_EXP2_C, whose mirror poly_exp2_fp32 the CPU tests check), and 2^j is
// the pattern (round(x) + 127) << 23, shifted out of t's bits: 0 when round(x) = −127. The clamp at −127
// (max.NaN keeps a NaN a NaN, as MUFU.EX2 does) makes every x below it, −inf included, give +0 (as
// ex2.approx.ftz does below −126; x in (−126.5, −126) gives a subnormal here, 0 there). Valid for x < 127.5
// (+inf gives NaN); P never exceeds 2^8 here (rung 12's threshold).
// Cost: FMNMX, 3 FADD, 3 FFMA, SHF, FMUL on the FP32/INT pipes in place of one MUFU.EX2.
__device__ __forceinline__ float poly_exp2(float x) {
    asm("max.NaN.f32 %0, %0, 0fC2FE0000;\n" : "+f"(x));  // max(x, −127), NaN stays NaN
    const float magic = 12583039.f;                      // 1.5·2^23 + 127
    const float t = __fadd_rn(x, magic);                 // rounded add: not contracted, not reassociated
    const float f = __fsub_rn(x, __fsub_rn(t, magic));   // x − round(x), exactly
    const float p = fmaf(fmaf(fmaf(0.055008519f, f, 0.24221009f), f, 0.69328290f), f, 1.f);
    return p * __uint_as_float(__float_as_uint(t) << 23);  // · 2^round(x)
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
    float shift;    // SHIFT_P only: k = ceil(e) <= 0, P = ex2(fma(s, mul, neg_ref) − shift), err = e − k
};

// SHIFT_P (fp16 P, see above): also k, with err and alpha relative to R + k.
template <bool SHIFT_P = false>
__device__ __forceinline__ RowRescale online_rescale(float m_old, float err_old, float m_new, float c) {
    RowRescale r;
    r.mul = row_multiplier(m_new, c);
    const float ref = __fmul_ru(m_new, r.mul);  // rounded up: e <= 0, so every P <= 1
    r.neg_ref = -ref;
    r.err = fmaf(m_new, r.mul, -ref);
    r.shift = 0.f;
    if constexpr (SHIFT_P) {
        r.shift = ceilf(r.err);  // 0 unless |m·c| >= 2^24
        r.err -= r.shift;        // exact (Sterbenz)
    }
    r.alpha = fast_exp2(fmaf(m_old - m_new, c, r.err - err_old));
    return r;
}

}  // namespace smx
