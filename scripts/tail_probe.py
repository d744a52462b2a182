"""Does the last partial wave cost what its tile count says? (rung 20's page, "Measured").

``python scripts/tail_probe.py [--out FILE] [--rounds 3]`` times, interleaved and with inputs rotated beyond L2,
rung 19, rung 20 (its launch: the tail split where ``runtime.launch.tail_split`` says so) and rung 20 with the
split switched off (the same kernel, no workspace: rung 19's schedule) on head counts that put the launch just
under, at and just over whole waves of 132 work tiles, and on the bench's head-line shapes. If the partial
wave costs a whole tile time, time(H) is flat between whole waves and jumps after each one; if the busy SMs
speed up while the others idle (the power cap), it grows smoothly with the tile count.
"""

import argparse
import json
import math

import torch
import triton.testing

from attnclimb import rungs
from attnclimb.bench import timing
from attnclimb.bench.shapes import Shape
from attnclimb.runtime import launch

# (B, H, S): 4k with 1 024 .. 1 536 work tiles of 128 rows (7.76 .. 11.6 waves), then the head-line shapes.
SHAPES = [
    (1, 32, 4096),
    (1, 33, 4096),
    (1, 34, 4096),
    (1, 40, 4096),
    (1, 41, 4096),
    (1, 48, 4096),
    (16, 16, 1024),
    (4, 16, 4096),
    (2, 16, 8192),
    (1, 16, 16384),
]


def plans(q, k, v, o, scale):
    """The three launches of one input set: rung 19, rung 20 as launched, rung 20 without its split."""
    r19, r20 = rungs.get(19), rungs.get(20)
    out = {
        "rung19": launch._plan(r19, q, k, v, o, scale, False, None),
        "rung20": launch._plan(r20, q, k, v, o, scale, False, None),
    }
    saved = launch.tail_split
    launch.tail_split = lambda *a: None
    try:
        out["rung20_nosplit"] = launch._plan(r20, q, k, v, o, scale, False, None)
    finally:
        launch.tail_split = saved
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tail_probe.json")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dev = torch.cuda.current_device()
    rows = []
    for b, h, s in SHAPES:
        shape = Shape(f"{b}x{h}x{s}", f"{b}x{h}x{s}", b, h, s, s)
        sets = timing.make_inputs(shape, timing.num_input_sets(3 * b * h * s * 128 * 2))
        scale = 1.0 / math.sqrt(128)
        o = torch.empty_like(sets[0][0])
        per_set = [plans(q, k, v, o, scale) for q, k, v in sets]
        names = list(per_set[0])
        tiles = rungs.get(20).num_m_blocks(s) * b * h
        ms = {n: [] for n in names}
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for n in order:
                i = [0]

                def call(n=n, i=i, per_set=per_set, o=o):
                    p = per_set[i[0] % len(per_set)][n]
                    i[0] += 1
                    launch.launch_plan(p, dev, o.data_ptr(), 0)

                ms[n].append(triton.testing.do_bench(call, warmup=25, rep=100))
        flops = 4 * b * h * s * s * 128
        row = {"shape": [b, h, s], "tiles": tiles, "waves": tiles / 132}
        row["split"] = per_set[0]["rung20"].ws_bytes > 0
        for n in names:
            med = sorted(ms[n])[len(ms[n]) // 2]
            row[n] = {"ms": med, "tflops": flops / med / 1e9, "rounds_ms": ms[n]}
        rows.append(row)
        print(
            f"{b}x{h}x{s:<6} tiles {tiles:5d} ({tiles / 132:5.2f} waves) split={row['split']!s:5}  "
            + "  ".join(f"{n} {row[n]['ms']:.4f} ms {row[n]['tflops']:.0f}" for n in names),
            flush=True,
        )
    with open(args.out, "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
