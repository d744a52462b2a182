// abi.cuh — the compile-time half of the contract between attnclimb/rungs.py and every kernel
// (docs/kernel-abi.md): the macros the host always defines, checked once here. SMEM_BYTES is the
// dynamic shared memory the host launches with (Rung.smem_bytes, derived in one place from the tile
// sizes and NUM_STAGES); each kernel static_asserts that its own layout needs exactly that, so a sweep
// that changes BLOCK_N or NUM_STAGES cannot overrun shared memory silently.
#pragma once

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined by the host (see attnclimb/rungs.py)"
#endif
#ifndef BLOCK_M
#error "BLOCK_M must be defined by the host (see attnclimb/rungs.py)"
#endif
#ifndef BLOCK_N
#error "BLOCK_N must be defined by the host (see attnclimb/rungs.py)"
#endif
#ifndef NUM_THREADS
#error "NUM_THREADS must be defined by the host (see attnclimb/rungs.py)"
#endif
#ifndef SMEM_BYTES
#error "SMEM_BYTES must be defined by the host (see attnclimb/rungs.py: Rung.smem_bytes)"
#endif
