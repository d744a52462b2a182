// common.cuh — what every tensor-core rung (2 and up) shares: the types, 32-bit shared-memory
// addresses, and the register layout of an accumulator tile: its bf16 packing into the A fragment of
// P·V and the reductions over the 4 threads (a quad) that hold one row. The mma.sync m16n8k16 layout
// (rungs 2–5) and a warp's share of the wgmma m64nNk16 layout (rungs 6+) are the same
// (PTX ISA, "Matrix Fragments for mma.m16n8k16" and wgmma "Register Fragments"):
// lane = 4*g + t, g = groupID (0..7), t = threadID_in_group (0..3);
//   A (16x16): a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   C (16x8):  c0,c1 = (g, 2t..2t+1)   c2,c3 = (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

// NVRTC has no <stdint.h>; redeclaring a typedef to the same type is legal.
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef __nv_bfloat16 bf16;
typedef __half f16;  // the top rung's FP16 variant

#define NEG_INF (-CUDART_INF_F)

// blockIdx.x, read again through a volatile asm that the compiler cannot merge with the kernel's first
// read: what an epilogue derives from it (the head, the first row) then needs no register across the
// main loop. Register relief for the rungs that run at the 255-register cap (2-5).
__device__ __forceinline__ unsigned int ctaid_x_again() {
    unsigned int cta;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
    return cta;
}

// The 32-bit .shared::cta window address of a pointer into shared memory, as PTX operands want it.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Two fp32 values -> one register of two bf16 (lo in the low half, as mma expects).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Two fp32 values -> one register of two fp16, round to nearest (cvt.rn.f16x2.f32; lo in the low half).
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// pack2<T>: the packing of the 16-bit type T (bf16, or f16 in the top rung's FP16 variant).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<bf16>(float lo, float hi) {
    return pack_bf16x2(lo, hi);
}
template <>
__device__ __forceinline__ uint32_t pack2<f16>(float lo, float hi) {
    return pack_f16x2(lo, hi);
}

// The S accumulators of two adjacent n8 tiles (keys 16j..16j+15) ARE the A fragment of the k16
// slice j of P·V, element for element:
//   s[2j][0..1] = (g,   16j + 2t..)     -> a0        s[2j+1][0..1] = (g,   16j + 8 + 2t..) -> a2
//   s[2j][2..3] = (g+8, 16j + 2t..)     -> a1        s[2j+1][2..3] = (g+8, 16j + 8 + 2t..) -> a3
// T: the type P is rounded to, the A type of the P·V MMA (bf16 on every rung; f16 in the FP16 variant).
template <typename T = bf16>
__device__ __forceinline__ void pack_p_fragment(uint32_t (&a)[4], const float (&s_lo)[4],
                                                const float (&s_hi)[4]) {
    a[0] = pack2<T>(s_lo[0], s_lo[1]);
    a[1] = pack2<T>(s_lo[2], s_lo[3]);
    a[2] = pack2<T>(s_hi[0], s_hi[1]);
    a[3] = pack2<T>(s_hi[2], s_hi[3]);
}

// Max over the 4 threads of a quad (they hold the BLOCK_N columns of one row between them).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
