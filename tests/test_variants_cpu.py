"""scripts/make_variants.py: the A/B variants of the top rung are generated from its current source, so a change
that the generator no longer recognises fails here (not on the GPU), and each variant compiles for sm_90a without
spills."""

import re
from collections import Counter
from pathlib import Path

import pytest
from scripts_loader import load_script

from attnclimb import rungs
from attnclimb.runtime.compiler import SERIALIZED_WGMMA, compile_rung, compile_source
from attnclimb.runtime.launch import feature_variant
from attnclimb.runtime.sass import find_cuobjdump, sass

ROOT = Path(__file__).resolve().parents[1]
TOP = rungs.TOP
VARIANTS = {
    "base",
    "noload",
    "noexp",
    "nomax",
    "nopptop",
    "sleeptop",
    "treetop",
    "hint",
    "hintq",
    "wgarrive18",
    "vfirst18",
    "sonlytop",
    "headpairs",
    "l2pf",
    "hgroup",
    "dynsched",
    "hwsched",
}


def _load():
    return load_script("make_variants")


def _no_spills(c):
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
    assert SERIALIZED_WGMMA not in c.log, c.log  # ptxas C7513, C7515, ...


def test_variants_are_generated_for_the_top_rung(tmp_path):
    """Every variant is one folder with the top rung's file (and its own headers), ``base`` is that source as it
    is (for the ``Rung``-field variants), every other one differs from it; the variants of the rungs that the
    re-cut removed or renumbered are no longer written."""
    _load().main(str(tmp_path))
    assert {d.name for d in tmp_path.iterdir()} == VARIANTS
    top = TOP.source.read_text()
    for name in VARIANTS:
        files = {f.name for f in (tmp_path / name).iterdir()}
        assert TOP.source.name in files and all(f == TOP.source.name or f.endswith(".cuh") for f in files), files
        assert ((tmp_path / name / TOP.source.name).read_text() == top) == (name == "base"), name


def test_generator_refuses_a_source_it_does_not_recognise():
    mod = _load()
    with pytest.raises(SystemExit, match="make_variants"):
        mod.nopp("// a kernel without turns\n")


def _build(name: str):
    """The top rung's build that the variant tests compile under ``name`` (each variant test names its own set)."""
    long_kv = TOP.long_kv[0]
    return {
        "plain": TOP,
        "long-kv": feature_variant(TOP, False, False, False, seqlen_k=long_kv),
        "long-kv-strided": feature_variant(TOP, False, False, False, True, seqlen_k=long_kv),
        "causal": feature_variant(TOP, True, False, False),
        "causal-short": feature_variant(TOP, True, False, False, seqlen_k=1024),
        "causal-gqa-lse-strided": feature_variant(TOP, True, True, True, True),
        "head_dim-64": feature_variant(TOP, False, False, False, head_dim=64),
        "head_dim-64-causal": feature_variant(TOP, True, False, False, head_dim=64),
        "head_dim-256-causal": feature_variant(TOP, True, False, False, head_dim=256),
        "fp16": feature_variant(TOP, False, False, False, fp16=True),
        "all-fp16": feature_variant(TOP, True, True, True, True, fp16=True),
        "fp16-long-kv-strided": feature_variant(TOP, False, False, False, True, seqlen_k=long_kv, fp16=True),
    }[name]


def _inlined(d, name=TOP.source.name):
    """The variant ``name`` in folder ``d`` with its own headers inlined, each once, also where one includes another
    (the package's includes resolve in the kernels)."""
    src, headers, done = (d / name).read_text(), {h.name: h for h in d.glob("*.cuh")}, set()
    while inc := next((n for n in headers if f'#include "{n}"' in src), None):
        body = "" if inc in done else headers[inc].read_text().replace("#pragma once\n", "")
        src = src.replace(f'#include "{inc}"', body, 1)
        done.add(inc)
    return src


def test_diagnostics_rewrite_the_top_rung(tmp_path):
    """noload, noexp and nomax are timing diagnostics of the top rung: its file name, one rewrite each."""
    _load().main(str(tmp_path))
    top = TOP.source.read_text()
    noexp = (tmp_path / "noexp" / TOP.source.name).read_text()
    noload = (tmp_path / "noload" / TOP.source.name).read_text()
    assert noexp != top and "diagnostic: FFMA only" in noexp
    assert noload != top and noload.count("if (kv < NUM_STAGES) load_") == 2
    nomax = (tmp_path / "nomax" / TOP.source.name).read_text()
    assert nomax != top and "(first ? S_TILES : 1)" in nomax


@pytest.mark.parametrize("name", ["noload", "noexp", "nomax"])
def test_diagnostics_compile_without_spills(tmp_path, name):
    _load().main(str(tmp_path))
    c = compile_source(TOP, (tmp_path / name / TOP.source.name).read_text())
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log


def test_wgarrive18_rewrites_the_empty_barriers(tmp_path):
    """wgarrive18 (measured on the staged epilogue's rung in the seventh session and on old rung 17 before it,
    not kept): the Q, K and V empty barriers expect one arrival per consumer warpgroup, and every arrival on them
    comes from the first warp of a warpgroup; nothing else changes."""
    _load().main(str(tmp_path))
    top = TOP.source.read_text()
    var = (tmp_path / "wgarrive18" / TOP.source.name).read_text()
    assert var.count(", CONSUMER_WGS);") == 3 and top.count("_empty[st], CONSUMER_WARPS);") == 2
    assert "_empty, CONSUMER_WARPS);" not in var and "_empty[st], CONSUMER_WARPS);" not in var
    arrivals = [ln for ln in var.splitlines() if "hop::mbar_arrive(&bar_" in ln and "_empty" in ln]
    assert arrivals and all("cw % 4 == 0 && lane == 0" in ln for ln in arrivals)
    assert len(top.splitlines()) == len(var.splitlines())


def test_vfirst18_waits_for_v_before_the_turn(tmp_path):
    """vfirst18: in the steady loop the previous tile's V is waited for right after K, before the turn's named
    barrier, instead of between the S and the P·V wgmmas of the turn; the same lines otherwise, less the trace
    marks that split S around the V wait."""
    _load().main(str(tmp_path))
    src = TOP.source.read_text()
    var = (tmp_path / "vfirst18" / TOP.source.name).read_text()
    dropped = Counter({"            TRACE_END(S);": 1, "            TRACE_BEGIN(S);": 1})
    assert Counter(src.splitlines()) - Counter(var.splitlines()) == dropped
    assert not Counter(var.splitlines()) - Counter(src.splitlines())
    lines = [ln.strip() for ln in var.splitlines()]
    wait_v = lines.index("hop::mbar_wait(&bar_v[pv_slot], pv_phase);")
    assert lines[wait_v - 3 : wait_v - 1] == ["hop::mbar_wait(&bar_k[slot], ring.phase);", "TRACE_END(WAIT_K);"]
    assert wait_v < next(i for i in range(wait_v, len(lines)) if "named_bar_sync(my_turn" in lines[i])


@pytest.mark.parametrize(("name", "head_dim"), [("wgarrive18", 128), ("vfirst18", 128), ("vfirst18", 64)])
def test_top_rung_arrival_variants_build_without_spills(tmp_path, name, head_dim):
    """wgarrive18 and vfirst18 build without spills or serialised wgmmas with two (head_dim 128) and, for vfirst18,
    three (head_dim 64) consumer warpgroups. wgarrive on the staged epilogue's rung spilled 8 bytes at head_dim 64
    (160 registers; NVRTC 13.0), so it was timed at head_dim 128 only (its long-K/V three-warpgroup build does not
    spill)."""
    _load().main(str(tmp_path))
    var = (tmp_path / name / TOP.source.name).read_text()
    _no_spills(compile_source(feature_variant(TOP, False, False, False, head_dim=head_dim), var))


def test_top_rung_variants_are_generated(tmp_path):
    """The twelfth session's variants of the top rung: ``nopptop`` (no turns), ``hint`` (L2 evict_last on K/V,
    evict_first on Q) and ``hintq`` (evict_first on Q only), each loading its tiles as named."""
    _load().main(str(tmp_path))
    name = TOP.source.name
    nopp = (tmp_path / "nopptop" / name).read_text()
    assert "named_bar_sync" in TOP.source.read_text() and "named_bar_" not in nopp
    hint, hintq = ((tmp_path / v / name).read_text() for v in ("hint", "hintq"))
    assert len(re.findall(r"l2h::tile(?:_4d)?\(s_[kv] \+ .*?pol_kv\);", hint, flags=re.S)) == 4
    assert len(re.findall(r"l2h::tile(?:_4d)?\(s_q, .*?pol_q\);", hint, flags=re.S)) == 2
    assert "hop::tma_load_tile" not in hint and "pol_kv = l2h::evict_last()" in hint
    assert len(re.findall(r"l2h::tile(?:_4d)?\(s_q, .*?pol_q\);", hintq, flags=re.S)) == 2
    assert hintq.count("hop::tma_load_tile") == 4 and "pol_kv = 0" in hintq


@pytest.mark.parametrize("name", ["nopptop", "hint", "hintq"])
@pytest.mark.parametrize("build", ["plain", "long-kv", "causal-gqa-lse-strided"])
def test_top_rung_variants_build_without_spills(tmp_path, name, build):
    """Each of them compiles for sm_90a without spills where the top rung does; the hints show up in SASS as
    the policy operand of UTMALDG (``desc[UR..]``)."""
    _load().main(str(tmp_path))
    r = _build(build)
    c = compile_source(r, _inlined(tmp_path / name, TOP.source.name))
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
    if find_cuobjdump() is not None:
        loads = [ln for ln in sass(c.cubin).splitlines() if "UTMALDG" in ln]
        hinted = sum("desc[" in ln for ln in loads)  # hintq: the Q tile's boxes only
        assert {"nopptop": hinted == 0, "hint": hinted == len(loads), "hintq": 0 < hinted < len(loads)}[name], loads


def test_nopptop_drops_every_turn_and_builds_without_spills(tmp_path):
    """``nopptop``: the top rung without its turns. Its source had named barriers and has none left; the lines that
    go are the turn lines alone, counted with their repeats (an ``if`` line only as the head of a two-line
    conditional arrival); the build and its long-K/V tiles compile for sm_90a without spills or serialized wgmmas,
    and without the turns' 256-thread BAR.SYNC / BAR.ARV that the top rung's SASS has."""
    _load().main(str(tmp_path))
    src = TOP.source.read_text()
    out = (tmp_path / "nopptop" / TOP.source.name).read_text()
    assert "named_bar_sync(my_turn" in src and "named_bar_" not in out
    gone = Counter(src.splitlines()) - Counter(out.splitlines())
    lines = src.splitlines()
    for ln in gone:
        if "TURN_THREADS" in ln:
            continue
        heads = [k for k, x in enumerate(lines) if x == ln]
        assert re.fullmatch(r"\s*if \(.*", ln) and all("named_bar_arrive(other_turn" in lines[k + 1] for k in heads), ln
    assert sum(gone.values()) == len(src.splitlines()) - len(out.splitlines())
    builds = [TOP] + ([feature_variant(TOP, False, False, False, seqlen_k=TOP.long_kv[0])] if TOP.long_kv else [])
    turns = re.compile(r"\bBAR\.(?:SYNC\.DEFER_BLOCKING|ARV) [^;]*, 0x100\b")  # both warpgroups' 256 threads
    for b in builds:
        c = compile_source(b, out)
        _no_spills(c)
        if find_cuobjdump() is not None and b is TOP:
            assert any(turns.search(ln) for ln in sass(compile_rung(TOP).cubin).splitlines())
            assert not [ln for ln in sass(c.cubin).splitlines() if turns.search(ln)]


def test_sleeptop_and_treetop_rewrite_the_top_rung(tmp_path):
    """The thirteenth session's variants of the top rung: ``sleeptop`` waits for free Q, K and V slots with a
    suspend hint (and nothing else), ``treetop`` keeps four chains per row for the tile max and the softmax's row
    sums (not for the exponentials-first loop) and joins them before each return."""
    _load().main(str(tmp_path))
    name = TOP.source.name
    top = TOP.source.read_text()
    sleep = (tmp_path / "sleeptop" / name).read_text()
    assert sleep.count("mbar_wait_sleep(&bar_") == 3 and "mbar_wait_sleep(&bar_k[" not in sleep
    assert sleep.count("hop::mbar_wait(") == top.count("hop::mbar_wait(") - 3
    tree = (tmp_path / "treetop" / name).read_text()
    assert tree.count("ps[e >> 1][j % 4] += s[j][e];") == 2 and "row_sum[e >> 1] += s[j][e];" not in tree
    assert tree.count("row_sum[r] += (ps[r][0] + ps[r][1]) + (ps[r][2] + ps[r][3]);") == 2
    assert "tm[0][j % 4] = fmaxf(tm[0][j % 4]" in tree and "tile_max[0] = fmaxf(tile_max[0]" not in tree
    assert "row_sum[e >> 1] += lo[e];" in tree  # the exponentials-first loop as it was


@pytest.mark.parametrize("name", ["sleeptop", "treetop"])
@pytest.mark.parametrize("build", ["plain", "long-kv", "head_dim-64-causal", "causal-gqa-lse-strided", "fp16"])
def test_sleeptop_and_treetop_build_without_spills(tmp_path, name, build):
    _load().main(str(tmp_path))
    r = _build(build)
    c = compile_source(r, _inlined(tmp_path / name, TOP.source.name))
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log


@pytest.mark.parametrize("build", ["plain", "long-kv"])
def test_sonlytop_moves_the_loop_arrival_after_issuing_s(tmp_path, build):
    """The sixteenth session's turn placement on the top rung (old rung 10's page, "Revisited"): ``sonlytop`` keeps
    every line of the rung and the same count of named-barrier calls, moving only the loop's arrival right after
    issuing S; it builds without spills or serialised wgmmas, with the three-warpgroup long-K/V tiles too."""
    _load().main(str(tmp_path))
    src, var = TOP.source.read_text(), (tmp_path / "sonlytop" / TOP.source.name).read_text()
    assert var != src and Counter(src.splitlines()) == Counter(var.splitlines())
    assert var.count("named_bar_arrive(") == src.count("named_bar_arrive(")
    lines = var.splitlines()
    loop_arrive = [i for i, ln in enumerate(lines) if ln.strip() == "hop::named_bar_arrive(other_turn, TURN_THREADS);"]
    issue = [i for i, ln in enumerate(lines) if ln.strip() == "issue_qk(slot);"]
    assert any(i + 1 in loop_arrive for i in issue)
    b = feature_variant(TOP, False, False, False, seqlen_k=TOP.long_kv[0]) if build == "long-kv" else TOP
    _no_spills(compile_source(b, var))


def _order_model():
    return load_script("causal_order_model")


ORDER_CASES = [  # (heads = batch·heads, m-blocks, grid): the bench's causal shapes and small odd ones
    (64, 43, 132),
    (128, 22, 132),
    (32, 86, 132),
    (32, 64, 132),
    (16, 128, 132),
    (5, 9, 4),
    (7, 3, 5),
    (3, 1, 2),
    (9, 7, 13),
]


def _tail_by_scan(model, work, grid, heads, nmb, tail_rounds):
    """The tail of the headpairs order by walking the m-blocks from the heaviest, counting each one's tiles left:
    the definition that the closed form of causal_order.cuh (and the model's mirror) must reproduce."""
    half = nmb // 2
    rounds = model.head_pair_rounds(heads, nmb, grid, tail_rounds)
    w0 = 2 * rounds * grid
    u = model.snake(work - w0, grid, heads * nmb - w0)
    h0, j0 = divmod(rounds * grid, half) if half else (heads, 0)
    for mb in range(nmb - 1, -1, -1):
        j, middle = min(mb, nmb - 1 - mb), nmb & 1 and mb == half
        left = list(range(heads)) if middle else [h for h in range(h0, heads) if h > h0 or j >= j0]
        if u < len(left):
            return left[u], mb
        u -= len(left)
    raise AssertionError("past the last tile")


def test_headpairs_closed_form_equals_the_scan():
    model = _order_model()
    for heads in range(1, 10):
        for nmb in range(1, 10):
            for grid in (1, 2, 3, 5, 8, 13):
                for tail in (0, 1, 2, 4):
                    w0 = 2 * model.head_pair_rounds(heads, nmb, grid, tail) * grid
                    for w in range(w0, heads * nmb):
                        want = _tail_by_scan(model, w, grid, heads, nmb, tail)
                        assert model.head_pairs_then_tail(w, grid, heads, nmb, tail) == want, (
                            heads,
                            nmb,
                            grid,
                            tail,
                            w,
                        )


def _host_program(tmp_path, header, main_body):
    """The variants written to ``tmp_path``, and a host program that includes ``header`` (``VARIANT/NAME.cuh``)
    with ``main_body`` (the text after the includes), compiled with the host C++ compiler (the test is skipped
    without one); returns ``run(stdin) -> stdout``."""
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip(f"no host C++ compiler to run {header}")
    _load().main(str(tmp_path))
    src, exe = tmp_path / "host.cpp", tmp_path / "host"
    src.write_text(f'#include <cstdio>\n#include "{header}"\n' + main_body)
    subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(exe), str(src)], check=True, cwd=tmp_path)
    return lambda stdin: subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("tail_rounds", [0, 2, 5])
def test_headpairs_order_visits_every_tile_once_and_matches_its_header(tmp_path, tail_rounds):
    """causal_order.cuh (compiled for the host) and the model's mirror give the same tile for every work, and
    the works 0 .. heads·nmb - 1 (CTA w % grid) visit every (head, m-block) once."""
    model = _order_model()
    for heads, nmb, grid in ORDER_CASES:
        tiles = [model.head_pairs_then_tail(w, grid, heads, nmb, tail_rounds) for w in range(heads * nmb)]
        assert sorted(tiles) == [(h, m) for h in range(heads) for m in range(nmb)], (heads, nmb, grid)
    run = _host_program(
        tmp_path,
        "headpairs/causal_order.cuh",
        "int main(int argc, char** argv) {\n"
        "  int heads, nmb, grid, tail;\n"
        '  while (std::scanf("%d %d %d %d", &heads, &nmb, &grid, &tail) == 4)\n'
        "    for (int w = 0; w < heads * nmb; ++w) {\n"
        "      causal_order::Tile t = causal_order::head_pairs_then_tail(w, grid, heads, nmb, tail);\n"
        '      std::printf("%d %d\\n", t.head, t.mb);\n'
        "    }\n"
        "}\n",
    )
    out = run("".join(f"{h} {n} {g} {tail_rounds}\n" for h, n, g in ORDER_CASES)).split("\n")
    want = [
        f"{h} {m}"
        for heads, nmb, grid in ORDER_CASES
        for h, m in (model.head_pairs_then_tail(w, grid, heads, nmb, tail_rounds) for w in range(heads * nmb))
    ]
    assert out[:-1] == want


@pytest.mark.parametrize("build", ["causal", "head_dim-64-causal", "causal-gqa-lse-strided", "plain"])
def test_headpairs_rewrites_the_pair_order_and_builds_without_spills(tmp_path, build):
    """``headpairs`` changes only the causal ``by_pairs`` order: its plain build is the top rung's machine code,
    its causal builds compile without spills and call causal_order.cuh's order."""
    _load().main(str(tmp_path))
    src = (tmp_path / "headpairs" / TOP.source.name).read_text()
    assert "causal_order::head_pairs_then_tail(tile, gridDim.x, bh_count, num_m_blocks" in src
    assert "if (by_pairs) return static_cast<unsigned>(work);" in src and "if (by_pairs) return 2 * (c +" not in src
    r = _build(build)
    c = compile_source(r, _inlined(tmp_path / "headpairs", TOP.source.name))
    _no_spills(c)
    if build == "plain" and find_cuobjdump() is not None:
        from attnclimb.runtime.sass import sass_digest

        assert sass_digest(c.cubin) == sass_digest(compile_rung(TOP).cubin)


@pytest.mark.parametrize(
    "build", ["plain", "long-kv", "long-kv-strided", "causal-gqa-lse-strided", "head_dim-64", "fp16-long-kv-strided"]
)
def test_l2pf_prefetches_the_kv_tiles_ahead_and_builds_without_spills(tmp_path, build):
    """``l2pf``: after the copies of K/V tile nb the producer asks L2 for tile nb + L2_PREFETCH_AHEAD of the same
    work tile through the same maps and boxes (3-D maps, 4-D for strided inputs), guarded by the work tile's K/V
    tile count; no spills in the builds its A/B times and their neighbours; in SASS one ``UTMAPF.L2`` per K/V box
    copy (``UTMALDG`` of K and V), none of Q. (Not in this list: the fp16 causal strided build, whose producer
    keeps 24 registers and spills 8 bytes with the prefetch; an experiment, not a rung.)"""
    _load().main(str(tmp_path))
    src = (tmp_path / "l2pf" / TOP.source.name).read_text()
    assert src.count("if (nb + L2_PREFETCH_AHEAD < num_n_blocks) {") == 1
    assert src.count("l2pf::tile(&tmap_") == 2 and src.count("l2pf::tile_4d(&tmap_") == 2

    # the prefetches take load_k's boxes and coordinates, with the tile nb + L2_PREFETCH_AHEAD's first row
    def args(call):
        return [re.sub(r"\s+", " ", m).strip() for m in re.findall(re.escape(call) + r"\((.*?)\);", src, flags=re.S)]

    loads = args("hop::tma_load_tile") + args("hop::tma_load_tile_4d")
    k_loads = [a.split(", ", 3)[3] for a in loads if a.startswith("s_k + slot")]  # after dst, map, bar
    pf = [a.split(", ", 1)[1] for a in args("l2pf::tile") + args("l2pf::tile_4d") if a.startswith("&tmap_k")]
    assert (
        len(k_loads) == 2
        and [a.replace("nb * BLOCK_N", "pf_row").replace("bh ", "bh_kv ").replace("bh,", "bh_kv,") for a in k_loads]
        == pf
    ), (k_loads, pf)
    r = _build(build)
    c = compile_source(r, _inlined(tmp_path / "l2pf", TOP.source.name))
    _no_spills(c)
    if find_cuobjdump() is not None:
        lines = sass(c.cubin).splitlines()
        dim = "4D" if "strided" in build else "3D"
        prefetches = [ln for ln in lines if "UTMAPF" in ln]
        loads = [ln for ln in lines if "UTMALDG" in ln]
        assert prefetches and all(f"UTMAPF.L2.{dim}" in ln for ln in prefetches), prefetches
        panels = r.head_dim // 64  # 64-column boxes (128-byte swizzle)
        kv_boxes = panels * (r.block_n // r.kv_box_rows)  # per K (or V) tile
        assert len(prefetches) == 2 * kv_boxes, (len(prefetches), kv_boxes)
        assert len(loads) == panels * (r.block_m // r.q_box_rows) + 2 * kv_boxes, (len(loads), kv_boxes)


def test_hgroup_order_visits_every_tile_once(tmp_path):
    """head_group.cuh (compiled for the host): for every head count, m-block count and group size the tiles
    0 .. heads·nmb - 1 visit every (head, m-block) once; a group of 1 is the top rung's head-major order
    (``bh = tile / nmb``); inside a group of several heads the heads come fastest, the m-blocks ascending."""
    run = _host_program(
        tmp_path,
        "hgroup/head_group.cuh",
        "int main() {\n"
        "  int heads, nmb, group;\n"
        '  while (std::scanf("%d %d %d", &heads, &nmb, &group) == 3)\n'
        "    for (int t = 0; t < heads * nmb; ++t) {\n"
        "      head_group::Tile x = head_group::tile_of(t, heads, nmb, group);\n"
        '      std::printf("%d %d\\n", x.head, x.mb);\n'
        "    }\n"
        "}\n",
    )
    cases = [(h, n, g) for h in (1, 2, 3, 5, 12, 13, 16, 64) for n in (1, 2, 7, 171) for g in (1, 2, 3, 4, 12, 100)]
    out = iter(run("".join(f"{h} {n} {g}\n" for h, n, g in cases)).split())
    for heads, nmb, group in cases:
        tiles = [(int(next(out)), int(next(out))) for _ in range(heads * nmb)]
        assert sorted(tiles) == [(h, m) for h in range(heads) for m in range(nmb)], (heads, nmb, group)
        if group == 1:
            assert tiles == [(t // nmb, t % nmb) for t in range(heads * nmb)]
        size = min(group, heads)  # the first group's heads, m-block 0, then m-block 1
        assert tiles[:size] == [(h, 0) for h in range(size)], (heads, nmb, group)
        if nmb > 1:
            assert tiles[size : 2 * size] == [(h, 1) for h in range(size)], (heads, nmb, group)


@pytest.mark.parametrize("build", ["plain", "long-kv", "long-kv-strided", "head_dim-64", "causal"])
def test_hgroup_rewrites_the_non_causal_order_and_builds_without_spills(tmp_path, build):
    """``hgroup`` changes only the non-causal ``work_of``: its causal build is the top rung's machine code, its
    non-causal builds compile without spills and call head_group.cuh's order."""
    _load().main(str(tmp_path))
    src = (tmp_path / "hgroup" / TOP.source.name).read_text()
    assert src.count("head_group::tile_of(tile, num_tiles / num_m_blocks, num_m_blocks, HEAD_GROUP)") == 1
    assert "w.m_start = (tile % num_m_blocks) * BLOCK_M;" not in src
    r = _build(build)
    c = compile_source(r, _inlined(tmp_path / "hgroup", TOP.source.name))
    _no_spills(c)
    if find_cuobjdump() is not None:
        from attnclimb.runtime.sass import sass_digest

        same = sass_digest(c.cubin) == sass_digest(compile_rung(r).cubin)
        assert same == (build == "causal"), build


def test_dynsched_order_is_the_models_dynamic_order(tmp_path):
    """dyn_sched.cuh's ``tile_of`` (compiled for the host) hands the tiles out in the order of
    scripts/causal_order_model.py's ``dynamic_order``, whose list scheduling gives the model's ``dynamic`` column:
    every (head, m-block) once, the heaviest m-block first in each group of heads."""
    model = _order_model()
    run = _host_program(
        tmp_path,
        "dynsched/dyn_sched.cuh",
        "int main() {\n"
        "  int heads, nmb, group;\n"
        '  while (std::scanf("%d %d %d", &heads, &nmb, &group) == 3) {\n'
        "    if (nmb < 0) {  // l2_heads: heads query heads, seqlen = group, head_dim 64 << -nmb, kv_group 4\n"
        "      const long long kv = 2ll * group * (64 << -nmb) * 2 * heads;\n"
        '      std::printf("%d %d\\n", dyn_sched::l2_heads(kv, heads, 1, 32ll << 20),\n'
        "                  dyn_sched::l2_heads(kv, heads, 4, 32ll << 20));\n"
        "      continue;\n"
        "    }\n"
        "    for (int w = 0; w < heads * nmb; ++w) {\n"
        "      dyn_sched::Tile t = dyn_sched::tile_of(w, heads, nmb, group);\n"
        '      std::printf("%d %d\\n", t.head, t.mb);\n'
        "    }\n"
        "  }\n"
        "}\n",
    )
    cases = [(h, n, g) for h in (1, 2, 3, 5, 16, 64) for n in (1, 2, 7, 64) for g in (1, 2, 3, 4, 16)]
    out = run("".join(f"{h} {n} {g}\n" for h, n, g in cases)).split()
    got = iter(zip(map(int, out[::2]), map(int, out[1::2])))
    for heads, nmb, group in cases:
        tiles = [next(got) for _ in range(heads * nmb)]
        want = model.dynamic_order(heads, nmb, min(group, heads))
        assert tiles == want, (heads, nmb, group)
        assert sorted(tiles) == [(h, m) for h in range(heads) for m in range(nmb)]
    # the group size: the model's L2 group (all heads' K/V over per-head bytes), from 1 to all heads; a GQA group
    # of 4 query heads shares one K/V head, so four times as many query heads fit
    sizes = [(h, s, d) for h in (1, 8, 16, 32, 128) for s in (1024, 4096, 8192, 16384, 75600) for d in (1, 2, 3)]
    out = run("".join(f"{h} {-d} {s}\n" for h, s, d in sizes)).split()
    for (h, s, d), mha, gqa in zip(sizes, map(int, out[::2]), map(int, out[1::2]), strict=True):
        per_head = 2 * s * (64 << d) * 2  # the model's dynamic_loads
        assert mha == min(h, max(1, (32 << 20) // per_head)), (h, s, d)
        assert gqa == min(h, max(1, 4 * (32 << 20) // per_head)), (h, s, d)


@pytest.mark.parametrize(
    "build", ["plain", "long-kv", "causal", "causal-short", "head_dim-64-causal", "head_dim-256-causal", "all-fp16"]
)
def test_dynsched_rewrites_the_causal_schedule_and_builds_without_spills(tmp_path, build):
    """``dynsched`` changes only the causal builds: its non-causal ones are the top rung's machine code; its causal
    ones compile without spills and take their works from the global counter (``ATOMG``), the producer publishing
    each with its Q and warpgroup 0 taking the turns' last hand-off after the loop."""
    _load().main(str(tmp_path))
    src = (tmp_path / "dynsched" / TOP.source.name).read_text()
    assert src.count("dyn_sched::take(sched_slot)") == 1 and src.count("dyn_sched::finish(sched_slot);") == 1
    assert src.count("int sched_slot)") == 1  # the kernel's last argument (Rung.sched_slot)
    assert src.count("sched_work = ") == 2 and "if (work < 0) break;" in src
    assert "if (wg == 0) hop::named_bar_sync(my_turn, TURN_THREADS);" in src and "by_pairs" not in src
    r = _build(build)
    c = compile_source(r, _inlined(tmp_path / "dynsched", TOP.source.name))
    _no_spills(c)
    if find_cuobjdump() is not None:
        from attnclimb.runtime.sass import sass_digest

        causal = build not in ("plain", "long-kv")
        assert (sass_digest(c.cubin) == sass_digest(compile_rung(r).cubin)) == (not causal), build
        assert any("ATOMG" in ln for ln in sass(c.cubin).splitlines()) == causal, build


@pytest.mark.parametrize("build", ["plain", "causal", "head_dim-64-causal", "head_dim-256-causal", "all-fp16"])
def test_hwsched_is_dynscheds_order_without_the_counter(tmp_path, build):
    """``hwsched`` (one CTA per causal work tile, ``Rung.causal_per_tile``) is ``dynsched``'s order and nothing
    else: its source differs from the top rung only in the causal order, its non-causal builds are the top rung's
    machine code, its causal ones compile without spills and take no work from a counter (no ``ATOMG``)."""
    mod = _load()
    mod.main(str(tmp_path))
    src = (tmp_path / "hwsched" / TOP.source.name).read_text()
    assert "dyn_sched::tile_of(" in src and "by_pairs" not in src
    assert "dyn_sched::take(" not in src and "sched_work" not in src and "dyn_sched::finish" not in src
    assert "sched_slot" not in src  # no counters' slot: the launch passes none (Rung.sched_slot is False)
    # every line is the top rung's or dynsched's (its order), and the loops are the top rung's static ones
    known = set(TOP.source.read_text().splitlines()) | set(
        (tmp_path / "dynsched" / TOP.source.name).read_text().splitlines()
    )
    assert all(line in known for line in src.splitlines())
    assert src.count("work += gridDim.x") == TOP.source.read_text().count("work += gridDim.x") == 2
    r = _build(build)
    c = compile_source(r, _inlined(tmp_path / "hwsched", TOP.source.name))
    _no_spills(c)
    if find_cuobjdump() is not None:
        from attnclimb.runtime.sass import sass_digest

        causal = build != "plain"
        assert (sass_digest(c.cubin) == sass_digest(compile_rung(r).cubin)) == (not causal), build
        assert not any("ATOMG" in ln for ln in sass(c.cubin).splitlines()), build
