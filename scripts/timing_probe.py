"""Which timing method separates close kernels best on a power-capped H200? (a device probe for the bench)

``python scripts/timing_probe.py [--shapes 4x16x4096,2x16x8192] [--impls rung13,rung14,rung15,rung16,sdpa_cudnn]
[--repeats 4] [--out FILE]``

Each method is run ``--repeats`` times per shape, the methods interleaved (A, B, C, A, B, C, ...) so that a drift
of the card hits them alike. A method's result is the bench's estimate, ms per call per implementation. What
matters is how much the estimate of a *ratio* (neighbouring rungs, rung / cuDNN) moves from one repeat to the
next: the spread is the bench's resolution.

Methods:
- ``win3x100``: the bench as it was (3 interleaved rounds; per round, do_bench with 25 ms warmup, 100 ms rep;
  median over rounds);
- ``win11x30``: 11 shorter rounds (5 ms warmup, 30 ms rep), the same total time;
- ``win5x400``: the A/B script's (5 rounds, 100 ms warmup, 400 ms rep): 4x the time;
- ``calls``: call-level interleaving: every repetition calls each implementation once (L2 cleared before each
  call, CUDA events around the call only), order rotated and reversed between repetitions; median over
  all calls; repetitions sized to the ``win3x100`` time.
"""

import argparse
import json
import statistics
import time

import torch
import triton.testing

from attnclimb.bench import peers, timing
from attnclimb.bench.shapes import Shape


def shape_of(spec):
    b, h, s = (int(x) for x in spec.split("x"))
    return Shape(name=f"b{b}h{h}s{s}", label=f"{s // 1024}k", batch=b, heads=h, seqlen_q=s, seqlen_k=s, head_dim=128)


STAMPS = []  # (method, impl index or None for all, wall start, wall end): to match nvidia-smi's clock samples


def windows(fns, rounds, warmup, rep):
    per = [[] for _ in fns]
    for r in range(rounds):
        for i in timing.round_order(len(fns), r, rounds):
            t0 = time.time()
            per[i].append(float(triton.testing.do_bench(fns[i], warmup=warmup, rep=rep, return_mode="median")))
            STAMPS.append((f"win{rounds}x{rep}", i, t0, time.time()))
    return [statistics.median(p) for p in per], per


def calls(fns, budget_ms, flush):
    n = len(fns)
    for f in fns:  # warm each for ~25 ms
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.025:
            f()
        torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for f in fns:
        f()
    e.record()
    torch.cuda.synchronize()
    reps = max(3, int(budget_ms / max(s.elapsed_time(e), 1e-3)))
    ev = [[] for _ in fns]
    for r in range(reps):
        start = (r // 2) % n
        order = [*range(start, n), *range(start)]
        for i in order[::-1] if r % 2 else order:
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fns[i]()
            b.record()
            ev[i].append((a, b))
        if r % 50 == 49:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times = [[a.elapsed_time(b) for a, b in e_] for e_ in ev]
    return [statistics.median(t) for t in times], reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x16x4096,2x16x8192")
    ap.add_argument("--impls", default="rung13,rung14,rung15,rung16,sdpa_cudnn")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--methods", default="win3x100,win11x30,win5x400,calls")
    args = ap.parse_args()
    impls = [i for i in peers.select_impls(impls_spec=args.impls) if i.available()[0]]
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    doc = {"impls": [i.key for i in impls], "shapes": []}
    for spec in args.shapes.split(","):
        shape = shape_of(spec)
        sets = timing.make_inputs(shape, 3)
        fns = []
        for impl in impls:
            prepared = [impl.prepare(*s) for s in sets]
            fns.append(timing.rotating(impl.call, prepared))
            fns[-1]()
        torch.cuda.synchronize()
        known = {"win3x100": (3, 25, 100), "win11x30": (11, 5, 30), "win5x400": (5, 100, 400), "calls": None}
        methods = {m: known[m] for m in args.methods.split(",")}
        res = {m: [] for m in methods}
        secs = dict.fromkeys(methods, 0.0)
        with torch.no_grad():
            for _ in range(args.repeats):
                for m, how in methods.items():
                    t0 = time.perf_counter()
                    w0 = time.time()
                    res[m].append(windows(fns, *how)[0] if how else calls(fns, 3 * 125 * len(fns), flush)[0])
                    secs[m] += time.perf_counter() - t0
                    if not how:
                        STAMPS.append(("calls", None, w0, time.time()))
        flops = shape.flops
        entry = {"shape": spec, "ms": res, "seconds": secs}
        doc["shapes"].append(entry)
        entry["stamps"] = list(STAMPS)
        STAMPS.clear()
        keys = [i.key for i in impls]
        print(f"\n== {spec}  (TFLOP/s per repeat; ratio spreads = stdev over repeats, %)")
        for m in methods:
            print(f"{m:9s} {secs[m] / args.repeats:5.1f} s/repeat")
            for j, k in enumerate(keys):
                vals = [flops / (r[j] * 1e-3) / 1e12 for r in res[m]]
                cv = statistics.pstdev(vals) / statistics.mean(vals) * 100
                print(f"   {k:12s} " + " ".join(f"{v:6.1f}" for v in vals) + f"   cv {cv:4.2f}")
            for j in range(1, len(keys)):
                rat = [r[j - 1] / r[j] for r in res[m]]
                print(
                    f"   {keys[j]}/{keys[j - 1]:10s} speedup "
                    + " ".join(f"{x:6.3f}" for x in rat)
                    + f"   sd {statistics.pstdev(rat) * 100:4.2f}"
                )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
