"""Measured timelines (issue 11): ``python -m attnclimb trace RUNG`` builds a rung with ``TRACE=1``, runs it
once on the GPU, reads back the ``%globaltimer`` stamps its warpgroups recorded and draws them as a Gantt
chart (:mod:`attnclimb.figures.timeline`).

The device half is ``attnclimb/kernels/trace.cuh``; ``docs/kernel-abi.md`` ("Trace builds") has the buffer
layout that :func:`decode` reads. Everything here but :class:`CudaBackend` runs without a GPU: the decoder
is a pure function of the buffer's bytes, and :func:`run_trace` takes its GPU through a small backend
object that the CPU tests replace with a fake.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
from pathlib import Path

from . import rungs

DESCRIPTION = (
    "Build RUNG with TRACE=1 (%globaltimer stamps per warpgroup and phase for the first few CTAs), run it "
    "once on random inputs after a warm-up launch, check that its output equals the untraced kernel's, "
    "and write the decoded trace (JSON) and its Gantt chart (SVG, PNG). Needs a Hopper GPU."
)

SYMBOL = "attn_trace"  # the __device__ buffer of trace.cuh, found with cuLibraryGetGlobal
MAGIC = 0x43525441  # trace.cuh's tracing::MAGIC: a slot's header carries it once its warpgroup ran
DEFAULT_CTAS = 4  # trace.cuh's TRACE_CTAS default
DEFAULT_EVENTS = 2047  # trace.cuh's TRACE_EVENTS default: 32 KB per (CTA, warpgroup)
MAX_CTAS = 64
DEFAULT_SHAPE = (1, 16, 2048, 2048)  # 256 work tiles: 2 per CTA on the persistent rungs (132 SMs)
NO_HOPPER_EXIT = 2
COARSE_STEP_NS = 200  # a %globaltimer step from which the command suggests --clock sm
# The stamps: "global" = %globaltimer (ns, one clock for all SMs); "sm" = %clock64 (cycles of each SM's own
# counter: the decoder starts every CTA at its own first stamp, since counters of two SMs do not agree).
CLOCKS = {
    "global": ("ns", "%globaltimer (ns)"),
    "sm": ("cycles", "%clock64 (SM cycles, each CTA from its own first stamp)"),
}

# trace.cuh's event codes: phase in bits 0-7, what in bits 8-15 (tests/test_trace_cpu.py compares the
# two tables). Phases are those of attnclimb.figures.timeline.PHASES.
PHASE_OF = {0: "wait", 1: "S", 2: "softmax", 3: "PV", 4: "epilogue", 5: "tma"}
EVENTS = {
    "WAIT_Q": (0x0100, "Q full"),
    "WAIT_K": (0x0200, "K full"),
    "WAIT_V": (0x0300, "V full"),
    "WAIT_KV_EMPTY": (0x0400, "K/V empty"),
    "WAIT_K_EMPTY": (0x0500, "K empty"),
    "WAIT_V_EMPTY": (0x0600, "V empty"),
    "WAIT_Q_EMPTY": (0x0700, "Q empty"),
    "WAIT_TURN": (0x0800, "turn"),
    "WAIT_CTA": (0x0900, "__syncthreads"),
    "S": (0x0001, "S"),
    "SOFTMAX": (0x0002, "softmax"),
    "PV": (0x0003, "PV"),
    "EPILOGUE": (0x0004, "epilogue"),
    "TMA_Q": (0x0105, "Q"),
    "TMA_KV": (0x0205, "K+V"),
    "TMA_K": (0x0305, "K"),
    "TMA_V": (0x0405, "V"),
}
_BY_CODE = {code: (PHASE_OF[code & 0xFF], what) for code, what in EVENTS.values()}

_TRACE_LINE = re.compile(r"\s*(?:TRACE_[A-Z]+\(\w*\);|#include \"trace\.cuh\")\s*")


# ------------------------------------------------------------------------------------------ builds


def instrumented(rung: rungs.Rung) -> bool:
    """Whether ``rung``'s kernel records a trace when built with ``TRACE=1`` (it includes ``trace.cuh``)."""
    return '#include "trace.cuh"' in rung.source.read_text()


def instrumented_rungs() -> list:
    return [r for r in rungs.RUNGS if instrumented(r)]


def traced(
    rung: rungs.Rung, ctas: int = DEFAULT_CTAS, events: int = DEFAULT_EVENTS, clock: str = "global"
) -> rungs.Rung:
    """The trace build of ``rung``: the same :class:`~attnclimb.rungs.Rung` plus the macros ``TRACE=1``,
    ``TRACE_CTAS``, ``TRACE_EVENTS`` and, for ``clock="sm"`` (stamps from each SM's ``%clock64`` instead of
    ``%globaltimer``), ``TRACE_CLOCK=1``. One object per arguments (memoised), so the loaded-module cache
    (keyed by the Rung object) loads it once; the disk cache keys it apart from the untraced build because
    its macros differ. ``ValueError`` when the rung has no instrumentation or an argument is out of range."""
    if not instrumented(rung):
        have = ", ".join(str(r.number) for r in instrumented_rungs())
        raise ValueError(f"rung {rung.number} has no trace instrumentation (rungs with it: {have})")
    if not 1 <= ctas <= MAX_CTAS:
        raise ValueError(f"ctas must be in 1..{MAX_CTAS}, got {ctas}")
    if not 1 <= events <= 1 << 16:
        raise ValueError(f"events must be in 1..65536, got {events}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    return _traced(rung, int(ctas), int(events), clock)


@functools.cache
def _traced(rung: rungs.Rung, ctas: int, events: int, clock: str) -> rungs.Rung:
    extra = {**rung.extra_defines, "TRACE": 1, "TRACE_CTAS": ctas, "TRACE_EVENTS": events}
    if clock == "sm":
        extra["TRACE_CLOCK"] = 1
    return dataclasses.replace(rung, extra_defines=extra)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The buffer of a trace build: ``ctas`` x ``wgs`` slots of ``events + 1`` records of 16 bytes."""

    ctas: int
    wgs: int
    events: int
    clock: str = "global"

    @classmethod
    def of(cls, rung: rungs.Rung) -> Layout:
        d = rung.defines()
        if not d.get("TRACE"):
            raise ValueError(f"{rung.key} is not a trace build (no TRACE=1 among its macros)")
        ctas, events = int(d.get("TRACE_CTAS", DEFAULT_CTAS)), int(d.get("TRACE_EVENTS", DEFAULT_EVENTS))
        return cls(ctas, rung.threads // 128, events, "sm" if d.get("TRACE_CLOCK") else "global")

    @property
    def words(self) -> int:
        """32-bit words in the buffer."""
        return self.ctas * self.wgs * (self.events + 1) * 4

    @property
    def nbytes(self) -> int:
        return 4 * self.words


def strip_trace_lines(source: str) -> str:
    """``source`` without its ``TRACE_*(...);`` statement lines and its ``#include "trace.cuh"``: what an
    untraced build must compile to the same machine code as (tests/test_trace_cpu.py)."""
    return "".join(line for line in source.splitlines(True) if not _TRACE_LINE.fullmatch(line.rstrip("\n")))


# ------------------------------------------------------------------------------------------ decoding


def decode(raw, layout: Layout, *, rung: int, meta: dict | None = None) -> dict:
    """The trace document (the format of :mod:`attnclimb.figures.timeline`) from the bytes of a trace
    buffer: ``raw`` is ``bytes``, a ``numpy`` array or anything with the buffer protocol, little-endian.

    With ``%globaltimer`` stamps (``layout.clock == "global"``) times are nanoseconds after the earliest
    stamp of the whole trace (``t_origin`` keeps that stamp) and ``unit`` is ``"ns"``; with ``%clock64``
    (``"sm"``) they are cycles after each CTA's own earliest stamp (``t_origin`` per CTA). ``timer_step``
    is the greatest common divisor of all stamps' distances from the origin: the step the clock was seen
    to advance in (1 for a clock that ticks every unit; a coarse ``%globaltimer`` shows here).

    Each warpgroup gets ``role`` (``producer``: issues TMA and computes nothing; ``consumer``; or
    ``consumer + TMA``, when one thread does both), ``dropped`` (events past the slot's capacity: counted
    by the kernel, not recorded) and ``phase_ns`` (or ``phase_cycles``): the time spent in each phase.
    Slots whose warpgroup never ran (no magic) are left out, and so is a CTA without any other slot.

    ``ValueError`` when the buffer has the wrong size or holds an event that the kernel cannot have
    written (an unknown code, a missing start stamp, a header for another CTA).
    """
    import numpy as np

    words = np.frombuffer(memoryview(raw).cast("B"), dtype="<u4")
    if words.size != layout.words:
        raise ValueError(f"trace buffer holds {words.size} words, the layout {layout} needs {layout.words}")
    slots = words.reshape(layout.ctas, layout.wgs, layout.events + 1, 4)
    ctas = []
    for c in range(layout.ctas):
        wgs = []
        sm = None
        for w in range(layout.wgs):
            count, smid, cta, magic = (int(x) for x in slots[c, w, 0])
            if magic != MAGIC:
                continue
            if cta != c:
                raise ValueError(f"slot of CTA {c} WG {w} has the header of CTA {cta}")
            sm = smid if sm is None else sm
            if smid != sm:
                raise ValueError(f"CTA {c}: warpgroups report different SMs ({sm} and {smid})")
            events = []
            for i in range(min(count, layout.events)):
                t0_lo, t0_hi, t1_lo, code = (int(x) for x in slots[c, w, 1 + i])
                if code not in _BY_CODE:
                    raise ValueError(f"CTA {c} WG {w} event {i}: unknown event code {code:#06x}")
                t0 = t0_lo | (t0_hi << 32)
                if t0 == 0:
                    raise ValueError(f"CTA {c} WG {w} event {i}: no start stamp")
                phase, what = _BY_CODE[code]
                t1 = t0 + ((t1_lo - t0_lo) & 0xFFFFFFFF)
                events.append({"phase": phase, "what": what, "t0": t0, "t1": t1})
            wgs.append({"wg": w, "role": _role(events), "dropped": max(0, count - layout.events), "events": events})
        if wgs:
            ctas.append({"cta": c, "sm": sm, "warpgroups": wgs})
    unit, clock = CLOCKS[layout.clock]

    def first(cs):
        stamps = [e["t0"] for c in cs for wg in c["warpgroups"] for e in wg["events"]]
        return min(stamps) if stamps else 0

    origin = first(ctas)
    step = 0
    for c in ctas:
        if layout.clock == "sm":
            origin = c["t_origin"] = first([c])
        for wg in c["warpgroups"]:
            for e in wg["events"]:
                e["t0"] -= origin
                e["t1"] -= origin
                step = math.gcd(step, e["t0"], e["t1"])
            wg[f"phase_{unit}"] = _totals(wg["events"])
    doc = {"rung": rung, **(meta or {}), "clock": clock, "unit": unit, "timer_step": step}
    if layout.clock == "global":
        doc["t_origin"] = origin
    doc["ctas"] = ctas
    return doc


def _role(events) -> str:
    phases = {e["phase"] for e in events}
    computes = bool(phases & {"S", "softmax", "PV", "epilogue"})
    if "tma" in phases:
        return "consumer + TMA" if computes else "producer"
    return "consumer" if computes else "idle"


def _totals(events) -> dict:
    out = {}
    for e in events:
        out[e["phase"]] = out.get(e["phase"], 0) + (e["t1"] - e["t0"])
    return dict(sorted(out.items()))


def dropped_events(doc) -> int:
    return sum(wg.get("dropped", 0) for c in doc["ctas"] for wg in c["warpgroups"])


# ------------------------------------------------------------------------------------------ running


class CudaBackend:
    """What :func:`run_trace` needs from the GPU, done with torch, :mod:`attnclimb.runtime.launch` and the
    CUDA driver (``cuLibraryGetGlobal``, ``cuMemsetD8``, ``cuMemcpyDtoH``). The CPU tests pass a fake."""

    device = "cuda"

    def run(self, rung, q, k, v, o, scale: float, causal: bool = False) -> None:
        from .runtime.launch import run_rung

        run_rung(rung, q, k, v, o, scale, causal=causal)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def _symbol(self, rung) -> tuple:
        """``(device pointer, bytes)`` of the trace buffer in the module loaded for ``rung``."""
        import torch
        from cuda.bindings import driver

        from .runtime.launch import _check, loaded

        lr = loaded(rung, torch.cuda.current_device())
        lr.device.set_current()  # the global's address is per context: the primary one, torch's too
        library = lr.module.handle  # cuda.core >= 1.2 loads modules as libraries: a CUlibrary
        if not isinstance(library, driver.CUlibrary):  # else ask the driver which library the kernel is in
            (library,) = _check(driver.cuKernelGetLibrary(lr.kernels["attn_fwd"].handle), "cuKernelGetLibrary")
        res = driver.cuLibraryGetGlobal(library, SYMBOL.encode())
        ptr, nbytes = _check(res, f"cuLibraryGetGlobal({SYMBOL})")
        return int(ptr), int(nbytes)

    def clear_buffer(self, rung, nbytes: int) -> None:
        from cuda.bindings import driver

        from .runtime.launch import _check

        ptr, size = self._symbol(rung)
        if size != nbytes:
            raise RuntimeError(f"the kernel's {SYMBOL} has {size} bytes, the host expects {nbytes}")
        self.synchronize()
        _check(driver.cuMemsetD8(ptr, 0, size), "cuMemsetD8")
        self.synchronize()

    def read_buffer(self, rung, nbytes: int):
        import numpy as np
        from cuda.bindings import driver

        from .runtime.launch import _check

        ptr, size = self._symbol(rung)
        if size != nbytes:
            raise RuntimeError(f"the kernel's {SYMBOL} has {size} bytes, the host expects {nbytes}")
        host = np.zeros(size // 4, dtype=np.uint32)
        self.synchronize()
        _check(driver.cuMemcpyDtoH(host, ptr, size), "cuMemcpyDtoH")
        return host

    def describe(self) -> dict:
        import torch

        from .runtime.compiler import nvrtc_version

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {
            "device": props.name,
            "sms": props.multi_processor_count,
            "torch": torch.__version__,
            "nvrtc": ".".join(map(str, nvrtc_version())),
        }


@dataclasses.dataclass
class TraceRun:
    """One traced launch: the buffer's words, the two outputs and whether they are equal."""

    raw: object
    layout: Layout
    same_output: bool
    max_abs_diff: float
    meta: dict


def launched_variant(rung: rungs.Rung, seqlen_k: int, causal: bool = False, head_dim: int | None = None) -> rungs.Rung:
    """The build that a launch of ``rung`` (or of its trace build) runs for these arguments: the compile-time
    variant that :func:`attnclimb.runtime.launch.run_rung` picks (causal, another head_dim, the long-K/V tiles
    from ``Rung.long_kv``'s bound), with ``rung``'s own macros (``TRACE=1`` ...) kept; ``rung`` itself when
    none applies. Its ``threads`` give the trace buffer's warpgroups. ``ValueError`` when ``rung`` lacks the
    feature or head_dim."""
    from .runtime.launch import launch_variant

    head_dim = rung.head_dim if head_dim is None else head_dim
    return launch_variant(rung, causal, False, False, False, head_dim, seqlen_k)


def run_trace(
    rung,
    shape,
    *,
    ctas: int = DEFAULT_CTAS,
    clock: str = "global",
    seed: int = 0,
    causal: bool = False,
    head_dim: int | None = None,
    backend=None,
) -> TraceRun:
    """Run ``rung`` untraced, then its trace build twice (a warm-up, then with a cleared buffer), on the
    same random inputs of ``shape = (B, H, Sq, Sk)`` (bf16, ``head_dim`` columns, default the rung's; with
    torch's causal mask if ``causal``); return the buffer and whether the traced output equals the untraced
    one bit for bit (the trace must not change results). The buffer is read from the build that ran
    (:func:`launched_variant`: e.g. three consumer warpgroups at head_dim 64 or on the long-K/V tiles)."""
    import torch

    backend = backend or CudaBackend()
    b, h, sq, sk = shape
    d = rung.head_dim if head_dim is None else head_dim
    tr = traced(rung, ctas, clock=clock)  # launched as the rung is: run_rung picks the variant
    built = launched_variant(tr, sk, causal, d)  # ... and this is it: its buffer and warpgroups
    layout = Layout.of(built)
    gen = torch.Generator(device=backend.device).manual_seed(seed)

    def rand(rows):
        return torch.randn(b, h, rows, d, generator=gen, device=backend.device).to(torch.bfloat16)

    q, k, v = rand(sq), rand(sk), rand(sk)
    scale = d**-0.5
    o_ref = torch.full_like(q, float("nan"))
    o_tr = torch.full_like(q, float("nan"))
    mask = {"causal": True} if causal else {}  # the plain trace calls run(rung, q, k, v, o, scale) as before
    backend.run(rung, q, k, v, o_ref, scale, **mask)
    backend.run(tr, q, k, v, o_tr, scale, **mask)  # warm-up: compiles and loads the trace build
    backend.synchronize()
    o_tr.fill_(float("nan"))
    backend.clear_buffer(built, layout.nbytes)
    backend.run(tr, q, k, v, o_tr, scale, **mask)
    backend.synchronize()
    raw = backend.read_buffer(built, layout.nbytes)
    same = bool(torch.equal(o_ref.view(torch.int16), o_tr.view(torch.int16)))  # bit for bit, NaNs included
    diff = (o_ref.float() - o_tr.float()).abs().nan_to_num(float("inf")).max().item() if not same else 0.0
    grid = built.num_m_blocks(sq) * b * h
    meta = {
        "name": rung.name,
        "shape": {"batch": b, "heads": h, "seqlen_q": sq, "seqlen_k": sk, "head_dim": d},
        "work_tiles": grid,
        "traced_ctas": ctas,
        **backend.describe(),
        "seed": seed,
        "command": f"python -m attnclimb trace {rung.number} --shape {b}x{h}x{sq}x{sk}"
        + (" --causal" if causal else "")
        + (f" --head-dim {d}" if d != rung.head_dim else "")
        + (f" --ctas {ctas}" if ctas != DEFAULT_CTAS else "")
        + (f" --clock {clock}" if clock != "global" else "")
        + (f" --seed {seed}" if seed else ""),
    }
    if causal:
        meta["causal"] = True
    if (built.block_m, built.block_n, built.threads) != (rung.block_m, rung.block_n, rung.threads):
        meta["tiles"] = {"block_m": built.block_m, "block_n": built.block_n, "threads": built.threads}
    return TraceRun(raw, layout, same, diff, meta)


# ------------------------------------------------------------------------------------------ the command


def default_dir() -> Path:
    from .bench.paths import REPO_ROOT

    return REPO_ROOT / "docs" / "figures" / "timelines"


def parse_shape(text: str) -> tuple:
    """``"BxHxSqxSk"`` -> ``(B, H, Sq, Sk)``, every size >= 1; ``ValueError`` otherwise."""
    parts = text.lower().split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"--shape takes BxHxSqxSk with every size >= 1 (e.g. 1x16x2048x2048), got {text!r}")
    return shape


def output_stem(doc: dict) -> str:
    """``rungNN``, with ``-causal`` and ``-dNN`` for a trace of those variants (``rung16-causal-d64``), so that
    such a trace never takes the place of a rung page's timeline (``docs/figures/timelines/rungNN.*``)."""
    stem = f"rung{doc['rung']:02d}"
    if doc.get("causal"):
        stem += "-causal"
    d = (doc.get("shape") or {}).get("head_dim", rungs.HEAD_DIM)
    return stem + (f"-d{d}" if d != rungs.HEAD_DIM else "")


def write_outputs(doc: dict, out_dir, formats=("svg", "png")) -> list:
    """``rungNN.json`` (:func:`output_stem`) and the chart in each of ``formats`` into ``out_dir``; returns the
    paths."""
    from .figures.timeline import draw_timeline

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = output_stem(doc)
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    written = [path]
    shape = doc.get("shape")
    title = f"Rung {doc['rung']}" + (f" ({doc['name']})" if "name" in doc else "") + ": measured phases per warpgroup"
    if shape:
        title += f", {shape['batch']}x{shape['heads']}x{shape['seqlen_q']}x{shape['seqlen_k']}"
        if shape.get("head_dim", rungs.HEAD_DIM) != rungs.HEAD_DIM:
            title += f" d{shape['head_dim']}"
    if doc.get("causal"):
        title += ", causal"
    if "device" in doc:
        title += f", {doc['device']}"
    for fmt in formats:
        written.append(draw_timeline(doc, out_dir / f"{stem}.{fmt}", title=title))
    return written


def add_arguments(p) -> None:
    p.add_argument("rung", type=int, metavar="RUNG", help="the rung to trace (an instrumented one: 5 and up)")
    p.add_argument(
        "--shape",
        default="x".join(map(str, DEFAULT_SHAPE)),
        help="BxHxSqxSk of the random inputs (default: %(default)s)",
    )
    p.add_argument("--out", help="folder for rungNN.json/.svg/.png (default: docs/figures/timelines)")
    p.add_argument(
        "--ctas",
        type=int,
        default=DEFAULT_CTAS,
        help="record the CTAs with blockIdx.x below this (default: %(default)s; TRACE_CTAS)",
    )
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="global",
        help="stamps from %%globaltimer (global: ns, one clock for all SMs; the default) or from each SM's "
        "%%clock64 (sm: cycles, finer; CTAs not aligned with each other), should the global timer tick "
        "too coarsely",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: %(default)s)")
    p.add_argument(
        "--causal",
        action="store_true",
        help="torch's causal mask (a rung with the causal feature); files rungNN-causal.*",
    )
    p.add_argument(
        "--head-dim",
        type=int,
        default=None,
        help="head_dim of the random inputs (default: the rung's, 128; others where the rung has them, e.g. "
        "64: files rungNN-d64.*)",
    )


def main(args, backend=None) -> int:
    """The ``trace`` subcommand: 0 on success, 1 when the traced output differs from the untraced one, 2 on
    bad arguments or without a Hopper GPU (checked unless a ``backend`` is given: the tests' fake)."""
    try:
        rung = rungs.get(args.rung)
        shape = parse_shape(args.shape)
        causal, head_dim = bool(getattr(args, "causal", False)), getattr(args, "head_dim", None)
        launched_variant(traced(rung, args.ctas, clock=args.clock), shape[3], causal, head_dim)
    except ValueError as exc:
        print(f"attnclimb trace: {exc}", file=sys.stderr)
        return 2
    if backend is None:
        from .api import hopper_unavailable_reason

        why = hopper_unavailable_reason()
        if why is not None:
            print(
                f"attnclimb trace: needs a Hopper GPU (sm_90: H100/H200) to run rung {rung.number}; none is "
                f"usable here: {' '.join(why.split())}. (Without a GPU, `python -m attnclimb build --trace` "
                "compiles the trace builds.)",
                file=sys.stderr,
            )
            return NO_HOPPER_EXIT
    run = run_trace(
        rung, shape, ctas=args.ctas, clock=args.clock, seed=args.seed, causal=causal, head_dim=head_dim, backend=backend
    )
    if not run.same_output:
        print(
            f"attnclimb trace: the trace build of rung {rung.number} changed the output (max |diff| "
            f"{run.max_abs_diff:g} against the untraced kernel); nothing written",
            file=sys.stderr,
        )
        return 1
    doc = decode(run.raw, run.layout, rung=rung.number, meta=run.meta)
    if not doc["ctas"]:
        print("attnclimb trace: no CTA recorded anything (is the grid empty?)", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else default_dir()
    for path in write_outputs(doc, out):
        print(f"wrote {path}")
    lost = dropped_events(doc)
    if lost:
        print(
            f"warning: {lost} events did not fit in the buffer ({run.layout.events} per warpgroup) and are "
            "missing from the chart; trace a shorter --shape",
            file=sys.stderr,
        )
    if doc["unit"] == "ns" and doc["timer_step"] >= COARSE_STEP_NS:
        print(
            f"warning: %globaltimer advanced in steps of {doc['timer_step']} ns on this GPU: phases shorter "
            "than that show as 0 or one step; `--clock sm` stamps with each SM's cycle counter instead",
            file=sys.stderr,
        )
    n_wg = sum(len(c["warpgroups"]) for c in doc["ctas"])
    n_ev = sum(len(wg["events"]) for c in doc["ctas"] for wg in c["warpgroups"])
    print(
        f"rung {rung.number}: {len(doc['ctas'])} CTAs, {n_wg} warpgroups, {n_ev} events; "
        "the output equals the untraced kernel's bit for bit"
    )
    return 0
