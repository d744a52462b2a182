"""A/B on the GPU: the rungs of this checkout against other versions of the same rungs, in one process.

``python scripts/ab_rungs.py --variant before=DIR [--variant LABEL=DIR[@block_n=176,NUM_STAGES=3] ...] [--rungs
4,5,6,7,8] [--out FILE]``: each ``DIR`` holds other copies of kernel files (``NN_name.cu``, e.g. from ``git archive``)
and any ``.cuh`` they include that the package lacks (one the package has must be the same file: a variant cannot
change a shared header, the build would read the package's). Each file is copied
beside the kernels as ``NN_name_LABEL.cu`` and built as a rung of its own with the same tile macros, so all versions
run in the same process, on the same inputs, interleaved (a, b, a, b) so that clock drift hits them alike. After
``@``, ``Rung`` fields (``block_n``, ``kv_box_rows``, ``l2_promotion``, ``smem_layout=tma_ring_staged_o``) and ``-D``
macros (``NUM_STAGES``) override the rung's own; ``long_kv_from=N`` moves the bound of the rung's long-K/V tiles to N
keys, and ``long_kv_FIELD=N`` (``long_kv_block_n=64``) changes a field of those tiles only. ``--bshd`` times every
implementation on BSHD views (the top rung's STRIDED variant), ``--head-dim 64`` on that head_dim (the top rung's
``head_dims`` variant, with a variant's overrides on top of its tiles; the error table stays at 128). FA4 is timed too
when it is importable.

Prints two tables: rel-L2 error against float64 on issue 6's far-offset inputs (with torch SDPA's cuDNN,
flash and efficient backends on the same inputs), and TFLOP/s with the ratio to cuDNN measured in the same
run. Before timing a shape, the output of each of our implementations (the rungs and their variants; not FA4) on
its first input set (O poisoned with NaN) is compared with SDPA cuDNN's (``--no-check`` skips it; the diagnostic
variants, wrong on purpose, warn): a variant that changes the work order or the tiles, causal ones
included, must still compute every row; the rel L2 goes into the JSON rows and a line after the tables.
Writes everything as JSON to ``--out``.
"""

import argparse
import dataclasses
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnclimb import rungs
from attnclimb.bench import timing
from attnclimb.bench.shapes import Shape
from attnclimb.reference import attention_exact, far_offset_inputs, far_offset_log2, rel_l2
from attnclimb.runtime.launch import run_rung

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


LONG_KV_FIELDS = ("block_m", "block_n", "threads", "q_box_rows", "kv_box_rows")  # what long_kv_FIELD=N may change


def overrides(spec):
    """``block_n=176,NUM_STAGES=3`` -> (Rung field replacements, extra -D macros)."""
    fields, defines = {}, {}
    names = {f.name for f in dataclasses.fields(rungs.Rung)}
    for item in filter(None, spec.split(",")):
        key, _, val = item.partition("=")
        long = key.startswith("long_kv_") and key != "long_kv_from"
        if long and key[len("long_kv_") :] not in LONG_KV_FIELDS:
            raise SystemExit(f"ab_rungs: {key}: the long-K/V tiles have the fields {', '.join(LONG_KV_FIELDS)}")
        if key == "smem_layout":  # a name (rungs.SMEM_LAYOUTS), for a variant that carves shared memory otherwise
            if val not in rungs.SMEM_LAYOUTS:
                raise SystemExit(f"ab_rungs: smem_layout must be one of {sorted(rungs.SMEM_LAYOUTS)}, got {val!r}")
            fields[key] = val
            continue
        (fields if key in names or key == "long_kv_from" or long else defines)[key] = int(val)
    return fields, defines


COPIED = []  # what variants() copied beside the kernels (headers, NN_name_LABEL.cu); cleanup() removes it


def cleanup():
    """Remove the files variants() copied beside the kernels; ``__main__`` calls it however the run ends (an error,
    or SIGTERM from a time limit; not SIGKILL): a header or source left there would enter every rung's build-cache
    key and the next checkout's ``git status``."""
    while COPIED:
        COPIED.pop().unlink(missing_ok=True)


def variants(specs, numbers, carriers=()):
    """(label, Rung) of every rung in ``numbers`` and of each variant of it; a rung in ``carriers`` only carries its
    variants (its own build is not timed)."""
    out, dirs = [], []
    for spec in specs:
        label, _, d = spec.partition("=")
        d, _, over = d.partition("@")  # LABEL=DIR@block_n=176,kv_box_rows=176,NUM_STAGES=3
        dirs.append((label, Path(d), *overrides(over)))
        for hdr in Path(d).glob("*.cuh"):
            mine = rungs.KERNEL_DIR / hdr.name
            if not mine.exists():
                shutil.copyfile(hdr, mine)
                COPIED.append(mine)
            elif mine.read_bytes() != hdr.read_bytes():  # the variant would build against the package's header
                raise SystemExit(f"ab_rungs: variant {label!r}: {hdr} differs from the package's {mine.name}")
    for n in numbers:
        new = rungs.get(n)
        for label, d, fields, defines in dirs:
            src = d / new.source.name
            if src.exists():
                extra = {**new.extra_defines, **defines}
                fields = dict(fields)
                bound = fields.pop("long_kv_from", None)  # long_kv_from=N: the long-K/V tiles from N keys
                # long_kv_block_n=64 etc.: fields of the long-K/V tiles only
                long = {k[len("long_kv_") :]: fields.pop(k) for k in list(fields) if k.startswith("long_kv_")}
                # the overrides hold at every head_dim: they also replace those fields of the rung's head_dims
                dims = {d: {**tiles, **fields} for d, tiles in new.head_dims.items()}
                if (bound is not None or long) and not new.long_kv:
                    raise SystemExit(f"ab_rungs: variant {label!r}: rung {n} has no long-K/V tiles to change")
                if bound is not None or long:
                    fields["long_kv"] = (new.long_kv[0] if bound is None else bound, {**new.long_kv[1], **long})
                other = dataclasses.replace(
                    new, name=f"{new.name}_{label}", extra_defines=extra, head_dims=dims, **fields
                )
                shutil.copyfile(src, other.source)
                COPIED.append(other.source)
                out.append((f"{new.key}-{label}", other))
        if n not in carriers:
            out.append((f"{new.key}", new))
    for label, d, _, _ in dirs:  # a variant that matches no rung would silently drop out of the A/B
        if not any(lab == f"{rungs.get(n).key}-{label}" for n in numbers for lab, _ in out):
            raise SystemExit(f"ab_rungs: variant {label!r}: {d} holds none of the rungs' sources ({numbers})")
    for n in carriers:  # a carrier with no variant would silently drop out of the A/B too
        if n not in numbers or not any(lab.startswith(f"{rungs.get(n).key}-") for lab, _ in out):
            raise SystemExit(f"ab_rungs: carrier {n}: not in --rungs, or no variant holds its source")
    return out


def sdpa(q, k, v, scale, backend, causal=False):
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal)


def errors(impls, g):
    rows = []
    cases = [
        ("issue6 p=11", 11, False),
        ("|max*c|~2^26", 26, False),
        ("|max*c|~2^30", 30, False),
        ("p=60 (ties)", 60, False),
        ("p=121 (fp32 limit)", 121, False),
    ]
    for sk in (4096, 16384):
        for scale in (1.0, 1 / math.sqrt(128)):
            for name, p, ties in cases:
                if name.startswith("|"):  # p from the target magnitude of max·c
                    p = far_offset_log2(scale, p)
                q, k, v = far_offset_inputs(1, 64, sk, p, scale, ties=ties, generator=g, device="cuda")
                q, k, v = (t.contiguous() for t in (q, k, v))
                ref = attention_exact(q, k, v, scale)
                row = {"case": name, "seqlen_k": sk, "scale": scale}
                for label, r in impls:
                    o = torch.full_like(q, float("nan"))
                    run_rung(r, q, k, v, o, scale)
                    row[label] = rel_l2(o, ref)
                for label, b in BACKENDS.items():
                    try:
                        row[label] = rel_l2(sdpa(q, k, v, scale, b), ref)
                    except RuntimeError:
                        row[label] = None
                rows.append(row)
    return rows


class Clocks:
    """SM clock (MHz) and board power (W) as ``nvidia-smi`` samples them every 20 ms while the block runs (read
    only; the card's settings are left alone). ``median()`` -> (MHz, W), or (None, None) without nvidia-smi."""

    def __enter__(self):
        cmd = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20"]
        try:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
        return self

    def __exit__(self, *exc):
        self.samples = []
        if self.proc is not None:
            self.proc.terminate()
            for line in self.proc.communicate()[0].splitlines():
                try:
                    self.samples.append(tuple(float(x) for x in line.split(",")[:2]))
                except ValueError:
                    pass

    def median(self):
        if not self.samples:
            return None, None
        return tuple(statistics.median(x[i] for x in self.samples) for i in (0, 1))


def output_check(impls, qkv, scale, causal):
    """``{label: rel L2}`` of each implementation's output against SDPA cuDNN's on the timed inputs ``qkv`` (O
    poisoned with NaN first, so a tile that no CTA computes shows as NaN): an A/B variant that changes the work
    order or the tiles must still compute every row. bf16 against bf16, so ~3e-3 is agreement."""
    q, k, v = qkv
    ref = sdpa(q, k, v, scale, BACKENDS["cudnn"], causal).float()
    out = {}
    for label, r in impls:
        o = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
        run_rung(r, q, k, v, o, scale, causal=causal)
        d = o.float() - ref
        out[label] = float("nan") if torch.isnan(o).any() else (d.norm() / ref.norm()).item()
    return out


def timings(impls, shapes, rounds=2, causal=False, bshd=False, head_dim=None, clocks=False, check=True):
    res = []
    from attnclimb.bench.peers import make_peer

    fa4 = make_peer("fa4")
    ok, why = fa4.available()
    if not ok:
        print(f"FA4 not timed: {why}")
        fa4 = None
    head_dim = head_dim or rungs.HEAD_DIM
    scale = 1 / math.sqrt(head_dim)
    for b, h, s, *sk in shapes:
        name = "x".join(map(str, (b, h, s, *sk)))
        shape = Shape(name, name, b, h, s, sk[0] if sk else s, head_dim=head_dim, causal=causal)
        sets = timing.make_inputs(shape, timing.num_input_sets(shape.qkv_bytes(), timing.l2_cache_bytes()))
        if bshd:  # (B, S, H, D)-contiguous memory passed as .transpose(1, 2) views, as diffusers does
            sets = [tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in qkv) for qkv in sets]
        prepared = [(q, k, v, torch.empty(q.shape, dtype=q.dtype, device=q.device)) for q, k, v in sets]
        checked = output_check(impls, sets[0], scale, causal) if check else {}
        for label, err in checked.items():
            if not err <= 1e-2:  # NaN fails too
                print(f"WARNING {name}: {label} differs from SDPA cuDNN, rel L2 {err:.2e}")
        fns = {
            label: timing.rotating(lambda a, r=r: run_rung(r, *a, scale, causal=causal), prepared) for label, r in impls
        }
        fns["cudnn"] = timing.rotating(lambda a: sdpa(*a, scale, BACKENDS["cudnn"], causal), sets)
        if fa4 is not None:
            fa4_sets = [fa4.prepare(q, k, v) for q, k, v in sets]
            fns["fa4"] = timing.rotating(fa4.for_shape(shape).call, fa4_sets)
        times = {k: [] for k in fns}
        mhz = {k: [] for k in fns}
        for rnd in range(rounds):  # the order alternates between rounds, so a drift in clocks hits all alike
            for k, fn in list(fns.items())[:: 1 if rnd % 2 == 0 else -1]:
                if clocks:
                    with Clocks() as c:
                        times[k].append(triton.testing.do_bench(fn, warmup=100, rep=1000, return_mode="median"))
                    mhz[k].append(c.median())
                else:
                    times[k].append(triton.testing.do_bench(fn, warmup=100, rep=400, return_mode="median"))
        row = {"shape": [b, h, s, *sk]}
        row.update({f"{label}_rel_l2_vs_cudnn": err for label, err in checked.items()})
        for k, ts in times.items():
            row[k] = shape.flops / (statistics.median(ts) * 1e-3) / 1e12
            if mhz[k] and all(m is not None for m, _ in mhz[k]):
                row[f"{k}_mhz"] = statistics.median(m for m, _ in mhz[k])
                row[f"{k}_watts"] = statistics.median(w for _, w in mhz[k])
        res.append(row)
        del sets, prepared, fns
        torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=DIR[@field=N,MACRO=N,...]")
    ap.add_argument("--rungs", default="4,5,6,7,8")
    ap.add_argument(
        "--carriers", default="", help="rungs of --rungs that only carry their variants (their own builds not timed)"
    )
    ap.add_argument("--out", default="ab_rungs.json")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-errors", action="store_true", help="skip the far-offset error table")
    ap.add_argument(
        "--no-check",
        action="store_true",
        help="skip the check of every timed implementation's output against SDPA cuDNN on each timed shape",
    )
    ap.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds (median taken)")
    ap.add_argument("--causal", action="store_true", help="time the causal variants (FLOPs halved)")
    ap.add_argument("--head-dim", type=int, default=None, help="head_dim of the timed shapes (default 128)")
    ap.add_argument(
        "--bshd", action="store_true", help="time on BSHD views (Q, K, V as .transpose(1, 2) of (B, S, H, D))"
    )
    ap.add_argument(
        "--clocks", action="store_true", help="sample the SM clock and power (nvidia-smi) while timing; 1 s per timing"
    )
    ap.add_argument("--shapes", default="16x16x1024,4x16x4096,1x16x16384,1x12x32760", help="BxHxS or BxHxSqxSk, ...")
    args = ap.parse_args()
    impls = variants(
        args.variant, [int(x) for x in args.rungs.split(",")], [int(x) for x in args.carriers.split(",") if x]
    )
    g = torch.Generator(device="cuda").manual_seed(12345)
    err = [] if args.no_errors else errors(impls, g)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    tim = (
        []
        if args.no_timing
        else timings(
            impls,
            shapes,
            rounds=args.rounds,
            causal=args.causal,
            bshd=args.bshd,
            head_dim=args.head_dim,
            clocks=args.clocks,
            check=not args.no_check,
        )
    )
    from attnclimb.bench.run import collect_env

    env = collect_env()
    env["variants"] = args.variant
    env["causal"] = args.causal
    env["bshd"] = args.bshd
    env["head_dim"] = args.head_dim or rungs.HEAD_DIM
    Path(args.out).write_text(json.dumps({"meta": env, "errors": err, "tflops": tim}, indent=1))
    labels = [lab for lab, _ in impls] + list(BACKENDS)
    print("rel-L2 vs float64 (far-offset inputs, seqlen_q 64; head 0 +offset, head 1 -offset)")
    print(f"{'case':28s} {'sk':>6s} {'scale':>6s} " + " ".join(f"{x[-15:]:>15s}" for x in labels))
    for r in err:
        print(
            f"{r['case']:28s} {r['seqlen_k']:6d} {r['scale']:6.3f} "
            + " ".join(f"{r[x]:15.2e}" if r[x] is not None else f"{'-':>15s}" for x in labels)
        )
    if tim:
        labels = [lab for lab, _ in impls] + ["cudnn"] + (["fa4"] if "fa4" in tim[0] else [])
        print("TFLOP/s (x cuDNN, same run)")
        print(f"{'shape':18s} " + " ".join(f"{x[-15:]:>15s}" for x in labels))
        for r in tim:
            print(f"{r['shape']!s:18s} " + " ".join(f"{r[x]:7.0f} ({r[x] / r['cudnn']:.3f})" for x in labels))
        checks = {x: [r[f"{x}_rel_l2_vs_cudnn"] for r in tim if f"{x}_rel_l2_vs_cudnn" in r] for x, _ in impls}
        if any(checks.values()):
            worst = {x: max(v, key=lambda e: math.inf if math.isnan(e) else e) for x, v in checks.items() if v}
            print(
                "output vs SDPA cuDNN on the timed inputs, rel L2 (largest over the shapes): "
                + ", ".join(f"{x} {e:.1e}" for x, e in worst.items())
            )
        if "cudnn_mhz" in tim[0]:
            print("median SM clock MHz / board power W while timing; TFLOP/s per GHz")
            for r in tim:
                print(
                    f"{r['shape']!s:18s} "
                    + " ".join(
                        f"{r[x + '_mhz']:5.0f}/{r[x + '_watts']:3.0f} {r[x] / r[x + '_mhz'] * 1e3:4.0f}" for x in labels
                    )
                )


if __name__ == "__main__":
    # a `timeout` or the device call's limit sends SIGTERM: leave through SystemExit, so that cleanup() runs
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        main()
    finally:
        cleanup()
