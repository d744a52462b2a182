"""``python -m attnclimb cp-bench``: context-parallel attention on N GPUs against one GPU (issue 12).

Launched once per GPU by ``torchrun`` (``torchrun --nproc-per-node N -m attnclimb cp-bench``), over NCCL.
Per shape and mask: every rank builds the whole sequence's Q, K, V (one seed, so the same on every rank),
times attnclimb's top rung on all of it (``attnclimb.attention``, no LSE: the 1-GPU time; every rank
measures it on its own GPU, the median over ranks is reported), then for each scheme
(:mod:`attnclimb.distributed`: ``ring`` and ``ulysses``) checks its output on this rank's shard against
that single-GPU output and against float64 on a sample of rows, and times it (every rank's mean time per
call after a barrier; the slowest rank's time is the N-GPU time). Parallel efficiency = ``t_1 / (N * t_N)``.

Each row also carries the communication model of ``docs/distributed.md`` (:func:`comm_model`): the bytes
each rank sends, the FLOPs each rank computes, and the link bandwidth at which the communication would
take as long as the computation at the measured single-GPU throughput (the ring posts its transfers to
overlap the attention, so above that bandwidth they can hide under it, if the GPU runs them side by side;
Ulysses' all-to-alls do not overlap, and add ``that bandwidth / link bandwidth`` of the compute time).

Rank 0 writes ``<out>/x<N>/<device>-YYYYMMDD-HHMMSS.json`` and ``latest.json`` there (the environment as
``bench`` collects it: device, driver, versions, commit, date; plus the world size and NCCL's version)
and prints the table.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from . import paths
from .shapes import WAN14B_SHAPE, Shape

DESCRIPTION = (
    "Time context-parallel attention (ring and all-to-all/Ulysses over torch.distributed, attnclimb's top rung "
    "as the local attention) on N GPUs against the top rung on one GPU, check it, and write a results JSON. "
    "Launch it with torchrun, one process per GPU: torchrun --nproc-per-node N -m attnclimb cp-bench. Needs "
    "Hopper GPUs."
)
SCHEMA_VERSION = 1
SCHEMES = ("ring", "ulysses")
NO_GPU_EXIT = 2
# Wan2.1-14B at 720p with 161 frames: 1 + 160/4 = 41 latent frames of 45 x 80 patches = 147600 tokens (twice
# the 81-frame clip's 75600, the longest video the issue asks for). 147600 = 2^4 3^2 5^2 41: it splits over
# 2, 3, 4, 5, 6 and 8 ranks in both layouts; Ulysses needs the 40 heads to split too (2, 4, 5, 8).
WAN14B_161F_SHAPE = Shape(
    name="wan2.1-14b-720p-161f", label="Wan2.1-14B 720p 161 frames", batch=1, heads=40, seqlen_q=147600, seqlen_k=147600
)
CP_SHAPES = {"wan14b": WAN14B_SHAPE, "wan14b-161f": WAN14B_161F_SHAPE}
DEFAULT_SHAPES = tuple(CP_SHAPES)
DEFAULT_WARMUP, DEFAULT_ITERS = 2, 5
# --device cpu: the float64 reference holds a (B, H, S, S) float64 score matrix per call (1.8 TB for
# wan14b), so the dry run defaults to a short sequence and refuses shapes whose scores exceed this.
# 240 = 2^4 3 5 splits over 2, 3, 4, 5, 6 and 8 ranks in both layouts, like the GPU shapes.
CPU_DEFAULT_SEQLENS = "240"
CPU_MAX_SCORE_BYTES = 2 << 30
CHECK_ROWS = 64  # query rows per rank checked against float64 (head 0 of batch 0)
REL_L2_TOL = 1e-2
TIME_NOTE = (
    "t_1: the top rung on the whole sequence on one GPU (median over ranks, each timing its own GPU); t_N: "
    "the scheme on N GPUs (each rank's mean over --iters calls after --warmup calls and a barrier; the slowest "
    "rank's); efficiency = t_1 / (N t_N)"
)


def default_out_dir() -> Path:
    """``<checkout>/benchmarks/cp`` (``./benchmarks/cp`` from an installed package)."""
    return paths.results_dir().parent / "cp"


def parse_shapes(spec: str | None) -> list:
    """``--seqlens``: comma-separated names (``wan14b``: B1 H40 S75600; ``wan14b-161f``: B1 H40 S147600) or
    sequence lengths (``Nk`` = N x 1024) of the 14B model's self-attention (B1 H40, head_dim 128).
    ``ValueError`` on anything else."""
    out = []
    for tok in (spec or ",".join(DEFAULT_SHAPES)).split(","):
        tok = tok.strip().lower()
        if not tok:
            continue
        if tok in CP_SHAPES:
            out.append(CP_SHAPES[tok])
            continue
        try:
            n = int(tok[:-1]) * 1024 if tok.endswith("k") else int(tok)
        except ValueError:
            raise ValueError(f"unknown shape {tok!r}: use {', '.join(CP_SHAPES)} or a sequence length") from None
        if n < 1:
            raise ValueError(f"sequence length must be >= 1, got {tok!r}")
        out.append(Shape(name=f"b1-h40-s{n}", label=f"B1 H40 S{n}", batch=1, heads=40, seqlen_q=n, seqlen_k=n))
    if not out:
        raise ValueError("no shape selected")
    return list({s.name: s for s in out}.values())


def parse_schemes(spec: str | None) -> list:
    """``--schemes``: a comma list of ``ring`` and ``ulysses`` (default both). ``ValueError`` otherwise."""
    out = [t.strip().lower() for t in (spec or ",".join(SCHEMES)).split(",") if t.strip()]
    bad = [t for t in out if t not in SCHEMES]
    if bad or not out:
        raise ValueError(f"unknown scheme(s) {bad or spec!r}: choose from {', '.join(SCHEMES)}")
    return list(dict.fromkeys(out))


def select_shapes(spec: str | None, on_cpu: bool) -> list:
    """The shapes of ``--seqlens`` (:func:`parse_shapes`); with ``--device cpu`` the default is
    :data:`CPU_DEFAULT_SEQLENS`, and a shape whose float64 scores (``8 B H S_q S_k`` bytes) exceed
    :data:`CPU_MAX_SCORE_BYTES` is a ``ValueError`` (the default GPU shapes would need terabytes)."""
    shapes = parse_shapes(spec if spec or not on_cpu else CPU_DEFAULT_SEQLENS)
    if on_cpu:
        big = [s for s in shapes if 8 * s.batch * s.heads * s.seqlen_q * s.seqlen_k > CPU_MAX_SCORE_BYTES]
        if big:
            gib = 8 * big[0].batch * big[0].heads * big[0].seqlen_q * big[0].seqlen_k / 2**30
            raise ValueError(
                f"--device cpu runs the float64 reference, whose scores for {big[0].label} take {gib:,.0f} GiB; "
                f"use shorter --seqlens (at most {CPU_MAX_SCORE_BYTES >> 30} GiB of scores: 2k fits; the default "
                f"with --device cpu is {CPU_DEFAULT_SEQLENS})"
            )
    return shapes


def layout_for(scheme: str, causal: bool) -> str:
    """The sequence layout the bench gives a scheme: the ring's causal case is load-balanced; everything
    else is contiguous (Ulysses does balanced work in either)."""
    return "load_balanced" if scheme == "ring" and causal else "contiguous"


def skip_reason(shape, scheme: str, causal: bool, world_size: int) -> str | None:
    """Why ``scheme`` cannot run ``shape`` on ``world_size`` ranks (a sequence or head count that does not
    split), or ``None``."""
    chunks = 2 * world_size if layout_for(scheme, causal) == "load_balanced" else world_size
    if shape.seqlen_q % chunks:
        return f"seqlen {shape.seqlen_q} does not split into {chunks} equal chunks"
    if scheme == "ulysses" and (shape.heads % world_size or shape.kv_heads % world_size):
        return f"{shape.heads} heads do not split over {world_size} ranks"
    return None


def comm_model(shape, scheme: str, world_size: int, causal: bool = False, elem_bytes: int = 2) -> dict:
    """Communication and computation per rank of one call (``docs/distributed.md``, "Scaling").

    With ``N = world_size``, ``S_l = seqlen / N`` tokens per rank, ``H`` query and ``H_kv`` K/V heads of
    ``D`` at ``elem_bytes`` bytes:

    * ring: ``N - 1`` transfers of one K/V block, ``2 B H_kv S_l D elem_bytes`` bytes each; each step's
      attention is ``4 B H S_l^2 D`` FLOPs (half with the load-balanced causal mask), so a step does
      ``2 S_l (H / H_kv) / elem_bytes`` FLOPs per byte sent (``S_l`` in bf16; half causal): it grows with
      the shard.
    * ulysses: Q, K, V in and O out, each rank keeping ``1/N`` of every tensor: ``(N - 1)/N (2 B H S_l D +
      2 B H_kv S_l D) elem_bytes`` bytes; FLOPs ``4 B H S^2 D / N`` (half causal), so ``2 S N H / ((N - 1)
      (H + H_kv) elem_bytes)`` FLOPs per byte (``S N / (2 (N - 1))`` in bf16 with ``H = H_kv``): it grows
      with the whole sequence, not the shard.

    Returns ``{"bytes_per_rank", "flops_per_rank", "flops_per_byte", "steps"}``; ``flops_per_byte`` is per
    step for the ring (what overlap needs), per call for Ulysses; ``inf`` when nothing is sent (N = 1).
    """
    b, h, hkv, s, d = shape.batch, shape.heads, shape.kv_heads, shape.seqlen_q, shape.head_dim
    s_local = s / world_size
    flops_per_rank = 4.0 * b * h * s * s * d / world_size / (2 if causal else 1)
    if scheme == "ring":
        step_bytes = 2.0 * b * hkv * s_local * d * elem_bytes
        step_flops = 4.0 * b * h * s_local * s_local * d / (2 if causal else 1)
        sent = (world_size - 1) * step_bytes
        per_byte = step_flops / step_bytes if world_size > 1 else math.inf
        steps = world_size
    elif scheme == "ulysses":
        sent = (world_size - 1) / world_size * (2.0 * b * h * s_local * d + 2.0 * b * hkv * s_local * d) * elem_bytes
        per_byte = flops_per_rank / sent if sent else math.inf
        steps = 1
    else:
        raise ValueError(f"unknown scheme {scheme!r}")
    return {"bytes_per_rank": sent, "flops_per_rank": flops_per_rank, "flops_per_byte": per_byte, "steps": steps}


def break_even_gbs(model: dict, tflops_1gpu: float | None) -> float | None:
    """The link bandwidth (GB/s, per direction per GPU) at which sending takes as long as computing at
    ``tflops_1gpu``: ``TFLOP/s * 1e12 / flops_per_byte / 1e9``. ``None`` without a throughput."""
    if not tflops_1gpu or not math.isfinite(model["flops_per_byte"]):
        return None
    return tflops_1gpu * 1e12 / model["flops_per_byte"] / 1e9


def _exact_rows(q_rows, k, v, positions, scale, causal):
    """float64 attention of a few query rows at global ``positions`` over one head's whole K/V
    (``(rows, D)``, ``(S, D)``, ``(S, D)``): the bench's float64 check."""
    import torch

    s = (q_rows.double() @ k.double().T) * scale
    if causal:
        keys = torch.arange(k.shape[0], device=s.device)[None, :]
        s = s.masked_fill(keys > positions.to(s.device)[:, None], -math.inf)
    return torch.softmax(s, dim=-1) @ v.double()


def make_row(
    shape,
    scheme,
    causal,
    world_size,
    *,
    status="ok",
    ms_1gpu=None,
    ms=None,
    ms_1gpu_ranks=None,
    rel_l2_1gpu=None,
    rel_l2_f64=None,
) -> dict:
    """One result row: times, speed-up over one GPU, parallel efficiency (speed-up / ``world_size``),
    TFLOP/s (causal: half the FLOPs), errors and the communication model (:func:`comm_model`).

    ``status``: ``"ok"``, ``"skipped: <why>"`` or ``"error: <why>"``; ``ms`` is kept only when ok.
    ``ValueError`` for another status."""
    if not (status == "ok" or status.startswith(("skipped: ", "error: "))):
        raise ValueError(f"status must be 'ok', 'skipped: ...' or 'error: ...', got {status!r}")
    model = comm_model(shape, scheme, world_size, causal)
    ok = status == "ok"
    flops = 4.0 * shape.batch * shape.heads * shape.seqlen_q * shape.seqlen_k * shape.head_dim / (2 if causal else 1)
    tflops_1 = flops / (ms_1gpu * 1e-3) / 1e12 if ms_1gpu else None
    speedup = ms_1gpu / ms if ok and ms_1gpu and ms else None
    return {
        "shape": shape.name,
        "label": shape.label,
        "batch": shape.batch,
        "heads": shape.heads,
        "heads_kv": shape.kv_heads,
        "seqlen": shape.seqlen_q,
        "head_dim": shape.head_dim,
        "causal": causal,
        "scheme": scheme,
        "layout": layout_for(scheme, causal),
        "world_size": world_size,
        "ms_1gpu": _round(ms_1gpu),
        "ms_1gpu_ranks": None if ms_1gpu_ranks is None else [_round(x) for x in ms_1gpu_ranks],
        "ms": _round(ms) if ok else None,
        "speedup": _round(speedup),
        "efficiency": _round(speedup / world_size) if speedup else None,
        "tflops_1gpu": _round(tflops_1),
        "tflops_per_gpu": _round(flops / (ms * 1e-3) / 1e12 / world_size) if ok and ms else None,
        "rel_l2_vs_1gpu": _round(rel_l2_1gpu, 4),
        "rel_l2_vs_float64": _round(rel_l2_f64, 4),
        "bytes_per_rank": model["bytes_per_rank"],
        "flops_per_rank": model["flops_per_rank"],
        "break_even_gbs": _round(break_even_gbs(model, tflops_1)),
        "status": status,
    }


def _round(x, digits: int = 6):
    return None if x is None or not math.isfinite(x) else float(f"{x:.{digits}g}")


# ------------------------------------------------------------------------------------------- runner


def cuda_timer(fn, warmup: int, iters: int) -> float:
    """Mean ms per ``fn()`` call over ``iters`` calls between two CUDA events, after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def wall_timer(fn, warmup: int, iters: int) -> float:
    """Mean ms per ``fn()`` call by the wall clock (the CPU tests' timer)."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def kernel_attention(q, k, v, *, scale, is_causal):
    """The 1-GPU baseline: :func:`attnclimb.attention` (the top rung, no LSE)."""
    from ..api import attention

    return attention(q, k, v, scale=scale, is_causal=is_causal)


def _exact_output(q, k, v, *, scale, is_causal):
    """The ``--device cpu`` baseline: the float64 reference's O."""
    from ..distributed import exact_local_attention

    return exact_local_attention(q, k, v, scale=scale, is_causal=is_causal)[0]


def _full_inputs(shape, device, dtype, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for heads in (shape.heads, shape.kv_heads, shape.kv_heads):
        size = (shape.batch, heads, shape.seqlen_q, shape.head_dim)
        out.append(torch.randn(size, device=device, dtype=dtype, generator=g))
    return out


def run_cp_bench(
    shapes,
    schemes,
    causal_modes,
    *,
    group=None,
    device="cuda",
    dtype=None,
    local_attention=None,
    single_gpu=None,
    timer=cuda_timer,
    warmup: int = DEFAULT_WARMUP,
    iters: int = DEFAULT_ITERS,
    seed: int = 0,
    log=None,
) -> list:
    """Check and time every (shape, mask, scheme) on the ranks of ``group``; a collective (every rank calls
    it with the same arguments). Returns the rows (:func:`make_row`), the same on every rank.

    Args:
        shapes: :class:`~attnclimb.bench.shapes.Shape` list (self-attention: ``seqlen_q == seqlen_k``).
        schemes: names from :data:`SCHEMES`.
        causal_modes: e.g. ``(False,)`` or ``(False, True)``.
        device, dtype: where and in what the inputs live (default bf16).
        local_attention: as in :func:`attnclimb.distributed.ring_attention` (default the top rung with its
            LSE).
        single_gpu: ``f(q, k, v, *, scale, is_causal) -> O``, the 1-GPU baseline that is timed and checked
            against (default :func:`kernel_attention`: the top rung without the LSE, what one GPU would run).
        timer: ``timer(fn, warmup, iters) -> ms`` per call on this rank (:func:`cuda_timer`; the CPU tests
            pass :func:`wall_timer`).
        log: ``log(text)`` for progress lines (rank 0 passes ``print``).
    """
    import torch
    import torch.distributed as dist

    from .. import distributed as cp
    from ..reference import rel_l2

    dtype = torch.bfloat16 if dtype is None else dtype
    local_attention = cp.kernel_local_attention if local_attention is None else local_attention
    single_gpu = kernel_attention if single_gpu is None else single_gpu
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    log = log or (lambda text: None)

    def reduce(value, op):
        t = torch.tensor([math.nan if value is None else float(value)], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op, group=group)
        return float(t.item())

    def gather(value):
        t = torch.tensor([float(value)], dtype=torch.float64, device=device)
        parts = [torch.empty_like(t) for _ in range(world_size)]
        dist.all_gather(parts, t, group=group)
        return [float(p.item()) for p in parts]

    def timed(fn):
        dist.barrier(group=group)
        return timer(fn, warmup, iters)

    rows = []
    for shape in shapes:
        q, k, v = _full_inputs(shape, device, dtype, seed)
        scale = 1.0 / math.sqrt(shape.head_dim)
        for causal in causal_modes:
            label = f"{shape.label}{' causal' if causal else ''}"

            def one_gpu(q=q, k=k, v=v, scale=scale, causal=causal):
                return single_gpu(q, k, v, scale=scale, is_causal=causal)

            ref = one_gpu()
            ms_ranks = gather(timed(one_gpu))
            ms_1 = statistics.median(ms_ranks)
            log(f"{label}: 1 GPU {ms_1:.3f} ms (ranks: {', '.join(f'{x:.3f}' for x in ms_ranks)})")
            for scheme in schemes:
                why = skip_reason(shape, scheme, causal, world_size)
                if why is not None:
                    rows.append(make_row(shape, scheme, causal, world_size, status=f"skipped: {why}", ms_1gpu=ms_1))
                    log(f"{label} {scheme}: skipped: {why}")
                    continue
                layout = layout_for(scheme, causal)
                qs, ks, vs = (cp.shard_sequence(t, rank, world_size, layout=layout).contiguous() for t in (q, k, v))

                def call(fn=cp.SCHEMES[scheme], qs=qs, ks=ks, vs=vs, layout=layout, causal=causal):
                    return fn(qs, ks, vs, group=group, is_causal=causal, layout=layout, local_attention=local_attention)

                out = call()
                err_1 = reduce(rel_l2(out, cp.shard_sequence(ref, rank, world_size, layout=layout)), dist.ReduceOp.MAX)
                positions = cp.sequence_positions(rank, world_size, qs.shape[2], layout, device=device)[:CHECK_ROWS]
                exact = _exact_rows(qs[0, 0, :CHECK_ROWS], k[0, 0], v[0, 0], positions, scale, causal)
                err_64 = reduce(rel_l2(out[0, 0, :CHECK_ROWS], exact), dist.ReduceOp.MAX)
                out = None
                errors = {"rel_l2_1gpu": err_1, "rel_l2_f64": err_64}
                bad = [n for n, e in (("1 GPU", err_1), ("float64", err_64)) if not e <= REL_L2_TOL]
                if bad:
                    status = f"error: rel-L2 vs {' and '.join(bad)} above {REL_L2_TOL:g} ({err_1:.2e}, {err_64:.2e})"
                    rows.append(make_row(shape, scheme, causal, world_size, status=status, ms_1gpu=ms_1, **errors))
                    log(f"{label} {scheme}: {status}")
                    continue
                ms = reduce(timed(call), dist.ReduceOp.MAX)
                row = make_row(shape, scheme, causal, world_size, ms_1gpu=ms_1, ms=ms, ms_1gpu_ranks=ms_ranks, **errors)
                rows.append(row)
                log(f"{label} {scheme}: {world_size} GPUs {ms:.3f} ms, efficiency {row['efficiency']}")
    return rows


# ------------------------------------------------------------------------------------------ results


def build_doc(env: dict, rows: list, shapes: list, settings: dict, notes=None) -> dict:
    """The results JSON: environment fields at the top (``bench``'s :func:`~attnclimb.bench.run.collect_env`
    plus ``world_size``, ``backend``, ``nccl_version``), then ``settings``, ``shapes``, ``notes``, ``rows``."""
    from .run import shape_entry

    doc = {"schema": SCHEMA_VERSION, "kind": "cp-bench"}
    doc.update(env)
    doc["settings"] = dict(settings)
    doc["shapes"] = [shape_entry(s) for s in shapes]
    doc["notes"] = [TIME_NOTE, *(notes or [])]
    doc["rows"] = list(rows)
    return doc


def write_doc(doc: dict, out_dir, when: datetime, slug: str | None = None) -> tuple:
    """Write ``doc`` to ``<out_dir>/<slug>-YYYYMMDD-HHMMSS.json`` and an identical ``latest.json`` (replaced
    atomically) with :func:`~attnclimb.bench.run.write_results`; ``slug`` defaults to the device's (``h200``).
    Returns both paths."""
    from .run import write_results

    return write_results(doc, out_dir, when, slug)


def console_table(doc: dict) -> str:
    """The rows as an aligned plain-text table, a caption line first."""
    cap = (
        f"{doc.get('device', '?')} x{doc.get('world_size', '?')} · torch {doc.get('torch_version', '?')} · "
        f"{doc.get('backend', '?')} {doc.get('nccl_version') or ''}".rstrip()
        + f" · commit {str(doc.get('commit', '?'))[:7]} · {doc.get('date', '?')}"
    )
    header = (
        "shape",
        "mask",
        "scheme",
        "1 GPU ms",
        "N GPUs ms",
        "speed-up",
        "efficiency",
        "rel-L2 1GPU/f64",
        "break-even GB/s",
    )
    body = []
    for r in doc.get("rows", []):
        mask = "causal" if r["causal"] else "full"
        if r["status"] != "ok":
            body.append((r["label"], mask, r["scheme"], _fmt(r["ms_1gpu"]), r["status"], "", "", "", ""))
            continue
        errs = "/".join("—" if e is None else f"{e:.1e}" for e in (r["rel_l2_vs_1gpu"], r["rel_l2_vs_float64"]))
        body.append(
            (
                r["label"],
                mask,
                f"{r['scheme']} ({r['layout']})",
                _fmt(r["ms_1gpu"]),
                _fmt(r["ms"]),
                "—" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                "—" if r["efficiency"] is None else f"{100 * r['efficiency']:.0f} %",
                errs,
                _fmt(r["break_even_gbs"], 0),
            )
        )
    widths = [max(len(str(row[i])) for row in (header, *body)) for i in range(len(header))]
    lines = [cap, "  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    return "\n".join(lines)


README_BEGIN, README_END = "<!-- cp:begin -->", "<!-- cp:end -->"


def markdown_table(doc: dict, rel_path: str | None = None) -> str:
    """One results JSON as the README's multi-GPU block: a caption (device × N, torch, NCCL, commit, date, link
    to the JSON) and a row per shape, mask and scheme (1-GPU and N-GPU ms, speed-up, efficiency, errors)."""
    link = f" · [JSON]({rel_path})" if rel_path else ""
    out = [
        f"_{doc.get('device', '?')} × {doc.get('world_size', '?')} · torch {doc.get('torch_version', '?')} · "
        f"{doc.get('backend', '?')} {doc.get('nccl_version') or ''} · commit {str(doc.get('commit', '?'))[:7]} · "
        f"{doc.get('date', '?')}{link}_",
        "",
        "| shape | mask | scheme (layout) | 1 GPU ms | N GPUs ms | speed-up | efficiency | rel-L2 vs 1 GPU / float64 |",
        "|:---|:---|:---|---:|---:|---:|---:|---:|",
    ]
    for r in doc.get("rows", []):
        mask = "causal" if r["causal"] else "full"
        if r["status"] != "ok":
            out.append(f"| {r['label']} | {mask} | {r['scheme']} | {_fmt(r['ms_1gpu'])} | {r['status']} | | | |")
            continue
        errs = " / ".join("—" if e is None else f"{e:.1e}" for e in (r["rel_l2_vs_1gpu"], r["rel_l2_vs_float64"]))
        out.append(
            f"| {r['label']} | {mask} | {r['scheme']} ({r['layout']}) | {_fmt(r['ms_1gpu'])} | {_fmt(r['ms'])} | "
            + ("—" if r["speedup"] is None else f"{r['speedup']:.2f}×")
            + " | "
            + ("—" if r["efficiency"] is None else f"{100 * r['efficiency']:.0f} %")
            + f" | {errs} |"
        )
    out += ["", f"<sub>{TIME_NOTE}. Generated by `python -m attnclimb cp-bench --report`; do not edit by hand.</sub>"]
    return "\n".join(out)


def report_main(args) -> int:
    """``cp-bench --report``: the README's multi-GPU block from ``latest.json`` of each ``x<N>`` folder under
    ``--out`` (default: ``benchmarks/cp``), fewest GPUs first. Exit 1 when there is no result to show or the
    README has no ``<!-- cp:begin -->`` / ``<!-- cp:end -->`` block."""
    import json

    from .paths import REPO_ROOT, default_readme
    from .report import replace_between_markers

    folder = Path(args.out) if args.out else default_out_dir()
    found = []
    for sub in folder.glob("x*"):
        latest = sub / "latest.json"
        if sub.name[1:].isdigit() and latest.is_file():
            found.append((int(sub.name[1:]), latest))
    if not found:
        print(f"attnclimb cp-bench --report: no x<N>/latest.json under {folder}", file=sys.stderr)
        return 1
    readme = Path(args.readme) if getattr(args, "readme", None) else default_readme()
    base = readme.parent if readme else REPO_ROOT
    blocks = []
    for _, latest in sorted(found):
        doc = json.loads(latest.read_text())
        try:
            rel = Path(os.path.relpath(latest.resolve(), base.resolve())).as_posix()
        except ValueError:
            rel = str(latest)
        blocks.append(markdown_table(doc, rel))
    block = "\n\n".join(blocks)
    if readme is None:
        print(block)
        return 0
    text = readme.read_text()
    new = replace_between_markers(text, block, README_BEGIN, README_END)
    if new is None:
        print(f"attnclimb cp-bench --report: {readme} has no {README_BEGIN} ... {README_END} block", file=sys.stderr)
        return 1
    if new != text:
        readme.write_text(new)
    print(f"{readme}: multi-GPU section from {', '.join(str(p) for _, p in sorted(found))}")
    return 0


def _fmt(x, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


# ---------------------------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    """Add the ``cp-bench`` options to an argparse (sub)parser."""
    p.add_argument(
        "--seqlens",
        metavar="LIST",
        help="shapes: 'wan14b' (Wan2.1-14B 720p self-attention, B1 H40 S75600), 'wan14b-161f' (the same at 161 "
        "frames, S147600) and/or sequence lengths of B1 H40 (e.g. 32k) (default: wan14b,wan14b-161f; with --device "
        f"cpu {CPU_DEFAULT_SEQLENS})",
    )
    p.add_argument("--schemes", metavar="LIST", help="ring and/or ulysses (default: both)")
    p.add_argument(
        "--causal",
        action="store_true",
        help="also time causal attention (the ring with the load-balanced layout, Ulysses with the contiguous one)",
    )
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N", help="untimed calls first (%(default)s)")
    p.add_argument("--iters", type=int, default=DEFAULT_ITERS, metavar="N", help="timed calls (%(default)s)")
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default): NCCL, the top rung, bf16. cpu: a dry run of the launch and the bookkeeping over gloo "
        "with the float64 reference as the local attention and float32 inputs (the times mean nothing; --seqlens "
        f"of at most {CPU_MAX_SCORE_BYTES >> 30} GiB of float64 scores, about 2k)",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="run nothing (no torchrun needed): write the README's multi-GPU table from x<N>/latest.json under "
        "--out (default: benchmarks/cp)",
    )
    p.add_argument(
        "--readme", default=None, metavar="FILE", help="--report: the README to update (default: the checkout's)"
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help=f"results folder; the JSON goes to DIR/x<N>/ (default: {default_out_dir()}, and its subfolder "
        "cpu-dry-run with --device cpu)",
    )


def cpu_env(when: datetime) -> dict:
    """The environment fields of :func:`~attnclimb.bench.run.collect_env` for a ``--device cpu`` dry run."""
    import platform

    import torch

    from .run import git_commit

    return {
        "device": f"cpu ({platform.machine()})",
        "driver_version": None,
        "torch_version": torch.__version__,
        "cuda_version": None,
        "python_version": platform.python_version(),
        "commit": git_commit(),
        "date": when.isoformat(timespec="seconds"),
        "nccl_version": None,
    }


def hopper_reason(device) -> str | None:
    """:func:`attnclimb.hopper_unavailable_reason` for ``device`` (a seam the CPU tests replace)."""
    from ..api import hopper_unavailable_reason

    return hopper_unavailable_reason(device)


def main(args) -> int:
    """Run ``cp-bench`` in one torchrun process. Exit 0 when every row is ok or skipped, 1 on an error row,
    2 without torchrun's environment, without a Hopper GPU (unless ``--device cpu``), or on bad options."""
    if getattr(args, "report", False):
        return report_main(args)
    world_size = int(os.environ.get("WORLD_SIZE", "0") or 0)
    if world_size < 1:
        print(
            "attnclimb cp-bench: start one process per GPU with torchrun, e.g. "
            "torchrun --nproc-per-node 2 -m attnclimb cp-bench",
            file=sys.stderr,
        )
        return 2
    on_cpu = getattr(args, "device", "cuda") == "cpu"
    try:
        shapes = select_shapes(args.seqlens, on_cpu)
        schemes = parse_schemes(args.schemes)
        if args.warmup < 0 or args.iters < 1:
            raise ValueError(f"need --warmup >= 0 and --iters >= 1, got {args.warmup} and {args.iters}")
    except ValueError as exc:
        print(f"attnclimb cp-bench: {exc}", file=sys.stderr)
        return 2
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    why = None if on_cpu else hopper_reason(f"cuda:{local_rank}")
    if why is not None:
        print(f"attnclimb cp-bench: no Hopper GPU (sm_90) for local rank {local_rank}: {why}", file=sys.stderr)
        return NO_GPU_EXIT

    import torch
    import torch.distributed as dist

    if on_cpu:
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    try:
        rank = dist.get_rank()
        started = datetime.now(timezone.utc)
        t0 = time.monotonic()
        env = cpu_env(started) if on_cpu else None
        if rank == 0 and not on_cpu:
            from .run import collect_env

            env = collect_env(started)
            nccl = torch.cuda.nccl.version()
            env["nccl_version"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        if env is not None:
            env.update(world_size=world_size, backend=dist.get_backend())
        causal_modes = (False, True) if args.causal else (False,)
        if on_cpu:
            from ..distributed import exact_local_attention

            kw = {"device": "cpu", "dtype": torch.float32, "local_attention": exact_local_attention}
            kw.update(single_gpu=_exact_output, timer=wall_timer)
        else:
            kw = {"device": "cuda"}
        rows = run_cp_bench(
            shapes,
            schemes,
            causal_modes,
            warmup=args.warmup,
            iters=args.iters,
            log=(lambda text: print(text, file=sys.stderr, flush=True)) if rank == 0 else None,
            **kw,
        )
        if rank == 0:
            settings = {"warmup": args.warmup, "iters": args.iters, "schemes": schemes, "causal": args.causal}
            settings["device"] = "cpu" if on_cpu else "cuda"
            settings["elapsed_s"] = round(time.monotonic() - t0, 1)
            doc = build_doc(env, rows, shapes, settings)
            out = Path(args.out) if args.out else default_out_dir() / ("cpu-dry-run" if on_cpu else "")
            stamped, latest = write_doc(doc, out / f"x{world_size}", started, slug="cpu" if on_cpu else None)
            print(console_table(doc))
            print(f"wrote {stamped} and {latest.name}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 1 if any(r["status"].startswith("error:") for r in rows) else 0
