"""The rung pages' diagrams (``python -m attnclimb figures``): committed files up to date, pages embedding
them, numbers read from rungs.py and the kernels, and the Gantt chart of a (synthetic) trace."""

import dataclasses
import itertools
import json
import re

import pytest

pytest.importorskip("matplotlib")

from attnclimb import figures, rungs
from attnclimb.__main__ import main
from attnclimb.figures import facts, late, timeline


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


def test_rung_pages_from_5_up_show_a_measured_timeline():
    """Issue 11: every page from rung 5 up embeds its measured H200 timeline, and the PNG and the JSON it
    was drawn from are committed and agree (the JSON's rung, a real device, events in every CTA). The top rung
    alone may still say "timeline not yet measured" (a rung made without a GPU, rung 13: the next GPU session
    runs `python -m attnclimb trace`)."""
    root = figures.default_dir().parent.parent
    for r in rungs.RUNGS:
        if r.number < 5:
            continue
        name = f"rung{r.number:02d}"
        page = (root / r.page).read_text()
        if r is rungs.TOP and "timeline not yet measured" in page.lower():
            assert f"python -m attnclimb trace {r.number}" in page, r.page
            continue
        assert f"](../figures/timelines/{name}.png)" in page, r.page
        assert f"(../figures/timelines/{name}.json)" in page, r.page
        png = figures.default_dir() / "timelines" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        doc = timeline.load_trace(json.loads((png.with_suffix(".json")).read_text()))
        assert doc["rung"] == r.number and "H200" in doc["device"], name
        assert all(wg["events"] for c in doc["ctas"] for wg in c["warpgroups"]), name


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


def test_rung12_figures_follow_rungs_py(tmp_path, monkeypatch):
    """The tile counts and the budgets of rung 12's figures follow its BLOCK_N in rungs.py."""
    figs = [f for f in figures.registry() if f.rung == 12]
    wider = dataclasses.replace(rungs.get(12), block_n=160, kv_box_rows=160)
    monkeypatch.setitem(rungs.BY_NUMBER, 12, wider)
    texts = []
    for path in figures.generate(tmp_path, figs):
        texts += figures.svg_structure(path.read_bytes())["texts"]
    assert "tiles of 160" in texts
    assert any("8 × m64n160k16" in t for t in texts)  # the S wgmma of a tile, N = BLOCK_N
    assert f"{wider.smem_bytes:,} B".replace(",", " ") in texts
    assert any(t.startswith("S: 80") for t in texts)  # S_TILES · 4 = 160 / 8 · 4 fp32 per thread


def test_late_rung_facts():
    tb = facts.turn_barriers(10)
    assert (tb["my_turn"], tb["other_turn"], tb["threads"]) == ((1, 2), (2, 1), 256)
    assert (tb["pre_arrive_wg"], tb["pre_arrive_bar"], tb["last_arrive_wg"], tb["turn_sites"]) == (1, 1, 0, 3)
    assert not tb["skips_only_at_the_end"] and facts.turn_barriers(11)["skips_only_at_the_end"]
    assert facts.mbarrier_counts(11)["bar_q_empty"] == facts.need(11, "CONSUMER_WARPS")
    assert "bar_q_empty" not in facts.mbarrier_counts(10)
    assert sum(facts.static_mbarriers(12).values()) == 2 + 4 * rungs.get(12).stages
    assert facts.ctas_per_sm(11) == 1
    narrow = facts.constants(12, block_n=128, kv_box_rows=128)
    assert narrow["S_TILES"] == facts.need(11, "S_TILES") and narrow["SMEM_BYTES"] == rungs.get(11).smem_bytes
    assert facts.need(12, "S_TILES", "KV_STEPS", "O_TILES") == (22, 11, 16)


@pytest.mark.parametrize("n_tiles", [1, 2, 4])
def test_pingpong_model_takes_turns(n_tiles):
    """The toy model runs the kernel's order of operations to the end: every bar.sync is matched by one
    arrival, and the two warpgroups' wgmma groups alternate on the tensor cores."""
    model = late.simulate([late.consumer_program(10, w, n_tiles, loads=False) for w in (0, 1)])
    ops = [(op, bar) for _, op, bar, _ in model["events"]]
    for bar in (1, 2):
        assert ops.count(("sync", bar)) == ops.count(("arrive", bar)) == n_tiles + 1
    owners = [w for _, w, _ in sorted((t0, int(k[-1]), s) for k in ("tc0", "tc1") for s, t0, _ in model["lanes"][k])]
    turns = [w for w, _ in itertools.groupby(owners)]
    assert turns == [0, 1] * (n_tiles + 1)


def test_persistent_model_loads_the_next_work_tile_early():
    n = 4
    one = late.simulate([late.consumer_program(10, w, n) for w in (0, 1)], late.producer_program(10, n))
    two = late.simulate([late.consumer_program(11, w, n, 2) for w in (0, 1)], late.producer_program(11, n, 2))
    issued, _, _ = two["loads"]["Q1"]
    assert issued == two["loads"]["Q0"][2]  # the next Q waits for q_empty
    epilogue = [t0 for s, t0, _ in two["lanes"]["wg1"] if s == ("alu", "epilogue")]
    assert issued < epilogue[0]  # ... and loads under the last P·V and the epilogue
    assert two["end"] < 2 * one["end"]
    with pytest.raises(ValueError, match="one work tile per CTA"):
        late.consumer_program(10, 0, n, 2)


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
