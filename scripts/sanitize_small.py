"""Run rungs once each on small ragged shapes, for compute-sanitizer (memcheck, racecheck, synccheck).

Usage: compute-sanitizer --tool racecheck python scripts/sanitize_small.py [rung ... | features [rung ...] |
fp16 [rung ...]]

``features`` runs the top rung's compile-time variants (causal, GQA, LSE, strided, head_dim 64/256, the long-K/V
tiles on the small shapes); ``fp16``
its FP16 variants (the same set on fp16 inputs, and inputs whose rows take the fp16-P slow path); ``long`` the
long-K/V tiles alone (bf16 and fp16, on inputs of size 1e4 and 30: where a shape has more than one 80-key K/V tile,
bf16 rows fail their kept-reference votes on later tiles and take the full path; fp16 rows of size 1e4 take the
shifted-P path). Rung numbers after ``features``, ``fp16`` or ``long`` run
those rungs' variants instead of the top rung's.
"""

import dataclasses
import math
import sys

import torch

from attnclimb import rungs
from attnclimb.reference import attention_exact, rel_l2
from attnclimb.runtime.launch import run_rung

# The last shape has more work tiles (3 x 100) than an H200 has SMs: a persistent rung's CTAs loop.
SHAPES = [(1, 1, 129, 200), (1, 2, 64, 65), (1, 100, 257, 300)]


def one(r, b, h, sq, sk, d=128, h_kv=None, causal=False, lse=False, strided=False, dtype=torch.bfloat16, big=1.0):
    h_kv = h_kv or h
    q = (torch.randn(b, h, sq, d, device="cuda") * big).to(dtype)
    k = (torch.randn(b, h_kv, sk, d, device="cuda") * big).to(dtype)
    v = torch.randn(b, h_kv, sk, d, device="cuda").to(dtype)
    if strided:  # BSHD views, as a model hands them over
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    o = torch.full_like(q.contiguous(), float("nan"))
    lse_t = torch.full((b, h, sq), float("nan"), device="cuda") if lse else None
    run_rung(r, q, k, v, o, 1 / math.sqrt(d), causal=causal, lse=lse_t)
    torch.cuda.synchronize()
    err = rel_l2(o, attention_exact(q, k, v, causal=causal))
    tag = f"{r.key} {dtype} d{d} {b}x{h}/{h_kv}x{sq}x{sk} causal={causal} lse={lse} strided={strided} big={big}"
    print(f"{tag}: rel_l2 {err:.2e}", flush=True)


def features(top):
    for b, h, sq, sk in SHAPES:
        one(top, b, h, sq, sk, causal=True)
        one(top, b, h, sq, sk, lse=True)
        one(top, b, h, sq, sk, strided=True)
        if h % 2 == 0:
            one(top, b, h, sq, sk, h_kv=h // 2, causal=True, lse=True)
        for d in top.head_dims:
            if d != 128:
                one(top, b, h, sq, sk, d=d)
                one(top, b, h, sq, sk, d=d, causal=True, lse=True)
        if top.long_kv:  # the long-K/V tiles (three consumer warpgroups), forced onto the small shapes
            long = dataclasses.replace(top, **top.long_kv[1])
            one(long, b, h, sq, sk)
            one(long, b, h, sq, sk, lse=True, strided=True, h_kv=h // 2 if h % 2 == 0 else None)
    # bf16 rows at |max·c| ~ 2^27, where the lazy rescale's votes differ between the warps of a warpgroup (a
    # wgmma wait in a warp-uniform branch would be executed at different places: synccheck's case), and K/V
    # long enough for several steady-loop tiles
    for b, h, sq, sk in SHAPES[1:] + [(1, 4, 128, 700)]:
        one(top, b, h, sq, sk, big=1e4)
        one(top, b, h, sq, sk, causal=True, lse=True, big=1e4)


def fp16(top):
    f16 = torch.float16
    for b, h, sq, sk in SHAPES:
        one(top, b, h, sq, sk, dtype=f16)
        one(top, b, h, sq, sk, causal=True, lse=True, dtype=f16)
        one(top, b, h, sq, sk, strided=True, dtype=f16)
        if h % 2 == 0:
            one(top, b, h, sq, sk, h_kv=h // 2, causal=True, lse=True, dtype=f16)
        for d in top.head_dims:
            one(top, b, h, sq, sk, d=d, dtype=f16)
        # Q and K of size ~1e4: |max·c| ~ 2^27, rows that need the fp16-P shift (the slow path)
        one(top, b, h, sq, sk, lse=True, dtype=f16, big=1e4)


def long_kv(top):
    long = dataclasses.replace(top, **top.long_kv[1])  # the long-K/V tiles, forced onto the small shapes
    for b, h, sq, sk in SHAPES + [(1, 4, 200, 700)]:
        for dtype in (torch.bfloat16, torch.float16):
            one(long, b, h, sq, sk, dtype=dtype, big=1e4)
            one(long, b, h, sq, sk, lse=True, strided=True, h_kv=h // 2 if h % 2 == 0 else None, dtype=dtype, big=30.0)


args = sys.argv[1:]
modes = {"features": features, "fp16": fp16, "long": long_kv}
if args[:1] and args[0] in modes:
    for n in [int(a) for a in args[1:]] or [rungs.TOP.number]:
        modes[args[0]](rungs.get(n))
else:
    for n in [int(a) for a in args] or [r.number for r in rungs.RUNGS]:
        r = rungs.get(n)
        for b, h, sq, sk in SHAPES:
            one(r, b, h, sq, sk)
