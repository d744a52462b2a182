"""Sweep a rung's tile sizes / stages on the GPU: check each variant, then time it.

Usage: python scripts/sweep.py RUNG 'JSON list of overrides' [SEQLENS]
e.g.   python scripts/sweep.py 4 '[{"block_n":64},{"block_n":128,"smem_bytes":163840}]' 4096,16384
An override dict sets Rung fields; key "defines" merges into extra_defines.
"""

import dataclasses
import json
import math
import sys

import torch
import triton.testing

from attnclimb import rungs
from attnclimb.reference import attention_exact, rel_l2
from attnclimb.runtime.launch import loaded, run_rung

base = rungs.get(int(sys.argv[1]))
variants = json.loads(sys.argv[2])
seqlens = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "4096,16384").split(",")]
cudnn = {}
for s in seqlens:
    b = 16384 // s
    q, k, v = (torch.randn(b, 16, s, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        ms = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                                     warmup=100, rep=300, return_mode="median")
    cudnn[s] = 4 * b * 16 * s * s * 128 / ms / 1e9
print("cudnn", {s: round(t, 1) for s, t in cudnn.items()})
for ov in variants:
    ov = dict(ov)
    defs = {**base.extra_defines, **ov.pop("defines", {})}
    r = dataclasses.replace(base, extra_defines=defs, **ov)
    try:
        q, k, v = (torch.randn(1, 3, n, 128, device="cuda", dtype=torch.bfloat16) for n in (333, 1000, 1000))
        o = torch.full_like(q, float("nan"))
        run_rung(r, q, k, v, o, 1 / math.sqrt(128))
        err = rel_l2(o, attention_exact(q, k, v))
        res = []
        for s in seqlens:
            b = 16384 // s
            sets = [tuple(torch.randn(b, 16, s, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(3)]
            out = torch.empty_like(sets[0][0])
            i = [0]
            def step():
                i[0] = (i[0] + 1) % 3
                run_rung(r, *sets[i[0]], out, 0.0884)
            ms = triton.testing.do_bench(step, warmup=100, rep=300, return_mode="median")
            t = 4 * b * 16 * s * s * 128 / ms / 1e9
            res.append(f"{s}: {t:6.1f} ({t / cudnn[s]:.2f}x)")
        lr = loaded(r, 0)
        regs = [x.registers for x in lr.compiled.resources]
        print(f"{json.dumps(ov)} {defs} err={err:.2e} regs={regs} ctas/SM={lr.ctas_per_sm()} | " + "  ".join(res),
              flush=True)
    except Exception as exc:
        print(f"{json.dumps(ov)} {defs} FAILED: {str(exc)[:300]}", flush=True)
