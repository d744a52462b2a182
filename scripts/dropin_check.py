"""Issue 9's GPU-side checks in one run (needs a Hopper GPU; about a minute on an H200), then a table:

opcheck of torch.ops.attnclimb.attention_fwd; torch.compile(fullgraph=True) with default inductor and with
mode="reduce-overhead" (CUDA graph trees); manual CUDA-graph capture and replay; gradients against torch's
math backend in float64; one call on tensors of 2^31+ elements; zero lengths; host overhead per call on a
tiny shape (wall clock over many calls, no CUDA events) against torch SDPA's cuDNN and flash paths; a
BSHD view against the contiguous call on the Wan2.1-1.3B and the 4k FA shape (both measured by the
bench's own code, attnclimb/bench/dropin.py, which `python -m attnclimb bench` runs too); and which
strided layouts the driver's tensor-map encoder accepts, against attnclimb.runtime.layout.tma_layout_reason.

Usage: python scripts/dropin_check.py [--json PATH]
Each check prints one row; the exit status is 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnclimb
from attnclimb import rungs
from attnclimb.reference import rel_l2

BF16 = torch.bfloat16
TOP = rungs.TOP.number
ROWS: list = []


def row(check, result, detail="", ok=True):
    ROWS.append({"check": check, "result": result, "detail": detail, "ok": bool(ok)})
    print(f"{'ok ' if ok else 'FAIL'} {check:<34} {result:<28} {detail}", flush=True)


def qkv(b, h, sq, sk, d=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, generator=g, device="cuda").to(BF16) for s in (sq, sk, sk))


def check(fn):
    """Run one check; an exception becomes a FAIL row, not the end of the run."""
    try:
        fn()
    except Exception as exc:  # report and go on
        traceback.print_exc()
        row(fn.__name__, "exception", f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}", ok=False)


def opcheck():
    q, k, v = qkv(2, 3, 130, 70, seed=1)
    k = k.transpose(1, 2).contiguous().transpose(1, 2)
    op = torch.ops.attnclimb.attention_fwd.default
    torch.library.opcheck(op, (q, k, v, 0.1, TOP))
    torch.library.opcheck(op, tuple(t.detach().requires_grad_() for t in (q, k, v)) + (0.1, TOP))
    row("opcheck", "passed", "schema, fake, autograd registration, aot_dispatch_dynamic; with and without grad")


class Block(torch.nn.Module):
    """Attention on BSHD activations, as diffusers' and flash-attn's callers hold them."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(128, 128, device="cuda", dtype=BF16)

    def forward(self, x):  # (B, S, H, D)
        q, k, v = (t.transpose(1, 2) for t in (x, 0.5 * x, x))
        return self.proj(attnclimb.scaled_dot_product_attention(q, k, v, strict=True).transpose(1, 2))


def compile_fullgraph():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    q, k, v = qkv(1, 2, 1000, 1000, seed=2)  # the repro shape
    f = torch.compile(lambda a, b, c: attnclimb.attention(a, b, c), fullgraph=True)
    same = torch.equal(f(q, k, v), attnclimb.attention(q, k, v))
    m = Block()
    x = torch.randn(2, 512, 4, 128, device="cuda", dtype=BF16)
    with torch.no_grad():
        eager = m(x)
        t0 = time.perf_counter()
        out = torch.compile(m, fullgraph=True)(x)
        t_default = time.perf_counter() - t0
        err = rel_l2(out, eager)
        breaks = sum(counters["graph_break"].values())  # fullgraph=True would have raised on one anyway
        torch._dynamo.reset()
        ro = torch.compile(m, fullgraph=True, mode="reduce-overhead")
        for _ in range(3):  # cudagraph trees record on the second call and replay after
            out_ro = ro(x).clone()
        err_ro = rel_l2(out_ro, eager)
    breaks += sum(counters["graph_break"].values())
    ok = same and err < 1e-2 and err_ro < 1e-2 and breaks == 0  # bf16: inductor may round the Linear differently
    row(
        "torch.compile fullgraph",
        f"{breaks} graph breaks",
        f"attention() equal: {same}; module rel L2 {err:.1e} "
        f"(compile {t_default:.0f} s); reduce-overhead rel L2 {err_ro:.1e}",
        ok,
    )


def cuda_graph():
    q, k, v = qkv(2, 3, 300, 200, seed=5)
    qv = torch.empty(2, 300, 3, 128, device="cuda", dtype=BF16).transpose(1, 2)
    qv.copy_(q)
    attnclimb.scaled_dot_product_attention(qv, k, v)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attnclimb.scaled_dot_product_attention(qv, k, v, strict=True)
    q2, k2, v2 = qkv(2, 3, 300, 200, seed=6)
    qv.copy_(q2)
    k.copy_(k2)
    v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(out, attnclimb.attention(q2, k2, v2))
    row("CUDA graph capture + replay", "equal" if same else "DIFFERENT", "BSHD-view input (copied in-graph)", same)


def gradients():
    q, k, v = (t.requires_grad_() for t in qkv(2, 4, 512, 700, seed=11))
    w = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(12))
    ours = torch.autograd.grad((attnclimb.scaled_dot_product_attention(q, k, v).float() * w).sum(), (q, k, v))
    theirs = torch.autograd.grad((F.scaled_dot_product_attention(q, k, v).float() * w).sum(), (q, k, v))
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.autograd.grad((F.scaled_dot_product_attention(*x64) * w.double()).sum(), x64)
    errs = [rel_l2(a, b) for a, b in zip(ours, ref)]
    errs_t = [rel_l2(a, b) for a, b in zip(theirs, ref)]
    ok = max(errs) < 2e-2
    row(
        "gradients vs math (fp64)",
        f"max rel L2 {max(errs):.1e}",
        "dq dk dv "
        + " ".join(f"{e:.1e}" for e in errs)
        + " | torch bf16 SDPA: "
        + " ".join(f"{e:.1e}" for e in errs_t),
        ok,
    )


def big_tensors():
    torch.cuda.empty_cache()
    q, k, v = qkv(2, 64, 2**17 + 64, 256, seed=14)
    t0 = time.perf_counter()
    out = attnclimb.attention(q, k, v)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    errs = []
    for i in range(2):
        for j in range(0, 64, 16):
            idx = (slice(i, i + 1), slice(j, j + 16))
            errs.append(rel_l2(out[idx], F.scaled_dot_product_attention(q[idx], k[idx], v[idx])))
    ok = max(errs) < 1e-2
    row(
        ">= 2^31 elements",
        f"max rel L2 {max(errs):.1e}",
        f"q {tuple(q.shape)} = {q.numel() / 2**31:.3f}·2^31 elements, {dt * 1e3:.0f} ms",
        ok,
    )
    del q, k, v, out
    torch.cuda.empty_cache()


def zero_lengths():
    res = []
    for qs, ks in [
        ((1, 2, 0, 128), (1, 2, 5, 128)),
        ((1, 2, 4, 128), (1, 2, 0, 128)),
        ((0, 2, 4, 128), (0, 2, 5, 128)),
    ]:
        q = torch.randn(*qs, device="cuda", dtype=BF16)
        k = torch.randn(*ks, device="cuda", dtype=BF16)
        out = attnclimb.scaled_dot_product_attention(q, k, k, strict=True)
        ref = F.scaled_dot_product_attention(q.cpu(), k.cpu(), k.cpu())
        res.append(out.shape == ref.shape and torch.equal(out.cpu(), ref))
    row("zero lengths", "match torch" if all(res) else "DIFFER", "Sq=0, Sk=0 (zeros), B=0", all(res))


def host_overhead():
    """The bench's host-overhead rows (attnclimb.bench.dropin.run_host_overhead), with the operator called
    directly as one more call path."""
    from attnclimb.bench import dropin

    calls, rounds = 3000, 2
    sec = dropin.run_host_overhead(dropin.host_calls(with_op=True), calls=calls, rounds=rounds)
    shape = "({batch}, {heads}, {seqlen_q}, {head_dim}) bf16".format(**sec["shape"])
    for r in sec["rows"]:
        ok = r["status"] == "ok"
        result = f"{r['us_per_call']:.1f} µs" if ok else r["status"][:28]
        row(f"host µs/call: {r['label']}"[:34], result, f"{shape}, wall clock over {calls} calls", ok)
    ours = next(r for r in sec["rows"] if r["key"] == "attnclimb_sdpa")
    ratio = ours["ratio_to_cudnn"]
    row(
        "host overhead vs cuDNN",
        f"{ratio:.2f}x" if ratio is not None else "no ratio",
        f"goal <= {dropin.HOST_GOAL:.2f}x",
        ratio is not None and ratio <= dropin.HOST_GOAL * 1.05,
    )


def bshd_views():
    """The bench's BSHD-view rows (attnclimb.bench.dropin.run_bshd_view): the top rung, SDPA cuDNN and FA4
    (when installed) on the Wan2.1-1.3B and the 4k FA shape."""
    from attnclimb.bench import dropin

    sec = dropin.run_bshd_view()
    labels = {s["name"]: s["label"] for s in sec["shapes"]}
    for r in sec["rows"]:
        if r["status"] != "ok":
            ok = r["status"].startswith("skipped: ")
            row(f"BSHD/contiguous {r['impl']} {labels[r['shape']]}"[:34], r["status"][:28], r["status"][28:90], ok)
            continue
        row(
            f"BSHD/contiguous {r['impl']} {labels[r['shape']]}"[:34],
            f"{r['ratio']:.3f}x",
            f"contiguous: {r['contiguous_ms']:.3f} ms, BSHD view: {r['view_ms']:.3f} ms "
            f"(native layout {r['native_layout']}) | goal <= {dropin.BSHD_GOAL:.2f}x",
            True,
        )


def tma_strides():
    """Ask the driver's encoder (cuTensorMapEncodeTiled, 4-D, bf16, box (64, 64, 1, 1), 128-byte swizzle)
    about strided layouts, and compare with tma_layout_reason's answer."""
    from cuda.bindings import driver

    from attnclimb.runtime.layout import tma_layout_reason

    base = torch.empty(2**22, device="cuda", dtype=BF16)
    p = base.data_ptr()
    D, S, H, B = 128, 33, 4, 2
    layouts = {
        "contiguous BHSD": ((B, H, S, D), (H * S * D, S * D, D, 1), p),
        "BSHD view": ((B, H, S, D), (S * H * D, D, H * D, 1), p),
        "fused QKV view": ((B, H, S, D), (S * 3 * H * D, D, 3 * H * D, 1), p + 2 * H * D * 2),
        "expanded batch (stride 0)": ((B, H, S, D), (0, S * D, D, 1), p),
        "size-1 batch, odd stride": ((1, H, S, D), (7, S * D, D, 1), p),
        "rows of 264 bytes": ((B, H, S, D), (H * S * 132, S * 132, 132, 1), p),
        "base 2 bytes off": ((B, H, S, D), (H * S * D, S * D, D, 1), p + 2),
        "head stride 2^39 bytes": ((B, H, S, D), (H * S * D, 2**38, D, 1), p),
        "head stride 2^40 bytes": ((B, H, S, D), (H * S * D, 2**39, D, 1), p),
    }
    dt = driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    agree = []
    for name, (shape, strides, ptr) in layouts.items():
        rule = tma_layout_reason(shape, strides, ptr)
        dims = [shape[3], shape[2], shape[1], shape[0]]
        byte_strides = [strides[2] * 2, strides[1] * 2, strides[0] * 2]
        packed = 2 * dims[0]
        for i, size in enumerate(dims[1:]):  # a size-1 dimension's stride is free: give the encoder a valid one
            if size == 1:
                byte_strides[i] = packed
            packed *= size
        u32, u64 = driver.cuuint32_t, driver.cuuint64_t
        err, _ = driver.cuTensorMapEncodeTiled(
            dt,
            4,
            ptr,
            [u64(x) for x in dims],
            [u64(x) for x in byte_strides],
            [u32(x) for x in (64, 64, 1, 1)],
            [u32(1)] * 4,
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        accepted = int(err) == 0
        same = accepted == (rule is None)
        agree.append(same)
        row(
            f"TMA encode: {name}"[:34],
            f"driver {'accepts' if accepted else 'refuses'}",
            f"rule: {'accepts' if rule is None else rule[:60]}",
            same,
        )
    del base


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()
    why = attnclimb.hopper_unavailable_reason()
    if why is not None:
        print(f"needs a Hopper GPU: {why}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · cuDNN {torch.backends.cudnn.version()}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)  # every check is on the kernel path
        for fn in (
            opcheck,
            compile_fullgraph,
            cuda_graph,
            gradients,
            big_tensors,
            zero_lengths,
            host_overhead,
            bshd_views,
            tma_strides,
        ):
            check(fn)
    print(f"\n{len([r for r in ROWS if r['ok']])}/{len(ROWS)} rows ok in {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(ROWS, indent=1))
    return 0 if all(r["ok"] for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
