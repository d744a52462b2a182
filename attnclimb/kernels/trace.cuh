// trace.cuh — measured timelines (issue 11): %globaltimer stamps per warpgroup and phase, read back by
// `python -m attnclimb trace RUNG` (attnclimb/trace.py) and drawn as a Gantt chart.
//
// Off by default. Without -DTRACE=1 every TRACE_* macro below expands to nothing and this header
// declares nothing, so an untraced build is the source without its TRACE_* lines: the same machine code
// (tests/test_trace_cpu.py compiles both and compares their code sections). The host defines TRACE=1,
// TRACE_CTAS and TRACE_EVENTS (and TRACE_CLOCK=1 on request) only for trace builds
// (attnclimb.trace.traced), and the compile cache keys builds by their macros, so a traced cubin is never
// served for an untraced one or the other way round.
//
// With TRACE=1 the CTAs with blockIdx.x < TRACE_CTAS record; in each of their warpgroups one thread
// writes, lane 0 of the warpgroup's first warp (threadIdx.x % 128 == 0). An event is a phase of that
// thread's program between two stamps, 64-bit reads of %globaltimer (PTX ISA "Special Registers:
// %globaltimer", a nanosecond timer common to the GPU; how often it ticks is the GPU's business, and the
// decoder reports the step it saw) or, with TRACE_CLOCK=1, of %clock64 (this SM's cycle counter):
//     TRACE_BEGIN(WAIT_K);
//     hop::mbar_wait(&bar_k[slot], ring.phase);
//     TRACE_END(WAIT_K);
// Every TRACE_* use is a statement on a line of its own (the SASS test strips those lines), and phases do
// not nest (one open stamp per thread; a CPU test checks that BEGIN and END alternate in every kernel).
// A stamp is an asm volatile with a "memory" clobber: it stays in order with the kernel's other asm
// volatile statements (mbarrier waits, wgmma issue / commit / wait, named barriers, ldmatrix) and its
// memory accesses; the compiler may still move a few independent arithmetic instructions across it, so a
// phase boundary is exact to within a few instructions.
//
// The buffer (docs/kernel-abi.md, "Trace builds") is the global `attn_trace` below, found by name with
// cuLibraryGetGlobal, so no kernel argument changes. It holds one slot of TRACE_EVENTS + 1 uint4 per
// (CTA, warpgroup), slot (cta * NUM_THREADS / 128 + wg):
//     slot[0]      = {count, %smid, blockIdx.x, MAGIC}    count = events ended so far
//     slot[1 + i]  = {t0 low, t0 high, t1 low, code}     event i < TRACE_EVENTS
// t1 = t0 + (t1 low - t0 low) mod 2^32 (a phase is shorter than 2^32 ticks). Events past TRACE_EVENTS are
// counted in `count` but not written: an overflow is reported, never out of bounds. The host zeroes the
// buffer before the measured launch; a slot without the magic did not run (grid < TRACE_CTAS).
#pragma once

#ifndef TRACE
#define TRACE 0
#endif

#if TRACE

#include "common.cuh"

#ifndef TRACE_CTAS
#define TRACE_CTAS 4
#endif
#ifndef TRACE_EVENTS
#define TRACE_EVENTS 2047
#endif
#ifndef TRACE_CLOCK
#define TRACE_CLOCK 0
#endif

namespace tracing {

constexpr int WGS = NUM_THREADS / 128;   // warpgroups per CTA (Layout.wgs on the host)
constexpr int SLOT = TRACE_EVENTS + 1;   // uint4 per (CTA, warpgroup): header + events
constexpr uint32_t MAGIC = 0x43525441u;  // "ATRC" in little-endian bytes
static_assert(NUM_THREADS % 128 == 0, "trace slots are per warpgroup");
static_assert(TRACE_CTAS >= 1 && TRACE_EVENTS >= 1, "TRACE_CTAS and TRACE_EVENTS must be positive");

// Event codes: phase in bits 0-7 (0 wait, 1 S, 2 softmax, 3 PV, 4 epilogue, 5 TMA issue), what in bits
// 8-15. attnclimb/trace.py decodes them with the same table (a CPU test compares the two).
constexpr uint32_t WAIT_Q = 0x0100;         // Q tile landed (full barrier)
constexpr uint32_t WAIT_K = 0x0200;         // K tile landed
constexpr uint32_t WAIT_V = 0x0300;         // V tile landed
constexpr uint32_t WAIT_KV_EMPTY = 0x0400;  // producer: a K/V slot released by the consumers
constexpr uint32_t WAIT_K_EMPTY = 0x0500;   // producer: a K slot released
constexpr uint32_t WAIT_V_EMPTY = 0x0600;   // producer: a V slot released
constexpr uint32_t WAIT_Q_EMPTY = 0x0700;   // producer: the Q buffer released (persistent rungs)
constexpr uint32_t WAIT_TURN = 0x0800;      // ping-pong: this warpgroup's turn (named barrier)
constexpr uint32_t WAIT_CTA = 0x0900;       // __syncthreads
constexpr uint32_t S = 0x0001;              // S = Q·Kᵀ, issue to completion
constexpr uint32_t SOFTMAX = 0x0002;        // mask, online softmax, O rescale, P packing
constexpr uint32_t PV = 0x0003;             // O += P·V (until its completion)
constexpr uint32_t EPILOGUE = 0x0004;       // O / l, bf16, stores
constexpr uint32_t TMA_Q = 0x0105;          // issue of the Q tile's TMA loads
constexpr uint32_t TMA_KV = 0x0205;         // ... of a K and a V tile
constexpr uint32_t TMA_K = 0x0305;          // ... of a K tile
constexpr uint32_t TMA_V = 0x0405;          // ... of a V tile

// The stamp: %globaltimer (ns, one clock for the whole GPU), or with TRACE_CLOCK=1 %clock64 (cycles of
// this SM's counter: finer, but not comparable between SMs), should the global timer tick too coarsely
// to show phases of a few hundred nanoseconds (the decoder reports the step it saw).
__device__ __forceinline__ uint64_t stamp() {
    uint64_t t;
#if TRACE_CLOCK
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
#else
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
#endif
    return t;
}

__device__ __forceinline__ uint32_t smid() {
    uint32_t s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

}  // namespace tracing

extern "C" {
// The trace buffer: TRACE_CTAS x WGS slots (see the top of this file).
__device__ uint4 attn_trace[TRACE_CTAS * tracing::WGS * tracing::SLOT];
}

namespace tracing {

// One per thread; only the writer thread of a traced CTA's warpgroup has a slot.
struct Recorder {
    uint4* slot;  // this (CTA, warpgroup)'s header, nullptr when this thread does not record
    uint32_t n;   // events ended so far (may pass TRACE_EVENTS: counted, not written)

    __device__ __forceinline__ static Recorder make() {
        Recorder r{nullptr, 0};
        if (blockIdx.x < TRACE_CTAS && threadIdx.x % 128 == 0) {
            r.slot = attn_trace + (blockIdx.x * WGS + threadIdx.x / 128) * SLOT;
            *r.slot = make_uint4(0, smid(), blockIdx.x, MAGIC);
        }
        return r;
    }
    __device__ __forceinline__ void begin() {
        if (slot != nullptr) {
            const uint64_t t = stamp();
            if (n < TRACE_EVENTS) *reinterpret_cast<uint64_t*>(slot + 1 + n) = t;
        }
    }
    __device__ __forceinline__ void end(uint32_t code) {
        if (slot != nullptr) {
            const uint64_t t = stamp();
            if (n < TRACE_EVENTS) reinterpret_cast<uint2*>(slot + 1 + n)[1] = make_uint2(uint32_t(t), code);
            ++n;
            slot->x = n;  // every time: a warpgroup that returns early leaves a valid count
        }
    }
};

}  // namespace tracing

#define TRACE_INIT() tracing::Recorder trace_rec_ = tracing::Recorder::make()
#define TRACE_BEGIN(event) ((void)tracing::event, trace_rec_.begin())
#define TRACE_END(event) trace_rec_.end(tracing::event)

#else  // !TRACE: nothing at all

#define TRACE_INIT()
#define TRACE_BEGIN(event)
#define TRACE_END(event)

#endif
