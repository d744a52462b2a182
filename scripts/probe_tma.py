"""Device probe: build a 3-D tensor map the way the launcher does, TMA-load one box, and check the
128-byte swizzle pattern and the zero fill past seqlen. Prints OK or what differs."""

import sys

import cuda.pathfinder
import numpy as np
import torch
from cuda.core import Device, LaunchConfig, ObjectCode, Program, ProgramOptions, launch

from attnclimb.runtime.launch import tensor_map

SRC = r"""
#include <cuda_bf16.h>
struct alignas(64) TmaDesc { unsigned long long opaque[16]; };
extern "C" __global__ void probe(const __grid_constant__ TmaDesc tmap, __nv_bfloat16* out, int col, int row,
                                 int bh, int bytes) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar;
  unsigned bar_addr = (unsigned)__cvta_generic_to_shared(&bar);
  unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_addr));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar_addr), "r"(bytes));
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];"
      :: "r"(dst), "l"(&tmap), "r"(col), "r"(row), "r"(bh), "r"(bar_addr) : "memory");
  }
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n @!p bra W;\n}"
               :: "r"(bar_addr));
  for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) out[i] = reinterpret_cast<__nv_bfloat16*>(smem)[i];
}
"""

dev = Device(0)
dev.set_current()
inc = cuda.pathfinder.find_nvidia_header_directory("cudart")
prog = Program(SRC, "c++", ProgramOptions(arch="sm_90a", std="c++17", include_path=[inc]))
kern = ObjectCode.from_cubin(prog.compile("cubin").code).get_kernel("probe")
bh, seqlen, rows = 3, 100, 64
x = (torch.arange(bh * seqlen * 128, device="cuda", dtype=torch.float32) % 251).to(torch.bfloat16).view(bh, seqlen, 128)
tm = tensor_map(x, rows)
stream = dev.create_stream(torch.cuda.current_stream())
ok = True
for col, row, b in [(0, 0, 1), (64, 0, 2), (0, 64, 1)]:  # the last box runs 28 rows past seqlen=100
    out = torch.zeros(rows * 64, device="cuda", dtype=torch.bfloat16)
    launch(
        stream,
        LaunchConfig(grid=1, block=128, shmem_size=rows * 128 + 1024),
        kern,
        tm,
        out.data_ptr(),
        np.int32(col),
        np.int32(row),
        np.int32(b),
        np.int32(rows * 128),
    )
    torch.cuda.synchronize()
    got = out.view(rows, 64).cpu().float().numpy()
    exp = np.zeros((rows, 64), np.float32)
    src = x[b].float().cpu().numpy()
    for r in range(rows):  # smem row r holds global row row+r; 16-byte chunk c lands at chunk c ^ (r % 8)
        for c in range(8):
            vals = src[row + r, col + 8 * c : col + 8 * c + 8] if row + r < seqlen else np.zeros(8)
            exp[r, 8 * (c ^ (r % 8)) : 8 * (c ^ (r % 8)) + 8] = vals
    same = np.array_equal(got, exp)
    ok &= same
    print(f"TMA box col={col} row={row} bh={b}: {'OK' if same else 'MISMATCH'}")
    if not same:
        print("got row0", got[0, :16], "\nexp row0", exp[0, :16], "\ngot row1", got[1, :16], "\nexp row1", exp[1, :16])
print("TMA probe:", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
