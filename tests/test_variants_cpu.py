"""scripts/make_variants.py: the A/B variants are generated from the current sources (the measured ones from
rung 14's, ``base`` and the diagnostics from the top rung's), so a change that the generator no longer
recognises fails here (not on the GPU), and each variant compiles for sm_90a without spills."""

import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest

from attnclimb import rungs
from attnclimb.runtime.compiler import SERIALIZED_WGMMA, compile_rung, compile_source
from attnclimb.runtime.launch import feature_variant
from attnclimb.runtime.sass import find_cuobjdump, sass, sass_instructions

ROOT = Path(__file__).resolve().parents[1]
MEASURED = rungs.get(14)  # make_variants.VARIANTS_OF: the rung the measured variants rewrite


def _load():
    spec = importlib.util.spec_from_file_location("make_variants", ROOT / "scripts" / "make_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variants_are_generated_and_differ_as_named(tmp_path):
    _load().main(str(tmp_path))
    top = MEASURED.source.read_text()
    nopp = (tmp_path / "nopp" / MEASURED.source.name).read_text()
    assert "named_bar_sync" in top and "named_bar_sync" not in nopp and "named_bar_arrive" not in nopp
    assert not (tmp_path / "desc").exists()  # rung 13 is that variant
    tree = (tmp_path / "tree" / MEASURED.source.name).read_text()
    assert "row_sum[e >> 1] += s[j][e]" not in tree and tree.count("ps[e >> 1][j % 4] += s[j][e];") == top.count(
        "row_sum[e >> 1] += s[j][e];"
    )
    sleep = (tmp_path / "sleep" / MEASURED.source.name).read_text()
    sleepall = (tmp_path / "sleepall" / MEASURED.source.name).read_text()
    assert sleep.count("mbar_wait_sleep(&bar_") == 3 and "hop::mbar_wait(&bar_k[slot]" in sleep  # producer only
    assert "hop::mbar_wait(" not in sleepall and sleepall.count("mbar_wait_sleep(") == top.count("hop::mbar_wait(")
    assert (tmp_path / "base" / rungs.TOP.source.name).read_text() == rungs.TOP.source.read_text()  # Rung fields
    nolfix = (tmp_path / "nolfix" / MEASURED.source.name).read_text()
    assert top.count("if (t == 0) row_sum[r] += p_top_rounded - p_top;") == 1 and "p_top" not in nolfix


def test_generator_refuses_a_source_it_does_not_recognise():
    mod = _load()
    with pytest.raises(SystemExit, match="make_variants"):
        mod.nopp("// a kernel without turns\n")


def _inlined(d, name=MEASURED.source.name):
    """The variant ``name`` in folder ``d`` with its own headers inlined (their includes resolve in the kernels)."""
    src = (d / name).read_text()
    for h in d.glob("*.cuh"):
        src = src.replace(f'#include "{h.name}"', h.read_text().replace("#pragma once\n", ""))
    return src


def test_lround_sums_the_rounded_pairs(tmp_path):
    """lround: no l fix (p_top), l_lse for the LSE, and both softmax loops round their pairs before l sums them."""
    _load().main(str(tmp_path))
    src = (tmp_path / "lround" / MEASURED.source.name).read_text()
    assert "p_top" not in src and "l_fix" not in src and src.count("l_lse[e >> 1] += s[j][e];") == 2
    assert src.count("round_pair(s[j][0], s[j][1], elem());") == 2 and '#include "lround.cuh"' in src


@pytest.mark.parametrize("name", ["lround", "poly4"])
@pytest.mark.parametrize(
    "causal,gqa,lse,strided,fp16,head_dim",
    [(1, 0, 1, 0, 1, 128), (1, 1, 1, 1, 1, 128), (1, 1, 0, 1, 1, 128), (0, 0, 1, 0, 1, 64), (1, 0, 1, 0, 0, 256)],
)
def test_lround_feature_builds_without_spills(tmp_path, name, causal, gqa, lse, strided, fp16, head_dim):
    """The feature builds where a first version of lround spilled (fp16 with causal, review), and two others:
    the variants must compile without spills wherever the top rung does."""
    _load().main(str(tmp_path))
    r = feature_variant(MEASURED, bool(causal), bool(gqa), bool(lse), bool(strided), head_dim, None, bool(fp16))
    c = compile_source(r, _inlined(tmp_path / name))
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
    assert SERIALIZED_WGMMA not in c.log, c.log  # ptxas C7513, C7515, ...


@pytest.mark.parametrize("name", ["nopp", "tree", "sleep", "sleepall", "nolfix", "lround", "poly2", "poly4", "poly8"])
def test_variants_compile_without_spills(tmp_path, name):
    _load().main(str(tmp_path))
    c = compile_source(MEASURED, _inlined(tmp_path / name))
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
    assert SERIALIZED_WGMMA not in c.log, c.log  # ptxas C7513, C7515, ...
    if find_cuobjdump() is not None:
        assert re.search(r"\bHGMMA\b", sass(c.cubin))


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_l_fix_costs_one_ex2_per_row_and_tile(tmp_path):
    """Rung 14's l fix computes each row's tile-max P once more (2 rows per thread): 2 more MUFU.EX2 in the
    steady loop and 2 in the peeled first tile than the nolfix variant (rung 14 as first landed), bf16 build."""
    _load().main(str(tmp_path))
    src = (tmp_path / "nolfix" / MEASURED.source.name).read_text()
    top = sass(compile_source(MEASURED, MEASURED.source.read_text()).cubin).count("MUFU.EX2")
    assert sass(compile_source(MEASURED, src).cubin).count("MUFU.EX2") == top - 4


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("every,blocks", [(2, 11), (4, 5), (8, 2)])
def test_poly_variants_move_exponentials_off_mufu(tmp_path, every, blocks):
    """polyN computes the exponentials of ``blocks`` of the 22 column blocks of S with smx::poly_exp2: 4 per
    block and thread fewer MUFU.EX2 in each copy of the softmax (the peeled first tile and the loop; the
    fp16 slow path is not in the bf16 build) than lround, which they are built on, and no new MUFU of any kind."""
    _load().main(str(tmp_path))
    top, var = (sass(compile_source(MEASURED, _inlined(tmp_path / n)).cubin) for n in ("lround", f"poly{every}"))
    fewer = top.count("MUFU.EX2") - var.count("MUFU.EX2")
    assert fewer > 0 and fewer % (4 * blocks) == 0, fewer
    assert var.count("MUFU") == top.count("MUFU") - fewer


def test_diagnostics_rewrite_the_top_rung(tmp_path):
    """noload, noexp and nomax are timing diagnostics of the top rung: its file name, one rewrite each."""
    _load().main(str(tmp_path))
    top = rungs.TOP.source.read_text()
    noexp = (tmp_path / "noexp" / rungs.TOP.source.name).read_text()
    noload = (tmp_path / "noload" / rungs.TOP.source.name).read_text()
    assert noexp != top and "diagnostic: FFMA only" in noexp
    assert noload != top and noload.count("if (kv < NUM_STAGES) load_") == 2
    nomax = (tmp_path / "nomax" / rungs.TOP.source.name).read_text()
    assert nomax != top and "(first ? S_TILES : 1)" in nomax


@pytest.mark.parametrize("name", ["noload", "noexp", "nomax"])
def test_diagnostics_compile_without_spills(tmp_path, name):
    _load().main(str(tmp_path))
    c = compile_source(rungs.TOP, (tmp_path / name / rungs.TOP.source.name).read_text())
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log


def test_wgarrive_rewrites_the_empty_barriers(tmp_path):
    """wgarrive (measured on rung 17, not kept: its page): the Q, K and V empty barriers expect one arrival per
    consumer warpgroup, and every arrival on them comes from the first warp of a warpgroup; nothing else changes."""
    _load().main(str(tmp_path))
    top = rungs.get(17).source.read_text()  # make_variants.VARIANTS_OF_17: measured on rung 17
    var = (tmp_path / "wgarrive" / rungs.get(17).source.name).read_text()
    assert var.count(", CONSUMER_WGS);") == 3 and top.count("_empty[st], CONSUMER_WARPS);") == 2
    arrivals = [ln for ln in var.splitlines() if "hop::mbar_arrive(&bar_" in ln and "_empty" in ln]
    assert arrivals and all("cw % 4 == 0 && lane == 0" in ln for ln in arrivals)
    assert len(top.splitlines()) == len(var.splitlines())


@pytest.mark.parametrize("head_dim", [128, 64])
def test_wgarrive_compiles_without_spills(tmp_path, head_dim):
    """Two consumer warpgroups at head_dim 128, three at 64 (CONSUMER_WGS arrivals either way)."""
    _load().main(str(tmp_path))
    r = feature_variant(rungs.get(17), False, False, False, head_dim=head_dim)
    c = compile_source(r, (tmp_path / "wgarrive" / rungs.get(17).source.name).read_text())
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log


@pytest.mark.parametrize(("name", "head_dim"), [("wgarrive18", 128), ("vfirst18", 128), ("vfirst18", 64)])
def test_rung18_variants_rewrite_it_and_compile_without_spills(tmp_path, name, head_dim):
    """The copies of wgarrive and vfirst on the staged epilogue's rung (make_variants.VARIANTS_OF_18: rung 18 when
    they were measured, rung 19 since the fifteenth session's re-cut): each differs from that rung's source as its
    rung-17 copy differs from rung 17's, and builds without spills or serialised
    wgmmas with two (head_dim 128) and, for vfirst, three (head_dim 64) consumer warpgroups. wgarrive on rung 18
    spills 8 bytes at head_dim 64 (160 registers; NVRTC 13.0), so its A/B (`device_calls.sh ab-18`) is head_dim
    128 only (its long-K/V three-warpgroup build does not spill)."""
    mod = _load()
    mod.main(str(tmp_path))
    r18, r17 = rungs.get(mod.VARIANTS_OF_18), rungs.get(17)
    var = (tmp_path / name / r18.source.name).read_text()
    fn = getattr(mod, name.removesuffix("18"))
    assert var == fn(r18.source.read_text()) != r18.source.read_text()
    # the same lines change as on rung 17
    diff = set(var.splitlines()) ^ set(r18.source.read_text().splitlines())
    diff17 = set(fn(r17.source.read_text()).splitlines()) ^ set(r17.source.read_text().splitlines())
    assert diff == diff17
    c = compile_source(feature_variant(r18, False, False, False, head_dim=head_dim), var)
    assert SERIALIZED_WGMMA not in c.log
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log


def test_top_rung_variants_are_generated(tmp_path):
    """The twelfth session's variants of the top rung: ``nopptop`` (no turns), ``hint`` (L2 evict_last on K/V,
    evict_first on Q) and ``hintq`` (evict_first on Q only), each loading its tiles as named."""
    _load().main(str(tmp_path))
    name = rungs.TOP.source.name
    nopp = (tmp_path / "nopptop" / name).read_text()
    assert "named_bar_sync" in rungs.TOP.source.read_text() and "named_bar_" not in nopp
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
    top = rungs.TOP
    r = {
        "plain": top,
        "long-kv": feature_variant(top, False, False, False, seqlen_k=top.long_kv[0]),
        "causal-gqa-lse-strided": feature_variant(top, True, True, True, True),
    }[build]
    c = compile_source(r, _inlined(tmp_path / name, top.source.name))
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
    if find_cuobjdump() is not None:
        loads = [ln for ln in sass(c.cubin).splitlines() if "UTMALDG" in ln]
        hinted = sum("desc[" in ln for ln in loads)  # hintq: the Q tile's boxes only
        assert {"nopptop": hinted == 0, "hint": hinted == len(loads), "hintq": 0 < hinted < len(loads)}[name], loads


@pytest.mark.parametrize("number", range(10, rungs.TOP.number + 1))
def test_nopp_ladder_drops_every_turn_and_builds_without_spills(tmp_path, number):
    """``nopp_ladder`` (thirteenth session): every rung from the turns' rung 10 up, without its turns. Each source
    had named barriers and has none left; the lines that go are the turn lines alone, counted with their repeats (an
    ``if`` line only as the head of a two-line conditional arrival); each build (and the long-K/V tiles where the
    rung has them) compiles for sm_90a without spills or serialized wgmmas, and without the turns' 256-thread
    BAR.SYNC / BAR.ARV in its SASS where the rung's has them."""
    _load().main(str(tmp_path))
    r = rungs.get(number)
    src = r.source.read_text()
    out = (tmp_path / "nopp_ladder" / r.source.name).read_text()
    assert "named_bar_sync(my_turn" in src and "named_bar_" not in out
    gone = Counter(src.splitlines()) - Counter(out.splitlines())
    lines = src.splitlines()
    for ln in gone:
        if "TURN_THREADS" in ln:
            continue
        heads = [k for k, x in enumerate(lines) if x == ln]
        assert re.fullmatch(r"\s*if \(.*", ln) and all("named_bar_arrive(other_turn" in lines[k + 1] for k in heads), ln
    assert sum(gone.values()) == len(src.splitlines()) - len(out.splitlines())
    builds = [r] + ([feature_variant(r, False, False, False, seqlen_k=r.long_kv[0])] if r.long_kv else [])
    turns = re.compile(r"\bBAR\.(?:SYNC\.DEFER_BLOCKING|ARV) [^;]*, 0x100\b")  # both warpgroups' 256 threads
    for b in builds:
        c = compile_source(b, _inlined(tmp_path / "nopp_ladder", r.source.name))
        for res in c.resources:
            assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
        assert SERIALIZED_WGMMA not in c.log, c.log
        if find_cuobjdump() is not None and b is r:
            assert any(turns.search(ln) for ln in sass(compile_rung(r).cubin).splitlines())
            assert not [ln for ln in sass(c.cubin).splitlines() if turns.search(ln)]


def test_sleeptop_and_treetop_rewrite_the_top_rung(tmp_path):
    """The thirteenth session's variants of the top rung: ``sleeptop`` waits for free Q, K and V slots with a
    suspend hint (and nothing else), ``treetop`` keeps four chains per row for the tile max and the softmax's row
    sums (not for the exponentials-first loop) and joins them before each return."""
    _load().main(str(tmp_path))
    name = rungs.TOP.source.name
    top = rungs.TOP.source.read_text()
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
    top = rungs.TOP
    r = {
        "plain": top,
        "long-kv": feature_variant(top, False, False, False, seqlen_k=top.long_kv[0]),
        "head_dim-64-causal": feature_variant(top, True, False, False, head_dim=64),
        "causal-gqa-lse-strided": feature_variant(top, True, True, True, True),
        "fp16": feature_variant(top, False, False, False, fp16=True),
    }[build]
    c = compile_source(r, _inlined(tmp_path / name, top.source.name))
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log


@pytest.mark.parametrize(
    ("name", "rung", "build"),
    [
        ("sonly10", 10, "plain"),
        ("vfirst10", 10, "plain"),
        ("latearrive10", 10, "plain"),
        ("sonlytop", None, "plain"),
        ("sonlytop", None, "long-kv"),
    ],
)
def test_turn_placement_variants_move_one_wait_or_arrival(tmp_path, name, rung, build):
    """The sixteenth session's turn placements (rung 10's page, "Revisited"): each keeps every line of its rung and
    the same count of named-barrier calls, moving only where the loop's arrival (sonly: right after issuing S;
    latearrive10: after S completes) or V wait (vfirst10: before the turn) sits; each builds without spills or
    serialised wgmmas (the top rung's also with its three-warpgroup long-K/V tiles)."""
    mod = _load()
    mod.main(str(tmp_path))
    r = rungs.get(rung) if rung else rungs.TOP
    src, var = r.source.read_text(), (tmp_path / name / r.source.name).read_text()
    # the same lines in another order; vfirst10 also drops the trace marks that split the turn around the V wait
    dropped = {"        TRACE_END(S);": 1, "        TRACE_BEGIN(S);": 1} if name == "vfirst10" else {}
    assert var != src and Counter(src.splitlines()) - Counter(var.splitlines()) == Counter(dropped)
    assert not Counter(var.splitlines()) - Counter(src.splitlines())
    assert var.count("named_bar_arrive(") == src.count("named_bar_arrive(")
    lines = var.splitlines()
    loop_arrive = [i for i, ln in enumerate(lines) if ln.strip() == "hop::named_bar_arrive(other_turn, TURN_THREADS);"]
    issue = [i for i, ln in enumerate(lines) if ln.strip() == "issue_qk(slot);"]
    if name.startswith("sonly"):
        assert any(i + 1 in loop_arrive for i in issue)
    b = feature_variant(r, False, False, False, seqlen_k=r.long_kv[0]) if build == "long-kv" else r
    c = compile_source(b, var)
    assert SERIALIZED_WGMMA not in c.log, c.log
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log


@pytest.mark.parametrize("turns", [True, False])
def test_rung11_epi_builds_without_spills(turns):
    """benchmarks/ab/variants/rung11-epi (sixteenth session, ``device_calls.sh ab-epi11``): rung 11 with the top
    rung's staged epilogue, with the turns and without them (``nopp``), at the staged layout's shared memory; no
    spills, no serialised wgmmas, and in SASS the epilogue's stmatrix and 16-byte stores that rung 11 lacks."""
    import dataclasses

    src = (ROOT / "benchmarks" / "ab" / "variants" / "rung11-epi" / "11_persistent.cu").read_text()
    if not turns:
        src = _load().nopp(src)
    r = dataclasses.replace(rungs.get(11), smem_layout="tma_ring_staged_o")
    c = compile_source(r, src)
    assert SERIALIZED_WGMMA not in c.log, c.log
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
    if find_cuobjdump() is not None:
        code, base = sass(c.cubin), sass(compile_rung(rungs.get(11)).cubin)
        assert "STSM" in code and "STG.E.128" in code and "STSM" not in base
        if turns:  # rung 11's named barriers, as many
            assert code.count("BAR.SYNC") == base.count("BAR.SYNC") and code.count("BAR.ARV") == base.count("BAR.ARV")
        else:  # only the CTA's one __syncthreads
            assert code.count("BAR.SYNC") == 1 and "BAR.ARV" not in code


@pytest.mark.skipif(__import__("shutil").which("patch") is None, reason="patch not installed")
def test_make_recut_writes_the_other_order(tmp_path):
    """scripts/make_recut.sh (sixteenth session, ``device_calls.sh recut``): rung 11 + the staged epilogue without
    turns, and rungs 12-17 (12 since the eighteenth session) with rung 19's epilogue diff applied, with their turns
    and (seventeenth session, the turns-last order) without; each has the epilogue, has the turns or none of them,
    and builds without spills with the overrides the device call gives it (staged layout, 128-key tiles), its
    three-warpgroup long-K/V tiles too (rungs 14-17)."""
    import dataclasses
    import itertools
    import subprocess

    subprocess.run(["bash", "scripts/make_recut.sh", str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    epin = (tmp_path / "epin" / "11_persistent.cu").read_text()
    assert "stmatrix_x4" in epin and "named_bar_" not in epin
    for n, turns in itertools.product(range(12, 18), (True, False)):
        r = rungs.get(n)
        folder = ("recut-e" if turns else "recut-en") + (str(n) if n in (12, 13) else "")
        src = (tmp_path / folder / r.source.name).read_text()
        assert "stmatrix_x4" in src and ("named_bar_sync(my_turn" in src) == turns and ("named_bar_" in src) == turns
        assert src.count("#if SMEM_EPILOGUE") == 2
        head = "" if turns else "// Without the ping-pong turns (make_variants.py's nopp): the turns-last order.\n"
        assert src.startswith(f"{head}// A/B VARIANT (scripts/make_recut.sh), not a rung: {r.source.name}")
        b = dataclasses.replace(r, smem_layout="tma_ring_staged_o", block_n=128, kv_box_rows=128)
        # the plain tiles, and from rung 14 the three-warpgroup long-K/V tiles that `recut` times at Wan2.1-1.3B
        builds = [b] + ([feature_variant(b, False, False, False, seqlen_k=b.long_kv[0])] if b.long_kv else [])
        for build in builds:
            c = compile_source(build, src)
            assert SERIALIZED_WGMMA not in c.log, c.log
            for res in c.resources:
                assert res.spill_bytes == 0 and res.stack_frame == 0, (n, build.block_m, c.log)


@pytest.mark.skipif(__import__("shutil").which("patch") is None, reason="patch not installed")
@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_recut_en12_is_epin_machine_code(tmp_path):
    """Eighteenth session: rung 12 + the staged epilogue without the turns, with 128-key tiles (``recut-en12``, the
    first rung of a turns-last re-cut: it also carries rung 12's compile-time features) builds the machine code of
    ``epin`` (rung 11 + the staged epilogue without the turns, the build that was timed): the same instructions,
    as many of each opcode, at most a few dozen lines placed or allocated otherwise (the prologue's). So the A/B
    figures of ``epin`` stand for it."""
    import dataclasses
    import difflib
    import subprocess

    subprocess.run(["bash", "scripts/make_recut.sh", str(tmp_path)], cwd=ROOT, check=True, capture_output=True)

    def code(n, folder, **tiles):
        r = rungs.get(n)
        r = dataclasses.replace(r, smem_layout="tma_ring_staged_o", **tiles)
        c = compile_source(r, (tmp_path / folder / r.source.name).read_text())
        for res in c.resources:
            assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
        return sass_instructions(c.cubin)

    epin, en12 = code(11, "epin"), code(12, "recut-en12", block_n=128, kv_box_rows=128)
    assert len(epin) == len(en12) > 1000

    def opcode(line):  # past a predicate guard (@P0 ...)
        return line.split()[1] if line.startswith("@") else line.split()[0]

    assert Counter(map(opcode, epin)) == Counter(map(opcode, en12))
    diff = difflib.unified_diff(epin, en12, lineterm="", n=0)
    moved = [ln for ln in diff if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert len(moved) <= 40, moved
