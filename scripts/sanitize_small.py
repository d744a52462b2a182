"""Run rungs once each on small ragged shapes, for compute-sanitizer (memcheck, racecheck, synccheck).

Usage: compute-sanitizer --tool racecheck python scripts/sanitize_small.py [rung ...]
"""

import math
import sys

import torch

from attnclimb import rungs
from attnclimb.reference import attention_exact, rel_l2
from attnclimb.runtime.launch import run_rung

sel = [int(a) for a in sys.argv[1:]] or [r.number for r in rungs.RUNGS]
for n in sel:
    r = rungs.get(n)
    # The last shape has more work tiles (3 x 100) than an H200 has SMs: a persistent rung's CTAs loop.
    for b, h, sq, sk in [(1, 1, 129, 200), (1, 2, 64, 65), (1, 100, 257, 300)]:
        q, k, v = (torch.randn(b, h, s, 128, device="cuda").to(torch.bfloat16) for s in (sq, sk, sk))
        o = torch.full_like(q, float("nan"))
        run_rung(r, q, k, v, o, 1 / math.sqrt(128))
        torch.cuda.synchronize()
        print(f"{r.key} {b}x{h}x{sq}x{sk}: rel_l2 {rel_l2(o, attention_exact(q, k, v)):.2e}", flush=True)
