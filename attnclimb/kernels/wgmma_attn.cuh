// wgmma_attn.cuh — rung 6's idea, kept by rungs 7–9: the two products of one attention tile as
// warpgroup MMAs (wgmma.mma_async) on the 128-B-swizzled TMA tiles of hopper.cuh. S = Q·Kᵀ reads both
// operands from shared memory through descriptors (SS); O += P·V takes P from registers (RS), so P
// never goes through shared memory. FlashAttention-3 (Shah et al., 2024) Sec. 3; PTX ISA
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions".
#pragma once

#include "hopper.cuh"

// S = Q·Kᵀ for the warpgroup whose 64 rows of Q start at shared address q_rows, against an N-key K
// tile at k_tile: head_dim 128 = 8 k16 steps, 4 per 64-column panel; q_panel and k_panel are the bytes
// from one panel of the Q (K) tile to the next. Q (A) and K (B) are both K-major (contiguous along
// head_dim). SIGN = -1 computes S = (−Q)·Kᵀ (wgmma's imm-scale-a). The wgmmas are one committed group, so
// that the caller's branch between the two signs holds whole groups. gemm_qk_async returns without
// waiting (rung 9 overlaps the group with the softmax); gemm_qk waits, and S may be read after it.
template <int SIGN, int N>
__device__ __forceinline__ void gemm_qk_async(float (&s)[N / 8][4], uint32_t q_rows, uint32_t q_panel,
                                              uint32_t k_tile, uint32_t k_panel) {
    hop::wgmma_fence();  // s was read and written by the previous tile's softmax
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; ++d) {
        // The k16 slice d % 4 of a panel is the 32 B at column offset 32·(d % 4) of every 128-B row. A
        // descriptor whose start address is advanced by those 32 B selects it: the hardware applies the
        // 128-B swizzle to the full address (its row bits [7, 10) are unchanged by the advance), and the
        // base-offset field stays 0 because every tile starts on a 1024-B boundary (PTX ISA "Matrix
        // Descriptor Format", "Shared Memory Matrix Layout"). The GPU tests check it against float64.
        const uint32_t panel = d / 4, koff = (d % 4) * 32;
        const uint64_t a = hop::desc_kmajor_sw128(q_rows + panel * q_panel + koff);
        const uint64_t b = hop::desc_kmajor_sw128(k_tile + panel * k_panel + koff);
        hop::wgmma_ss<N, SIGN>(s, a, b, d > 0);  // the first step overwrites S (scale-d = 0)
    }
    hop::wgmma_commit();
}

template <int SIGN, int N>
__device__ __forceinline__ void gemm_qk(float (&s)[N / 8][4], uint32_t q_rows, uint32_t q_panel,
                                        uint32_t k_tile, uint32_t k_panel) {
    gemm_qk_async<SIGN, N>(s, q_rows, q_panel, k_tile, k_panel);
    hop::wgmma_wait<0>();
}

// O += P·V over an N-key V tile at v_tile: N / 16 k16 steps over the keys, P from registers (the
// A fragments of pack_p_fragment). B = V (keys x 128) is MN-major: the leading-dimension byte offset
// is the distance between the tile's two 64-column panels (v_panel bytes) and the stride byte offset
// the distance between groups of 8 keys (8 rows = 1024 B; hopper.cuh, desc_mnmajor_sw128). The k16
// slice kv starts 16 rows = 2048 B into each panel. gemm_pv_async returns without waiting (O and P
// must not be touched until a wgmma_wait covers the group); gemm_pv waits.
template <int N>
__device__ __forceinline__ void gemm_pv_async(float (&o)[HEAD_DIM / 8][4], const uint32_t (&p)[N / 16][4],
                                              uint32_t v_tile, uint32_t v_panel) {
    hop::wgmma_fence();  // o was rescaled and p written since the last wgmma
#pragma unroll
    for (int kv = 0; kv < N / 16; ++kv) {
        const uint64_t b = hop::desc_mnmajor_sw128(v_tile + kv * 16 * hop::PANEL_ROW_BYTES, v_panel);
        hop::wgmma_rs<HEAD_DIM, 1>(o, p[kv], b, 1);
    }
    hop::wgmma_commit();
}

template <int N>
__device__ __forceinline__ void gemm_pv(float (&o)[HEAD_DIM / 8][4], const uint32_t (&p)[N / 16][4],
                                        uint32_t v_tile, uint32_t v_panel) {
    gemm_pv_async<N>(o, p, v_tile, v_panel);
    hop::wgmma_wait<0>();
}
