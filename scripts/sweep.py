"""Sweep a rung's tile sizes / stages on the GPU: check each variant, then time it next to cuDNN.

Usage: python scripts/sweep.py RUNG 'JSON list of overrides' [SEQLENS]
e.g.   python scripts/sweep.py 8 '[{}, {"block_n":192,"kv_box_rows":192}]' 4k,16k   (smem_bytes follows)
An override dict sets Rung fields; its key "defines" merges into extra_defines.
"""

import dataclasses
import json
import math
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnclimb import rungs
from attnclimb.bench import shapes, timing
from attnclimb.reference import attention_exact, rel_l2
from attnclimb.runtime.launch import loaded, run_rung

base = rungs.get(int(sys.argv[1]))
variants = json.loads(sys.argv[2])
problems = [shapes.fa_shape(s) for s in shapes.parse_seqlens(sys.argv[3] if len(sys.argv) > 3 else "4k,16k")]
scale = 1 / math.sqrt(rungs.HEAD_DIM)


def time_tflops(shape, call):
    sets = timing.make_inputs(shape, timing.num_input_sets(shape.qkv_bytes(), timing.l2_cache_bytes()))
    ms = timing.median_ms(timing.rotating(lambda qkv: call(*qkv), sets), warmup_ms=100, rep_ms=300)
    return shapes.tflops(shape.flops, ms)


def sdpa_cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


cudnn = {p.name: time_tflops(p, sdpa_cudnn) for p in problems}
print("cudnn", {p.label: round(cudnn[p.name], 1) for p in problems})
for ov in variants:
    ov = dict(ov)
    defs = {**base.extra_defines, **ov.pop("defines", {})}
    r = dataclasses.replace(base, extra_defines=defs, **ov)
    try:
        q, k, v = (torch.randn(1, 3, n, 128, device="cuda", dtype=torch.bfloat16) for n in (333, 1000, 1000))
        o = torch.full_like(q, float("nan"))
        run_rung(r, q, k, v, o, scale)
        err = rel_l2(o, attention_exact(q, k, v))
        res = []
        for p in problems:
            out = torch.empty(p.batch, p.heads, p.seqlen_q, p.head_dim, device="cuda", dtype=torch.bfloat16)
            t = time_tflops(p, lambda q, k, v, r=r, out=out: run_rung(r, q, k, v, out, scale))
            res.append(f"{p.label}: {t:6.1f} ({t / cudnn[p.name]:.2f}x)")
        lr = loaded(r, 0)
        regs = [x.registers for x in lr.compiled.resources]
        print(
            f"{json.dumps(ov)} {defs} err={err:.2e} regs={regs} ctas/SM={lr.ctas_per_sm()} | " + "  ".join(res),
            flush=True,
        )
    except Exception as exc:
        print(f"{json.dumps(ov)} {defs} FAILED: {str(exc)[:300]}", flush=True)
