"""``python -m attnclimb bench``: time every rung and every peer on the benchmark shapes.

Flow per shape: allocate enough (q, k, v) sets to rotate beyond L2, compute a float32 reference for two
heads, then check every implementation's output (rel. L2 <= 1e-2, else the row is
``"error: wrong result ..."`` and it is not timed). Then the implementations that passed are timed
in rounds (default 3): every round times each of them once (a median over ~``rep_ms`` of calls), in an
order that is rotated and reversed from round to round (:func:`~attnclimb.bench.timing.round_order`),
so that no implementation always runs right after the same heavy neighbour or at the same point of
the clock's drift. A row's ``ms`` is the median over rounds of each round's median; ``rounds_ms`` keeps
the per-round values (in round order).

The headline implementations (the rungs from rung 9 up, cuDNN and FA4 by default; ``--headline``) get a longer
measurement on the main shapes (``CONTEST_WARMUP_MS`` then ``CONTEST_REP_MS`` per round), the rest
``warmup_ms`` + ``rep_ms``; calls of 20 ms or more are timed without do_bench's own estimate
(:func:`~attnclimb.bench.timing.median_ms`).

Opt-in (off by default: one bench run with it was not steadier, see ``DEFAULT_CONTEST_SPAN``): with
``--contest-span X`` the close ones on the main shapes (within X times the fastest by a quick estimate)
get a longer measurement in each round (``CONTEST_WARMUP_MS`` then ``CONTEST_REP_MS``), since at the power
cap each kernel settles at a clock of its own over a few hundred ms; with ``--interleave`` as well they are
timed call by call instead (:func:`~attnclimb.bench.timing.interleaved_ms`): a far finer ratio, but at one
clock shared by all of them, which is not the clock each settles at alone.

The feature columns (causal, grouped-query, head_dim 64 and 256; issue 8) come last, a group of their own in
the JSON (``shapes[].group``; rows and shapes carry ``head_dim``) and in the report; an implementation without
the variant gets a ``"skipped: ..."`` row there. Then the drop-in rows (:mod:`attnclimb.bench.dropin`, skipped
with ``--no-dropin-rows``): a BSHD-view call against the contiguous call, and the host overhead per call, each
in a top-level section of its own. Rows, sections, environment and settings go to
``<out>/<device>-YYYYMMDD-HHMMSS.json`` and ``<out>/latest.json``; the chart to ``<out>/ladder.png``; the
tables are printed last.
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
# 2: rows carry ratio_to_fa4 and rounds_ms; settings carry rounds. 3: the top-level sections "bshd_view" and
# "host_overhead" (attnclimb/bench/dropin.py; absent when the bench ran with --no-dropin-rows). 4: rows and
# shapes carry heads_kv, shapes their group ("main" or "features": causal, GQA and head_dim 64/256 columns,
# issue 8; head_dim was in rows and shapes from the start). 5: settings carry the contest's span, times and mode
# and, per shape, the contenders (and the implementations timed call by call, with --interleave); since the eleventh
# session also the headline list (settings.headline: the implementations given the contest's times by name).
SCHEMA_VERSION = 5
ROW_FIELDS = (
    "impl",
    "label",
    "shape",
    "batch",
    "heads",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "causal",
    "ms",
    "tflops",
    "ratio_to_cudnn",
    "ratio_to_fa4",
    "rel_l2",
    "status",
    "rounds_ms",
)
RATIO_FIELDS = {"ratio_to_cudnn": peers_mod.REFERENCE_KEY, "ratio_to_fa4": peers_mod.FA4_KEY}
# Time budgets of one measurement: one implementation on one shape in one round (do_bench's warmup and
# rep, in ms: the number of calls follows from the kernel's time, at least one of each).
DEFAULT_WARMUP_MS, DEFAULT_REP_MS = 25.0, 100.0
QUICK_WARMUP_MS, QUICK_REP_MS = 10.0, 40.0
DEFAULT_ROUNDS = 3
# The contest (the implementations within DEFAULT_CONTEST_SPAN of the fastest at a main-group shape, by a quick
# estimate after the check): per round, CONTEST_WARMUP_MS of calls before CONTEST_REP_MS of timed ones. Two device
# probes (benchmarks/ab/timing-probe-33be169-h200.json and timing-probe2-e2a5b8f-h200.json, with nvidia-smi's
# samples): at the 690 W cap a kernel's SM clock settles at its own level (1 680-1 800 MHz by kernel at 4k) over
# 100-300 ms after the switch from another kernel; 3 rounds of 25 + 100 ms left ratios of close kernels with a
# spread of 0.4-1.7 % over repeats, 5 rounds of 100 + 400 ms 0.02-0.7 %. Timing them call by call, interleaved
# (--interleave), spread 0.1 % or less, but every kernel then runs at the clock of the mix (1 710 MHz at 4k):
# rung 8, which settles at 1 800 MHz alone, measured 5 % slower that way. A whole bench with the contest on
# (span 1.1, 200 + 100 ms, the rest at 10 + 50 ms; benchmarks/ab/bench-contest-f64a4bf-h200.json) was no better:
# the estimate (then three single calls, each waiting on its own launch; now back to back) left FA4 and cuDNN
# out of the 4k contest, the short windows of the rest spread by up to 13 % (FA4 at 2k), and it took 338 s
# (issue 13: 5 min). So the contest is off by default (span 0) until a bench run shows it helps; --contest-span 1.1
# (and --interleave) turn it on.
DEFAULT_CONTEST_SPAN = 0.0
# The headline implementations (eleventh session; the rungs from SCHEDULE_RUNGS_FROM since the sixteenth, the top
# three before): on every main-group shape these rungs, cuDNN and FA4 are
# contenders by name, without an estimate, each measurement CONTEST_WARMUP_MS then CONTEST_REP_MS, the windows of
# scripts/ab_rungs.py (and of the first probe's "5 x (100 + 400 ms)": 0.26-0.49 % spread of close ratios over
# repeats, against 0.39-1.02 % for 25 + 100 ms). What the top rung is measured against (issue 13) is timed so; the
# lower rungs keep warmup_ms + rep_ms. The time comes from the long calls (timing.LONG_CALL_MS), which no longer pay
# do_bench's five-call estimate. "--headline none" turns it off.
CONTEST_WARMUP_MS, CONTEST_REP_MS = 100.0, 400.0


def parse_headline(text: str | None) -> tuple:
    """``--headline``'s value: ``None`` -> :func:`headline_keys`; ``"none"`` (or empty) -> ``()``; else the comma
    list's keys."""
    if text is None:
        return headline_keys()
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    return () if keys in ((), ("none",)) else keys


# The first rung of issue 13's schedule ladder (rung 9, the softmax under P·V): from it up, every neighbour step is
# judged on the bench ("every new rung faster than the rung below"), and the steps there are 0-4 % where 25 + 100-ms
# rounds spread by 0.4-1.7 % (above), so these rungs are headline implementations too (sixteenth session: in the
# fifteenth session's bench four of their steps fell below 1 at one shape or two, where the same-process run of 4
# long rounds had one). About 50 s more than the top three alone.
SCHEDULE_RUNGS_FROM = 9


def headline_keys() -> tuple:
    """The default headline implementations: the rungs from :data:`SCHEDULE_RUNGS_FROM` to the top (top first),
    SDPA's cuDNN backend and FA4 (their keys)."""
    from .. import rungs

    top = [r.key for r in rungs.RUNGS if SCHEDULE_RUNGS_FROM <= r.number <= rungs.TOP.number]
    return (*reversed(top), peers_mod.REFERENCE_KEY, peers_mod.FA4_KEY)


ORDER_NOTE = (
    "per shape: every implementation checked once, then timed once per round; even rounds run the list "
    "forwards from implementation (r//2)*n//ceil(rounds/2), odd rounds the previous round backwards; "
    "ms = median over rounds of each round's median (rounds_ms, in round order); on main-group shapes the "
    "headline implementations (settings.headline) get contest_warmup_ms of calls then contest_rep_ms timed in "
    "each round; when contest_span >= 1, "
    "on main-group shapes the implementations within contest_span of the fastest (a quick estimate after "
    "the check; settings.contenders) get contest_warmup_ms of calls then contest_rep_ms timed in each round, "
    "so that the power-capped clock settles; with contest_mode 'interleaved' they are instead timed call by "
    "call, interleaved (L2 cleared before each call, events around it, order rotated and reversed between "
    "repetitions, rounds x rep_ms of calls each; rounds_ms = the medians of `rounds` consecutive slices), "
    "all at the mix's clock"
)
NO_HOPPER_EXIT = 2


# --------------------------------------------------------------------------------------------- rows / JSON


def make_row(
    impl: str,
    shape,
    status: str = "ok",
    ms: float | None = None,
    label: str | None = None,
    rel_l2: float | None = None,
    rounds_ms: list | None = None,
) -> dict:
    """One result row (see :data:`ROW_FIELDS`); ``tflops`` is derived from ``ms`` for ``status == "ok"``.

    Args:
        impl: ``rungNN`` or a peer key (``sdpa_cudnn``, ``sdpa_flash``, ``sdpa_efficient``, ``fa4``).
        shape: a :class:`~attnclimb.bench.shapes.Shape`.
        status: ``"ok"``, ``"skipped: <why>"`` or ``"error: <msg>"``.
        ms: milliseconds per call; for an ok row without it, the median of ``rounds_ms``
            (:func:`~attnclimb.bench.timing.median_of_rounds`). Ignored unless ok.
        rounds_ms: each round's median, in round order (kept in the row; ``None`` unless ok).

    ``ratio_to_cudnn`` and ``ratio_to_fa4`` are left ``None``; :func:`fill_ratios` sets them once the
    whole run is known.
    """
    if status == "ok":
        if ms is None and rounds_ms:
            from .timing import median_of_rounds

            ms = median_of_rounds(rounds_ms)
        if ms is None:
            raise ValueError("an ok row needs ms or rounds_ms")
        t = shapes_mod.tflops(shape.flops, ms)
    else:
        if not status.startswith(("skipped: ", "error: ")):
            raise ValueError(f"status must be 'ok', 'skipped: ...' or 'error: ...', got {status!r}")
        ms, t, rounds_ms = None, None, None
    return {
        "impl": impl,
        "label": label or peers_mod.PEER_LABELS.get(impl, impl),
        "shape": shape.name,
        "batch": shape.batch,
        "heads": shape.heads,
        "heads_kv": shape.kv_heads,
        "seqlen_q": shape.seqlen_q,
        "seqlen_k": shape.seqlen_k,
        "head_dim": shape.head_dim,
        "causal": shape.causal,
        "ms": None if ms is None else float(f"{ms:.6g}"),
        "tflops": None if t is None else float(f"{t:.6g}"),
        "ratio_to_cudnn": None,
        "ratio_to_fa4": None,
        "rel_l2": None if rel_l2 is None or rel_l2 != rel_l2 or rel_l2 == float("inf") else float(f"{rel_l2:.3e}"),
        "status": status,
        "rounds_ms": None if rounds_ms is None else [float(f"{v:.6g}") for v in rounds_ms],
    }


def fill_ratios(rows: list) -> list:
    """Set each field of :data:`RATIO_FIELDS` (``ratio_to_cudnn``, ``ratio_to_fa4``) to ``tflops /
    tflops(its reference impl, same shape)`` on every ok row (in place; returns rows).

    Rows whose shape has no ok row of the reference keep ``None``.
    """
    for field, reference in RATIO_FIELDS.items():
        ref = {r["shape"]: r["tflops"] for r in rows if r["impl"] == reference and r["status"] == "ok"}
        for r in rows:
            base = ref.get(r["shape"])
            r[field] = float(f"{r['tflops'] / base:.4g}") if (r["status"] == "ok" and base) else None
    return rows


def shape_entry(s) -> dict:
    """A :class:`~attnclimb.bench.shapes.Shape` as the JSON's ``shapes`` list holds it."""
    return {
        "name": s.name,
        "label": s.label,
        "batch": s.batch,
        "heads": s.heads,
        "heads_kv": s.kv_heads,
        "seqlen_q": s.seqlen_q,
        "seqlen_k": s.seqlen_k,
        "head_dim": s.head_dim,
        "causal": s.causal,
        "headline": s.headline,
        "group": s.group,
    }


def build_results(
    env: dict,
    rows: list,
    shapes: list,
    settings: dict | None = None,
    notes: list | None = None,
    sections: dict | None = None,
) -> dict:
    """The JSON document: environment fields at top level, then ``settings``, ``shapes``, ``notes``, ``rows``,
    then each of ``sections`` (``{name: section}``, e.g. :data:`attnclimb.bench.dropin.BSHD_SECTION`) under
    its name."""
    doc = {"schema": SCHEMA_VERSION}
    doc.update(env)
    doc["settings"] = settings or {}
    doc["shapes"] = [shape_entry(s) for s in shapes]
    doc["notes"] = list(notes or [])
    doc["rows"] = fill_ratios(rows)
    for name, section in (sections or {}).items():
        if name in doc:
            raise ValueError(f"section name {name!r} collides with a top-level field")
        doc[name] = section
    return doc


def device_slug(device_name: str) -> str:
    """``"NVIDIA H200" -> "h200"``, ``"NVIDIA H100 80GB HBM3" -> "h100"``; ``"gpu"`` when nothing fits."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", device_name or "")
    return m.group(1).lower() if m else "gpu"


def write_results(doc: dict, out_dir, when: datetime | None = None, slug: str | None = None) -> tuple:
    """Write ``doc`` to ``<out_dir>/<slug>-YYYYMMDD-HHMMSS.json`` and an identical ``latest.json``; ``slug``
    defaults to the device's (:func:`device_slug`).

    Returns ``(stamped_path, latest_path)``. ``latest.json`` is a real file (a copy, not a symlink).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    when = when or datetime.now(timezone.utc)
    base = f"{slug or device_slug(doc.get('device', ''))}-{when.strftime('%Y%m%d-%H%M%S')}"
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

    def advance(self, n: int = 1):
        """Advance the bar by ``n`` measurements."""
        self.done += n
        if self._kind == "rich":
            self._p.advance(self._task, n)
        elif self._kind == "tqdm":
            self._p.update(n)

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
    rounds: int = DEFAULT_ROUNDS,
    timer=None,
    contest_span: float = DEFAULT_CONTEST_SPAN,
    estimator=None,
    interleaver=None,
    interleave: bool = False,
    contest_warmup_ms: float = CONTEST_WARMUP_MS,
    contest_rep_ms: float = CONTEST_REP_MS,
    headline: tuple = (),
) -> tuple:
    """Check every ``impl`` on every ``shape``, then time the ones that passed in interleaved rounds, the close
    ones on the main shapes with a longer measurement per round (or call by call with ``interleave``).

    Args:
        warmup_ms, rep_ms: budgets of one measurement (one impl, one shape, one round), passed to ``timer``.
        rounds: measurements per (impl, shape); each round times every impl once, in the order
            :func:`~attnclimb.bench.timing.round_order` gives (see the module docstring).
        timer: ``timer(fn, warmup_ms, rep_ms) -> median ms of one fn() call``; default
            :func:`~attnclimb.bench.timing.median_ms` (a seam for the CPU tests).
        contest_span: on shapes of the main group, the impls whose estimated time is within this factor of
            the fastest (:func:`~attnclimb.bench.timing.contest`) are the contenders: their measurements use
            ``contest_warmup_ms`` and ``contest_rep_ms``; below 1, none.
        headline: impl keys that are contenders on every main-group shape whatever the estimate (with or
            without ``contest_span``; :func:`headline_keys` is the CLI's default).
        interleave: time the contenders together by ``interleaver`` instead, with ``rounds x rep_ms`` of calls
            each and ``rounds`` slices reported as ``rounds_ms`` (one clock for all; see the module docstring).
        estimator: ``estimator(fn) -> ms``, the quick estimate; default
            :func:`~attnclimb.bench.timing.estimate_ms` on CUDA, none on ``"cpu"`` (then there is no contest).
        interleaver: ``interleaver(fns, warmup_ms, budget_ms, chunks, contexts=...) -> per fn, chunks
            medians``; default :func:`~attnclimb.bench.timing.interleaved_ms`. If it raises, its impls are
            timed in rounds instead (with a note).
        device: ``"cpu"`` exists for the CPU tests of this loop (with a fake timer); benchmarks use CUDA.

    Returns ``(rows, notes, settings)``: rows without ratios (see :func:`build_results`), in impl order
    within each shape; one-line notes (unavailable impls, lost context) and the settings actually used.
    """
    import torch

    from . import timing

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    time_fn = timer if timer is not None else timing.median_ms
    estimate = estimator if estimator is not None else (timing.estimate_ms if device != "cpu" else None)
    together_fn = interleaver if interleaver is not None else timing.interleaved_ms
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
        "rounds": rounds,
        "contest_span": contest_span if estimate is not None else None,
        "contest_warmup_ms": contest_warmup_ms,
        "contest_rep_ms": contest_rep_ms,
        "contest_mode": (
            None
            if (estimate is None or contest_span < 1) and not headline
            else ("interleaved" if interleave else "rounds")
        ),
        "headline": list(headline),
        "order": ORDER_NOTE,
        "contenders": {},
        "interleaved": {},
        "timer": timing.timer_name() if timer is None else getattr(timer, "__name__", "custom"),
        "l2_bytes": l2,
        "input_sets": {},
        "respect_max_bench_seqlen": respect_limits,
        "check": f"float32 reference on (b,h) first and last, all rows; rel L2 <= {REL_L2_TOL:g}",
    }
    dead = None  # set when a kernel killed the CUDA context: nothing after it can run
    prog = progress or _Progress(len(impls) * len(shapes) * (1 + rounds))  # one check + `rounds` timings each

    def lost_context(impl_key: str, shape) -> None:
        nonlocal dead
        lost = _context_alive(device)
        if lost and dead is None:
            dead = f"{impl_key} on {shape.name}: {lost}"
            notes.append(f"CUDA context lost after {dead}; later rows are errors")
            prog.log(notes[-1])

    def describe_row(r: dict, shape) -> str:
        if r["status"] != "ok":
            return f"{r['impl']} {shape.label}: {r['status']}"
        per = ", ".join(f"{shapes_mod.tflops(shape.flops, v):.1f}" for v in r["rounds_ms"] or [])
        return f"{r['impl']} {shape.label}: {r['tflops']:.1f} TFLOP/s" + (f" (rounds: {per})" if per else "")

    for shape in shapes:
        plan = []
        for impl in impls:
            ok, why = avail[impl.key]
            skip = None if ok else f"skipped: {why}"
            if skip is None:  # a variant the impl does not have: skipped whatever the limits
                r = impl.unsupported(shape)
                skip = f"skipped: {r}" if r else None
            if skip is None and respect_limits:
                r = impl.skip_reason(shape)
                skip = f"skipped: {r}" if r else None
            plan.append((impl.for_shape(shape), skip))
        sets = refs = pairs = None
        if dead is None and any(s is None for _, s in plan):
            try:
                n_sets = timing.num_input_sets(shape.qkv_bytes(), l2)
                settings["input_sets"][shape.name] = n_sets
                sets = timing.make_inputs(shape, n_sets, device=device)
                pairs = timing.check_heads(shape)
                refs = timing.reference_slices(*sets[0], pairs, causal=shape.causal)
            except Exception as exc:
                msg = peers_mod._one_line(exc)
                dead = _context_alive(device) and f"setup of {shape.name} failed ({msg})"
                plan = [(i, s or f"error: input setup failed ({msg})") for i, s in plan]
                sets = refs = None

        # 1. check every impl once (in list order); the ones that pass are timed in the rounds below
        final = {}  # impl key -> finished row
        live = []  # [impl, rotating fn, rel_l2, per-round medians] of the impls still being timed
        for impl, skip in plan:
            if dead is not None and skip is None:
                skip = f"error: CUDA context lost earlier ({dead})"
            if skip is not None:
                final[impl.key] = make_row(impl.key, shape, skip, label=impl.label)
                prog.advance(1 + rounds)
                prog.log(describe_row(final[impl.key], shape))
                continue
            prog.describe(f"check {impl.key} @ {shape.label}")
            prepared, row, err = _prepare_and_check(impl, shape, sets, pairs, refs, device)
            prog.advance(1)
            if row is not None:
                final[impl.key] = row
                prog.advance(rounds)
                prog.log(describe_row(row, shape))
                if "wrong result" not in row["status"] and row["status"].startswith("error:"):
                    lost_context(impl.key, shape)
                continue
            live.append([impl, timing.rotating(impl.call, prepared), err, []])
            prepared = None

        # 2. the contest: the impls close to the fastest on a main shape
        contenders, together = [], []
        main_shape = getattr(shape, "group", shapes_mod.MAIN_GROUP) == shapes_mod.MAIN_GROUP
        if estimate is not None and contest_span >= 1 and len(live) > 1 and main_shape and dead is None:
            prog.describe(f"estimate @ {shape.label}")
            try:
                est = []
                for impl, fn, *_ in live:
                    with torch.no_grad(), impl.context():
                        est.append(float(estimate(fn)))
                contenders = timing.contest(est, contest_span)
            except Exception as exc:
                notes.append(f"{shape.name}: no contest, the estimate failed ({peers_mod._one_line(exc)})")
                prog.log(notes[-1])
                lost_context("the estimate", shape)
        if headline and main_shape and dead is None:
            contenders = sorted({*contenders, *(i for i, e in enumerate(live) if e[0].key in headline)})
        if contenders:
            settings["contenders"][shape.name] = [live[i][0].key for i in contenders]
        if contenders and interleave and dead is None:
            prog.describe(f"{len(contenders)} interleaved @ {shape.label}")
            try:
                with torch.no_grad():
                    meds = together_fn(
                        [live[i][1] for i in contenders],
                        warmup_ms,
                        rounds * rep_ms * len(contenders),
                        rounds,
                        contexts=[live[i][0].context for i in contenders],
                    )
                for i, m in zip(contenders, meds):
                    live[i][3] = [float(x) for x in m]
                together = contenders
                settings["interleaved"][shape.name] = [live[i][0].key for i in together]
                prog.advance(rounds * len(together))
            except Exception as exc:
                notes.append(
                    f"{shape.name}: timed in rounds only, the call-by-call timing failed ({peers_mod._one_line(exc)})"
                )
                prog.log(notes[-1])
                lost_context("interleaved timing", shape)
                for entry in live:
                    entry[3] = []

        # 3. the other live impls in rounds, the order rotated and reversed from round to round
        close = {id(live[i]) for i in contenders}
        alone = [e for i, e in enumerate(live) if i not in together]
        for rnd in range(rounds):
            for idx in timing.round_order(len(alone), rnd, rounds):
                entry = alone[idx]
                impl, fn = entry[0], entry[1]
                if impl.key in final:  # failed in an earlier round
                    continue
                if dead is not None:
                    final[impl.key] = make_row(
                        impl.key, shape, f"error: CUDA context lost earlier ({dead})", label=impl.label
                    )
                    prog.advance(rounds - rnd)
                    continue
                wm, rm = (contest_warmup_ms, contest_rep_ms) if id(entry) in close else (warmup_ms, rep_ms)
                prog.describe(f"round {rnd + 1}/{rounds}: {impl.key} @ {shape.label}")
                try:
                    with torch.no_grad(), impl.context():
                        entry[3].append(float(time_fn(fn, wm, rm)))
                    prog.advance(1)
                except Exception as exc:
                    final[impl.key] = _failure_row(impl, shape, exc)
                    prog.advance(rounds - rnd)
                    prog.log(describe_row(final[impl.key], shape))
                    lost_context(impl.key, shape)
        for impl, _, err, per_round in live:
            if impl.key not in final:
                final[impl.key] = make_row(impl.key, shape, "ok", label=impl.label, rel_l2=err, rounds_ms=per_round)
                prog.log(describe_row(final[impl.key], shape))
        rows += [final[impl.key] for impl in impls]
        live = sets = refs = entry = fn = None  # drop the inputs (and FA4's copies) before the next shape
        if dead is None and device != "cpu":
            torch.cuda.empty_cache()
    if progress is None:
        prog.close()
    return rows, notes, settings


def _failure_row(impl, shape, exc) -> dict:
    """The row for an exception raised while checking or timing ``impl``."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return make_row(impl.key, shape, f"error: out of memory ({peers_mod._one_line(exc, 80)})", label=impl.label)
    msg = peers_mod._one_line(exc)
    if impl.kind == "peer" and impl.key.startswith("sdpa_") and "No available kernel" in msg:
        return make_row(impl.key, shape, "skipped: this SDPA backend refused the shape", label=impl.label)
    return make_row(impl.key, shape, f"error: {msg}", label=impl.label)


def _prepare_and_check(impl, shape, sets, pairs, refs, device="cuda") -> tuple:
    """Prepare every input set for ``impl`` and check its output on the first one.

    Returns ``(prepared, None, rel_l2)`` when the output is right (first call done: JIT/compilation
    happens there, outside any timing), else ``(None, row, None)`` with the error/skip row.
    """
    import torch

    from . import timing

    prepared = out = None
    try:
        with torch.no_grad(), impl.context():
            prepared = [impl.prepare(*s) for s in sets]
            out = impl.call(prepared[0])
            _sync(device)
            ok, err, why = timing.check_output(impl.to_bhsd(out), refs, pairs, shape)
            out = None
        if not ok:
            return None, make_row(impl.key, shape, f"error: wrong result ({why})", label=impl.label, rel_l2=err), None
        return prepared, None, err
    except Exception as exc:
        prepared = out = None
        return None, _failure_row(impl, shape, exc), None


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
        help="FA-paper seqlens and/or the named shapes 'wan' (Wan2.1-1.3B 480p self-attention), 'wan14b' "
        "(Wan2.1-14B 720p self-attention) and 'wan-cross' (its cross-attention to the 512 text tokens), "
        "and the feature columns 'causal' (1k, 4k, 8k, 16k), 'gqa' (32/8 heads at 8k, non-causal and causal), "
        "'hdim' (head_dim 64 with 32 heads and 256 with 8 at 8k, non-causal and causal), 'features' (all three) "
        "or one by name (fa-4k-causal, fa-8k-gqa32x8, fa-8k-gqa32x8-causal, fa-8k-d64, fa-8k-d256-causal, ...), "
        "e.g. 4k,8192,wan-cross,causal (default: 1k,2k,4k,8k,16k,wan,wan14b,wan-cross,features)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="4k, 16k, wan, causal 4k, causal GQA and causal head_dim 256 only, shorter warm-up and rep",
    )
    p.add_argument(
        "--no-feature-columns",
        action="store_true",
        help="leave out the feature columns (causal 1k/4k/8k/16k, and GQA 32/8, head_dim 64 and head_dim 256 "
        "at 8k, each non-causal and causal; issue 8), which run after the others by default (an estimated "
        "35-100 s on an H200: about 28 s of timing, plus the first-use compiles of the top rung's and FA4's "
        "causal, GQA and head_dim variants)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help="time every implementation N times per shape, interleaved with the others in an order that "
        "changes from round to round; report the median of the rounds (default: %(default)s)",
    )
    p.add_argument(
        "--contest-span",
        type=float,
        default=DEFAULT_CONTEST_SPAN,
        metavar="X",
        help=f"on the main shapes, the implementations within X times the fastest get {CONTEST_WARMUP_MS:g} ms of "
        f"warm-up and {CONTEST_REP_MS:g} ms of timed calls per round (the power-capped clock settles); below 1: "
        "none (default: %(default)s, off: a bench with 1.1 was not steadier; see DEFAULT_CONTEST_SPAN)",
    )
    p.add_argument(
        "--headline",
        metavar="LIST",
        default=None,
        help=f"comma list of implementation keys that get {CONTEST_WARMUP_MS:g} ms of warm-up and "
        f"{CONTEST_REP_MS:g} ms of timed calls per round on the main shapes, or 'none' (default: the rungs from "
        f"rung {SCHEDULE_RUNGS_FROM} up, sdpa_cudnn and fa4; none with --quick)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="time the headline implementations (and, with --contest-span, the close ones) call by call, "
        "interleaved, instead: a far finer ratio, at one clock shared by all of them (not the clock each settles "
        "at alone)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help=f"results folder (default: {paths.results_dir()}, where report reads them)",
    )
    p.add_argument("--no-chart", action="store_true", help="don't write ladder.png")
    p.add_argument(
        "--warmup-ms",
        type=float,
        default=None,
        help=f"warm-up time per measurement, i.e. per implementation, shape and round (ms; default "
        f"{DEFAULT_WARMUP_MS:g}, {QUICK_WARMUP_MS:g} with --quick)",
    )
    p.add_argument(
        "--rep-ms",
        type=float,
        default=None,
        help=f"timed repetitions per measurement (ms; at least one call; default {DEFAULT_REP_MS:g}, "
        f"{QUICK_REP_MS:g} with --quick)",
    )
    p.add_argument(
        "--no-limits",
        action="store_true",
        help="ignore each rung's max_bench_seqlen (slow rungs run the big shapes too) and time the feature columns "
        "on every rung that has the variants, not only the top rung",
    )
    p.add_argument(
        "--no-dropin-rows",
        action="store_true",
        help="skip the drop-in rows: the top rung, SDPA cuDNN and FA4 on BSHD views against contiguous inputs "
        "(Wan2.1-1.3B and 4k), and the host overhead per call on a tiny shape (about 12 s on an H200)",
    )


def main(args) -> int:
    """Run the ``bench`` subcommand. Exit 0 when every row (drop-in rows included) is ok/skipped, 1 on any
    error row, 2 without Hopper."""
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
    shapes = shapes_mod.default_shapes(
        seqlens, quick=args.quick, features=not getattr(args, "no_feature_columns", False)
    )
    if not impls or not shapes:
        print("attnclimb bench: nothing selected", file=sys.stderr)
        return 2
    rounds = getattr(args, "rounds", DEFAULT_ROUNDS)
    if rounds < 1:
        print(f"attnclimb bench: --rounds must be >= 1, got {rounds}", file=sys.stderr)
        return 2
    warmup = args.warmup_ms if args.warmup_ms is not None else (QUICK_WARMUP_MS if args.quick else DEFAULT_WARMUP_MS)
    rep = args.rep_ms if args.rep_ms is not None else (QUICK_REP_MS if args.quick else DEFAULT_REP_MS)
    out_dir = Path(args.out) if args.out else paths.results_dir()

    t0 = time.monotonic()
    started = datetime.now(timezone.utc)
    env = collect_env(started)
    rows, notes, settings = run_bench(
        impls,
        shapes,
        warmup,
        rep,
        respect_limits=not args.no_limits,
        rounds=rounds,
        contest_span=getattr(args, "contest_span", DEFAULT_CONTEST_SPAN),
        interleave=getattr(args, "interleave", False),
        # --quick keeps its short windows for everyone unless --headline names some
        headline=() if args.quick and getattr(args, "headline", None) is None else parse_headline(args.headline),
    )
    sections = {}
    if not args.no_dropin_rows:
        if any(n.startswith("CUDA context lost") for n in notes):
            notes.append("drop-in rows left out: the CUDA context was lost")
        else:
            from . import dropin

            sections, more = dropin.run_sections(warmup, rep, rounds, quick=args.quick)
            notes += more
    env["gpu_clocks"]["end"] = gpu_clocks()
    settings["elapsed_s"] = round(time.monotonic() - t0, 1)
    for key, field in ((peers_mod.REFERENCE_KEY, "ratio_to_cudnn"), (peers_mod.FA4_KEY, "ratio_to_fa4")):
        if not any(i.key == key for i in impls):
            notes.append(f"{key} not selected: {field} is empty")
    doc = build_results(env, rows, shapes, settings, notes, sections)
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
    from .dropin import section_errors

    return 1 if any(r["status"].startswith("error:") for r in rows) or section_errors(doc) else 0
