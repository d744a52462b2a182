// Rung 7 — warp specialization: a producer warpgroup feeds two consumer warpgroups through mbarriers.
//
// The idea (one change over rung 6): split the CTA by role instead of having every warp both load and
// compute. Warpgroup 0 is the producer: one elected thread issues every TMA load (Q once, then K/V tiles
// into a NUM_STAGES ring), nothing else. Warpgroups 1 and 2 are consumers, each owning 64 rows of the
// 128-row Q tile and running exactly rung 6's math. Instead of a CTA-wide __syncthreads() per tile, each
// ring stage has "full" barriers (TMA -> consumers: the bytes have landed) and an "empty" barrier
// (consumers -> producer: every consumer warp has finished its wgmmas on the stage), so the producer runs
// ahead as far as the ring allows and the consumers never wait on each other. setmaxnreg moves registers
// from the producer (which needs almost none) to the consumers (accumulators for S and O).
// Sources: FlashAttention-3 (Shah et al., 2024) Sec. 3.1 "Producer-consumer asynchrony through warp
// specialization and pingpong scheduling" (warp specialization part); PTX ISA "mbarrier",
// "cp.async.bulk.tensor", "setmaxnreg".
//
//   producer WG 0 (24 regs):  [Q] K0 V0 K1 V1 | wait empty[s] -> K_j V_j -> ...
//                                  |full_k/full_v[s]        ^ empty[s] (8 consumer warps arrive)
//   consumer WG 1, 2 (240 regs, 64 rows each):
//     wait full_k[s] -> S = Q K_j^T (wgmma SS) -> softmax -> wait full_v[s] -> O += P V_j (wgmma RS)
//       -> wait wgmma -> arrive empty[s]
//
// Shared memory (1024-B aligned; each tile = two 64-column panels of rows x 128 B, TMA 128-B swizzle):
//   [ Q: 2 x BLOCK_M x 128 B ][ K stage 0 .. NUM_STAGES-1 ][ V stage 0 .. NUM_STAGES-1 ]
#include <math_constants.h>

#include "hopper.cuh"

#if !defined(HEAD_DIM) || !defined(BLOCK_M) || !defined(BLOCK_N) || !defined(NUM_THREADS)
#error "HEAD_DIM, BLOCK_M, BLOCK_N and NUM_THREADS must be defined by the host (see attnclimb/rungs.py)"
#endif
#if !defined(NUM_STAGES) || !defined(Q_BOX_ROWS) || !defined(KV_BOX_ROWS)
#error "NUM_STAGES, Q_BOX_ROWS and KV_BOX_ROWS must be defined by the host (see attnclimb/rungs.py)"
#endif
#if HEAD_DIM != 128
#error "this kernel is written for head_dim 128 (two 64-column TMA panels)"
#endif

constexpr int kBlockM = BLOCK_M;
constexpr int kBlockN = BLOCK_N;
constexpr int kStages = NUM_STAGES;
constexpr int kConsumerWGs = NUM_THREADS / 128 - 1;  // warpgroup 0 is the producer
constexpr int kConsumerWarps = 4 * kConsumerWGs;      // arrivals that empty a stage
constexpr int kProducerRegs = 24;                     // setmaxnreg targets: 128*24 + 256*240 <= 64K
constexpr int kConsumerRegs = 240;
constexpr int kAccS = kBlockN / 2;      // fp32 accumulators per thread for S (m64 x BLOCK_N)
constexpr int kAccO = HEAD_DIM / 2;     // fp32 accumulators per thread for O (m64 x 128)
constexpr int kPSlices = kBlockN / 16;  // k16 slices of P (A operand of O += P V)

constexpr uint32_t kRowBytes = 128;                       // one row of a 64-column bf16 panel
constexpr uint32_t kQPanelBytes = kBlockM * kRowBytes;    // Q tile: two panels
constexpr uint32_t kQTileBytes = 2 * kQPanelBytes;
constexpr uint32_t kKVPanelBytes = kBlockN * kRowBytes;   // K or V tile: two panels
constexpr uint32_t kKVTileBytes = 2 * kKVPanelBytes;

static_assert(NUM_THREADS % 128 == 0 && kBlockM == 64 * kConsumerWGs, "one consumer warpgroup per 64 rows");
static_assert(128 * kProducerRegs + 128 * kConsumerWGs * kConsumerRegs <= 65536, "register file");
static_assert(kBlockN % 16 == 0, "BLOCK_N must be a multiple of the wgmma k (16)");
static_assert(kBlockM % Q_BOX_ROWS == 0 && kBlockN % KV_BOX_ROWS == 0, "tiles are whole TMA boxes");
static_assert(Q_BOX_ROWS % 8 == 0 && KV_BOX_ROWS % 8 == 0, "boxes must be whole 1024-B swizzle atoms");
static_assert(kStages >= 1, "NUM_STAGES >= 1");

// ex2.approx.ftz.f32: the MUFU instruction itself (exp2f adds range handling we do not need);
// ex2(-inf) = +0, which is how masked keys get probability 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A (rows x 128) bf16 tile = two 64-column panels (128-B swizzle caps a box at 128 B of columns),
// each panel `rows / box_rows` boxes high. Panel p lands at dst + p * rows * 128 B.
__device__ __forceinline__ void tma_load_tile(unsigned char* dst, const TmaDesc* map, uint64_t* bar, int rows,
                                              int box_rows, int row0, int bh) {
  for (int p = 0; p < 2; ++p)
    for (int r = 0; r < rows; r += box_rows)
      hop::tma_load_3d(dst + (p * rows + r) * kRowBytes, map, bar, p * 64, row0 + r, bh);
}

// K and V tile `tile` into ring stage `stage`, each signalling its own barrier (S needs only K).
__device__ __forceinline__ void issue_kv(int tile, int stage, unsigned char* sK, unsigned char* sV,
                                         const TmaDesc* tmap_k, const TmaDesc* tmap_v, uint64_t* bar_k,
                                         uint64_t* bar_v, int bh) {
  hop::mbar_arrive_expect_tx(&bar_k[stage], kKVTileBytes);
  tma_load_tile(sK + stage * kKVTileBytes, tmap_k, &bar_k[stage], kBlockN, KV_BOX_ROWS, tile * kBlockN, bh);
  hop::mbar_arrive_expect_tx(&bar_v[stage], kKVTileBytes);
  tma_load_tile(sV + stage * kKVTileBytes, tmap_v, &bar_v[stage], kBlockN, KV_BOX_ROWS, tile * kBlockN, bh);
}

// S = Q K^T for this warpgroup's 64 rows: head_dim 128 = 8 k16 steps, 4 per 64-column panel. Both
// operands K-major; the k-th slice of a panel starts 32 B further into each 128-B swizzled row.
// SIGN = -1 computes S = (-Q) K^T (wgmma's imm-scale-a), for a negative softmax scale. Issues the
// wgmmas as one group and waits for it, so that a branch between the two signs holds whole groups.
template <int SIGN>
__device__ __forceinline__ void gemm_qk(float (&s)[kAccS], uint32_t q_addr, uint32_t k_addr) {
  hop::wgmma_fence();  // S registers were read by the previous tile's softmax
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    const uint32_t panel = kk / 4, koff = (kk % 4) * 32;
    const uint64_t a = hop::desc_kmajor_sw128(q_addr + panel * kQPanelBytes + koff);
    const uint64_t b = hop::desc_kmajor_sw128(k_addr + panel * kKVPanelBytes + koff);
    hop::wgmma_ss<kBlockN, SIGN>(s, a, b, kk > 0);  // first step overwrites S (scale-d = 0)
  }
  hop::wgmma_commit();
  hop::wgmma_wait<0>();
}

// O += P V: BLOCK_N/16 k16 steps over the keys. B = V (keys x 128) is MN-major: 16 keys = two 8-row
// groups 1024 B apart (SBO); head_dim 128 = two 64-column panels kKVPanelBytes apart (LBO). The k16
// slice t starts 16 rows = 2048 B into each panel.
__device__ __forceinline__ void gemm_pv(float (&o)[kAccO], const uint32_t (&p)[kPSlices][4], uint32_t v_addr) {
#pragma unroll
  for (int t = 0; t < kPSlices; ++t) {
    const uint64_t b = hop::desc_mnmajor_sw128(v_addr + t * 16 * kRowBytes, kKVPanelBytes);  // CHECK: LBO/SBO roles
    hop::wgmma_m64n128k16_rs<1>(o, p[t], b, 1);
  }
}

// Keys >= seqlen_k (TMA filled them with zeros) get score -inf. Column of accumulator i of this
// thread: 8*(i/4) + 2*(lane%4) + (i%2) (wgmma D fragment).
__device__ __forceinline__ void mask_tail(float (&s)[kAccS], int kv0, int seqlen_k, int lane) {
#pragma unroll
  for (int i = 0; i < kAccS; ++i) {
    const int col = kv0 + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
    if (col >= seqlen_k) s[i] = -CUDART_INF_F;
  }
}

// Online softmax for this thread's two rows (h = 0: row lane/4, h = 1: row lane/4 + 8; accumulators
// with ((i >> 1) & 1) == h). Each row is spread over the 4 threads of a quad: reduce with two
// shuffles. Scores are raw (unscaled); scale*log2(e) is folded into one FFMA before ex2. On return
// s holds the probabilities, l the thread-partial row sums, o is rescaled by exp2(m_old - m_new).
__device__ __forceinline__ void online_softmax(float (&s)[kAccS], float (&m)[2], float (&l)[2], float (&o)[kAccO],
                                               float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int c = 0; c < kBlockN / 8; ++c) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * h], s[4 * c + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx);
    // A row with no valid key yet keeps m = -inf: subtract 0 instead, so (-inf) - (-inf) never occurs.
    const float m_scaled = (m_new == -CUDART_INF_F) ? 0.f : m_new * scale_log2;
    const float alpha = fast_exp2(m[h] * scale_log2 - m_scaled);  // 0 on the first tile (m = -inf)
    m[h] = m_new;
    float rowsum = 0.f;
#pragma unroll
    for (int c = 0; c < kBlockN / 8; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * c + 2 * h + e;
        s[i] = fast_exp2(fmaf(s[i], scale_log2, -m_scaled));
        rowsum += s[i];
      }
    }
    l[h] = l[h] * alpha + rowsum;
#pragma unroll
    for (int c = 0; c < HEAD_DIM / 8; ++c) {
      o[4 * c + 2 * h] *= alpha;
      o[4 * c + 2 * h + 1] *= alpha;
    }
  }
}

// P (fp32 accumulator of S) -> bf16 A fragments of O += P V: slice t, register r packs accumulators
// 8t + 2r and 8t + 2r + 1 (see hopper.cuh, "wgmma.mma_async" comment).
__device__ __forceinline__ void pack_p(const float (&s)[kAccS], uint32_t (&p)[kPSlices][4]) {
#pragma unroll
  for (int t = 0; t < kPSlices; ++t)
#pragma unroll
    for (int r = 0; r < 4; ++r) p[t][r] = hop::pack_bf16x2(s[8 * t + 2 * r], s[8 * t + 2 * r + 1]);
}

// O / l to global memory straight from the accumulator fragment, rows >= seqlen_q skipped.
// Thread owns rows row_base + lane/4 (+8) and, per 8-column group c, columns 8c + 2*(lane%4) + {0,1}.
__device__ __forceinline__ void store_o(const float (&o)[kAccO], const float (&l)[2], __nv_bfloat16* out,
                                        int bh, int row_base, int seqlen_q, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int row = row_base + lane / 4 + 8 * h;
    if (row < seqlen_q) {
      __nv_bfloat16* dst = out + (bh * seqlen_q + row) * HEAD_DIM + 2 * (lane & 3);
#pragma unroll
      for (int c = 0; c < HEAD_DIM / 8; ++c)
        *reinterpret_cast<uint32_t*>(dst + 8 * c) = hop::pack_bf16x2(o[4 * c + 2 * h] * inv, o[4 * c + 2 * h + 1] * inv);
    }
  }
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)  // the register cap setmaxnreg needs
attn_fwd(const __grid_constant__ TmaDesc tmap_q, const __grid_constant__ TmaDesc tmap_k,
         const __grid_constant__ TmaDesc tmap_v, __nv_bfloat16* o, int seqlen_q, int seqlen_k, int num_m_blocks,
         float scale) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = hop::align_1024(smem_raw);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + kQTileBytes;
  unsigned char* sV = sK + kStages * kKVTileBytes;
  __shared__ __align__(8) uint64_t bar_q;
  __shared__ __align__(8) uint64_t bar_k[kStages];      // full: K tile landed
  __shared__ __align__(8) uint64_t bar_v[kStages];      // full: V tile landed
  __shared__ __align__(8) uint64_t bar_empty[kStages];  // empty: consumers are done with the stage

  const int tid = threadIdx.x;
  const int warpgroup = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int bh = blockIdx.x / num_m_blocks;
  const int m_block = blockIdx.x % num_m_blocks;
  const int q_row0 = m_block * kBlockM;
  const int n_tiles = (seqlen_k + kBlockN - 1) / kBlockN;

  if (tid == 0) {
    hop::tma_prefetch_desc(&tmap_q);
    hop::tma_prefetch_desc(&tmap_k);
    hop::tma_prefetch_desc(&tmap_v);
    hop::mbar_init(&bar_q, 1);
    for (int st = 0; st < kStages; ++st) {
      hop::mbar_init(&bar_k[st], 1);
      hop::mbar_init(&bar_v[st], 1);
      hop::mbar_init(&bar_empty[st], kConsumerWarps);
    }
    hop::fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: from here on the roles only meet at mbarriers

  if (warpgroup == 0) {
    // ---------------- producer ----------------
    hop::setmaxnreg_dec<kProducerRegs>();  // all 4 warps of the warpgroup execute it
    if (tid == 0) {
      hop::mbar_arrive_expect_tx(&bar_q, kQTileBytes);
      tma_load_tile(sQ, &tmap_q, &bar_q, kBlockM, Q_BOX_ROWS, q_row0, bh);
      int stage = 0;
      uint32_t phase = 0;  // parity of the full barriers' phase for tile j
      for (int j = 0; j < n_tiles; ++j) {
        // Tile j reuses the stage of tile j - NUM_STAGES: wait until its consumers released it (that
        // release completed phase j/NUM_STAGES - 1 of bar_empty[stage], parity phase ^ 1).
        if (j >= kStages) hop::mbar_wait(&bar_empty[stage], phase ^ 1);
        issue_kv(j, stage, sK, sV, &tmap_k, &tmap_v, bar_k, bar_v, bh);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;  // the other producer threads have nothing to do
  }

  // ---------------- consumers ----------------
  hop::setmaxnreg_inc<kConsumerRegs>();
  const int cwg = warpgroup - 1;  // consumer index: rows 64*cwg .. 64*cwg+63 of the Q tile

  float o_acc[kAccO], s_acc[kAccS];
#pragma unroll
  for (int i = 0; i < kAccO; ++i) o_acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kAccS; ++i) s_acc[i] = 0.f;
  float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f};
  // A negative scale: softmax(scale*S) = softmax(|scale|*(-S)); the S wgmma negates Q on the fly, so
  // the max of the raw scores below is the max of the scaled ones. A zero scale becomes FLT_MIN (the
  // same uniform P, but -inf * scale stays -inf for masked keys instead of NaN).
  const bool negate = scale < 0.f;
  scale = fmaxf(fabsf(scale), 1.17549435e-38f);
  const float scale_log2 = scale * 1.4426950408889634f;  // softmax(scale*x) = 2^(x*scale*log2 e) / sum

  const uint32_t q_addr = hop::smem_u32(sQ) + cwg * 64 * kRowBytes;  // this warpgroup's 64 rows
  hop::mbar_wait(&bar_q, 0);

  int stage = 0;
  uint32_t phase = 0;  // parity of the barrier phase holding tile j in `stage`
  for (int j = 0; j < n_tiles; ++j) {
    // S = Q K_j^T
    hop::mbar_wait(&bar_k[stage], phase);
    hop::reg_fence(s_acc);
    if (negate)  // warp-uniform (a kernel argument)
      gemm_qk<-1>(s_acc, q_addr, hop::smem_u32(sK) + stage * kKVTileBytes);
    else
      gemm_qk<1>(s_acc, q_addr, hop::smem_u32(sK) + stage * kKVTileBytes);
    hop::reg_fence(s_acc);

    // softmax (only the last tile can hold keys >= seqlen_k)
    if ((j + 1) * kBlockN > seqlen_k) mask_tail(s_acc, j * kBlockN, seqlen_k, lane);
    online_softmax(s_acc, m_run, l_run, o_acc, scale_log2);
    uint32_t p_frag[kPSlices][4];
    pack_p(s_acc, p_frag);

    // O += P V_j
    hop::mbar_wait(&bar_v[stage], phase);
#pragma unroll
    for (int t = 0; t < kPSlices; ++t) hop::reg_fence(p_frag[t]);
    hop::reg_fence(o_acc);
    hop::wgmma_fence();
    gemm_pv(o_acc, p_frag, hop::smem_u32(sV) + stage * kKVTileBytes);
    hop::wgmma_commit();
    hop::wgmma_wait<0>();
    hop::reg_fence(o_acc);

    // This warp's wgmmas on the stage are complete (wait_group 0): one arrival per warp.
    if (lane == 0) hop::mbar_arrive(&bar_empty[stage]);
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }

  store_o(o_acc, l_run, o, bh, q_row0 + cwg * 64 + warp * 16, seqlen_q, lane);
}
