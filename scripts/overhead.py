"""Host-side cost of one attnclimb.attention call (validation, tensor maps, launch), in microseconds:
many calls on a tiny problem, so the CPU side, not the kernel, sets the pace."""

import time

import torch

import attnclimb
from attnclimb import rungs

q, k, v = (torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for r in (4, 8):
    for _ in range(50):
        attnclimb.attention(q, k, v, rung=r)
    torch.cuda.synchronize()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        attnclimb.attention(q, k, v, rung=r)
    torch.cuda.synchronize()
    print(f"{rungs.get(r).key}: {(time.perf_counter() - t0) / n * 1e6:.1f} us per call (host-bound)")
t0 = time.perf_counter()
for _ in range(2000):
    torch.nn.functional.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()
print(f"torch SDPA: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us per call")
