// Rung 2 — tensor cores: mma.sync m16n8k16 fed by ldmatrix, P kept in registers.
//
// The idea: the two matrix products of attention (S = Q·Kᵀ and O += P·V) move from CUDA-core FMAs to
// the warp-level tensor-core instruction mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// (PTX ISA, "Warp-level matrix multiply-accumulate instructions", mma.m16n8k16 fragment layouts), with
// operands loaded from shared memory by ldmatrix (PTX ISA, "ldmatrix"; .trans for V).
//
// Work split (FlashAttention-2, Dao 2023, Sec. 3.3): each of the 4 warps owns 32 rows of Q (two m16
// tiles) and sweeps all of K/V, so the softmax statistics of a row never leave the 4 threads (a "quad")
// that hold it — no shared-memory exchange between warps. Two m16 tiles per warp mean every K or V
// fragment a warp loads with ldmatrix feeds two mma.sync instead of one: half the shared-memory reads
// per FLOP of a 16-row split. The S accumulator of Q·Kᵀ, converted to bf16, is already laid out as the
// A operand of P·V (see pack_p_fragment), so P never touches shared memory. Q is not kept in
// registers (64 more per thread beside 128 of O and 64 of S would not fit in 255): its A fragments
// are re-read from shared memory at every k-step, 2 ldmatrix against 4 for the K fragments they meet.
// 128 threads x <= 255 registers and < 113 KB of shared memory let 2 CTAs share an SM.
//
// Online softmax as in rung 1: running max m and running sum l per row, O rescaled by
// exp(scale·(m_old − m_new)) per tile, normalised once at the end. A negative scale is
// handled by negating Q once, so the max is always taken on raw scores.
//
// Loads are deliberately plain here: synchronous 16-byte vector loads, __syncthreads, and a padded
// shared-memory row (HEAD_DIM + 8 bf16) so the 8 row addresses of an ldmatrix hit 8 different
// 16-byte bank groups. Rung 3 makes the loads asynchronous and replaces the padding by a swizzle.

#include <cuda_bf16.h>
#include <math_constants.h>

#include "abi.cuh"
#include "mma_sync.cuh"

constexpr int NUM_WARPS = NUM_THREADS / 32;
constexpr int M_TILES = 2;                    // m16 tiles of Q per warp
constexpr int WARP_ROWS = 16 * M_TILES;       // rows of Q per warp (32)
constexpr int SMEM_STRIDE = HEAD_DIM + 8;     // bf16 per padded shared-memory row (272 bytes)
constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte chunks in one 128-column row
constexpr int D_STEPS = HEAD_DIM / 16;        // k16 steps of Q·Kᵀ (over head_dim)
constexpr int S_TILES = BLOCK_N / 8;          // n8 tiles of S per warp
constexpr int KV_STEPS = BLOCK_N / 16;        // k16 steps of P·V (over keys)
constexpr int O_TILES = HEAD_DIM / 8;         // n8 tiles of O per warp

static_assert(HEAD_DIM == 128, "this kernel is written for head_dim 128");
static_assert(BLOCK_M == NUM_WARPS * WARP_ROWS, "each warp owns 32 rows of Q");
static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of the mma K (16)");
static_assert((BLOCK_M * CHUNKS_PER_ROW) % NUM_THREADS == 0, "Q tile must split evenly over threads");
static_assert((BLOCK_N * CHUNKS_PER_ROW) % NUM_THREADS == 0, "K/V tiles must split evenly over threads");
static_assert(SMEM_BYTES == 2 * (BLOCK_M + 2 * BLOCK_N) * SMEM_STRIDE,
              "dynamic smem: the padded Q, K and V tiles (rungs.py smem_layout)");

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: 128 bf16 per row plus 8 bf16 of padding
// ---------------------------------------------------------------------------------------------

// Element offset of (row, col) in a padded tile. A row is 272 bytes = 68 four-byte banks ≡ 4 (mod 32),
// so the 8 rows of one ldmatrix 8x8 matrix start 4 banks apart and their 16-byte pieces cover all 32
// banks: one wavefront per matrix, no conflict. (Without the padding all 8 rows would start at bank 0.)
__device__ __forceinline__ int smem_offset(int row, int col) { return row * SMEM_STRIDE + col; }

// ---------------------------------------------------------------------------------------------
// Global -> shared tile copies (synchronous)
// ---------------------------------------------------------------------------------------------

// A ROWS x 128 bf16 tile, row-major in global memory, into padded shared memory. Rows at or past
// valid_rows are written as zeros and never read from global memory.
template <int ROWS>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int valid_rows, int tid) {
    constexpr int PER_THREAD = ROWS * CHUNKS_PER_ROW / NUM_THREADS;
    uint4 chunk[PER_THREAD];
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {  // all loads first: PER_THREAD requests in flight
        const int c = tid + i * NUM_THREADS;
        const int row = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        chunk[i] = row < valid_rows ? *reinterpret_cast<const uint4*>(src + row * HEAD_DIM + col)
                                    : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
        const int c = tid + i * NUM_THREADS;
        const int row = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        *reinterpret_cast<uint4*>(dst + smem_offset(row, col)) = chunk[i];
    }
}

// Flip the sign of every element this thread's load_tile wrote (same chunk mapping), so no barrier
// is needed between the copy and the flip. Flipping bf16 sign bits is exact.
template <int ROWS>
__device__ __forceinline__ void negate_tile(bf16* tile, int tid) {
    constexpr int PER_THREAD = ROWS * CHUNKS_PER_ROW / NUM_THREADS;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
        const int c = tid + i * NUM_THREADS;
        const int row = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        uint4* chunk = reinterpret_cast<uint4*>(tile + smem_offset(row, col));
        chunk->x ^= 0x80008000u, chunk->y ^= 0x80008000u, chunk->z ^= 0x80008000u, chunk->w ^= 0x80008000u;
    }
}

// ---------------------------------------------------------------------------------------------
// Fragment helpers. Notation (PTX ISA mma.m16n8k16): lane = 4*g + t, g = groupID (0..7),
// t = threadID_in_group (0..3).
//   A (16x16): a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B (16x8):  b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8..2t+9, n g)
//   C (16x8):  c0,c1 = (g, 2t..2t+1)   c2,c3 = (g+8, 2t..2t+1)
// ---------------------------------------------------------------------------------------------

// Shared-memory address this lane hands to ldmatrix_x4 so that the four matrices are the four
// 8x8 quarters of the 16x16 block at (row0, col0) in A-fragment order: [rows 0-7 | rows 8-15] x
// [cols 0-7 | cols 8-15] -> a0, a1, a2, a3. With .trans on a row-major V block (rows = keys,
// cols = head dims) the same addresses give B fragments of two n8 tiles: r0, r1 = (b0, b1) of
// columns col0..col0+7 and r2, r3 = (b0, b1) of columns col0+8..col0+15.
//
// The padded layout is linear, so the address is (lane part) + (block part); written that way, the
// lane part is one register per tile and the block part a compile-time immediate of the ldmatrix
// (as a single expression ptxas kept one register per block, 80 of them live across the loop).
__device__ __forceinline__ uint32_t a_layout_addr(const bf16* tile, int row0, int col0, int lane) {
    return smem_addr(tile + smem_offset(lane & 15, (lane >> 4) * 8)) + 2 * smem_offset(row0, col0);
}

// Address for ldmatrix_x4 (no .trans) on a row-major K block: matrices are [keys n0..n0+7, dims
// k0..k0+7], [keys n0..n0+7, dims k0+8..], [keys n0+8.., dims k0..], [keys n0+8.., dims k0+8..], i.e.
// r0, r1 = (b0, b1) of the n8 tile of keys n0.. and r2, r3 = (b0, b1) of the tile of keys n0+8..
__device__ __forceinline__ uint32_t b_layout_addr(const bf16* tile, int row0, int col0, int lane) {
    const int row = (lane & 7) + ((lane >> 4) << 3), col = ((lane >> 3) & 1) * 8;
    return smem_addr(tile + smem_offset(row, col)) + 2 * smem_offset(row0, col0);
}

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------

// 2 CTAs per SM: caps registers at 65536 / (2 x NUM_THREADS) (255 for 128 threads).
extern "C" __global__ void __launch_bounds__(NUM_THREADS, 2)
    attn_fwd(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
             bf16* __restrict__ o, int seqlen_q, int seqlen_k, int num_m_blocks, float scale) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* s_q = reinterpret_cast<bf16*>(smem_raw);  // BLOCK_M x SMEM_STRIDE
    bf16* s_k = s_q + BLOCK_M * SMEM_STRIDE;        // BLOCK_N x SMEM_STRIDE
    bf16* s_v = s_k + BLOCK_N * SMEM_STRIDE;        // BLOCK_N x SMEM_STRIDE

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x / num_m_blocks;
    const int m_start = (blockIdx.x % num_m_blocks) * BLOCK_M;
    const bf16* k_head = k + bh * seqlen_k * HEAD_DIM;
    const bf16* v_head = v + bh * seqlen_k * HEAD_DIM;

    // Q: global -> shared, once; the warps read their A fragments from there at every k-step. The
    // barrier at the top of the first tile publishes it.
    load_tile<BLOCK_M>(s_q, q + (bh * seqlen_q + m_start) * HEAD_DIM, seqlen_q - m_start, tid);

    // A negative scale: softmax(scale·S) = softmax(|scale|·(−S)), so negate Q once (flip the bf16 sign
    // bits of the shared tile, exact) and the max of the raw scores below is the max of the scaled
    // ones. A zero scale (uniform P) becomes the smallest normal float: the same P, but −inf · scale
    // stays −inf for masked keys and for the first tile's max instead of turning into NaN.
    if (scale < 0.f) negate_tile<BLOCK_M>(s_q, tid);
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
    float row_max[M_TILES][2], row_sum[M_TILES][2];  // sums: this thread's partials, quad-summed at the end
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        row_max[mt][0] = row_max[mt][1] = NEG_INF;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }

    const int kv_limit = seqlen_k - 2 * t;  // the mask below, with this lane's column offset folded in
    for (int nb = 0; nb * BLOCK_N < seqlen_k; ++nb) {  // (not nb < num_n_blocks: one register less)
        const int n_start = nb * BLOCK_N;
        __syncthreads();  // every warp is done reading the previous K/V tile
        load_tile<BLOCK_N>(s_k, k_head + n_start * HEAD_DIM, seqlen_k - n_start, tid);
        load_tile<BLOCK_N>(s_v, v_head + n_start * HEAD_DIM, seqlen_k - n_start, tid);
        __syncthreads();

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
            for (int mt = 0; mt < M_TILES; ++mt) {
                ldmatrix_x4(q_frag[mt], a_layout_addr(s_q, warp * WARP_ROWS + mt * 16, d * 16, lane));
            }
#pragma unroll
            for (int j = 0; j < S_TILES; j += 2) {
                uint32_t kb[4];
                ldmatrix_x4(kb, b_layout_addr(s_k, j * 8, d * 16, lane));
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

        // ---- online softmax: new running max, rescale factor, P = exp(scale·(S − m)) ----
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) {
                tile_max[0] = fmaxf(tile_max[0], fmaxf(s[mt][j][0], s[mt][j][1]));
                tile_max[1] = fmaxf(tile_max[1], fmaxf(s[mt][j][2], s[mt][j][3]));
            }
            float alpha[2], m_use[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float m_new = fmaxf(row_max[mt][r], quad_max(tile_max[r]));
                // A row with no valid key so far keeps max −inf; subtract 0 instead so that no
                // (−inf) − (−inf) = NaN appears. Its scores are all −inf, so its P is 0 either way.
                m_use[r] = m_new == NEG_INF ? 0.f : m_new;
                alpha[r] = expf((row_max[mt][r] - m_use[r]) * scale);  // first tile: exp(−inf) = 0
                row_max[mt][r] = m_new;
                row_sum[mt][r] *= alpha[r];
            }
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[mt][j][e] = expf((s[mt][j][e] - m_use[e >> 1]) * scale);
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
#pragma unroll
        for (int kv = 0; kv < KV_STEPS; ++kv) {
            uint32_t p_frag[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
                pack_p_fragment(p_frag[mt], s[mt][2 * kv], s[mt][2 * kv + 1]);
#pragma unroll
            for (int j = 0; j < O_TILES; j += 2) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, a_layout_addr(s_v, kv * 16, j * 8, lane));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_m16n8k16(o_acc[mt][j], p_frag[mt], vb[0], vb[1]);
                    mma_m16n8k16(o_acc[mt][j + 1], p_frag[mt], vb[2], vb[3]);
                }
            }
        }
    }

    // ---- epilogue: O / l, bf16, rows past seqlen_q not written ----
    const int bh_out = ctaid_x_again() / num_m_blocks;  // not bh: no register across the loop
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = quad_sum(row_sum[mt][r]);
            const float inv_l = l > 0.f ? 1.f / l : 0.f;
            const int row = m_start + warp * WARP_ROWS + mt * 16 + g + 8 * r;
            if (row < seqlen_q) {
                bf16* dst = o + (bh_out * seqlen_q + row) * HEAD_DIM + 2 * t;
#pragma unroll
                for (int j = 0; j < O_TILES; ++j) {
                    *reinterpret_cast<uint32_t*>(dst + j * 8) =
                        pack_bf16x2(o_acc[mt][j][2 * r] * inv_l, o_acc[mt][j][2 * r + 1] * inv_l);
                }
            }
        }
    }
}
