// Rung 8 — a deeper, finer-grained K/V ring: loads run ahead of the math.
//
// The idea (over rung 7): make the producer/consumer ring deep and fine-grained enough that the
// consumers never wait for a load. K and V of a slot now have separate "empty" barriers: a consumer
// warp releases K as soon as its S = Q·Kᵀ wgmmas have completed, so the producer refills the K half
// of the slot while the softmax and P·V of the same tile are still running, instead of waiting for the
// whole tile. NUM_STAGES (2 or 3) slots, and BLOCK_N = 128 keys per tile: each warpgroup's wgmmas are
// m64n128k16 for both products (twice the work per descriptor pair, per barrier round trip and per
// softmax reduction of rung 7's 64). Q (32 KB) + 2 slots of K and V is 160 KB; 3 slots 224 KB (the most
// that fits in 227 KB); BLOCK_N 176 or 192 fits with 2 slots. NUM_STAGES and BLOCK_N are macros from
// rungs.py so they can be swept on the GPU.
// Sources: FlashAttention-3 (Shah et al., 2024) Sec. 3.1 (circular shared-memory buffer between the
// producer and consumer warpgroups, released per stage) and its 128 x 128 / 128 x 176 tiles for
// head_dim 128; PTX ISA "mbarrier" (phases and parity), "cp.async.bulk.tensor".
//
//   slot s:  full_k[s]  full_v[s]    TMA complete_tx ─► consumers
//            empty_k[s] empty_v[s]   8 consumer-warp arrivals ─► producer
//   producer:  for tile nb: wait empty_k[slot] ─► K_nb │ wait empty_v[slot] ─► V_nb
//   consumers: wait full_k ─► S = Q·Kᵀ ─► arrive empty_k ─► softmax ─► wait full_v ─► O += P·V
//              ─► arrive empty_v
//
// Shared memory (1024-B aligned): [ Q: 2 panels x BLOCK_M x 128 B ][ K stages ][ V stages ], each K or V
// stage 2 panels x BLOCK_N x 128 B.

#include <cuda_bf16.h>
#include <math_constants.h>

#include "abi.cuh"
#include "softmax.cuh"
#include "trace.cuh"
#include "wgmma_attn.cuh"

#ifndef NUM_STAGES
#error "NUM_STAGES must be defined by the host (see attnclimb/rungs.py)"
#endif
#if !defined(Q_BOX_ROWS) || !defined(KV_BOX_ROWS)
#error "Q_BOX_ROWS and KV_BOX_ROWS must be defined by the host (see attnclimb/rungs.py)"
#endif

constexpr int NUM_WARPS = NUM_THREADS / 32;
constexpr int PRODUCER_WARPS = 4;  // warpgroup 0 loads, warpgroups 1.. compute
constexpr int CONSUMER_WARPS = NUM_WARPS - PRODUCER_WARPS;
constexpr int PRODUCER_REGS = 24;  // setmaxnreg targets: 128·24 + 256·240 = 384·168, the CTA's pool
constexpr int CONSUMER_REGS = 240;
constexpr int WARP_ROWS = 16;                       // rows of Q per warp (its part of a wgmma's M = 64)
constexpr int WARPGROUP_ROWS = 64;                  // M of one wgmma: 4 warps x 16 rows
constexpr uint32_t ROW_BYTES = 128;                 // one row of a 64-column bf16 panel
constexpr uint32_t Q_PANEL = BLOCK_M * ROW_BYTES;   // bytes of one 64-column panel of the Q tile
constexpr uint32_t KV_PANEL = BLOCK_N * ROW_BYTES;  // ... of a K or V tile
constexpr uint32_t KV_TILE_BYTES = 2 * KV_PANEL;    // a K (or V) tile: two panels
constexpr int S_TILES = BLOCK_N / 8;                // n8 tiles of S per warp (accumulator groups of 4)
constexpr int KV_STEPS = BLOCK_N / 16;              // k16 steps of P·V (over keys)
constexpr int O_TILES = HEAD_DIM / 8;               // n8 tiles of O per warp (accumulator groups of 4)

static_assert(HEAD_DIM == 128, "this kernel is written for head_dim 128 (16 chunks of 16 bytes a row)");
static_assert(NUM_STAGES >= 2, "at least one tile in flight while another is computed on");
static_assert(BLOCK_M % Q_BOX_ROWS == 0 && BLOCK_N % KV_BOX_ROWS == 0, "tiles are whole TMA boxes");
static_assert(Q_BOX_ROWS % 8 == 0 && KV_BOX_ROWS % 8 == 0, "boxes must be whole 1024-B swizzle atoms");
static_assert(BLOCK_M == CONSUMER_WARPS * WARP_ROWS, "each consumer warp owns 16 rows of Q");
// setmaxnreg moves registers within the CTA's own pool, the launch allocation of 65536 / NUM_THREADS per
// thread rounded down to 8 (168 at 384 threads; ptxas allocates that much, tests/test_build_cpu.py checks):
// a setmaxnreg.inc that the pool cannot serve blocks for ever (PTX ISA "setmaxnreg").
static_assert(PRODUCER_WARPS * 32 * PRODUCER_REGS + CONSUMER_WARPS * 32 * CONSUMER_REGS <=
                  NUM_THREADS * (65536 / NUM_THREADS / 8 * 8),
              "the targets of setmaxnreg fit the CTA's register pool");
static_assert(NUM_THREADS % 128 == 0, "whole warpgroups");
static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of the wgmma K (16)");
static_assert(SMEM_BYTES == 1024 + 2 * Q_PANEL + NUM_STAGES * 2 * KV_TILE_BYTES,
              "dynamic smem: 1 KB alignment slack, Q and NUM_STAGES (K, V) tiles (rungs.py smem_layout)");

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: two 64-column panels, TMA 128-byte swizzle
// ---------------------------------------------------------------------------------------------

// As in rung 5 a tile is two 64-column panels of 128-B rows, 16-B chunk c of row r stored at chunk
// c ^ (r % 8), 1024-B aligned. That is exactly the canonical "128-byte swizzle" layout that wgmma
// reads through a matrix descriptor (see hopper.cuh), so no address arithmetic happens in this file:
// the descriptors below point at 8-row atoms and the tensor cores apply the XOR themselves.

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)  // the register cap setmaxnreg needs
    attn_fwd(const __grid_constant__ TmaDesc tmap_q, const __grid_constant__ TmaDesc tmap_k,
             const __grid_constant__ TmaDesc tmap_v, bf16* __restrict__ o, int seqlen_q, int seqlen_k,
             int num_m_blocks, float scale) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* s_q = hop::align_1024(smem_raw);         // 2 panels x BLOCK_M rows
    unsigned char* s_k = s_q + 2 * Q_PANEL;                 // NUM_STAGES K tiles
    unsigned char* s_v = s_k + NUM_STAGES * KV_TILE_BYTES;  // NUM_STAGES V tiles
    __shared__ __align__(8) uint64_t bar_q;
    __shared__ __align__(8) uint64_t bar_k[NUM_STAGES];        // K tile of the stage has landed
    __shared__ __align__(8) uint64_t bar_v[NUM_STAGES];        // V tile of the stage has landed
    __shared__ __align__(8) uint64_t bar_k_empty[NUM_STAGES];  // every consumer warp is done with K
    __shared__ __align__(8) uint64_t bar_v_empty[NUM_STAGES];  // every consumer warp is done with V

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    TRACE_INIT();
    const int bh = blockIdx.x / num_m_blocks;
    const int m_start = (blockIdx.x % num_m_blocks) * BLOCK_M;

    const int num_n_blocks = (seqlen_k + BLOCK_N - 1) / BLOCK_N;

    // Thread 0 copies the K (or V) tile nb into ring slot nb % NUM_STAGES, completing on `full`.
    auto load_k = [&](int nb) {
        const int slot = nb % NUM_STAGES;
        TRACE_BEGIN(TMA_K);
        hop::mbar_arrive_expect_tx(&bar_k[slot], KV_TILE_BYTES);
        hop::tma_load_tile(s_k + slot * KV_TILE_BYTES, &tmap_k, &bar_k[slot], BLOCK_N, KV_BOX_ROWS,
                           nb * BLOCK_N, bh);
        TRACE_END(TMA_K);
    };
    auto load_v = [&](int nb) {
        const int slot = nb % NUM_STAGES;
        TRACE_BEGIN(TMA_V);
        hop::mbar_arrive_expect_tx(&bar_v[slot], KV_TILE_BYTES);
        hop::tma_load_tile(s_v + slot * KV_TILE_BYTES, &tmap_v, &bar_v[slot], BLOCK_N, KV_BOX_ROWS,
                           nb * BLOCK_N, bh);
        TRACE_END(TMA_V);
    };

    // Barriers: full ones take one arrival (the producer's arrive.expect_tx) plus the bytes; empty ones
    // one arrival per consumer warp.
    if (tid == 0) {
        hop::tma_prefetch_desc(&tmap_q);
        hop::tma_prefetch_desc(&tmap_k);
        hop::tma_prefetch_desc(&tmap_v);
        hop::mbar_init(&bar_q, 1);
        for (int st = 0; st < NUM_STAGES; ++st) {
            hop::mbar_init(&bar_k[st], 1);
            hop::mbar_init(&bar_v[st], 1);
            hop::mbar_init(&bar_k_empty[st], CONSUMER_WARPS);
            hop::mbar_init(&bar_v_empty[st], CONSUMER_WARPS);
        }
        hop::fence_barrier_init();
    }
    __syncthreads();  // the last CTA-wide barrier: from here on the roles meet only at mbarriers

    if (warp < PRODUCER_WARPS) {
        // ---------------- producer ----------------
        hop::setmaxnreg_dec<PRODUCER_REGS>();  // executed by all 4 warps of the warpgroup
        if (tid == 0) {
            TRACE_BEGIN(TMA_Q);
            hop::mbar_arrive_expect_tx(&bar_q, 2 * Q_PANEL);
            hop::tma_load_tile(s_q, &tmap_q, &bar_q, BLOCK_M, Q_BOX_ROWS, m_start, bh);
            TRACE_END(TMA_Q);
            hop::PipelineState<NUM_STAGES> ring;  // the phase parity of tile nb's slot
            for (int nb = 0; nb < num_n_blocks; ++nb) {
                const int slot = nb % NUM_STAGES;
                // Tile nb reuses the slot of tile nb − NUM_STAGES: wait until every consumer warp has
                // released that one (it completed the empty barrier's previous phase: ring.prev_phase()).
                // K comes back a whole softmax + P·V earlier than V.
                TRACE_BEGIN(WAIT_K_EMPTY);
                if (nb >= NUM_STAGES) hop::mbar_wait(&bar_k_empty[slot], ring.prev_phase());
                TRACE_END(WAIT_K_EMPTY);
                load_k(nb);
                TRACE_BEGIN(WAIT_V_EMPTY);
                if (nb >= NUM_STAGES) hop::mbar_wait(&bar_v_empty[slot], ring.prev_phase());
                TRACE_END(WAIT_V_EMPTY);
                load_v(nb);
                ring.advance(slot);  // the next use of each slot is its next phase
            }
        }
        return;  // the other producer threads have nothing to do
    }

    // ---------------- consumers ----------------
    hop::setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = warp - PRODUCER_WARPS;  // consumer warp: rows 16·cw .. 16·cw + 15 of the Q tile

    // Q stays in shared memory: the wgmmas read it from there, every tile. Consumer warpgroup cw/4
    // issues them for its 64 rows.
    TRACE_BEGIN(WAIT_Q);
    hop::mbar_wait(&bar_q, 0);
    TRACE_END(WAIT_Q);
    const uint32_t q_rows = smem_addr(s_q) + (cw / 4) * WARPGROUP_ROWS * ROW_BYTES;

    // A negative scale: softmax(scale·S) = softmax(|scale|·(−S)), so the S wgmmas negate Q on the fly
    // (imm-scale-a = −1, exact) and the max of the raw scores below is the max of the scaled ones. A zero
    // scale (uniform P) becomes the smallest normal float: the same P, but −inf · scale stays −inf for
    // masked keys instead of turning into NaN
    // (the same P unless raw scores exceed ~1e37: softmax.cuh, Limits).
    const bool negate = scale < 0.f;
    scale = fmaxf(fabsf(scale), CUDART_TWO_TO_M126_F);  // FLT_MIN

    // This thread's rows are g and g + 8 of the warp's 16: index 0 and 1 below.
    float o_acc[O_TILES][4];
#pragma unroll
    for (int j = 0; j < O_TILES; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.f;
    float row_max[2] = {smx::ROW_MAX_INIT, smx::ROW_MAX_INIT};  // raw scores; finite: see softmax.cuh
    float row_err[2] = {0.f, 0.f};                              // e = max·c − R of each row (softmax.cuh)
    const float scale_log2 = scale * CUDART_L2E_F;              // exp(scale·x) = 2^(scale_log2·x)
    float row_sum[2] = {0.f, 0.f};  // this thread's partial sums; summed over the quad at the end
    float s[S_TILES][4];            // S, then P, of the current tile (overwritten by each tile's first wgmma)
#pragma unroll
    for (int j = 0; j < S_TILES; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;

    hop::PipelineState<NUM_STAGES> ring;  // the phase parity of tile nb's slot
    for (int nb = 0; nb < num_n_blocks; ++nb) {
        const int n_start = nb * BLOCK_N;
        const int slot = nb % NUM_STAGES;
        const uint32_t s_kt = smem_addr(s_k + slot * KV_TILE_BYTES);
        const uint32_t s_vt = smem_addr(s_v + slot * KV_TILE_BYTES);

        // ---- S = Q·Kᵀ (64 x BLOCK_N per warpgroup), fp32 in registers ----
        TRACE_BEGIN(WAIT_K);
        hop::mbar_wait(&bar_k[slot], ring.phase);
        TRACE_END(WAIT_K);
        TRACE_BEGIN(S);
        hop::reg_fence(s);
        if (negate)  // warp-uniform: a kernel argument
            gemm_qk<-1, BLOCK_N>(s, q_rows, Q_PANEL, s_kt, KV_PANEL);
        else
            gemm_qk<1, BLOCK_N>(s, q_rows, Q_PANEL, s_kt, KV_PANEL);
        hop::reg_fence(s);                                    // no read of S above the wgmma wait
        if (lane == 0) hop::mbar_arrive(&bar_k_empty[slot]);  // this warp's wgmmas no longer read K_nb
        TRACE_END(S);

        // ---- keys past seqlen_k (only in the last tile): probability 0 ----
        TRACE_BEGIN(SOFTMAX);
        if (n_start + BLOCK_N > seqlen_k) {
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (n_start + j * 8 + 2 * t + (e & 1) >= seqlen_k) s[j][e] = NEG_INF;
                }
            }
        }

        // ---- online softmax: new running max, rescale factor, P = 2^(S·c − R), c = scale·log2 e ----
        float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
            tile_max[0] = fmaxf(tile_max[0], fmaxf(s[j][0], s[j][1]));
            tile_max[1] = fmaxf(tile_max[1], fmaxf(s[j][2], s[j][3]));
        }
        // R = the row's fp32 reference, P = 2^(s·c − R); alpha = 2^(R_old − R_new), exactly 1 when the max
        // did not change. See softmax.cuh for why P, l and alpha must share R, and for rows of huge |max·c|.
        float alpha[2];
        smx::RowRescale rs[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float m_new = fmaxf(row_max[r], quad_max(tile_max[r]));
            rs[r] = smx::online_rescale(row_max[r], row_err[r], m_new, scale_log2);
            row_err[r] = rs[r].err;
            alpha[r] = rs[r].alpha;
            row_max[r] = m_new;
            row_sum[r] *= alpha[r];
        }
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[j][e] =
                    smx::fast_exp2(fmaf(s[j][e], rs[e >> 1].mul, rs[e >> 1].neg_ref));  // FFMA + MUFU.EX2
                row_sum[e >> 1] += s[j][e];
            }
        }
#pragma unroll
        for (int j = 0; j < O_TILES; ++j) {
            o_acc[j][0] *= alpha[0];
            o_acc[j][1] *= alpha[0];
            o_acc[j][2] *= alpha[1];
            o_acc[j][3] *= alpha[1];
        }

        // ---- O += P·V: P re-packed in registers as A fragments, V read by the tensor cores ----
        uint32_t p_frag[KV_STEPS][4];
#pragma unroll
        for (int kv = 0; kv < KV_STEPS; ++kv) pack_p_fragment(p_frag[kv], s[2 * kv], s[2 * kv + 1]);
        TRACE_END(SOFTMAX);
        TRACE_BEGIN(WAIT_V);
        hop::mbar_wait(&bar_v[slot], ring.phase);
        TRACE_END(WAIT_V);
        TRACE_BEGIN(PV);
        hop::reg_fence(p_frag);
        hop::reg_fence(o_acc);  // the rescale above happens before the wgmmas, not during them
        gemm_pv<BLOCK_N>(o_acc, p_frag, s_vt, KV_PANEL);
        hop::reg_fence(o_acc);
        TRACE_END(PV);
        if (lane == 0) hop::mbar_arrive(&bar_v_empty[slot]);  // ... nor V_nb
        ring.advance(slot);                                   // the next use of each slot is its next phase
    }

    // ---- epilogue: O / l, bf16, rows past seqlen_q not written ----
    TRACE_BEGIN(EPILOGUE);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float l = quad_sum(row_sum[r]);
        const float inv_l = l > 0.f ? 1.f / l : 0.f;
        const int row = m_start + cw * WARP_ROWS + g + 8 * r;
        if (row < seqlen_q) {
            bf16* dst = o + (bh * seqlen_q + row) * HEAD_DIM + 2 * t;
#pragma unroll
            for (int j = 0; j < O_TILES; ++j) {
                *reinterpret_cast<uint32_t*>(dst + j * 8) =
                    pack_bf16x2(o_acc[j][2 * r] * inv_l, o_acc[j][2 * r + 1] * inv_l);
            }
        }
    }
    TRACE_END(EPILOGUE);
}
