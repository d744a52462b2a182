// hopper.cuh — named device helpers for the Hopper rungs (5+), each a thin wrapper over one PTX
// instruction. Every helper cites the PTX ISA section (by title; numbering moves between ISA versions)
// it was written from, and the TMA tile and ring bookkeeping of rungs 5+. Only rungs 5 and above
// include this file.
//
//   TMA       : "Data Movement and Conversion Instructions: cp.async.bulk.tensor", "prefetch.tensormap"
//   mbarrier  : "Parallel Synchronization and Communication Instructions: mbarrier"
//   proxies   : "membar / fence" (fence.proxy.async) and "Memory Consistency Model: Proxies"
//   wgmma     : "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"
//               ("Matrix Descriptor Format", "Shared Memory Matrix Layout", "Register Fragments",
//                "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group")
//   setmaxnreg: "Miscellaneous Instructions: setmaxnreg"
//
// Conventions: shared-memory addresses passed to PTX are 32-bit `.shared::cta` window addresses
// (from __cvta_generic_to_shared); every asm that orders memory has a "memory" clobber.
#pragma once

#include "common.cuh"

// The tensor-map parameter type of the TMA ABI (docs/kernel-abi.md): an opaque CUtensorMap, 128 bytes.
struct alignas(64) TmaDesc {
    unsigned long long opaque[16];
};

#ifndef HOP_WGMMA_AB
#define HOP_WGMMA_AB ".bf16.bf16"
#endif

namespace hop {

// ---------------------------------------------------------------------------------------------
// Addresses
// ---------------------------------------------------------------------------------------------

// Round a shared-memory pointer up to a 1024-byte boundary. 128-byte-swizzled TMA destinations and
// wgmma operands repeat their swizzle pattern every 8 rows x 128 B = 1024 B, and both the TMA unit
// and the wgmma descriptor (base offset field = 0) assume the pattern starts at a 1024-B boundary.
// The dynamic shared-memory base is only guaranteed 16-B aligned, hence the +1 KB slack in rungs.py.
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
    const uint32_t a = smem_addr(p);
    return p + (((a + 1023u) & ~1023u) - a);
}

// ---------------------------------------------------------------------------------------------
// mbarrier (PTX ISA "mbarrier"). A 64-bit shared-memory object with a pending-arrival count and a
// pending-transaction (tx) byte count; a phase completes when both reach zero, then the phase bit
// flips and the counts re-arm. Waiters name the parity of the phase they wait for.
// ---------------------------------------------------------------------------------------------

// PTX ISA "mbarrier.init": expected arrival count for every phase.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Make mbarrier.init (a generic-proxy write) visible before any thread or the TMA unit (async proxy)
// uses the barrier. fence.mbarrier_init ("membar / fence") exists only in .release.cluster form; the proxy
// fence covers the async proxy. Follow with __syncthreads() for the other threads of the CTA.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// PTX ISA "mbarrier.arrive" with .expect_tx ("mbarrier.expect_tx"): one arrival plus
// "tx_bytes more bytes will be delivered by complete_tx" (the TMA loads signalling this barrier).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(tx_bytes)
                 : "memory");
}

// PTX ISA "mbarrier.arrive": one arrival (release semantics at CTA scope by default).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// PTX ISA "mbarrier.test_wait / mbarrier.try_wait", .parity variant: true once the phase with parity
// `parity` has completed (acquire semantics at CTA scope by default). try_wait may suspend the thread
// for a system-dependent time before returning false, so a plain retry loop is not a hot spin.
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    return done != 0;
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    while (!mbar_try_wait(bar, parity)) {
    }
}

// The phase bookkeeping of a loop over tiles in a ring of STAGES buffers. Tile n uses slot n % STAGES
// (the kernel computes it from its tile counter) and completes that slot's phase n / STAGES on each of
// the slot's barriers; `phase` is that phase's parity, carried across the loop and flipped by
// advance(slot) after the ring's last slot. A producer refilling a slot waits for the slot's "empty"
// barrier to complete the phase before: prev_phase(). (Carrying the slot index in here as well costs
// rung 5, at the 255-register cap, a spill with NVRTC 13.5; even deriving it inside a member function
// changed rungs 6-8's machine code and cost them 1-4 % on the H200. So the index stays in the kernel.)
template <int STAGES>
struct PipelineState {
    uint32_t phase = 0;
    __device__ __forceinline__ uint32_t prev_phase() const { return phase ^ 1; }
    // After the tile in ring slot `slot`: the next use of each slot is its next phase.
    __device__ __forceinline__ void advance(int slot) {
        if (slot == STAGES - 1) phase ^= 1;
    }
};

// ---------------------------------------------------------------------------------------------
// TMA (PTX ISA "cp.async.bulk.tensor", "prefetch / prefetch.tensormap")
// ---------------------------------------------------------------------------------------------

// Pull the 128-byte tensor map into the TMA unit's descriptor cache ahead of first use. `map` is the
// generic address of a __grid_constant__ kernel parameter (the form the ISA allows for tensorMap).
__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// One 3-D box global -> shared, completion signalled on `bar` as complete_tx(box bytes). The box
// shape, element type, swizzle and out-of-bounds fill live in the tensor map; coordinates are
// innermost-first: (c0 = column, c1 = row, c2 = batch*head). Elements outside the tensor are written
// as zero and still count toward the transaction bytes. The .shared::cluster destination accepts a
// CTA-local shared address (a non-cluster launch is a cluster of one). `dst` must be 1024-B aligned
// for the 128-B swizzle (the swizzle pattern is a function of the shared address bits [4,10)).
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaDesc* map, uint64_t* bar, int c0, int c1,
                                            int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
}

// The tiles of rungs 5+: a (rows x 128) bf16 tile is two 64-column panels of 128-B rows (the 128-B
// swizzle's row width), panel p at dst + p * rows * 128 B, each loaded as `rows / box_rows` boxes.
// Coordinates (col, row, bh), innermost first; rows past seqlen are zero-filled by the TMA unit and
// still count toward the barrier's transaction bytes (2 * rows * 128 B for the whole tile).
constexpr uint32_t PANEL_ROW_BYTES = 128;

__device__ __forceinline__ void tma_load_tile(unsigned char* dst, const TmaDesc* map, uint64_t* bar, int rows,
                                              int box_rows, int row0, int bh, int panels = 2) {
    for (int p = 0; p < panels; ++p)
        for (int r = 0; r < rows; r += box_rows)
            tma_load_3d(dst + (p * rows + r) * PANEL_ROW_BYTES, map, bar, p * 64, row0 + r, bh);
}

// The same tile through a 4-D map over a strided (batch, heads, seqlen, 128) tensor (innermost first:
// column, row, head, batch): a BSHD view or a slice of a fused QKV buffer is read where it lies.
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaDesc* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
        : "memory");
}

__device__ __forceinline__ void tma_load_tile_4d(unsigned char* dst, const TmaDesc* map, uint64_t* bar,
                                                 int rows, int box_rows, int row0, int head, int batch,
                                                 int panels = 2) {
    for (int p = 0; p < panels; ++p)
        for (int r = 0; r < rows; r += box_rows)
            tma_load_4d(dst + (p * rows + r) * PANEL_ROW_BYTES, map, bar, p * 64, row0 + r, head, batch);
}

// ---------------------------------------------------------------------------------------------
// Proxy fence (PTX ISA "membar / fence": fence.proxy.async). Shared memory written by ordinary
// st.shared (generic proxy) and then read by TMA stores or wgmma (async proxy) needs this fence first;
// so does memory read by ordinary loads (ldmatrix) and then overwritten by a TMA load (rung 5's ring).
// TMA-load -> wgmma needs none: both are async proxy, ordered by the mbarrier wait.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---------------------------------------------------------------------------------------------
// Named barriers (PTX ISA "bar, barrier"): hardware barriers 1..15 of the CTA (0 is __syncthreads'),
// each completing when `count` threads (a multiple of the warp size) have arrived. bar.sync arrives and
// waits; bar.arrive only arrives. Threads of a warp take part together. Rung 16 uses one per consumer
// warpgroup to make them take turns on the tensor cores (FlashAttention-3 Sec. 3.1).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(uint32_t id, uint32_t count) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// ---------------------------------------------------------------------------------------------
// setmaxnreg (PTX ISA "setmaxnreg"): re-balance registers between warpgroups. Executed by all warps of a
// warpgroup; counts are multiples of 8 in [24, 256]. Only honoured when the kernel has a register
// cap at entry (__launch_bounds__(threads, 1)); otherwise ptxas warns (C7508) and ignores it.
// ---------------------------------------------------------------------------------------------
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg count");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg count");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// ---------------------------------------------------------------------------------------------
// wgmma ordering (PTX ISA "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group"). All three are
// warpgroup-collective (.sync.aligned): every warp of the warpgroup executes them convergently.
//   wgmma_fence()      before the first wgmma that reads registers (accumulators or the A fragment)
//                      written by ordinary instructions since the last wgmma;
//   wgmma_commit()     closes the wgmmas issued so far into one wgmma-group;
//   wgmma_wait<N>()    blocks until at most N groups are pending; only then may the
//                      accumulators be read, and only then are the shared-memory operands free.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the computation of `x` above the next wgmma wait. ptxas schedules a wgmma.wait_group
// (WARPGROUP.DEPBAR) as early in its basic block as the registers allow, so arithmetic that the source
// puts between the issue of a wgmma group and its wait (the softmax under P·V: FlashAttention-3 Sec. 3.2)
// ends up after the wait, serialised with the GEMM. A shared-memory store stays before the wait, and with
// it everything the stored value depends on. `slot` is a per-thread scratch word (no other reader).
__device__ __forceinline__ void keep_above_wait(uint32_t slot, float x) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(slot), "f"(x) : "memory");
}

// Four 8 x 8 matrices of 16-bit elements from the warp's registers to shared memory (PTX ISA "stmatrix",
// sm_90): register i of each thread holds two elements of matrix i, row lane / 4, columns 2 (lane % 4) and
// 2 (lane % 4) + 1, which is the layout of an mma / wgmma accumulator's n8 tile once packed in pairs; lanes
// 8i .. 8i + 7 give the shared-memory addresses of matrix i's rows 0-7 (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(uint32_t row_addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(row_addr), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// a ^ b ^ c in one LOP3, written as PTX so that the compiler keeps the order of a running XOR as the source
// gives it (re-associated, a fold of values that come one after another can start from the last of them).
__device__ __forceinline__ uint32_t xor3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0x96;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Compiler-only fence on registers: an empty asm that "reads and writes" each register, so the
// compiler can neither move ordinary arithmetic on accumulators into the window between a wgmma
// issue and its wait, nor hoist reads of the results above the wait (volatile asms keep their order).
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N, int M>
__device__ __forceinline__ void reg_fence(float (&r)[N][M]) {
#pragma unroll
    for (int i = 0; i < N; ++i) reg_fence(r[i]);
}
template <int N, int M>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N][M]) {
#pragma unroll
    for (int i = 0; i < N; ++i) reg_fence(r[i]);
}

// ---------------------------------------------------------------------------------------------
// wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"), 64 bit:
//   bits  0-13  start address >> 4          bits 32-45  stride-dimension byte offset (SBO) >> 4
//   bits 16-29  leading-dimension byte offset (LBO) >> 4
//   bits 49-51  base offset (0: the swizzle pattern starts at a 1024-B boundary)
//   bits 62-63  swizzle mode: 0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B
// The layouts used here are the canonical 128-byte-swizzle ones of PTX ISA "Shared Memory Matrix
// Layout", which are exactly what a TMA box with CU_TENSOR_MAP_SWIZZLE_128B and a 128-B inner extent
// writes: rows of 128 B, 8-row atoms of 1024 B, the 16-B chunk c of row r stored at chunk c ^ (r % 8).
//
//  * K-major operand (contiguous along K; Q and K in S = Q K^T): the 8-row atoms follow each other
//    along M/N, so SBO = 1024 B (next 8 rows). A k16 slice is 32 B wide and lies inside one 128-B
//    swizzle row, so LBO is not used for swizzled K-major layouts (encoded as 1). The k-th 16-column
//    slice of a 64-column panel starts at +32*k bytes on the start address (the hardware applies the
//    XOR swizzle to the final address, so the start may sit inside an atom).
//  * MN-major operand (contiguous along N; V as the B operand of O = P V, tnspB = 1): an atom is
//    64 N-elements (128 B) x 8 K-rows; SBO = byte distance between consecutive groups of 8 K-rows
//    (1024 B here), LBO = byte distance between consecutive 64-element groups along N (the next
//    64-column panel of V).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t make_smem_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                         uint32_t sbo_bytes) {
    uint64_t d = 0;
    d |= static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4);
    d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
    d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
    d |= static_cast<uint64_t>(1) << 62;  // 128-byte swizzle
    return d;
}

// K-major tile whose 8-row atoms are 1024 B apart (a TMA 64-column panel).
__device__ __forceinline__ uint64_t desc_kmajor_sw128(uint32_t smem_addr) {
    return make_smem_desc_sw128(smem_addr, 16, 1024);
}

// MN-major tile: 64-wide N groups `n_group_stride` bytes apart (panel stride), 8-row K groups 1024 B
// apart.
__device__ __forceinline__ uint64_t desc_mnmajor_sw128(uint32_t smem_addr, uint32_t n_group_stride) {
    return make_smem_desc_sw128(smem_addr, n_group_stride, 1024);
}

// ---------------------------------------------------------------------------------------------
// wgmma.mma_async (PTX ISA "wgmma.mma_async"), .f32.bf16.bf16, shape m64nNk16, one warpgroup (128
// threads; warp w of the warpgroup owns rows 16w .. 16w+15 of the 64). The A and B types are the macro
// HOP_WGMMA_AB, ".bf16.bf16" unless a kernel defines it before including this file: the top rung's FP16
// variant sets ".f16.f16" (the same shapes, fragments and descriptors for both 16-bit types).
//
// Accumulator fragment (PTX ISA "Register Fragments", matrix D): for warp w, lane l = 4g + t, the N/2
// registers form N/8 groups of four, one per n8 column tile j, and
//     d[j][e]:  row 16w + g + 8*(e >> 1),  column 8j + 2t + (e & 1)
// i.e. each warp's part is exactly the mma.sync m16n8 C fragment of N/8 tiles side by side. The
// helpers take it as float[N/8][4] for that reason.
// A fragment from registers (16-bit types): four .b32 registers of two bf16 each (lower k in the low
// half): a[0] = (row g, k 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..) of
// the warp's 16 rows, the mma.sync m16n8k16 A layout. Hence the accumulator of S = Q K^T, rounded to
// bf16 pairs, IS the A fragment of P V: the k16 slice kv (keys 16kv .. 16kv+15) is
//     a = { pack(d[2kv][0..1]), pack(d[2kv][2..3]), pack(d[2kv+1][0..1]), pack(d[2kv+1][2..3]) }.
//
// `accumulate` = 0 makes the instruction ignore the old accumulator (D = A*B), 1 gives D += A*B.
// Every accumulator is a "+f" operand so the compiler treats it as read and written by the asm.
// ---------------------------------------------------------------------------------------------
// Accumulators of the n8 tiles j and j + 1 (8 registers).
#define HOP_ACC8(d, j)                                                                                    \
    "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3]), "+f"(d[(j) + 1][0]), "+f"(d[(j) + 1][1]), \
        "+f"(d[(j) + 1][2]), "+f"(d[(j) + 1][3])

// m64n64k16, A and B from shared memory (both K-major), fp32 accumulators: d[8][4].
// SCALE_A = -1 negates A (the imm-scale-a operand), e.g. for a negative softmax scale.
template <int SCALE_A>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                                   int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32" HOP_WGMMA_AB
        "\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
        " %32, %33, p, %35, 1, 0, 0;\n"  // scale-d, scale-a, scale-b, tnspA=0, tnspB=0
        "}\n"
        : HOP_ACC8(d, 0), HOP_ACC8(d, 2), HOP_ACC8(d, 4), HOP_ACC8(d, 6)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(SCALE_A));
}

// m64n80k16, A and B from shared memory (both K-major), fp32 accumulators: d[10][4]: the S of rung 12's
// long-K/V tiles (three warpgroups, 80-key K/V tiles at head_dim 128; Rung.long_kv).
template <int SCALE_A>
__device__ __forceinline__ void wgmma_m64n80k16_ss(float (&d)[10][4], uint64_t desc_a, uint64_t desc_b,
                                                   int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32" HOP_WGMMA_AB
        "\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39},\n"
        " %40, %41, p, %43, 1, 0, 0;\n"  // scale-d, scale-a, scale-b, tnspA=0, tnspB=0
        "}\n"
        : HOP_ACC8(d, 0), HOP_ACC8(d, 2), HOP_ACC8(d, 4), HOP_ACC8(d, 6), HOP_ACC8(d, 8)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(SCALE_A));
}

// m64n128k16, A and B from shared memory (both K-major), fp32 accumulators: d[16][4].
// SCALE_A = -1 negates A (the imm-scale-a operand), e.g. for a negative softmax scale.
template <int SCALE_A>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b,
                                                    int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32" HOP_WGMMA_AB
        "\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"
        " %64, %65, p, %67, 1, 0, 0;\n"  // scale-d, scale-a, scale-b, tnspA=0, tnspB=0
        "}\n"
        : HOP_ACC8(d, 0), HOP_ACC8(d, 2), HOP_ACC8(d, 4), HOP_ACC8(d, 6), HOP_ACC8(d, 8), HOP_ACC8(d, 10),
          HOP_ACC8(d, 12), HOP_ACC8(d, 14)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(SCALE_A));
}

// m64n176k16, A and B from shared memory (both K-major), fp32 accumulators: d[22][4].
// SCALE_A = -1 negates A (the imm-scale-a operand), e.g. for a negative softmax scale.
template <int SCALE_A>
__device__ __forceinline__ void wgmma_m64n176k16_ss(float (&d)[22][4], uint64_t desc_a, uint64_t desc_b,
                                                    int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %90, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n176k16.f32" HOP_WGMMA_AB
        "\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,\n"
        " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,\n"
        " %80, %81, %82, %83, %84, %85, %86, %87},\n"
        " %88, %89, p, %91, 1, 0, 0;\n"  // scale-d, scale-a, scale-b, tnspA=0, tnspB=0
        "}\n"
        : HOP_ACC8(d, 0), HOP_ACC8(d, 2), HOP_ACC8(d, 4), HOP_ACC8(d, 6), HOP_ACC8(d, 8), HOP_ACC8(d, 10),
          HOP_ACC8(d, 12), HOP_ACC8(d, 14), HOP_ACC8(d, 16), HOP_ACC8(d, 18), HOP_ACC8(d, 20)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(SCALE_A));
}

// m64n192k16, A and B from shared memory (both K-major), fp32 accumulators: d[24][4].
// SCALE_A = -1 negates A (the imm-scale-a operand), e.g. for a negative softmax scale.
template <int SCALE_A>
__device__ __forceinline__ void wgmma_m64n192k16_ss(float (&d)[24][4], uint64_t desc_a, uint64_t desc_b,
                                                    int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32" HOP_WGMMA_AB
        "\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,\n"
        " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,\n"
        " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95},\n"
        " %96, %97, p, %99, 1, 0, 0;\n"  // scale-d, scale-a, scale-b, tnspA=0, tnspB=0
        "}\n"
        : HOP_ACC8(d, 0), HOP_ACC8(d, 2), HOP_ACC8(d, 4), HOP_ACC8(d, 6), HOP_ACC8(d, 8), HOP_ACC8(d, 10),
          HOP_ACC8(d, 12), HOP_ACC8(d, 14), HOP_ACC8(d, 16), HOP_ACC8(d, 18), HOP_ACC8(d, 20), HOP_ACC8(d, 22)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(SCALE_A));
}

// m64n128k16, A from registers (4 x bf16x2 per thread), B from shared memory; tnspB is a
// template argument (1 = B is MN-major, i.e. contiguous along N). fp32 accumulators: d[16][4].
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32" HOP_WGMMA_AB
        "\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"
        " {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n"  // scale-d, scale-a, scale-b, tnspB
        "}\n"
        : HOP_ACC8(d, 0), HOP_ACC8(d, 2), HOP_ACC8(d, 4), HOP_ACC8(d, 6), HOP_ACC8(d, 8), HOP_ACC8(d, 10),
          HOP_ACC8(d, 12), HOP_ACC8(d, 14)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// The same for O of 64 and 256 columns (head_dim 64 and 256; issue 8).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32" HOP_WGMMA_AB
        "\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
        " {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"  // scale-d, scale-a, scale-b, tnspB
        "}\n"
        : HOP_ACC8(d, 0), HOP_ACC8(d, 2), HOP_ACC8(d, 4), HOP_ACC8(d, 6)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[32][4], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32" HOP_WGMMA_AB
        "\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,\n"
        " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,\n"
        " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,\n"
        " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,\n"
        " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},\n"
        " {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n"  // scale-d, scale-a, scale-b, tnspB
        "}\n"
        : HOP_ACC8(d, 0), HOP_ACC8(d, 2), HOP_ACC8(d, 4), HOP_ACC8(d, 6), HOP_ACC8(d, 8), HOP_ACC8(d, 10),
          HOP_ACC8(d, 12), HOP_ACC8(d, 14), HOP_ACC8(d, 16), HOP_ACC8(d, 18), HOP_ACC8(d, 20),
          HOP_ACC8(d, 22), HOP_ACC8(d, 24), HOP_ACC8(d, 26), HOP_ACC8(d, 28), HOP_ACC8(d, 30)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// m64nNk16 RS for an N (= HEAD_DIM, the width of O) chosen at compile time.
template <int N, int TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                         int accumulate) {
    if constexpr (N == 64) {
        wgmma_m64n64k16_rs<TRANS_B>(d, a, desc_b, accumulate);
    } else if constexpr (N == 128) {
        wgmma_m64n128k16_rs<TRANS_B>(d, a, desc_b, accumulate);
    } else if constexpr (N == 256) {
        wgmma_m64n256k16_rs<TRANS_B>(d, a, desc_b, accumulate);
    } else {
        static_assert(N == 64, "wgmma_rs: add an m64nNk16 variant for this N");
    }
}

#undef HOP_ACC8

// m64nNk16 SS for an N (= BLOCK_N) chosen at compile time; SCALE_A = +1 or -1.
template <int N, int SCALE_A = 1>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b,
                                         int accumulate) {
    static_assert(SCALE_A == 1 || SCALE_A == -1, "imm-scale-a is +1 or -1");
    if constexpr (N == 64) {
        wgmma_m64n64k16_ss<SCALE_A>(d, desc_a, desc_b, accumulate);
    } else if constexpr (N == 80) {
        wgmma_m64n80k16_ss<SCALE_A>(d, desc_a, desc_b, accumulate);
    } else if constexpr (N == 128) {
        wgmma_m64n128k16_ss<SCALE_A>(d, desc_a, desc_b, accumulate);
    } else if constexpr (N == 176) {
        wgmma_m64n176k16_ss<SCALE_A>(d, desc_a, desc_b, accumulate);
    } else if constexpr (N == 192) {
        wgmma_m64n192k16_ss<SCALE_A>(d, desc_a, desc_b, accumulate);
    } else {
        static_assert(N == 64, "wgmma_ss: add an m64nNk16 variant for this N");
    }
}

}  // namespace hop
