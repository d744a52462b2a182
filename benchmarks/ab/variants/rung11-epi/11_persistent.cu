// A/B VARIANT, not a rung (sixteenth session; benchmarks/ab/variants/README.md): rung 11 with rung 19's epilogue
// through shared memory (stmatrix into a BLOCK_M x HEAD_DIM staging tile, whole 16-byte chunks out). With the
// ping-pong turns removed (make_variants.nopp) it is issue 13's item 3, "persistent grid + epilogue through shared
// memory", on rung 9's kernel: the first step of a ladder whose turns would come right after it.
// Rung 11 — a persistent grid: one CTA per SM walks over many (m-block, head) tiles.
//
// The idea (over rung 10): rung 10 launches one CTA per 128-row tile of Q, and every CTA pays its own
// start (barrier init, Q load, the first K tile's latency with empty tensor cores) and end (the last
// P·V and the epilogue with nothing to overlap them). With few K/V tiles per CTA (seqlen_k 1k: 8 tiles;
// the Wan text cross-attention, 512 keys: 4) that is a large share of the CTA's time. Here the host
// launches min(#tiles, #SMs) CTAs and each walks tiles blockIdx.x, blockIdx.x + gridDim.x, ...: the
// producer keeps the K/V ring running straight into the next tile, and loads the next tile's Q as soon
// as both consumer warpgroups have finished their last S = Q·Kᵀ of the current one (a new mbarrier,
// q_empty), so that Q, the first K/V tiles and the consumers' last P·V and epilogue overlap.
// The ring's slots and phases and the ping-pong turns simply continue across tiles; consecutive CTAs
// still take consecutive m-blocks of one head, which keeps that head's K/V in L2.
// Sources: FlashAttention-3 (Shah et al., 2024) Sec. 3.1 (persistent kernel whose epilogue of one tile
// overlaps the loads of the next); CUDA C++ Programming Guide, "persistent threads" style grid-stride loop.
//
//   producer:      Q0 K0 V0 K1 V1 ... K7 V7 │ Q1 (after q_empty) K0' V0' K1' ...
//   consumers:     ·· tile 0 ···························S7 ─► last P·V, epilogue │ tile 1 (Q1, K0' ready)
//
// Everything else (ping-pong turns, intra-warpgroup overlap, K/V ring) is rung 10's.

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
// A/B variant (sixteenth session): O staged in shared memory for the stores, as in rung 19.
constexpr uint32_t O_ROW_BYTES = HEAD_DIM * sizeof(bf16);  // one row of O in the staging tile
constexpr int O_CHUNKS = O_ROW_BYTES / 16;                 // its 16-byte chunks: 16
constexpr uint32_t O_STAGE_BYTES = BLOCK_M * O_ROW_BYTES;
static_assert(SMEM_BYTES == 1024 + 2 * Q_PANEL + NUM_STAGES * 2 * KV_TILE_BYTES + O_STAGE_BYTES,
              "dynamic smem: 1 KB alignment slack, Q, NUM_STAGES (K, V) tiles and the O staging tile "
              "(smem_layout tma_ring_staged_o)");
static_assert(O_TILES % 2 == 0 && 32 % O_CHUNKS == 0, "whole stmatrix.x4 and whole rows");

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
             int num_m_blocks, float scale, int num_tiles) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* s_q = hop::align_1024(smem_raw);         // 2 panels x BLOCK_M rows
    unsigned char* s_k = s_q + 2 * Q_PANEL;                 // NUM_STAGES K tiles
    unsigned char* s_v = s_k + NUM_STAGES * KV_TILE_BYTES;  // NUM_STAGES V tiles
    unsigned char* s_o = s_v + NUM_STAGES * KV_TILE_BYTES;  // O staging: BLOCK_M rows
    __shared__ __align__(8) uint64_t bar_q;
    __shared__ __align__(8) uint64_t bar_q_empty;              // every consumer warp is done with Q
    __shared__ __align__(8) uint64_t bar_k[NUM_STAGES];        // K tile of the stage has landed
    __shared__ __align__(8) uint64_t bar_v[NUM_STAGES];        // V tile of the stage has landed
    __shared__ __align__(8) uint64_t bar_k_empty[NUM_STAGES];  // every consumer warp is done with K
    __shared__ __align__(8) uint64_t bar_v_empty[NUM_STAGES];  // every consumer warp is done with V
    __shared__ float wait_anchor[CONSUMER_WARPS * 32];         // scratch of hop::keep_above_wait

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    [[maybe_unused]] const int g = lane / 4, t = lane % 4;
    TRACE_INIT();

    const int num_n_blocks = (seqlen_k + BLOCK_N - 1) / BLOCK_N;

    // Thread 0 copies the K (or V) tile nb of head bh into ring slot `slot`, completing on `full`.
    auto load_k = [&](int nb, int slot, int bh) {
        TRACE_BEGIN(TMA_K);
        hop::mbar_arrive_expect_tx(&bar_k[slot], KV_TILE_BYTES);
        hop::tma_load_tile(s_k + slot * KV_TILE_BYTES, &tmap_k, &bar_k[slot], BLOCK_N, KV_BOX_ROWS,
                           nb * BLOCK_N, bh);
        TRACE_END(TMA_K);
    };
    auto load_v = [&](int nb, int slot, int bh) {
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
        hop::mbar_init(&bar_q_empty, CONSUMER_WARPS);
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
            hop::PipelineState<NUM_STAGES> ring;  // the phase parity of K/V load number `kv` 's slot
            int kv = 0;                           // K/V tiles loaded so far, over all of this CTA's tiles
            for (int work = blockIdx.x, it = 0; work < num_tiles; work += gridDim.x, ++it) {
                const int bh = work / num_m_blocks, m_start = (work % num_m_blocks) * BLOCK_M;
                // The Q buffer is free once every consumer warp's last S of the previous work tile is done.
                TRACE_BEGIN(WAIT_Q_EMPTY);
                if (it > 0) hop::mbar_wait(&bar_q_empty, (it - 1) & 1);
                TRACE_END(WAIT_Q_EMPTY);
                TRACE_BEGIN(TMA_Q);
                hop::mbar_arrive_expect_tx(&bar_q, 2 * Q_PANEL);
                hop::tma_load_tile(s_q, &tmap_q, &bar_q, BLOCK_M, Q_BOX_ROWS, m_start, bh);
                TRACE_END(TMA_Q);
                for (int nb = 0; nb < num_n_blocks; ++nb, ++kv) {
                    const int slot = kv % NUM_STAGES;
                    // Load kv reuses the slot of load kv − NUM_STAGES: wait until every consumer warp has
                    // released that one (it completed the empty barrier's previous phase:
                    // ring.prev_phase()). K comes back a whole softmax + P·V earlier than V.
                    TRACE_BEGIN(WAIT_K_EMPTY);
                    if (kv >= NUM_STAGES) hop::mbar_wait(&bar_k_empty[slot], ring.prev_phase());
                    TRACE_END(WAIT_K_EMPTY);
                    load_k(nb, slot, bh);
                    TRACE_BEGIN(WAIT_V_EMPTY);
                    if (kv >= NUM_STAGES) hop::mbar_wait(&bar_v_empty[slot], ring.prev_phase());
                    TRACE_END(WAIT_V_EMPTY);
                    load_v(nb, slot, bh);
                    ring.advance(slot);  // the next use of each slot is its next phase
                }
            }
        }
        return;  // the other producer threads have nothing to do
    }

    // ---------------- consumers ----------------
    hop::setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = warp - PRODUCER_WARPS;  // consumer warp: rows 16·cw .. 16·cw + 15 of the Q tile

    // Q stays in shared memory: the wgmmas read it from there, every tile. Consumer warpgroup cw/4
    // issues them for its 64 rows.
    const int wg = cw / 4;  // consumer warpgroup 0 or 1
    const uint32_t q_rows = smem_addr(s_q) + wg * WARPGROUP_ROWS * ROW_BYTES;

    // Ping-pong: named barrier 1 + w is warpgroup w's turn to issue wgmmas. Both warpgroups take part in
    // each (256 threads): w waits on its own (bar.sync), the other one arrives on it (bar.arrive) once it
    // has issued its own wgmmas. Warpgroup 1 lets warpgroup 0 go first.
    const uint32_t my_turn = 1 + wg, other_turn = 2 - wg;
    constexpr uint32_t TURN_THREADS = 2 * 128;
    if (wg == 1) hop::named_bar_arrive(1, TURN_THREADS);

    // A negative scale: softmax(scale·S) = softmax(|scale|·(−S)), so the S wgmmas negate Q on the fly
    // (imm-scale-a = −1, exact) and the max of the raw scores below is the max of the scaled ones. A zero
    // scale (uniform P) becomes the smallest normal float: the same P, but −inf · scale stays −inf for
    // masked keys instead of turning into NaN
    // (the same P unless raw scores exceed ~1e37: softmax.cuh, Limits).
    const bool negate = scale < 0.f;
    scale = fmaxf(fabsf(scale), CUDART_TWO_TO_M126_F);  // FLT_MIN

    // This thread's rows are g and g + 8 of the warp's 16: index 0 and 1 below. (Set per work tile.)
    float o_acc[O_TILES][4];
    float row_max[2];  // raw scores; finite: see softmax.cuh
    float row_err[2];  // e = max·c − R of each row (softmax.cuh)
    float row_sum[2];  // this thread's partial sums; summed over the quad at the end
    const float scale_log2 = scale * CUDART_L2E_F;  // exp(scale·x) = 2^(scale_log2·x)
    float s[S_TILES][4];  // S, then P, of the current tile (overwritten by each tile's first wgmma)
#pragma unroll
    for (int j = 0; j < S_TILES; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;

    // Tile nb's masking and online softmax, in place on s (S -> P, fp32); alpha: the rescale factor of O.
    auto softmax_tile = [&](int n_start, float (&alpha)[2]) {
        // ---- keys past seqlen_k (only in the last tile): probability 0 ----
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
        // R = the row's fp32 reference, P = 2^(s·c − R); alpha = 2^(R_old − R_new), exactly 1 when the
        // max did not change. See softmax.cuh for why P, l and alpha must share R, and for huge |max·c|.
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
    };
    auto issue_qk = [&](int slot) {
        const uint32_t s_kt = smem_addr(s_k + slot * KV_TILE_BYTES);
        hop::reg_fence(s);
        if (negate)  // warp-uniform: a kernel argument
            gemm_qk_async<-1, BLOCK_N>(s, q_rows, Q_PANEL, s_kt, KV_PANEL);
        else
            gemm_qk_async<1, BLOCK_N>(s, q_rows, Q_PANEL, s_kt, KV_PANEL);
    };

    uint32_t p_frag[KV_STEPS][4];         // P of the previous tile, the A operand of its P·V (in flight)
    hop::PipelineState<NUM_STAGES> ring;  // the phase parity of K/V tile number `kv` 's slot
    int kv = 0;                           // K/V tiles consumed so far, over all of this CTA's work tiles

    for (int work = blockIdx.x, it = 0; work < num_tiles; work += gridDim.x, ++it) {
        const int bh = work / num_m_blocks, m_start = (work % num_m_blocks) * BLOCK_M;
#pragma unroll
        for (int j = 0; j < O_TILES; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.f;
        row_max[0] = row_max[1] = smx::ROW_MAX_INIT;
        row_err[0] = row_err[1] = row_sum[0] = row_sum[1] = 0.f;
        TRACE_BEGIN(WAIT_Q);
        hop::mbar_wait(&bar_q, it & 1);  // this work tile's Q has landed
        TRACE_END(WAIT_Q);

        // Tile 0 (peeled, so that the loop below has one shape of wgmma groups for ptxas to track): S, its
        // softmax, P into p_frag. O is still 0: no rescale.
        int slot = kv % NUM_STAGES;
        {
            TRACE_BEGIN(WAIT_K);
            hop::mbar_wait(&bar_k[slot], ring.phase);
            TRACE_END(WAIT_K);
            TRACE_BEGIN(WAIT_TURN);
            hop::named_bar_sync(my_turn, TURN_THREADS);
            TRACE_END(WAIT_TURN);
            TRACE_BEGIN(S);
            issue_qk(slot);
            hop::named_bar_arrive(other_turn, TURN_THREADS);
            hop::wgmma_wait<0>();
            hop::reg_fence(s);                                    // no read of S above the wgmma wait
            if (lane == 0) hop::mbar_arrive(&bar_k_empty[slot]);  // this warp's wgmmas no longer read K_0
            TRACE_END(S);
            TRACE_BEGIN(SOFTMAX);
            float alpha[2];
            softmax_tile(0, alpha);
#pragma unroll
            for (int ks = 0; ks < KV_STEPS; ++ks) pack_p_fragment(p_frag[ks], s[2 * ks], s[2 * ks + 1]);
            TRACE_END(SOFTMAX);
        }
        int pv_slot = slot;  // ring slot and phase parity of the previous tile's V
        uint32_t pv_phase = ring.phase;
        ring.advance(slot);
        ++kv;

        // Each iteration issues S_nb = Q·K_nbᵀ and then O += P_{nb-1}·V_{nb-1} as two wgmma groups, waits for
        // the first only, and runs tile nb's softmax while the tensor cores still work on P·V; then it waits
        // for P·V, rescales O and packs P_nb for the next iteration (FlashAttention-3 Sec. 3.2).
        for (int nb = 1; nb < num_n_blocks; ++nb, ++kv) {
            slot = kv % NUM_STAGES;
            TRACE_BEGIN(WAIT_K);
            hop::mbar_wait(&bar_k[slot], ring.phase);
            TRACE_END(WAIT_K);
            TRACE_BEGIN(WAIT_TURN);
            hop::named_bar_sync(my_turn, TURN_THREADS);
            TRACE_END(WAIT_TURN);
            TRACE_BEGIN(S);
            issue_qk(slot);
            TRACE_END(S);
            TRACE_BEGIN(WAIT_V);
            hop::mbar_wait(&bar_v[pv_slot], pv_phase);
            TRACE_END(WAIT_V);
            TRACE_BEGIN(S);
            hop::reg_fence(p_frag);
            hop::reg_fence(o_acc);  // the rescale before happens before the wgmmas, not during them
            gemm_pv_async<BLOCK_N>(o_acc, p_frag, smem_addr(s_v + pv_slot * KV_TILE_BYTES), KV_PANEL);
            hop::named_bar_arrive(other_turn, TURN_THREADS);
            hop::wgmma_wait<1>();                                 // the older group, S, is complete
            hop::reg_fence(s);                                    // no read of S above the wgmma wait
            if (lane == 0) hop::mbar_arrive(&bar_k_empty[slot]);  // this warp's wgmmas no longer read K_nb
            TRACE_END(S);

            TRACE_BEGIN(SOFTMAX);
            float alpha[2];
            softmax_tile(nb * BLOCK_N, alpha);  // while P_{nb-1}·V_{nb-1} runs on the tensor cores
            TRACE_END(SOFTMAX);
            // The softmax stays here, under P·V, rather than after the wait below (see hop::keep_above_wait).
            hop::keep_above_wait(smem_addr(&wait_anchor[tid - PRODUCER_WARPS * 32]), row_sum[0] + row_sum[1]);

            // ---- the previous tile's P·V is done: release its V, rescale O, P of this tile replaces it ----
            TRACE_BEGIN(PV);
            hop::wgmma_wait<0>();
            hop::reg_fence(o_acc);
            hop::reg_fence(p_frag);
            if (lane == 0) hop::mbar_arrive(&bar_v_empty[pv_slot]);  // this warp's wgmmas no longer read V
            TRACE_END(PV);
            TRACE_BEGIN(SOFTMAX);
#pragma unroll
            for (int j = 0; j < O_TILES; ++j) {
                o_acc[j][0] *= alpha[0];
                o_acc[j][1] *= alpha[0];
                o_acc[j][2] *= alpha[1];
                o_acc[j][3] *= alpha[1];
            }
#pragma unroll
            for (int ks = 0; ks < KV_STEPS; ++ks) pack_p_fragment(p_frag[ks], s[2 * ks], s[2 * ks + 1]);
            TRACE_END(SOFTMAX);
            pv_slot = slot;
            pv_phase = ring.phase;
            ring.advance(slot);  // the next use of each slot is its next phase
        }
        // Every S of this work tile is complete: the producer may load the next work tile's Q now, under
        // the last P·V and the epilogue below.
        if (lane == 0) hop::mbar_arrive(&bar_q_empty);

        // ---- the last tile's O += P·V ----
        TRACE_BEGIN(WAIT_V);
        hop::mbar_wait(&bar_v[pv_slot], pv_phase);
        TRACE_END(WAIT_V);
        TRACE_BEGIN(WAIT_TURN);
        hop::named_bar_sync(my_turn, TURN_THREADS);
        TRACE_END(WAIT_TURN);
        TRACE_BEGIN(PV);
        hop::reg_fence(p_frag);
        hop::reg_fence(o_acc);
        gemm_pv_async<BLOCK_N>(o_acc, p_frag, smem_addr(s_v + pv_slot * KV_TILE_BYTES), KV_PANEL);
        // Warpgroup 1's very last turn has no arrival: warpgroup 0 waits for no further turn.
        if (wg == 0 || work + gridDim.x < num_tiles) hop::named_bar_arrive(other_turn, TURN_THREADS);
        hop::wgmma_wait<0>();
        hop::reg_fence(o_acc);
        if (lane == 0) hop::mbar_arrive(&bar_v_empty[pv_slot]);
        TRACE_END(PV);

        // ---- epilogue: O / l, bf16, rows past seqlen_q not written; staged in shared memory (rung 19's) ----
        TRACE_BEGIN(EPILOGUE);
        float inv_l[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = quad_sum(row_sum[r]);
            inv_l[r] = l > 0.f ? 1.f / l : 0.f;
        }
        unsigned char* o_rows = s_o + cw * WARP_ROWS * O_ROW_BYTES;  // this warp's staging rows
        __syncwarp();  // every lane has read the previous work tile's rows back (their last reader)
        {
            const int r = (lane & 7) + (lane & 8);
            const uint32_t row_addr = smem_addr(o_rows) + r * O_ROW_BYTES;
#pragma unroll
            for (int j = 0; j < O_TILES; j += 2) {
                const int c = j + (lane >> 4);
                hop::stmatrix_x4(row_addr + ((c ^ (r & 7)) << 4),
                                 pack_bf16x2(o_acc[j][0] * inv_l[0], o_acc[j][1] * inv_l[0]),
                                 pack_bf16x2(o_acc[j][2] * inv_l[1], o_acc[j][3] * inv_l[1]),
                                 pack_bf16x2(o_acc[j + 1][0] * inv_l[0], o_acc[j + 1][1] * inv_l[0]),
                                 pack_bf16x2(o_acc[j + 1][2] * inv_l[1], o_acc[j + 1][3] * inv_l[1]));
            }
        }
        __syncwarp();  // the warp's rows are in shared memory for every lane
        const bool o_vec = (reinterpret_cast<unsigned long long>(o) & 15) == 0;
#pragma unroll
        for (int pass = 0; pass < WARP_ROWS * O_CHUNKS / 32; ++pass) {
            const int r = pass * (32 / O_CHUNKS) + lane / O_CHUNKS, c = lane % O_CHUNKS;
            const uint4 chunk = *reinterpret_cast<const uint4*>(o_rows + r * O_ROW_BYTES + ((c ^ (r & 7)) << 4));
            const int row = m_start + cw * WARP_ROWS + r;
            if (row < seqlen_q) {
                bf16* dst = o + (bh * seqlen_q + row) * HEAD_DIM + c * 8;
                if (o_vec) {  // a kernel argument: warp-uniform
                    *reinterpret_cast<uint4*>(dst) = chunk;
                } else {
                    uint32_t* dst32 = reinterpret_cast<uint32_t*>(dst);
                    dst32[0] = chunk.x;
                    dst32[1] = chunk.y;
                    dst32[2] = chunk.z;
                    dst32[3] = chunk.w;
                }
            }
        }
        TRACE_END(EPILOGUE);
    }
}
