// cp_async_tiles.cuh — rung 3's idea, kept by rung 4: K/V (and Q) tiles copied with cp.async into
// shared memory whose 16-byte chunks are XOR-swizzled, and the ldmatrix addresses into such tiles.
// PTX ISA: "cp.async", "cp.async.commit_group", "cp.async.wait_group", "ldmatrix".
#pragma once

#include "common.cuh"

constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte chunks in one 128-column row

// 16 bytes global -> shared, asynchronously (bypassing L1 and registers). src_bytes is 16 or 0; the
// part of the 16 bytes past src_bytes is filled with zeros, so 0 writes a zero chunk and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}

// Close the group of cp.async issued by this thread since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: dense 128-bf16 rows, 16-byte chunks XOR-swizzled
// ---------------------------------------------------------------------------------------------

// Element offset of (row, col) in a swizzled tile: chunk (col / 8) of row r lives at chunk
// (col / 8) ^ (r % 8). A dense row is 256 bytes, so without the swizzle the 8 rows of an ldmatrix
// 8x8 matrix (same chunk, 8 consecutive rows) would all sit in the same 4 banks: an 8-way conflict.
// With it they land in 8 different chunks of one 128-byte span: all 32 banks, one wavefront. The
// copies are conflict-free too: 8 consecutive threads write chunks 0-7 (or 8-15) of one row, which
// the XOR only permutes.
__device__ __forceinline__ int smem_offset(int row, int col) {
    return row * HEAD_DIM + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

// Start copying a ROWS x 128 bf16 tile, row-major in global memory, into swizzled shared memory.
// Rows at or past valid_rows are zero-filled; their source address is clamped to the last valid row
// (valid_rows >= 1 for every tile loaded), so no out-of-bounds address is ever formed. Completion:
// cp_async_wait.
//
// Thread tid copies chunk tid % 16 of rows tid / 16 + i·(NUM_THREADS / 16): one column, so the source
// and destination of copy i are the thread's first ones plus compile-time offsets (the swizzle key
// row % 8 is the same for all i because NUM_THREADS / 16 is a multiple of 8), and the per-tile
// address work is one predicate and one select per copy instead of a dozen live registers.
template <int ROWS>
__device__ __forceinline__ void load_tile_async(bf16* dst, const bf16* src, int valid_rows, int tid) {
    constexpr int PER_THREAD = ROWS * CHUNKS_PER_ROW / NUM_THREADS;
    constexpr int ROWS_PER_PASS = NUM_THREADS / CHUNKS_PER_ROW;
    const int row0 = unsigned(tid) / CHUNKS_PER_ROW, col = (unsigned(tid) % CHUNKS_PER_ROW) * 8;
    const uint32_t dst0 = smem_addr(dst + smem_offset(row0, col));
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
        const int row = row0 + i * ROWS_PER_PASS;
        cp_async_16(dst0 + i * ROWS_PER_PASS * HEAD_DIM * 2,
                    src + (min(row, valid_rows - 1) * HEAD_DIM + col), row < valid_rows ? 16 : 0);
    }
}

// Flip the sign of every element this thread's load_tile_async wrote (same chunk mapping): after
// cp_async_wait those writes are visible to this thread, so no barrier is needed before the flip.
// Flipping bf16 sign bits is exact.
template <int ROWS>
__device__ __forceinline__ void negate_tile(bf16* tile, int tid) {
    constexpr int PER_THREAD = ROWS * CHUNKS_PER_ROW / NUM_THREADS;
    constexpr int ROWS_PER_PASS = NUM_THREADS / CHUNKS_PER_ROW;
    const int row0 = unsigned(tid) / CHUNKS_PER_ROW, col = (unsigned(tid) % CHUNKS_PER_ROW) * 8;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {
        uint4* chunk = reinterpret_cast<uint4*>(tile + smem_offset(row0 + i * ROWS_PER_PASS, col));
        chunk->x ^= 0x80008000u, chunk->y ^= 0x80008000u, chunk->z ^= 0x80008000u, chunk->w ^= 0x80008000u;
    }
}

// ldmatrix row addresses. a-layout: the lane's row address such that the four matrices are the four
// 8x8 quarters of a 16x16 block in A-fragment order: [rows 0-7 | rows 8-15] x [cols 0-7 | cols 8-15]
// -> a0, a1, a2, a3. With .trans on a row-major V block (rows = keys, cols = head dims) the same
// addresses give B fragments of two n8 tiles: r0, r1 = (b0, b1) of columns col0..col0+7 and
// r2, r3 = (b0, b1) of columns col0+8..col0+15.
// b-layout (no .trans) on a row-major K block: matrices are [keys n0..n0+7, dims k0..k0+7],
// [keys n0..n0+7, dims k0+8..], [keys n0+8.., dims k0..], [keys n0+8.., dims k0+8..], i.e.
// r0, r1 = (b0, b1) of the n8 tile of keys n0.. and r2, r3 = (b0, b1) of the tile of keys n0+8..
//
// With the swizzle an address is no longer linear in (row0, col0); precomputing one address per
// block would take dozens of registers. Instead: every block starts on a multiple of 8 rows, so a
// lane's swizzle key (row % 8) is fixed, and for a column col0 that is a multiple of 16 the lane's
// 16-byte chunk is (col0 / 8) XOR (lane's own chunk in block (0, 0)), col0 / 8 being even. In bytes,
// with the tile 256-byte aligned (bits 0-7 of its address zero):
//     addr(row0, col0) = (base XOR 2·col0) + 256·row0,     base = lane's address in block (0, 0)
// (2·col0 only touches bits 5-7, which the tile address and 256·row0 leave alone). One register per
// tile, one LOP3 per distinct col0, the row offset an immediate of the ldmatrix.
__device__ __forceinline__ uint32_t a_lane_base(uint32_t tile, int lane) {
    return tile + 2 * smem_offset(lane & 15, (lane >> 4) * 8);
}

__device__ __forceinline__ uint32_t b_lane_base(uint32_t tile, int lane) {
    return tile + 2 * smem_offset((lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 8);
}

// Address of the lane's row of the 16x16 block at (row0, col0); row0 a multiple of 8, col0 of 16.
__device__ __forceinline__ uint32_t block_addr(uint32_t base, int row0, int col0) {
    return (base ^ (2 * col0)) + row0 * HEAD_DIM * 2;
}
