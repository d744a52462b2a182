"""Every rung compiles for sm_90a with NVRTC (no GPU), with no spills, and its SASS has what it claims."""

import multiprocessing as mp
import re
import time

import pytest

from attnclimb import rungs
from attnclimb.runtime import CompileError, compile_rung, parse_ptxas_log
from attnclimb.runtime.compiler import SERIALIZED_WGMMA
from attnclimb.runtime.sass import find_cuobjdump, sass, sass_digest

RUNG_IDS = [r.key for r in rungs.RUNGS]


@pytest.fixture(scope="module")
def compiled():
    return {r.key: compile_rung(r, "sm_90a") for r in rungs.RUNGS}


@pytest.mark.parametrize("key", RUNG_IDS)
def test_compiles_without_spills(compiled, key):
    c = compiled[key]
    names = {res.kernel for res in c.resources}
    assert set(c.rung.kernel_names) <= names, f"entry points missing: {c.rung.kernel_names} vs {names}"
    for res in c.resources:
        assert res.spill_bytes == 0, f"{key}:{res.kernel} spills {res.spill_bytes} bytes\n{c.log}"
        assert res.stack_frame == 0, f"{key}:{res.kernel} uses a {res.stack_frame}-byte stack frame\n{c.log}"
        assert res.registers <= 255
    assert c.rung.smem_bytes + max(r.static_smem for r in c.resources) <= 227 * 1024
    assert SERIALIZED_WGMMA not in c.log, f"{key}: ptxas serialised its wgmmas\n{c.log}"


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("key", RUNG_IDS)
def test_sass_has_claimed_instructions(compiled, key):
    c = compiled[key]
    text = sass(c.cubin)
    for mnemonic in c.rung.sass_required:
        assert re.search(rf"\b{mnemonic}\b", text), f"{key} claims {mnemonic} but its SASS has none"
    assert not re.search(r"\b(LDL|STL)\b", text), f"{key} uses local memory (LDL/STL)"
    if c.rung.number >= 6:
        assert "HGMMA" in text
    if c.rung.number < 2:
        assert not re.search(r"\b(HMMA|HGMMA)\b", text), f"{key} should run on CUDA cores only"


def test_compile_error_shows_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "99_broken.cu").write_text('extern "C" __global__ void attn_fwd() {\n  int x = ;\n}\n')
    monkeypatch.setattr(rungs, "KERNEL_DIR", tmp_path)
    monkeypatch.setenv("ATTNCLIMB_CACHE_DIR", str(tmp_path / "cache"))
    r = rungs.Rung(99, "broken", "none", "pointer", 64, 64, 128, "none")
    with pytest.raises(CompileError, match=r"99_broken\.cu\(2\).*error"):
        compile_rung(r)


def test_cache_hit_is_fast_and_keyed_by_options(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCLIMB_CACHE_DIR", str(tmp_path))
    r = rungs.get(1)
    first = compile_rung(r)
    t0 = time.perf_counter()
    again = compile_rung(r)
    assert time.perf_counter() - t0 < 0.05  # a cache hit reads two small files: milliseconds
    assert not first.cached and again.cached and again.cubin == first.cubin
    other = rungs.Rung(**{**r.__dict__, "extra_defines": {"UNUSED_KNOB": 1}})
    assert not compile_rung(other).cached  # new options: a new entry, never a stale cubin


def _compile_in_child(cache):
    import os

    os.environ["ATTNCLIMB_CACHE_DIR"] = cache
    from attnclimb import rungs as rr
    from attnclimb.runtime import compile_rung as cr

    return len(cr(rr.get(1)).cubin)


def test_concurrent_compiles_do_not_corrupt_cache(tmp_path):
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        sizes = pool.map(_compile_in_child, [str(tmp_path)] * 4)
    # Each child may have compiled its own copy (NVRTC 13.5 can emit differing, equally valid cubins under
    # parallel load): the cache must hold exactly one of them, whole, and no temporary file.
    assert min(sizes) > 0
    assert not list(tmp_path.glob("*.tmp"))
    cubins = list(tmp_path.glob("*.cubin"))
    assert len(cubins) == 1 and cubins[0].stat().st_size in sizes


def test_parse_ptxas_log():
    log = """ptxas info    : Compiling entry function 'attn_fwd' for 'sm_90a'
ptxas info    : Function properties for attn_fwd
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
"""
    (res,) = parse_ptxas_log(log)
    assert (res.kernel, res.registers, res.static_smem, res.stack_frame, res.spill_bytes) == (
        "attn_fwd",
        168,
        1024,
        8,
        8,
    )


def test_damaged_or_unwritable_cache_is_survived(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCLIMB_CACHE_DIR", str(tmp_path))
    r = rungs.get(1)
    good = compile_rung(r)
    good.path.with_suffix(".json").write_text("[1, 2]")  # valid JSON, wrong shape
    # A fresh compile each time, equivalent to the first. (Not compared byte for byte: NVRTC 13.5 was seen to
    # emit a different, equally valid cubin for the same source now and then, once in this test in CI.)
    same_kernel = lambda c: c.cubin[:4] == b"\x7fELF" and c.resources == good.resources
    again = compile_rung(r)
    assert not again.cached and same_kernel(again)
    good.path.write_bytes(b"")  # an empty cubin is never served
    assert not compile_rung(r).cached
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("ATTNCLIMB_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning, match="cannot write the kernel cache"):
        c = compile_rung(r)
    assert not c.cached and same_kernel(c)


def test_edited_kernel_is_never_served_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCLIMB_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "kernels"
    src.mkdir()
    (src / "01_online_softmax.cu").write_text(rungs.get(1).source.read_text())
    monkeypatch.setattr(rungs, "KERNEL_DIR", src)
    r = rungs.get(1)
    assert r.source.parent == src
    compile_rung(r)
    assert compile_rung(r).cached
    (src / "01_online_softmax.cu").write_text(r.source.read_text() + "\n// one more line\n")
    assert not compile_rung(r).cached


def test_atomic_write_leaves_old_file_when_writer_dies(tmp_path, monkeypatch):
    from attnclimb.runtime import compiler

    target = tmp_path / "x.cubin"
    compiler._atomic_write(target, b"old contents")

    class Boom(Exception):
        pass

    def dying_replace(src, dst):
        raise Boom()

    monkeypatch.setattr(compiler.os, "replace", dying_replace)
    with pytest.raises(Boom):
        compiler._atomic_write(target, b"new")
    assert target.read_bytes() == b"old contents"
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed")
def test_resources_from_cubin_match_ptxas_report(compiled):
    """The cuobjdump fallback (for NVRTC builds with an empty log) agrees with ptxas' own report."""
    from attnclimb.runtime.sass import resource_usage

    for key, c in compiled.items():
        by_name = {r.kernel: r for r in resource_usage(c.cubin)}
        for res in c.resources:
            alt = by_name[res.kernel]
            assert (alt.registers, alt.static_smem, alt.stack_frame) == (
                res.registers,
                res.static_smem,
                res.stack_frame,
            ), key
            assert alt.spill_bytes == 0 and res.spill_bytes == 0


def test_shared_memory_has_one_source_of_truth():
    """rungs.py derives smem_bytes from the layout, tiles and NUM_STAGES; the kernel static_asserts it."""
    import dataclasses

    from attnclimb.runtime import CompileError, compile_rung

    top = rungs.get(8)
    deeper = dataclasses.replace(top, extra_defines={**top.extra_defines, "NUM_STAGES": 3})
    assert deeper.smem_bytes == top.smem_bytes + 2 * top.block_n * rungs.HEAD_DIM * 2
    assert deeper.defines()["SMEM_BYTES"] == deeper.smem_bytes
    assert compile_rung(deeper).resources[0].spill_bytes == 0  # 230400 B: still fits
    wrong = dataclasses.replace(top, smem_layout="swizzled_ring")  # 1 KB short of what the kernel carves
    with pytest.raises(CompileError, match="static assertion failed"):
        compile_rung(wrong)


FEATURE_COMBOS = [(c, g, w, st) for c in (0, 1) for g in (0, 1) for w in (0, 1) for st in (0, 1) if c or g or w or st]
# causal calls up to Rung.causal_short's seqlen_k take its tiles: those variants too
SHORT_K = rungs.TOP.causal_short[0] if rungs.TOP.causal_short else None
FEATURE_COMBOS += [(c, g, w, st, SHORT_K) for c, g, w, st in FEATURE_COMBOS if c and SHORT_K]
# non-causal calls from Rung.long_kv's seqlen_k on take its tiles (three warpgroups): every such variant too
LONG_K = rungs.TOP.long_kv[0] if rungs.TOP.long_kv else None
FEATURE_COMBOS += [(0, g, w, st, LONG_K) for g in (0, 1) for w in (0, 1) for st in (0, 1) if LONG_K]


def launch_regs(threads: int) -> int:
    """Registers per thread that a CTA of ``threads`` gets at launch under ``__launch_bounds__(threads, 1)``."""
    return min(255, 65536 // threads // 8 * 8)


@pytest.mark.parametrize("key", [r.key for r in rungs.RUNGS if "USETMAXREG" in r.sass_required])
def test_setmaxnreg_pool_is_the_launch_allocation(compiled, key):
    """setmaxnreg only moves registers inside the CTA's pool, the launch allocation (PTX ISA "setmaxnreg":
    an .inc the pool cannot serve blocks for ever). The kernels' static_asserts bound their targets by
    65536 / NUM_THREADS rounded down to 8; this checks that ptxas allocates exactly that much. (A 32-register
    producer beside 240-register consumers once hung the causal GQA strided variant on the GPU.)"""
    r = rungs.BY_NUMBER[int(key[4:])]
    for res in compiled[key].resources:
        assert res.registers == launch_regs(r.threads), compiled[key].log


@pytest.mark.parametrize(("causal", "gqa", "lse", "strided", "seqlen_k"), [(*c, None)[:5] for c in FEATURE_COMBOS])
def test_top_rung_feature_variants_compile(causal, gqa, lse, strided, seqlen_k):
    """Each compile-time variant of the top rung (issues 8 and 9) builds for sm_90a without spills or local
    memory and keeps the rung's Hopper instructions."""
    from attnclimb.runtime.launch import feature_variant

    r = feature_variant(rungs.TOP, bool(causal), bool(gqa), bool(lse), bool(strided), seqlen_k=seqlen_k)
    if seqlen_k is not None:
        tiles = rungs.TOP.causal_short[1] if causal else rungs.TOP.long_kv[1]
        assert all(getattr(r, f) == n for f, n in tiles.items())
    c = compile_rung(r, "sm_90a")
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
        assert res.registers == launch_regs(r.threads)  # the setmaxnreg pool (see the next test)
        assert r.smem_bytes + res.static_smem <= 227 * 1024
    assert SERIALIZED_WGMMA not in c.log, c.log
    if find_cuobjdump() is not None:
        text = sass(c.cubin)
        assert not re.search(r"\b(LDL|STL)\b", text)
        for mnemonic in rungs.TOP.sass_required:
            assert re.search(rf"\b{mnemonic}\b", text)


# (causal, gqa, lse, strided, head_dim, long-K/V tiles): the bf16 builds of the rungs below the top that
# tests/test_ladder_features_gpu.py runs (rungs 12-15 take three consumer warpgroups, without turns, at head_dim 64
# and with the long-K/V tiles)
BELOW_TOP_CASES = [(1, 1, 1, 1, 128, False), (1, 0, 1, 0, 64, False), (1, 0, 0, 0, 256, False), (0, 1, 1, 1, 128, True)]


@pytest.mark.parametrize("case", BELOW_TOP_CASES, ids=lambda c: "".join(map(str, c[:4])) + f"-d{c[4]}-long{int(c[5])}")
@pytest.mark.parametrize("number", [r.number for r in rungs.RUNGS if r.features and r is not rungs.TOP])
def test_below_top_feature_variants_compile(number, case):
    """The bf16 feature variants of rungs 10-15 (the re-cut's rungs without turns) build for sm_90a without
    spills, local memory or serialized wgmmas, inside the setmaxnreg pool and the shared-memory limit."""
    import dataclasses

    from attnclimb.runtime.launch import feature_variant

    causal, gqa, lse, strided, head_dim, long_kv = case
    rung = rungs.get(number)
    if long_kv:
        if rung.long_kv is None:
            pytest.skip(f"{rung.key} has no long-K/V tiles")
        rung = dataclasses.replace(rung, **rung.long_kv[1])
    r = feature_variant(rung, bool(causal), bool(gqa), bool(lse), bool(strided), head_dim)
    c = compile_rung(r, "sm_90a")
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
        assert res.registers == launch_regs(r.threads)
        assert r.smem_bytes + res.static_smem <= 227 * 1024
    assert SERIALIZED_WGMMA not in c.log, c.log
    if find_cuobjdump() is not None:
        assert not re.search(r"\b(LDL|STL)\b", sass(c.cubin))


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_feature_switches_off_leave_the_top_rung_unchanged(compiled):
    """CAUSAL=GQA=WRITE_LSE=STRIDED=FP16=0 spelled out compiles to the very machine code of the plain top rung
    (what the bench measures): the variants cost the default call nothing."""
    import dataclasses

    off = dataclasses.replace(
        rungs.TOP,
        extra_defines={**rungs.TOP.extra_defines, "CAUSAL": 0, "GQA": 0, "WRITE_LSE": 0, "STRIDED": 0, "FP16": 0},
    )

    assert sass_digest(compile_rung(off, "sm_90a").cubin) == sass_digest(compiled[rungs.TOP.key].cubin)


# The FP16 variant (fp16 Q, K, V, O) with each feature alone, all of them, the long-K/V tiles (where the rung has
# them) and both other head dims: (causal, gqa, lse, strided, head_dim, seqlen_k)
FP16_CASES = [
    (0, 0, 0, 0, 128, None),
    (1, 0, 0, 0, 128, None),
    (0, 1, 0, 0, 128, None),
    (0, 0, 1, 0, 128, None),
    (0, 0, 0, 1, 128, None),
    (1, 1, 1, 1, 128, None),
    (0, 1, 1, 1, 128, 10**5),
    (1, 1, 1, 1, 64, None),
    (1, 1, 1, 1, 256, None),
    (0, 0, 0, 0, 256, None),
]


FP16_RUNGS = [r.number for r in rungs.RUNGS if "fp16" in r.features]  # the rungs that carry the FP16 variant


def _fp16_variant(causal, gqa, lse, strided, head_dim, seqlen_k, number=None, fp16=True):
    from attnclimb.runtime.launch import feature_variant

    rung = rungs.TOP if number is None else rungs.get(number)
    return feature_variant(rung, bool(causal), bool(gqa), bool(lse), bool(strided), head_dim, seqlen_k, fp16)


def _shift_and_vote(text):
    """The fp16-P shift's instructions in SASS (softmax.cuh, "fp16 P"): (FRND.CEIL count: k = ceil(e), per
    row and tile and in the LSE epilogue; VOTE.ANY count: the warp-uniform slow-path branch, __any_sync)."""
    return len(re.findall(r"\bFRND\.CEIL\b", text)), len(re.findall(r"\bVOTE\.ANY\b", text))


@pytest.mark.parametrize("number", FP16_RUNGS)
@pytest.mark.parametrize("case", FP16_CASES, ids=lambda c: "fp16-" + "".join(map(str, c[:4])) + f"-d{c[4]}-k{c[5]}")
def test_top_rung_fp16_variants_compile(case, number):
    """The FP16 variants of rungs 10-16 build for sm_90a without spills or local memory, within the
    setmaxnreg pool, and run both wgmmas on fp16 operands (SASS HGMMA without the .BF16 type of the bf16
    build) with P packed by F2FP.F16 (cvt.rn.f16x2.f32), never by the bf16 pack; the per-row shift of fp16 P
    (FRND.CEIL) and its warp vote (VOTE.ANY) are there (their absence from the bf16 builds: below)."""
    r = _fp16_variant(*case, number=number)
    assert r.defines()["FP16"] == 1 and r.head_dim == case[4] and r.number == number
    c = compile_rung(r, "sm_90a")
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
        assert res.registers == launch_regs(r.threads)
        assert r.smem_bytes + res.static_smem <= 227 * 1024
    assert SERIALIZED_WGMMA not in c.log, c.log
    if find_cuobjdump() is not None:
        text = sass(c.cubin)
        assert not re.search(r"\b(LDL|STL)\b", text)
        for mnemonic in rungs.get(number).sass_required:
            assert re.search(rf"\b{mnemonic}\b", text)
        hgmma = re.findall(r"HGMMA\.64x\d+x16\.F32\S*", text)
        assert hgmma and all(h.endswith(".F32") for h in hgmma), sorted(set(hgmma))  # fp16 A and B
        assert "F2FP.F16.F32.PACK_AB" in text and "F2FP.BF16" not in text
        frnd, vote = _shift_and_vote(text)
        assert frnd >= 1 and vote >= 1, (frnd, vote)


# (causal, gqa, lse, strided): plain, the LSE alone, and all four features
SHIFT_CASES = [(0, 0, 0, 0), (0, 0, 1, 0), (1, 1, 1, 1)]


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("number", FP16_RUNGS)
def test_fp16_shift_and_vote_are_the_fp16_variants_own(number):
    """FRND.CEIL (k = ceil(e)) and VOTE.ANY (the __any_sync over k != 0) appear in the fp16 builds of rungs
    10-16 and not in the bf16 build of the same variant, so a kernel that drops the shift or the vote fails
    here (the CPU model's tests show what the shift is for). The bf16 builds of rungs 12-16 have votes of their
    own (the lazy rescale's skip of the O rescale): their fp16 builds must have more. With WRITE_LSE the
    epilogue's own k adds FRND.CEILs (NVRTC 13.0: 4 → 6), so an LSE without k fails too."""
    counts = {}
    for feats in SHIFT_CASES:
        for fp16 in (False, True):
            r = _fp16_variant(*feats, 128, None, number=number, fp16=fp16)
            assert r.defines().get("FP16", 0) == int(fp16)
            counts[feats, fp16] = _shift_and_vote(sass(compile_rung(r, "sm_90a").cubin))
    lazy = number >= 12  # rungs 12-16: the bf16 build votes on skipping the O rescale
    for feats in SHIFT_CASES:
        bf16_frnd, bf16_vote = counts[feats, False]
        assert bf16_frnd == 0 and (bf16_vote >= 1 if lazy else bf16_vote == 0), (feats, counts[feats, False])
        frnd, vote = counts[feats, True]
        assert frnd >= 2 and vote > bf16_vote, (feats, counts[feats, True])
    plain, lse = counts[(0, 0, 0, 0), True][0], counts[(0, 0, 1, 0), True][0]
    assert lse > plain, counts  # the LSE epilogue's k = ceil(fma(m, mul, −R))


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_bf16_top_rung_wgmmas_are_bf16(compiled):
    """The converse of the FP16 check above: the bf16 top rung's HGMMAs all carry .BF16 (so that the check can
    tell them apart) and it packs P with F2FP.BF16."""
    text = sass(compiled[rungs.TOP.key].cubin)
    hgmma = re.findall(r"HGMMA\.64x\d+x16\.F32\S*", text)
    assert hgmma and all(h.endswith(".BF16") for h in hgmma)
    assert "F2FP.BF16.F32.PACK_AB" in text and "F2FP.F16" not in text


def test_feature_variant_refuses_missing_features():
    from attnclimb.runtime.launch import feature_variant

    assert feature_variant(rungs.TOP, False, False, False) is rungs.TOP
    assert feature_variant(rungs.TOP, True, False, True) is feature_variant(rungs.TOP, True, False, True)
    # no rung of the ladder has short causal tiles (Rung.causal_short): every causal length takes the rung's own
    assert not any(r.causal_short for r in rungs.RUNGS)
    assert feature_variant(rungs.TOP, True, False, False, seqlen_k=1) is feature_variant(rungs.TOP, True, False, False)
    # a rung with them: every short causal length maps to one variant (compiled and loaded once), long ones to the
    # default tiles, non-causal calls never
    import dataclasses

    shorty = dataclasses.replace(rungs.TOP, causal_short=(2048, {"block_n": 64, "kv_box_rows": 64}))
    short = shorty.causal_short[0]
    assert shorty.takes_causal_short(short) and not shorty.takes_causal_short(short + 1)
    assert not shorty.takes_causal_short(None) and not rungs.TOP.takes_causal_short(1)
    assert feature_variant(shorty, True, False, False, seqlen_k=1) is feature_variant(
        shorty, True, False, False, seqlen_k=short
    )
    assert feature_variant(shorty, True, False, False, seqlen_k=1).block_n == 64
    assert feature_variant(shorty, True, False, False, seqlen_k=short + 1).block_n == shorty.block_n
    assert feature_variant(shorty, False, False, True, seqlen_k=1).block_n == shorty.block_n  # not causal
    # non-causal from long_kv's bound on: its tiles, one variant for every length, with or without features;
    # causal calls and other head dims never take them
    long = rungs.TOP.long_kv[0]
    plain_long = feature_variant(rungs.TOP, False, False, False, seqlen_k=long)
    assert plain_long is feature_variant(rungs.TOP, False, False, False, seqlen_k=10 * long)
    assert (plain_long.threads, plain_long.block_m, plain_long.block_n) == (512, 192, 80)
    assert feature_variant(rungs.TOP, False, False, False, seqlen_k=long - 1) is rungs.TOP
    assert feature_variant(rungs.TOP, False, True, True, seqlen_k=long, fp16=True).threads == 512
    assert feature_variant(rungs.TOP, True, False, False, seqlen_k=long).threads == rungs.TOP.threads
    assert feature_variant(rungs.TOP, False, False, False, head_dim=256, seqlen_k=long).block_n == 64
    with pytest.raises(ValueError, match="causal"):
        feature_variant(rungs.get(9), True, False, False)
    with pytest.raises(ValueError, match="fp16"):  # the rungs below 10 stay bf16-only
        feature_variant(rungs.get(9), False, False, False, fp16=True)
    fp16 = feature_variant(rungs.TOP, False, False, False, fp16=True)
    assert fp16 is feature_variant(rungs.TOP, False, False, False, fp16=True) and fp16.defines()["FP16"] == 1
    assert "FP16" not in feature_variant(rungs.TOP, True, False, False).defines()  # bf16 keys stay as they were


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize(("causal", "gqa", "strided"), [(0, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)])
def test_top_rung_head_dim_variants_compile(head_dim, causal, gqa, strided):
    """The top rung's head_dim 64 and 256 variants (issue 8), with the LSE, build without spills and within
    shared memory (head_dim 64 with causal, GQA and the LSE has the fewest registers to spare: 160 per consumer
    thread at 512 threads; a review found old rung 15's first version spilling 8 bytes there)."""
    from attnclimb.runtime.launch import feature_variant

    r = feature_variant(rungs.TOP, bool(causal), bool(gqa), True, bool(strided), head_dim)
    assert r.head_dim == head_dim and r.defines()["HEAD_DIM"] == head_dim
    c = compile_rung(r, "sm_90a")
    for res in c.resources:
        assert res.spill_bytes == 0 and res.stack_frame == 0, c.log
    assert r.smem_bytes + max(res.static_smem for res in c.resources) <= 227 * 1024
    assert SERIALIZED_WGMMA not in c.log, c.log
    with pytest.raises(ValueError, match="head_dim 96"):
        feature_variant(rungs.TOP, False, False, False, False, 96)


OVERLAP_RUNGS = [r.key for r in rungs.RUNGS if r.number >= 9]


def _softmax_windows(lines: list) -> list:
    """Per wait for S (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) in the SASS ``lines``: ``(i, j)``, that wait's line and
    the next wgmma wait's. Asserts that there is exactly one wait for P·V (``... 0x0``) between the wait for S and
    the next wgmma: ``wgmma.wait_group`` is ``.aligned`` over the warpgroup, so it may not be copied into the
    arms of a warp-uniform branch such as the lazy rescale's (the first version of old rung 16, today's 13, did,
    and compute-sanitizer's synccheck failed on it)."""
    waits = [i for i, ln in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ln]
    assert waits, "no wait_group 1 in the kernel"
    out = []
    for i in waits:
        nxt = next(j for j in range(i + 1, len(lines)) if "HGMMA" in lines[j])
        pv_waits = sum("WARPGROUP.DEPBAR.LE gsb0, 0x0" in ln for ln in lines[i:nxt])
        assert pv_waits == 1, f"{pv_waits} waits for P·V between the wait for S and the next wgmma"
        out.append((i, next(j for j in range(i + 1, len(lines)) if "WARPGROUP.DEPBAR" in lines[j])))
    return out


def _overlap_cases():
    from attnclimb.runtime.launch import feature_variant

    top = rungs.TOP
    cases = [(key, rungs.BY_NUMBER[int(key[4:])]) for key in OVERLAP_RUNGS]
    cases.append(("top-causal-gqa-strided", feature_variant(top, True, True, True, True)))
    cases.append(("top-long-kv", feature_variant(top, False, False, False, seqlen_k=top.long_kv[0])))
    cases += [(f"top-hd{d}", feature_variant(top, False, False, False, head_dim=d)) for d in top.head_dims]
    cases.append(("top-fp16", feature_variant(top, False, False, False, fp16=True)))
    cases.append(("top-fp16-causal-gqa-lse-strided", feature_variant(top, True, True, True, True, fp16=True)))
    return cases


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("case", _overlap_cases(), ids=lambda c: c[0])
def test_softmax_runs_under_the_pv_wgmma(case):
    """Rungs 9 and up overlap a warpgroup's softmax with its own P·V (FA3 Sec. 3.2): in the steady loop, after
    the wait for S (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) the whole softmax (BLOCK_N / 2 MUFU.EX2 per thread)
    must come before the wait for P·V (``... 0x0``). ptxas is free to schedule that wait first and did
    (issue 13); ``hop::keep_above_wait`` holds it, which this checks stays true. Between the wait for S and the
    next wgmma there is exactly one wait for P·V (``_softmax_windows``)."""
    _, r = case
    lines = sass(compile_rung(r, "sm_90a").cubin).splitlines()
    for i, j in _softmax_windows(lines):
        assert "gsb0, 0x0" in lines[j]
        ex2 = sum("MUFU.EX2" in ln for ln in lines[i:j])
        assert ex2 >= r.block_n // 2, f"only {ex2} MUFU.EX2 between the waits for S and for P·V"


def _p_buffer_builds(n):
    """Rung ``n``'s builds as ``(id, Rung)`` lists: those with the second P buffer (two consumer warpgroups: plain,
    causal-GQA-LSE-strided, head_dim 256, fp16 causal) and those without it (three: head_dim 64, the long-K/V
    tiles)."""
    from attnclimb.runtime.launch import feature_variant

    r, k = rungs.get(n), f"rung{n}"
    double = [(k, r), (f"{k}-causal-gqa-lse-strided", feature_variant(r, True, True, True, True))]
    double.append((f"{k}-hd256", feature_variant(r, False, False, False, head_dim=256)))
    double.append((f"{k}-fp16-causal", feature_variant(r, True, False, False, fp16=True)))
    single = [(f"{k}-hd64", feature_variant(r, False, False, False, head_dim=64))]
    single.append((f"{k}-long-kv", feature_variant(r, False, False, False, seqlen_k=r.long_kv[0])))
    return double, single


def _pack_cases():
    """Rungs 13 and 14's builds with the second P buffer (two consumer warpgroups) and those without it (three),
    and rung 12 (one P buffer). Rungs 15 and 16 pack P twice in their two-buffer builds (the exponentials first):
    ``test_exp_first_votes_after_the_exponentials``."""
    cases = []
    for n in (13, 14):
        double, single = _p_buffer_builds(n)
        cases += [(k, r, True) for k, r in double] + [(k, r, False) for k, r in single]
    return cases + [("rung12", rungs.get(12), False)]


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("case", _pack_cases(), ids=lambda c: c[0])
def test_p_double_buffer_packs_p_under_the_pv_wgmma(case):
    """Rungs 13 and 14 pack P of tile j (BLOCK_N / 4 F2FP per thread) between the wait for S_j and the wait for
    P_{j-1}·V_{j-1}, into the buffer that P·V does not read: every steady-loop window between those waits holds
    the whole pack. Where the second buffer does not fit (three consumer warpgroups: head_dim 64, the long-K/V
    tiles), and in rung 12, the pack follows the P·V wait. Between the wait for S and the next wgmma there is
    exactly one wait for P·V (``_softmax_windows``)."""
    _, r, double = case
    lines = sass(compile_rung(r, "sm_90a").cubin).splitlines()
    for i, j in _softmax_windows(lines):
        packs = sum("F2FP" in ln and "PACK_AB" in ln for ln in lines[i:j])
        # (an fp16 build also rounds the l fix's two P with F2FP.F16: at most 2 more, on both sides of the wait)
        if double:
            assert r.block_n // 4 <= packs <= r.block_n // 4 + 2, f"{packs} F2FP between the waits for S and P·V"
        else:
            assert packs <= 2, f"{packs} F2FP between the waits for S and for P·V"


def _exp_first_cases():
    """Rungs 14, 15 and 16's builds with two P buffers (rung 15's idea on from rung 15) and their three-warpgroup
    long-K/V builds (one P buffer: rungs 15 and 16 keep rung 14's softmax there)."""
    cases = []
    for n in (14, 15, 16):
        double, single = _p_buffer_builds(n)
        single = [(k, r) for k, r in single if k.endswith("-long-kv")]
        cases += [(k, r, n >= 15) for k, r in double] + [(k, r, False) for k, r in single]
    return cases


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("case", _exp_first_cases(), ids=lambda c: c[0])
def test_exp_first_votes_after_the_exponentials(case):
    """Rung 15's idea in the machine code (and rung 16's, which keeps it): in every steady-loop window between the
    wait for S and the wait for P·V, their builds with two P buffers issue the first MUFU.EX2 before the
    kept-reference vote (VOTE.ALL) and hold two packs of P (the speculative one and the full path's; an fp16 build
    also rounds the l fix's P, two per path). Rung 14, and the three-warpgroup builds of rungs 15 and 16, vote
    before the first exponential (the row-max loop ahead of them)."""
    _, r, first = case
    lines = sass(compile_rung(r, "sm_90a").cubin).splitlines()
    for i, j in _softmax_windows(lines):
        window = lines[i:j]
        ex2 = next(x for x, ln in enumerate(window) if "MUFU.EX2" in ln)
        vote = next(x for x, ln in enumerate(window) if "VOTE.ALL" in ln)
        assert (ex2 < vote) == first, f"first MUFU.EX2 at {ex2}, first VOTE.ALL at {vote} after the wait for S"
        if first:
            packs = sum("F2FP" in ln and "PACK_AB" in ln for ln in window)
            assert 2 * (r.block_n // 4) <= packs <= 2 * (r.block_n // 4) + 4, f"{packs} F2FP between the waits"


_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)([^;]*);")


def _steady_loop(text: str) -> list:
    """The opcodes of the innermost loop around the wait for S (``WARPGROUP.DEPBAR.LE gsb0, 0x1``): the
    shortest backward branch that jumps over it."""
    insns = [(int(m[1], 16), m[2], m[3]) for ln in text.splitlines() if (m := _INSN.match(ln))]
    wait = next(a for a, op, rest in insns if op == "WARPGROUP" and "gsb0, 0x1" in rest)
    spans = []
    for a, op, rest in insns:
        t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if t and int(t[1], 16) < wait < a:
            spans.append((a - int(t[1], 16), int(t[1], 16), a))
    _, lo, hi = min(spans)
    return [op for a, op, _ in insns if lo <= a <= hi]


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_const_desc_steady_loop_counts_match_its_figure(compiled):
    """The const-desc rung's budget figure (rung 11's page) quotes the steady loop's SASS of the rungs it names
    (figures/late.py LOOP_SASS: rung 11 and the rung below it): recounted here, so that a change of either kernel
    or of the compiler shows up as a stale figure."""
    from collections import Counter

    from attnclimb.figures.late import LOOP_SASS
    from attnclimb.runtime.compiler import nvrtc_version

    # the counts are those of NVRTC 13.0 (the device's toolchain and CI's oldest); another ptxas schedules
    # the loop a little differently (CI's newest 13.x: +1 UIADD3, -2 ULEA, ...), so it is not compared there
    if tuple(nvrtc_version()[:2]) != (13, 0):
        pytest.skip(f"LOOP_SASS was counted with NVRTC 13.0, this is {nvrtc_version()}")
    for number, want in LOOP_SASS.items():
        ops = _steady_loop(sass(compiled[rungs.get(number).key].cubin))
        got = Counter(ops)
        assert {k: got[k] for k in want if k != "total"} | {"total": len(ops)} == want, number


def _first_softmax_window(text: str) -> str:
    """The SASS ``text`` from the first wait for S to the next wait for P·V."""
    start = text.index("WARPGROUP.DEPBAR.LE gsb0, 0x1")
    return text[start : text.index("WARPGROUP.DEPBAR.LE gsb0, 0x0", start)]


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("number", [12, 13, 14])
def test_lazy_rescale_row_max_reduction_behind_a_vote(compiled, number):
    """The kept-reference fast path of rung 12 (and of rungs 13 and 14, which keep its order; rungs 15 and 16
    compute the exponentials first: ``test_exp_first_votes_after_the_exponentials``): in the steady loop (from
    the wait for S to the wait for P·V) the quad shuffles of the row max come after a VOTE.ALL and a branch (the
    fast path for kept references skips them), and no MUFU.EX2 precedes that vote; in rung 11's loop (the eager
    rescale) the shuffles are unconditional (no VOTE.ALL there)."""
    w = _first_softmax_window(sass(compiled[rungs.get(number).key].cubin))
    w11 = _first_softmax_window(sass(compiled[rungs.get(11).key].cubin))
    vote, shfl = w.index("VOTE.ALL"), w.index("SHFL.BFLY")
    assert vote < shfl and re.search(r"\bBRA\b", w[vote:shfl])
    assert "MUFU.EX2" not in w[:vote]
    assert "VOTE.ALL" not in w11 and "SHFL.BFLY" in w11


def _s_groups(lines: list) -> list:
    """Per wait for S (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) in the SASS ``lines``, in SASS order: ``(first,
    last)``, the lines of the WARPGROUP.ARRIVE and the last wgmma of the S = Q·Kᵀ group before it (the run of
    HGMMAs without ``tnspB``, P·V's V operand)."""
    out = []
    for w in (i for i, ln in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ln):
        last = max(i for i in range(w) if "HGMMA" in lines[i] and "tnspB" not in lines[i])
        first = max(i for i in range(last) if "WARPGROUP.ARRIVE" in lines[i])
        assert not any("tnspB" in ln for ln in lines[first:last]), "a P·V wgmma inside the S group"
        out.append((first, last))
    return out


def _s_issue_r2ur(text: str) -> list:
    """Per S group of the SASS ``text`` (``_s_groups``): the R2UR among the instructions that issue it."""
    lines = text.splitlines()
    return [sum("R2UR" in ln for ln in lines[first:last]) for first, last in _s_groups(lines)]


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize(
    "causal,gqa,lse,strided,fp16,head_dim,seqlen_k",
    [(0, 0, 0, 0, 0, 128, None), (1, 1, 1, 1, 1, 128, None), (0, 0, 0, 0, 0, 64, None), (0, 0, 0, 0, 0, 128, 10**5)],
)
def test_uniform_warp_issues_s_without_r2ur(causal, gqa, lse, strided, fp16, head_dim, seqlen_k):
    """Rung 14's S = Q·Kᵀ wgmmas take their descriptors from uniform registers, and so do rungs 15 and 16's: no
    R2UR in the instructions that issue them, where rung 13 moves the Q descriptors with at least one per S wgmma
    (plain, feature, head_dim 64 and long-K/V builds; NVRTC 13.5: 15 for the 8 wgmmas at head_dim 128, 7 for the 4
    at 64, where old rung 16, without the staged epilogue, had two each)."""
    from attnclimb.runtime.launch import feature_variant

    args = (bool(causal), bool(gqa), bool(lse), bool(strided), head_dim, seqlen_k, bool(fp16))
    before = _s_issue_r2ur(sass(compile_rung(feature_variant(rungs.get(13), *args), "sm_90a").cubin))
    assert before and min(before) >= head_dim // 16, before  # what rung 14 removes is there in rung 13
    for n in range(14, rungs.TOP.number + 1):
        after = _s_issue_r2ur(sass(compile_rung(feature_variant(rungs.get(n), *args), "sm_90a").cubin))
        assert after and max(after) == 0, (n, after)


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_uniform_warp_s_group_counts_match_its_figure(compiled):
    """The uniform warp index's figure (rung 14's page) quotes the SASS of one S group and the kernel's R2UR and
    size, in the rungs it names (figures/late.py S_GROUP_SASS, KERNEL_SASS: rung 14 and the rung below it):
    recounted here, with NVRTC 13.0 (as LOOP_SASS)."""
    from collections import Counter

    from attnclimb.figures.late import KERNEL_SASS, S_GROUP_SASS
    from attnclimb.runtime.compiler import nvrtc_version

    if tuple(nvrtc_version()[:2]) != (13, 0):
        pytest.skip(f"S_GROUP_SASS was counted with NVRTC 13.0, this is {nvrtc_version()}")
    for number, want in S_GROUP_SASS.items():
        lines = sass(compiled[rungs.get(number).key].cubin).splitlines()
        insns = [m for ln in lines if (m := _INSN.match(ln))]
        assert {"R2UR": sum(m[2] == "R2UR" for m in insns), "total": len(insns)} == KERNEL_SASS[number], number
        # the S groups in SASS order: the peeled first tile's, then the steady loop's two
        groups = [
            dict(Counter(m[2] for ln in lines[first : last + 1] if (m := _INSN.match(ln))))
            for first, last in _s_groups(lines)
        ]
        assert len(groups) == 3 and groups[1] == want, (number, groups)


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_staged_epilogue_counts_match_its_figure(compiled):
    """The staged epilogue's figure (rung 10's page) quotes the epilogue's memory instructions per thread of the
    rungs it names (figures/late.py EPILOGUE_SASS: the rung below the staged epilogue and the first rung with it):
    the first stores O as 32 four-byte STG.E and nothing wider; the second stages it with 8 stmatrix.x4 and stores
    it as 8 STG.E.128 (its 4-byte fallback for unaligned O is a second copy of the row loop: 32 STG.E, and the row
    loads appear once per copy)."""
    from collections import Counter

    from attnclimb.figures.late import EPILOGUE_SASS

    before, after = sorted(EPILOGUE_SASS)
    ops = {
        n: Counter(
            m[2] + m[3].split(" ")[0]
            for ln in sass(compiled[rungs.get(n).key].cubin).splitlines()
            if (m := _INSN.match(ln))
        )
        for n in (before, after)
    }
    assert ops[before]["STG.E"] == EPILOGUE_SASS[before]["STG.E"]
    assert not ops[before]["STG.E.128"] and not ops[before]["STSM.16.M88.4"]
    want = EPILOGUE_SASS[after]
    assert ops[after]["STSM.16.M88.4"] == want["STSM.16.M88.4"], ops[after]
    assert ops[after]["STG.E.128"] == want["STG.E.128"], ops[after]
    assert ops[after]["LDS.128"] >= want["LDS.128"], ops[after]
    assert ops[after]["STG.E"] == EPILOGUE_SASS[before]["STG.E"], ops[after]  # the fallback copy only


LATE_RUNGS = [r.key for r in rungs.RUNGS if r.number >= 9]


def test_the_ladder_from_rung_10_is_persistent_staged_and_turns_last():
    """The re-cut's order (rungs.py): the persistent grid and the epilogue through shared memory from rung 10 to
    the top (rung 9 has neither); the ping-pong turns (BAR in sass_required, named barriers in the source, the
    WAIT_TURN trace phase) on the top rung alone, the last idea of the ladder."""
    top = rungs.TOP.number
    assert [r.number for r in rungs.RUNGS if r.persistent] == list(range(10, top + 1))
    assert [r.number for r in rungs.RUNGS if r.smem_layout == "tma_ring_staged_o"] == list(range(10, top + 1))
    assert [r.number for r in rungs.RUNGS if "BAR" in r.sass_required] == [top]
    for r in rungs.RUNGS:
        src = r.source.read_text()
        turns = r.number == top
        assert ("named_bar_sync(" in src) == turns and ("named_bar_arrive(" in src) == turns, r.key
        assert ("TRACE_BEGIN(WAIT_TURN)" in src) == turns, r.key


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("key", LATE_RUNGS)
def test_staged_epilogue_and_turns_in_the_machine_code(compiled, key):
    """Rungs 10 to the top stage O with stmatrix and store it with 16-byte STG.E.128 (rung 9 stores it directly);
    only the top rung has the turns' named barriers in SASS (BAR.SYNC / BAR.ARV over both consumer warpgroups'
    256 threads, 0x100): rungs 9-15 have none."""
    r = rungs.BY_NUMBER[int(key[4:])]
    text = sass(compiled[key].cubin)
    staged = r.number >= 10
    assert bool(re.search(r"\bSTSM\b", text)) == staged and ("STG.E.128" in text) == staged, key
    turns = re.compile(r"\bBAR\.(?:SYNC\.DEFER_BLOCKING|ARV) [^;]*, 0x100\b")
    assert any(turns.search(ln) for ln in text.splitlines()) == (r.number == rungs.TOP.number), key
