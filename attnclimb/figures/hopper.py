"""Figures of rungs 5-9: TMA and mbarriers, wgmma, warp specialization, the K/V ring, the overlap."""

from __future__ import annotations

from .. import rungs
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

CHUNK_COLOURS = [tint(c, 0.35) for c in (BLUE, ORANGE, GREEN, SKY, VERMILLION, PURPLE, YELLOW, GREY)]


def _kb(n: int) -> str:
    return f"{n // 1024} KB" if n % 1024 == 0 else f"{n} B"


def _fmt(n: int) -> str:
    return f"{n:,}".replace(",", " ")


# ------------------------------------------------------------------------------------------------ rung 5


def rung05_swizzle128(path):
    r = rungs.get(5)
    row_bytes, kv_panel, kv_tile = facts.need(5, "ROW_BYTES", "KV_PANEL", "KV_TILE_BYTES")
    bn = r.block_n
    chunks = row_bytes // 16
    fig, ax = new_figure(9.6, 4.3)
    title(ax, 0.1, 4.25, f"Rung 5: a {bn}-key K tile as TMA writes it, two 128-B-swizzled panels")
    # left: the tile as panels of atoms
    x0, y0, pw, ph = 0.5, 0.55, 1.35, 3.0
    atoms = bn // 8
    for p in range(2):
        px = x0 + p * (pw + 0.25)
        for a in range(atoms):
            ay = y0 + ph - (a + 1) * ph / atoms
            rect(ax, px, ay, pw, ph / atoms, fc=tint(ROLE["K"], 0.35 if a else 0.0), ec="white", lw=0.7)
        label(ax, px + pw / 2, y0 + ph + 0.3, f"panel {p}: cols {64 * p}-{64 * p + 63}", size=7.5, weight="bold")
        label(ax, px + pw / 2, y0 + ph + 0.1, f"{bn} rows × {row_bytes} B = {_kb(kv_panel)}", size=7)
    label(
        ax,
        x0 + pw + 0.12,
        y0 - 0.2,
        f"K tile = 2 boxes of 64 columns × {r.kv_box_rows} rows = {_kb(kv_tile)}; "
        f"{atoms} atoms of 8 rows × 128 B = 1024 B per panel",
        size=7,
        ha="left",
    )
    arrow(ax, x0 + pw, y0 + ph - ph / atoms / 2, 4.0, 2.6, color=VERMILLION, lw=1.0)
    label(ax, x0 + pw / 2, y0 + ph - ph / atoms / 2, "atom 0", size=7, color="white", weight="bold")
    # right: one 1024-B atom, 8 rows x 8 chunks
    cx, cy, cell = 4.2, 0.75, 0.32
    for row in range(8):
        for c in range(chunks):
            pchunk = c ^ (row % 8)
            x, y = cx + pchunk * cell, cy + (7 - row) * cell
            rect(ax, x, y, cell, cell, fc=CHUNK_COLOURS[c], ec="white", lw=0.6)
            label(ax, x + cell / 2, y + cell / 2, str(c), size=7)
        label(ax, cx - 0.08, cy + (7.5 - row) * cell, f"r={row}", size=6.5, ha="right")
    for pc in range(chunks):
        label(ax, cx + (pc + 0.5) * cell, cy - 0.14, f"{16 * pc}", size=6, color="#555555")
    label(ax, cx - 0.08, cy - 0.14, "byte", size=6, ha="right", color="#555555")
    label(
        ax,
        cx + chunks * cell / 2,
        cy + 8 * cell + 0.15,
        "one 1024-B atom: logical chunk c of row r at c ^ (r % 8)",
        size=7.5,
        weight="bold",
    )
    label(
        ax,
        cx + chunks * cell + 0.25,
        cy + 8 * cell,
        "address bits [4,7) ^= bits [7,10)\n\n"
        "applied by the TMA unit when it\nwrites the box, and by the tensor\ncores when wgmma reads it (rung 6)\n\n"
        "hence every panel starts on a\n1024-B boundary (align_1024,\n+1 KB slack in rungs.py)\n\n"
        "rung 5's ldmatrix addresses:\n(base ^ 2·(col0 % 64))\n + (col0 / 64)·panel + 128·row0",
        size=7,
        ha="left",
        va="top",
    )
    save(fig, path)


def rung05_mbarrier(path):
    r = rungs.get(5)
    stages = r.stages
    kv_tile = facts.need(5, "KV_TILE_BYTES")
    nbox = 2 * r.block_n // r.kv_box_rows  # two 64-column panels of block_n / kv_box_rows boxes each
    ntiles = 3 * stages
    fig, ax = new_figure(9.6, 4.5)
    title(
        ax,
        0.1,
        4.45,
        f"Rung 5: one mbarrier per ring slot and operand; tile nb completes phase nb / {stages} of slot nb % {stages}",
    )
    # top: one phase of bar_k[s]
    steps = [
        ("init: count 1", "pending: 1 arrival, 0 B", "white"),
        ("thread 0:\narrive.expect_tx", f"pending: 0 arrivals,\n{_fmt(kv_tile)} B", tint(BLUE, 0.6)),
        (f"TMA box 1 of {nbox} lands\ncomplete_tx", f"pending: {_fmt(kv_tile - kv_tile // nbox)} B", tint(ORANGE, 0.5)),
        (f"TMA box {nbox} of {nbox} lands\ncomplete_tx", "pending: 0 B\n→ phase completes", tint(ORANGE, 0.5)),
        ("waiters on\ntry_wait.parity(p)", "return: K tile\nis in smem", tint(GREEN, 0.5)),
    ]
    for i, (head, body, colour) in enumerate(steps):
        x = 0.3 + i * 1.9
        box(ax, x, 3.0, 1.6, 0.62, head, fc=colour, fontsize=7.2)
        label(ax, x + 0.8, 2.72, body, size=6.8, color="#333333")
        if i:
            arrow(ax, x - 0.28, 3.31, x - 0.02, 3.31)
    # bottom: tiles -> slot, phase, parity
    x0, y0, w = 1.6, 0.5, (9.3 - 1.6) / ntiles
    for s in range(stages):
        y = y0 + (stages - 1 - s) * 0.62
        label(ax, x0 - 0.1, y + 0.25, f"bar_k[{s}], bar_v[{s}]", size=7.5, ha="right", family="monospace")
        for nb in range(ntiles):
            if nb % stages != s:
                continue
            phase = nb // stages
            box(
                ax,
                x0 + nb * w + 0.03,
                y,
                w - 0.06,
                0.5,
                f"tile {nb}: phase {phase}\nparity {phase % 2}",
                fc=tint(SKY if phase % 2 == 0 else ORANGE, 0.45),
                fontsize=6.8,
            )
    label(
        ax,
        x0,
        y0 + stages * 0.62 + 0.15,
        "the consumer of tile nb waits with ring.phase, which PipelineState flips after the last slot",
        size=7.2,
        ha="left",
        color="#444444",
    )
    label(
        ax,
        x0,
        y0 - 0.2,
        "K and V of a tile have separate barriers, so S = Q·Kᵀ starts before V has landed; "
        "__syncthreads() at the top of each tile still guards slot reuse",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 6


def rung06_warpgroups(path):
    r5, r6 = rungs.get(5), rungs.get(6)
    m_tiles, s5, o5, kv5 = facts.need(5, "M_TILES", "S_TILES", "O_TILES", "KV_STEPS")
    d5 = facts.need(5, "D_STEPS")
    wg_rows, warp_rows, kv6 = facts.need(6, "WARPGROUP_ROWS", "WARP_ROWS", "KV_STEPS")
    hd = rungs.HEAD_DIM
    d6 = hd // 16
    mma = m_tiles * s5 * d5 + m_tiles * o5 * kv5
    ldsm = m_tiles * d5 + d5 * s5 // 2 + kv5 * o5 // 2
    fig, ax = new_figure(9.6, 4.3)
    title(
        ax,
        0.1,
        4.25,
        f"Rung 6: the {r6.block_m}-row tile is {r6.block_m // wg_rows} warpgroups of "
        f"{wg_rows} rows; one wgmma covers a warpgroup's rows",
    )
    u = 2.9 / r6.block_m
    colours = [tint(c, 0.45) for c in (BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION, YELLOW, GREY)]
    # rung 5 split
    for name, x0, nwarps, rows_per_warp in (
        (
            f"rung 5: {r5.threads // 32} warps × {rungs.get(5).block_m // (r5.threads // 32)} rows",
            0.4,
            r5.threads // 32,
            r5.block_m // (r5.threads // 32),
        ),
        (f"rung 6: {r6.threads // 32} warps × {warp_rows} rows", 3.3, r6.threads // 32, warp_rows),
    ):
        for w in range(nwarps):
            y = 0.6 + (nwarps - 1 - w) * rows_per_warp * u
            rect(ax, x0, y, 1.0, rows_per_warp * u, fc=colours[w % 8], ec="white", lw=0.8)
            label(ax, x0 + 0.5, y + rows_per_warp * u / 2, f"warp {w}", size=6.5)
        label(ax, x0 + 0.5, 0.6 + r6.block_m * u + 0.15, name, size=7.5, weight="bold")
    for g in range(r6.block_m // wg_rows):
        y = 0.6 + (r6.block_m // wg_rows - 1 - g) * wg_rows * u
        rect(ax, 4.35, y + 0.03, 0.12, wg_rows * u - 0.06, fc="#333333", ec="none")
        label(
            ax,
            4.55,
            y + wg_rows * u / 2,
            f"warpgroup {g}\nrows {g * wg_rows}-{(g + 1) * wg_rows - 1}",
            size=7,
            ha="left",
        )
    label(
        ax,
        1.55,
        0.6 + r6.block_m * u / 2,
        f"per warp and tile:\n{ldsm} ldmatrix\n{mma} mma.sync\nm16n8k16",
        size=7,
        ha="left",
    )
    label(
        ax,
        6.0,
        3.6,
        f"per warpgroup and {r6.block_n}-key tile:\n\n"
        f"S = Q·Kᵀ   {d6} × wgmma.m64n{r6.block_n}k16\n"
        f"           (head_dim {hd} = {d6} k16 steps)\n"
        f"           A = Q, B = K: both from smem\n\n"
        f"O += P·V   {kv6} × wgmma.m64n{hd}k16\n"
        f"           ({r6.block_n} keys = {kv6} k16 steps)\n"
        f"           A = P from registers, B = V smem\n\n"
        f"= {d6 + kv6} wgmma, 0 ldmatrix",
        size=7.2,
        ha="left",
        va="top",
        family="monospace",
    )
    save(fig, path)


def rung06_operands(path):
    r = rungs.get(6)
    bn, hd = r.block_n, rungs.HEAD_DIM
    fig, ax = new_figure(9.6, 3.9)
    title(ax, 0.1, 3.85, "Rung 6: SS and RS operands: who reads shared memory, who reads registers")
    # shared memory column
    box(ax, 0.3, 0.45, 2.2, 2.85, "", fc=tint(GREY, 0.8), ec=GREY)
    label(ax, 1.4, 3.12, "shared memory", size=8, weight="bold")
    box(ax, 0.5, 2.3, 1.8, 0.55, "Q tile, 2 panels\n(K-major)", fc=tint(ROLE["Q"], 0.5), fontsize=7.2)
    box(ax, 0.5, 1.5, 1.8, 0.55, f"K slot, {bn} keys\n(K-major)", fc=tint(ROLE["K"], 0.45), fontsize=7.2)
    box(ax, 0.5, 0.65, 1.8, 0.55, f"V slot, {bn} keys\n(MN-major)", fc=tint(ROLE["V"], 0.5), fontsize=7.2)
    # tensor core
    box(ax, 4.0, 1.95, 1.7, 0.9, f"wgmma SS\nm64n{bn}k16", fc=tint(ORANGE, 0.6), fontsize=7.5)
    box(ax, 4.0, 0.55, 1.7, 0.9, f"wgmma RS\nm64n{hd}k16, tnspB", fc=tint(GREEN, 0.6), fontsize=7.5)
    arrow(ax, 2.3, 2.55, 4.0, 2.55, color=BLUE)
    label(ax, 3.15, 2.68, "desc(Q)", size=7, family="monospace")
    arrow(ax, 2.3, 1.78, 4.0, 2.2, color=ORANGE)
    label(ax, 3.15, 2.12, "desc(K)", size=7, family="monospace")
    arrow(ax, 2.3, 0.92, 4.0, 0.92, color=GREEN)
    label(ax, 3.15, 1.05, "desc(V)", size=7, family="monospace")
    # registers
    box(ax, 7.0, 0.45, 2.3, 2.85, "", fc=tint(PURPLE, 0.85), ec=PURPLE)
    label(ax, 8.15, 3.12, "registers (per warpgroup)", size=8, weight="bold")
    box(ax, 7.2, 2.2, 1.9, 0.6, f"S accumulators\n64 × {bn} fp32", fc=tint(SKY, 0.4), fontsize=7.2)
    box(ax, 7.2, 1.35, 1.9, 0.55, "P: bf16 A fragments\n(pack_p_fragment)", fc=tint(SKY, 0.6), fontsize=7.2)
    box(ax, 7.2, 0.6, 1.9, 0.5, f"O accumulators\n64 × {hd} fp32", fc=tint(ROLE["O"], 0.4), fontsize=7.2)
    arrow(ax, 5.7, 2.4, 7.2, 2.5)
    arrow(ax, 8.15, 2.2, 8.15, 1.9)
    label(ax, 8.25, 2.05, "softmax, pack", size=6.5, ha="left")
    arrow(ax, 7.2, 1.55, 5.7, 1.2, color=SKY)
    label(ax, 6.45, 1.55, "A = P", size=7, family="monospace")
    arrow(ax, 5.7, 0.8, 7.2, 0.85)
    label(
        ax,
        0.3,
        0.15,
        "SS: both operands through 64-bit descriptors, no ldmatrix; RS: A from registers, so P "
        "never goes to shared memory. wgmma.fence / commit_group / wait_group order them.",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


def rung06_descriptor(path):
    f = facts.descriptor_fields()
    kv_panel = facts.need(6, "KV_PANEL")
    fig, ax = new_figure(9.6, 3.4)
    title(ax, 0.1, 3.35, "Rung 6: the 64-bit wgmma shared-memory descriptor (hopper.cuh make_smem_desc_sw128)")
    bit = 9.0 / 64
    x0 = 0.3
    fields = [
        (0, 14, "start address >> 4", tint(BLUE, 0.5)),
        (f["lbo_shift"], 14, "LBO >> 4", tint(ORANGE, 0.45)),
        (f["sbo_shift"], 14, "SBO >> 4", tint(GREEN, 0.5)),
        (49, 3, "base\noffset", tint(GREY, 0.6)),
        (f["swizzle_shift"], 2, "swizzle", tint(VERMILLION, 0.45)),
    ]
    y = 2.2
    rect(ax, x0, y, 64 * bit, 0.55, fc="white", ec="#333333", lw=0.8)
    for lo, width, name, colour in fields:
        # bit 0 on the right, as in the PTX ISA
        x = x0 + (64 - lo - width) * bit
        rect(ax, x, y, width * bit, 0.55, fc=colour, ec="#333333", lw=0.6, zorder=3)
        if width >= 3:
            label(ax, x + width * bit / 2, y + 0.275, name, size=6.8, zorder=4)
        else:  # too narrow: name it below the bar
            label(ax, x + width * bit / 2, y - 0.15, name, size=6.8)
        label(ax, x + width * bit / 2, y + 0.68, f"{lo + width - 1}..{lo}", size=6.2, color="#555555")
    rows = [
        (
            "K-major (Q and K in S = Q·Kᵀ)",
            f"LBO = {f['kmajor_lbo']} B (encoded 1; unused when swizzled)",
            f"SBO = {f['kmajor_sbo']} B: next 8 rows",
            "k16 step d: start + 32·(d % 4) B, panel d / 4",
        ),
        (
            "MN-major (V in O += P·V, tnspB = 1)",
            f"LBO = {kv_panel} B: next 64-column panel",
            f"SBO = {f['mnmajor_sbo']} B: next 8 keys",
            "k16 step kv: start + 16 keys × 128 B",
        ),
    ]
    for i, (name, lbo, sbo, step) in enumerate(rows):
        yy = 1.55 - i * 0.62
        label(ax, x0, yy, name, size=7.8, ha="left", weight="bold")
        label(
            ax,
            x0 + 0.15,
            yy - 0.24,
            f"{lbo};  {sbo};  swizzle mode 1 = 128 B;  base offset 0 (1024-B aligned);  {step}",
            size=7,
            ha="left",
        )
    label(
        ax,
        x0,
        0.12,
        "The TMA boxes of rung 5 already are the canonical 128-B-swizzle layout, so the "
        "descriptors point straight into them.",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 7


def rung07_roles(path):
    r = rungs.get(7)
    pw, cw, preg, creg, wg_rows = facts.need(
        7, "PRODUCER_WARPS", "CONSUMER_WARPS", "PRODUCER_REGS", "CONSUMER_REGS", "WARPGROUP_ROWS"
    )
    stages = r.stages
    fig, ax = new_figure(9.6, 4.4)
    title(ax, 0.1, 4.35, f"Rung 7: warpgroup 0 loads, warpgroups 1-{cw // 4} compute; they meet only at mbarriers")
    # producer
    box(ax, 0.3, 2.75, 2.5, 1.1, "", fc=tint(BLUE, 0.75))
    label(ax, 1.55, 3.6, f"WG 0: producer (warps 0-{pw - 1})", size=8, weight="bold")
    label(
        ax,
        1.55,
        3.15,
        f"setmaxnreg.dec {preg}\nthread 0 issues every TMA load;\nthe other {pw * 32 - 1} threads exit",
        size=7,
    )
    # ring
    sx = 3.5
    for s in range(stages):
        y = 3.1 - s * 0.75
        box(ax, sx, y, 2.4, 0.55, "", fc=tint(GREY, 0.8), ec=GREY)
        box(ax, sx + 0.1, y + 0.08, 1.05, 0.39, f"K slot {s}", fc=tint(ROLE["K"], 0.45), fontsize=7)
        box(ax, sx + 1.25, y + 0.08, 1.05, 0.39, f"V slot {s}", fc=tint(ROLE["V"], 0.5), fontsize=7)
    label(ax, sx + 1.2, 3.85, f"shared memory: {stages}-slot K/V ring (+ Q)", size=7.5, weight="bold")
    # consumers
    for i in range(cw // 4):
        y = 2.75 - i * 1.45
        box(ax, 6.6, y, 2.7, 1.1, "", fc=tint(ORANGE, 0.7))
        label(
            ax,
            7.95,
            y + 0.85,
            f"WG {i + 1}: consumer, rows {i * wg_rows}-{(i + 1) * wg_rows - 1}",
            size=8,
            weight="bold",
        )
        label(ax, 7.95, y + 0.4, f"setmaxnreg.inc {creg}\nS wgmma, softmax, P·V wgmma", size=7)
    # barriers
    arrow(ax, 2.8, 3.3, 3.5, 3.3, color=BLUE, lw=1.3)
    label(ax, 3.15, 3.5, "TMA", size=7, color=BLUE)
    arrow(ax, 5.9, 3.2, 6.6, 3.2, color=GREEN, lw=1.3)
    arrow(ax, 5.9, 2.9, 6.6, 1.9, color=GREEN, lw=1.3)
    label(ax, 6.25, 2.75, "full_k / full_v:\n1 arrival\n+ tx bytes", size=6.8, color="#00704F")
    arrow(ax, 6.6, 2.85, 2.2, 2.75, color=VERMILLION, lw=1.3, rad=-0.35)
    arrow(ax, 6.6, 1.5, 1.2, 2.75, color=VERMILLION, lw=1.3, rad=-0.3)
    label(
        ax,
        4.2,
        0.95,
        f"empty[slot]: {cw} arrivals (one per consumer warp, after its wgmmas\n"
        "on the slot completed); the producer waits on it before refilling",
        size=6.8,
        color=VERMILLION,
    )
    label(
        ax,
        0.3,
        0.2,
        "No __syncthreads() after the prologue: the producer runs up to NUM_STAGES tiles ahead, the "
        "two consumers drift freely against each other.",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


def rung07_registers(path):
    import matplotlib.pyplot as plt

    r = rungs.get(7)
    pw, cw, preg, creg = facts.need(7, "PRODUCER_WARPS", "CONSUMER_WARPS", "PRODUCER_REGS", "CONSUMER_REGS")
    file_regs = 65536
    launch = facts.registers_at_launch(r.threads, file_regs)
    pt = pw * 32
    fig, ax = plt.subplots(figsize=(8.4, 2.6))
    bars = [
        (
            "at launch\n__launch_bounds__(" + f"{r.threads}, 1)",
            [(f"WG 0: {pt}×{launch}", pt * launch, BLUE)]
            + [(f"WG {i + 1}: 128×{launch}", 128 * launch, ORANGE) for i in range(cw // 4)],
        ),
        (
            "after setmaxnreg",
            [(f"WG 0: {pt}×{preg}", pt * preg, BLUE)]
            + [(f"WG {i + 1}: 128×{creg}", 128 * creg, ORANGE) for i in range(cw // 4)],
        ),
    ]
    for yi, (_, parts) in enumerate(bars):
        left = 0
        for i, (text, n, colour) in enumerate(parts):
            ax.barh(yi, n, left=left, color=tint(colour, 0.2 + 0.25 * (i % 2)), edgecolor="white", height=0.6)
            narrow = n < 0.12 * file_regs  # the producer after setmaxnreg: label it above its bar
            ax.text(
                left + n / 2 if not narrow else left,
                yi - (0.42 if narrow else 0),
                f"{text}\n= {_fmt(n)}",
                ha="center" if not narrow else "left",
                va="center" if not narrow else "bottom",
                fontsize=7,
            )
            left += n
        ax.text(left + 500, yi, f"{_fmt(left)} of {_fmt(file_regs)}", va="center", fontsize=7.5)
    ax.set_yticks([0, 1], [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(file_regs, color=VERMILLION, lw=1, ls="--")
    ax.set_xlim(0, file_regs * 1.18)
    ax.set_xlabel("registers of the SM's register file held by the CTA")
    ax.set_title(
        f"Rung 7: setmaxnreg moves registers from the producer ({preg}/thread) to the consumers ({creg}/thread)",
        loc="left",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 8


def rung08_ring(path):
    r = rungs.get(8)
    stages, bn, bm = r.stages, r.block_n, r.block_m
    q_panel, kv_tile, cw = facts.need(8, "Q_PANEL", "KV_TILE_BYTES", "CONSUMER_WARPS")
    total = r.smem_bytes
    fig, ax = new_figure(9.6, 4.0)
    title(
        ax,
        0.1,
        3.95,
        f"Rung 8: {_fmt(total)} B of dynamic shared memory, a {stages}-slot ring of {bn}-key K and "
        "V tiles, four barriers per slot",
    )
    x0, width, y = 0.3, 9.0, 2.7
    parts = [("slack", 1024, tint(GREY, 0.6)), (f"Q {bm} rows", 2 * q_panel, tint(ROLE["Q"], 0.45))]
    parts += [(f"K slot {s}", kv_tile, tint(ROLE["K"], 0.45)) for s in range(stages)]
    parts += [(f"V slot {s}", kv_tile, tint(ROLE["V"], 0.5)) for s in range(stages)]
    x = x0
    for name, n, colour in parts:
        w = width * n / total
        box(ax, x, y, w, 0.5, name if w > 0.5 else "", fc=colour, rounded=False, fontsize=7.2)
        label(ax, x + w / 2, y - 0.15, _kb(n) if n >= 2048 else "1 KB", size=6.5, color="#555555")
        x += w
    label(
        ax,
        x0,
        y + 0.68,
        "dynamic shared memory (rungs.tma_smem_bytes): 1 KB alignment slack + Q + NUM_STAGES × (K tile + V tile)",
        size=7.5,
        ha="left",
    )
    # barriers per slot
    rows = [
        ("full_k[s], full_v[s]", "count 1: the producer's arrive.expect_tx + the TMA bytes", "producer → consumers"),
        ("empty_k[s]", f"count {cw}: each consumer warp, once its S wgmmas completed", "consumers → producer"),
        ("empty_v[s]", f"count {cw}: each consumer warp, once its P·V wgmmas completed", "consumers → producer"),
    ]
    for i, (name, what, direction) in enumerate(rows):
        yy = 1.75 - i * 0.45
        box(
            ax,
            x0,
            yy - 0.17,
            1.9,
            0.34,
            name,
            fc=tint(SKY if i == 0 else VERMILLION, 0.6),
            family="monospace",
            fontsize=7.2,
        )
        label(ax, x0 + 2.05, yy, what, size=7.2, ha="left")
        label(ax, 8.0, yy, direction, size=7.2, ha="left", color="#444444")
    label(
        ax,
        x0,
        0.2,
        "tile nb uses slot nb % NUM_STAGES; the producer waits for empty_k / empty_v of the tile "
        "NUM_STAGES before it (parity prev_phase()).",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


def _lane(ax, x0, y, spans, unit, height=0.34, font=6.8):
    """Boxes along a time line: spans = [(start, length, text, colour), ...] in schematic time units."""
    for start, length, text, colour in spans:
        box(
            ax,
            x0 + start * unit,
            y,
            length * unit - 0.02,
            height,
            text,
            fc=colour,
            fontsize=font,
            rounded=False,
            ec="#555555",
            lw=0.6,
        )


def rung08_timeline(path):
    stages = rungs.get(8).stages
    unit = 0.3
    S, SM, PV = 2, 3, 3  # schematic lengths: not measured (see the trace command for measured timelines)
    it = S + SM + PV
    fig, ax = new_figure(9.6, 4.4)
    title(ax, 0.1, 4.35, f"Rung 8 vs rung 7: when a ring slot is handed back ({stages} slots; schematic, not measured)")
    x0 = 1.8
    ntiles = 3
    for name, y, split in (("rung 7", 3.0, False), ("rung 8", 1.1, True)):
        label(ax, 0.1, y + 0.75, name, size=8.5, weight="bold", ha="left")
        label(ax, x0 - 0.1, y + 0.17, "consumer WG", size=7.2, ha="right")
        label(ax, x0 - 0.1, y + 0.87, "producer", size=7.2, ha="right")
        spans, loads = [], []
        for nb in range(ntiles):
            t = nb * it
            spans += [
                (t, S, f"S {nb}", PHASE_COLOURS["S"]),
                (t + S, SM, f"softmax {nb}", PHASE_COLOURS["softmax"]),
                (t + S + SM, PV, f"P·V {nb}", PHASE_COLOURS["PV"]),
            ]
            nxt = nb + stages
            if split:
                loads += [
                    (t + S, 2, f"K {nxt} → slot {nxt % stages}", tint(ROLE["K"], 0.45)),
                    (t + it, 2, f"V {nxt} → slot {nxt % stages}", tint(ROLE["V"], 0.5)),
                ]
                arrow(ax, x0 + (t + S) * unit, y + 0.36, x0 + (t + S) * unit, y + 0.68, color=VERMILLION)
                arrow(ax, x0 + (t + it) * unit, y + 0.36, x0 + (t + it) * unit, y + 0.68, color=VERMILLION)
            else:
                loads += [(t + it, 3, f"K, V {nxt} → slot {nxt % stages}", tint(GREY, 0.5))]
                arrow(ax, x0 + (t + it) * unit, y + 0.36, x0 + (t + it) * unit, y + 0.68, color=VERMILLION)
        _lane(ax, x0, y, spans, unit)
        _lane(ax, x0, y + 0.7, [sp for sp in loads if sp[0] < ntiles * it], unit)
    label(ax, x0, 2.55, "one empty barrier per slot: the refill waits for P·V", size=7, ha="left", color=VERMILLION)
    label(
        ax,
        x0,
        0.65,
        "empty_k after S, empty_v after P·V: the K half is refilled during the softmax and P·V",
        size=7,
        ha="left",
        color=VERMILLION,
    )
    label(
        ax,
        0.1,
        0.25,
        "red arrows: a consumer warp's mbarrier.arrive on an empty barrier (all 8 consumer warps "
        "must arrive); the lengths of the boxes are illustrative only.",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 9


def rung09_schedule(path):
    unit = 0.3
    S, SM, PV, RS = 2, 4, 3, 1.7  # schematic lengths, not measured
    fig, ax = new_figure(9.6, 4.2)
    title(
        ax,
        0.1,
        4.15,
        "Rung 9: one consumer warpgroup's schedule; P·V of the previous tile runs under the softmax (schematic)",
    )
    x0 = 2.0
    # rung 8
    y8 = 2.65
    label(ax, 0.1, y8 + 0.95, "rung 8", size=8.5, weight="bold", ha="left")
    label(ax, x0 - 0.1, y8 + 0.55, "warps", size=7.2, ha="right")
    label(ax, x0 - 0.1, y8 + 0.1, "tensor cores", size=7.2, ha="right")
    t, warp, tc = 0, [], []
    for j in range(2):
        warp += [
            (t, S, f"wait S{j}", PHASE_COLOURS["wait"]),
            (t + S, SM, f"softmax {j}", PHASE_COLOURS["softmax"]),
            (t + S + SM, PV, f"wait P·V{j}", PHASE_COLOURS["wait"]),
        ]
        tc += [(t, S, f"S{j}", PHASE_COLOURS["S"]), (t + S + SM, PV, f"P{j}·V{j}", PHASE_COLOURS["PV"])]
        t += S + SM + PV
    _lane(ax, x0, y8 + 0.38, warp, unit)
    _lane(ax, x0, y8 - 0.07, tc, unit)
    # rung 9
    y9 = 0.75
    label(ax, 0.1, y9 + 1.15, "rung 9", size=8.5, weight="bold", ha="left")
    label(ax, x0 - 0.1, y9 + 0.55, "warps", size=7.2, ha="right")
    label(ax, x0 - 0.1, y9 + 0.1, "tensor cores", size=7.2, ha="right")
    t, warp, tc = 0, [], []
    for j in (1, 2, 3):
        warp += [
            (t, S, f"wait S{j}", PHASE_COLOURS["wait"]),
            (t + S, SM, f"softmax {j}", PHASE_COLOURS["softmax"]),
            (t + S + SM, RS, "O *= α,\npack P", tint(PURPLE, 0.5)),
        ]
        tc += [(t, S, f"S{j}", PHASE_COLOURS["S"]), (t + S, PV, f"P{j - 1}·V{j - 1}", PHASE_COLOURS["PV"])]
        ax.plot([x0 + (t + S) * unit] * 2, [y9 - 0.12, y9 + 0.85], color=VERMILLION, lw=1, ls="--")
        ax.plot([x0 + (t + S + SM) * unit] * 2, [y9 - 0.12, y9 + 0.85], color=BLUE, lw=1, ls=":")
        t += S + SM + RS
    _lane(ax, x0, y9 + 0.38, warp, unit)
    _lane(ax, x0, y9 - 0.07, tc, unit)
    label(ax, x0 + S * unit, y9 + 0.98, "wait_group 1", size=6.8, color=VERMILLION)
    label(ax, x0 + (S + SM) * unit, y9 + 0.98, "wait_group 0", size=6.8, color=BLUE)
    label(
        ax,
        0.1,
        0.2,
        "each iteration j: issue S_j, issue P_(j−1)·V_(j−1), wait_group 1 (S_j done, groups retire in "
        "order),\nsoftmax_j, wait_group 0, O *= α_j, pack P_j. Tile 0 is peeled; the last P·V follows the loop.",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


def rung09_registers(path):
    import matplotlib.pyplot as plt

    s_tiles, kv_steps, o_tiles, creg = facts.need(9, "S_TILES", "KV_STEPS", "O_TILES", "CONSUMER_REGS")
    phases = ["issue S_j,\nP_(j−1)·V_(j−1)", "wait_group 1", "softmax_j", "wait_group 0", "O *= α_j,\npack P_j"]
    live = [  # the register arrays of a consumer thread (09_softmax_overlap.cu)
        f"o_acc: O, {o_tiles * 4} fp32",
        f"s: S_j → P_j, {s_tiles * 4} fp32",
        f"p_frag: P_(j−1), {kv_steps * 4} × bf16x2",
    ]
    owner = {  # who reads or writes them in each phase of an iteration
        0: ["wgmma (P·V)", "wgmma (S)", "wgmma (A of P·V)"],
        1: ["wgmma (P·V)", "warps", "wgmma (A of P·V)"],
        2: ["wgmma (P·V)", "warps", "wgmma (A of P·V)"],
        3: ["warps", "warps", "free"],
        4: ["warps", "warps", "warps: P_j"],
    }
    fig, ax = plt.subplots(figsize=(8.4, 2.8))
    colours = {"wgmma": tint(GREEN, 0.3), "warps": tint(YELLOW, 0.3), "free": "white"}
    for yi in range(len(live)):
        for xi in range(len(phases)):
            who = owner[xi][yi]
            key = who.split(" ")[0].rstrip(":")
            ax.barh(yi, 1, left=xi, color=colours.get(key, "white"), edgecolor="#555555", height=0.6, lw=0.6)
            ax.text(xi + 0.5, yi, who, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(live)), live, fontsize=7.5)
    ax.set_xticks([i + 0.5 for i in range(len(phases))], phases, fontsize=7.2)
    ax.set_xlim(0, len(phases))
    ax.invert_yaxis()
    ax.tick_params(length=0)
    total = (o_tiles + s_tiles + kv_steps) * 4
    ax.set_title(
        f"Rung 9: registers per consumer thread across one iteration ({total} in these arrays, budget {creg})",
        loc="left",
    )
    legend_items = [
        ("in use by the wgmmas in flight", colours["wgmma"]),
        ("read/written by the warps", colours["warps"]),
    ]
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c, ec="#555555") for _, c in legend_items]
    ax.legend(handles, [t for t, _ in legend_items], loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2)
    save(fig, path)


FIGURES = [
    (
        5,
        "swizzle128",
        rung05_swizzle128,
        "A K tile in shared memory as the TMA unit writes it: two panels of 1024-B atoms, 128-B swizzle.",
    ),
    (
        5,
        "mbarrier",
        rung05_mbarrier,
        "One phase of a slot's mbarrier (arrivals and transaction bytes), and which tile completes which phase.",
    ),
    (6, "warpgroups", rung06_warpgroups, "Rung 5's warps against rung 6's warpgroups, and the wgmmas of one tile."),
    (
        6,
        "operands",
        rung06_operands,
        "S = Q·Kᵀ with both operands in shared memory (SS); O += P·V with P from registers (RS).",
    ),
    (
        6,
        "descriptor",
        rung06_descriptor,
        "The fields of the wgmma matrix descriptor and their values for K-major and MN-major tiles.",
    ),
    (7, "roles", rung07_roles, "Producer and consumer warpgroups and the full/empty barriers between them."),
    (7, "registers", rung07_registers, "The register file before and after setmaxnreg."),
    (8, "ring", rung08_ring, "Rung 8's shared memory and the four barriers of each ring slot."),
    (
        8,
        "timeline",
        rung08_timeline,
        "When a slot is refilled: after P·V in rung 7; K after S and V after P·V in rung 8.",
    ),
    (
        9,
        "schedule",
        rung09_schedule,
        "One consumer warpgroup in rung 8 and rung 9: the previous tile's P·V runs under this tile's softmax.",
    ),
    (
        9,
        "registers",
        rung09_registers,
        "The accumulator and fragment registers of a consumer thread over one rung-9 iteration.",
    ),
]
