"""Gantt charts of measured per-warpgroup phases (what ``python -m attnclimb trace`` writes; see
:mod:`attnclimb.trace`).

Input, as a dict or a JSON file::

    {"rung": N,
     "ctas": [{"cta": i, "sm": s,
               "warpgroups": [{"wg": w, "role": "producer",
                               "events": [{"phase": "wait|S|softmax|PV|epilogue|tma", "t0": ns, "t1": ns},
                                          ...]},
                              ...]},
              ...]}

Times are nanoseconds (``%globaltimer``), or SM cycles when ``"unit": "cycles"`` (``%clock64``); the chart
starts at the earliest ``t0`` of all CTAs and draws one lane per (CTA, warpgroup), phases coloured as in
the schematic figures of rungs 8 and 9. ``sm`` and
``role`` are optional (shown in the lane's label when present); other keys (the trace command adds
``what`` to events, ``shape``, ``device`` ...) are ignored here. A TMA issue takes a few hundred
nanoseconds, too short to see at the scale of a whole CTA, so ``tma`` events are drawn at least
:data:`MIN_TMA_WIDTH` of the time axis wide.
"""

from __future__ import annotations

import json
from pathlib import Path

PHASES = ("wait", "S", "softmax", "PV", "epilogue", "tma")
MIN_TMA_WIDTH = 0.002  # of the time axis


def load_trace(source) -> dict:
    """Parse and validate a trace (a dict, or a path to its JSON). Raises ``ValueError`` naming the first
    problem found."""
    doc = json.loads(Path(source).read_text()) if isinstance(source, (str, Path)) else source
    if not isinstance(doc, dict) or not isinstance(doc.get("rung"), int) or not isinstance(doc.get("ctas"), list):
        raise ValueError('a trace is {"rung": int, "ctas": [...]}')
    if not doc["ctas"]:
        raise ValueError("the trace has no CTAs")
    for c in doc["ctas"]:
        if not isinstance(c, dict) or not isinstance(c.get("warpgroups"), list) or "cta" not in c:
            raise ValueError(f"malformed CTA entry: {c!r:.80}")
        for wg in c["warpgroups"]:
            if not isinstance(wg, dict) or "wg" not in wg or not isinstance(wg.get("events"), list):
                raise ValueError(f"CTA {c['cta']}: malformed warpgroup entry: {wg!r:.80}")
            for e in wg["events"]:
                if not isinstance(e, dict) or e.get("phase") not in PHASES:
                    raise ValueError(f"CTA {c['cta']} WG {wg['wg']}: unknown phase in {e!r:.80} (one of {PHASES})")
                t0, t1 = e.get("t0"), e.get("t1")
                if not isinstance(t0, (int, float)) or not isinstance(t1, (int, float)) or t1 < t0:
                    raise ValueError(f"CTA {c['cta']} WG {wg['wg']}: need numbers t0 <= t1 in {e!r:.80}")
    return doc


def draw_timeline(source, path, *, title: str | None = None) -> Path:
    """Draw the Gantt chart of a trace (see the module docstring) to ``path`` (SVG or PNG by suffix)."""
    import matplotlib.pyplot as plt

    from .style import PHASE_COLOURS, PHASE_LABELS, SVG_METADATA, figure_style

    doc = load_trace(source)
    lanes = []  # (label, events), top to bottom
    for c in sorted(doc["ctas"], key=lambda c: c["cta"]):
        for wg in sorted(c["warpgroups"], key=lambda w: w["wg"]):
            sm = f", SM {c['sm']}" if c.get("sm") is not None else ""
            role = f" ({wg['role']})" if wg.get("role") else ""
            lanes.append((f"CTA {c['cta']}{sm} · WG {wg['wg']}{role}", wg["events"]))
    times = [t for _, evs in lanes for e in evs for t in (e["t0"], e["t1"])]
    origin = min(times) if times else 0
    span_us = ((max(times) - origin) / 1000.0) if times else 1.0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with figure_style():
        fig, ax = plt.subplots(figsize=(9.0, 0.9 + 0.32 * len(lanes)))
        for y, (_, events) in enumerate(lanes):
            by_phase: dict = {}
            for e in events:
                width = (e["t1"] - e["t0"]) / 1000.0
                if e["phase"] == "tma":
                    width = max(width, MIN_TMA_WIDTH * span_us)
                by_phase.setdefault(e["phase"], []).append(((e["t0"] - origin) / 1000.0, width))
            for phase in PHASES:
                if phase in by_phase:
                    hatch = "////" if phase == "wait" else None
                    ax.broken_barh(
                        by_phase[phase],
                        (y - 0.38, 0.76),
                        facecolors=PHASE_COLOURS[phase],
                        edgecolor="#555555",
                        linewidth=0.3,
                        hatch=hatch,
                    )
        ax.set_yticks(range(len(lanes)), [name for name, _ in lanes], fontsize=7)
        ax.set_ylim(len(lanes) - 0.5, -0.5)
        ax.set_xlim(0, span_us * 1.01 if span_us > 0 else 1)
        if doc.get("unit", "ns") == "ns":
            ax.set_xlabel("time since the first event (µs, %globaltimer)")
        else:  # SM cycles (%clock64): every CTA starts at its own first event
            ax.set_xlabel("thousands of SM cycles since the CTA's first event (%clock64)")
        ax.grid(axis="x", alpha=0.3)
        handles = [
            plt.Rectangle((0, 0), 1, 1, fc=PHASE_COLOURS[p], ec="#555555", hatch="////" if p == "wait" else None)
            for p in PHASES
        ]
        ax.legend(
            handles,
            [PHASE_LABELS[p] for p in PHASES],
            ncol=len(PHASES),
            loc="lower left",
            bbox_to_anchor=(0, 1.0),
            fontsize=7.5,
        )
        ax.set_title(title or f"Rung {doc['rung']}: measured phases per warpgroup", loc="left", pad=22)
        fmt = path.suffix.lstrip(".").lower() or "svg"
        kwargs = {"metadata": SVG_METADATA} if fmt == "svg" else {"dpi": 200}
        fig.savefig(path, format=fmt, **kwargs)
        plt.close(fig)
    return path


def synthetic_trace(rung: int = 9, ctas: int = 2, tiles: int = 4) -> dict:
    """A made-up trace in the format above (for tests and for trying the chart): a producer warpgroup that
    mostly waits and consumer warpgroups cycling through S, softmax and P·V. Not a measurement."""
    doc = {"rung": rung, "ctas": []}
    for c in range(ctas):
        t = 1000 * c
        wgs = [{"wg": 0, "events": [{"phase": "wait", "t0": t, "t1": t + 400 * tiles}]}]
        for w in (1, 2):
            now, events = t + 80 * w, [{"phase": "wait", "t0": t, "t1": t + 80 * w}]
            for _ in range(tiles):
                for phase, length in (("S", 120), ("softmax", 160), ("PV", 110)):
                    events.append({"phase": phase, "t0": now, "t1": now + length})
                    now += length
            events.append({"phase": "epilogue", "t0": now, "t1": now + 60})
            wgs.append({"wg": w, "events": events})
        doc["ctas"].append({"cta": c, "sm": 2 * c, "warpgroups": wgs})
    return doc
