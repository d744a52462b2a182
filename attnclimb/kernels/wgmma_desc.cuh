// wgmma_desc.cuh — rung 11's idea: the two products of wgmma_attn.cuh on descriptors that the caller
// builds once (per work tile, or per ring slot) and that are advanced by constant adds, instead of being
// rebuilt from a shared address before every wgmma.
//
// A wgmma shared-memory descriptor (PTX ISA "Matrix Descriptor Format"; the fields in hopper.cuh) keeps
// the operand's start address, >> 4, in its bits 0–13; the other fields (LBO, SBO, base offset, swizzle)
// are the same for every k16 step of a tile and for every tile of the ring. So the descriptor of a k16
// slice at `off` bytes past a base is that base's descriptor + (off >> 4), one 64-bit add of a constant
// the compiler folds, as long as the sum does not carry out of the 14-bit field into LBO. It cannot: the
// field holds addresses up to 2^14 · 16 B = 256 KB, a CTA's shared window is 227 KB, and every sum
// here is the start address of a real slice inside the CTA's own tiles (PTX ISA "Asynchronous Warpgroup
// Level Matrix Multiply-Accumulate Instructions": the start must be 16-B aligned, which every offset is).
// hop::desc_kmajor_sw128 and hop::desc_mnmajor_sw128 build the bases; the GPU tests check the result
// against float64 like every other rung.
#pragma once

#include "wgmma_attn.cuh"

// gemm_qk_async (wgmma_attn.cuh) on bases: q_desc describes the warpgroup's 64 rows of Q, k_desc the
// N-key K tile, both K-major, 128-B swizzle; q_panel and k_panel are the bytes from one 64-column panel
// to the next. The k16 slice d starts (d % 4)·32 B into a 128-B row of panel d / 4: + 2 in the field per
// step inside a panel, + panel bytes >> 4 per panel (the same addresses gemm_qk_async computes).
template <int SIGN, int N>
__device__ __forceinline__ void gemm_qk_async_desc(float (&s)[N / 8][4], uint64_t q_desc, uint32_t q_panel,
                                                   uint64_t k_desc, uint32_t k_panel) {
    hop::wgmma_fence();  // s was read and written by the previous tile's softmax
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; ++d) {
        const uint32_t panel = d / 4, koff = (d % 4) * 32;
        hop::wgmma_ss<N, SIGN>(s, q_desc + ((panel * q_panel + koff) >> 4),
                               k_desc + ((panel * k_panel + koff) >> 4),
                               d > 0);  // the first step overwrites S (scale-d = 0)
    }
    hop::wgmma_commit();
}

// gemm_pv_async (wgmma_attn.cuh) on a base: v_desc describes the N-key V tile, MN-major, its LBO already
// the panel stride (hop::desc_mnmajor_sw128). The k16 slice kv starts 16 rows = 2048 B into each panel:
// + 128 in the field per step.
template <int N>
__device__ __forceinline__ void gemm_pv_async_desc(float (&o)[HEAD_DIM / 8][4],
                                                   const uint32_t (&p)[N / 16][4], uint64_t v_desc) {
    hop::wgmma_fence();  // o was rescaled and p written since the last wgmma
#pragma unroll
    for (int kv = 0; kv < N / 16; ++kv)
        hop::wgmma_rs<HEAD_DIM, 1>(o, p[kv], v_desc + ((kv * 16 * hop::PANEL_ROW_BYTES) >> 4), 1);
    hop::wgmma_commit();
}
