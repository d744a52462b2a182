"""Figures of rungs 0-4: the CUDA-core rungs and the mma.sync rungs before Hopper's own units."""

from __future__ import annotations

import numpy as np

from .. import rungs
from . import facts
from .style import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    ROLE,
    SKY,
    VERMILLION,
    YELLOW,
    arrow,
    box,
    label,
    legend_patches,
    new_figure,
    rect,
    save,
    tint,
    title,
)

# The four registers of a fragment (c0..c3 / a0..a3), one colour each.
REG_COLOURS = [tint(SKY, 0.35), tint(ORANGE, 0.35), tint(GREEN, 0.45), tint(PURPLE, 0.35)]
# Lanes t = 0..3 of a quad.
QUAD_COLOURS = [tint(BLUE, 0.45), tint(ORANGE, 0.35), tint(GREEN, 0.45), tint(PURPLE, 0.35)]


def _kib(n: int) -> str:
    return f"{n // 1024} KB" if n % 1024 == 0 else f"{n / 1024:.1f} KB"


# ------------------------------------------------------------------------------------------------ rung 0


def rung00_dataflow(path):
    r = rungs.get(0)
    fig, ax = new_figure(9.2, 4.0)
    title(ax, 0.1, 3.95, "Rung 0: three kernels that talk through a score matrix in HBM")
    # HBM band
    box(ax, 0.1, 0.15, 9.0, 1.25, "", fc=tint(GREY, 0.8), ec=GREY, lw=0.8)
    label(ax, 0.25, 1.25, "HBM", ha="left", size=9, weight="bold", color="#555555")
    box(ax, 0.3, 0.35, 0.55, 0.7, "Q", fc=tint(ROLE["Q"], 0.55), weight="bold")
    box(ax, 0.95, 0.35, 0.55, 0.7, "K", fc=tint(ROLE["K"], 0.45), weight="bold")
    box(
        ax,
        2.2,
        0.3,
        3.6,
        0.85,
        "S, then P (in place): fp32 workspace\n4·B·H·Sq·Sk bytes",
        fc=tint(SKY, 0.5),
        ec=VERMILLION,
        lw=1.6,
    )
    box(ax, 6.9, 0.35, 0.55, 0.7, "V", fc=tint(ROLE["V"], 0.5), weight="bold")
    box(ax, 8.35, 0.35, 0.55, 0.7, "O", fc=tint(ROLE["O"], 0.45), weight="bold")
    # kernels
    bm, bn, hd = r.block_m, r.block_n, rungs.HEAD_DIM
    kernels = [
        (0.3, "1  qk_scores", f"S = scale·Q·Kᵀ\none CTA per {bm}×{bn} tile of S\ngrid: B·H·⌈Sq/{bm}⌉·⌈Sk/{bn}⌉"),
        (3.25, "2  row_softmax", "max, Σexp, p = exp(s−max)/Σ\none CTA per row of S\ngrid: B·H·Sq"),
        (6.2, "3  pv_product", f"O = P·V\none CTA per {bm}×{hd} tile of O\ngrid: B·H·⌈Sq/{bm}⌉"),
    ]
    for x, name, body in kernels:
        box(ax, x, 2.0, 2.75, 1.45, "", fc="white")
        label(ax, x + 1.375, 3.22, name, weight="bold", family="monospace", size=9)
        label(ax, x + 1.375, 2.55, body, size=8)
    arrow(ax, 0.58, 1.05, 1.0, 2.0)
    arrow(ax, 1.22, 1.05, 1.4, 2.0)
    arrow(ax, 2.4, 2.0, 3.0, 1.15, color=VERMILLION, lw=1.4)
    label(ax, 2.0, 1.62, "write 4 B / score", size=7.5, color=VERMILLION, ha="left")
    arrow(ax, 3.9, 1.15, 4.1, 2.0, color=VERMILLION, lw=1.4)
    arrow(ax, 5.0, 2.0, 4.9, 1.15, color=VERMILLION, lw=1.4)
    label(ax, 4.5, 1.62, "read S, write P", size=7.5, color=VERMILLION)
    arrow(ax, 5.6, 1.15, 6.5, 2.0, color=VERMILLION, lw=1.4)
    label(ax, 6.05, 1.5, "read 4 B / score", size=7.5, color=VERMILLION, ha="left")
    arrow(ax, 7.17, 1.05, 7.3, 2.0)
    arrow(ax, 8.7, 2.0, 8.62, 1.05)
    label(
        ax,
        6.2,
        3.75,
        "three launches in order on one stream: kernel 2 waits for all of 1, kernel 3 for all of 2",
        size=7.5,
        color="#444444",
    )
    save(fig, path)


def rung00_thread_tiles(path):
    r = rungs.get(0)
    grid, rows_pt, cols_pt = facts.need(0, "GRID_DIM", "ROWS_PER_THREAD", "COLS_PER_THREAD")
    bm, bn, hd = r.block_m, r.block_n, rungs.HEAD_DIM
    half = hd // 2
    run = half // grid  # pv_product: columns 4·tx + {0..3} and 64 + 4·tx + {0..3}
    ty, tx = 1, 2  # the thread drawn
    warp_rows = (32 // grid) * rows_pt  # a warp = 2 row groups x all 16 column groups
    cell = 0.04
    fig, ax = new_figure(9.4, 3.75)
    title(ax, 0.1, 3.7, f"Rung 0 (and 1): who owns what in a {bm}×{bn} S tile and a {bm}×{hd} O tile")
    x0, y0 = 0.45, 0.5
    for name, ncols, owned in (
        ("qk_scores: S tile", bn, [tx + grid * j for j in range(cols_pt)]),
        ("pv_product: O tile", hd, [run * tx + i for i in range(run)] + [half + run * tx + i for i in range(run)]),
    ):
        rect(ax, x0, y0, ncols * cell, bm * cell, fc="white", ec="#333333", lw=0.8)
        rect(ax, x0, y0 + (bm - warp_rows) * cell, ncols * cell, warp_rows * cell, fc=tint(SKY, 0.6), ec="none")
        for k in range(1, bm // rows_pt):  # the row groups of the 16 thread rows
            ax.plot([x0, x0 + ncols * cell], [y0 + k * rows_pt * cell] * 2, color="#DDDDDD", lw=0.4, zorder=2.5)
        for rr in range(ty * rows_pt, ty * rows_pt + rows_pt):
            for c in owned:
                rect(ax, x0 + c * cell, y0 + (bm - 1 - rr) * cell, cell, cell, fc=VERMILLION, ec="none", zorder=3)
        label(ax, x0 + ncols * cell / 2, y0 + bm * cell + 0.12, f"{name} ({ncols} columns)", weight="bold", size=8)
        label(ax, x0 - 0.12, y0 + bm * cell / 2, f"{bm} rows", size=7, rotation=90)
        x0 += ncols * cell + 0.6
    legend_patches(
        ax,
        0.45,
        0.22,
        [
            (f"thread (ty={ty}, tx={tx}): {rows_pt} rows", VERMILLION),
            (f"warp 0 = threads 0-31: rows 0-{warp_rows - 1}", tint(SKY, 0.6)),
        ],
        dx=3.0,
        size=7.5,
    )
    label(
        ax,
        0.45,
        3.38,
        f"{grid}×{grid} threads; S columns tx+{grid}·j (j = 0..{cols_pt - 1}); O columns {run}·tx+{{0..{run - 1}}} "
        f"and {half}+{run}·tx+{{0..{run - 1}}}",
        ha="left",
        size=7.5,
        color="#444444",
    )
    save(fig, path)


def rung00_workspace(path):
    import matplotlib.pyplot as plt

    heads, elem_in, elem_s = 16, 2, 4
    seqlens = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    s_bytes = [elem_s * heads * n * n for n in seqlens]
    q_bytes = [elem_in * heads * n * rungs.HEAD_DIM for n in seqlens]
    fig, ax = plt.subplots(figsize=(6.4, 3.3))
    ax.plot(seqlens, s_bytes, marker="o", color=VERMILLION, label="S workspace (rung 0): 4·H·S² bytes")
    ax.plot(seqlens, q_bytes, marker="s", color=BLUE, label="Q (or K, V, O): 2·H·S·128 bytes")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(seqlens, [f"{n // 1024}k" for n in seqlens])
    gib = 2**30
    ticks = [2**20, 2**24, 2**28, 4 * gib, 64 * gib, 1024 * gib]
    ax.set_yticks(ticks, ["1 MiB", "16 MiB", "256 MiB", "4 GiB", "64 GiB", "1 TiB"])
    ax.minorticks_off()
    ax.set_xlabel("seqlen (q = k)")
    ax.set_ylabel("bytes per batch element")
    ax.set_title("Rung 0: S grows with seqlen², Q, K, V, O with seqlen (16 heads)", loc="left")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 1


def rung01_tiling(path):
    r = rungs.get(1)
    bm, bn, hd = r.block_m, r.block_n, rungs.HEAD_DIM
    nq, nk = 6, 6  # blocks drawn (an example seqlen of 6 tiles)
    u = 0.34  # inches per 64 rows/columns
    fig, ax = new_figure(9.4, 4.4)
    title(ax, 0.1, 4.35, f"Rung 1: one CTA owns {bm} rows of Q and streams K, V through in {bn}-key tiles")
    h = hd / 64 * u  # width of a head_dim-wide matrix
    # Q
    qx, qy = 0.5, 0.6
    for i in range(nq):
        y = qy + (nq - 1 - i) * bm / 64 * u
        fc = tint(ROLE["Q"], 0.25 if i == 2 else 0.8)
        rect(ax, qx, y, h, bm / 64 * u, fc=fc, ec="white", lw=1)
        label(ax, qx - 0.08, y + bm / 128 * u, f"CTA {i}", size=6.5, ha="right")
    label(ax, qx + h / 2, qy + nq * bm / 64 * u + 0.15, f"Q ({bm}-row blocks)", size=8, weight="bold")
    # K^T
    kx, ky = 2.3, qy + nq * bm / 64 * u + 0.35
    for j in range(nk):
        rect(
            ax, kx + j * bn / 64 * u, ky, bn / 64 * u, h, fc=tint(ROLE["K"], 0.3 if j == 3 else 0.75), ec="white", lw=1
        )
    label(ax, kx - 0.1, ky + h / 2, "Kᵀ", size=8, weight="bold", ha="right")
    # S row block of CTA 2
    sy = qy + (nq - 3) * bm / 64 * u
    for j in range(nk):
        fc = tint(SKY, 0.2) if j == 3 else tint(SKY, 0.75)
        rect(ax, kx + j * bn / 64 * u, sy, bn / 64 * u, bm / 64 * u, fc=fc, ec="white", lw=1, hatch=None)
    label(ax, kx + nk * bn / 64 * u / 2, sy - 0.14, f"S of CTA 2: {bm}×{bn} per tile, in registers only", size=7)
    # V
    vx, vy = 5.0, 0.6
    for j in range(nk):
        y = vy + (nk - 1 - j) * bn / 64 * u
        rect(ax, vx, y, h, bn / 64 * u, fc=tint(ROLE["V"], 0.3 if j == 3 else 0.75), ec="white", lw=1)
    label(ax, vx + h / 2, vy + nk * bn / 64 * u + 0.15, f"V ({bn}-key tiles)", size=8, weight="bold")
    arrow(ax, kx + 3.5 * bn / 64 * u, ky, kx + 3.5 * bn / 64 * u, sy + bm / 64 * u + 0.02, color=ORANGE)
    arrow(ax, kx + nk * bn / 64 * u + 0.05, sy + bm / 128 * u, vx - 0.05, vy + 2.5 * bn / 64 * u, color=GREEN)
    # O
    ox = 6.8
    rect(ax, ox, sy, h, bm / 64 * u, fc=tint(ROLE["O"], 0.3), ec="#333333", lw=0.8)
    label(ax, ox + h / 2, sy + bm / 128 * u, f"O\n{bm}×{hd}", size=7)
    arrow(ax, vx + h + 0.05, vy + 2.5 * bn / 64 * u, ox - 0.05, sy + bm / 128 * u, color=PURPLE)
    arrow(ax, qx + h + 0.05, sy + bm / 128 * u, kx - 0.05, sy + bm / 128 * u, color=BLUE)
    label(
        ax,
        6.45,
        3.55,
        "per K/V tile (one loop iteration):\n"
        "  S = scale·Q·Kᵀ      (fp32 FMAs)\n"
        "  m' = max(m, rowmax S)\n"
        "  c = exp(m − m'),  l = c·l + Σ exp(S − m')\n"
        "  O = c·O + exp(S − m')·V\n"
        "after the last tile: O / l → bf16 → HBM",
        size=7.2,
        ha="left",
        va="top",
        family="monospace",
    )
    label(
        ax, 5.0, 0.3, "HBM traffic per CTA: Q once, each K/V tile once, O once; no S, no P", size=7.5, color=VERMILLION
    )
    save(fig, path)


def rung01_online_softmax(path):
    import matplotlib.pyplot as plt

    bn = rungs.get(1).block_n
    tiles = 5
    rng = np.random.default_rng(11)
    s = rng.normal(0.0, 1.0, tiles * bn) + np.repeat([0.0, 1.6, 1.1, 2.7, 2.2], bn)  # the max jumps twice
    keys = np.arange(tiles * bn)
    m, l_run, c_hist, m_hist, l_hist = -np.inf, 0.0, [], [], []
    for t in range(tiles):
        st = s[t * bn : (t + 1) * bn]
        m_new = max(m, st.max())
        c = np.exp(m - m_new) if np.isfinite(m) else 0.0
        l_run = c * l_run + np.exp(st - m_new).sum()
        m = m_new
        c_hist.append(c)
        m_hist.append(m)
        l_hist.append(l_run)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7.6, 4.6), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    a1.scatter(keys, s, s=3, color=GREY, label="scores s of one query row")
    for t in range(tiles):
        a1.hlines(m_hist[t], t * bn, (t + 1) * bn, color=VERMILLION, lw=2, label="running max m_t" if t == 0 else None)
        a1.axvline(t * bn, color="#BBBBBB", lw=0.6)
        a1.text((t + 0.5) * bn, s.min() - 0.3, f"tile {t + 1}", ha="center", va="top", fontsize=7)
    a1.set_ylim(s.min() - 0.9, s.max() + 0.5)
    a1.set_ylabel("score")
    a1.legend(loc="lower right", fontsize=7.5, frameon=True, framealpha=0.9)
    a1.set_title(f"Rung 1: the online softmax over {tiles} tiles of {bn} keys (one row, synthetic scores)", loc="left")
    centres = (np.arange(tiles) + 0.5) * bn
    a2.bar(centres, c_hist, width=bn * 0.35, color=SKY, label="correction c_t = exp(m_(t−1) − m_t)")
    for x, c in zip(centres, c_hist):
        a2.text(x, c + 0.04, f"{c:.2f}", ha="center", fontsize=7)
    a2.set_ylim(0, 1.3)
    a2.set_ylabel("c_t")
    a2.set_xlabel("key index")
    a2b = a2.twinx()
    a2b.plot(centres, l_hist, marker="o", color=BLUE, label="running sum l_t (relative to m_t)")
    a2b.set_ylabel("l_t", color=BLUE)
    a2b.spines["right"].set_visible(True)
    a2b.set_ylim(0, max(l_hist) * 1.25)
    h1, l1 = a2.get_legend_handles_labels()
    h2, l2 = a2b.get_legend_handles_labels()
    a2.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=7.5, frameon=True, framealpha=0.9)
    a2.set_xlim(0, tiles * bn)
    fig.text(
        0.01,
        -0.02,
        "c_1 = 0 (nothing to rescale); c_t = 1 when the max does not change, < 1 when it grows; "
        "O is rescaled by c_t the same way.",
        fontsize=7.5,
        color="#444444",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 2


def rung02_warp_split(path):
    r = rungs.get(2)
    warps, warp_rows, m_tiles, s_tiles, o_tiles = facts.need(
        2, "NUM_WARPS", "WARP_ROWS", "M_TILES", "S_TILES", "O_TILES"
    )
    bm, bn, hd = r.block_m, r.block_n, rungs.HEAD_DIM
    u = 0.018  # inches per row / key; head_dim is drawn at half that scale
    fig, ax = new_figure(9.4, 3.7)
    title(ax, 0.1, 3.65, f"Rung 2: {warps} warps split the {bm} query rows, {warp_rows} each ({m_tiles} m16 tiles)")
    x0, y0, gap = 0.8, 0.35, 0.3
    wq, ws, wo = hd * u * 0.5, bn * u, hd * u * 0.5
    colours = [tint(c, 0.45) for c in (BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION, YELLOW, GREY)]
    for w in range(warps):
        y = y0 + (warps - 1 - w) * warp_rows * u
        for mt in range(m_tiles):
            ym = y + (m_tiles - 1 - mt) * 16 * u
            for xx, ww in ((x0, wq), (x0 + wq + gap, ws), (x0 + wq + ws + 2 * gap, wo)):
                rect(ax, xx, ym, ww, 16 * u, fc=colours[w % 8], ec="white", lw=0.8)
        label(
            ax,
            x0 - 0.1,
            y + warp_rows * u / 2,
            f"warp {w}\nrows {w * warp_rows}-{(w + 1) * warp_rows - 1}",
            size=6.5,
            ha="right",
        )
    top = y0 + bm * u + 0.2
    label(ax, x0 + wq / 2, top, f"Q: {hd} dims\n(smem)", size=7.5, weight="bold")
    label(ax, x0 + wq + gap + ws / 2, top, f"S: {bn} keys\n(registers)", size=7.5, weight="bold")
    label(ax, x0 + wq + ws + 2 * gap + wo / 2, top, f"O: {hd} dims\n(registers)", size=7.5, weight="bold")
    # K/V tile shared by all warps
    kx = x0 + wq + ws + wo + 2 * gap + 0.8
    kw, kh = hd * u * 0.5, bn * u
    rect(ax, kx, y0 + kh + 0.15, kw, kh, fc=tint(ROLE["K"], 0.5), ec="#333333", lw=0.8)
    rect(ax, kx, y0, kw, kh, fc=tint(ROLE["V"], 0.5), ec="#333333", lw=0.8)
    label(ax, kx + kw / 2, y0 + kh * 1.5 + 0.15, f"K tile\n{bn}×{hd}", size=7.5)
    label(ax, kx + kw / 2, y0 + kh / 2, f"V tile\n{bn}×{hd}", size=7.5)
    label(ax, kx + kw / 2, top + 0.28, "shared memory:\nread by all warps", size=7.5, weight="bold")
    o_regs, s_regs = o_tiles * 4 * m_tiles, s_tiles * 4 * m_tiles
    label(
        ax,
        kx + kw + 0.35,
        y0 + bm * u - 0.1,
        f"per lane:\n  {o_regs} fp32 O accumulators\n  {s_regs} fp32 S accumulators\n\n"
        f"each K or V fragment loaded\nwith ldmatrix.x4 feeds\n{2 * m_tiles} mma.sync (both m16 tiles)\n\n"
        "row max / row sum stay\ninside a quad (4 lanes)",
        size=7.5,
        ha="left",
        va="top",
    )
    save(fig, path)


def rung02_fragments(path):
    """The S accumulators of two n8 tiles and the A fragment of one k16 slice of P·V, lane by lane."""
    cell = 0.25
    fig, ax = new_figure(9.6, 5.6)
    title(ax, 0.1, 5.55, "Rung 2: the S accumulator fragment IS the A fragment of P·V (P never leaves the registers)")
    hl = 5  # the lane called out

    def owner_c(row, col):  # C layout of two side-by-side n8 tiles: (tile, e)
        g, half = row % 8, row // 8
        tile, c8 = col // 8, col % 8
        t = c8 // 2
        return 4 * g + t, tile, 2 * half + (c8 % 2)

    def owner_a(row, col):  # A layout (16x16): a0 (g, 2t..) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
        g, half = row % 8, row // 8
        t = (col % 8) // 2
        return 4 * g + t, half + 2 * (col // 8)

    panels = [
        (0.55, "S = Q·Kᵀ accumulators of n8 tiles s[2kk] | s[2kk+1]", "c"),
        (5.25, "A fragment of P·V, k16 slice kk", "a"),
    ]
    y0 = 0.75
    for x0, name, kind in panels:
        for row in range(16):
            for col in range(16):
                if kind == "c":
                    lane, tile, e = owner_c(row, col)
                    reg = (e // 2) + 2 * tile  # which A register the pair is packed into
                    text = str(lane)
                else:
                    lane, reg = owner_a(row, col)
                    text = str(lane)
                x, y = x0 + col * cell, y0 + (15 - row) * cell
                rect(ax, x, y, cell, cell, fc=REG_COLOURS[reg], ec="white", lw=0.6)
                weight = "bold" if lane == hl else "normal"
                label(
                    ax,
                    x + cell / 2,
                    y + cell / 2,
                    text,
                    size=6,
                    weight=weight,
                    color="#000000" if lane == hl else "#333333",
                )
                if lane == hl:
                    rect(ax, x, y, cell, cell, fc="none", ec=VERMILLION, lw=1.4, zorder=5)
        rect(ax, x0 + 8 * cell - 0.004, y0, 0.008, 16 * cell, fc="#333333", ec="none", zorder=6)
        rect(ax, x0, y0 + 8 * cell - 0.004, 16 * cell, 0.008, fc="#333333", ec="none", zorder=6)
        label(ax, x0 + 8 * cell, y0 + 16 * cell + 0.42, name, size=8, weight="bold")
        label(ax, x0 + 4 * cell, y0 + 16 * cell + 0.15, "keys 16kk+0..7", size=7)
        label(ax, x0 + 12 * cell, y0 + 16 * cell + 0.15, "keys 16kk+8..15", size=7)
        label(ax, x0 - 0.12, y0 + 12 * cell, "rows 0-7 (g)", size=7, rotation=90)
        label(ax, x0 - 0.12, y0 + 4 * cell, "rows 8-15 (g+8)", size=7, rotation=90)
    arrow(ax, 0.55 + 16 * cell + 0.1, y0 + 8 * cell, 5.25 - 0.15, y0 + 8 * cell, lw=1.5)
    label(ax, (0.55 + 16 * cell + 5.25) / 2, y0 + 8 * cell + 0.4, "pack_bf16x2\n(no data moves\nbetween lanes)", size=7)
    legend_patches(
        ax,
        0.55,
        0.4,
        [
            ("s[2kk][0,1] → a0", REG_COLOURS[0]),
            ("s[2kk][2,3] → a1", REG_COLOURS[1]),
            ("s[2kk+1][0,1] → a2", REG_COLOURS[2]),
            ("s[2kk+1][2,3] → a3", REG_COLOURS[3]),
        ],
        dx=2.05,
        size=7.5,
    )
    label(
        ax,
        0.55,
        0.12,
        f"number in a cell: the lane (4g + t) holding that element; lane {hl} outlined. "
        "Layouts from common.cuh (PTX ISA mma.m16n8k16 C and A fragments).",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 3


def rung03_ring(path):
    r = rungs.get(3)
    stages = r.stages
    ntiles = 5
    slot_colours = [tint(c, 0.35) for c in (ORANGE, GREEN, PURPLE, BLUE)]
    fig, ax = new_figure(9.6, 3.6)
    title(
        ax,
        0.1,
        3.55,
        f"Rung 3: cp.async into a {stages}-slot K/V ring; copy of tile n+{stages - 1} in flight "
        "while tile n is computed",
    )
    x0, w = 1.3, 1.36
    label(ax, 0.1, 2.55, "cp.async groups\n(all 128 threads\nissue, no wait)", size=7.5, ha="left")
    label(ax, 0.1, 1.35, "math\n(mma.sync,\nsoftmax)", size=7.5, ha="left")
    # prologue: Q and tiles 0 .. stages-2
    box(ax, x0, 2.35, 0.45, 0.42, "Q", fc=tint(BLUE, 0.5), fontsize=7.5)
    for n in range(stages - 1):
        box(ax, x0 + 0.5 + n * 0.55, 2.35, 0.5, 0.42, f"KV{n}", fc=slot_colours[n % stages], fontsize=7)
    label(ax, x0 + 0.45, 2.95, "prologue", size=7)
    for n in range(ntiles):
        xs = x0 + 0.5 + (stages - 1) * 0.55 + n * w
        tile = n + stages - 1
        if tile < ntiles:
            box(
                ax,
                xs,
                2.35,
                w - 0.1,
                0.42,
                f"copy KV{tile} → slot {tile % stages}",
                fc=slot_colours[tile % stages],
                fontsize=7,
            )
        else:
            box(ax, xs, 2.35, w - 0.1, 0.42, "empty group", fc="white", fontsize=7, ec=GREY)
        box(ax, xs, 1.15, w - 0.1, 0.42, f"tile {n} on slot {n % stages}", fc=slot_colours[n % stages], fontsize=7)
        ax.plot([xs - 0.03, xs - 0.03], [0.95, 2.85], color=VERMILLION, lw=1.2, ls="--")
        label(ax, xs - 0.03, 0.8, f"wait_group {stages - 2}\n+ __syncthreads", size=6.2, color=VERMILLION)
    label(
        ax,
        0.1,
        0.32,
        f"group i+1 holds tile i (one group committed per iteration, empty when no tile is left), so the wait count "
        f"is the constant NUM_STAGES−2 = {stages - 2}.\nThe barrier also proves every warp left iteration n−1: "
        f"its slot ((n−1) mod {stages}) may be refilled right after it.",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


def rung03_swizzle(path):
    chunks = facts.need(3, "CHUNKS_PER_ROW")
    cell = 0.24
    fig, ax = new_figure(9.6, 3.45)
    title(ax, 0.1, 3.4, "Rung 3: logical 16-B chunk c of row r stored at physical chunk c ^ (r % 8)")
    hl = 0  # the logical chunk one ldmatrix 8x8 matrix reads (rows 0-7)
    for pi, (x0, name, phys) in enumerate(
        (
            (0.55, "dense rows, no swizzle: 8-way bank conflict", lambda r, c: c),
            (5.05, "rung 3's XOR swizzle: one wavefront", lambda r, c: c ^ (r % 8)),
        )
    ):
        y0 = 0.75
        for r in range(8):
            for c in range(chunks):
                p = phys(r, c)
                x, y = x0 + p * cell, y0 + (7 - r) * cell
                hit = c == hl
                rect(
                    ax,
                    x,
                    y,
                    cell,
                    cell,
                    fc=VERMILLION if hit else tint(SKY, 0.25 + 0.5 * ((c // 8) % 2)),
                    ec="white",
                    lw=0.6,
                )
                label(ax, x + cell / 2, y + cell / 2, str(c), size=6, color="white" if hit else "#222222")
        for half in range(chunks // 8):
            label(
                ax, x0 + (half * 8 + 4) * cell, y0 + 8 * cell + 0.12, f"bytes {128 * half}-{128 * half + 127}", size=6.5
            )
        for p in range(8):
            label(ax, x0 + (p + 0.5) * cell, y0 - 0.12, f"{4 * p}", size=5.5, color="#555555")
        label(ax, x0 - 0.05, y0 - 0.12, "bank", size=5.5, ha="right", color="#555555")
        for r in range(8):
            label(ax, x0 - 0.08, y0 + (7.5 - r) * cell, f"r={r}", size=6, ha="right")
        label(ax, x0 + chunks * cell / 2, y0 + 8 * cell + 0.4, name, size=8, weight="bold")
        if pi == 0:
            label(
                ax,
                x0 + 0.02,
                y0 - 0.38,
                f"chunk {hl} of rows 0-7: all in banks 0-3",
                size=7,
                ha="left",
                color=VERMILLION,
            )
        else:
            label(
                ax,
                x0 + 0.02,
                y0 - 0.38,
                f"chunk {hl} of rows 0-7: 8 chunks, all 32 banks",
                size=7,
                ha="left",
                color=VERMILLION,
            )
    label(
        ax,
        0.55,
        0.02,
        f"a row is {chunks} chunks = 256 B (128 bf16); numbers are logical chunks at their physical place.\n"
        "Rung 2 padded rows to 272 B instead; rung 5's TMA applies the same XOR inside 128-B panel rows.",
        size=7,
        ha="left",
        color="#444444",
    )
    save(fig, path)


# ------------------------------------------------------------------------------------------------ rung 4


def rung04_fold(path):
    fig, ax = new_figure(9.6, 3.7)
    title(ax, 0.1, 3.65, "Rung 4: per score, rung 3's expf chain becomes one FFMA and one MUFU.EX2")
    chains = [
        (
            2.75,
            "rung 3  p = expf((s − m)·scale)",
            [
                ("FADD\ns − m", YELLOW),
                ("FMUL\n·scale", YELLOW),
                ("expf: ~5 FFMA/FMUL\nrange reduction", tint(GREY, 0.4)),
                ("MUFU.EX2", ORANGE),
                ("FADD\nrow sum", YELLOW),
            ],
        ),
        (
            1.45,
            "rung 4  p = ex2(fma(s, mul, −R))",
            [("FFMA\ns·mul − R", SKY), ("MUFU.EX2", ORANGE), ("FADD\nrow sum", YELLOW)],
        ),
    ]
    for y, name, steps in chains:
        label(ax, 0.15, y + 0.55, name, size=8.5, ha="left", weight="bold", family="monospace")
        x = 0.2
        for i, (text, colour) in enumerate(steps):
            w = 1.9 if "range" in text else 1.15
            box(ax, x, y, w, 0.45, text, fc=tint(colour, 0.45), fontsize=7.5)
            if i:
                arrow(ax, x - 0.2, y + 0.225, x - 0.01, y + 0.225)
            x += w + 0.22
    label(
        ax,
        5.0,
        2.05,
        "once per row and tile (softmax.cuh, online_rescale):\n"
        "  c = scale·log2 e,  mul = min(c, 2^(29−E))  (= c on soft rows)\n"
        "  R = m·mul rounded up      FMUL.RP\n"
        "  e = fma(m, mul, −R)       exact residual\n"
        "  α = ex2(fma(m_old − m, c, e − e_old))\n"
        "α = 1 exactly when the max did not change",
        size=7,
        ha="left",
        va="top",
        family="monospace",
    )
    label(
        ax,
        0.15,
        0.7,
        "c > 0 always (a negative scale negates Q, zero becomes FLT_MIN), so the max stays in raw "
        "score units and masked keys (s = −∞) give ex2(−∞) = +0.",
        size=7.2,
        ha="left",
        color="#444444",
    )
    label(
        ax,
        0.15,
        0.42,
        "ex2.approx.ftz.f32: ~2 ulp, far below the bf16 rounding that P gets before P·V.",
        size=7.2,
        ha="left",
        color="#444444",
    )
    save(fig, path)


def rung04_quad_reduction(path):
    bn = rungs.get(4).block_n
    s_tiles = facts.need(4, "S_TILES")
    cell = 0.12
    fig, ax = new_figure(9.6, 4.2)
    title(ax, 0.1, 4.15, f"Rung 4: a row's {bn} scores live in one quad (lanes 4g..4g+3); its max is two shuffles")
    x0, y0 = 0.6, 3.1
    for col in range(bn):
        t = (col % 8) // 2
        rect(ax, x0 + col * cell, y0, cell, 0.32, fc=QUAD_COLOURS[t], ec="white", lw=0.4)
    for j in range(s_tiles):
        label(ax, x0 + (8 * j + 4) * cell, y0 + 0.45, f"n8 tile {j}", size=6)
    label(ax, x0 - 0.08, y0 + 0.16, "row g", size=7, ha="right")
    label(
        ax, x0 + bn * cell + 0.1, y0 + 0.16, f"lane 4g+t holds keys 8j+2t, 8j+2t+1: {bn // 4} scores", size=7, ha="left"
    )
    # butterfly
    xs = [1.1 + 2.0 * k for k in range(4)]
    ys = [2.3, 1.45, 0.6]
    stages = ["local max of its own\nscores (FMNMX)", "shfl_xor 1", "shfl_xor 2"]
    for t in range(4):
        for y in ys:
            box(ax, xs[t] - 0.55, y, 1.1, 0.4, f"lane 4g+{t}", fc=QUAD_COLOURS[t], fontsize=7)
    for yi in range(2):
        d = 1 << yi
        for t in range(4):
            arrow(ax, xs[t], ys[yi], xs[t], ys[yi + 1] + 0.4, color="#555555")
            arrow(
                ax,
                xs[t ^ d] + (0.2 if t > (t ^ d) else -0.2),
                ys[yi],
                xs[t] + (-0.2 if t > (t ^ d) else 0.2),
                ys[yi + 1] + 0.4,
                color=VERMILLION,
                lw=0.9,
            )
        label(ax, 8.3, (ys[yi] + ys[yi + 1] + 0.4) / 2, stages[yi + 1] + "\n(fmaxf)", size=7.5, family="monospace")
    label(ax, 8.3, ys[0] + 0.2, stages[0], size=7.5)
    label(ax, 8.3, ys[2] + 0.2, "all 4 lanes:\nthe row max", size=7.5, weight="bold")
    label(
        ax,
        0.6,
        0.25,
        "quad_max (common.cuh) once per row and tile; the row sums stay per lane and are reduced the "
        "same way (quad_sum) once, in the epilogue.",
        size=7.2,
        ha="left",
        color="#444444",
    )
    save(fig, path)


FIGURES = [
    (0, "dataflow", rung00_dataflow, "The three kernels of rung 0 and the fp32 score matrix they pass through HBM."),
    (
        0,
        "thread-tiles",
        rung00_thread_tiles,
        "The 16 × 16 thread grid of the two GEMM kernels: what one thread and one warp own.",
    ),
    (0, "workspace", rung00_workspace, "Size of the S workspace against the size of one input, per batch element."),
    (
        1,
        "tiling",
        rung01_tiling,
        "One CTA per block of Q rows; K and V stream through in tiles; S lives only in registers.",
    ),
    (
        1,
        "online-softmax",
        rung01_online_softmax,
        "Running max, correction factor and running sum over the tiles of one row.",
    ),
    (
        2,
        "warp-split",
        rung02_warp_split,
        "The 4 warps × 32 rows split: each warp owns two m16 tiles and sweeps all of K and V.",
    ),
    (
        2,
        "fragments",
        rung02_fragments,
        "mma.sync m16n8k16: the lanes holding S are the lanes that must supply P as the A operand.",
    ),
    (3, "cp-async-ring", rung03_ring, "The cp.async commit groups and the ring of K/V slots, one barrier per tile."),
    (3, "swizzle", rung03_swizzle, "The XOR swizzle spreads the 8 rows of an ldmatrix matrix over all 32 banks."),
    (4, "fold", rung04_fold, "The per-score instructions of rungs 3 and 4, and the per-row work of the exact fold."),
    (
        4,
        "quad-reduction",
        rung04_quad_reduction,
        "Which lane of a quad holds which scores of a row, and the two-step butterfly.",
    ),
]
