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
    """Issue 11: every page from rung 5 up embeds its measured H200 timeline (an H100's from rung 10 up, whose
    caption says so), and the PNG and the JSON it
    was drawn from are committed and agree (the JSON's rung number and name, a real device, events in every CTA:
    a timeline of the kernel a number had before the re-cut of the ladder does not count). A page of the re-cut's
    rungs (10 and up, made in a session in which no H200 could be started) may instead say "timeline not yet
    measured" with the command that measures it, and then no timeline of that number may be committed (the old
    kernels' were removed: none may stand in for the new one)."""
    root = figures.default_dir().parent.parent
    for r in rungs.RUNGS:
        if r.number < 5:
            continue
        name = f"rung{r.number:02d}"
        page = (root / r.page).read_text()
        if r.number >= 10 and "timeline not yet measured" in page.lower():
            assert f"python -m attnclimb trace {r.number}" in page, r.page
            assert f"timelines/{name}." not in page, r.page
            assert not list((figures.default_dir() / "timelines").glob(f"{name}.*")), f"stale {name} timeline"
            continue
        assert f"](../figures/timelines/{name}.png)" in page, r.page
        assert f"(../figures/timelines/{name}.json)" in page, r.page
        png = figures.default_dir() / "timelines" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        doc = timeline.load_trace(json.loads((png.with_suffix(".json")).read_text()))
        assert doc["rung"] == r.number, name
        # a Hopper card: the H200 of the README's table, or (rungs 10 and up, traced in a session that got no
        # H200) an H100 80GB, whose SMs are the same; the page then names the card it was measured on
        card = "H200" if "H200" in doc["device"] else "H100" if r.number >= 10 and "H100" in doc["device"] else None
        assert card, f"{name}.json measured on {doc['device']!r}"
        assert f"1x16x2048x2048, {card}" in page, f"{r.page}: the timeline's caption must name the {card}"
        # the kernel it measured: the re-cut of the ladder (059569f) gave rungs 10 and up new kernels
        assert doc.get("name") == r.name, f"{name}.json measured {doc.get('name')!r}, rung {r.number} is {r.name!r}"
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
    # #if / #elif / #else branches follow the variant's macros (the plain build's values by default)
    assert facts.need(13, "CONSUMER_REGS", "PRODUCER_REGS", "P_DOUBLE_BUFFER") == (240, 24, 1)
    three = rungs.get(13).long_kv[1]
    assert facts.need(13, "CONSUMER_REGS", "PRODUCER_REGS", "P_DOUBLE_BUFFER", **three) == (160, 32, 0)
    assert facts.need(10, "SMEM_EPILOGUE") == 1 and facts.need(10, "SMEM_EPILOGUE", head_dim=256) == 0
    assert facts._eval("A == 2 && !defined(B) || C", {"A": 2}, undefined=0) == 1
    assert facts._eval("A == 2", {}) is None


def test_rung13_and_16_figures_follow_rungs_py(tmp_path, monkeypatch):
    """Rung 13's register budget and rung 16's schedule follow BLOCK_N in rungs.py (and the kernels' constants)."""
    figs = [f for f in figures.registry() if f.filename in ("rung13-budget.svg", "rung16-schedule.svg")]
    assert len(figs) == 2
    for n in (12, 13, 16):
        monkeypatch.setitem(rungs.BY_NUMBER, n, dataclasses.replace(rungs.get(n), block_n=64, kv_box_rows=64))
    texts = []
    for path in figures.generate(tmp_path, figs):
        texts += figures.svg_structure(path.read_bytes())["texts"]
    assert "rung 12: 64-key tiles" in texts and "S: 32" in texts and "P: 16" in texts
    assert any("8 K/V tiles of 64 keys" in t for t in texts)


def test_late_rung_facts():
    assert [facts.has_turns(n) for n in range(9, 17)] == [False] * 7 + [True]  # only rung 16 takes turns
    tb = facts.turn_barriers(16)
    assert (tb["my_turn"], tb["other_turn"], tb["threads"]) == ((1, 2), (2, 1), 256)
    assert (tb["pre_arrive_wg"], tb["pre_arrive_bar"], tb["last_arrive_wg"], tb["turn_sites"]) == (1, 1, 0, 3)
    assert tb["skips_only_at_the_end"]  # the turns run on across the persistent CTA's work tiles
    ring = tb["rings"][3]  # head_dim 64 and the long-K/V tiles: three consumer warpgroups
    assert (ring["my_turn"], ring["other_turn"]) == ((1, 2, 3), (2, 3, 1))
    assert (ring["pre_arrive_wg"], ring["pre_arrive_bar"], ring["last_arrive_wgs"]) == (2, 1, (0, 1))
    with pytest.raises(ValueError, match="turns changed form"):
        facts.turn_barriers(15)
    assert facts.mbarrier_counts(10)["bar_q_empty"] == facts.need(10, "CONSUMER_WARPS")
    assert "bar_q_empty" not in facts.mbarrier_counts(9)
    assert sum(facts.static_mbarriers(10).values()) == 2 + 4 * rungs.get(10).stages
    assert all(rungs.get(n).persistent for n in range(10, 17)) and not rungs.get(9).persistent
    assert facts.ctas_per_sm(10) == 1
    assert facts.need(10, "S_TILES", "KV_STEPS", "O_TILES") == (16, 8, 16)  # 128-key tiles from rung 10 on
    three = rungs.get(12).long_kv[1]
    assert facts.need(12, "S_TILES", "KV_STEPS", "CONSUMER_REGS", **three) == (10, 5, 160)


@pytest.mark.parametrize("wgs", [2, 3])
@pytest.mark.parametrize("n_tiles", [1, 2, 4])
def test_pingpong_model_takes_turns(n_tiles, wgs):
    """The toy model runs rung 16's order of operations to the end: every bar.sync is matched by one
    arrival, and the warpgroups' wgmma groups take the tensor cores in turn (0, 1, ..., round the ring)."""
    model = late.simulate([late.consumer_program(16, w, n_tiles, loads=False, wgs=wgs) for w in range(wgs)])
    ops = [(op, bar) for _, op, bar, _ in model["events"]]
    for bar in range(1, wgs + 1):
        assert ops.count(("sync", bar)) == ops.count(("arrive", bar)) == n_tiles + 1
    lanes = [f"tc{w}" for w in range(wgs)]
    owners = [w for _, w, _ in sorted((t0, int(k[-1]), s) for k in lanes for s, t0, _ in model["lanes"][k])]
    turns = [w for w, _ in itertools.groupby(owners)]
    assert turns == list(range(wgs)) * (n_tiles + 1)


@pytest.mark.parametrize("number", range(10, 16))
def test_rungs_below_16_take_no_turns_in_the_model(number):
    prog = late.consumer_program(number, 1, 3, 2)
    assert not any(op in ("sync", "arrive") for op, _ in prog)
    assert ("release", "Q0") in prog  # the persistent grid's q_empty


def test_persistent_model_loads_the_next_work_tile_early():
    """Rung 10 against rung 9: one persistent CTA loads the next work tile's Q under the last P·V and the
    epilogue of the current one (q_empty), and ends before two CTAs one after the other would."""
    n = 4
    one = late.simulate([late.consumer_program(9, w, n) for w in (0, 1)], late.producer_program(9, n))
    two = late.simulate([late.consumer_program(10, w, n, 2) for w in (0, 1)], late.producer_program(10, n, 2))
    issued, _, _ = two["loads"]["Q1"]
    assert issued == two["loads"]["Q0"][2]  # the next Q waits for q_empty
    epilogue = [t0 for s, t0, _ in two["lanes"]["wg1"] if s == ("alu", "epilogue")]
    assert issued < epilogue[0]  # ... and loads under the last P·V and the epilogue
    assert two["end"] < 2 * one["end"]
    with pytest.raises(ValueError, match="one work tile per CTA"):
        late.consumer_program(9, 0, n, 2)


# ------------------------------------------------------------------ the machine-code counts of rungs 10-15


def _nvrtc():
    from attnclimb.runtime.compiler import nvrtc_version

    try:
        return tuple(nvrtc_version()[:2])
    except Exception:  # no NVRTC library
        return None


@pytest.fixture(scope="module")
def late_sass():
    """The SASS of rungs 9-15's plain builds (``cuobjdump -sass``), compiled with the NVRTC at hand."""
    from attnclimb.runtime.compiler import compile_rung
    from attnclimb.runtime.sass import find_cuobjdump, sass

    if find_cuobjdump() is None or _nvrtc() is None:
        pytest.skip("needs NVRTC and cuobjdump (pip install nvidia-cuda-nvrtc nvidia-cuda-cuobjdump)")
    return {n: sass(compile_rung(rungs.get(n), "sm_90a").cubin) for n in range(9, 16)}


def test_late_figure_counts_match_a_compile(late_sass):
    """The counts that the figures of rungs 10-15 quote (figures/late.py: EPILOGUE_SASS, LOOP_SASS, S_GROUP_SASS,
    KERNEL_SASS, SOFTMAX_PATH_CYCLES, THREE_WG_TWO_P_SPILL) are those of NVRTC 13.0 (the device's toolchain):
    recounted here from a fresh compile, so that a changed kernel shows up as a stale figure. Another NVRTC
    schedules the code a little differently; test_late_figure_claims_hold_for_any_nvrtc checks what the figures
    say with it."""
    if _nvrtc() != (13, 0):
        pytest.skip(f"the figures quote NVRTC 13.0's machine code, this is NVRTC {_nvrtc()}")
    for n, want in late.EPILOGUE_SASS.items():
        got = late.epilogue_sass(late_sass[n])
        assert got["STG.E"] == late.EPILOGUE_SASS[9]["STG.E"], n  # rung 10: its 4-byte fallback copy
        for k, v in want.items():
            assert got[k] >= v if k == "LDS.128" else got[k] == v, (n, k, got)  # (row loads: one per copy)
    for n, want in late.LOOP_SASS.items():
        got = late.loop_sass(late_sass[n])
        assert {k: got.get(k, 0) for k in want} == want, n
    for n, want in late.S_GROUP_SASS.items():
        groups = late.s_group_sass(late_sass[n])
        assert len(groups) == 3 and groups[1] == want, (n, groups)  # the peeled tile's, then the loop's two
        assert late.kernel_sass(late_sass[n]) == late.KERNEL_SASS[n], n
    for n, want in late.SOFTMAX_PATH_CYCLES.items():
        assert late.softmax_path_cycles(late_sass[n]) == want, n
    spill = late.three_warpgroup_two_p_spill()
    assert spill is None or spill == late.THREE_WG_TWO_P_SPILL  # (None: an NVRTC whose log has no ptxas report)


def _ops_before_first_ex2(text):
    path = [op for _, _, op, _, _ in late.softmax_path(text)]
    return path[: path.index("MUFU.EX2")], path


def test_late_figure_claims_hold_for_any_nvrtc(late_sass):
    """What the figures of rungs 10-15 say about the machine code, with whatever NVRTC is installed."""
    from collections import Counter

    e9, e10 = (late.epilogue_sass(late_sass[n]) for n in (9, 10))
    assert e9["STG.E"] == 32 and not e9["STG.E.128"] and not e9["STSM.16.M88.4"]  # rung 10's figures
    assert (e10["STSM.16.M88.4"], e10["STG.E.128"]) == (8, 8) and e10["LDS.128"] >= 8
    l10, l11 = (late.loop_sass(late_sass[n]) for n in (10, 11))  # rung 11's budget
    assert l11["total"] < l10["total"]
    assert l11.get("ULOP3", 0) + l11.get("USHF", 0) < (l10["ULOP3"] + l10["USHF"]) / 4
    g13, g14 = (late.s_group_sass(late_sass[n])[1] for n in (13, 14))  # rung 14's figures
    assert g13["HGMMA"] == g14["HGMMA"] == 8
    assert g13["R2UR"] >= 2 * (g13["HGMMA"] - 1) and g13["IADD3"] and g13["IMAD"]
    assert not any(g14.get(k) for k in ("R2UR", "IADD3", "IMAD")) and g14["UIADD3"]
    assert late.kernel_sass(late_sass[14])["R2UR"] < late.kernel_sass(late_sass[13])["R2UR"] / 4
    c14, c15 = (late.softmax_path_cycles(late_sass[n]) for n in (14, 15))  # rung 15's path
    assert c14["vote"] < c14["first_ex2"] and c15["first_ex2"] < c15["vote"] and c15["total"] < c14["total"]
    # rung 12's path: the opcodes each step names, on the way from S to the first exponential
    for n, steps in late.PATH_STEPS.items():
        before, path = _ops_before_first_ex2(late_sass[n])
        scores = 4 * facts.need(n, "S_TILES")
        assert Counter(path)["FMNMX"] >= scores and Counter(path)["MUFU.EX2"] >= scores, n
        named = {w for _, what in steps[1:-1] for w in re.findall(r"[A-Z][A-Z0-9.]+", what)}
        for op in named:
            assert any(o == op or o.startswith(op + ".") for o in before), (n, op, before)
    before11, path11 = _ops_before_first_ex2(late_sass[11])
    before12, path12 = _ops_before_first_ex2(late_sass[12])
    # rung 11: two rows' quad max, 2 shuffles each (the second row's may follow the first row's exponentials)
    assert path11.count("SHFL.BFLY") == 4 and "SHFL.BFLY" in before11 and "VOTE.ALL" not in path11
    assert "SHFL.BFLY" not in path12 and before12.count("VOTE.ALL") == 1
    assert sum(o.startswith("FSETP") for o in before12) == 2
    # rung 13's budget: the second P buffer spills with three consumer warpgroups, the built variant does not
    from attnclimb.runtime.compiler import compile_rung

    built = dataclasses.replace(rungs.get(13), **rungs.get(13).long_kv[1])
    assert compile_rung(late.three_warpgroup_two_p_variant(), "sm_90a").resources[0].spill_bytes > 0
    assert compile_rung(built, "sm_90a").resources[0].spill_bytes == 0


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
