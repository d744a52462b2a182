"""The rung pages' diagrams (``python -m attnclimb figures``): committed files up to date, pages embedding
them, numbers read from rungs.py and the kernels, and the Gantt chart of a (synthetic) trace."""

import dataclasses
import json
import re

import pytest

pytest.importorskip("matplotlib")

from attnclimb import figures, rungs
from attnclimb.__main__ import main
from attnclimb.figures import facts, timeline


def test_committed_figures_and_pages_are_up_to_date():
    """The CI check: a fresh drawing equals docs/figures (bytes with the matplotlib release that drew them,
    texts and shapes with another) and every page's figure block is current."""
    problems, mode = figures.check()
    assert not problems, "\n".join(problems) + "\nrun: python -m attnclimb figures"
    assert mode in ("bytes", "structure")


def test_every_rung_page_shows_at_least_two_figures():
    reg = figures.registry()
    assert len({f.filename for f in reg}) == len(reg)
    for r in rungs.RUNGS:
        mine = [f for f in reg if f.rung == r.number]
        assert len(mine) >= 2, r.key
        page = (figures.default_dir().parent.parent / r.page).read_text()
        for f in mine:
            assert f"](../figures/{f.filename})" in page, (r.page, f.filename)
            assert (figures.default_dir() / f.filename).is_file()


def test_svg_keeps_text_as_text(tmp_path):
    fig = next(f for f in figures.registry() if f.filename == "rung05-swizzle128.svg")
    (path,) = figures.generate(tmp_path, [fig])
    svg = path.read_text()
    assert "<text" in svg and "Rung 5" in svg
    assert "DejaVuSans-" not in svg  # no glyph outlines: the text is real text
    assert "<dc:date>" not in svg and "Matplotlib v" not in svg  # nothing that changes from run to run


def test_figures_follow_rungs_py(tmp_path, monkeypatch):
    """Tile sizes are read from rungs.py, not typed into the drawing code."""
    fig = next(f for f in figures.registry() if f.filename == "rung08-ring.svg")
    (before,) = figures.generate(tmp_path / "a", [fig])
    wider = dataclasses.replace(rungs.get(8), block_n=192, kv_box_rows=192)
    monkeypatch.setitem(rungs.BY_NUMBER, 8, wider)
    (after,) = figures.generate(tmp_path / "b", [fig])
    texts_before = figures.svg_structure(before.read_bytes())["texts"]
    texts_after = figures.svg_structure(after.read_bytes())["texts"]
    assert any("128-key" in t for t in texts_before)
    assert any("192-key" in t for t in texts_after)
    assert any(f"{wider.smem_bytes:,}".replace(",", " ") in t for t in texts_after)


def test_kernel_constants():
    c = facts.constants(7)
    assert c["BLOCK_N"] == rungs.get(7).block_n and c["NUM_STAGES"] == rungs.get(7).stages
    assert c["PRODUCER_REGS"] * 32 * c["PRODUCER_WARPS"] + c["CONSUMER_REGS"] * 32 * c["CONSUMER_WARPS"] <= 65536
    assert facts.need(2, "WARP_ROWS") * facts.need(2, "NUM_WARPS") == rungs.get(2).block_m
    assert facts.need(5, "KV_TILE_BYTES") == 2 * rungs.get(5).block_n * 128
    assert facts.registers_at_launch(384) == 168
    with pytest.raises(KeyError, match="NO_SUCH_CONSTANT"):
        facts.need(3, "NO_SUCH_CONSTANT")
    d = facts.descriptor_fields()
    assert (d["lbo_shift"], d["sbo_shift"], d["swizzle_shift"]) == (16, 32, 62)
    assert d["kmajor_sbo"] == d["mnmajor_sbo"] == 1024


def test_svg_structure_ignores_coordinates_not_labels():
    svg = (
        b'<svg><path d="M 0 0 L 1 1" style="fill: #56b4e9"/><text x="1" y="2">S = Q</text>'
        b'<path d="M 0 0" style="fill: #009e73; stroke: #333333"/></svg>'
    )
    moved = svg.replace(b"M 0 0 L 1 1", b"M 3 3 L 4 5").replace(b'x="1"', b'x="7"')
    relabelled = svg.replace(b"S = Q", b"S = K")
    recoloured = svg.replace(b"#009e73", b"#e69f00")
    base = figures.svg_structure(svg)
    assert figures.svg_structure(moved) == base
    assert figures.svg_structure(relabelled) != base
    assert figures.svg_structure(recoloured) != base


def test_compare_falls_back_to_structure_for_another_matplotlib(tmp_path):
    fig = next(f for f in figures.registry() if f.filename == "rung04-fold.svg")
    fresh, committed = tmp_path / "fresh", tmp_path / "committed"
    figures.generate(fresh, [fig])
    figures.generate(committed, [fig])
    (committed / "VERSION").write_text("matplotlib 0.0.0\n")
    svg = committed / fig.filename
    svg.write_text(svg.read_text().replace('viewBox="', 'data-x="1" viewBox="'))  # not byte-equal any more
    assert figures.compare(fresh, committed, [fig]) == ([], "structure")
    svg.write_text(svg.read_text().replace("MUFU.EX2", "MUFU.RCP"))
    problems, mode = figures.compare(fresh, committed, [fig])
    assert mode == "structure" and problems and "rung04-fold.svg" in problems[0]
    # with the same release it is bytes, and the harmless edit above is caught too
    import matplotlib

    (committed / "VERSION").write_text(f"matplotlib {matplotlib.__version__}\n")
    problems, mode = figures.compare(fresh, committed, [fig])
    assert mode == "bytes" and problems


def test_page_block_and_markers():
    block = figures.page_block(5)
    assert block.count("![") == len([f for f in figures.registry() if f.rung == 5])
    assert "*Figure 5.1:" in block
    text = f"intro\n{figures.PAGE_BEGIN}\nold\n{figures.PAGE_END}\ntail\n"
    new = figures.replace_block(text, block)
    assert new.startswith("intro\n" + figures.PAGE_BEGIN) and new.endswith(figures.PAGE_END + "\ntail\n")
    assert "old" not in new
    assert figures.replace_block("no markers", block) is None


def test_cli_out_elsewhere_leaves_the_pages_alone(tmp_path, monkeypatch, capsys):
    reg = figures.registry()[:2]
    monkeypatch.setattr(figures, "registry", lambda: reg)
    pages = {p: p.read_text() for p in figures.page_paths().values()}
    assert main(["figures", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f.filename for f in reg] + ["VERSION"])
    assert all(p.read_text() == text for p, text in pages.items())
    assert "wrote 2 figures" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------- timelines


def test_timeline_from_synthetic_json(tmp_path):
    doc = timeline.synthetic_trace(rung=8, ctas=2, tiles=3)
    src = tmp_path / "trace.json"
    src.write_text(json.dumps(doc))
    out = timeline.draw_timeline(src, tmp_path / "rung08-timeline.svg")
    svg = out.read_text()
    for lane in ("CTA 0, SM 0 · WG 0", "CTA 1, SM 2 · WG 2"):
        assert lane in svg
    for legend in ("wait", "softmax", "epilogue"):
        assert re.search(rf">\s*{legend}\s*<", svg)
    assert "Rung 8: measured phases per warpgroup" in svg
    again = timeline.draw_timeline(doc, tmp_path / "again.svg")
    assert again.read_bytes() == out.read_bytes()  # deterministic, from a dict or a file
    png = timeline.draw_timeline(doc, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "doc, match",
    [
        ({"ctas": []}, "rung"),
        ({"rung": 9, "ctas": []}, "no CTAs"),
        ({"rung": 9, "ctas": [{"cta": 0, "warpgroups": [{"wg": 1, "events": [{"phase": "gemm"}]}]}]}, "phase"),
        (
            {"rung": 9, "ctas": [{"cta": 0, "warpgroups": [{"wg": 1, "events": [{"phase": "S", "t0": 5, "t1": 1}]}]}]},
            "t0 <= t1",
        ),
        ({"rung": 9, "ctas": [{"cta": 0, "warpgroups": [{"events": []}]}]}, "warpgroup"),
    ],
)
def test_timeline_rejects_malformed_traces(doc, match):
    with pytest.raises(ValueError, match=match):
        timeline.load_trace(doc)
