// fp32_tiles.cuh — the CUDA-core helpers of rungs 0 and 1 (fp32 tiles in shared memory, a 16 x 16
// thread grid); the tensor-core rungs (2 and up) do not include it.
//
// Thread layout: the CTA's 256 threads form a GRID_DIM x GRID_DIM grid; thread (ty, tx) = (threadIdx.x
// / 16, threadIdx.x % 16). A warp covers 2 row groups and all 16 column groups, so each shared-memory
// value a warp reads is either broadcast (same address) or part of a contiguous run (no bank conflicts).
#pragma once

#include <cuda_bf16.h>

constexpr int GRID_DIM = 16;  // threads per tile edge
constexpr int SMEM_PAD = 4;   // floats of row padding: keeps 16-byte alignment, shifts banks

// -inf (NVRTC has no <math.h>, hence no INFINITY macro): the fp32 bit pattern 0xff800000.
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// The softmax exponent (x − m)·a of rungs 0–1, for a row max m (finite) and a = |scale| >= 0: the
// subtraction comes first, exact when x is within 2x of m, so large logits lose nothing to rounding
// (issue 6). A masked key (x = −inf) gives −inf, a = 0 the uniform 0 with no 0·inf = NaN, and when x − m
// overflows (scores of opposite signs beyond ±FLT_MAX/2) the two products are subtracted instead.
__device__ __forceinline__ float scaled_gap(float x, float m, float a) {
    if (x == neg_inf()) return neg_inf();
    const float d = x - m;
    return isinf(d) ? fmaf(x, a, -m * a) : d * a;
}

__device__ __forceinline__ int thread_row() { return threadIdx.x / GRID_DIM; }
__device__ __forceinline__ int thread_col() { return threadIdx.x % GRID_DIM; }

// Load 8 consecutive bf16 values (16 bytes) and store them widened to fp32 at dst (16-byte
// aligned). Out-of-range rows are stored as zeros so that tails contribute nothing.
__device__ __forceinline__ void load8_bf16_as_f32(float* dst, const __nv_bfloat16* src, bool valid) {
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    if (valid) raw = *reinterpret_cast<const uint4*>(src);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float2 f0 = __bfloat1622float2(h[0]);
    const float2 f1 = __bfloat1622float2(h[1]);
    const float2 f2 = __bfloat1622float2(h[2]);
    const float2 f3 = __bfloat1622float2(h[3]);
    reinterpret_cast<float4*>(dst)[0] = make_float4(f0.x, f0.y, f1.x, f1.y);
    reinterpret_cast<float4*>(dst)[1] = make_float4(f2.x, f2.y, f3.x, f3.y);
}

// Store 4 consecutive fp32 values as bf16 (8 bytes, round to nearest even).
__device__ __forceinline__ void store4_f32_as_bf16(__nv_bfloat16* dst, float a, float b, float c, float d) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(a, b);
    __nv_bfloat162 hi = __floats2bfloat162_rn(c, d);
    uint2 packed;
    packed.x = *reinterpret_cast<unsigned*>(&lo);
    packed.y = *reinterpret_cast<unsigned*>(&hi);
    *reinterpret_cast<uint2*>(dst) = packed;
}
