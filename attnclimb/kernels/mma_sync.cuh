// mma_sync.cuh — warp-level tensor-core helpers of rungs 2–5 (mma.sync and ldmatrix); the wgmma
// rungs (6 and up) do not include it. PTX ISA: "Warp-level matrix instructions: ldmatrix", "mma".
//   B (16x8) fragment of mma.m16n8k16: b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8..2t+9, n g)
#pragma once

#include "common.cuh"

// Four 8x8 b16 matrices; lane 8*i + r supplies the address of row r of matrix i, and register i of
// lane 4*r + c receives elements (r, 2c) and (r, 2c + 1) of matrix i (PTX ISA, "ldmatrix").
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Same, each 8x8 matrix transposed on the way: lane 4*r + c receives elements (2c, r) and (2c + 1, r).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a · b for one 16x8x16 tile: a is 16x16 (row-major fragment), b is 16x8 (column fragment).
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
