// Rung 1 — fused attention with an online softmax, on CUDA cores.
//
// The idea: never materialise S. One CTA owns BLOCK_M rows of Q and walks over K/V in tiles of
// BLOCK_N rows. For each tile it computes the BLOCK_M x BLOCK_N scores in registers, and keeps
// per row a running maximum m and a running normaliser l. When a new tile raises the maximum from
// m_old to m_new, everything accumulated so far was weighted by exp(s - m_old), so the O
// accumulator and l are multiplied by exp(m_old - m_new) before the tile's exp(s - m_new) * V is
// added. O is divided by l once, at the end. The result equals softmax(S) V exactly (in exact
// arithmetic), but the only HBM traffic is Q, K, V in and O out.
// References: Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", Alg. 3;
// Dao et al. 2022, "FlashAttention", Sec. 3.1 (tiling) and Alg. 1.
//
// Still no tensor cores: both products are fp32 FMAs from shared memory, with the register-tile
// layout of rung 0's GEMMs (that is rung 2's idea). expf is the accurate library exp (rung 4
// folds the scale into exp2).
//
// Launch (docs/kernel-abi.md, pointer form): 1-D grid of num_m_blocks * batch*heads CTAs,
// NUM_THREADS threads, dynamic shared memory
//     4 * (BLOCK_M * (HEAD_DIM + 4) + BLOCK_N * (HEAD_DIM + 4) + BLOCK_N * HEAD_DIM) bytes
// (Q tile, K tile, V tile as fp32; the P tile reuses the K tile's space).

#include <cuda_bf16.h>

#include "abi.cuh"
#include "fp32_tiles.cuh"

// ---------------------------------------------------------------------------------------------
// Thread layout (as in rung 0): the CTA's 256 threads form a 16 x 16 grid. Thread (ty, tx) owns
// rows ty*ROWS_PER_THREAD .. +ROWS_PER_THREAD-1 of the Q tile, key columns tx + 16*j of each
// score tile, and output columns 4*tx + {0..3} and 64 + 4*tx + {0..3} of O. A warp covers 2 row
// groups and all 16 column groups: each shared-memory value a warp reads is either broadcast or
// part of a contiguous run (no bank conflicts), and the 16 threads that share a row are one
// half-warp, so row max / row sum are warp shuffles.
// ---------------------------------------------------------------------------------------------
constexpr int ROWS_PER_THREAD = BLOCK_M / GRID_DIM;
constexpr int COLS_PER_THREAD = BLOCK_N / GRID_DIM;  // key columns of a score tile per thread
constexpr int QK_STRIDE = HEAD_DIM + SMEM_PAD;       // row stride of the Q and K tiles (floats)
constexpr int P_STRIDE = BLOCK_N + SMEM_PAD;         // row stride of the P tile (floats)

static_assert(NUM_THREADS == GRID_DIM * GRID_DIM, "the tiles assume 256 threads (16 x 16)");
static_assert(BLOCK_M % GRID_DIM == 0 && BLOCK_N % GRID_DIM == 0, "tiles must split over 16 threads");
static_assert(BLOCK_N % 4 == 0, "P V reads P four keys at a time");
static_assert(HEAD_DIM == 8 * GRID_DIM, "each thread owns 8 output columns");
static_assert(BLOCK_M * P_STRIDE <= BLOCK_N * QK_STRIDE, "the P tile must fit in the K tile's space");
static_assert(SMEM_BYTES == 4 * (BLOCK_M * QK_STRIDE + BLOCK_N * QK_STRIDE + BLOCK_N * HEAD_DIM),
              "dynamic smem: the fp32 Q, K and V tiles (rungs.py smem_layout)");

// Stage ROWS whole rows (starting at row0) of a (seqlen, HEAD_DIM) bf16 matrix into
// dst[ROWS][STRIDE] as fp32; rows >= seqlen are zero. A warp reads two contiguous 256-byte rows.
template <int ROWS, int STRIDE>
__device__ __forceinline__ void stage_rows(float* dst, const __nv_bfloat16* src, int row0, int seqlen) {
    constexpr int VECS_PER_ROW = HEAD_DIM / 8;
    for (int idx = threadIdx.x; idx < ROWS * VECS_PER_ROW; idx += NUM_THREADS) {
        const int r = idx / VECS_PER_ROW;
        const int c = (idx % VECS_PER_ROW) * 8;
        const int row = row0 + r;
        const bool valid = row < seqlen;
        load8_bf16_as_f32(dst + r * STRIDE + c, src + (valid ? row : 0) * HEAD_DIM + c, valid);
    }
}

// Max or sum over the 16 threads of a row group (one half-warp: lanes differing in bits 0-3).
// After the xor butterfly every one of the 16 lanes holds the same, bit-identical result.
template <bool IS_MAX>
__device__ __forceinline__ float row_group_reduce(float x) {
#pragma unroll
    for (int offset = GRID_DIM / 2; offset > 0; offset >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, offset);
        x = IS_MAX ? fmaxf(x, y) : x + y;
    }
    return x;
}

// s[i][j] = Q[row i] . K[key column j] for this thread's ROWS_PER_THREAD x COLS_PER_THREAD scores
// (unscaled), from the fp32 Q and K tiles in shared memory.
__device__ __forceinline__ void tile_scores(const float* q_smem, const float* k_smem,
                                            float (&s)[ROWS_PER_THREAD][COLS_PER_THREAD]) {
    const int ty = thread_row(), tx = thread_col();
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i)
#pragma unroll
        for (int j = 0; j < COLS_PER_THREAD; ++j) s[i][j] = 0.f;

#pragma unroll 4
    for (int d = 0; d < HEAD_DIM; d += 4) {
        float4 a[ROWS_PER_THREAD], b[COLS_PER_THREAD];
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i)
            a[i] = *reinterpret_cast<const float4*>(q_smem + (ty * ROWS_PER_THREAD + i) * QK_STRIDE + d);
#pragma unroll
        for (int j = 0; j < COLS_PER_THREAD; ++j)
            b[j] = *reinterpret_cast<const float4*>(k_smem + (tx + GRID_DIM * j) * QK_STRIDE + d);
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i)
#pragma unroll
            for (int j = 0; j < COLS_PER_THREAD; ++j) {
                s[i][j] = fmaf(a[i].x, b[j].x, s[i][j]);
                s[i][j] = fmaf(a[i].y, b[j].y, s[i][j]);
                s[i][j] = fmaf(a[i].z, b[j].z, s[i][j]);
                s[i][j] = fmaf(a[i].w, b[j].w, s[i][j]);
            }
    }
}

// o[i][:] += P[row i][:] V for this thread's rows and 8 output columns, from the fp32 P tile
// (p_smem[BLOCK_M][P_STRIDE]) and V tile (v_smem[BLOCK_N][HEAD_DIM]) in shared memory.
__device__ __forceinline__ void accumulate_pv(const float* p_smem, const float* v_smem,
                                              float (&o)[ROWS_PER_THREAD][8]) {
    const int ty = thread_row(), tx = thread_col();
    constexpr int HALF = HEAD_DIM / 2;
#pragma unroll 2
    for (int kk = 0; kk < BLOCK_N; kk += 4) {
        float4 a[ROWS_PER_THREAD];
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i)
            a[i] = *reinterpret_cast<const float4*>(p_smem + (ty * ROWS_PER_THREAD + i) * P_STRIDE + kk);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const float4 b0 = *reinterpret_cast<const float4*>(v_smem + (kk + t) * HEAD_DIM + 4 * tx);
            const float4 b1 = *reinterpret_cast<const float4*>(v_smem + (kk + t) * HEAD_DIM + HALF + 4 * tx);
#pragma unroll
            for (int i = 0; i < ROWS_PER_THREAD; ++i) {
                const float pa = t == 0 ? a[i].x : t == 1 ? a[i].y : t == 2 ? a[i].z : a[i].w;
                o[i][0] = fmaf(pa, b0.x, o[i][0]);
                o[i][1] = fmaf(pa, b0.y, o[i][1]);
                o[i][2] = fmaf(pa, b0.z, o[i][2]);
                o[i][3] = fmaf(pa, b0.w, o[i][3]);
                o[i][4] = fmaf(pa, b1.x, o[i][4]);
                o[i][5] = fmaf(pa, b1.y, o[i][5]);
                o[i][6] = fmaf(pa, b1.z, o[i][6]);
                o[i][7] = fmaf(pa, b1.w, o[i][7]);
            }
        }
    }
}

// Two CTAs per SM (2 x 98 KB of shared memory) need <= 128 registers per thread.
extern "C" __global__ void __launch_bounds__(NUM_THREADS, 2)
    attn_fwd(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
             const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ o, int seqlen_q, int seqlen_k,
             int num_m_blocks, float scale) {
    // Shared memory: the Q tile stays for the whole kernel; K and V are refilled every tile.
    // Once the scores are in registers the K tile is dead, so P is written over it: this keeps
    // the CTA under ~113 KB, and two CTAs fit on one SM.
    extern __shared__ __align__(16) float smem[];
    float* q_smem = smem;                          // [BLOCK_M][QK_STRIDE]
    float* k_smem = q_smem + BLOCK_M * QK_STRIDE;  // [BLOCK_N][QK_STRIDE]
    float* v_smem = k_smem + BLOCK_N * QK_STRIDE;  // [BLOCK_N][HEAD_DIM]
    float* p_smem = k_smem;                        // [BLOCK_M][P_STRIDE], over the K tile

    const int bh = blockIdx.x / num_m_blocks;
    const int m0 = (blockIdx.x % num_m_blocks) * BLOCK_M;
    const __nv_bfloat16* q_head = q + (size_t)bh * seqlen_q * HEAD_DIM;
    const __nv_bfloat16* k_head = k + (size_t)bh * seqlen_k * HEAD_DIM;
    const __nv_bfloat16* v_head = v + (size_t)bh * seqlen_k * HEAD_DIM;
    const int ty = thread_row(), tx = thread_col();

    stage_rows<BLOCK_M, QK_STRIDE>(q_smem, q_head, m0, seqlen_q);  // rows past seqlen_q are 0

    // Per owned row: running max m (of raw scores), running normaliser l, and 8 columns of the
    // unnormalised output O = sum_j exp((s_j - m)·|scale|) v_j. The scale multiplies s - m, after the
    // subtraction (scaled_gap): scaling first would round scale·s to fp32 and, for large |scale·s|, move
    // every probability by that rounding (issue 6). A negative scale negates the raw scores (exact), so
    // that their max is the max of the scaled ones.
    const bool negate = scale < 0.f;
    const float abs_scale = fabsf(scale);
    float m[ROWS_PER_THREAD], l[ROWS_PER_THREAD], acc[ROWS_PER_THREAD][8];
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        m[i] = neg_inf();
        l[i] = 0.f;
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[i][c] = 0.f;
    }

    for (int n0 = 0; n0 < seqlen_k; n0 += BLOCK_N) {
        __syncthreads();  // every thread is done with the previous tile's P (= K space) and V
        stage_rows<BLOCK_N, QK_STRIDE>(k_smem, k_head, n0, seqlen_k);  // keys past seqlen_k are 0
        stage_rows<BLOCK_N, HEAD_DIM>(v_smem, v_head, n0, seqlen_k);
        __syncthreads();

        float s[ROWS_PER_THREAD][COLS_PER_THREAD];
        tile_scores(q_smem, k_smem, s);

#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i) {
            // Keys past seqlen_k get a score of -inf (probability exactly 0).
            float tile_max = neg_inf();
#pragma unroll
            for (int j = 0; j < COLS_PER_THREAD; ++j) {
                const bool key_valid = n0 + tx + GRID_DIM * j < seqlen_k;
                s[i][j] = key_valid ? (negate ? -s[i][j] : s[i][j]) : neg_inf();
                tile_max = fmaxf(tile_max, s[i][j]);
            }
            tile_max = row_group_reduce<true>(tile_max);

            // The online-softmax step. Every tile we visit holds key n0 < seqlen_k, so m_new is
            // finite; the guard only makes sure a (hypothetical) all-masked row subtracts 0
            // instead of computing (-inf) - (-inf) = NaN. On the first tile m[i] = -inf and
            // correction = expf(-inf) = 0, which zeroes the (empty) accumulator and l.
            const float m_new = fmaxf(m[i], tile_max);
            const float m_use = m_new == neg_inf() ? 0.f : m_new;
            const float correction = expf(scaled_gap(m[i], m_use, abs_scale));

            float tile_sum = 0.f;
#pragma unroll
            for (int j = 0; j < COLS_PER_THREAD; ++j) {
                s[i][j] = expf(scaled_gap(s[i][j], m_use, abs_scale));  // masked keys: expf(-inf) = 0
                tile_sum += s[i][j];
            }
            tile_sum = row_group_reduce<false>(tile_sum);

            l[i] = l[i] * correction + tile_sum;
            m[i] = m_new;
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[i][c] *= correction;
        }

        __syncthreads();  // every thread has finished reading the K tile: P may overwrite it
#pragma unroll
        for (int i = 0; i < ROWS_PER_THREAD; ++i)
#pragma unroll
            for (int j = 0; j < COLS_PER_THREAD; ++j)
                p_smem[(ty * ROWS_PER_THREAD + i) * P_STRIDE + tx + GRID_DIM * j] = s[i][j];
        __syncthreads();

        accumulate_pv(p_smem, v_smem, acc);
    }

    // Normalise once and store; rows past seqlen_q are not written. l >= 1 for every real row
    // (its maximum key contributes expf(0) = 1).
    constexpr int HALF = HEAD_DIM / 2;
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        const int row = m0 + ty * ROWS_PER_THREAD + i;
        if (row >= seqlen_q) continue;
        const float inv_l = l[i] > 0.f ? 1.f / l[i] : 0.f;
        __nv_bfloat16* o_row = o + ((size_t)bh * seqlen_q + row) * HEAD_DIM;
        store4_f32_as_bf16(o_row + 4 * tx, acc[i][0] * inv_l, acc[i][1] * inv_l, acc[i][2] * inv_l,
                           acc[i][3] * inv_l);
        store4_f32_as_bf16(o_row + HALF + 4 * tx, acc[i][4] * inv_l, acc[i][5] * inv_l, acc[i][6] * inv_l,
                           acc[i][7] * inv_l);
    }
}
