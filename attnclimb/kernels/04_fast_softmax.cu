// Rung 4 — cheaper softmax: scale·log2(e) folded into one FFMA in front of ex2.approx.
//
// The idea (over rung 3): cut the non-matmul instructions per score (FlashAttention-2, Dao 2023,
// Sec. 3.1: non-matmul FLOPs are up to 16x more expensive than tensor-core FLOPs, so trimming them
// matters far more than their count suggests). Rung 3 computes p = expf((s − m)·scale): an FADD, an
// FMUL, then expf's own range reduction (x·log2 e split over FFMAs, a range check, scaling around
// MUFU.EX2). Since exp(x) = 2^(x·log2 e), the scale and log2 e are one constant c = scale·log2 e, and
//     p = 2^(s·c − m·c) = ex2(fma(s, c, −m·c))
// with m·c computed once per row and tile: one FFMA and one MUFU.EX2 per score. ex2.approx.ftz.f32
// (PTX ISA, "Floating point instructions: ex2") is the raw hardware instruction: ~2 ulp, subnormal
// results flushed to 0 (harmless: beside the row's largest p = 1 a p below 2^−126 is lost in the sum
// anyway), and ex2(−inf) = +0, which is what masked keys and the first tile's rescale factor need. The
// running max stays in raw score units, so the masking and max logic are unchanged; the row sums stay per
// thread until the end (one quad reduction per row instead of one per tile), as before.
//
// Unchanged from rung 3: cp.async NUM_STAGES-deep ring of swizzled K/V tiles; mma.sync.m16n8k16
// (bf16 in, fp32 accumulate) fed by ldmatrix (.trans for V); 4 warps x 32 rows of Q, two m16 tiles
// per warp (FlashAttention-2 Sec. 3.3), 2 CTAs per SM; P re-packed from the S accumulators as the A
// operand of P·V in registers; online softmax with O normalised once at the end; a negative scale
// negates Q once.

#include <cuda_bf16.h>
#include <math_constants.h>

#include "abi.cuh"
#include "cp_async_tiles.cuh"
#include "mma_sync.cuh"
#include "softmax.cuh"

#ifndef NUM_STAGES
#error "NUM_STAGES must be defined by the host (see attnclimb/rungs.py)"
#endif

constexpr int NUM_WARPS = NUM_THREADS / 32;
constexpr int M_TILES = 2;                   // m16 tiles of Q per warp
constexpr int WARP_ROWS = 16 * M_TILES;      // rows of Q per warp (32)
constexpr int KV_TILE = BLOCK_N * HEAD_DIM;  // bf16 in one K (or V) tile in shared memory
constexpr int D_STEPS = HEAD_DIM / 16;       // k16 steps of Q·Kᵀ (over head_dim)
constexpr int S_TILES = BLOCK_N / 8;         // n8 tiles of S per warp
constexpr int KV_STEPS = BLOCK_N / 16;       // k16 steps of P·V (over keys)
constexpr int O_TILES = HEAD_DIM / 8;        // n8 tiles of O per warp

static_assert(HEAD_DIM == 128, "this kernel is written for head_dim 128 (16 chunks of 16 bytes a row)");
static_assert(NUM_STAGES >= 2, "at least one tile in flight while another is computed on");
static_assert(BLOCK_M == NUM_WARPS * WARP_ROWS, "each warp owns 32 rows of Q");
static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of the mma K (16)");
static_assert((BLOCK_M * CHUNKS_PER_ROW) % NUM_THREADS == 0, "Q tile must split evenly over threads");
static_assert((BLOCK_N * CHUNKS_PER_ROW) % NUM_THREADS == 0, "K/V tiles must split evenly over threads");
static_assert((NUM_THREADS / CHUNKS_PER_ROW) % 8 == 0, "a thread's copies must share one swizzle key");
static_assert(SMEM_BYTES == 2 * (BLOCK_M * HEAD_DIM + NUM_STAGES * 2 * KV_TILE),
              "dynamic smem: Q and NUM_STAGES (K, V) tiles (rungs.py smem_layout)");

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------

// 2 CTAs per SM: caps registers at 65536 / (2 x NUM_THREADS) (255 for 128 threads).
extern "C" __global__ void __launch_bounds__(NUM_THREADS, 2)
    attn_fwd(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
             bf16* __restrict__ o, int seqlen_q, int seqlen_k, int num_m_blocks, float scale) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // block_addr needs 256-B aligned tiles. Dynamic shared memory starts 1 KB-aligned (ptxas folds this
    // test away); trap rather than compute garbage should that ever change.
    if (smem_addr(smem_raw) % 256 != 0) __trap();
    bf16* s_q = reinterpret_cast<bf16*>(smem_raw);  // BLOCK_M x HEAD_DIM
    bf16* s_kv = s_q + BLOCK_M * HEAD_DIM;          // NUM_STAGES x (K tile, V tile)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x / num_m_blocks;
    const int m_start = (blockIdx.x % num_m_blocks) * BLOCK_M;
    const bf16* k_head = k + bh * seqlen_k * HEAD_DIM;
    const bf16* v_head = v + bh * seqlen_k * HEAD_DIM;

    const int num_n_blocks = (seqlen_k + BLOCK_N - 1) / BLOCK_N;
    const int kv_limit = seqlen_k - 2 * t;  // the mask below, with this lane's column offset folded in

    // Copy K/V tile nb into ring slot nb % NUM_STAGES (K first, then V).
    auto load_kv_async = [&](int nb) {
        bf16* slot = s_kv + (nb % NUM_STAGES) * 2 * KV_TILE;
        const int n_start = nb * BLOCK_N;
        load_tile_async<BLOCK_N>(slot, k_head + n_start * HEAD_DIM, seqlen_k - n_start, tid);
        load_tile_async<BLOCK_N>(slot + KV_TILE, v_head + n_start * HEAD_DIM, seqlen_k - n_start, tid);
    };

    // Prologue. Commit groups, in order: Q, then K/V tiles 0 .. NUM_STAGES-2. A group is committed
    // even when there is no tile to load, so that "group i+1 holds tile i" stays true and the
    // wait counts below are constants.
    load_tile_async<BLOCK_M>(s_q, q + (bh * seqlen_q + m_start) * HEAD_DIM, seqlen_q - m_start, tid);
    cp_async_commit();
#pragma unroll
    for (int nb = 0; nb < NUM_STAGES - 1; ++nb) {
        if (nb < num_n_blocks) load_kv_async(nb);
        cp_async_commit();
    }

    // Q stays in shared memory; the warps read their A fragments from there at every k-step. Its group
    // is older than tile 0's, so the first tile's wait and barrier below cover it.
    const uint32_t q_base =
        a_lane_base(smem_addr(s_q) + warp * WARP_ROWS * HEAD_DIM * 2, lane);  // warp's 32 rows

    // A negative scale: softmax(scale·S) = softmax(|scale|·(−S)), so negate Q once (flip the bf16 sign
    // bits of the shared tile, exact; wait for this thread's Q copies first) and the max of the raw
    // scores below is the max of the scaled ones. A zero scale (uniform P) becomes the smallest normal
    // float: the same P, but −inf · scale stays −inf for masked keys instead of turning into NaN
    // (the same P unless raw scores exceed ~1e37: softmax.cuh, Limits).
    if (scale < 0.f) {
        cp_async_wait<NUM_STAGES - 1>();
        negate_tile<BLOCK_M>(s_q, tid);
    }
    scale = fmaxf(fabsf(scale), CUDART_TWO_TO_M126_F);  // FLT_MIN

    // This thread's rows are g and g + 8 of each of the warp's two m16 tiles: [mt][0] and [mt][1] below
    // (warp rows 16·mt + g and 16·mt + g + 8).
    float o_acc[M_TILES][O_TILES][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
        for (int j = 0; j < O_TILES; ++j)
            o_acc[mt][j][0] = o_acc[mt][j][1] = o_acc[mt][j][2] = o_acc[mt][j][3] = 0.f;
    }
    // row_max: raw scores (scale not applied); row_sum: this thread's partials, quad-summed at the end.
    float row_max[M_TILES][2], row_sum[M_TILES][2], row_err[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        row_max[mt][0] = row_max[mt][1] = smx::ROW_MAX_INIT;  // finite: see softmax.cuh
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
        row_err[mt][0] = row_err[mt][1] = 0.f;
    }
    const float scale_log2 = scale * CUDART_L2E_F;  // exp(scale·x) = 2^(scale_log2·x)

    for (int nb = 0; nb * BLOCK_N < seqlen_k; ++nb) {  // (not nb < num_n_blocks: one register less)
        const int n_start = nb * BLOCK_N;
        // Tile nb is group nb+1; NUM_STAGES+nb groups are committed, so allowing NUM_STAGES-2 of them
        // in flight means this thread's copies of tile nb are done. The barrier then makes every
        // thread's copies visible, and guarantees every warp has finished computing on tile nb-1,
        // whose slot the prefetch below overwrites.
        cp_async_wait<NUM_STAGES - 2>();
        __syncthreads();
        if ((nb + NUM_STAGES - 1) * BLOCK_N < seqlen_k) load_kv_async(nb + NUM_STAGES - 1);
        cp_async_commit();  // possibly empty, see the prologue
        const uint32_t s_k = smem_addr(s_kv + (nb % NUM_STAGES) * 2 * KV_TILE);
        const uint32_t k_base = b_lane_base(s_k, lane), v_base = a_lane_base(s_k + KV_TILE * 2, lane);

        // ---- S = Q·Kᵀ (32 x BLOCK_N per warp), fp32 in registers ----
        // Per k-step: the warp's two Q A fragments, then each K fragment feeds both m16 tiles.
        float s[M_TILES][S_TILES][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
        }
#pragma unroll
        for (int d = 0; d < D_STEPS; ++d) {
            uint32_t q_frag[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) ldmatrix_x4(q_frag[mt], block_addr(q_base, mt * 16, d * 16));
#pragma unroll
            for (int j = 0; j < S_TILES; j += 2) {
                uint32_t kb[4];
                ldmatrix_x4(kb, block_addr(k_base, j * 8, d * 16));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_m16n8k16(s[mt][j], q_frag[mt], kb[0], kb[1]);
                    mma_m16n8k16(s[mt][j + 1], q_frag[mt], kb[2], kb[3]);
                }
            }
        }

        // ---- keys past seqlen_k (only in the last tile): probability 0 ----
        // Key n_start + 8j + 2t + (e & 1) is masked when it is >= seqlen_k, i.e. 8j + (e & 1) >= kv_limit -
        // n_start.
        if (n_start + BLOCK_N > seqlen_k) {
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
                for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (j * 8 + (e & 1) >= kv_limit - n_start) s[mt][j][e] = NEG_INF;
                    }
                }
            }
        }

        // ---- online softmax: new running max, rescale factor, P = 2^(S·c − R), c = scale·log2 e ----
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) {
                tile_max[0] = fmaxf(tile_max[0], fmaxf(s[mt][j][0], s[mt][j][1]));
                tile_max[1] = fmaxf(tile_max[1], fmaxf(s[mt][j][2], s[mt][j][3]));
            }
            // R = the row's fp32 reference, P = 2^(s·c − R); alpha = 2^(R_old − R_new), exactly 1 when the
            // max did not change. See softmax.cuh for why P, l and alpha must share R, and for rows of huge
            // |max·c|.
            float alpha[2];
            smx::RowRescale rs[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float m_new = fmaxf(row_max[mt][r], quad_max(tile_max[r]));
                rs[r] = smx::online_rescale(row_max[mt][r], row_err[mt][r], m_new, scale_log2);
                row_err[mt][r] = rs[r].err;
                alpha[r] = rs[r].alpha;
                row_max[mt][r] = m_new;
                row_sum[mt][r] *= alpha[r];
            }
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[mt][j][e] = smx::fast_exp2(
                        fmaf(s[mt][j][e], rs[e >> 1].mul, rs[e >> 1].neg_ref));  // FFMA + MUFU.EX2
                    row_sum[mt][e >> 1] += s[mt][j][e];
                }
            }
#pragma unroll
            for (int j = 0; j < O_TILES; ++j) {
                o_acc[mt][j][0] *= alpha[0];
                o_acc[mt][j][1] *= alpha[0];
                o_acc[mt][j][2] *= alpha[1];
                o_acc[mt][j][3] *= alpha[1];
            }
        }

        // ---- O += P·V: P re-packed in registers as A fragments, V via ldmatrix.trans ----
        // All of P is packed first (32 registers of bf16x2 instead of 64 fp32), then the loop runs over
        // output columns outside and keys inside, so only one V column block's address is live; each V
        // fragment feeds both m16 tiles.
        uint32_t p_frag[M_TILES][KV_STEPS][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
            for (int kv = 0; kv < KV_STEPS; ++kv)
                pack_p_fragment(p_frag[mt][kv], s[mt][2 * kv], s[mt][2 * kv + 1]);
        }
#pragma unroll
        for (int j = 0; j < O_TILES; j += 2) {
#pragma unroll
            for (int kv = 0; kv < KV_STEPS; ++kv) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, block_addr(v_base, kv * 16, j * 8));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_m16n8k16(o_acc[mt][j], p_frag[mt][kv], vb[0], vb[1]);
                    mma_m16n8k16(o_acc[mt][j + 1], p_frag[mt][kv], vb[2], vb[3]);
                }
            }
        }
    }

    // ---- epilogue: O / l, bf16, rows past seqlen_q not written ----
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = quad_sum(row_sum[mt][r]);
            const float inv_l = l > 0.f ? 1.f / l : 0.f;
            const int row = m_start + warp * WARP_ROWS + mt * 16 + g + 8 * r;
            if (row < seqlen_q) {
                bf16* dst = o + (bh * seqlen_q + row) * HEAD_DIM + 2 * t;
#pragma unroll
                for (int j = 0; j < O_TILES; ++j) {
                    *reinterpret_cast<uint32_t*>(dst + j * 8) =
                        pack_bf16x2(o_acc[mt][j][2 * r] * inv_l, o_acc[mt][j][2 * r + 1] * inv_l);
                }
            }
        }
    }
}
