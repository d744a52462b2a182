"""The drop-in rows of ``python -m attnclimb bench`` (issue 9): what a caller of the drop-in API pays
beyond the kernel, in two row sets that become two top-level sections of the results JSON.

* **BSHD views** (:func:`run_bshd_view`, section :data:`BSHD_SECTION`). diffusers' and flash-attn's
  callers hold q, k, v as ``(B, S, H, D)``-contiguous tensors and pass ``x.transpose(1, 2)``. For the
  top rung (through ``attnclimb.attention(q, k, v, rung=TOP)``), SDPA cuDNN and FlashAttention-4 (when
  installed), on :data:`~attnclimb.bench.shapes.BSHD_VIEW_SHAPES` (Wan2.1-1.3B 480p and the 4k FA
  shape), one call is timed on the same values held in two memory layouts (:class:`LayoutImpl`):

  - ``contiguous``: ``(B, H, S, D)``-contiguous tensors;
  - ``view``: ``(B, S, H, D)``-contiguous tensors, passed as ``.transpose(1, 2)`` views; whatever the
    call does with a view (today attnclimb copies it to contiguous memory) is inside the timed call.

  FlashAttention-4 takes ``(B, S, H, D)`` natively: its ``view`` is its ordinary call, and its
  ``contiguous`` passes the ``(B, H, S, D)`` tensors as ``.transpose(1, 2)``. A row's ``ratio`` is
  ``view_ms / contiguous_ms`` (goal: at most :data:`BSHD_GOAL`). The timing is the bench's own
  (:func:`attnclimb.bench.run.run_bench`: a correctness check of each layout, inputs rotated beyond L2,
  interleaved rounds, median), so ``contiguous_ms`` is comparable with the main table.
* **Host overhead** (:func:`run_host_overhead`, section :data:`HOST_SECTION`). On a
  ``(1, 1, 128, 128)`` bf16 problem, whose kernel takes a few microseconds, the wall clock per call
  over many back-to-back calls (:func:`attnclimb.bench.timing.wall_us_per_call`) of
  ``attnclimb.scaled_dot_product_attention``, ``attnclimb.attention`` and torch's SDPA with its default
  dispatch, pinned to cuDNN and pinned to flash (:func:`host_calls`), in interleaved rounds. A row's
  ``ratio_to_cudnn`` is ``us_per_call / us_per_call(SDPA cuDNN)`` (goal: at most :data:`HOST_GOAL`).

``report`` renders the sections as two small tables; ``scripts/dropin_check.py`` calls the same
functions. Importing this module imports neither torch nor the runner (``report`` reads its constants).
"""

from __future__ import annotations

import contextlib
import time

from . import peers as peers_mod
from . import shapes as shapes_mod

BSHD_SECTION = "bshd_view"
HOST_SECTION = "host_overhead"
BSHD_GOAL = 1.02  # view_ms / contiguous_ms (issue 9)
HOST_GOAL = 1.0  # us_per_call / SDPA cuDNN's (issue 9)
HOST_REFERENCE = peers_mod.REFERENCE_KEY  # "sdpa_cudnn"
# One measurement: HOST_WARMUP_CALLS untimed calls, then HOST_REPS times HOST_CALLS timed ones (median).
HOST_CALLS, HOST_REPS, HOST_WARMUP_CALLS = 2000, 5, 200
QUICK_HOST_CALLS, QUICK_HOST_REPS = 1000, 3
# memory layouts of the inputs: "bhsd" = (B, H, S, D)-contiguous (the "contiguous" call), "bshd" =
# (B, S, H, D)-contiguous (the "view" call)
MEMORY = {"contiguous": "bhsd", "view": "bshd"}
BSHD_ROW_FIELDS = (
    "impl",
    "label",
    "shape",
    "native_layout",
    "contiguous_ms",
    "view_ms",
    "ratio",
    "contiguous_rounds_ms",
    "view_rounds_ms",
    "rel_l2",
    "status",
)
HOST_ROW_FIELDS = ("key", "label", "call", "us_per_call", "rounds_us", "ratio_to_cudnn", "status")
BSHD_WHAT = (
    "median time of one call on q, k, v held as (B, S, H, D)-contiguous tensors and passed as .transpose(1, 2) "
    "views (view_ms; what the call does with a view, e.g. a copy, is timed) against the call on (B, H, S, D)-"
    "contiguous tensors (contiguous_ms); ratio = view_ms / contiguous_ms. An impl whose native layout is bshd "
    "(FlashAttention-4) is called on the (B, S, H, D) tensors as they are for view_ms, and on .transpose(1, 2) of "
    "the (B, H, S, D) tensors for contiguous_ms."
)
HOST_WHAT = (
    "wall-clock microseconds per call on a tiny problem, where the host sets the pace: warmup_calls untimed "
    "calls, then reps times [time.perf_counter, calls back-to-back calls, torch.cuda.synchronize, time.perf_counter]; "
    "us_per_call = median over rounds of each round's median over reps; ratio_to_cudnn = us_per_call / SDPA cuDNN's."
)
HOST_ORDER_NOTE = "every round times each call once, in the bench's rotated and reversed order (timing.round_order)"


def ratio(num: float, den: float) -> float:
    """``num / den`` to 4 significant digits (the ratios of both sections)."""
    return float(f"{num / den:.4g}")


# ------------------------------------------------------------------------------------------ BSHD views


def operands_in(q, k, v, memory: str, native: str) -> tuple:
    """``(q, k, v)`` (``(B, H, S, D)``-contiguous) as a caller holding them in ``memory`` passes them to an
    implementation that takes ``native`` shapes.

    ``memory``/``native``: ``"bhsd"`` or ``"bshd"``. For ``memory="bshd"`` the values are first copied into
    ``(B, S, H, D)``-contiguous tensors (here, outside any timing); where ``memory`` differs from
    ``native`` the tensors are passed as ``.transpose(1, 2)`` views of that memory.
    """
    for name, val in (("memory", memory), ("native", native)):
        if val not in ("bhsd", "bshd"):
            raise ValueError(f"{name} must be 'bhsd' or 'bshd', got {val!r}")
    held = (q, k, v) if memory == "bhsd" else tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))
    return held if memory == native else tuple(t.transpose(1, 2) for t in held)


class LayoutImpl(peers_mod.Impl):
    """``base`` called on inputs held in ``memory`` (``"bhsd"`` or ``"bshd"``, see :func:`operands_in`);
    key ``<base key>@<memory>``. Availability, context, call and output check are the base's."""

    def __init__(self, base, memory: str):
        if memory not in MEMORY.values():
            raise ValueError(f"memory must be one of {sorted(MEMORY.values())}, got {memory!r}")
        super().__init__(
            key=f"{base.key}@{memory}", label=base.label, kind=base.kind, max_bench_seqlen=base.max_bench_seqlen
        )
        self.base, self.memory = base, memory

    def available(self) -> tuple:
        return self.base.available()

    def context(self):
        return self.base.context()

    def prepare(self, q, k, v):
        return operands_in(q, k, v, self.memory, self.base.native_layout)

    def call(self, prepared):
        return self.base.call(prepared)

    def to_bhsd(self, out):
        return self.base.to_bhsd(out)


def bshd_view_impls() -> list:
    """The implementations of the BSHD-view rows: the top rung, SDPA cuDNN, FlashAttention-4 (skipped
    with its reason when not installed)."""
    from ..rungs import TOP

    return [peers_mod.RungImpl(TOP), *(peers_mod.make_peer(k) for k in (peers_mod.REFERENCE_KEY, peers_mod.FA4_KEY))]


def _combined_status(contiguous: dict, view: dict) -> str:
    """One status for a pair of bench rows: ``ok`` when both are; the shared status when both say the same;
    else the first one that is not ok, naming its layout (``"error: BSHD view: ..."``)."""
    if contiguous["status"] == view["status"]:
        return contiguous["status"]
    for name, r in (("contiguous", contiguous), ("BSHD view", view)):
        if r["status"] != "ok":
            kind, _, why = r["status"].partition(": ")
            return f"{kind}: {name}: {why}"
    raise AssertionError("unreachable")  # statuses differ, so one is not ok


def bshd_view_row(impl: str, label: str, native_layout: str, shape: str, contiguous: dict, view: dict) -> dict:
    """The section row (:data:`BSHD_ROW_FIELDS`) of one implementation on one shape, from its two bench rows
    (:func:`attnclimb.bench.run.make_row` rows of the ``@bhsd`` and ``@bshd`` :class:`LayoutImpl`).

    ``ratio = view_ms / contiguous_ms`` of the rows' (rounded) times, to 4 significant digits; ``rel_l2`` is
    the worse of the two checks. Times, rounds and ratio are ``None`` unless both rows are ok.
    """
    status = _combined_status(contiguous, view)
    ok = status == "ok"
    errs = [r["rel_l2"] for r in (contiguous, view) if r.get("rel_l2") is not None]
    return {
        "impl": impl,
        "label": label,
        "shape": shape,
        "native_layout": native_layout,
        "contiguous_ms": contiguous["ms"] if ok else None,
        "view_ms": view["ms"] if ok else None,
        "ratio": ratio(view["ms"], contiguous["ms"]) if ok else None,
        "contiguous_rounds_ms": contiguous["rounds_ms"] if ok else None,
        "view_rounds_ms": view["rounds_ms"] if ok else None,
        "rel_l2": max(errs) if ok and errs else None,
        "status": status,
    }


def bshd_view_section(bases: list, shapes: list, rows: list, notes: list, settings: dict) -> dict:
    """The :data:`BSHD_SECTION` of the results JSON from the rows ``run_bench`` gave for the
    :class:`LayoutImpl` pairs of ``bases`` on ``shapes`` (rows in shape order, then ``bases`` order)."""
    from .run import shape_entry

    by = {(r["impl"], r["shape"]): r for r in rows}
    out = []
    for s in shapes:
        for b in bases:
            c, v = by[(f"{b.key}@{MEMORY['contiguous']}", s.name)], by[(f"{b.key}@{MEMORY['view']}", s.name)]
            out.append(bshd_view_row(b.key, b.label, b.native_layout, s.name, c, v))
    kept = ("warmup_ms", "rep_ms", "rounds", "order", "timer", "input_sets", "check")
    kept += ("contest_span", "contest_warmup_ms", "contest_rep_ms", "contest_mode", "contenders", "interleaved")
    return {
        "what": BSHD_WHAT,
        "goal_max_ratio": BSHD_GOAL,
        "settings": {k: settings[k] for k in kept if k in settings},
        "shapes": [shape_entry(s) for s in shapes],
        "notes": list(notes),
        "rows": out,
    }


def run_bshd_view(
    bases=None,
    shapes=None,
    warmup_ms: float | None = None,
    rep_ms: float | None = None,
    rounds: int | None = None,
    progress=None,
    device: str | None = None,
    timer=None,
) -> dict:
    """Check and time ``bases`` (default :func:`bshd_view_impls`) on ``shapes`` (default
    :data:`~attnclimb.bench.shapes.BSHD_VIEW_SHAPES`) with inputs in both layouts; returns the section.

    ``warmup_ms``, ``rep_ms``, ``rounds`` default to the bench's; ``progress``, ``device``, ``timer`` are
    passed to :func:`attnclimb.bench.run.run_bench` when given (seams for the CPU tests).
    """
    from . import run

    bases = bshd_view_impls() if bases is None else list(bases)
    shapes = list(shapes_mod.BSHD_VIEW_SHAPES if shapes is None else shapes)
    impls = [LayoutImpl(b, MEMORY[layout]) for b in bases for layout in ("contiguous", "view")]
    extra = {k: v for k, v in (("progress", progress), ("device", device), ("timer", timer)) if v is not None}
    rows, notes, settings = run.run_bench(
        impls,
        shapes,
        run.DEFAULT_WARMUP_MS if warmup_ms is None else warmup_ms,
        run.DEFAULT_REP_MS if rep_ms is None else rep_ms,
        rounds=run.DEFAULT_ROUNDS if rounds is None else rounds,
        **extra,
    )
    return bshd_view_section(bases, shapes, rows, notes, settings)


# --------------------------------------------------------------------------------------- host overhead


class HostCall:
    """One call path of the host-overhead rows.

    Args:
        key: row key (``attnclimb_sdpa``, ``sdpa_cudnn``, ...).
        label: what the table shows.
        call: the call as code, for the JSON.
        make: ``make(q, k, v)`` -> the zero-argument function that is timed.
        peer: a :class:`~attnclimb.bench.peers.Impl` whose ``available()`` and ``context()`` (SDPA backend
            pinning, entered once around a measurement) apply; ``None`` for neither.
        ours: an attnclimb entry point: refused (an error row) when
            :func:`attnclimb.support.unsupported_reason` says the kernels would not take the inputs, so
            that a fallback to torch is never timed as ours.
    """

    def __init__(self, key: str, label: str, call: str, make, peer=None, ours: bool = False):
        self.key, self.label, self.call, self.make, self.peer, self.ours = key, label, call, make, peer, ours

    def available(self) -> tuple:
        return self.peer.available() if self.peer is not None else (True, "")

    def context(self):
        return self.peer.context() if self.peer is not None else contextlib.nullcontext()

    def refusal(self, q, k, v) -> str | None:
        """Why the kernels would not take ``(q, k, v)`` (for ``ours``), else ``None``."""
        if not self.ours:
            return None
        from ..support import unsupported_reason

        why = unsupported_reason(q, k, v)
        return None if why is None else why.message


def host_calls(with_op: bool = False) -> list:
    """The call paths of the host-overhead rows, in table order: ``attnclimb.scaled_dot_product_attention``,
    ``attnclimb.attention``, (with ``with_op``: the operator ``torch.ops.attnclimb.attention_fwd`` called
    directly), torch SDPA's default dispatch, SDPA pinned to cuDNN, SDPA pinned to flash."""
    import torch
    import torch.nn.functional as F

    import attnclimb

    def sdpa(q, k, v):
        return lambda: F.scaled_dot_product_attention(q, k, v)

    calls = [
        HostCall(
            "attnclimb_sdpa",
            "attnclimb.scaled_dot_product_attention",
            "attnclimb.scaled_dot_product_attention(q, k, v)",
            lambda q, k, v: lambda: attnclimb.scaled_dot_product_attention(q, k, v),
            ours=True,
        ),
        HostCall(
            "attnclimb_attention",
            "attnclimb.attention",
            "attnclimb.attention(q, k, v)",
            lambda q, k, v: lambda: attnclimb.attention(q, k, v),
            ours=True,
        ),
    ]
    if with_op:
        from .. import ops  # noqa: F401  (importing it registers the operator)
        from ..rungs import TOP

        op, top = torch.ops.attnclimb.attention_fwd.default, TOP.number

        def make_op(q, k, v):
            scale = q.shape[-1] ** -0.5
            return lambda: op(q, k, v, scale, top)

        calls.append(
            HostCall(
                "attnclimb_op",
                "torch.ops.attnclimb.attention_fwd",
                f"torch.ops.attnclimb.attention_fwd.default(q, k, v, scale, {top})",
                make_op,
                ours=True,
            )
        )
    calls.append(HostCall("sdpa_default", "SDPA (default backend)", "F.scaled_dot_product_attention(q, k, v)", sdpa))
    for key, backend in (("sdpa_cudnn", "CUDNN_ATTENTION"), ("sdpa_flash", "FLASH_ATTENTION")):
        calls.append(
            HostCall(
                key,
                peers_mod.PEER_LABELS[key],
                f"F.scaled_dot_product_attention(q, k, v) inside sdpa_kernel(SDPBackend.{backend})",
                sdpa,
                peer=peers_mod.make_peer(key),
            )
        )
    return calls


def host_row(c: HostCall, status: str = "ok", rounds_us: list | None = None) -> dict:
    """The section row (:data:`HOST_ROW_FIELDS`) of call path ``c``: ``us_per_call`` is the median of
    ``rounds_us`` (4 significant digits) for an ok row; ``ratio_to_cudnn`` is left for
    :func:`fill_host_ratios`."""
    from .timing import median_of_rounds

    if status == "ok":
        if not rounds_us:
            raise ValueError("an ok row needs rounds_us")
        us = float(f"{median_of_rounds(rounds_us):.4g}")
        rounds = [float(f"{x:.4g}") for x in rounds_us]
    else:
        if not status.startswith(("skipped: ", "error: ")):
            raise ValueError(f"status must be 'ok', 'skipped: ...' or 'error: ...', got {status!r}")
        us = rounds = None
    return {
        "key": c.key,
        "label": c.label,
        "call": c.call,
        "us_per_call": us,
        "rounds_us": rounds,
        "ratio_to_cudnn": None,
        "status": status,
    }


def fill_host_ratios(rows: list, reference: str = HOST_REFERENCE) -> list:
    """Set ``ratio_to_cudnn = us_per_call / us_per_call(reference)`` (4 significant digits) on every ok row
    (in place; returns rows); ``None`` everywhere when the reference row is not ok."""
    base = next((r["us_per_call"] for r in rows if r["key"] == reference and r["status"] == "ok"), None)
    for r in rows:
        r["ratio_to_cudnn"] = ratio(r["us_per_call"], base) if (r["status"] == "ok" and base) else None
    return rows


def run_host_overhead(
    candidates=None,
    shape=None,
    calls: int = HOST_CALLS,
    reps: int = HOST_REPS,
    warmup_calls: int = HOST_WARMUP_CALLS,
    rounds: int | None = None,
    device: str | None = None,
    clock=None,
    progress=None,
) -> dict:
    """Check every call path of ``candidates`` (default :func:`host_calls`) once on ``shape`` (default
    :data:`~attnclimb.bench.shapes.HOST_OVERHEAD_SHAPE`), then measure the ones that passed in
    ``rounds`` interleaved rounds (default the bench's) with
    :func:`~attnclimb.bench.timing.wall_us_per_call`; returns the :data:`HOST_SECTION`.

    A call path that is not available is a ``skipped`` row; one that raises, returns a wrong result or
    (for attnclimb's) would fall back to torch is an ``error`` row and is not timed.

    Args:
        device: ``"cuda"`` (default); ``"cpu"`` for the CPU tests (no synchronisation).
        clock: passed to :func:`~attnclimb.bench.timing.wall_us_per_call` (a seam for the CPU tests).
    """
    import torch

    from . import run, timing

    rounds = run.DEFAULT_ROUNDS if rounds is None else rounds
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    device = device or "cuda"
    shape = shapes_mod.HOST_OVERHEAD_SHAPE if shape is None else shape
    candidates = host_calls() if candidates is None else list(candidates)
    sync = (lambda: None) if device == "cpu" else torch.cuda.synchronize
    prog = progress or run._Progress(len(candidates) * (1 + rounds))
    final = {}
    live = []  # [call path, timed function, per-round µs]
    q, k, v = timing.make_inputs(shape, 1, seed=20, device=device)[0]
    pairs = timing.check_heads(shape)
    refs = timing.reference_slices(q, k, v, pairs)
    for c in candidates:
        ok, why = c.available()
        if not ok:
            final[c.key] = host_row(c, f"skipped: {why}")
            prog.advance(1 + rounds)
            continue
        prog.describe(f"check {c.key}")
        try:
            refused = c.refusal(q, k, v)
            if refused is not None:
                raise RuntimeError(f"would fall back to torch SDPA: {refused}")
            fn = c.make(q, k, v)
            with c.context():
                out = fn()
                sync()
            good, _, bad = timing.check_output(out, refs, pairs, shape)
            if not good:
                raise RuntimeError(f"wrong result ({bad})")
            live.append([c, fn, []])
            prog.advance(1)
        except Exception as exc:
            final[c.key] = host_row(c, f"error: {peers_mod._one_line(exc)}")
            prog.advance(1 + rounds)
            prog.log(f"host overhead {c.key}: {final[c.key]['status']}")
    for rnd in range(rounds):
        for idx in timing.round_order(len(live), rnd, rounds):
            c, fn, per_round = live[idx]
            if c.key in final:  # failed in an earlier round
                continue
            prog.describe(f"round {rnd + 1}/{rounds}: host overhead {c.key}")
            try:
                with c.context():  # entered once: the calls pay no backend switch
                    per_round.append(timing.wall_us_per_call(fn, calls, reps, warmup_calls, sync=sync, clock=clock))
                prog.advance(1)
            except Exception as exc:
                final[c.key] = host_row(c, f"error: {peers_mod._one_line(exc)}")
                prog.advance(rounds - rnd)
    for c, _, per_round in live:
        if c.key not in final:
            final[c.key] = host_row(c, "ok", per_round)
            prog.log(f"host overhead {c.key}: {final[c.key]['us_per_call']:.1f} us per call")
    if progress is None:
        prog.close()
    rows = fill_host_ratios([final[c.key] for c in candidates])
    return {
        "what": HOST_WHAT,
        "goal_max_ratio": HOST_GOAL,
        "reference": HOST_REFERENCE,
        "shape": {**run.shape_entry(shape), "dtype": "bfloat16"},
        "settings": {
            "calls": calls,
            "reps": reps,
            "warmup_calls": warmup_calls,
            "rounds": rounds,
            "order": HOST_ORDER_NOTE,
            "clock": "time.perf_counter" if clock is None else getattr(clock, "__name__", "custom"),
            "sync": "torch.cuda.synchronize after the warm-up and at the end of each repetition"
            if device != "cpu"
            else "none (cpu)",
        },
        "rows": rows,
    }


# ------------------------------------------------------------------------------------------- the bench


# The BSHD-view rows take at least this many interleaved rounds in a full bench (about 2 s a round): a ratio
# within 2 % needs more than the main table's 2-3 (two benches of 2026-11-30 gave 1.034 and 1.000 on one shape).
BSHD_ROUNDS = 6


def run_sections(warmup_ms: float, rep_ms: float, rounds: int, quick: bool = False) -> tuple:
    """Both row sets, as ``bench`` runs them after the main table: ``({section name: section}, notes)``.

    A row set whose setup fails (e.g. the CUDA context is gone) is left out with a note; failures of single
    implementations are error rows inside the section. ``quick`` measures the host overhead with
    :data:`QUICK_HOST_CALLS` calls and :data:`QUICK_HOST_REPS` repetitions.
    """
    sections, notes = {}, []
    for name, fn in (
        (
            BSHD_SECTION,
            lambda: run_bshd_view(
                warmup_ms=warmup_ms, rep_ms=rep_ms, rounds=rounds if quick else max(rounds, BSHD_ROUNDS)
            ),
        ),
        (
            HOST_SECTION,
            lambda: run_host_overhead(
                calls=QUICK_HOST_CALLS if quick else HOST_CALLS,
                reps=QUICK_HOST_REPS if quick else HOST_REPS,
                rounds=rounds,
            ),
        ),
    ):
        t0 = time.monotonic()
        try:
            sec = fn()
        except Exception as exc:
            notes.append(f"{name} rows left out: {peers_mod._one_line(exc)}")
            continue
        sec["settings"]["elapsed_s"] = round(time.monotonic() - t0, 1)
        sections[name] = sec
    return sections, notes


def section_errors(doc: dict) -> bool:
    """True when a row of either section is an error."""
    return any(
        r.get("status", "").startswith("error:")
        for name in (BSHD_SECTION, HOST_SECTION)
        for r in (doc.get(name) or {}).get("rows", [])
    )
