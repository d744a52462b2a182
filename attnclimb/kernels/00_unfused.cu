// Rung 0 — unfused attention: S = Q K^T to HBM, a row softmax of scale * S in place, then O = P V.
//
// The idea: the textbook formula, O = softmax(scale * Q K^T) V, computed as three separate kernels
// that talk through an fp32 workspace `s` of batch*heads*seqlen_q*seqlen_k floats in global
// memory. Every other rung is measured against this one. It uses no tensor cores: both matrix
// products are classic shared-memory tiled GEMMs on the fp32 CUDA cores (each thread owns a small
// register tile of outputs and reuses every shared-memory value it loads several times).
// Reference: Vaswani et al. 2017, "Attention Is All You Need", Eq. (1).
//
// Launch shapes (the host computes these; see docs/kernel-abi.md "Rung 0"). Every grid is 1-D, so
// batch*heads may exceed 65535. Let BH = batch*heads, mb = ceil(seqlen_q / BLOCK_M),
// nb = ceil(seqlen_k / BLOCK_N):
//
//   qk_scores  (q, k, s, seqlen_q, seqlen_k, scale)
//       grid.x = BH * mb * nb,  block.x = NUM_THREADS,  dynamic smem = 0 (static smem only)
//       CTA b computes the BLOCK_M x BLOCK_N tile (m_block, n_block) of head bh, where
//       bh = b / (mb*nb), m_block = (b % (mb*nb)) / nb, n_block = b % nb.
//   row_softmax(s, seqlen_k, scale)
//       grid.x = BH * seqlen_q,  block.x = NUM_THREADS,  dynamic smem = 0
//       CTA b turns row b of the workspace (BH*seqlen_q rows of seqlen_k floats) into probabilities.
//   pv_product (p, v, o, seqlen_q, seqlen_k)        (p is the same workspace, now holding P)
//       grid.x = BH * mb,  block.x = NUM_THREADS,  dynamic smem = 0
//       CTA b computes the BLOCK_M x HEAD_DIM tile of O: bh = b / mb, m_block = b % mb.
//
// The three launches must run in this order on one stream. All workspace offsets use 64-bit
// math: the workspace may hold more than 2^31 floats (16 heads at seqlen 16k is 2^32 floats).

#include <cuda_bf16.h>

#include "abi.cuh"
#include "fp32_tiles.cuh"

// ---------------------------------------------------------------------------------------------
// Thread layout of the two GEMM kernels: the CTA's 256 threads form a 16 x 16 grid. Thread
// (ty, tx) owns the output rows ty*ROWS_PER_THREAD .. +ROWS_PER_THREAD-1 of the tile; a warp thus
// covers 2 row groups and all 16 column groups, so each shared-memory value a warp reads is
// either broadcast (same address) or part of a contiguous run (no bank conflicts).
// ---------------------------------------------------------------------------------------------
constexpr int ROWS_PER_THREAD = BLOCK_M / GRID_DIM;
constexpr int COLS_PER_THREAD = BLOCK_N / GRID_DIM;  // qk_scores: key columns per thread
constexpr int CHUNK_K = 32;                          // depth of the reduction slice staged in smem

static_assert(NUM_THREADS == GRID_DIM * GRID_DIM, "the GEMM tiles assume 256 threads (16 x 16)");
static_assert(BLOCK_M % GRID_DIM == 0 && BLOCK_N % GRID_DIM == 0, "tiles must split over 16 threads");
static_assert(HEAD_DIM % CHUNK_K == 0, "head_dim must be a multiple of the reduction slice");
static_assert(HEAD_DIM == 8 * GRID_DIM, "pv_product gives each thread 8 output columns");
static_assert(NUM_THREADS % 32 == 0 && NUM_THREADS <= 1024, "whole warps");
static_assert(SMEM_BYTES == 0, "rung 0 uses static shared memory only (rungs.py smem_layout)");

// =============================================================================================
// Kernel 1: S = scale * Q K^T for one BLOCK_M x BLOCK_N tile, written as fp32 to the workspace.
// =============================================================================================

// Stage columns [d0, d0 + CHUNK_K) of `rows` consecutive rows (starting at row0) of a
// (seqlen, HEAD_DIM) bf16 matrix into dst[rows][CHUNK_K + SMEM_PAD] as fp32; rows >= seqlen are 0.
template <int ROWS>
__device__ __forceinline__ void stage_row_slice(float* dst, const __nv_bfloat16* src, int row0, int seqlen,
                                                int d0) {
    constexpr int VECS_PER_ROW = CHUNK_K / 8;
    for (int idx = threadIdx.x; idx < ROWS * VECS_PER_ROW; idx += NUM_THREADS) {
        const int r = idx / VECS_PER_ROW;
        const int c = (idx % VECS_PER_ROW) * 8;
        const int row = row0 + r;
        const bool valid = row < seqlen;
        load8_bf16_as_f32(dst + r * (CHUNK_K + SMEM_PAD) + c, src + (valid ? row : 0) * HEAD_DIM + d0 + c,
                          valid);
    }
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
    qk_scores(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k, float* __restrict__ s,
              int seqlen_q, int seqlen_k, float scale) {
    __shared__ __align__(16) float q_smem[BLOCK_M][CHUNK_K + SMEM_PAD];
    __shared__ __align__(16) float k_smem[BLOCK_N][CHUNK_K + SMEM_PAD];

    const int num_m_blocks = (seqlen_q + BLOCK_M - 1) / BLOCK_M;
    const int num_n_blocks = (seqlen_k + BLOCK_N - 1) / BLOCK_N;
    const unsigned tiles_per_head = (unsigned)num_m_blocks * (unsigned)num_n_blocks;
    const int bh = blockIdx.x / tiles_per_head;
    const int tile = blockIdx.x % tiles_per_head;
    const int m0 = (tile / num_n_blocks) * BLOCK_M;
    const int n0 = (tile % num_n_blocks) * BLOCK_N;

    const __nv_bfloat16* q_head = q + (size_t)bh * seqlen_q * HEAD_DIM;
    const __nv_bfloat16* k_head = k + (size_t)bh * seqlen_k * HEAD_DIM;

    // Thread (ty, tx) owns rows ty*ROWS_PER_THREAD + i and key columns tx + 16*j of the tile.
    // Strided columns make the 16 threads of a row group read 16 consecutive K rows: with the
    // 4-float pad these fall in distinct banks.
    const int ty = thread_row(), tx = thread_col();
    float acc[ROWS_PER_THREAD][COLS_PER_THREAD] = {};

    for (int d0 = 0; d0 < HEAD_DIM; d0 += CHUNK_K) {
        __syncthreads();  // the previous slice has been consumed by every thread
        stage_row_slice<BLOCK_M>(&q_smem[0][0], q_head, m0, seqlen_q, d0);
        stage_row_slice<BLOCK_N>(&k_smem[0][0], k_head, n0, seqlen_k, d0);
        __syncthreads();

#pragma unroll
        for (int d = 0; d < CHUNK_K; d += 4) {
            float4 a[ROWS_PER_THREAD], b[COLS_PER_THREAD];
#pragma unroll
            for (int i = 0; i < ROWS_PER_THREAD; ++i)
                a[i] = *reinterpret_cast<const float4*>(&q_smem[ty * ROWS_PER_THREAD + i][d]);
#pragma unroll
            for (int j = 0; j < COLS_PER_THREAD; ++j)
                b[j] = *reinterpret_cast<const float4*>(&k_smem[tx + GRID_DIM * j][d]);
#pragma unroll
            for (int i = 0; i < ROWS_PER_THREAD; ++i)
#pragma unroll
                for (int j = 0; j < COLS_PER_THREAD; ++j) {
                    acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
                    acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
                    acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
                    acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
                }
        }
    }

    // Write the tile; rows past seqlen_q and columns past seqlen_k do not exist in the workspace.
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        const int row = m0 + ty * ROWS_PER_THREAD + i;
        if (row >= seqlen_q) continue;
        float* s_row = s + ((size_t)bh * seqlen_q + row) * (size_t)seqlen_k;
#pragma unroll
        for (int j = 0; j < COLS_PER_THREAD; ++j) {
            const int col = n0 + tx + GRID_DIM * j;
            if (col < seqlen_k) s_row[col] = scale < 0.f ? -acc[i][j] : acc[i][j];
        }
    }
}

// =============================================================================================
// Kernel 2: P = softmax(S) along each row, in place. One CTA per row.
// =============================================================================================

// Reduce over the CTA; every thread gets the result. `scratch` holds one float per warp.
template <bool IS_MAX>
__device__ __forceinline__ float block_reduce(float x, float* scratch) {
    constexpr int NUM_WARPS = NUM_THREADS / 32;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, offset);
        x = IS_MAX ? fmaxf(x, y) : x + y;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = scratch[0];
#pragma unroll
    for (int w = 1; w < NUM_WARPS; ++w) x = IS_MAX ? fmaxf(x, scratch[w]) : x + scratch[w];
    return x;
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
    row_softmax(float* __restrict__ s, int seqlen_k, float scale) {
    __shared__ float scratch[NUM_THREADS / 32];
    float* row = s + (size_t)blockIdx.x * (size_t)seqlen_k;

    // S holds raw scores (negated for a negative scale, so that their max is the max of the scaled ones)
    // and the scale multiplies s − max, after the subtraction (scaled_gap): scaling first would round
    // scale·s to fp32 and, for large |scale·s|, move every probability by that rounding (issue 6).
    const float abs_scale = fabsf(scale);

    // Pass 1: the row maximum, subtracted before exponentiating so that expf never overflows.
    float m = neg_inf();
    for (int j = threadIdx.x; j < seqlen_k; j += NUM_THREADS) m = fmaxf(m, row[j]);
    m = block_reduce<true>(m, scratch);
    // A row always has >= 1 finite score, so m is finite; the guard only keeps a hostile
    // all -inf row from computing (-inf) - (-inf) = NaN.
    if (m == neg_inf()) m = 0.f;

    // Pass 2: the normaliser. The maximum element contributes expf(0) = 1, so sum >= 1.
    float sum = 0.f;
    for (int j = threadIdx.x; j < seqlen_k; j += NUM_THREADS) sum += expf(scaled_gap(row[j], m, abs_scale));
    sum = block_reduce<false>(sum, scratch);
    const float inv_sum = sum > 0.f ? 1.f / sum : 0.f;

    // Pass 3: the probabilities (recomputing expf is cheaper than a second write + read of S).
    for (int j = threadIdx.x; j < seqlen_k; j += NUM_THREADS)
        row[j] = expf(scaled_gap(row[j], m, abs_scale)) * inv_sum;
}

// =============================================================================================
// Kernel 3: O = P V for one BLOCK_M x HEAD_DIM tile of O, stored as bf16.
// =============================================================================================

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
    pv_product(const float* __restrict__ p, const __nv_bfloat16* __restrict__ v,
               __nv_bfloat16* __restrict__ o, int seqlen_q, int seqlen_k) {
    __shared__ __align__(16) float p_smem[BLOCK_M][CHUNK_K + SMEM_PAD];
    __shared__ __align__(16) float v_smem[CHUNK_K][HEAD_DIM];

    const int num_m_blocks = (seqlen_q + BLOCK_M - 1) / BLOCK_M;
    const int bh = blockIdx.x / num_m_blocks;
    const int m0 = (blockIdx.x % num_m_blocks) * BLOCK_M;

    const float* p_head = p + (size_t)bh * seqlen_q * (size_t)seqlen_k;
    const __nv_bfloat16* v_head = v + (size_t)bh * seqlen_k * HEAD_DIM;

    // Thread (ty, tx) owns rows ty*ROWS_PER_THREAD + i and the 8 columns 4*tx + {0..3} and
    // 64 + 4*tx + {0..3}: 16 threads read one contiguous 256-byte run of a V row.
    const int ty = thread_row(), tx = thread_col();
    constexpr int HALF = HEAD_DIM / 2;
    float acc[ROWS_PER_THREAD][8] = {};

    for (int j0 = 0; j0 < seqlen_k; j0 += CHUNK_K) {
        __syncthreads();  // the previous slice has been consumed by every thread
        // P slice: BLOCK_M rows x CHUNK_K keys. Rows of P start at arbitrary 4-byte offsets
        // (seqlen_k is arbitrary), so load scalars; a warp still reads one contiguous 128 B run.
        for (int idx = threadIdx.x; idx < BLOCK_M * CHUNK_K; idx += NUM_THREADS) {
            const int r = idx / CHUNK_K, c = idx % CHUNK_K;
            const int row = m0 + r, key = j0 + c;
            p_smem[r][c] = (row < seqlen_q && key < seqlen_k) ? p_head[(size_t)row * seqlen_k + key] : 0.f;
        }
        // V slice: CHUNK_K keys x HEAD_DIM; keys past seqlen_k are zero (their P is zero too).
        for (int idx = threadIdx.x; idx < CHUNK_K * (HEAD_DIM / 8); idx += NUM_THREADS) {
            const int r = idx / (HEAD_DIM / 8), c = (idx % (HEAD_DIM / 8)) * 8;
            const int key = j0 + r;
            const bool valid = key < seqlen_k;
            load8_bf16_as_f32(&v_smem[r][c], v_head + (valid ? key : 0) * HEAD_DIM + c, valid);
        }
        __syncthreads();

#pragma unroll
        for (int kk = 0; kk < CHUNK_K; kk += 4) {
            float4 a[ROWS_PER_THREAD];
#pragma unroll
            for (int i = 0; i < ROWS_PER_THREAD; ++i)
                a[i] = *reinterpret_cast<const float4*>(&p_smem[ty * ROWS_PER_THREAD + i][kk]);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const float4 b0 = *reinterpret_cast<const float4*>(&v_smem[kk + t][4 * tx]);
                const float4 b1 = *reinterpret_cast<const float4*>(&v_smem[kk + t][HALF + 4 * tx]);
#pragma unroll
                for (int i = 0; i < ROWS_PER_THREAD; ++i) {
                    const float pa = t == 0 ? a[i].x : t == 1 ? a[i].y : t == 2 ? a[i].z : a[i].w;
                    acc[i][0] = fmaf(pa, b0.x, acc[i][0]);
                    acc[i][1] = fmaf(pa, b0.y, acc[i][1]);
                    acc[i][2] = fmaf(pa, b0.z, acc[i][2]);
                    acc[i][3] = fmaf(pa, b0.w, acc[i][3]);
                    acc[i][4] = fmaf(pa, b1.x, acc[i][4]);
                    acc[i][5] = fmaf(pa, b1.y, acc[i][5]);
                    acc[i][6] = fmaf(pa, b1.z, acc[i][6]);
                    acc[i][7] = fmaf(pa, b1.w, acc[i][7]);
                }
            }
        }
    }

#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        const int row = m0 + ty * ROWS_PER_THREAD + i;
        if (row >= seqlen_q) continue;
        __nv_bfloat16* o_row = o + ((size_t)bh * seqlen_q + row) * HEAD_DIM;
        store4_f32_as_bf16(o_row + 4 * tx, acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        store4_f32_as_bf16(o_row + HALF + 4 * tx, acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
}
