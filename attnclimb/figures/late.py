"""Figures of rungs 10-16: the persistent grid and the epilogue through shared memory, the wgmma descriptors
advanced by constant adds, the lazy rescale with its fast path for kept references, P in two A-fragment
buffers, the warp-uniform warp index, the exponentials before the vote, and the ping-pong turns of the
consumer warpgroups (the only rung of them with turns: 16).

Counts of machine code that a figure quotes (``*_SASS``, ``*_CYCLES``, the spill of a variant) are those of
NVRTC 13.0 (the device's toolchain), sm_90a, read with ``cuobjdump -sass``; the functions at the end of this
file count them from a compiled rung, and ``tests/test_figures_cpu.py`` recounts them from a fresh compile."""

from __future__ import annotations

import re
from fractions import Fraction

from .. import rungs
from ..bench import shapes
from . import facts
from .style import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PHASE_COLOURS,
    PURPLE,
    ROLE,
    SKY,
    VERMILLION,
    YELLOW,
    arrow,
    box,
    label,
    new_figure,
    rect,
    save,
    tint,
    title,
)

PACK = tint(PURPLE, 0.5)  # "O *= α, pack P": the colour rung 9's schedule gives it
WG_EDGE = (BLUE, VERMILLION, GREEN)  # consumer warpgroups 0, 1 and 2 in the lanes of rung 16's figures
SASS_NVRTC = "NVRTC 13.0"  # the compiler whose machine code the counts below are


def _fmt(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def _kb(n: int) -> str:
    return f"{n // 1024} KB" if n % 1024 == 0 else f"{n / 1024:.1f} KB"


def _tiles(keys: int, block_n: int) -> int:
    return -(-keys // block_n)


def _block_n(number: int, seqlen_k: int) -> int:
    """The K/V tile width rung ``number`` takes for a non-causal head_dim-128 call with ``seqlen_k`` keys."""
    r = rungs.get(number)
    return r.long_kv[1]["block_n"] if r.takes_long_kv(seqlen_k) else r.block_n


# ------------------------------------------------------------------- a toy model of rungs 9, 10 and 16

# Schematic lengths, in time units: not measured (a trace would measure them).
S_LEN, PV_LEN, SOFTMAX_LEN, PACK_LEN, EPILOGUE_LEN = 2, 2, 4, 1, 2
ISSUE_LEN = Fraction(1, 4)  # issuing one wgmma group
LOAD_LEN = 3  # a TMA load, from its issue until its bytes have landed
START_LEN = 1  # a CTA's start: barrier init, descriptor prefetch, setmaxnreg
TICKS = 4  # simulation steps per time unit


def consumer_program(number: int, wg: int, n_tiles: int, work_tiles: int = 1, *, loads: bool = True, wgs: int = 2):
    """What consumer warpgroup ``wg`` (of ``wgs``) of rung ``number`` does, in the kernel's order, over
    ``work_tiles`` work tiles of ``n_tiles`` K/V tiles each: a list of (op, argument). A rung with the ping-pong
    turns (:func:`facts.has_turns`: rung 16) waits for its turn before each group of wgmmas and passes the turn
    on after it (the ring of ``wgs`` warpgroups that the kernel has); the rungs below issue as soon as their
    operands are there. K/V loads are numbered over the whole CTA (``K0``, ``V0``, ``K1``, ...), as the kernel's
    ring counter ``kv``; ``loads=False`` leaves out the waits for them and the releases (every tile is assumed
    to be in shared memory)."""
    if work_tiles > 1 and not rungs.get(number).persistent:
        raise ValueError(f"rung {number} runs one work tile per CTA")
    q_empty = "bar_q_empty" in facts.mbarrier_counts(number)
    turns = facts.has_turns(number)
    prog = []
    if turns:
        tb = facts.turn_barriers(number)
        ring = tb["rings"][wgs]
        my, other = ring["my_turn"][wg], ring["other_turn"][wg]
        if wg == ring["pre_arrive_wg"]:
            prog.append(("arrive", ring["pre_arrive_bar"]))

    def need(*ops):
        if loads:
            prog.extend(ops)

    def turn():
        if turns:
            prog.append(("sync", my))

    def pass_turn():
        if turns:
            prog.append(("arrive", other))

    kv = 0
    for it in range(work_tiles):
        tag = "'" * it  # the second work tile's tiles are K0', V0', ...
        need(("wait_load", f"Q{it}"))
        need(("wait_load", f"K{kv}"))  # tile 0 is peeled: S only, then wait_group 0
        turn()
        prog.append(("issue", f"S0{tag}"))
        pass_turn()
        prog.append(("wait", 0))
        need(("release", f"K{kv}"))
        prog += [("softmax", f"softmax 0{tag}"), ("alu", f"pack P0{tag}")]
        for j in range(1, n_tiles):
            kv += 1
            need(("wait_load", f"K{kv}"))
            turn()
            prog.append(("issue", f"S{j}{tag}"))
            need(("wait_load", f"V{kv - 1}"))
            prog.append(("issue", f"P{j - 1}·V{j - 1}{tag}"))
            pass_turn()
            prog.append(("wait", 1))
            need(("release", f"K{kv}"))
            prog += [("softmax", f"softmax {j}{tag}"), ("wait", 0)]
            need(("release", f"V{kv - 1}"))
            prog.append(("alu", f"O·α, P{j}{tag}"))
        if q_empty:
            need(("release", f"Q{it}"))  # every S of this work tile is complete
        need(("wait_load", f"V{kv}"))
        turn()
        prog.append(("issue", f"P{n_tiles - 1}·V{n_tiles - 1}{tag}"))
        if turns and (wg in ring["last_arrive_wgs"] or (it < work_tiles - 1 and tb["skips_only_at_the_end"])):
            pass_turn()
        prog.append(("wait", 0))
        need(("release", f"V{kv}"))
        prog.append(("alu", "epilogue"))
        kv += 1
    return prog


def producer_program(number: int, n_tiles: int, work_tiles: int = 1) -> list:
    """The TMA thread of rung ``number``: Q of each work tile (after ``q_empty``, where the kernel has it),
    then K and V of every tile, each into the slot of load ``kv - NUM_STAGES`` once that was released."""
    stages = rungs.get(number).stages
    q_empty = "bar_q_empty" in facts.mbarrier_counts(number)
    prog, kv = [], 0
    for it in range(work_tiles):
        if it and q_empty:
            prog.append(("wait_free", f"Q{it - 1}"))
        prog.append(("load", f"Q{it}"))
        for _ in range(n_tiles):
            for m in "KV":
                if kv >= stages:
                    prog.append(("wait_free", f"{m}{kv - stages}"))
                prog.append(("load", f"{m}{kv}"))
            kv += 1
    return prog


def simulate(consumers: list, producer: list | None = None) -> dict:
    """A toy model of one CTA of rungs 9, 10 and 16 on one SM: the consumer warpgroups run ``consumers`` (see
    :func:`consumer_program`), the TMA thread ``producer``. The tensor cores run the wgmma groups one after
    the other in issue order, softmaxes at the same time share the MUFU units (two at half speed each),
    the k-th ``bar.sync`` on a named barrier passes once it has k arrivals, a load lands ``LOAD_LEN`` after
    its issue and its slot is free once every consumer warpgroup released it. Time advances in steps of
    1/``TICKS`` unit. Returns the lanes as run-length spans ``(state, t0, t1)``, the named-barrier events
    ``(wg, op, barrier, t)``, the loads ``name -> (issued, landed, released)`` and the end."""
    n = len(consumers)
    progs = [*consumers, producer or []]
    pc = [0] * (n + 1)
    arrivals, syncs, released = {}, {}, {}
    loads = {}  # name -> [issue step, landed step, released step]
    queue = []  # the wgmma groups issued and not complete: [owner, name, steps left]
    outstanding = [0] * n
    work = [None] * n  # the phase a warpgroup is in: [kind, label, steps left]
    events, history = [], {}
    for w in range(n):
        history[f"wg{w}"], history[f"tc{w}"], history[f"mufu{w}"] = [], [], []
    lengths = {"S": S_LEN, "P": PV_LEN}
    t = 0
    while any(pc[a] < len(progs[a]) for a in range(n + 1)) or any(work) or queue:
        progress = True
        while progress:  # the zero-time ops: barriers, issues, loads, waits that are already satisfied
            progress = False
            for a in range(n + 1):
                if pc[a] >= len(progs[a]) or (a < n and work[a]):
                    continue
                op, arg = progs[a][pc[a]]
                if op == "arrive":
                    arrivals[arg] = arrivals.get(arg, 0) + 1
                    events.append((a, "arrive", arg, t))
                elif op == "sync":
                    if arrivals.get(arg, 0) < syncs.get(arg, 0) + 1:
                        continue
                    syncs[arg] = syncs.get(arg, 0) + 1
                    events.append((a, "sync", arg, t))
                elif op == "issue":
                    queue.append([a, arg, lengths[arg[0]] * TICKS])
                    outstanding[a] += 1
                    work[a] = ["issue", "", ISSUE_LEN * TICKS]  # the wgmmas start while the rest are issued
                elif op == "wait":
                    if outstanding[a] > arg:
                        continue
                elif op == "wait_load":
                    if arg not in loads or loads[arg][1] > t:
                        continue
                elif op == "release":
                    released[arg] = released.get(arg, 0) + 1
                    if released[arg] == n:
                        loads[arg][2] = t
                    events.append((a, "release", arg, t))
                elif op == "wait_free":
                    if released.get(arg, 0) < n:
                        continue
                elif op == "load":
                    loads[arg] = [t, t + LOAD_LEN * TICKS, None]
                elif op == "softmax":
                    work[a] = ["softmax", arg, Fraction(SOFTMAX_LEN * TICKS)]
                elif op == "alu":
                    work[a] = ["alu", arg, Fraction((EPILOGUE_LEN if arg == "epilogue" else PACK_LEN) * TICKS)]
                pc[a] += 1
                progress = True
        for w in range(n):  # this step's state of every lane
            if work[w]:
                state = (work[w][0], work[w][1])
            elif pc[w] < len(progs[w]):
                state = ("turn", "") if progs[w][pc[w]][0] == "sync" else ("wait", "")
            else:
                state = None
            history[f"wg{w}"].append(state)
            history[f"tc{w}"].append(("tc", queue[0][1]) if queue and queue[0][0] == w else None)
        if queue:  # the tensor cores: the oldest wgmma group first
            queue[0][2] -= 1
            if queue[0][2] <= 0:
                outstanding[queue.pop(0)[0]] -= 1
        on_mufu = [w for w in range(n) if work[w] and work[w][0] == "softmax"]
        for w in range(n):
            history[f"mufu{w}"].append(("mufu", work[w][1]) if w in on_mufu else None)
            if work[w]:
                work[w][2] -= Fraction(1, len(on_mufu)) if w in on_mufu else 1
                if work[w][2] <= 0:
                    work[w] = None
        t += 1
    lanes = {}
    for key, states in history.items():
        spans, start = [], 0
        for i in range(1, len(states) + 1):
            if i == len(states) or states[i] != states[start]:
                if states[start] is not None:
                    spans.append((states[start], Fraction(start, TICKS), Fraction(i, TICKS)))
                start = i
        lanes[key] = spans
    return {
        "lanes": lanes,
        "events": [(w, op, b, Fraction(tt, TICKS)) for w, op, b, tt in events],
        "loads": {k: tuple(None if v is None else Fraction(v, TICKS) for v in steps) for k, steps in loads.items()},
        "end": Fraction(t, TICKS),
    }


def _span_colour(state) -> tuple:
    kind, text = state
    if kind == "softmax" or kind == "mufu":
        return PHASE_COLOURS["softmax"], text
    if kind == "alu":
        return (PHASE_COLOURS["epilogue"], text) if text == "epilogue" else (PACK, text)
    if kind == "tc":
        return (PHASE_COLOURS["S"] if text.startswith("S") else PHASE_COLOURS["PV"]), text
    if kind == "turn":
        return tint(VERMILLION, 0.6), ""
    if kind == "issue":
        return BLUE, ""
    return PHASE_COLOURS["wait"], ""


def _draw_spans(ax, spans, x0, y, unit, height, *, font=6.4, offset=0, lw=0.5):
    """Boxes along a time line; a box's text only where it fits."""
    for state, t0, t1 in spans:
        colour, text = _span_colour(state)
        w = float(t1 - t0) * unit
        box(
            ax,
            x0 + float(t0 + offset) * unit,
            y,
            w - 0.015,
            height,
            text if w >= 0.0085 * font * len(text) else "",
            fc=colour,
            fontsize=font,
            rounded=False,
            ec="#555555",
            lw=lw,
        )


# ------------------------------------------------------------------------------------------------ rung 10


def _short(shape) -> str:
    return shape.label.replace("Wan2.1-", "Wan ").replace(" 720p", "").replace(" 480p", "").replace("-attn", "")


def rung10_grid(path):
    r = rungs.get(10)
    sms = facts.H200_SMS
    per_sm = facts.ctas_per_sm(10)
    regs = facts.registers_at_launch(r.threads)
    grid = sms * per_sm
    shape = shapes.fa_shape(1024)
    m_blocks = r.num_m_blocks(shape.seqlen_q)
    num_tiles = shape.batch * shape.heads * m_blocks
    rounds = -(-num_tiles // grid)
    fig, ax = new_figure(9.6, 4.0)
    title(
        ax,
        0.1,
        3.95,
        f"Rung 10: {grid} persistent CTAs walk the work tiles blockIdx.x, blockIdx.x + gridDim.x, … "
        f"(one per SM of an H200)",
    )
    # left: which CTA takes which work tile, for the 1k shape
    full = num_tiles - (rounds - 1) * grid  # CTAs with a work tile in the last round
    ctas = [0, 1, None, m_blocks - 1, m_blocks, None, full - 1, full, None, grid - 1]
    its = [0, 1, 2, None, rounds - 2, rounds - 1]
    cw, ch, ew = 0.62, 0.38, 0.2
    x0, ytop = 0.75, 3.0
    head_colours = [tint(c, 0.55) for c in (BLUE, ORANGE, GREEN, SKY, VERMILLION, PURPLE, YELLOW)]
    xs, x = [], x0
    for c in ctas:
        xs.append(x)
        x += cw if c is not None else ew
    ys, y = [], ytop
    for it in its:
        ys.append(y)
        y -= ch if it is not None else ew
    for c, xc in zip(ctas, xs, strict=True):
        label(ax, xc + (cw if c is not None else ew) / 2, ytop + ch + 0.1, "…" if c is None else str(c), size=6.8)
    label(ax, x0 + (x - x0) / 2, ytop + ch + 0.3, "CTA = blockIdx.x", size=7.2, weight="bold")
    for it, yc in zip(its, ys, strict=True):
        label(ax, x0 - 0.08, yc + ch / 2, "⋮" if it is None else f"it = {it}", size=6.8, ha="right")
        for c, xc in zip(ctas, xs, strict=True):
            if c is None or it is None:
                continue
            w = c + it * grid
            if w < num_tiles:
                bh, mb = divmod(w, m_blocks)
                box(
                    ax,
                    xc + 0.02,
                    yc + 0.02,
                    cw - 0.04,
                    ch - 0.04,
                    f"w {w}\nbh {bh}, m {mb}",
                    fc=head_colours[bh % len(head_colours)],
                    rounded=False,
                    fontsize=5.6,
                    lw=0.4,
                )
            else:
                box(
                    ax,
                    xc + 0.02,
                    yc + 0.02,
                    cw - 0.04,
                    ch - 0.04,
                    "done",
                    fc="white",
                    ec=GREY,
                    rounded=False,
                    fontsize=5.6,
                    lw=0.4,
                    hatch="///",
                )
    label(
        ax,
        x0,
        ys[-1] - 0.22,
        f"{shape.label} shape ({shape.detail}): {num_tiles} work tiles = B·H·⌈Sq/{r.block_m}⌉; "
        f"work tile w → bh = w / {m_blocks}, m-block = w % {m_blocks}",
        size=6.8,
        ha="left",
    )
    label(
        ax,
        x0,
        ys[-1] - 0.45,
        f"consecutive CTAs take consecutive m-blocks of one head (colour): "
        f"{grid // m_blocks}+ heads' K/V in flight share the L2",
        size=6.8,
        ha="left",
        color="#444444",
    )
    # right: work tiles per CTA of each bench shape
    tx = 6.35
    cols = [
        (tx, "shape", "left"),
        (tx + 1.45, "work tiles", "right"),
        (tx + 2.2, "per CTA", "right"),
        (tx + 2.7, "waves", "right"),
        (tx + 3.15, "K/V", "right"),
    ]
    ty = ytop + ch + 0.1
    for xc, text, ha in cols:
        label(ax, xc, ty, text, size=7, weight="bold", ha=ha)
    ax.plot([tx, tx + 3.2], [ty - 0.12, ty - 0.12], color="#333333", lw=0.6)
    for k, sh in enumerate(shapes.default_shapes(features=False)):
        n = sh.batch * sh.heads * r.num_m_blocks(sh.seqlen_q)
        q, rem = divmod(n, min(n, grid))
        per_cta = f"{q + 1} or {q}" if rem else f"{q}"
        yk = ty - 0.3 - k * 0.24
        for (xc, _, ha), text in zip(
            cols,
            (_short(sh), _fmt(n), per_cta, f"{n / min(n, grid):.1f}", str(_tiles(sh.seqlen_k, r.block_n))),
            strict=True,
        ):
            label(ax, xc, yk, text, size=6.8, ha=ha)
    yk = ty - 0.3 - len(shapes.default_shapes(features=False)) * 0.24
    label(
        ax,
        tx,
        yk - 0.05,
        f"per CTA: ⌈tiles / {grid}⌉ for the first tiles % {grid} CTAs, ⌊tiles / {grid}⌋\n"
        f"for the others (waves = tiles / {grid}); K/V: K/V tiles per work tile",
        size=6.4,
        ha="left",
        va="top",
        color="#444444",
    )
    label(
        ax,
        0.1,
        0.2,
        f"grid = min(work tiles, SMs × CTAs per SM) = {sms} × {per_sm}: {r.threads} threads × {regs} registers and "
        f"{_fmt(r.smem_bytes)} B of shared memory leave room for {per_sm} CTA per SM.\n{sms} SMs is the H200's "
        "count (the launch asks the device); the kernel receives num_tiles as its last argument.",
        size=6.6,
        ha="left",
        color="#444444",
    )
    save(fig, path)


def _load_name(name: str, n_tiles: int) -> str:
    """``K5`` (the kernel's ring counter over the CTA) as the figure names it: ``K1'`` (tile 1 of the second
    work tile)."""
    kind, number = name[0], int(name[1:])
    if kind == "Q":
        return "Q" + "'" * number
    return f"{kind}{number % n_tiles}" + "'" * (number // n_tiles)


def _draw_cta(ax, model, x0, y_top, unit, offset, n_tiles, stages, *, end_q=None):
    """One CTA of the toy model: its ring slots (in flight: hatched; in shared memory until released:
    solid), its two consumer warpgroups and the tensor cores, from time ``offset``."""
    rows = ["Q"] + [f"{m}{s}" for m in "KV" for s in range(stages)]
    rh, gap = 0.12, 0.145
    y_of = {row: y_top - i * gap for i, row in enumerate(rows)}
    colours = {"Q": ROLE["Q"], "K": ROLE["K"], "V": ROLE["V"]}
    for name, (issued, landed, freed) in sorted(model["loads"].items()):
        kind, number = name[0], int(name[1:])
        row = "Q" if kind == "Q" else f"{kind}{number % stages}"
        freed = freed if freed is not None else (end_q if end_q is not None else model["end"])
        y = y_of[row]
        xa = x0 + float(issued + offset) * unit
        xb = x0 + float(landed + offset) * unit
        xc = x0 + float(freed + offset) * unit
        rect(ax, xa, y, xb - xa, rh, fc=tint(colours[kind], 0.75), ec="#777777", lw=0.4, hatch="////")
        text = _load_name(name, n_tiles)
        rect(ax, xb, y, xc - xb - 0.01, rh, fc=tint(colours[kind], 0.35), ec="#555555", lw=0.4)
        if xc - xb > 0.06 * len(text):
            label(ax, (xb + xc) / 2, y + rh / 2, text, size=5.6)
    y_wg = y_top - len(rows) * gap - 0.3
    for w in (0, 1):
        _draw_spans(ax, model["lanes"][f"wg{w}"], x0, y_wg - w * 0.3, unit, 0.24, font=5.6, offset=offset, lw=0.4)
    tc = sorted(model["lanes"]["tc0"] + model["lanes"]["tc1"], key=lambda sp: sp[1])
    _draw_spans(ax, tc, x0, y_wg - 0.64, unit, 0.2, font=5.6, offset=offset, lw=0.4)
    for w, op, arg, t in model["events"]:
        if op == "release" and arg.startswith("Q"):
            x = x0 + float(t + offset) * unit
            ax.plot([x], [y_wg - w * 0.3 + 0.24], marker="D", ms=3.2, color=VERMILLION, zorder=6)
    return {row: y + rh / 2 for row, y in y_of.items()} | {
        "wg0": y_wg + 0.12,
        "wg1": y_wg - 0.18,
        "tc": y_wg - 0.54,
    }


def rung10_handover(path):
    r9, r10 = rungs.get(9), rungs.get(10)
    n_tiles = _tiles(shapes.WAN_TEXT_TOKENS, r10.block_n)
    counts = facts.mbarrier_counts(10)
    cta9 = simulate([consumer_program(9, w, n_tiles) for w in (0, 1)], producer_program(9, n_tiles))
    cta10 = simulate([consumer_program(10, w, n_tiles, 2) for w in (0, 1)], producer_program(10, n_tiles, 2))
    span9 = 2 * (START_LEN + cta9["end"])
    x0, x1 = 1.2, 9.45
    unit = (x1 - x0) / float(span9)
    fig, ax = new_figure(9.6, 5.5)
    title(
        ax,
        0.1,
        5.45,
        f"Rung 10 vs rung 9: two work tiles of {n_tiles} K/V tiles ({shapes.WAN_TEXT_TOKENS} keys) on one SM "
        "(toy model of the code; schematic, not measured)",
    )

    def lane_labels(ys):
        for key, text in (
            ("Q", "Q"),
            ("K0", "K slot 0"),
            ("K1", "K slot 1"),
            ("V0", "V slot 0"),
            ("V1", "V slot 1"),
            ("wg0", "consumer WG 0"),
            ("wg1", "consumer WG 1"),
            ("tc", "tensor cores"),
        ):
            if key in ys:
                big = key in ("wg0", "wg1", "tc")
                label(ax, x0 - 0.08, ys[key], text, size=6.8 if big else 6.2, ha="right")

    def start_box(t, y_hi, y_lo):
        box(
            ax,
            x0 + float(t) * unit,
            y_lo,
            START_LEN * unit - 0.01,
            y_hi - y_lo,
            "",
            fc=tint(GREY, 0.55),
            rounded=False,
            lw=0.4,
        )

    # rung 9: one CTA per work tile, one after the other on this SM
    label(
        ax,
        0.1,
        5.1,
        f"rung 9: one CTA per work tile ({r9.block_n}-key tiles, {r9.stages} slots)",
        size=7.8,
        weight="bold",
        ha="left",
    )
    top = 4.85
    ys = {}
    for c in range(2):
        off = c * (START_LEN + cta9["end"]) + START_LEN
        ys = _draw_cta(ax, cta9, x0, top, unit, off, n_tiles, r9.stages)
        start_box(off - START_LEN, top + 0.12, ys["tc"] - 0.1)
        if c:
            label(
                ax,
                x0 + float(off) * unit + 0.05,
                top + 0.25,
                "the next CTA: start, then wait for Q and K0",
                size=6.4,
                ha="left",
                color=VERMILLION,
            )
            ax.plot(
                [x0 + float(off - START_LEN) * unit] * 2,
                [ys["tc"] - 0.12, top + 0.2],
                color=VERMILLION,
                lw=0.9,
                ls="--",
            )
    lane_labels(ys)
    # rung 10: one CTA walks both
    top = 2.6
    label(ax, 0.1, 2.85, "rung 10: one persistent CTA walks both", size=7.8, weight="bold", ha="left")
    ys = _draw_cta(ax, cta10, x0, top, unit, START_LEN, n_tiles, r10.stages)
    start_box(0, top + 0.12, ys["tc"] - 0.1)
    lane_labels(ys)
    q1 = cta10["loads"]["Q1"]
    xq = x0 + float(q1[0] + START_LEN) * unit
    label(
        ax,
        xq + 0.05,
        top + 0.25,
        f"q_empty complete ({counts['bar_q_empty']} warps arrived): Q', K0', V0', K1' issued",
        size=6.4,
        ha="left",
        color=VERMILLION,
    )
    ax.plot([xq] * 2, [ys["tc"] - 0.12, top + 0.2], color=VERMILLION, lw=0.9, ls="--")
    end9 = x0 + float(span9) * unit
    end10 = x0 + float(START_LEN + cta10["end"]) * unit
    arrow(ax, end10, ys["tc"] - 0.2, end9, ys["tc"] - 0.2, style="<|-|>", color=BLUE, lw=0.9, mutation=6)
    label(ax, end9, ys["tc"] - 0.33, "saved", size=6.4, ha="right", color=BLUE)
    # legend
    ly = 0.5
    items = [
        ("TMA load in flight", tint(GREY, 0.7), "////"),
        ("tile in shared memory", tint(GREY, 0.3), None),
        ("CTA start", tint(GREY, 0.55), None),
        ("S", PHASE_COLOURS["S"], None),
        ("softmax", PHASE_COLOURS["softmax"], None),
        ("P·V", PHASE_COLOURS["PV"], None),
        ("O *= α, pack P", PACK, None),
        ("epilogue", PHASE_COLOURS["epilogue"], None),
        ("wait", PHASE_COLOURS["wait"], None),
    ]
    x = 0.1
    for text, colour, hatch in items:
        rect(ax, x, ly - 0.06, 0.16, 0.12, fc=colour, ec="#555555", lw=0.4, hatch=hatch)
        label(ax, x + 0.2, ly, text, size=6.3, ha="left")
        x += 0.32 + 0.052 * len(text)
    ax.plot([x + 0.05], [ly], marker="D", ms=3.2, color=VERMILLION)
    label(ax, x + 0.14, ly, "arrives on q_empty", size=6.3, ha="left")
    label(
        ax,
        0.1,
        0.2,
        f"Illustrative lengths (units): S, P·V {S_LEN}; softmax {SOFTMAX_LEN}; rescale + pack {PACK_LEN}; epilogue "
        f"{EPILOGUE_LEN}; a load {LOAD_LEN}; a CTA start {START_LEN}. A slot is refilled once both consumer "
        "warpgroups released it (empty barriers);\nthe next Q only after q_empty, i.e. after every S of the work "
        "tile. Two softmaxes at once share the MUFU (each at half speed); wgmma groups run in issue order.",
        size=6.4,
        ha="left",
        va="center",
        color="#444444",
    )
    save(fig, path)


# The epilogue's memory instructions per consumer thread in the plain head_dim-128 kernels (rung 10's 16-byte
# path; its 4-byte fallback for unaligned O is a second copy of the row loop), NVRTC 13.0, sm_90a, from
# `cuobjdump -sass` (epilogue_sass below; tests/test_figures_cpu.py recounts them).
EPILOGUE_SASS = {9: {"STG.E": 32}, 10: {"STSM.16.M88.4": 8, "LDS.128": 8, "STG.E.128": 8}}
LINE_BYTES = 128


def _epilogue_lines(n: int) -> int:
    """128-byte lines a warp's epilogue stores touch, summed over its store instructions (head_dim 128)."""
    if n == 9:  # a warp's 4-byte store covers 8 rows x 16 bytes: 8 lines
        return EPILOGUE_SASS[9]["STG.E"] * 8
    return EPILOGUE_SASS[10]["STG.E.128"] * 32 * 16 // LINE_BYTES  # 32 lanes x 16 contiguous bytes


def rung10_count(path):
    import matplotlib.pyplot as plt

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(8.6, 2.2), gridspec_kw={"width_ratios": [1.3, 1]})
    kinds = [
        ("STG.E (4 B)", "STG.E", tint(VERMILLION, 0.45)),
        ("STSM (stmatrix.x4)", "STSM.16.M88.4", tint(PURPLE, 0.45)),
        ("LDS.128", "LDS.128", tint(SKY, 0.45)),
        ("STG.E.128 (16 B)", "STG.E.128", tint(GREEN, 0.45)),
    ]
    for yi, n in enumerate((9, 10)):
        left = 0
        for text, op, colour in kinds:
            k = EPILOGUE_SASS[n].get(op, 0)
            if k:
                a0.barh(yi, k, left=left, color=colour, edgecolor="white", height=0.6, label=text)
                a0.text(left + k / 2, yi, str(k), ha="center", va="center", fontsize=7)
            left += k
        lines = _epilogue_lines(n)
        a1.barh(yi, lines, color=tint(VERMILLION if n == 9 else GREEN, 0.45), edgecolor="white", height=0.6)
        a1.text(lines + 4, yi, str(lines), va="center", fontsize=7)
    for ax in (a0, a1):
        ax.set_yticks([0, 1], ["rung 9", "rung 10"], fontsize=8)
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
    a0.set_xlim(0, 60)
    a0.set_xlabel("memory instructions per thread in the epilogue (head_dim 128)", fontsize=7.5)
    a0.legend(fontsize=6.5, frameon=False, loc="center right")
    a1.set_xlim(0, 300)
    a1.set_xlabel("128-byte lines its stores touch, per warp and work tile", fontsize=7.5)
    fig.suptitle(
        "Storing a warp's 16 rows of O: 32 scattered 4-byte stores (rung 9) against stmatrix, a row read and "
        "16-byte stores (rung 10)",
        x=0.01,
        ha="left",
        fontsize=8.5,
    )
    save(fig, path)


def rung10_rows(path):
    fig, ax = new_figure(8.6, 3.1)
    chunks, rows, cw, ch = 16, 16, 0.2, 0.12
    panels = [
        (0.3, "rung 9: one STG.E of a warp (8 lanes x 4 B per row)", lambda r, c: r < 8 and c == 0, VERMILLION),
        (4.6, "rung 10: one STG.E.128 of a warp (16 lanes x 16 B per row)", lambda r, c: r < 2, GREEN),
    ]
    for x0, text, hit, colour in panels:
        label(ax, x0, 2.78, text, size=7.2, ha="left")
        for r in range(rows):
            for c in range(chunks):
                y = 2.5 - (r + 1) * ch
                fc = tint(colour, 0.45) if hit(r, c) else "white"
                rect(ax, x0 + c * cw, y, cw, ch, fc=fc, ec="#BBBBBB", lw=0.4)
        # 128-byte line boundaries: every 8 chunks of a 256-byte row
        for c in (0, 8, 16):
            ax.plot([x0 + c * cw] * 2, [2.5 - rows * ch, 2.5], color="#333333", lw=0.9)
        label(
            ax,
            x0 + chunks * cw / 2,
            2.5 - rows * ch - 0.13,
            "256-byte rows of O (16 chunks of 16 B; | = 128-byte line)",
            size=6.5,
        )
    label(
        ax,
        0.3,
        0.18,
        "Rung 9's store touches 8 lines and half of each 32-byte sector it writes; 32 of them per thread. Rung 10 "
        "first puts the rows into shared memory\nwith stmatrix (the accumulator's n8 tiles are its 8 x 8 "
        "fragments), then each store writes two whole rows: four full lines, 8 per thread.",
        size=6.6,
        ha="left",
        va="center",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 11


def rung11_descriptors(path):
    f = facts.descriptor_fields()
    q_panel, kv_panel, kv_tile, kv_steps, panels = facts.need(
        11, "Q_PANEL", "KV_PANEL", "KV_TILE_BYTES", "KV_STEPS", "PANELS"
    )
    qk_steps = rungs.get(11).head_dim // 16
    row = 128  # bytes of a 64-column bf16 row (hopper.cuh PANEL_ROW_BYTES)
    fig, ax = new_figure(9.6, 5.0)
    title(ax, 0.1, 4.95, "Rung 11: each descriptor is built once, every other one is base + a constant in bits 0–13")
    bit = 9.0 / 64
    x0 = 0.3
    fields = [
        (0, 14, "start address >> 4", tint(BLUE, 0.5)),
        (f["lbo_shift"], 14, "LBO >> 4", tint(ORANGE, 0.45)),
        (f["sbo_shift"], 14, "SBO >> 4", tint(GREEN, 0.5)),
        (49, 3, "base\noffset", tint(GREY, 0.6)),
        (f["swizzle_shift"], 2, "swizzle", tint(VERMILLION, 0.45)),
    ]
    y = 3.75
    rect(ax, x0, y, 64 * bit, 0.5, fc="white", ec="#333333", lw=0.8)
    for lo, width, name, colour in fields:
        x = x0 + (64 - lo - width) * bit  # bit 0 on the right, as in the PTX ISA
        rect(ax, x, y, width * bit, 0.5, fc=colour, ec="#333333", lw=0.6, zorder=3)
        if width >= 3:
            label(ax, x + width * bit / 2, y + 0.25, name, size=6.8, zorder=4)
        else:
            label(ax, x + width * bit / 2, y - 0.14, name, size=6.8)
        label(ax, x + width * bit / 2, y + 0.6, f"{lo + width - 1}..{lo}", size=6.2, color="#555555")
    for i, text in enumerate(
        (
            "Built once (hop::desc_kmajor_sw128, hop::desc_mnmajor_sw128): LBO, SBO, base offset and swizzle are the "
            "same for every wgmma;",
            "only the start field moves, by + (offset >> 4). A shared address < 256 KB never carries out of "
            "its 14 bits.",
        )
    ):
        label(ax, x0, y - 0.32 - 0.2 * i, text, size=6.8, ha="left", color="#444444")
    # the constant added to the start field, per wgmma of one K/V tile
    qk = [(d // 4 * q_panel + d % 4 * 32) >> 4 for d in range(qk_steps)]
    kk = [(d // 4 * kv_panel + d % 4 * 32) >> 4 for d in range(qk_steps)]
    vv = [(kv * 16 * row) >> 4 for kv in range(kv_steps)]
    rows = [
        ("q_desc +", qk, ROLE["Q"], f"k16 step d: 32 B along the row = +2; next 64-column panel = +{q_panel >> 4}"),
        ("k_desc0 +", kk, ROLE["K"], f"same steps in a K tile; next panel = +{kv_panel >> 4}"),
        (
            "v_desc0 +",
            vv,
            ROLE["V"],
            f"k16 step kv: 16 keys × {row} B = +{(16 * row) >> 4} (the panel stride is in LBO)",
        ),
    ]
    cell, gap = 0.62, 0.06
    for i, (name, offs, colour, note) in enumerate(rows):
        yy = 2.75 - i * 0.68
        label(ax, 0.95, yy + 0.17, name, size=7.5, ha="right", family="monospace")
        for j, off in enumerate(offs):
            box(
                ax,
                1.05 + j * (cell + gap),
                yy,
                cell,
                0.34,
                str(off),
                fc=tint(colour, 0.55),
                fontsize=7,
                family="monospace",
            )
        label(ax, 1.05, yy - 0.12, note, size=6.6, ha="left", va="center", color="#444444")
    yy = 2.75 - 3 * 0.68
    for i, text in enumerate(
        (
            f"Ring slot s (K or V): base + s × (KV_TILE_BYTES >> 4) = + s × {kv_tile >> 4} "
            f"(KV_TILE_BYTES = {_fmt(kv_tile)} B, {panels} panels of {_fmt(kv_panel)} B).",
            f"The compiler folds the constants: one 64-bit add per wgmma ({qk_steps} + {kv_steps} per K/V tile), where "
            "rung 10 masked, shifted and OR-ed",
            "a fresh descriptor from a per-thread shared address before each of them.",
        )
    ):
        label(ax, 0.3, yy + 0.1 - 0.2 * i, text, size=6.8, ha="left", color="#333333")
    save(fig, path)


# SASS instructions of the steady loop (the innermost loop around the wait for S, `WARPGROUP.DEPBAR.LE gsb0, 0x1`:
# one K/V tile of one consumer warpgroup; steady_loop below) of the plain head_dim-128 kernels, NVRTC 13.0,
# sm_90a: every opcode whose count the change moves by more than one, and the loop's total.
LOOP_SASS = {
    10: {
        "ULOP3": 50,
        "USHF": 26,
        "ULDC": 2,
        "UISETP": 3,
        "ULEA": 11,
        "UIADD3": 33,
        "IADD3": 0,
        "IMAD": 10,
        "LOP3": 2,
        "ISETP": 32,
        "PLOP3": 2,
        "total": 749,
    },
    11: {
        "ULOP3": 7,
        "USHF": 4,
        "ULDC": 0,
        "UISETP": 1,
        "ULEA": 9,
        "UIADD3": 40,
        "IADD3": 16,
        "IMAD": 22,
        "LOP3": 5,
        "ISETP": 34,
        "PLOP3": 0,
        "total": 714,
    },
}
# Nsight Compute at 1×16×16384 in one run, before the re-cut: the ladder's rung 12 of that time (rung 10's
# descriptors, with 176-key tiles and the ping-pong turns) and FA4's Hopper path (millions of warp instructions
# executed; benchmarks/ab/ncu_rung12_vs_fa4_16k_mix.txt): the uniform-datapath descriptor arithmetic this rung
# removes.
NCU_MIX_16K = {"ULOP3": (61.9, 8.7), "USHF": (29.3, 0.0), "R2UR": (24.7, None)}


def rung11_budget(path):
    import matplotlib.pyplot as plt

    ops = [k for k in LOOP_SASS[10] if k != "total"]
    fig, (ax_t, ax_o) = plt.subplots(2, 1, figsize=(8.6, 4.8), gridspec_kw={"height_ratios": [2, 4], "hspace": 0.7})
    moved = {n: sum(LOOP_SASS[n][k] for k in ops) for n in (10, 11)}
    top = max(LOOP_SASS[n]["total"] for n in (10, 11))
    for yi, n in enumerate((10, 11)):
        rest = LOOP_SASS[n]["total"] - moved[n]
        ax_t.barh(yi, rest, color=tint(GREY, 0.55), edgecolor="white", height=0.6)
        ax_t.barh(
            yi, moved[n], left=rest, color=tint(VERMILLION if n == 10 else GREEN, 0.35), edgecolor="white", height=0.6
        )
        ax_t.text(rest / 2, yi, f"other opcodes: {rest}", ha="center", va="center", fontsize=7)
        ax_t.text(rest + moved[n] / 2, yi, str(moved[n]), ha="center", va="center", fontsize=7)
        ax_t.text(LOOP_SASS[n]["total"] + top * 0.01, yi, str(LOOP_SASS[n]["total"]), va="center", fontsize=7.5)
    ax_t.set_yticks(range(2), ["rung 10", "rung 11"], fontsize=7.5)
    ax_t.invert_yaxis()
    ax_t.set_xlim(0, top * 1.12)
    ax_t.set_xlabel(
        "SASS instructions of the steady loop (one K/V tile of one consumer warpgroup; coloured: the opcodes below)",
        fontsize=7.5,
    )
    d = LOOP_SASS[10]["total"] - LOOP_SASS[11]["total"]
    ax_t.set_title(
        f"Rung 11: {d} fewer instructions per K/V tile ({d / LOOP_SASS[10]['total']:.1%}), in the address and "
        f"descriptor arithmetic ({SASS_NVRTC})",
        loc="left",
    )
    xs = range(len(ops))
    w = 0.38
    ax_o.bar([x - w / 2 for x in xs], [LOOP_SASS[10][k] for k in ops], w, color=tint(VERMILLION, 0.35), label="rung 10")
    ax_o.bar([x + w / 2 for x in xs], [LOOP_SASS[11][k] for k in ops], w, color=tint(GREEN, 0.35), label="rung 11")
    for x, k in zip(xs, ops):
        for dx, n in ((-w / 2, 10), (w / 2, 11)):
            ax_o.text(x + dx, LOOP_SASS[n][k] + 0.6, str(LOOP_SASS[n][k]), ha="center", va="bottom", fontsize=6.2)
    ax_o.set_xticks(list(xs), ops, fontsize=7, family="monospace")
    ax_o.set_ylim(0, 1.25 * max(LOOP_SASS[n][k] for n in (10, 11) for k in ops))
    ax_o.set_ylabel("per loop iteration", fontsize=7.5)
    ax_o.legend(fontsize=7, loc="upper right", frameon=False)
    ncu = ", ".join(
        f"{k} {old:g} M" + ("" if fa4 is None else f" (FA4 {fa4:g} M)" if fa4 else " (FA4 ≈ 0)")
        for k, (old, fa4) in NCU_MIX_16K.items()
    )
    ax_o.set_title(
        "The opcodes whose count changes by more than one (U…: the uniform datapath)", loc="left", fontsize=7.5
    )
    ax_o.text(
        0.0,
        -0.3,
        f"Nsight Compute before the re-cut, the old rung 12 (these descriptors; 176-key tiles, turns) at 1×16×16384, "
        f"warp instructions executed:\n{ncu} (benchmarks/ab/ncu_rung12_vs_fa4_16k_mix.txt)",
        transform=ax_o.transAxes,
        fontsize=6.8,
        va="top",
        color="#444444",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 12

LAZY_SEQLEN, LAZY_ROWS, LAZY_SEED = 16384, 256, 14  # the inputs of rung 12's figures: randn, head_dim 128


def _lazy_runs():
    """Per K/V tile of rung 12 (BLOCK_N keys), for LAZY_ROWS rows of randn Q·Kᵀ (head_dim 128, scale 1/sqrt(128),
    seqlen_k LAZY_SEQLEN): the rows' running max, rung 11's and rung 12's references (in s·c, log2 units) and
    whether each 16-row warp rescales O (some row's alpha != 1), from the float32 model of the kernels
    (attnclimb.reference: online_rescale_fp32 and rung 12's test on the kept reference, lazy_max_fp32)."""
    import math

    import torch

    from .. import reference as ref

    g = torch.Generator().manual_seed(LAZY_SEED)
    q = torch.randn(LAZY_ROWS, 128, generator=g).bfloat16().double()
    k = torch.randn(LAZY_SEQLEN, 128, generator=g).bfloat16().double()
    s = (q @ k.T).float()
    c = torch.tensor(ref.LOG2E / math.sqrt(128), dtype=torch.float32)
    block_n = _block_n(12, LAZY_SEQLEN)
    out = {"max": [], "ref11": [], "ref12": [], "warp11": [], "warp12": []}
    state = {
        11: (torch.full((LAZY_ROWS, 1), ref.ROW_MAX_INIT), torch.zeros(LAZY_ROWS, 1)),
        12: (torch.full((LAZY_ROWS, 1), ref.ROW_MAX_INIT), torch.zeros(LAZY_ROWS, 1)),
    }
    run_max = torch.full((LAZY_ROWS, 1), ref.ROW_MAX_INIT)
    for n0 in range(0, LAZY_SEQLEN, block_n):
        tile = s[:, n0 : n0 + block_n].amax(-1, keepdim=True)
        run_max = torch.maximum(run_max, tile)
        out["max"].append((run_max * c).squeeze(-1))
        for n in (11, 12):
            m, err = state[n]
            m_new = torch.maximum(m, tile)
            if n == 12:
                m_new = ref.lazy_max_fp32(m, err, m_new, c, ref.RESCALE_THRESHOLD)
            alpha, _, neg_ref, err_new = ref.online_rescale_fp32(m, err, m_new, c)
            state[n] = (m_new, err_new)
            out[f"ref{n}"].append(-neg_ref.squeeze(-1))
            out[f"warp{n}"].append((alpha != 1).view(-1, 16).any(-1).float().mean().item() if n0 else 1.0)
    return out


def rung12_reference(path):
    import matplotlib.pyplot as plt

    runs = _lazy_runs()
    tiles = 24
    row = 0
    fig, ax = plt.subplots(figsize=(8.6, 3.4))
    xs = range(tiles)
    ax.plot(xs, [float(runs["max"][t][row]) for t in xs], color=GREY, lw=1.2, marker="o", ms=3, label="running max m·c")
    ax.step(xs, [float(runs["ref11"][t][row]) for t in xs], where="post", color=VERMILLION, lw=1.4, label="rung 11: R")
    ax.step(
        xs, [float(runs["ref12"][t][row]) for t in xs], where="post", color=GREEN, lw=1.4, ls="--", label="rung 12: R"
    )
    moves11 = [t for t in xs if t and float(runs["ref11"][t][row]) != float(runs["ref11"][t - 1][row])]
    moves12 = [t for t in xs if t and float(runs["ref12"][t][row]) != float(runs["ref12"][t - 1][row])]
    for t in moves11:
        ax.annotate(
            "",
            (t, float(runs["ref11"][t][row])),
            (t, float(runs["ref11"][t][row]) - 0.35),
            arrowprops={"arrowstyle": "-|>", "color": VERMILLION, "lw": 0.8},
        )
    ax.set_xlabel(f"K/V tile ({_block_n(12, LAZY_SEQLEN)} keys)", fontsize=8)
    ax.set_ylabel("log2 units (s·c)", fontsize=8)
    ax.legend(fontsize=7.5, frameon=False, loc="lower right")
    ax.set_title(
        f"One row of randn Q·Kᵀ (head_dim 128, {LAZY_SEQLEN} keys), its first {tiles} tiles:\n"
        f"rung 11 moves its reference {len(moves11)} times after the first tile (O *= alpha each time), rung 12 "
        f"{len(moves12)} times (P against it stays <= 2^8)",
        loc="left",
        fontsize=8.5,
    )
    ax.tick_params(labelsize=7)
    save(fig, path)


def rung12_rescales(path):
    import matplotlib.pyplot as plt

    runs = _lazy_runs()
    n = len(runs["warp11"])
    fmul = 4 * facts.need(12, "O_TILES")  # O *= alpha: the thread's O accumulators
    fig, ax = plt.subplots(figsize=(8.6, 3.2))
    ax.plot(range(n), runs["warp11"], color=VERMILLION, lw=1.2, label="rung 11: some row's max grew")
    ax.plot(range(n), runs["warp12"], color=GREEN, lw=1.4, label="rung 12: some row's new max would give P > 2^8")
    f11 = sum(runs["warp11"][1:]) / (n - 1)
    f12 = sum(runs["warp12"][1:]) / (n - 1)
    ax.set_xlabel(f"K/V tile ({_block_n(12, LAZY_SEQLEN)} keys)", fontsize=8)
    ax.set_ylabel("share of 16-row warps", fontsize=8)
    ax.set_ylim(-0.03, 1.03)
    ax.legend(fontsize=7.5, frameon=False, loc="upper right")
    ax.set_title(
        f"Warps that must rescale O ({fmul} FMUL per thread), per tile after the first: rung 11 {f11:.0%} of them, "
        f"rung 12 {f12:.1%}\n({LAZY_ROWS} rows of randn Q·Kᵀ, head_dim 128, {LAZY_SEQLEN} keys; the float32 model "
        "of the kernels)",
        loc="left",
        fontsize=8.5,
    )
    ax.tick_params(labelsize=7)
    save(fig, path)


# The dependency chain from S (the wait for the S wgmmas) to the first exponential of a score, per consumer thread
# and K/V tile, in rung 11's steady loop and on rung 12's fast path for kept references (the plain kernels; "{n}":
# the thread's scores, S_TILES · 4). tests/test_figures_cpu.py finds these opcodes on that path in the SASS.
PATH_STEPS = {
    11: [
        ("own columns' max", "{n} FMNMX, two chains"),
        ("quad max", "2 x 2 SHFL.BFLY + FMNMX"),
        ("new mul, R", "FADD, LOP3,\nVIADDMNMX, FMUL.RP"),
        ("exponentials", "{n} x (FFMA + MUFU.EX2)"),
    ],
    12: [
        ("own columns' max", "{n} FMNMX, two chains"),
        ("limit test", "2 FSETP, VOTE.ALL, BRA"),
        ("exponentials", "{n} x (FFMA + MUFU.EX2)"),
    ],
}


def rung12_path(path):
    fig, ax = new_figure(8.6, 3.0)
    widths = {"own columns' max": 2.0, "quad max": 1.7, "new mul, R": 1.7, "limit test": 1.5}
    for yi, (n, steps) in enumerate(PATH_STEPS.items()):
        scores = 4 * facts.need(n, "S_TILES")
        y = 1.95 - 1.25 * yi
        label(ax, 0.1, y + 0.45, f"rung {n}" + (" (every tile)" if n == 11 else " (fast path)"), size=8, ha="left")
        x = 0.1
        for name, what in steps:
            w = widths.get(name, 2.2)
            colour = SKY if name == "own columns' max" else YELLOW if name == "exponentials" else VERMILLION
            if n == 12 and name == "limit test":
                colour = GREEN
            box(ax, x, y - 0.35, w, 0.7, f"{name}\n{what.format(n=scores)}", fc=tint(colour, 0.3), fontsize=6.8)
            if name != "exponentials":
                arrow(ax, x + w, y, x + w + 0.2, y)
            x += w + 0.2
    title(ax, 0.1, 2.95, "From S to the first exponential, per consumer thread and K/V tile", size=9)
    save(fig, path)


FAST_SEQLENS = (1024, 4096, 16384, 32760, 75600)  # the bench's self-attention lengths


def _fast_path_shares():
    """Per seqlen_k in FAST_SEQLENS: the share of (16-row warp, K/V tile) pairs that take rung 12's fast path
    (every row of the warp keeps its reference under the lazy rule; a row's first tile never does), for LAZY_ROWS
    rows of randn Q·Kᵀ (head_dim 128, scale 1/sqrt(128), the K/V tiles rung 12 takes at that length; the
    float32 model, attnclimb.reference), and the number of K/V tiles per row and their width."""
    import math

    import torch

    from .. import reference as ref

    g = torch.Generator().manual_seed(LAZY_SEED)
    q = torch.randn(LAZY_ROWS, 128, generator=g).bfloat16().double()
    k = torch.randn(max(FAST_SEQLENS), 128, generator=g).bfloat16().double()
    s_all = (q @ k.T).float()
    c = torch.tensor(ref.LOG2E / math.sqrt(128), dtype=torch.float32)
    out = {}
    for sk in FAST_SEQLENS:
        block_n = _block_n(12, sk)
        m, err = torch.full((LAZY_ROWS, 1), ref.ROW_MAX_INIT), torch.full((LAZY_ROWS, 1), math.inf)
        fast, tiles = 0.0, 0
        for n0 in range(0, sk, block_n):
            tile = s_all[:, n0 : min(n0 + block_n, sk)].amax(-1, keepdim=True)
            m_new = ref.lazy_max_fp32(m, err, torch.maximum(m, tile), c, ref.RESCALE_THRESHOLD)
            kept = m_new == m  # the reference stands: every score is within the row's limit
            fast += kept.view(-1, 16).all(-1).float().mean().item() if n0 else 0.0
            _, _, _, err = ref.online_rescale_fp32(m, err, m_new, c)
            m, tiles = m_new, tiles + 1
        out[sk] = (fast / tiles, tiles, block_n)
    return out


def rung12_fastpath(path):
    import matplotlib.pyplot as plt

    shares = _fast_path_shares()
    fig, ax = plt.subplots(figsize=(8.6, 3.2))
    xs = range(len(FAST_SEQLENS))
    vals = [shares[sk][0] for sk in FAST_SEQLENS]
    ax.bar(xs, vals, 0.55, color=tint(GREEN, 0.35), edgecolor=GREEN)
    for x, sk in zip(xs, FAST_SEQLENS):
        share, tiles, block_n = shares[sk]
        ax.text(x, share + 0.02, f"{share:.0%}\n({tiles} tiles of {block_n})", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [f"{sk:,}".replace(",", " ") for sk in FAST_SEQLENS], fontsize=7.5)
    lk = rungs.get(12).long_kv
    ax.set_xlabel(
        f"seqlen_k (K/V tiles per row and their keys in brackets: from {_fmt(lk[0])} keys rung 12 takes "
        f"{lk[1]['block_m']} × {lk[1]['block_n']} tiles)",
        fontsize=8,
    )
    ax.set_ylabel("share of (warp, K/V tile)", fontsize=8)
    ax.set_ylim(0, 1.2)
    ax.set_title(
        "Warps whose 16 rows all keep their reference take the fast path (no quad max, no new reference):\n"
        f"{LAZY_ROWS} rows of randn Q·Kᵀ, head_dim 128; a row's first tile always takes the full path "
        "(the float32 model of the kernels)",
        loc="left",
        fontsize=8.5,
    )
    ax.tick_params(labelsize=7)
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 13

# One consumer warpgroup's K/V tile j in the steady loop, in schematic time units (not measured: the rung's
# page has the measured timeline): the wait for S_j, the softmax, the pack of P_j into bf16 pairs (BLOCK_N / 4
# F2FP per thread), the wait for P_{j-1}·V_{j-1} and the warpgroup's next wgmmas.
CHAIN_SOFTMAX, CHAIN_PACK, CHAIN_RESCALE = 5.0, 1.1, 0.5


def rung13_chain(path):
    fig, ax = new_figure(8.6, 3.3)
    x0, unit = 1.25, 0.9
    kv12, kv13 = facts.need(12, "KV_STEPS"), facts.need(13, "KV_STEPS")
    lanes = [  # (y, rung, the steps after the wait for S_j)
        (
            2.15,
            12,
            [("softmax of S_j", CHAIN_SOFTMAX, YELLOW), ("wait\nP·V", 0.6, GREY), ("pack P_j", CHAIN_PACK, PACK)],
        ),
        (
            0.95,
            13,
            [
                ("softmax of S_j, pack P_j\ninto the other buffer", CHAIN_SOFTMAX + 0.25, YELLOW),
                ("wait\nP·V", 0.6, GREY),
            ],
        ),
    ]
    for y, n, steps in lanes:
        kv = kv12 if n == 12 else kv13
        label(ax, 0.1, y + 0.28, f"rung {n}", size=8, ha="left", weight="bold")
        label(
            ax,
            0.1,
            y - 0.02,
            f"{kv * 4} F2FP" + (" after\nthe wait" if n == 12 else " under\nP·V"),
            size=6.5,
            ha="left",
        )
        x = x0
        for name, length, colour in steps:
            w = length * unit * 0.9
            box(ax, x, y - 0.05, w, 0.5, name, fc=tint(colour, 0.35), fontsize=6.6)
            x += w
        box(ax, x + 0.05, y - 0.05, 0.9, 0.5, "next issue:\nS_j+1, P_j·V_j", fc=tint(SKY, 0.35), fontsize=6.4)
        # the tensor cores: P_{j-1}·V_{j-1} in flight from the issue before until its wait
        pv_end = x0 + (CHAIN_SOFTMAX + (0.25 if n == 13 else 0)) * unit * 0.9
        rect(ax, x0, y - 0.42, pv_end - x0, 0.24, fc=tint(GREEN, 0.4), ec=GREEN)
        buf = "p_a" if n == 13 else "p_frag"
        label(ax, x0 + 0.08, y - 0.30, f"tensor cores: P_j-1·V_j-1 (reads {buf})", size=6.3, ha="left")
    title(ax, 0.1, 3.22, "After the softmax of tile j: what stands between a warpgroup and its next wgmmas", size=9)
    label(
        ax,
        0.1,
        0.22,
        "P_j-1·V_j-1 reads its A operand from registers until its wgmma wait, so with one buffer (rung 12) P_j is "
        "packed after that wait;\nwith two (rung 13, p_a / p_b trading roles every tile) the F2FPs run beside the "
        "exponentials, and only the rare O rescale follows the wait.",
        size=6.6,
        ha="left",
        va="center",
    )
    save(fig, path)


# ptxas's spill (bytes of stores, bytes of loads per thread) of rung 13's three-consumer-warpgroup long-K/V build
# with two P buffers forced on (P_DOUBLE_BUFFER 1, which the kernel leaves off there), NVRTC 13.0, sm_90a
# (three_warpgroup_two_p_spill below; tests/test_figures_cpu.py recompiles it).
THREE_WG_TWO_P_SPILL = (96, 144)


def rung13_budget(path):
    import matplotlib.pyplot as plt

    r12 = rungs.get(12)
    bn = r12.block_n
    three = dict(rungs.get(13).long_kv[1])  # the three-consumer-warpgroup tiles (long K/V)
    variants = [  # (label, rung, Rung fields changed)
        (f"rung 12: {bn}-key tiles", 12, {}),
        (f"rung 13: {bn}-key tiles", 13, {}),
        (f"rung 13, three WGs: {three['block_m']} × {three['block_n']}", 13, three),
        (
            "the same with two P (not built)",
            13,
            {**three, "extra_defines": {**rungs.get(13).extra_defines, "P_DOUBLE_BUFFER": 1}},
        ),
    ]
    fig, ax = plt.subplots(figsize=(8.6, 2.9))
    for yi, (_, n, change) in enumerate(variants):
        c = facts.constants(n, **change)
        o_t, s_t, kv, creg = c["O_TILES"], c["S_TILES"], c["KV_STEPS"], c["CONSUMER_REGS"]
        buffers = 2 if c.get("P_DOUBLE_BUFFER", 0) else 1
        parts = [(f"O: {o_t * 4}", o_t * 4, tint(ROLE["O"], 0.35)), (f"S: {s_t * 4}", s_t * 4, tint(SKY, 0.25))]
        parts += [(f"P: {kv * 4}", kv * 4, tint(ORANGE, 0.3 + 0.25 * b)) for b in range(buffers)]
        left = 0
        for text, k, colour in parts:
            ax.barh(yi, k, left=left, color=colour, edgecolor="white", height=0.62)
            ax.text(left + k / 2, yi, text, ha="center", va="center", fontsize=7)
            left += k
        ax.plot([creg, creg], [yi - 0.4, yi + 0.4], color=VERMILLION, lw=1.2)
        spills = change.get("extra_defines", {}).get("P_DOUBLE_BUFFER") == 1
        if spills:
            st, ld = THREE_WG_TWO_P_SPILL
            note = f"{left} of {creg}: ptxas spills ({st} B stored, {ld} B loaded)"
        else:
            note = f"{left} of {creg}, {creg - left} left"
        ax.text(creg + 3, yi, note, va="center", fontsize=7, color=VERMILLION if spills else "black")
    ax.set_yticks(range(len(variants)), [v[0] for v in variants], fontsize=7.5)
    ax.invert_yaxis()
    ax.set_xlim(0, 400)
    ax.set_xlabel(
        "32-bit registers of a consumer thread held across the loop in O, S and the P buffers (red: its setmaxnreg "
        "budget; the rest holds addresses, row state)",
        fontsize=7.5,
    )
    c2, c3 = facts.need(13, "CONSUMER_REGS"), facts.need(13, "CONSUMER_REGS", **three)
    ax.set_title(
        f"A second P buffer costs BLOCK_N / 4 registers: it fits two consumer warpgroups' {c2}, not three's {c3}",
        loc="left",
        fontsize=8.5,
    )
    ax.tick_params(labelsize=7)
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 14

# SASS instructions that issue one S group (from the WARPGROUP.ARRIVE before it to its last wgmma) in the steady
# loop of the plain head_dim-128 kernels (the first of its two, unrolled by two; the kernel's first S group is
# peeled before it), NVRTC 13.0, sm_90a (s_group_sass below); and the whole kernel's R2UR and instruction count.
# tests/test_figures_cpu.py recounts them.
S_GROUP_SASS = {
    13: {"HGMMA": 8, "R2UR": 14, "IADD3": 6, "IMAD": 7, "UIADD3": 14, "UMOV": 7, "WARPGROUP": 1},
    14: {"HGMMA": 8, "UIADD3": 28, "UMOV": 25, "WARPGROUP": 1},
}
KERNEL_SASS = {13: {"R2UR": 138, "total": 3888}, 14: {"R2UR": 11, "total": 3768}}


def rung14_sgroup(path):
    import matplotlib.pyplot as plt

    classes = [  # (label, opcodes, colour)
        ("wgmma (HGMMA)", ("HGMMA",), tint(ROLE["K"], 0.45)),
        ("R2UR: register → uniform register", ("R2UR",), tint(VERMILLION, 0.45)),
        ("per-thread integer ops", ("IADD3", "IMAD", "LOP3", "SHF"), tint(SKY, 0.45)),
        ("uniform-datapath ops", ("UIADD3", "UMOV", "ULOP3", "USHF", "WARPGROUP"), tint(GREEN, 0.35)),
    ]
    fig, ax = plt.subplots(figsize=(8.6, 2.4))
    for yi, n in enumerate((13, 14)):
        ops, left = S_GROUP_SASS[n], 0
        for text, names, colour in classes:
            k = sum(ops.get(o, 0) for o in names)
            if k:
                ax.barh(yi, k, left=left, color=colour, edgecolor="white", height=0.6, label=text if yi == 0 else None)
                ax.text(left + k / 2, yi, str(k), ha="center", va="center", fontsize=7)
            left += k
        kern = KERNEL_SASS[n]
        ax.text(left + 1, yi, f"{left} (kernel: {kern['R2UR']} R2UR of {_fmt(kern['total'])})", va="center", fontsize=7)
    ax.set_yticks([0, 1], ["rung 13", "rung 14"], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(
        f"SASS instructions that issue the 8 wgmmas of one S group (plain head_dim-128 kernel, {SASS_NVRTC})",
        fontsize=7.5,
    )
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(
        "Issuing S = Q·Kᵀ: rung 13 moves each Q descriptor into uniform registers (2 R2UR per wgmma), rung 14 "
        "keeps it there",
        loc="left",
        fontsize=8.5,
    )
    ax.tick_params(labelsize=7)
    save(fig, path)


def rung14_path(path):
    fig, ax = new_figure(8.6, 2.9)
    lanes = [
        (
            1.85,
            13,
            [
                ("threadIdx.x / 32", SKY),
                ("wg, Q rows", SKY),
                ("Q descriptor\n(64-bit pair)", SKY),
                ("+ k-step offset\nIADD3, IMAD.X", SKY),
                ("2 × R2UR", VERMILLION),
                ("HGMMA\ngdesc[UR]", ORANGE),
            ],
        ),
        (
            0.75,
            14,
            [
                ("__shfl_sync(\nthreadIdx.x / 32, 0)", GREEN),
                ("wg, Q rows", GREEN),
                ("Q descriptor\n(64-bit pair)", GREEN),
                ("+ k-step offset\nUIADD3", GREEN),
                ("HGMMA\ngdesc[UR]", ORANGE),
            ],
        ),
    ]
    for y, n, steps in lanes:
        label(ax, 0.1, y + 0.02, f"rung {n}", size=8, ha="left", weight="bold")
        x = 0.8
        for i, (text, colour) in enumerate(steps):
            w = 1.05
            box(ax, x, y - 0.3, w, 0.6, text, fc=tint(colour, 0.35), fontsize=6.5)
            if i + 1 < len(steps):
                arrow(ax, x + w, y, x + w + 0.15, y)
            x += w + 0.15
    title(
        ax, 0.1, 2.8, "Where the Q descriptor lives: per-thread registers (blue) or uniform registers (green)", size=9
    )
    label(
        ax,
        0.1,
        0.18,
        "A wgmma reads its descriptors from uniform registers. The compiler keeps a value there only if it can tell "
        "that every thread of the warp holds the same one:\nthreadIdx.x / 32 is the same across a warp, but only "
        "__shfl_sync from lane 0 says so.",
        size=6.6,
        ha="left",
        va="center",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 15

# Static issue cycles (the stall counts in the SASS control bits: bits 41-44 of each instruction's second word in
# `cuobjdump -sass`) summed along the fastest path of one K/V tile's softmax, from the S wait to the P·V wait, at
# the K/V loop's second step, and where that path reaches its vote (VOTE.ALL) and its first MUFU.EX2: the
# kept-reference path (no masked keys, no O rescale) of the plain head_dim-128 kernels, NVRTC 13.0, sm_90a
# (softmax_path_cycles below; tests/test_figures_cpu.py recounts them).
SOFTMAX_PATH_CYCLES = {
    14: {"vote": 153, "first_ex2": 188, "total": 748},
    15: {"vote": 550, "first_ex2": 14, "total": 648},
}
SOFTMAX_PATH_PARTS = {  # what each rung's path does before its vote, and from the vote on
    14: ("column max\n({n} FMNMX), test", "vote, exponentials, l, pack P, anchor"),
    15: ("exponentials, l, largest P ({n} FMNMX), pack P", "vote, l fix,\nanchor"),
}
# Before the re-cut, the ladder's rung 17 with the staged epilogue and the ping-pong turns (the softmax of rung
# 14, below this rung's idea) at 4k (B4 H16 S4096), Nsight Compute's source view (seventh session,
# 85de7ef, SM clock locked at 1.33 GHz): the warp-state samples of the consumer warps in the two steps of the
# unrolled K/V loop, by phase (benchmarks/ab/ncu_rung18_4k_phases_85de7ef.txt). "turn": the ping-pong wait,
# which the rungs below 16 no longer have.
NCU_OLD17_4K_PHASES = (
    ("K wait", 3422),
    ("turn", 2732),
    ("S issue", 6395),
    ("V wait", 2862),
    ("P·V issue", 7769),
    ("S wait", 3664),
    ("row max, vote", 10793),
    ("exponentials, pack", 27629),
    ("P·V wait", 935),
)


def rung15_path(path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.6, 2.4))
    for yi, n in enumerate((14, 15)):
        cyc = SOFTMAX_PATH_CYCLES[n]
        scores = 4 * facts.need(n, "S_TILES")
        before, after = SOFTMAX_PATH_PARTS[n]
        parts = [
            (before.format(n=scores), cyc["vote"], tint(VERMILLION if n == 14 else GREEN, 0.4)),
            (after.format(n=scores), cyc["total"] - cyc["vote"], tint(GREEN if n == 14 else VERMILLION, 0.3)),
        ]
        left = 0
        for text, k, colour in parts:
            ax.barh(yi, k, left=left, color=colour, edgecolor="white", height=0.6)
            ax.text(left + k / 2, yi, f"{text}\n{k}", ha="center", va="center", fontsize=6.4)
            left += k
        ax.text(left + 8, yi, f"{left} cycles", va="center", fontsize=7)
        x = cyc["first_ex2"]
        ax.plot([x], [yi - 0.36], marker="v", ms=5, color="#333333", clip_on=False)
        ax.text(x + 6, yi - 0.42, f"first MUFU.EX2 at {x}", fontsize=6.3, ha="left", va="bottom")
    ax.set_yticks([0, 1], ["rung 14", "rung 15"], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 880)
    ax.set_ylim(1.5, -0.75)
    ax.set_xlabel(
        f"static issue cycles from the S wait to the P·V wait, kept references (SASS stall counts, {SASS_NVRTC})",
        fontsize=7.5,
    )
    ax.set_title(
        "One K/V tile's softmax: rung 14 finds each row's column max before the first exponential, rung 15 after",
        loc="left",
        fontsize=8.5,
    )
    ax.tick_params(labelsize=7)
    save(fig, path)


def rung15_samples(path):
    import matplotlib.pyplot as plt

    total = sum(k for _, k in NCU_OLD17_4K_PHASES)
    fig, ax = plt.subplots(figsize=(8.6, 1.9))
    left = 0
    for text, k in NCU_OLD17_4K_PHASES:
        share = 100 * k / total
        hot = text == "row max, vote"
        colour = tint(VERMILLION, 0.45) if hot else tint(GREEN if "exponentials" in text else SKY, 0.35)
        ax.barh(0, share, left=left, color=colour, edgecolor="white", height=0.6)
        if share > 4:
            ax.text(left + share / 2, 0, f"{text}\n{share:.0f} %", ha="center", va="center", fontsize=6.3)
        left += share
    ax.set_yticks([0], ["old rung 17, 4k"], fontsize=8)
    ax.set_xlim(0, 100)
    ax.set_xlabel(
        "share of a consumer warp's warp-state samples per K/V tile (Nsight Compute source view, 1.33 GHz; "
        "measured before the re-cut)",
        fontsize=7.5,
    )
    ax.set_title(
        "Where a consumer warp below this idea spends a K/V tile: the row-max loop sits between S and the exponentials",
        loc="left",
        fontsize=8.5,
    )
    ax.tick_params(labelsize=7)
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 16


def _schedule(path, wgs: int, n_tiles: int, heading: str, note: str):
    """The toy model of rung 16's turns (:func:`simulate`) with ``wgs`` consumer warpgroups over one work tile
    of ``n_tiles`` K/V tiles: per warpgroup its own lane, its wgmma groups on the tensor cores and its
    exponentials on the MUFU, with the named-barrier operations marked."""
    tb = facts.turn_barriers(16)
    ring = tb["rings"][wgs]
    model = simulate([consumer_program(16, w, n_tiles, loads=False, wgs=wgs) for w in range(wgs)])
    h = 0.3
    rows = {}
    for i in range(wgs):
        rows[f"mufu{i}"] = 0.75 + (wgs - 1 - i) * 0.35
    tc_base = rows["mufu0"] + 0.75
    for i in range(wgs):
        rows[f"tc{i}"] = tc_base + (wgs - 1 - i) * 0.35
    wg_base = rows["tc0"] + 0.75
    for i in range(wgs):
        rows[f"wg{i}"] = wg_base + (wgs - 1 - i) * 0.5
    top = rows["wg0"] + 1.0
    fig, ax = new_figure(9.6, top + 0.05)
    title(ax, 0.1, top, heading)
    x0, x1 = 1.75, 9.45
    unit = (x1 - x0) / float(model["end"])
    for key, y in rows.items():
        _draw_spans(ax, model["lanes"][key], x0, y, unit, h)
        w = int(key[-1])
        name = {"wg": f"consumer WG {w}", "tc": f"WG {w}'s wgmmas", "mu": f"WG {w}'s exp2"}[key[:2]]
        label(ax, x0 - 0.08, y + h / 2, name, size=7.2, ha="right", color=WG_EDGE[w])
    label(ax, 0.1, rows["tc0"] + h + 0.12, "tensor cores", size=7.6, weight="bold", ha="left")
    label(ax, 0.1, rows["mufu0"] + h + 0.12, "MUFU", size=7.6, weight="bold", ha="left")
    # the named-barrier operations of the warpgroups
    for w, op, _, t in model["events"]:
        x = x0 + float(t) * unit
        y = rows[f"wg{w}"]
        if op == "sync":
            ax.plot([x], [y + h + 0.06], marker="v", ms=4.2, color=VERMILLION, zorder=6, clip_on=False)
        else:
            ax.plot([x], [y - 0.06], marker="^", ms=4.2, color=BLUE, zorder=6, clip_on=False)
    pw = ring["pre_arrive_wg"]
    pre = next(e for e in model["events"] if e[0] == pw and e[1] == "arrive")
    label(
        ax,
        x0 + float(pre[3]) * unit + 0.05,
        rows[f"wg{pw}"] - 0.2,
        f"WG {pw} arrives on barrier {ring['pre_arrive_bar']} first: WG 0 goes first",
        size=6.6,
        ha="left",
        color=BLUE,
    )
    (skip,) = [w for w in range(wgs) if w not in ring["last_arrive_wgs"]]
    last = max(t for w, op, _, t in model["events"] if w == skip and op == "sync")
    label(
        ax,
        x0 + float(last) * unit - 0.05,
        rows[f"wg{skip}"] - 0.2,
        "last turn: no arrival",
        size=6.6,
        ha="right",
        color=VERMILLION,
    )
    # legend
    lx, ly = 0.1, 0.36
    ax.plot([lx + 0.05], [ly], marker="v", ms=4.2, color=VERMILLION)
    own = ", ".join(f"WG {w}: {ring['my_turn'][w]}" for w in range(wgs))
    label(ax, lx + 0.15, ly, f"bar.sync on its own barrier ({own}; {tb['threads']} threads each)", size=6.8, ha="left")
    ax.plot([lx + 3.7], [ly], marker="^", ms=4.2, color=BLUE)
    label(ax, lx + 3.8, ly, "bar.arrive on the next one's", size=6.8, ha="left")
    for xi, text, colour in (
        (5.35, "issues its wgmmas", BLUE),
        (6.45, "waits for its turn", tint(VERMILLION, 0.6)),
        (7.6, "waits for wgmmas", PHASE_COLOURS["wait"]),
        (8.65, "O *= α, pack P", PACK),
    ):
        rect(ax, xi, ly - 0.07, 0.16, 0.14, fc=colour, ec="#555555", lw=0.5)
        label(ax, xi + 0.2, ly, text, size=6.2, ha="left")
    label(ax, 0.1, 0.1, note, size=6.5, ha="left", color="#444444")
    save(fig, path)


def rung16_schedule(path):
    r = rungs.get(16)
    n_tiles = _tiles(shapes.WAN_TEXT_TOKENS, r.block_n)
    _schedule(
        path,
        2,
        n_tiles,
        f"Rung 16: the two consumer warpgroups take turns on the tensor cores "
        f"({n_tiles} K/V tiles of {r.block_n} keys; schematic, not measured)",
        f"Illustrative lengths (units): S, P·V {S_LEN}; softmax {SOFTMAX_LEN}; rescale + pack {PACK_LEN}; issue "
        f"{float(ISSUE_LEN)} per wgmma group; epilogue {EPILOGUE_LEN}. wgmma groups run in issue order; two "
        "softmaxes at once share the MUFU (each at half speed).",
    )


def rung16_ring(path):
    r = rungs.get(16)
    three = r.long_kv[1]
    wgs = (three["threads"] - 128) // 128
    n_tiles = 4
    _schedule(
        path,
        wgs,
        n_tiles,
        f"Rung 16 with {wgs} consumer warpgroups: the turn goes round a ring ({n_tiles} K/V tiles; schematic, "
        "not measured)",
        f"{wgs} consumer warpgroups: head_dim 64, and the {three['block_m']} × {three['block_n']} tiles from "
        f"{_fmt(r.long_kv[0])} keys. Illustrative lengths as with two (S, P·V {S_LEN}; softmax {SOFTMAX_LEN}; "
        f"rescale + pack {PACK_LEN}); softmaxes at once share the MUFU.",
    )


def _turn_text(k: int, n_tiles: int) -> str:
    if k == 0:
        return "S0"
    if k == n_tiles:
        return f"P{k - 1}·V{k - 1}"
    return f"S{k},\nP{k - 1}·V{k - 1}"


def rung16_barriers(path):
    from matplotlib.patches import Circle

    r = rungs.get(16)
    tb = facts.turn_barriers(16)
    n_tiles = _tiles(shapes.WAN_TEXT_TOKENS, r.block_n)
    turns = n_tiles + 1
    wg_threads = tb["threads"] // 2
    fig, ax = new_figure(9.6, 4.6)
    title(
        ax,
        0.1,
        4.55,
        f"Rung 16: who waits and who arrives on named barriers {tb['my_turn'][0]} and {tb['my_turn'][1]} "
        f"(a work tile of {n_tiles} K/V tiles: {shapes.WAN_TEXT_TOKENS} keys)",
    )
    cols = 2 * turns + 1
    xl, xr = 1.75, 9.45
    cw = (xr - xl) / cols

    def cx(c):
        return xl + (c + 0.5) * cw

    y_wg = {0: 3.35, 1: 0.75}
    y_bar = {tb["my_turn"][0]: 2.6, tb["my_turn"][1]: 1.65}
    bh = 0.5
    for w, y in y_wg.items():
        label(ax, xl - 0.1, y + bh / 2, f"consumer WG {w}", size=7.6, ha="right", color=WG_EDGE[w], weight="bold")
        label(ax, xl - 0.1, y + bh / 2 - 0.17, f"waits on {tb['my_turn'][w]}", size=6.6, ha="right", color="#444444")
    for b, y in y_bar.items():
        ax.plot([xl, xr], [y, y], color="#777777", lw=0.8, zorder=1)
        label(ax, xl - 0.1, y, f"named barrier {b}", size=7.6, ha="right", family="monospace")
    # the pre-arrival
    pw, pb = tb["pre_arrive_wg"], tb["pre_arrive_bar"]
    box(
        ax,
        cx(0) - cw * 0.45,
        y_wg[pw],
        cw * 0.9,
        bh,
        "before\ntile 0",
        fc="white",
        ec=WG_EDGE[pw],
        fontsize=6.4,
    )
    arrivals = {b: [] for b in y_bar}  # the column of each arrival, in order
    arrivals[pb].append(0)
    syncs = {b: [] for b in y_bar}
    for k in range(turns):
        for w in (0, 1):
            c = 2 * k + 1 + w
            x = cx(c)
            box(
                ax,
                x - cw * 0.45,
                y_wg[w],
                cw * 0.9,
                bh,
                _turn_text(k, n_tiles),
                fc=tint(SKY if k < n_tiles else GREEN, 0.45),
                ec=WG_EDGE[w],
                fontsize=6.2,
            )
            skipped = k == n_tiles and w != tb["last_arrive_wg"]
            skip_text = f"turn {k}: no bar.arrive {tb['other_turn'][w]}"
            if tb["skips_only_at_the_end"]:  # the turns run on into the CTA's next work tile
                skip_text += "\n(after the CTA's last work tile)"
            label(
                ax,
                x + (cw * 0.45 if skipped else 0),
                y_wg[w] + (bh + 0.1 if w == 0 else -0.1 + 0.06 * skipped),
                skip_text if skipped else f"turn {k}",
                size=6.2,
                color=VERMILLION if skipped else "#555555",
                ha="right" if skipped else "center",
                va="top" if skipped and w == 1 else "center",
            )
            syncs[tb["my_turn"][w]].append(c)
            if k < n_tiles or w == tb["last_arrive_wg"]:
                arrivals[tb["other_turn"][w]].append(c)
    for b, y in y_bar.items():
        for phase, (ca, cs) in enumerate(zip(arrivals[b], syncs[b], strict=True)):
            # the arrival (from the arriving warpgroup's turn) and the sync it releases
            xa, xs = cx(ca), cx(cs)
            wa = tb["pre_arrive_wg"] if ca == 0 else (ca - 1) % 2
            ws = (cs - 1) % 2
            ya = y_wg[wa] + (bh if wa == 1 else 0)
            arrow(
                ax, xa + (0.12 if wa == 1 else 0.1), ya, xs - 0.06, y + (-0.13 if wa == 1 else 0.13), color=BLUE, lw=0.9
            )
            ys = y_wg[ws] + (0 if ws == 0 else bh)
            arrow(ax, xs, y + (0.13 if ws == 0 else -0.13), xs, ys, color=VERMILLION, lw=1.0)
            ax.add_patch(Circle((xs, y), 0.13, fc="white", ec="#333333", lw=0.8, zorder=5))
            label(ax, xs, y, str(phase), size=6.6, zorder=6)
    # the counts
    nsync = len(syncs[tb["my_turn"][0]])
    label(
        ax,
        0.1,
        0.42,
        f"Each phase (circled) completes when {tb['threads']} threads have reached it: {wg_threads} of one "
        f"warpgroup arriving (bar.arrive, blue) and {wg_threads} of the other waiting (bar.sync, red).",
        size=6.9,
        ha="left",
    )
    label(
        ax,
        0.1,
        0.18,
        f"{n_tiles} K/V tiles = {turns} turns per warpgroup ({tb['turn_sites']} places issue wgmmas: tile 0, the loop, "
        f"the last P·V). Barrier {tb['my_turn'][0]}: {nsync} waits by WG 0, 1 + {len(arrivals[pb]) - 1} "
        f"arrivals by WG {pw}; barrier {tb['my_turn'][1]}: {len(syncs[tb['my_turn'][1]])} waits by WG 1, "
        f"{len(arrivals[tb['my_turn'][1]])} arrivals by WG 0.",
        size=6.9,
        ha="left",
    )
    save(fig, path)


# ------------------------------------------------------------------------ counted from the machine code
#
# What the tables above quote, counted from `cuobjdump -sass` text (attnclimb.runtime.sass.sass of a compiled
# rung): tests/test_figures_cpu.py compiles the rungs and compares.

_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P[T0-9]+\s+)?)([A-Z0-9_]+)([^;]*);\s*/\* 0x[0-9a-f]{16} \*/")
_CONTROL = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")


def sass_instructions(text: str) -> list:
    """The instructions of ``cuobjdump -sass`` ``text`` in order: ``(address, predicate, opcode, operands,
    stall)``, where ``opcode`` is the mnemonic up to its first dot-suffix's end (``STG.E``, ``HGMMA.64x128x16...``
    as written), and ``stall`` the stall count of its control bits (bits 41-44 of its second word)."""
    lines = text.splitlines()
    out = []
    for i, ln in enumerate(lines):
        m = _INSN.match(ln)
        if not m:
            continue
        c = _CONTROL.match(lines[i + 1]) if i + 1 < len(lines) else None
        stall = (int(c[1], 16) >> 41) & 0xF if c else 0
        mnemonic = m[3] + m[4].split(" ")[0] if m[4].startswith(".") else m[3]
        out.append((int(m[1], 16), m[2].strip(), mnemonic, m[4].strip(), stall))
    return out


def _base(mnemonic: str) -> str:
    return re.match(r"[A-Z0-9_]+", mnemonic)[0]


def steady_loop(insns: list) -> list:
    """The instructions of the innermost loop around the first wait for S (``WARPGROUP.DEPBAR.LE gsb0, 0x1``):
    the shortest backward branch that jumps over it."""
    wait = next(a for a, _, op, rest, _ in insns if op == "WARPGROUP.DEPBAR.LE" and "gsb0, 0x1" in rest)
    spans = []
    for a, _, op, rest, _ in insns:
        t = re.search(r"0x([0-9a-f]+)", rest) if _base(op) == "BRA" else None
        if t and int(t[1], 16) < wait < a:
            spans.append((a - int(t[1], 16), int(t[1], 16), a))
    _, lo, hi = min(spans)
    return [i for i in insns if lo <= i[0] <= hi]


def loop_sass(text: str) -> dict:
    """LOOP_SASS's entry for a kernel: its steady loop's instructions by opcode (without suffixes), and ``total``."""
    loop = steady_loop(sass_instructions(text))
    out: dict = {}
    for i in loop:
        out[_base(i[2])] = out.get(_base(i[2]), 0) + 1
    return out | {"total": len(loop)}


def s_group_sass(text: str) -> list:
    """Per wait for S in SASS order, the instructions by opcode (without suffixes) from the WARPGROUP.ARRIVE
    before the S = Q·Kᵀ group to its last wgmma (the run of HGMMAs without ``tnspB``, P·V's V operand)."""
    insns = sass_instructions(text)
    out = []
    for w, i in enumerate(insns):
        if i[2] != "WARPGROUP.DEPBAR.LE" or "gsb0, 0x1" not in i[3]:
            continue
        last = max(k for k in range(w) if insns[k][2].startswith("HGMMA") and "tnspB" not in insns[k][3])
        first = max(k for k in range(last) if insns[k][2] == "WARPGROUP.ARRIVE")
        counts: dict = {}
        for k in range(first, last + 1):
            counts[_base(insns[k][2])] = counts.get(_base(insns[k][2]), 0) + 1
        out.append(counts)
    return out


def kernel_sass(text: str) -> dict:
    """KERNEL_SASS's entry: the kernel's R2UR and all its instructions."""
    insns = sass_instructions(text)
    return {"R2UR": sum(i[2] == "R2UR" for i in insns), "total": len(insns)}


def epilogue_sass(text: str) -> dict:
    """The kernel's memory instructions of the kinds EPILOGUE_SASS counts (every copy of the epilogue)."""
    insns = sass_instructions(text)
    kinds = ("STG.E", "STSM.16.M88.4", "LDS.128", "STG.E.128")
    return {k: sum(i[2] == k for i in insns) for k in kinds}


def softmax_path(text: str, step: int = 1) -> list:
    """The fastest path (fewest stall cycles; forward branches only) from a wait for S to the next wait for P·V
    (``WARPGROUP.DEPBAR.LE gsb0, 0x0``) in the steady loop: the ``step``-th such window of the loop (0-based;
    the last one where the loop has fewer). For the softmax that is the kept-reference path with no masked keys
    and no O rescale. Returns its instructions in order."""
    import heapq

    insns = sass_instructions(text)
    loop = steady_loop(insns)
    index = {i[0]: k for k, i in enumerate(insns)}
    starts = [index[i[0]] for i in loop if i[2] == "WARPGROUP.DEPBAR.LE" and "gsb0, 0x1" in i[3]]
    k0 = starts[min(step, len(starts) - 1)]
    dist, prev, queue = {k0: 0}, {}, [(0, k0)]
    while queue:
        d, k = heapq.heappop(queue)
        if d > dist[k]:
            continue
        a, pred, op, rest, stall = insns[k]
        if op == "WARPGROUP.DEPBAR.LE" and "gsb0, 0x0" in rest:
            path = [k]
            while path[-1] != k0:
                path.append(prev[path[-1]])
            return [insns[j] for j in reversed(path)]
        succ = []
        if _base(op) == "BRA":
            target = int(re.search(r"0x([0-9a-f]+)", rest)[1], 16)
            if target > a and target in index:  # a backward branch leaves the window: not followed
                succ.append(index[target])
            if pred or re.match(r"!?U?P[T0-9]", rest):  # conditional: it may fall through
                succ.append(k + 1)
        elif _base(op) not in ("EXIT", "RET"):
            succ.append(k + 1)
        for j in succ:
            if d + stall < dist.get(j, float("inf")):
                dist[j], prev[j] = d + stall, k
                heapq.heappush(queue, (d + stall, j))
    raise ValueError("no path from the wait for S to the wait for P·V")


def softmax_path_cycles(text: str) -> dict:
    """SOFTMAX_PATH_CYCLES's entry: the stall cycles of :func:`softmax_path` before its VOTE.ALL, before its first
    MUFU.EX2, and in all (up to the wait for P·V)."""
    out, cycles = {}, 0
    for _, _, op, _, stall in softmax_path(text)[:-1]:  # up to the issue of the wait for P·V
        if op == "VOTE.ALL":
            out.setdefault("vote", cycles)
        if op == "MUFU.EX2":
            out.setdefault("first_ex2", cycles)
        cycles += stall
    return out | {"total": cycles}


def three_warpgroup_two_p_variant():
    """Rung 13's three-consumer-warpgroup long-K/V build with P_DOUBLE_BUFFER 1 (which the kernel leaves off)."""
    import dataclasses

    r = rungs.get(13)
    return dataclasses.replace(r, **r.long_kv[1], extra_defines={**r.extra_defines, "P_DOUBLE_BUFFER": 1})


def three_warpgroup_two_p_spill() -> tuple | None:
    """THREE_WG_TWO_P_SPILL: compiles :func:`three_warpgroup_two_p_variant` (NVRTC) and returns ptxas's (spill
    stores, spill loads) in bytes; ``None`` when the compiler's log has no ptxas report to read them from."""
    from ..runtime.compiler import compile_rung, parse_ptxas_log

    found = parse_ptxas_log(compile_rung(three_warpgroup_two_p_variant(), "sm_90a").log)
    if not found:
        return None
    (res,) = found
    return res.spill_stores, res.spill_loads


# ------------------------------------------------------------------------------------------------ the list

_LONG_KV = rungs.get(16).long_kv[1]  # rung 16's three-consumer-warpgroup tiles
FIGURES = [
    (
        10,
        "grid",
        rung10_grid,
        "The persistent grid: CTA c takes work tiles c, c + gridDim.x, …; how many work tiles each CTA takes "
        "for the bench shapes.",
    ),
    (
        10,
        "handover",
        rung10_handover,
        "Two work tiles on one SM: in rung 10 the next work tile's Q and K/V load under the last P·V and the "
        "epilogue of the current one, where rung 9 starts a new CTA (a toy model of the code).",
    ),
    (
        10,
        "rows",
        rung10_rows,
        "What one store instruction of a warp writes: in rung 9 16 bytes of 8 rows (8 lines), in rung 10 two "
        "whole rows (4 full lines), after the rows were staged in shared memory.",
    ),
    (
        10,
        "count",
        rung10_count,
        "The epilogue's memory instructions per thread and the 128-byte lines its stores touch per warp, rung 9 "
        "against rung 10 (head_dim 128, SASS of NVRTC 13.0).",
    ),
    (
        11,
        "descriptors",
        rung11_descriptors,
        "The wgmma descriptor's fields, and the constant each wgmma of one K/V tile adds to the start-address "
        "field of a base built once.",
    ),
    (
        11,
        "budget",
        rung11_budget,
        "The SASS instructions of one iteration of the consumers' steady loop in rung 10 and rung 11, by the "
        "opcodes the change moves (NVRTC 13.0).",
    ),
    (
        12,
        "reference",
        rung12_reference,
        "One row's running max and its softmax reference per K/V tile: rung 11 moves the reference (and rescales "
        "O) whenever the max grows, rung 12 only when P against the kept reference would pass 2^8.",
    ),
    (
        12,
        "rescales",
        rung12_rescales,
        "The share of warps that rescale O at each K/V tile, rung 11 against rung 12, on random inputs (the "
        "float32 model of the kernels).",
    ),
    (
        12,
        "path",
        rung12_path,
        "From S to the first exponential: rung 11 reduces each row's max over the quad and recomputes its "
        "reference on every tile; rung 12's fast path tests the thread's own maxima against the kept limit.",
    ),
    (
        12,
        "fastpath",
        rung12_fastpath,
        "The share of warp-tiles that take rung 12's fast path, by seqlen_k, on random inputs (the float32 model "
        "of the kernels).",
    ),
    (
        13,
        "chain",
        rung13_chain,
        "After the softmax of K/V tile j: rung 12 packs P_j after the wait for P_{j-1}·V_{j-1}, rung 13 packs it "
        "into the other buffer under that P·V (schematic lengths).",
    ),
    (
        13,
        "budget",
        rung13_budget,
        "The registers of a consumer thread held in O, S and P: a second P buffer fits the two-warpgroup "
        f"{rungs.get(13).block_n}-key tiles, not the three-warpgroup tiles (ptxas spills there, NVRTC 13.0).",
    ),
    (
        14,
        "path",
        rung14_path,
        "Where the warpgroup's Q descriptor lives: in rung 13 in per-thread registers, moved by two R2UR before "
        "each wgmma of S; in rung 14 in uniform registers, from a warp index read through __shfl_sync.",
    ),
    (
        14,
        "sgroup",
        rung14_sgroup,
        "The SASS instructions that issue one S group in rung 13 and rung 14, by kind (NVRTC 13.0).",
    ),
    (
        15,
        "path",
        rung15_path,
        "Static issue cycles of one K/V tile's softmax on the kept-reference path, rung 14 against rung 15: the "
        "row-max loop before the exponentials against the largest P kept beside them (SASS of NVRTC 13.0).",
    ),
    (
        15,
        "samples",
        rung15_samples,
        "Measured before the re-cut on the old rung 17 (rung 14's softmax, with the staged epilogue and the turns) "
        "at 4k in Nsight Compute's source view: a consumer warp's samples per K/V tile by phase; the row-max loop "
        "and vote take a sixth, on the path from S to P.",
    ),
    (
        16,
        "schedule",
        rung16_schedule,
        "The ping-pong turns: each consumer warpgroup issues its wgmmas while the other one computes its "
        "softmax (a toy model of the kernel's order of operations).",
    ),
    (
        16,
        "barriers",
        rung16_barriers,
        "The turn protocol: the other warpgroup's bar.arrive opens each turn; warpgroup 1 arrives once before "
        "the first turn, and not after the last turn of its CTA's last work tile.",
    ),
    (
        16,
        "ring",
        rung16_ring,
        f"With three consumer warpgroups (head_dim 64, and the {_LONG_KV['block_m']} × {_LONG_KV['block_n']} tiles "
        "of long K/V) the turn goes round a ring: each warpgroup waits on its own barrier and arrives on the next "
        "one's (a toy model).",
    ),
]
