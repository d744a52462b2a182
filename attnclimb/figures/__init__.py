"""Diagrams of what each rung changes, drawn from the numbers the kernels are built with (``python -m
attnclimb figures``). matplotlib only; every figure is a deterministic SVG in ``docs/figures/``.

Each rung page embeds its figures between ``<!-- figures:begin -->`` and ``<!-- figures:end -->``; that
block is generated here too (image links and captions), so the files and the pages cannot drift apart.
``check()`` (used by ``figures --check`` and the CPU tests) regenerates everything into a temporary
folder and compares it with what is committed.
"""

from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DESCRIPTION = (
    "Draw the diagrams of every rung page (SVG, deterministic) into docs/figures and refresh the figure "
    "block of each page in docs/rungs; --check only compares a fresh drawing with the committed files."
)
PAGE_BEGIN, PAGE_END = "<!-- figures:begin -->", "<!-- figures:end -->"


@dataclass(frozen=True)
class Figure:
    rung: int
    slug: str
    draw: object  # draw(path) -> None
    caption: str

    @property
    def filename(self) -> str:
        return f"rung{self.rung:02d}-{self.slug}.svg"


def registry() -> list:
    """Every figure, in page order."""
    from . import early, hopper, late

    return [Figure(*entry) for entry in (*early.FIGURES, *hopper.FIGURES, *late.FIGURES)]


def default_dir() -> Path:
    from ..bench.paths import REPO_ROOT

    return REPO_ROOT / "docs" / "figures"


def generate(out_dir, figures=None) -> list:
    """Draw ``figures`` (default: all) into ``out_dir``; returns the paths written."""
    from .style import figure_style

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fig in figures or registry():
        with figure_style():
            fig.draw(out_dir / fig.filename)
        written.append(out_dir / fig.filename)
    return written


def page_block(rung: int, figures=None, rel: str = "../figures") -> str:
    """The markdown between a page's figure markers: each figure with its caption."""
    lines = []
    mine = [f for f in figures or registry() if f.rung == rung]
    for i, f in enumerate(mine, 1):
        src = f"{rel}/{f.filename}"  # the picture links to itself: a click opens it at full size
        lines += [f"[![{f.caption}]({src})]({src})", "", f"*Figure {rung}.{i}: {f.caption}*", ""]
    lines.append(
        "<sub>Drawn by `python -m attnclimb figures` from `rungs.py` and the kernel sources; do not edit by hand.</sub>"
    )
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str | None:
    i, j = text.find(PAGE_BEGIN), text.find(PAGE_END)
    if i < 0 or j < i:
        return None
    return text[: i + len(PAGE_BEGIN)] + "\n" + block + "\n" + text[j:]


def page_paths() -> dict:
    from .. import rungs
    from ..bench.paths import REPO_ROOT

    return {r.number: REPO_ROOT / r.page for r in rungs.RUNGS}


def stale_pages(figures=None) -> list:
    """Pages whose figure block is missing or differs from :func:`page_block`."""
    out = []
    for number, path in page_paths().items():
        text = path.read_text()
        new = replace_block(text, page_block(number, figures))
        if new is None or new != text:
            out.append(path)
    return out


def update_pages(figures=None) -> list:
    """Rewrite the figure block of every page that has the markers; returns the pages changed."""
    changed = []
    for number, path in page_paths().items():
        text = path.read_text()
        new = replace_block(text, page_block(number, figures))
        if new is None:
            raise ValueError(f"{path}: no {PAGE_BEGIN} ... {PAGE_END} block")
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


# ------------------------------------------------------------------------------------------ comparison


def svg_structure(data: bytes) -> dict:
    """What an SVG shows, without its coordinates: the texts in order and how many shapes of each colour
    it has. Two matplotlib releases may write the same drawing with different path data or ids; this
    stays equal as long as the labels, numbers and colour-coded shapes are the same."""
    text = data.decode("utf-8")
    texts = [re.sub(r"\s+", " ", t).strip() for t in re.findall(r"<text[^>]*>(.*?)</text>", text, flags=re.S)]
    colours: dict = {}
    for m in re.finditer(r"<(path|use|rect)\b[^>]*?style=\"([^\"]*)\"", text):
        fill = re.search(r"fill:\s*(#[0-9a-fA-F]{6}|none)", m.group(2))
        key = (m.group(1), fill.group(1).lower() if fill else "")
        colours[key] = colours.get(key, 0) + 1
    return {"texts": texts, "shapes": dict(sorted(colours.items()))}


def compare(fresh_dir, committed_dir, figures=None) -> tuple:
    """``(problems, mode)``: the files that differ between a fresh drawing and the committed one.

    ``mode`` is ``"bytes"`` when the committed files were drawn by this matplotlib release (recorded in
    ``VERSION`` beside them): then every file must be byte-identical. With another release the SVGs are
    compared by :func:`svg_structure` (``mode = "structure"``), since matplotlib does not promise the
    same path data or element order across releases."""
    import matplotlib

    fresh_dir, committed_dir = Path(fresh_dir), Path(committed_dir)
    version_file = committed_dir / "VERSION"
    recorded = version_file.read_text().strip() if version_file.exists() else ""
    mode = "bytes" if recorded == _version_line(matplotlib.__version__) else "structure"
    problems = []
    names = {f.filename for f in figures or registry()}
    on_disk = {p.name for p in committed_dir.glob("*.svg")}
    problems += [f"{n}: missing (run python -m attnclimb figures)" for n in sorted(names - on_disk)]
    problems += [f"{n}: no figure of that name is drawn any more (delete it)" for n in sorted(on_disk - names)]
    for n in sorted(names & on_disk):
        a, b = (fresh_dir / n).read_bytes(), (committed_dir / n).read_bytes()
        if mode == "bytes" and a != b:
            problems.append(f"{n}: differs from a fresh drawing")
        elif mode == "structure" and svg_structure(a) != svg_structure(b):
            problems.append(f"{n}: its texts or shapes differ from a fresh drawing")
    return problems, mode


def _version_line(version: str) -> str:
    return f"matplotlib {version}"


def check(committed_dir=None) -> tuple:
    """Regenerate into a temporary folder and compare with ``committed_dir`` (default ``docs/figures``);
    also check each page's figure block. Returns ``(problems, mode)``."""
    committed_dir = Path(committed_dir or default_dir())
    figures = registry()
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, figures)
        problems, mode = compare(tmp, committed_dir, figures)
    problems += [f"{p.name}: figure block out of date (run python -m attnclimb figures)" for p in stale_pages(figures)]
    return problems, mode


# ------------------------------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the SVG files (default: docs/figures of the checkout; the rung pages are only "
        "updated when drawing there)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing: draw into a temporary folder and fail (exit 1) if the committed figures or the "
        "pages' figure blocks are out of date",
    )


def main(args) -> int:
    import matplotlib

    if args.check:
        problems, mode = check(args.out)
        for p in problems:
            print(p, file=sys.stderr)
        if not problems:
            print(f"figures up to date ({len(registry())} files, compared by {mode})")
        return 1 if problems else 0
    out = Path(args.out or default_dir())
    figures = registry()
    written = generate(out, figures)
    (out / "VERSION").write_text(_version_line(matplotlib.__version__) + "\n")
    print(f"wrote {len(written)} figures to {out}")
    if out.resolve() == default_dir().resolve():
        for page in update_pages(figures):
            print(f"updated {page.name}")
    return 0
