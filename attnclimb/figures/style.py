"""One look for every figure: a colour-blind-safe palette (Okabe & Ito's eight colours and light tints of
them), one font, and a few drawing helpers (boxes, arrows, cell grids) on axes measured in data units.

Every figure is written as SVG with its text kept as text (``svg.fonttype = none``), a fixed hash salt
for the ids matplotlib generates, and no date or version in the metadata, so that drawing the same
figure twice gives the same bytes.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision deficiency.
BLACK = "#000000"
ORANGE = "#E69F00"
SKY = "#56B4E9"
GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
GREY = "#999999"

# What each colour means, the same on every page.
ROLE = {
    "Q": BLUE,
    "K": ORANGE,
    "V": GREEN,
    "O": PURPLE,
    "S": SKY,
    "P": SKY,
    "softmax": YELLOW,
    "hbm": GREY,
    "wait": GREY,
    "accent": VERMILLION,
    "PV": GREEN,
    "epilogue": PURPLE,
}

# The phases of a warpgroup's timeline (schematic figures of rungs 8-9 and the measured Gantt charts).
PHASE_COLOURS = {"wait": "#D9D9D9", "S": SKY, "softmax": YELLOW, "PV": GREEN, "epilogue": PURPLE, "tma": VERMILLION}
PHASE_LABELS = {
    "wait": "wait",
    "S": "S = Q·Kᵀ",
    "softmax": "softmax",
    "PV": "O += P·V",
    "epilogue": "epilogue",
    "tma": "TMA issue",
}

FONT = "DejaVu Sans"
MONO = "DejaVu Sans Mono"

RC = {
    "svg.fonttype": "none",  # text stays text: searchable, selectable, scales with the page
    "svg.hashsalt": "attnclimb",  # deterministic ids for clip paths and markers
    "svg.image_inline": True,
    "font.family": "sans-serif",
    "font.sans-serif": [FONT],
    "font.monospace": [MONO],
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.edgecolor": "#333333",
    "axes.linewidth": 0.8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "legend.fontsize": 8,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.08,
    "path.simplify": False,
    "lines.linewidth": 1.2,
    "hatch.linewidth": 0.6,
}

# Metadata that would change from run to run or from one matplotlib release to the next: left out.
SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}


def tint(colour: str, amount: float) -> str:
    """``colour`` mixed with white: ``amount`` 0 is the colour, 1 is white."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    mix = [round(c + (255 - c) * amount) for c in (r, g, b)]
    return "#" + "".join(f"{c:02X}" for c in mix)


@contextmanager
def figure_style():
    """The rcParams of every figure, restored on exit (the caller's own plots are left alone)."""
    with matplotlib.rc_context(RC):
        yield


def new_figure(width: float, height: float, *, xlim=None, ylim=None):
    """A figure of ``width`` x ``height`` inches with one frameless axes whose data units are inches
    (or ``xlim``/``ylim`` when given), y growing upwards."""
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(*(xlim or (0, width)))
    ax.set_ylim(*(ylim or (0, height)))
    ax.set_axis_off()
    return fig, ax


def save(fig, path: Path) -> Path:
    """Write ``fig`` as deterministic SVG and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata=SVG_METADATA)
    plt.close(fig)
    return path


def box(
    ax,
    x,
    y,
    w,
    h,
    text="",
    *,
    fc="white",
    ec="#333333",
    lw=0.9,
    fontsize=8.5,
    color=BLACK,
    rounded=True,
    weight="normal",
    family=None,
    ha="center",
    hatch=None,
    zorder=2,
    **text_kw,
):
    """A (rounded) rectangle with its lower-left corner at (x, y) and ``text`` centred in it."""
    style = "round,pad=0,rounding_size=0.06" if rounded else "square,pad=0"
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle=style, fc=fc, ec=ec, lw=lw, hatch=hatch, zorder=zorder, mutation_scale=1)
    )
    if text:
        tx = x + w / 2 if ha == "center" else x + 0.08
        ax.text(
            tx,
            y + h / 2,
            text,
            ha=ha,
            va="center",
            fontsize=fontsize,
            color=color,
            weight=weight,
            family=family or "sans-serif",
            zorder=zorder + 1,
            **text_kw,
        )


def rect(ax, x, y, w, h, *, fc="white", ec="#333333", lw=0.6, hatch=None, zorder=2, alpha=None):
    ax.add_patch(Rectangle((x, y), w, h, fc=fc, ec=ec, lw=lw, hatch=hatch, zorder=zorder, alpha=alpha))


def arrow(ax, x0, y0, x1, y1, *, color="#333333", lw=1.0, style="-|>", rad=0.0, ls="-", zorder=4, mutation=9):
    """An arrow from (x0, y0) to (x1, y1), optionally curved (``rad``)."""
    ax.add_patch(
        FancyArrowPatch(
            (x0, y0),
            (x1, y1),
            arrowstyle=style,
            mutation_scale=mutation,
            color=color,
            lw=lw,
            ls=ls,
            connectionstyle=f"arc3,rad={rad}",
            shrinkA=0,
            shrinkB=0,
            zorder=zorder,
        )
    )


def label(ax, x, y, text, *, size=8.5, ha="center", va="center", color=BLACK, weight="normal", family=None, **kw):
    ax.text(x, y, text, ha=ha, va=va, fontsize=size, color=color, weight=weight, family=family or "sans-serif", **kw)


def title(ax, x, y, text, *, size=10.5):
    ax.text(x, y, text, ha="left", va="top", fontsize=size, weight="bold")


def legend_patches(ax, x, y, items, *, size=8, dx=1.6, sw=0.22, sh=0.16):
    """A row of colour swatches with labels, starting at (x, y): ``items`` is [(label, colour), ...]."""
    for i, (text, colour) in enumerate(items):
        xi = x + i * dx
        rect(ax, xi, y - sh / 2, sw, sh, fc=colour, ec="#333333", lw=0.5)
        ax.text(xi + sw + 0.07, y, text, ha="left", va="center", fontsize=size)
