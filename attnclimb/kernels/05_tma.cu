// Rung 5 — TMA: whole tiles fetched by the Tensor Memory Accelerator, completion on mbarriers.
//
// The idea (over rung 4): stop spending 128 threads' instructions on data movement. In rung 4 every
// thread computes addresses, bounds checks and a swizzled destination for 16 cp.async of 16 bytes per
// K/V tile and the whole CTA waits on cp.async groups + __syncthreads. On Hopper one thread can hand a
// whole box to the TMA unit with cp.async.bulk.tensor: the tensor map (built once on the host, see
// docs/kernel-abi.md) holds the shape, strides and swizzle, the unit generates the addresses, zero-fills
// rows past seqlen (the tensor map's third dimension is the head, so nothing is read from the next head)
// and writes the box 128-byte swizzled. Completion is counted in bytes on an mbarrier
// (arrive.expect_tx, then complete_tx by the copy); consumers wait on the barrier's phase parity.
// The swizzle is now the hardware's: a 128-column row is two 64-column panels (a 128-B swizzled box is
// at most 128 B wide), each panel rows of 128 B in 1024-B atoms of 8 rows, with 16-B chunk c of row r
// at chunk c ^ (r % 8) — the same XOR as rung 4's, but inside 128-B panel rows instead of 256-B rows,
// so only the ldmatrix address arithmetic changes.
// Sources: PTX ISA "cp.async.bulk.tensor", "Tensor Copy" / "Tensor-map" (swizzle modes), "mbarrier";
// CUDA C++ Programming Guide, "Tensor Memory Access"; FlashAttention-3 (Shah et al., 2024) Sec. 3.1.
//
// Unchanged from rung 4: mma.sync.m16n8k16 fed by ldmatrix (.trans for V); 4 warps x 32 rows of Q (two
// m16 tiles per warp, Q's fragments re-read from shared memory per k-step), 2 CTAs per SM; P re-packed
// from the S accumulators in registers; exp2 softmax with scale*log2(e) folded into one
// FFMA; a NUM_STAGES-deep K/V ring (now: thread 0 refills, everybody waits on mbarriers, and a
// __syncthreads() per tile still guards slot reuse).
//
// Shared memory (1024-B aligned): [ Q: 2 panels x BLOCK_M x 128 B ][ K stages ][ V stages ], each K or V
// stage 2 panels x BLOCK_N x 128 B.

#include <cuda_bf16.h>
#include <math_constants.h>

#include "abi.cuh"
#include "hopper.cuh"
#include "mma_sync.cuh"
#include "softmax.cuh"
#include "trace.cuh"

#ifndef NUM_STAGES
#error "NUM_STAGES must be defined by the host (see attnclimb/rungs.py)"
#endif
#if !defined(Q_BOX_ROWS) || !defined(KV_BOX_ROWS)
#error "Q_BOX_ROWS and KV_BOX_ROWS must be defined by the host (see attnclimb/rungs.py)"
#endif

constexpr int NUM_WARPS = NUM_THREADS / 32;
constexpr int M_TILES = 2;                          // m16 tiles of Q per warp
constexpr int WARP_ROWS = 16 * M_TILES;             // rows of Q per warp (32)
constexpr uint32_t ROW_BYTES = 128;                 // one row of a 64-column bf16 panel
constexpr uint32_t Q_PANEL = BLOCK_M * ROW_BYTES;   // bytes of one 64-column panel of the Q tile
constexpr uint32_t KV_PANEL = BLOCK_N * ROW_BYTES;  // ... of a K or V tile
constexpr uint32_t KV_TILE_BYTES = 2 * KV_PANEL;    // a K (or V) tile: two panels
constexpr int D_STEPS = HEAD_DIM / 16;              // k16 steps of Q·Kᵀ (over head_dim)
constexpr int S_TILES = BLOCK_N / 8;                // n8 tiles of S per warp
constexpr int KV_STEPS = BLOCK_N / 16;              // k16 steps of P·V (over keys)
constexpr int O_TILES = HEAD_DIM / 8;               // n8 tiles of O per warp

static_assert(HEAD_DIM == 128, "this kernel is written for head_dim 128 (16 chunks of 16 bytes a row)");
static_assert(NUM_STAGES >= 2, "at least one tile in flight while another is computed on");
static_assert(BLOCK_M % Q_BOX_ROWS == 0 && BLOCK_N % KV_BOX_ROWS == 0, "tiles are whole TMA boxes");
static_assert(Q_BOX_ROWS % 8 == 0 && KV_BOX_ROWS % 8 == 0, "boxes must be whole 1024-B swizzle atoms");
static_assert(BLOCK_M == NUM_WARPS * WARP_ROWS, "each warp owns 32 rows of Q");
static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of the mma K (16)");
static_assert(SMEM_BYTES == 1024 + 2 * Q_PANEL + NUM_STAGES * 2 * KV_TILE_BYTES,
              "dynamic smem: 1 KB alignment slack, Q and NUM_STAGES (K, V) tiles (rungs.py smem_layout)");

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: two 64-column panels, TMA 128-byte swizzle
// ---------------------------------------------------------------------------------------------

// Byte offset of (row, col), col < 64, inside one 64-column panel as the TMA 128-B swizzle writes it:
// 128-B rows; 16-B chunk (col / 8) of row r lives at chunk (col / 8) ^ (r % 8) (the XOR is of shared
// address bits [4,7) with bits [7,10), hence the 1024-B alignment of every panel). As in rung 4, the 8
// rows of an ldmatrix 8x8 matrix (same chunk, 8 consecutive rows) land in 8 different chunks of the
// 1024-B atom: 32 different banks, one wavefront.
__device__ __forceinline__ uint32_t smem_offset(int row, int col) {
    return row * ROW_BYTES + ((((col >> 3) & 7) ^ (row & 7)) << 4) + ((col & 7) << 1);
}

// ---------------------------------------------------------------------------------------------
// Global -> shared tile copies (TMA, one thread)
// ---------------------------------------------------------------------------------------------

// Flip the sign of every element of a `bytes`-long tile (any layout: every bf16 of it is data), 16 bytes
// per thread and step. Callers order it after the tile's mbarrier wait and before readers with a
// __syncthreads. Flipping bf16 sign bits is exact.
__device__ __forceinline__ void negate_tile(unsigned char* tile, uint32_t bytes, int tid) {
    for (uint32_t i = tid; i < bytes / 16; i += NUM_THREADS) {
        uint4* chunk = reinterpret_cast<uint4*>(tile) + i;
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

// ldmatrix row addresses. a-layout: the lane's row address such that the four matrices are the four
// 8x8 quarters of a 16x16 block in A-fragment order: [rows 0-7 | rows 8-15] x [cols 0-7 | cols 8-15]
// -> a0, a1, a2, a3. With .trans on a row-major V block (rows = keys, cols = head dims) the same
// addresses give B fragments of two n8 tiles: r0, r1 = (b0, b1) of columns col0..col0+7 and
// r2, r3 = (b0, b1) of columns col0+8..col0+15.
// b-layout (no .trans) on a row-major K block: matrices are [keys n0..n0+7, dims k0..k0+7],
// [keys n0..n0+7, dims k0+8..], [keys n0+8.., dims k0..], [keys n0+8.., dims k0+8..], i.e.
// r0, r1 = (b0, b1) of the n8 tile of keys n0.. and r2, r3 = (b0, b1) of the tile of keys n0+8..
//
// With the swizzle an address is no longer linear in (row0, col0); precomputing one address per
// block would take dozens of registers. Instead: every block starts on a multiple of 8 rows, so a
// lane's swizzle key (row % 8) is fixed, and for a column col0 that is a multiple of 16 the lane's
// chunk inside its panel is ((col0 % 64) / 8) XOR (lane's own chunk in block (0, 0)), (col0 % 64) / 8
// being even. In bytes, with every panel 1024-byte aligned:
//     addr(row0, col0) = (base XOR 2·(col0 % 64)) + (col0 / 64)·panel + 128·row0
// with base = the lane's address in block (0, 0) (2·(col0 % 64) only touches bits 5-6, which the
// panel address and 128·row0 leave alone). One register per tile, one LOP3 per distinct col0 % 64,
// the rest an immediate of the ldmatrix.
__device__ __forceinline__ uint32_t a_lane_base(uint32_t tile, int lane) {
    return tile + smem_offset(lane & 15, (lane >> 4) * 8);
}

__device__ __forceinline__ uint32_t b_lane_base(uint32_t tile, int lane) {
    return tile + smem_offset((lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 8);
}

// Address of the lane's row of the 16x16 block at (row0, col0) of a tile whose 64-column panels are
// `panel` bytes apart; row0 a multiple of 8, col0 of 16 (compile-time constants in every call).
__device__ __forceinline__ uint32_t block_addr(uint32_t base, uint32_t panel, int row0, int col0) {
    return (base ^ (2 * (col0 % 64))) + (col0 / 64) * panel + row0 * ROW_BYTES;
}

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------

// 2 CTAs per SM: caps registers at 65536 / (2 x NUM_THREADS) (255 for 128 threads).
extern "C" __global__ void __launch_bounds__(NUM_THREADS, 2)
    attn_fwd(const __grid_constant__ TmaDesc tmap_q, const __grid_constant__ TmaDesc tmap_k,
             const __grid_constant__ TmaDesc tmap_v, bf16* __restrict__ o, int seqlen_q, int seqlen_k,
             int num_m_blocks, float scale) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* s_q = hop::align_1024(smem_raw);         // 2 panels x BLOCK_M rows
    unsigned char* s_k = s_q + 2 * Q_PANEL;                 // NUM_STAGES K tiles
    unsigned char* s_v = s_k + NUM_STAGES * KV_TILE_BYTES;  // NUM_STAGES V tiles
    __shared__ __align__(8) uint64_t bar_q;
    __shared__ __align__(8) uint64_t bar_k[NUM_STAGES];  // K tile of the stage has landed
    __shared__ __align__(8) uint64_t bar_v[NUM_STAGES];  // V tile of the stage has landed

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    TRACE_INIT();
    const int bh = blockIdx.x / num_m_blocks;
    const int m_start = (blockIdx.x % num_m_blocks) * BLOCK_M;

    const int num_n_blocks = (seqlen_k + BLOCK_N - 1) / BLOCK_N;
    const int kv_limit = seqlen_k - 2 * t;  // the mask below, with this lane's column offset folded in

    // Thread 0 copies K/V tile nb into ring slot nb % NUM_STAGES; K and V complete on separate
    // barriers so S = Q·Kᵀ can start before V has landed.
    auto load_kv = [&](int nb) {
        const int slot = nb % NUM_STAGES;
        TRACE_BEGIN(TMA_KV);
        hop::mbar_arrive_expect_tx(&bar_k[slot], KV_TILE_BYTES);
        hop::tma_load_tile(s_k + slot * KV_TILE_BYTES, &tmap_k, &bar_k[slot], BLOCK_N, KV_BOX_ROWS,
                           nb * BLOCK_N, bh);
        hop::mbar_arrive_expect_tx(&bar_v[slot], KV_TILE_BYTES);
        hop::tma_load_tile(s_v + slot * KV_TILE_BYTES, &tmap_v, &bar_v[slot], BLOCK_N, KV_BOX_ROWS,
                           nb * BLOCK_N, bh);
        TRACE_END(TMA_KV);
    };

    // Prologue: barriers (one arrival each: thread 0's arrive.expect_tx), then Q and K/V tiles
    // 0 .. NUM_STAGES-2.
    if (tid == 0) {
        hop::tma_prefetch_desc(&tmap_q);
        hop::tma_prefetch_desc(&tmap_k);
        hop::tma_prefetch_desc(&tmap_v);
        hop::mbar_init(&bar_q, 1);
        for (int st = 0; st < NUM_STAGES; ++st) {
            hop::mbar_init(&bar_k[st], 1);
            hop::mbar_init(&bar_v[st], 1);
        }
        hop::fence_barrier_init();
    }
    __syncthreads();
    if (tid == 0) {
        TRACE_BEGIN(TMA_Q);
        hop::mbar_arrive_expect_tx(&bar_q, 2 * Q_PANEL);
        hop::tma_load_tile(s_q, &tmap_q, &bar_q, BLOCK_M, Q_BOX_ROWS, m_start, bh);
        TRACE_END(TMA_Q);
        for (int nb = 0; nb < NUM_STAGES - 1 && nb < num_n_blocks; ++nb) load_kv(nb);
    }
    __syncwarp();

    // Q stays in shared memory; the warps read their A fragments from there at every k-step.
    TRACE_BEGIN(WAIT_Q);
    hop::mbar_wait(&bar_q, 0);
    TRACE_END(WAIT_Q);
    const uint32_t q_base =
        a_lane_base(smem_addr(s_q) + warp * WARP_ROWS * ROW_BYTES, lane);  // warp's 32 rows

    // A negative scale: softmax(scale·S) = softmax(|scale|·(−S)), so negate Q once (flip the bf16 sign
    // bits of the shared tile, exact; the first tile's __syncthreads orders it before any ldmatrix) and
    // the max of the raw scores below is the max of the scaled ones. A zero scale (uniform P) becomes
    // the smallest normal float: the same P, but −inf · scale stays −inf for masked keys instead of turning
    // into NaN (the same P unless raw scores exceed ~1e37: softmax.cuh, Limits).
    if (scale < 0.f) negate_tile(s_q, 2 * Q_PANEL, tid);
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

    hop::PipelineState<NUM_STAGES> ring;               // the phase parity of tile nb's slot
    for (int nb = 0; nb * BLOCK_N < seqlen_k; ++nb) {  // (not nb < num_n_blocks: one register less)
        const int n_start = nb * BLOCK_N;
        const int slot = nb % NUM_STAGES;
        // The barrier guarantees every warp has finished computing on tile nb-1, whose slot the
        // prefetch below overwrites (ldmatrix reads are complete once the warp has their registers).
        // Those reads are generic-proxy accesses and the TMA write is an async-proxy one: the barrier
        // orders them within the generic proxy only, so thread 0 also issues a proxy fence between
        // the two (PTX ISA "Memory Consistency Model: Proxies", fence.proxy.async).
        TRACE_BEGIN(WAIT_CTA);
        __syncthreads();
        TRACE_END(WAIT_CTA);
        if (tid == 0 && (nb + NUM_STAGES - 1) * BLOCK_N < seqlen_k) {
            hop::fence_proxy_async();
            load_kv(nb + NUM_STAGES - 1);
        }
        __syncwarp();
        const uint32_t k_base = b_lane_base(smem_addr(s_k + slot * KV_TILE_BYTES), lane);
        const uint32_t v_base = a_lane_base(smem_addr(s_v + slot * KV_TILE_BYTES), lane);

        // ---- S = Q·Kᵀ (32 x BLOCK_N per warp), fp32 in registers ----
        // Per k-step: the warp's two Q A fragments, then each K fragment feeds both m16 tiles.
        float s[M_TILES][S_TILES][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
        }
        TRACE_BEGIN(WAIT_K);
        hop::mbar_wait(&bar_k[slot], ring.phase);
        TRACE_END(WAIT_K);
        TRACE_BEGIN(S);
#pragma unroll
        for (int d = 0; d < D_STEPS; ++d) {
            uint32_t q_frag[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
                ldmatrix_x4(q_frag[mt], block_addr(q_base, Q_PANEL, mt * 16, d * 16));
#pragma unroll
            for (int j = 0; j < S_TILES; j += 2) {
                uint32_t kb[4];
                ldmatrix_x4(kb, block_addr(k_base, KV_PANEL, j * 8, d * 16));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_m16n8k16(s[mt][j], q_frag[mt], kb[0], kb[1]);
                    mma_m16n8k16(s[mt][j + 1], q_frag[mt], kb[2], kb[3]);
                }
            }
        }

        TRACE_END(S);

        // ---- keys past seqlen_k (only in the last tile): probability 0 ----
        TRACE_BEGIN(SOFTMAX);
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
        TRACE_END(SOFTMAX);
        TRACE_BEGIN(WAIT_V);
        hop::mbar_wait(&bar_v[slot], ring.phase);
        TRACE_END(WAIT_V);
        TRACE_BEGIN(PV);
#pragma unroll
        for (int j = 0; j < O_TILES; j += 2) {
#pragma unroll
            for (int kv = 0; kv < KV_STEPS; ++kv) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, block_addr(v_base, KV_PANEL, kv * 16, j * 8));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_m16n8k16(o_acc[mt][j], p_frag[mt][kv], vb[0], vb[1]);
                    mma_m16n8k16(o_acc[mt][j + 1], p_frag[mt][kv], vb[2], vb[3]);
                }
            }
        }
        TRACE_END(PV);
        ring.advance(slot);  // the next use of each slot is its next phase
    }

    // ---- epilogue: O / l, bf16, rows past seqlen_q not written ----
    TRACE_BEGIN(EPILOGUE);
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
    TRACE_END(EPILOGUE);
}
