"""Quick timing for iteration (not the benchmark): rungs vs SDPA backends at head_dim 128, 16 heads,
batch*seqlen = 16384. Usage: python scripts/quick_time.py RUNGS SEQLENS   e.g. "2,3,4" "4096,16384"."""

import sys

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnclimb

rung_list = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "4").split(",")]
seqlens = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "4096").split(",")]
print(f"{'impl':>12} " + " ".join(f"{s:>14}" for s in seqlens))
rows = {}
for s in seqlens:
    b, h, d = 16384 // s, 16, 128
    sets = [tuple(torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(3)]
    flops = 4 * b * h * s * s * d
    impls = {f"rung{r:02d}": (lambda q, k, v, r=r: attnclimb.attention(q, k, v, rung=r)) for r in rung_list}
    for name, be in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]:
        def f(q, k, v, be=be):
            with sdpa_kernel(be):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        impls[name] = f
    for name, fn in impls.items():
        i = [0]
        def step(fn=fn):
            i[0] = (i[0] + 1) % len(sets)
            fn(*sets[i[0]])
        try:
            ms = triton.testing.do_bench(step, warmup=100, rep=400, return_mode="median")
            rows.setdefault(name, {})[s] = flops / ms / 1e9
        except Exception as exc:
            rows.setdefault(name, {})[s] = float("nan")
            print(name, s, "error", exc)
for name, vals in rows.items():
    print(f"{name:>12} " + " ".join(f"{vals[s]:7.1f} {vals[s] / rows['cudnn'][s]:5.2f}x" for s in seqlens))
