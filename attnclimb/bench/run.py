"""``python -m attnclimb bench``: time every rung and every peer on the benchmark shapes.

Flow per shape: allocate enough (q, k, v) sets to rotate beyond L2, compute a float32 reference for two
heads, then for each implementation: check its output (rel. L2 <= 1e-2, else the row is
``"error: wrong result ..."`` and it is not timed), then take the median time. Rows, environment and
settings go to ``<out>/<device>-YYYYMMDD-HHMMSS.json`` and ``<out>/latest.json``; the chart to
``<out>/ladder.png``; the table is printed last.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from . import paths
from . import peers as peers_mod
from . import shapes as shapes_mod
from .timing import REL_L2_TOL

DESCRIPTION = (
    "Check and time every rung and every peer (SDPA backends, FlashAttention-4 when installed) on "
    "the benchmark shapes; write a results JSON and the chart, then print the table. Needs a "
    "Hopper GPU."
)
REPO_ROOT = paths.REPO_ROOT
SCHEMA_VERSION = 1
ROW_FIELDS = (
    "impl",
    "label",
    "shape",
    "batch",
    "heads",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "causal",
    "ms",
    "tflops",
    "ratio_to_cudnn",
    "rel_l2",
    "status",
)
DEFAULT_WARMUP_MS, DEFAULT_REP_MS = 50.0, 200.0
QUICK_WARMUP_MS, QUICK_REP_MS = 10.0, 40.0
NO_HOPPER_EXIT = 2


# --------------------------------------------------------------------------------------------- rows / JSON


def make_row(
    impl: str, shape, status: str = "ok", ms: float | None = None, label: str | None = None, rel_l2: float | None = None
) -> dict:
    """One result row (see :data:`ROW_FIELDS`); ``tflops`` is derived from ``ms`` for ``status == "ok"``.

    Args:
        impl: ``rungNN`` or a peer key (``sdpa_cudnn``, ``sdpa_flash``, ``sdpa_efficient``, ``fa4``).
        shape: a :class:`~attnclimb.bench.shapes.Shape`.
        status: ``"ok"``, ``"skipped: <why>"`` or ``"error: <msg>"``.
        ms: median milliseconds per call (required when ``status == "ok"``, else ignored).

    ``ratio_to_cudnn`` is left ``None``; :func:`fill_ratios` sets it once the whole run is known.
    """
    if status == "ok":
        if ms is None:
            raise ValueError("an ok row needs ms")
        t = shapes_mod.tflops(shape.flops, ms)
    else:
        if not status.startswith(("skipped: ", "error: ")):
            raise ValueError(f"status must be 'ok', 'skipped: ...' or 'error: ...', got {status!r}")
        ms, t = None, None
    return {
        "impl": impl,
        "label": label or peers_mod.PEER_LABELS.get(impl, impl),
        "shape": shape.name,
        "batch": shape.batch,
        "heads": shape.heads,
        "seqlen_q": shape.seqlen_q,
        "seqlen_k": shape.seqlen_k,
        "head_dim": shape.head_dim,
        "causal": shape.causal,
        "ms": None if ms is None else float(f"{ms:.6g}"),
        "tflops": None if t is None else float(f"{t:.6g}"),
        "ratio_to_cudnn": None,
        "rel_l2": None if rel_l2 is None or rel_l2 != rel_l2 or rel_l2 == float("inf") else float(f"{rel_l2:.3e}"),
        "status": status,
    }


def fill_ratios(rows: list, reference: str = peers_mod.REFERENCE_KEY) -> list:
    """Set ``ratio_to_cudnn = tflops / tflops(reference, same shape)`` on every ok row (in place; returns rows).

    Rows whose shape has no ok ``reference`` row keep ``None``.
    """
    ref = {r["shape"]: r["tflops"] for r in rows if r["impl"] == reference and r["status"] == "ok"}
    for r in rows:
        base = ref.get(r["shape"])
        r["ratio_to_cudnn"] = float(f"{r['tflops'] / base:.4g}") if (r["status"] == "ok" and base) else None
    return rows


def build_results(env: dict, rows: list, shapes: list, settings: dict | None = None, notes: list | None = None) -> dict:
    """The JSON document: environment fields at top level, then ``settings``, ``shapes``, ``notes``, ``rows``."""
    doc = {"schema": SCHEMA_VERSION}
    doc.update(env)
    doc["settings"] = settings or {}
    doc["shapes"] = [
        {
            "name": s.name,
            "label": s.label,
            "batch": s.batch,
            "heads": s.heads,
            "seqlen_q": s.seqlen_q,
            "seqlen_k": s.seqlen_k,
            "head_dim": s.head_dim,
            "causal": s.causal,
            "headline": s.headline,
        }
        for s in shapes
    ]
    doc["notes"] = list(notes or [])
    doc["rows"] = fill_ratios(rows)
    return doc


def device_slug(device_name: str) -> str:
    """``"NVIDIA H200" -> "h200"``, ``"NVIDIA H100 80GB HBM3" -> "h100"``; ``"gpu"`` when nothing fits."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", device_name or "")
    return m.group(1).lower() if m else "gpu"


def write_results(doc: dict, out_dir, when: datetime | None = None) -> tuple:
    """Write ``doc`` to ``<out_dir>/<slug>-YYYYMMDD-HHMMSS.json`` and an identical ``latest.json``.

    Returns ``(stamped_path, latest_path)``. ``latest.json`` is a real file (a copy, not a symlink).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    when = when or datetime.now(timezone.utc)
    base = f"{device_slug(doc.get('device', ''))}-{when.strftime('%Y%m%d-%H%M%S')}"
    stamped, n = out_dir / f"{base}.json", 1
    while stamped.exists():  # two runs in one second keep both files
        stamped, n = out_dir / f"{base}-{n}.json", n + 1
    text = json.dumps(doc, indent=2) + "\n"
    stamped.write_text(text)
    latest = out_dir / "latest.json"
    tmp = out_dir / f".latest.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, latest)  # atomic: a reader never sees half a latest.json (a symlink is replaced too)
    return stamped, latest


# ----------------------------------------------------------------------------------------- environment


def _run(cmd: list, cwd=None, timeout: float = 10.0) -> str | None:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except Exception:
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_commit(repo=REPO_ROOT) -> str:
    """``git rev-parse HEAD`` (+ ``-dirty`` when tracked files differ); env ``ATTNCLIMB_GIT_COMMIT`` overrides.

    Returns ``"unknown"`` outside a git checkout or before the first commit.
    """
    forced = os.environ.get("ATTNCLIMB_GIT_COMMIT")
    if forced:
        return forced
    head = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if not head:
        return "unknown"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return head + ("-dirty" if dirty else "")


_SMI_CLOCKS = (
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.draw",
    "power.limit",
    "temperature.gpu",
)


def _smi_query(fields: str) -> list | None:
    """Values of one ``nvidia-smi --query-gpu`` line for torch's current device (by UUID), else the first GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    ids = []
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
        if uuid:
            ids.append(["-i", str(uuid) if str(uuid).startswith("GPU-") else f"GPU-{uuid}"])
    except Exception:
        pass
    for sel in ids + [[]]:
        out = _run(["nvidia-smi", *sel, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], timeout=5)
        if out:
            return [v.strip() for v in out.splitlines()[0].split(",")]
    return None


def gpu_clocks() -> dict | None:
    """Current SM/memory clocks (MHz), power (W) and temperature (C) from ``nvidia-smi``; ``None`` if absent."""
    vals = _smi_query(",".join(_SMI_CLOCKS))
    if not vals:
        return None
    res = {}
    for k, v in zip(_SMI_CLOCKS, vals):
        unit = "_mhz" if k.startswith("clocks") else "_w" if k.startswith("power") else "_c"
        try:
            res[k.replace(".", "_") + unit] = float(v)
        except ValueError:
            pass
    return res or None


def driver_version() -> str | None:
    """The NVIDIA driver version (``nvidia-smi``, else pynvml, else the CUDA driver API version)."""
    vals = _smi_query("driver_version")
    if vals and vals[0]:
        return vals[0]
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        pass
    try:
        from cuda.bindings import driver as cu

        _, v = cu.cuDriverGetVersion()
        return f"CUDA driver API {v // 1000}.{(v % 1000) // 10}"
    except Exception:
        return None


def collect_env(when: datetime | None = None) -> dict:
    """Device, driver, torch/CUDA/cuDNN/triton versions, git commit, UTC date (``when``, default now) and
    clocks. Needs CUDA."""
    import torch

    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    return {
        "device": torch.cuda.get_device_name(dev),
        "capability": "{}.{}".format(*torch.cuda.get_device_capability(dev)),
        "sm_count": props.multi_processor_count,
        "driver_version": driver_version(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),
        "triton_version": triton_version,
        "python_version": platform.python_version(),
        "commit": git_commit(),
        "date": (when or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "gpu_clocks": {"start": gpu_clocks()},
    }


def hopper_status() -> str | None:
    """:func:`attnclimb.hopper_unavailable_reason`: ``None`` when a Hopper GPU is usable, else why not
    (a seam the CPU tests replace)."""
    from ..api import hopper_unavailable_reason

    return hopper_unavailable_reason()


# ------------------------------------------------------------------------------------------- progress


class _Progress:
    """rich, else tqdm, else one plain line per step; always on stderr so stdout ends with the table."""

    def __init__(self, total: int):
        self.total, self.done, self._kind = total, 0, "plain"
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(
                TextColumn("{task.description:<34}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._p.start()
            self._task = self._p.add_task("bench", total=total)
            self._kind = "rich"
            return
        except Exception:
            pass
        try:
            from tqdm import tqdm

            self._p = tqdm(total=total, file=sys.stderr, dynamic_ncols=True)
            self._kind = "tqdm"
        except Exception:
            pass

    def describe(self, text: str):
        if self._kind == "rich":
            self._p.update(self._task, description=text)
        elif self._kind == "tqdm":
            self._p.set_description_str(text)

    def step(self, result: str):
        """Advance by one and log ``result`` above the bar (so logs of non-interactive runs show each row)."""
        self.done += 1
        self.log(f"[{self.done}/{self.total}] {result}")
        if self._kind == "rich":
            self._p.advance(self._task)
        elif self._kind == "tqdm":
            self._p.update(1)

    def log(self, text: str):
        if self._kind == "rich":
            self._p.console.print(text, markup=False, highlight=False)
        elif self._kind == "tqdm":
            self._p.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self):
        if self._kind in ("rich",):
            self._p.stop()
        elif self._kind == "tqdm":
            self._p.close()


# ---------------------------------------------------------------------------------------------- runner


def _sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def _context_alive(device: str = "cuda") -> str | None:
    import torch

    try:
        _sync(device)
        torch.ones(1, device=device).add_(1).item()
        return None
    except Exception as exc:
        return peers_mod._one_line(exc)


def run_bench(
    impls: list,
    shapes: list,
    warmup_ms: float,
    rep_ms: float,
    respect_limits: bool = True,
    progress=None,
    device: str = "cuda",
) -> tuple:
    """Check and time every ``impl`` on every ``shape``.

    ``device="cpu"`` exists for the CPU tests of this loop (with a fake timer); benchmarks use CUDA.

    Returns ``(rows, notes, settings)``: rows without ratios (see :func:`build_results`), one-line notes
    (unavailable impls, lost context) and the settings actually used.
    """
    import torch

    from . import timing

    notes, rows = [], []
    avail = {}
    for impl in impls:
        ok, why = impl.available()
        avail[impl.key] = (ok, why)
        if not ok:
            notes.append(f"{impl.key} skipped: {why}")
    l2 = timing.l2_cache_bytes() if device != "cpu" else timing.DEFAULT_L2_BYTES
    settings = {
        "warmup_ms": warmup_ms,
        "rep_ms": rep_ms,
        "timer": timing.timer_name(),
        "l2_bytes": l2,
        "input_sets": {},
        "respect_max_bench_seqlen": respect_limits,
        "check": f"float32 reference on (b,h) first and last, all rows; rel L2 <= {REL_L2_TOL:g}",
    }
    dead = None  # set when a kernel killed the CUDA context: nothing after it can run
    prog = progress or _Progress(len(impls) * len(shapes))

    for shape in shapes:
        plan = []
        for impl in impls:
            ok, why = avail[impl.key]
            skip = None if ok else f"skipped: {why}"
            if skip is None and respect_limits:
                r = impl.skip_reason(shape)
                skip = f"skipped: {r}" if r else None
            plan.append((impl, skip))
        if dead is None and any(s is None for _, s in plan):
            try:
                n_sets = timing.num_input_sets(shape.qkv_bytes(), l2)
                settings["input_sets"][shape.name] = n_sets
                sets = timing.make_inputs(shape, n_sets, device=device)
                pairs = timing.check_heads(shape)
                refs = timing.reference_slices(*sets[0], pairs)
            except Exception as exc:
                msg = peers_mod._one_line(exc)
                dead = _context_alive(device) and f"setup of {shape.name} failed ({msg})"
                plan = [(i, s or f"error: input setup failed ({msg})") for i, s in plan]
                sets = refs = None
        for impl, skip in plan:
            prog.describe(f"{impl.key} @ {shape.label}")
            if dead is not None and skip is None:
                skip = f"error: CUDA context lost earlier ({dead})"
            if skip is not None:
                rows.append(make_row(impl.key, shape, skip, label=impl.label))
                prog.step(f"{impl.key} {shape.label}: {skip}")
                continue
            rows.append(_bench_one(impl, shape, sets, pairs, refs, warmup_ms, rep_ms, device))
            r = rows[-1]
            prog.step(
                f"{impl.key} {shape.label}: " + (f"{r['tflops']:.1f} TFLOP/s" if r["status"] == "ok" else r["status"])
            )
            if r["status"].startswith("error:") and "wrong result" not in r["status"]:
                lost = _context_alive(device)
                if lost:
                    dead = f"{impl.key} on {shape.name}: {lost}"
                    notes.append(f"CUDA context lost after {dead}; later rows are errors")
                    prog.log(notes[-1])
        sets = refs = None
        if dead is None and device != "cpu":
            torch.cuda.empty_cache()
    if progress is None:
        prog.close()
    return rows, notes, settings


def _bench_one(impl, shape, sets, pairs, refs, warmup_ms, rep_ms, device="cuda") -> dict:
    import torch

    from . import timing

    prepared = out = None
    try:
        with torch.no_grad(), impl.context():
            prepared = [impl.prepare(*s) for s in sets]
            out = impl.call(prepared[0])  # first call: JIT/compile happens here, outside the timing
            _sync(device)
            ok, err, why = timing.check_output(impl.to_bhsd(out), refs, pairs, shape)
            out = None
            if not ok:
                return make_row(impl.key, shape, f"error: wrong result ({why})", label=impl.label, rel_l2=err)
            ms = timing.median_ms(timing.rotating(impl.call, prepared), warmup_ms, rep_ms)
        return make_row(impl.key, shape, "ok", ms=ms, label=impl.label, rel_l2=err)
    except torch.cuda.OutOfMemoryError as exc:
        return make_row(impl.key, shape, f"error: out of memory ({peers_mod._one_line(exc, 80)})", label=impl.label)
    except Exception as exc:
        msg = peers_mod._one_line(exc)
        if impl.kind == "peer" and impl.key.startswith("sdpa_") and "No available kernel" in msg:
            return make_row(impl.key, shape, "skipped: this SDPA backend refused the shape", label=impl.label)
        return make_row(impl.key, shape, f"error: {msg}", label=impl.label)
    finally:
        prepared = out = None


# ------------------------------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    """Add the ``bench`` options to an argparse (sub)parser."""
    p.add_argument("--rungs", metavar="LIST", help="only these rungs, e.g. 4,5,8 (default: all)")
    p.add_argument(
        "--impls",
        metavar="LIST",
        help="comma list of rungNN, sdpa_cudnn, sdpa_flash, sdpa_efficient, fa4, or the groups "
        "rungs, peers, sdpa, all (default: every rung and every peer)",
    )
    p.add_argument(
        "--seqlens",
        metavar="LIST",
        help="FA-paper seqlens and/or 'wan', e.g. 4k,8192,wan (default: 1k,2k,4k,8k,16k,wan)",
    )
    p.add_argument("--quick", action="store_true", help="4k, 16k and wan only, shorter warm-up and rep")
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help=f"results folder (default: {paths.results_dir()}, where report reads them)",
    )
    p.add_argument("--no-chart", action="store_true", help="don't write ladder.png")
    p.add_argument("--warmup-ms", type=float, default=None, help="warm-up time per measurement (ms)")
    p.add_argument("--rep-ms", type=float, default=None, help="timed repetitions per measurement (ms)")
    p.add_argument(
        "--no-limits",
        action="store_true",
        help="ignore each rung's max_bench_seqlen (slow rungs run the big shapes too)",
    )


def main(args) -> int:
    """Run the ``bench`` subcommand. Exit 0 when every row is ok/skipped, 1 on any error row, 2 without Hopper."""
    why = hopper_status()
    if why is not None:
        print(f"attnclimb bench: no Hopper GPU (sm_90: H100/H200) available: {' '.join(why.split())}", file=sys.stderr)
        return NO_HOPPER_EXIT
    try:
        impls = peers_mod.select_impls(args.rungs, args.impls)
        seqlens = shapes_mod.parse_seqlens(args.seqlens) if args.seqlens else None
    except ValueError as exc:
        print(f"attnclimb bench: {exc}", file=sys.stderr)
        return 2
    shapes = shapes_mod.default_shapes(seqlens, quick=args.quick)
    if not impls:
        print("attnclimb bench: nothing selected", file=sys.stderr)
        return 2
    warmup = args.warmup_ms if args.warmup_ms is not None else (QUICK_WARMUP_MS if args.quick else DEFAULT_WARMUP_MS)
    rep = args.rep_ms if args.rep_ms is not None else (QUICK_REP_MS if args.quick else DEFAULT_REP_MS)
    out_dir = Path(args.out) if args.out else paths.results_dir()

    t0 = time.monotonic()
    started = datetime.now(timezone.utc)
    env = collect_env(started)
    rows, notes, settings = run_bench(impls, shapes, warmup, rep, respect_limits=not args.no_limits)
    env["gpu_clocks"]["end"] = gpu_clocks()
    settings["elapsed_s"] = round(time.monotonic() - t0, 1)
    if not any(i.key == peers_mod.REFERENCE_KEY for i in impls):
        notes.append("sdpa_cudnn not selected: ratio_to_cudnn is empty")
    doc = build_results(env, rows, shapes, settings, notes)
    stamped, latest = write_results(doc, out_dir, started)

    from . import report

    for n in notes:
        print(f"note: {n}")
    print(f"wrote {stamped} and {latest.name}")
    if not args.no_chart:
        png = report.write_chart(doc, out_dir / "ladder.png")
        print(f"wrote {png}" if png else "chart skipped: matplotlib not importable")
    print(f"{settings['elapsed_s']:.0f} s; README table: python -m attnclimb report {stamped}")
    print()
    print(report.console_table(doc))
    return 1 if any(r["status"].startswith("error:") for r in rows) else 0
