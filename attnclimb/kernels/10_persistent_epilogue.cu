// Rung 10 — a persistent grid with the epilogue through shared memory: one CTA per SM walks over many
// (m-block, head) work tiles, and each warp stores its rows of O as whole 128-byte lines.
//
// The idea (over rung 9; FlashAttention-3's item "persistent kernel + epilogue", issue 13's item 3):
// rung 9 launches one CTA per 128-row tile of Q, and every CTA pays its own start (barrier init, Q load,
// the first K tile's latency with idle tensor cores) and end (the last P·V and the epilogue with nothing
// to overlap them); with few K/V tiles per CTA (1k keys: 8; the Wan text cross-attention, 512 keys: 4)
// that is a large share of its time. Here the host launches min(#tiles, #SMs) CTAs and each walks tiles
// blockIdx.x, blockIdx.x + gridDim.x, ...: the producer keeps the K/V ring running straight into the next
// tile and loads the next tile's Q as soon as both consumer warpgroups have completed their last S = Q·Kᵀ of
// the current one (mbarrier q_empty), so Q, the first K/V tiles, the last P·V and the epilogue overlap.
// Consecutive CTAs take consecutive m-blocks of one head, which keeps that head's K/V in L2.
// The epilogue: rung 9 writes O straight from the wgmma accumulators, one bf16 pair (4 bytes) per store,
// so a warp's store touches 8 lines and half-fills each sector. Here the accumulator's n8 tiles, packed in
// pairs, are stmatrix's 8 × 8 fragments (PTX ISA "stmatrix"): HEAD_DIM / 16 stmatrix.x4 per thread put the
// warp's 16 rows into its own staging rows (16-byte chunks XOR-swizzled by row: no bank conflicts on either
// side), a __syncwarp, then each lane reads 16-byte chunks back and stores them, every store whole lines.
// No warp waits for another, and the staging tile costs BLOCK_M × HEAD_DIM × 2 bytes (32 KB at head_dim
// 128; head_dim 256 has no room for it and keeps 4-byte stores: SMEM_EPILOGUE 0). Where O's address or
// strides are not 16-byte multiples (a caller's buffer), the rows go out in 4-byte stores.
// This rung also has the compile-time features (rungs.py): causal masking (longest-first tile order,
// by head pairs when K/V outgrow L2), GQA, the LSE, strided (BSHD) views, fp16, head_dim 64 and 256.
// Sources: FlashAttention-3 (Shah et al., 2024) Sec. 3.1 (a persistent kernel whose epilogue of one tile
// overlaps the loads of the next; O staged in shared memory before the store: the idea only); PTX ISA
// "stmatrix"; CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory".
//
//   producer:   Q0 K0 V0 K1 V1 ... K7 V7 │ Q1 (after q_empty) K0' V0' K1' ...
//   consumers:  ·· tile 0 ············· S7 ─► last P·V, O → smem → lines │ tile 1 (Q1, K0' ready)
//
// Everything else (producer and K/V ring, the intra-warpgroup overlap of softmax and P·V) is rung 9's.

#include <cuda_bf16.h>
#include <math_constants.h>

#ifndef FP16
#define FP16 0
#endif
#if FP16  // fp16 operands for both wgmmas (hopper.cuh; read before it is included)
#define HOP_WGMMA_AB ".f16.f16"
#endif

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

// Compile-time variants of the top rung (issue 8; attnclimb/rungs.py `features`, docs/kernel-abi.md). All
// 0 is the plain kernel, whose machine code these switches leave unchanged.
//   CAUSAL     query row i sees keys 0..i (torch's is_causal=True, top-left aligned, any seqlen_q, seqlen_k):
//              a work tile loads only the K/V tiles up to its last row, only tiles that cross the diagonal
//              are masked, and the work tiles of a head are walked from the longest (last m-block) down.
//   GQA        K/V have heads_q / kv_group heads: query head h reads K/V head h / kv_group (no copies).
//   WRITE_LSE  also write the natural-log log-sum-exp of each row's scaled scores to lse (fp32, B·H·Sq).
//   HEAD_DIM   64, 128 (the plain kernel) or 256: PANELS 64-column panels per row of Q, K, V; the P·V wgmma
//              is m64n{HEAD_DIM}k16 (tile sizes per head_dim in the rung's `head_dims`, attnclimb/rungs.py).
//   STRIDED    Q, K, V through 4-D tensor maps over their own strides (batch, heads, seqlen, 128) and O
//              written through o_stride_*: BSHD views and fused-QKV slices are read and written in place.
//   FP16       Q, K, V and O are fp16 (else bf16): the wgmmas take .f16 operands, P is rounded to fp16, and
//              a row whose P would leave fp16's range (|max·c| >= 2^24) stores it scaled by a power of two
//              on a warp-uniform slow path (softmax.cuh, "fp16 P").
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef GQA
#define GQA 0
#endif
#ifndef WRITE_LSE
#define WRITE_LSE 0
#endif
#ifndef STRIDED
#define STRIDED 0
#endif
#if FP16
typedef f16 elem;  // the element type of Q, K, V, O and P
#else
typedef bf16 elem;
#endif
#ifndef CAUSAL_L2_BYTES
// causal tile order: head by head (in pairs) when K and V of all heads exceed this, else a snake
#define CAUSAL_L2_BYTES (32ll << 20)
#endif

constexpr int NUM_WARPS = NUM_THREADS / 32;
constexpr int PRODUCER_WARPS = 4;  // warpgroup 0 loads, warpgroups 1.. compute
constexpr int CONSUMER_WARPS = NUM_WARPS - PRODUCER_WARPS;
// setmaxnreg targets: 128·24 + 256·240 = 384·168, the CTA's pool. The causal, grouped-query, strided
// variant's producer (tile order, K/V head and 4-D coordinates) spills at 24: 40 + 232 there. (The plain
// values come last: attnclimb/figures/facts.py reads the constexpr lines and keeps the last of a name.)
#if CAUSAL && GQA && STRIDED
constexpr int PRODUCER_REGS = 40;
constexpr int CONSUMER_REGS = 232;
#else
constexpr int PRODUCER_REGS = 24;
constexpr int CONSUMER_REGS = 240;
#endif
constexpr int WARP_ROWS = 16;                          // rows of Q per warp (its part of a wgmma's M = 64)
constexpr int WARPGROUP_ROWS = 64;                     // M of one wgmma: 4 warps x 16 rows
constexpr uint32_t ROW_BYTES = 128;                    // one row of a 64-column bf16 panel
constexpr uint32_t Q_PANEL = BLOCK_M * ROW_BYTES;      // bytes of one 64-column panel of the Q tile
constexpr uint32_t KV_PANEL = BLOCK_N * ROW_BYTES;     // ... of a K or V tile
constexpr int PANELS = HEAD_DIM / 64;                  // 64-column panels of a row: 1, 2 or 4
constexpr uint32_t KV_TILE_BYTES = PANELS * KV_PANEL;  // a K (or V) tile
constexpr int S_TILES = BLOCK_N / 8;                   // n8 tiles of S per warp (accumulator groups of 4)
constexpr int KV_STEPS = BLOCK_N / 16;                 // k16 steps of P·V (over keys)
constexpr int O_TILES = HEAD_DIM / 8;                  // n8 tiles of O per warp (accumulator groups of 4)

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256,
              "head_dim 64, 128 or 256 (whole 64-column panels)");
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
// O staged in shared memory for the stores (this rung's idea) where the staging tile fits: head_dim <= 128.
#define SMEM_EPILOGUE (HEAD_DIM <= 128)
constexpr uint32_t O_ROW_BYTES = HEAD_DIM * sizeof(elem);  // one row of O in the staging tile
constexpr int O_CHUNKS = O_ROW_BYTES / 16;                 // its 16-byte chunks: 8 (head_dim 64) or 16 (128)
constexpr uint32_t O_STAGE_BYTES = SMEM_EPILOGUE ? BLOCK_M * O_ROW_BYTES : 0;
static_assert(
    SMEM_BYTES == 1024 + PANELS * Q_PANEL + NUM_STAGES * 2 * KV_TILE_BYTES + O_STAGE_BYTES,
    "dynamic smem: 1 KB alignment slack, Q, NUM_STAGES (K, V) tiles and the O staging tile (rungs.py "
    "smem_layout)");
static_assert(!SMEM_EPILOGUE || (O_TILES % 2 == 0 && 32 % O_CHUNKS == 0), "whole stmatrix.x4 and whole rows");
// The row copies unrolled (all loads before the stores).
[[maybe_unused]] constexpr int O_COPY_UNROLL = WARP_ROWS * O_CHUNKS / 32;

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: two 64-column panels, TMA 128-byte swizzle
// ---------------------------------------------------------------------------------------------

// As in rung 5 a tile is two 64-column panels of 128-B rows, 16-B chunk c of row r stored at chunk
// c ^ (r % 8), 1024-B aligned. That is exactly the canonical "128-byte swizzle" layout that wgmma
// reads through a matrix descriptor (see hopper.cuh), so no address arithmetic happens in this file:
// the descriptors below point at 8-row atoms and the tensor cores apply the XOR themselves.

#if FP16
// A finite x clamped to fp16's finite range (±65504); inf and NaN pass (they come from inf or NaN inputs).
__device__ __forceinline__ float clamp_f16(float x) {
    return fabsf(x) < CUDART_INF_F ? fminf(fmaxf(x, -65504.f), 65504.f) : x;
}
#endif

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)  // the register cap setmaxnreg needs
    attn_fwd(const __grid_constant__ TmaDesc tmap_q, const __grid_constant__ TmaDesc tmap_k,
             const __grid_constant__ TmaDesc tmap_v, elem* __restrict__ o, int seqlen_q, int seqlen_k,
             int num_m_blocks, float scale, int num_tiles, int heads_q, int kv_group, float* __restrict__ lse,
             long long o_stride_b, long long o_stride_h, long long o_stride_s) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* s_q = hop::align_1024(smem_raw);         // 2 panels x BLOCK_M rows
    unsigned char* s_k = s_q + PANELS * Q_PANEL;            // NUM_STAGES K tiles
    unsigned char* s_v = s_k + NUM_STAGES * KV_TILE_BYTES;  // NUM_STAGES V tiles
#if SMEM_EPILOGUE
    unsigned char* s_o = s_v + NUM_STAGES * KV_TILE_BYTES;  // O staging: BLOCK_M rows
#endif
    __shared__ __align__(8) uint64_t bar_q;
    __shared__ __align__(8) uint64_t bar_q_empty;              // every consumer warp is done with Q
    __shared__ __align__(8) uint64_t bar_k[NUM_STAGES];        // K tile of the stage has landed
    __shared__ __align__(8) uint64_t bar_v[NUM_STAGES];        // V tile of the stage has landed
    __shared__ __align__(8) uint64_t bar_k_empty[NUM_STAGES];  // every consumer warp is done with K
    __shared__ __align__(8) uint64_t bar_v_empty[NUM_STAGES];  // every consumer warp is done with V
    __shared__ float wait_anchor[CONSUMER_WARPS * 32];         // scratch of hop::keep_above_wait

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    [[maybe_unused]] const int g = lane / 4, t = lane % 4;  // g: causal masks, LSE and head_dim-256 stores
    TRACE_INIT();

    // The k-th work tile of CTA c is tile_of(c + k·gridDim.x); the CTA is done at the first one >= num_tiles.
    // Work tile -> (query head bh, first row m_start, K/V head, K/V tiles to visit).
    struct Work {
        int bh, m_start, bh_kv, num_n;
    };
#if !CAUSAL
    const int num_n_blocks_all = (seqlen_k + BLOCK_N - 1) / BLOCK_N;
    auto tile_of = [&](int work) { return work; };
    auto work_of = [&](int tile) {
        Work w;
        w.bh = tile / num_m_blocks;
        w.m_start = (tile % num_m_blocks) * BLOCK_M;
        w.num_n = num_n_blocks_all;
#else
    // Causal: an m-block's cost grows with its index, and a tile visits only the keys up to its last row.
    // Heads whose K and V (the keys any row reads) fit in L2 together (CAUSAL_L2_BYTES) go in a static
    // longest-first order: the heaviest m-block of every head first, each whole wave of gridDim.x tiles
    // dealt in the opposite direction to the one before (a snake: the CTA given the heaviest tile of one
    // wave gets the lightest of the next). More heads than that go head by head, for L2, each CTA taking
    // two neighbours of the list m-block nmb-1, 0, nmb-2, 1, ... (a heavy one and its light complement:
    // equal pairs, except where an odd nmb makes a pair straddle two heads), when there are enough tiles
    // for every CTA to get a pair.
    const int bh_count = num_tiles / num_m_blocks;
    long long kv_bytes = 2ll * min(seqlen_k, num_m_blocks * BLOCK_M) * HEAD_DIM * sizeof(elem) * bh_count;
#if GQA
    kv_bytes /= kv_group;  // query heads of one group share them
#endif
    const bool by_pairs = kv_bytes > CAUSAL_L2_BYTES && num_tiles >= 2 * (int)gridDim.x;
    auto tile_of = [&](int work) {
        const int wave = work / gridDim.x, c = work % gridDim.x;
        if (by_pairs) return 2 * (c + (wave >> 1) * gridDim.x) + (wave & 1);
        return (wave & 1) && (wave + 1) * gridDim.x <= num_tiles ? wave * gridDim.x + (gridDim.x - 1 - c)
                                                                 : work;
    };
    auto work_of = [&](int tile) {
        Work w;
        int mb;
        if (by_pairs) {
            w.bh = tile / num_m_blocks;
            const int r = tile % num_m_blocks;
            mb = r & 1 ? r >> 1 : num_m_blocks - 1 - (r >> 1);
        } else {
            w.bh = tile % bh_count;
            mb = num_m_blocks - 1 - tile / bh_count;
        }
        w.m_start = mb * BLOCK_M;
        w.num_n = (min(seqlen_k, w.m_start + BLOCK_M) + BLOCK_N - 1) / BLOCK_N;
#endif
        w.bh_kv = w.bh;
#if GQA
        w.bh_kv = (w.bh / heads_q) * (heads_q / kv_group) + (w.bh % heads_q) / kv_group;
#endif
        return w;
    };

    // Thread 0 copies the K (or V) tile nb of head bh into ring slot `slot`, completing on `full`.
    auto load_k = [&](int nb, int slot, int bh) {
        TRACE_BEGIN(TMA_K);
        hop::mbar_arrive_expect_tx(&bar_k[slot], KV_TILE_BYTES);
#if STRIDED  // the 4-D map takes (head, batch); bh = batch·heads_kv + head
        hop::tma_load_tile_4d(s_k + slot * KV_TILE_BYTES, &tmap_k, &bar_k[slot], BLOCK_N, KV_BOX_ROWS,
                              nb * BLOCK_N, bh % (heads_q / kv_group), bh / (heads_q / kv_group), PANELS);
#else
        hop::tma_load_tile(s_k + slot * KV_TILE_BYTES, &tmap_k, &bar_k[slot], BLOCK_N, KV_BOX_ROWS,
                           nb * BLOCK_N, bh, PANELS);
#endif
        TRACE_END(TMA_K);
    };
    auto load_v = [&](int nb, int slot, int bh) {
        TRACE_BEGIN(TMA_V);
        hop::mbar_arrive_expect_tx(&bar_v[slot], KV_TILE_BYTES);
#if STRIDED  // the 4-D map takes (head, batch); bh = batch·heads_kv + head
        hop::tma_load_tile_4d(s_v + slot * KV_TILE_BYTES, &tmap_v, &bar_v[slot], BLOCK_N, KV_BOX_ROWS,
                              nb * BLOCK_N, bh % (heads_q / kv_group), bh / (heads_q / kv_group), PANELS);
#else
        hop::tma_load_tile(s_v + slot * KV_TILE_BYTES, &tmap_v, &bar_v[slot], BLOCK_N, KV_BOX_ROWS,
                           nb * BLOCK_N, bh, PANELS);
#endif
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
            for (int work = blockIdx.x, it = 0; tile_of(work) < num_tiles; work += gridDim.x, ++it) {
                const Work w = work_of(tile_of(work));
                const int bh = w.bh, m_start = w.m_start, bh_kv = w.bh_kv, num_n_blocks = w.num_n;
                // The Q buffer is free once every consumer warp's last S of the previous work tile is done.
                TRACE_BEGIN(WAIT_Q_EMPTY);
                if (it > 0) hop::mbar_wait(&bar_q_empty, (it - 1) & 1);
                TRACE_END(WAIT_Q_EMPTY);
                TRACE_BEGIN(TMA_Q);
                hop::mbar_arrive_expect_tx(&bar_q, PANELS * Q_PANEL);
#if STRIDED
                hop::tma_load_tile_4d(s_q, &tmap_q, &bar_q, BLOCK_M, Q_BOX_ROWS, m_start, bh % heads_q,
                                      bh / heads_q, PANELS);
#else
                hop::tma_load_tile(s_q, &tmap_q, &bar_q, BLOCK_M, Q_BOX_ROWS, m_start, bh, PANELS);
#endif
                TRACE_END(TMA_Q);
                for (int nb = 0; nb < num_n_blocks; ++nb, ++kv) {
                    const int slot = kv % NUM_STAGES;
                    // Load kv reuses the slot of load kv − NUM_STAGES: wait until every consumer warp has
                    // released that one (it completed the empty barrier's previous phase:
                    // ring.prev_phase()). K comes back a whole softmax + P·V earlier than V.
                    TRACE_BEGIN(WAIT_K_EMPTY);
                    if (kv >= NUM_STAGES) hop::mbar_wait(&bar_k_empty[slot], ring.prev_phase());
                    TRACE_END(WAIT_K_EMPTY);
                    load_k(nb, slot, bh_kv);
                    TRACE_BEGIN(WAIT_V_EMPTY);
                    if (kv >= NUM_STAGES) hop::mbar_wait(&bar_v_empty[slot], ring.prev_phase());
                    TRACE_END(WAIT_V_EMPTY);
                    load_v(nb, slot, bh_kv);
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
    auto softmax_tile = [&](int n_start, int m_start, float (&alpha)[2]) {
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
#if CAUSAL
        // ---- causal: key > row gets probability 0; only tiles that cross this warp's diagonal ----
        // (Key 0 is in every row's first tile, so a row's running max is finite from its first tile on,
        // and a tile whose keys are all above a row's diagonal gives it P = 0 and alpha = 1.)
        const int row0 = m_start + cw * WARP_ROWS + g;  // this thread's rows: row0 and row0 + 8
        if (n_start + BLOCK_N - 1 > m_start + cw * WARP_ROWS) {
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (n_start + j * 8 + 2 * t + (e & 1) > row0 + 8 * (e >> 1)) s[j][e] = NEG_INF;
                }
            }
        }
#endif
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
            rs[r] = smx::online_rescale<FP16>(row_max[r], row_err[r], m_new, scale_log2);
            row_err[r] = rs[r].err;
            alpha[r] = rs[r].alpha;
            row_max[r] = m_new;
            row_sum[r] *= alpha[r];
        }
#if FP16
        // fp16 P: a row with k != 0 (|max·c| >= 2^24) stores P·2^−k, with l and alpha to match (softmax.cuh).
        // Warp-uniform, so the common case below is the bf16 loop, one FFMA and one MUFU.EX2 per score.
        if (__any_sync(0xffffffffu, rs[0].shift != 0.f || rs[1].shift != 0.f)) {
#pragma unroll
            for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[j][e] =
                        smx::fast_exp2(fmaf(s[j][e], rs[e >> 1].mul, rs[e >> 1].neg_ref) - rs[e >> 1].shift);
                    row_sum[e >> 1] += s[j][e];
                }
            }
            return;
        }
#endif
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

    for (int work = blockIdx.x, it = 0; tile_of(work) < num_tiles; work += gridDim.x, ++it) {
        const Work w = work_of(tile_of(work));
        const int bh = w.bh, m_start = w.m_start, num_n_blocks = w.num_n;
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
            TRACE_BEGIN(S);
            issue_qk(slot);
            hop::wgmma_wait<0>();
            hop::reg_fence(s);                                    // no read of S above the wgmma wait
            if (lane == 0) hop::mbar_arrive(&bar_k_empty[slot]);  // this warp's wgmmas no longer read K_0
            TRACE_END(S);
            TRACE_BEGIN(SOFTMAX);
            float alpha[2];
            softmax_tile(0, m_start, alpha);
#pragma unroll
            for (int ks = 0; ks < KV_STEPS; ++ks) pack_p_fragment<elem>(p_frag[ks], s[2 * ks], s[2 * ks + 1]);
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
            hop::wgmma_wait<1>();                                 // the older group, S, is complete
            hop::reg_fence(s);                                    // no read of S above the wgmma wait
            if (lane == 0) hop::mbar_arrive(&bar_k_empty[slot]);  // this warp's wgmmas no longer read K_nb
            TRACE_END(S);

            TRACE_BEGIN(SOFTMAX);
            float alpha[2];
            softmax_tile(nb * BLOCK_N, m_start, alpha);  // while P_{nb-1}·V_{nb-1} runs on the tensor cores
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
            for (int ks = 0; ks < KV_STEPS; ++ks) pack_p_fragment<elem>(p_frag[ks], s[2 * ks], s[2 * ks + 1]);
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
        TRACE_BEGIN(PV);
        hop::reg_fence(p_frag);
        hop::reg_fence(o_acc);
        gemm_pv_async<BLOCK_N>(o_acc, p_frag, smem_addr(s_v + pv_slot * KV_TILE_BYTES), KV_PANEL);
        hop::wgmma_wait<0>();
        hop::reg_fence(o_acc);
        if (lane == 0) hop::mbar_arrive(&bar_v_empty[pv_slot]);
        TRACE_END(PV);

        // ---- epilogue: O / l, bf16 (fp16), rows past seqlen_q not written ----
        TRACE_BEGIN(EPILOGUE);
        float inv_l[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = quad_sum(row_sum[r]);
            inv_l[r] = l > 0.f ? 1.f / l : 0.f;
#if WRITE_LSE || !SMEM_EPILOGUE
            const int row = m_start + cw * WARP_ROWS + g + 8 * r;
#endif
#if WRITE_LSE
            // LSE = ln(sum_j exp(scale·s_j)) = ln2·R + ln l with R the row's reference (P = 2^(s·c − R),
            // l = sum P; softmax.cuh), recomputed here exactly as the last tile computed it. On hard rows
            // (mul < c) P is relative to the max itself: LSE = scale·m + ln l, in natural units so that it
            // stays finite wherever the exact LSE is (m·c could overflow where m·scale does not).
            if (t == 0 && row < seqlen_q) {
                const float m = row_max[r], mul = smx::row_multiplier(m, scale_log2);
#if FP16  // P was stored against R + k, k = ceil(m·mul − R) (0 on hard rows): ln 2·(R + k) + ln l
                const float ref = __fmul_ru(m, mul);
                const float log_l = fmaf(ceilf(fmaf(m, mul, -ref)), CUDART_LN2_F, logf(l));
                lse[bh * seqlen_q + row] =
                    mul == scale_log2 ? fmaf(ref, CUDART_LN2_F, log_l) : fmaf(m, scale, log_l);
#else
                lse[bh * seqlen_q + row] = mul == scale_log2 ? fmaf(__fmul_ru(m, mul), CUDART_LN2_F, logf(l))
                                                             : fmaf(m, scale, logf(l));
#endif
            }
#endif
#if !SMEM_EPILOGUE  // head_dim 256: 4-byte stores, straight from the registers
            const float inv = inv_l[r];
            if (row < seqlen_q) {
#if STRIDED
                elem* dst =
                    o + (bh / heads_q) * o_stride_b + (bh % heads_q) * o_stride_h + row * o_stride_s + 2 * t;
#else
                elem* dst = o + (bh * seqlen_q + row) * HEAD_DIM + 2 * t;
#endif
#pragma unroll
                for (int j = 0; j < O_TILES; ++j) {
#if FP16  // O lies within V's range, but its fp16-rounded P may overshoot it by 2^-11: no inf from that
                    *reinterpret_cast<uint32_t*>(dst + j * 8) =
                        pack_f16x2(clamp_f16(o_acc[j][2 * r] * inv), clamp_f16(o_acc[j][2 * r + 1] * inv));
#else
                    *reinterpret_cast<uint32_t*>(dst + j * 8) =
                        pack_bf16x2(o_acc[j][2 * r] * inv, o_acc[j][2 * r + 1] * inv);
#endif
                }
            }
#endif
        }
#if SMEM_EPILOGUE
        // O / l of this warp's 16 rows into its staging rows, one stmatrix.x4 per two n8 tiles: matrices (j,
        // rows 0-7), (j, rows 8-15), (j + 1, rows 0-7), (j + 1, rows 8-15); lane l addresses row (l % 8) + (l
        // & 8) of the 16-byte chunk j + l / 16 (n8 tile = chunk), stored at chunk c ^ (row % 8).
        auto pack_o = [&](float lo, float hi, float inv) -> uint32_t {
#if FP16  // O lies within V's range, but its fp16-rounded P may overshoot it by 2^-11: no inf from that
            return pack_f16x2(clamp_f16(lo * inv), clamp_f16(hi * inv));
#else
            return pack_bf16x2(lo * inv, hi * inv);
#endif
        };
        unsigned char* o_rows = s_o + cw * WARP_ROWS * O_ROW_BYTES;  // this warp's staging rows
        __syncwarp();  // every lane has read the previous work tile's rows back (their last reader)
        {
            const int r = (lane & 7) + (lane & 8);
            const uint32_t row_addr = smem_addr(o_rows) + r * O_ROW_BYTES;
#pragma unroll
            for (int j = 0; j < O_TILES; j += 2) {
                const int c = j + (lane >> 4);
                hop::stmatrix_x4(row_addr + ((c ^ (r & 7)) << 4), pack_o(o_acc[j][0], o_acc[j][1], inv_l[0]),
                                 pack_o(o_acc[j][2], o_acc[j][3], inv_l[1]),
                                 pack_o(o_acc[j + 1][0], o_acc[j + 1][1], inv_l[0]),
                                 pack_o(o_acc[j + 1][2], o_acc[j + 1][3], inv_l[1]));
            }
        }
        __syncwarp();  // the warp's rows are in shared memory for every lane
        // Whole rows out: O_CHUNKS lanes per row, 16 bytes each (4-byte stores where O is not 16-byte
        // aligned).
#if STRIDED
        const bool o_vec = (reinterpret_cast<unsigned long long>(o) & 15) == 0 &&
                           ((o_stride_b | o_stride_h | o_stride_s) & 7) == 0;
#else
        const bool o_vec = (reinterpret_cast<unsigned long long>(o) & 15) == 0;
#endif
#pragma unroll O_COPY_UNROLL
        for (int pass = 0; pass < WARP_ROWS * O_CHUNKS / 32; ++pass) {
            const int r = pass * (32 / O_CHUNKS) + lane / O_CHUNKS, c = lane % O_CHUNKS;
            const uint4 chunk =
                *reinterpret_cast<const uint4*>(o_rows + r * O_ROW_BYTES + ((c ^ (r & 7)) << 4));
            const int row = m_start + cw * WARP_ROWS + r;
            if (row < seqlen_q) {
#if STRIDED
                elem* dst =
                    o + (bh / heads_q) * o_stride_b + (bh % heads_q) * o_stride_h + row * o_stride_s + c * 8;
#else
                elem* dst = o + (bh * seqlen_q + row) * HEAD_DIM + c * 8;
#endif
                if (o_vec) {  // kernel arguments: warp-uniform
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
#endif
        TRACE_END(EPILOGUE);
    }
}
