"""The bench's feature columns (issue 8) without a GPU: the causal, GQA and head_dim 64/256 shapes and their
FLOPs, the --seqlens names, which implementations run them (the top rung and the peers; the other rungs are
skipped with the reason, whatever the limits), the causal/GQA/head_dim calls of each peer, the bench loop's
check on them, and the report's separate table."""

import contextlib
import dataclasses

import pytest

from attnclimb import rungs
from attnclimb.bench import peers, report, run, shapes, timing

torch = pytest.importorskip("torch")
F = torch.nn.functional
TOP = rungs.TOP
# the rungs with issue 8's variants: rung 10 and every rung above it, which keep them
FEATURED = [r for r in rungs.RUNGS if r.features]
WHO = f"issue 8: rungs {', '.join(str(r.number) for r in FEATURED)} have them"
TOP_ROW = f"| {TOP.number} {TOP.name}"


# ------------------------------------------------------------------------------------------ shapes


def test_feature_shapes_dimensions_and_flops():
    fs = shapes.FEATURE_SHAPES
    assert list(fs) == [
        "fa-1k-causal",
        "fa-4k-causal",
        "fa-8k-causal",
        "fa-16k-causal",
        "fa-8k-gqa32x8",
        "fa-8k-gqa32x8-causal",
        "fa-8k-d64",
        "fa-8k-d64-causal",
        "fa-8k-d256",
        "fa-8k-d256-causal",
    ]
    assert all(s.group == "features" and not s.headline for s in fs.values())
    assert [s.head_dim for s in fs.values()] == [128] * 6 + [64, 64, 256, 256]
    for n in (1024, 4096, 8192, 16384):
        s = fs[f"fa-{n // 1024}k-causal"]
        assert (s.heads, s.kv_heads, s.seqlen_q, s.seqlen_k, s.causal) == (16, 16, n, n, True)
        assert s.batch * s.seqlen_q == 16384
        assert s.flops == 2 * s.batch * 16 * n * n * 128 == shapes.fa_shape(n).flops / 2  # halved
    gqa, gqa_c = fs["fa-8k-gqa32x8"], fs["fa-8k-gqa32x8-causal"]
    assert (gqa.batch, gqa.heads, gqa.kv_heads, gqa.seqlen_q, gqa.causal, gqa.gqa) == (2, 32, 8, 8192, False, True)
    assert gqa.flops == 4 * 2 * 32 * 8192 * 8192 * 128 and gqa_c.flops == gqa.flops / 2  # query heads count
    assert gqa.qkv_bytes() == 2 * (32 + 2 * 8) * 8192 * 128 * 2  # K/V bytes: 8 heads
    assert [s.label for s in fs.values()] == [
        "1k causal",
        "4k causal",
        "8k causal",
        "16k causal",
        "8k GQA 32/8",
        "8k GQA 32/8 causal",
        "8k d64",
        "8k d64 causal",
        "8k d256",
        "8k d256 causal",
    ]
    assert (gqa.detail, gqa_c.detail) == ("B2 H32/8 S8192", "B2 H32/8 S8192")
    # head_dim 64 and 256: the FA papers' convention keeps heads * head_dim = 2048 and batch * seqlen = 16384
    for d, heads in ((64, 32), (256, 8)):
        plain, causal = fs[f"fa-8k-d{d}"], fs[f"fa-8k-d{d}-causal"]
        for s in (plain, causal):
            dims = (s.batch, s.heads, s.kv_heads, s.seqlen_q, s.seqlen_k, s.head_dim)
            assert dims == (2, heads, heads, 8192, 8192, d)
            assert s.heads * s.head_dim == 2048 and s.batch * s.seqlen_q == 16384 and not s.gqa
            assert s.detail == f"B2 H{heads} S8192 D{d}"
            assert s.qkv_bytes() == 3 * 2 * heads * 8192 * d * 2
        assert (plain.causal, causal.causal) == (False, True)
        assert plain.flops == 4 * 2 * heads * 8192 * 8192 * d == 4 * 2 * 16 * 8192 * 8192 * 128  # same work as fa-8k
        assert causal.flops == plain.flops / 2
    # the main group stays head_dim 128; the other head dims are feature columns of the default run
    assert {s.head_dim for s in shapes.default_shapes(features=False)} == {128}
    assert [s.name for s in shapes.default_shapes() if s.head_dim != 128] == list(shapes.FEATURE_ALIASES["hdim"])


def test_feature_columns_by_name_and_group():
    causal = ("fa-1k-causal", "fa-4k-causal", "fa-8k-causal", "fa-16k-causal")
    assert shapes.parse_seqlens("causal") == causal
    assert shapes.parse_seqlens("GQA") == ("fa-8k-gqa32x8", "fa-8k-gqa32x8-causal")
    hdim = ("fa-8k-d64", "fa-8k-d64-causal", "fa-8k-d256", "fa-8k-d256-causal")
    assert shapes.parse_seqlens("hdim") == shapes.parse_seqlens(" HDIM ,hdim") == hdim  # not in 'causal'
    assert shapes.parse_seqlens("features,causal") == tuple(shapes.FEATURE_SHAPES)
    assert shapes.parse_seqlens("causal,gqa,hdim") == tuple(shapes.FEATURE_SHAPES)
    assert shapes.parse_seqlens("fa-8k-d256-causal,8k,fa-8k-d64") == ("fa-8k-d256-causal", 8192, "fa-8k-d64")
    sel = shapes.default_shapes(shapes.parse_seqlens("fa-8k-d256-causal,8k,fa-8k-d64"))
    assert [(s.name, s.head_dim) for s in sel] == [("fa-8k", 128), ("fa-8k-d64", 64), ("fa-8k-d256-causal", 256)]
    assert shapes.default_shapes(shapes.parse_seqlens("hdim"), features=False) == []
    assert shapes.parse_seqlens("4k,fa-16k-causal,wan") == (4096, "fa-16k-causal", "wan")
    sel = shapes.default_shapes(shapes.parse_seqlens("fa-8k-gqa32x8-causal,8k,causal"))
    assert [s.name for s in sel] == ["fa-8k", *causal, "fa-8k-gqa32x8-causal"]  # column order
    assert shapes.default_shapes(shapes.parse_seqlens("causal,4k"), features=False) == [shapes.fa_shape(4096)]
    for bad in ("causals", "fa-4k-gqa", "fa-8k-hd64", "d64", "fa-4k-d64"):  # only the columns that exist
        with pytest.raises(ValueError, match="causal, gqa, hdim, features"):
            shapes.parse_seqlens(bad)


def test_bench_help_names_the_feature_columns():
    import argparse
    import re

    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    helps = {a.dest: " ".join(a.help.split()) for a in parser._actions if a.help}
    for alias in shapes.FEATURE_ALIASES:  # every --seqlens group, and only columns that exist
        assert f"'{alias}'" in helps["seqlens"]
    named = re.findall(r"fa-\d+k-[a-z0-9-]+", helps["seqlens"])
    assert "fa-8k-d64" in named and "fa-8k-d256-causal" in named and set(named) <= set(shapes.FEATURE_SHAPES)
    assert "head_dim 64 with 32 heads and 256 with 8 at 8k" in helps["seqlens"]
    assert "causal head_dim 256" in helps["quick"] and "fa-8k-d256-causal" in shapes.QUICK_FEATURES
    assert "head_dim 64 and head_dim 256 at 8k" in helps["no_feature_columns"]
    assert "GQA and head_dim variants" in helps["no_feature_columns"]


def test_no_feature_columns_flag(monkeypatch):
    from attnclimb.__main__ import main

    seen = []
    monkeypatch.setattr(run, "hopper_status", lambda: None)
    monkeypatch.setattr(
        run.shapes_mod, "default_shapes", lambda s=None, quick=False, features=True: seen.append(features)
    )
    monkeypatch.setattr(run.peers_mod, "select_impls", lambda r, i: [])
    assert main(["bench", "--no-feature-columns"]) == 2  # nothing selected: exits before timing anything
    assert main(["bench"]) == 2
    assert seen == [False, True]


# ------------------------------------------------------------------------ who runs the columns


@pytest.mark.parametrize("rung", rungs.RUNGS, ids=lambda r: r.key)
def test_rungs_without_the_variants_are_skipped_with_the_reason(rung):
    from attnclimb import support

    impl = peers.RungImpl(rung)
    # the head dims the bench runs a rung on are the ones its calls take (attnclimb.attention checks these)
    assert set(impl.head_dims) == set(support.FEATURES_BY_RUNG[rung.number].head_dims)
    assert impl.head_dims == ((64, 128, 256) if rung in FEATURED else (128,))
    for s in shapes.default_shapes(features=False):
        assert impl.unsupported(s) is None
    want = {
        "fa-1k-causal": "no causal variant",
        "fa-4k-causal": "no causal variant",
        "fa-8k-causal": "no causal variant",
        "fa-16k-causal": "no causal variant",
        "fa-8k-gqa32x8": "no grouped-query variant",
        "fa-8k-gqa32x8-causal": "no causal or grouped-query variant",
        "fa-8k-d64": "no head_dim 64 variant",
        "fa-8k-d64-causal": "no causal or head_dim 64 variant",
        "fa-8k-d256": "no head_dim 256 variant",
        "fa-8k-d256-causal": "no causal or head_dim 256 variant",
    }
    assert list(want) == list(shapes.FEATURE_SHAPES)
    for name, s in shapes.FEATURE_SHAPES.items():
        why = impl.unsupported(s)
        if rung in FEATURED:
            assert why is None
        else:
            assert why == f"{want[name]} ({WHO})"
    for key in peers.PEER_KEYS:
        assert all(peers.make_peer(key).unsupported(s) is None for s in shapes.FEATURE_SHAPES.values())


def test_feature_columns_time_the_top_rung_only():
    """A rung below the top that has the variants (rungs 10-15 under rung 16) computes the feature columns but
    is not timed there by default (their compiles would double the bench); the main columns it runs."""
    below = [r for r in rungs.RUNGS if r.features and r is not TOP]
    assert below, "expected a rung below the top with the feature variants"
    for r in below:
        impl = peers.RungImpl(r)
        for s in shapes.FEATURE_SHAPES.values():
            assert impl.unsupported(s) is None
            assert impl.skip_reason(s) == (
                f"the feature columns time the top rung only (rung {TOP.number}; --no-limits times this one too)"
            )
        assert all(impl.skip_reason(s) is None for s in shapes.default_shapes(features=False))
    top = peers.RungImpl(TOP)
    assert all(top.skip_reason(s) is None for s in shapes.FEATURE_SHAPES.values())


def test_unsupported_head_dim_reasons_follow_the_ladder(monkeypatch):
    """The reason names who has the variant, from the ladder: the top rung alone, several rungs, or none."""
    top, r9 = peers.RungImpl(TOP), peers.RungImpl(rungs.BY_NUMBER[9])
    d96 = shapes.fa_shape(4096, head_dim=96)
    assert top.unsupported(d96) == r9.unsupported(d96) == "no head_dim 96 variant (no rung has it)"
    d96c = shapes.fa_shape(4096, head_dim=96, causal=True)
    assert top.unsupported(d96c) == "no head_dim 96 variant (no rung has it)"
    assert r9.unsupported(d96c) == "no causal or head_dim 96 variant (no rung has them)"
    three = shapes.Shape("x", "x", 1, 4, 64, 64, head_dim=64, causal=True, heads_kv=2)
    assert r9.unsupported(three) == f"no causal, grouped-query or head_dim 64 variant ({WHO})"
    assert top.unsupported(three) is None
    # a ladder where rung 9 has head_dim 64 too: the reason says so
    wider = dataclasses.replace(rungs.BY_NUMBER[9], head_dims={64: {}})
    monkeypatch.setattr(rungs, "RUNGS", tuple(wider if r.number == 9 else r for r in rungs.RUNGS))
    d64 = shapes.FEATURE_SHAPES["fa-8k-d64"]
    assert peers.RungImpl(wider).unsupported(d64) is None
    with_d64 = ", ".join(str(r.number) for r in rungs.RUNGS if 64 in r.head_dims or r.number == 9)
    assert with_d64.startswith("9, 10, 11")
    assert r9.unsupported(d64) == f"no head_dim 64 variant (issue 8: rungs {with_d64} have them)"  # r9: built before


def test_for_shape_sets_the_variant_on_a_copy():
    impl = peers.make_peer("sdpa_cudnn")
    plain, causal_gqa = shapes.fa_shape(4096), shapes.FEATURE_SHAPES["fa-8k-gqa32x8-causal"]
    assert impl.for_shape(plain) is impl
    c = impl.for_shape(causal_gqa)
    assert c is not impl and (c.causal, c.gqa, c.key, c.backend_name) == (True, True, "sdpa_cudnn", impl.backend_name)
    assert (impl.causal, impl.gqa) == (False, False)  # the original is untouched
    assert c.for_shape(causal_gqa) is c and c.for_shape(plain).causal is False


def _qkv(b, h, hkv, s, seed=0, d=128):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n, s, d, generator=g, dtype=torch.bfloat16) for n in (h, hkv, hkv))


@pytest.mark.parametrize(
    "name", ["fa-4k-causal", "fa-8k-gqa32x8", "fa-8k-gqa32x8-causal", "fa-8k-d64", "fa-8k-d256-causal"]
)
def test_peer_calls_compute_the_variant(name):
    """SDPA (called without its backend pin, on the CPU) and FA4 (a stand-in with flash_attn_func's
    interface: BSHD, K/V with fewer heads, causal=) compute the shape's variant: the bench's float32
    reference (causal, GQA, the shape's head_dim and its scale) accepts their output."""
    s = shapes.FEATURE_SHAPES[name]
    small = shapes.Shape(
        "t", "t", 1, s.heads, 96, 96, head_dim=s.head_dim, causal=s.causal, heads_kv=s.heads_kv, group="features"
    )
    q, k, v = _qkv(1, small.heads, small.kv_heads, 96, d=s.head_dim)
    pairs = timing.check_heads(small)
    refs = timing.reference_slices(q, k, v, pairs, causal=small.causal)
    seen = []

    def fa4_standin(q, k, v, causal=False):  # BSHD in and out, GQA native
        seen.append((tuple(q.shape), tuple(k.shape), causal))
        o = F.scaled_dot_product_attention(
            *(t.transpose(1, 2).float() for t in (q, k, v)), is_causal=causal, enable_gqa=k.shape[2] != q.shape[2]
        )
        return o.transpose(1, 2).bfloat16(), None

    fa4 = peers.Fa4Impl()
    fa4._fn = fa4_standin
    for impl in (peers.make_peer("sdpa_cudnn"), fa4):
        impl = impl.for_shape(small)
        out = impl.to_bhsd(impl.call(impl.prepare(q, k, v)))
        ok, _, why = timing.check_output(out, refs, pairs, small)
        assert ok, (impl.key, why)
        # without the mask the call is wrong on this shape: the check sees it
        blind = impl.for_shape(shapes.Shape("b", "b", 1, small.heads, 96, 96, heads_kv=small.heads_kv))
        if s.causal:
            ok, _, _ = timing.check_output(blind.to_bhsd(blind.call(blind.prepare(q, k, v))), refs, pairs, small)
            assert not ok
    assert seen[0] == ((1, 96, s.heads, s.head_dim), (1, 96, s.kv_heads, s.head_dim), s.causal)


class _Quiet:
    def describe(self, text):
        pass

    def advance(self, n=1):
        pass

    def log(self, text):
        pass


class _CpuRung(peers.RungImpl):
    """A rung whose attention() is a CPU stand-in honouring is_causal and GQA (the real one needs a GPU)."""

    def available(self):
        def attention(q, k, v, rung, is_causal=False):
            gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
            return F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=is_causal, **gqa
            ).bfloat16()

        self._fn = attention
        return True, ""


class _CpuSdpa(peers.SdpaImpl):
    def available(self):  # cuDNN is not in a CPU build of torch
        return True, ""

    def context(self):  # no backend pin on the CPU
        return contextlib.nullcontext()


class _Blind(peers.Impl):
    """Ignores the variant: wrong on causal columns, refused by torch on GQA ones (no enable_gqa)."""

    def call(self, p):
        q, k, v = p
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).bfloat16()


def _feature_run(monkeypatch, respect_limits=True):
    monkeypatch.setattr(timing, "median_ms", lambda fn, w, r: (fn(), 2.0)[1])
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    sh = [
        shapes.Shape("t-main", "main", 1, 2, 64, 64),
        shapes.Shape("t-causal", "causal", 2, 2, 80, 80, causal=True, group="features"),
        shapes.Shape("t-gqa", "GQA 4/2", 1, 4, 64, 64, heads_kv=2, group="features"),
        shapes.Shape("t-gqa-causal", "GQA 4/2 causal", 1, 4, 64, 64, heads_kv=2, causal=True, group="features"),
    ]
    impls = [
        _CpuRung(rungs.BY_NUMBER[9]),
        _CpuRung(TOP),
        _Blind("rung99", "99 blind", "rung"),
        _CpuSdpa("sdpa_cudnn"),
    ]
    impls[0].max_bench_seqlen = 70  # a limit that would skip rung 9 on the main column without --no-limits
    rows, notes, settings = run.run_bench(
        impls, sh, 1, 1, respect_limits=respect_limits, progress=_Quiet(), device="cpu"
    )
    return sh, rows, notes, settings


def test_bench_loop_runs_the_feature_columns(monkeypatch):
    _, rows, _, _ = _feature_run(monkeypatch)
    st = {(r["impl"], r["shape"]): r["status"] for r in rows}
    for s in ("t-causal", "t-gqa", "t-gqa-causal"):
        assert st[(TOP.key, s)] == "ok" and st[("sdpa_cudnn", s)] == "ok"
    assert st[("rung09", "t-main")] == "ok"
    assert st[("rung09", "t-causal")] == f"skipped: no causal variant ({WHO})"
    assert st[("rung09", "t-gqa")] == f"skipped: no grouped-query variant ({WHO})"
    assert st[("rung09", "t-gqa-causal")].startswith("skipped: no causal or grouped-query variant")
    assert st[("rung99", "t-causal")].startswith("error: wrong result (rel_l2")  # the check knows the mask
    assert st[("rung99", "t-gqa")].startswith("error: ")  # torch refuses 4 query heads on 2 K/V heads
    by = {(r["impl"], r["shape"]): r for r in rows}
    r = by[(TOP.key, "t-gqa-causal")]
    assert (r["heads"], r["heads_kv"], r["causal"]) == (4, 2, True)
    assert r["tflops"] == pytest.approx(shapes.tflops(2 * 4 * 64 * 64 * 128, 2.0))  # the halved count
    # the rungs without the variants are skipped there even when the limits are ignored
    _, rows2, _, _ = _feature_run(monkeypatch, respect_limits=False)
    assert {(r["impl"], r["shape"]): r["status"] for r in rows2}[("rung09", "t-causal")] == st[("rung09", "t-causal")]


def test_footnote_helpers():
    assert report._impl_ranges(["rung00", "rung01", "rung02", "rung05", "rung07", "rung08", "fa4"]) == (
        "rung00–rung02, rung05, rung07, rung08, fa4"
    )
    assert report._impl_ranges(["sdpa_flash", "rung03", "rung04", "rung05"]) == "sdpa_flash, rung03–rung05"
    assert report._reasons(["a (x)", "b (x)", "a (x)"]) == "a / b; x"
    assert report._reasons(["a (x)", "b (y)"]) == "a (x) / b (y)"
    assert report._reasons(["a", "a"]) == "a"
    # the variants a rung lacks, each named once
    top_only = "issue 8: only the top rung has them"
    reasons = [f"no {w} variant ({top_only})" for w in ("causal", "grouped-query", "causal or grouped-query")]
    assert report._reasons(reasons) == f"no causal or grouped-query variant; {top_only}"
    reasons += [f"no {w} variant ({top_only})" for w in ("head_dim 64", "causal or head_dim 64", "head_dim 256")]
    assert report._reasons(reasons) == f"no causal, grouped-query, head_dim 64 or head_dim 256 variant; {top_only}"
    assert report._reasons([f"no causal variant ({top_only})"]) == f"no causal variant; {top_only}"
    assert report._reasons(["no a variant (x)", "too slow (x)"]) == "no a variant / too slow; x"  # not all "no .."


def test_report_puts_the_feature_columns_in_their_own_table(monkeypatch):
    sh, rows, notes, _ = _feature_run(monkeypatch)
    doc = run.build_results({"device": "NVIDIA H200"}, rows, sh, {"rounds": 3}, notes)
    assert [s["group"] for s in doc["shapes"]] == ["main", "features", "features", "features"]
    assert [s["heads_kv"] for s in doc["shapes"]] == [2, 2, 2, 2]
    md = report.markdown_table(doc).splitlines()
    tables = [i for i, line in enumerate(md) if line.startswith("| impl")]
    assert len(tables) == 2
    assert md[tables[0]] == "| impl | main (B1 H2 S64) |"  # the main table: main columns only
    title = next(line for line in md if line.startswith("**Causal and grouped-query attention (issue 8)**: "))
    assert "halved for causal" in title and md.index(title) < tables[1]
    assert md[tables[1]] == "| impl | causal (B2 H2 S80) | GQA 4/2 (B1 H4/2 S64) | GQA 4/2 causal (B1 H4/2 S64) |"
    feature_rows = [line for line in md[tables[1] + 2 :] if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in feature_rows] == [TOP_ROW, "| 99 blind", "| SDPA cuDNN"]
    assert feature_rows[0] == f"{TOP_ROW} | 0 (1.00×) | 0 (1.00×) | 0 (1.00×) |"
    foot = [line for line in md[tables[1] :] if "not run here" in line]
    assert foot == [f"- rung09: not run here (no causal or grouped-query variant; {WHO})"]
    assert any(line.startswith("- rung99 at causal: error: wrong result") for line in md)
    # the main table's phrase stays "non-causal": the variants are the other table's
    assert "bf16, head_dim 128, non-causal;" in md[2]
    # rung pages and the chart show the main columns only
    page = report.rung_page_block(doc, TOP.number)
    assert "causal" not in page and f"| **this rung {TOP.number}** |" in page
    text = report.console_table(doc)
    assert "Causal and grouped-query attention" in text and "rung09" in text.split("Causal and grouped")[1]
    assert report._chart_columns(doc) == [("t-main", "main")]


# ------------------------------------------------------------------------------ head_dim 64 and 256


class _FixedScale(peers.RungImpl):
    """A rung stand-in that scales by 1/sqrt(128) whatever the head_dim (the head_dim-128 kernel's constant)."""

    def available(self):
        def attention(q, k, v, rung, is_causal=False):
            return F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=is_causal, scale=128**-0.5
            ).bfloat16()

        self._fn = attention
        return True, ""


class _Crop(peers.Impl):
    """Returns head_dim 128 columns whatever the input's head_dim (zero-padded or cropped)."""

    def call(self, p):
        q, k, v = p
        o = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).bfloat16()
        return F.pad(o, (0, 128 - o.shape[-1])) if o.shape[-1] < 128 else o[..., :128]


def _head_dim_run(monkeypatch):
    monkeypatch.setattr(timing, "median_ms", lambda fn, w, r: (fn(), 2.0)[1])
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    made = []
    make_inputs = timing.make_inputs
    monkeypatch.setattr(
        timing, "make_inputs", lambda shape, n, **kw: made.append(make_inputs(shape, n, **kw)) or made[-1]
    )
    sh = [  # the FA convention at a small size: heads * head_dim = 256
        shapes.Shape("t-main", "main", 1, 2, 64, 64),
        shapes.Shape("t-d64", "d64", 2, 4, 64, 64, head_dim=64, group="features"),
        shapes.Shape("t-d64-causal", "d64 causal", 2, 4, 80, 80, head_dim=64, causal=True, group="features"),
        shapes.Shape("t-d256", "d256", 2, 1, 64, 64, head_dim=256, group="features"),
        shapes.Shape("t-d256-causal", "d256 causal", 2, 1, 80, 80, head_dim=256, causal=True, group="features"),
    ]
    top_fixed = _FixedScale(TOP)
    top_fixed.key, top_fixed.label = "rung98", "98 fixed scale"  # the top rung's variants, a wrong scale
    impls = [_CpuRung(rungs.BY_NUMBER[9]), _CpuRung(TOP), top_fixed, _Crop("rung97", "97 crop", "rung")]
    impls.append(_CpuSdpa("sdpa_cudnn"))
    rows, notes, _ = run.run_bench(impls, sh, 1, 1, progress=_Quiet(), device="cpu")
    return sh, rows, notes, made


def test_bench_loop_runs_the_head_dim_columns(monkeypatch):
    sh, rows, _, made = _head_dim_run(monkeypatch)
    # inputs of the shape's head_dim; K/V as Q here (no GQA)
    assert [tuple(t.shape for t in sets[0]) for sets in made] == [
        ((s.batch, s.heads, s.seqlen_q, s.head_dim),) * 3 for s in sh
    ]
    st = {(r["impl"], r["shape"]): r["status"] for r in rows}
    for s in sh:
        assert st[(TOP.key, s.name)] == "ok" and st[("sdpa_cudnn", s.name)] == "ok"
    assert st[("rung09", "t-main")] == "ok" and st[("rung98", "t-main")] == "ok"  # 1/sqrt(128) is right at 128
    top_only = WHO
    assert st[("rung09", "t-d64")] == f"skipped: no head_dim 64 variant ({top_only})"
    assert st[("rung09", "t-d64-causal")] == f"skipped: no causal or head_dim 64 variant ({top_only})"
    assert st[("rung09", "t-d256")] == f"skipped: no head_dim 256 variant ({top_only})"
    assert st[("rung09", "t-d256-causal")] == f"skipped: no causal or head_dim 256 variant ({top_only})"
    for name in ("t-d64", "t-d64-causal", "t-d256", "t-d256-causal"):
        assert st[("rung98", name)].startswith("error: wrong result (rel_l2")  # the reference scales by the head_dim
        assert st[("rung97", name)].startswith("error: wrong result (output shape")
    by = {(r["impl"], r["shape"]): r for r in rows}
    for s in sh:
        r = by[(TOP.key, s.name)]
        assert (r["head_dim"], r["heads"], r["heads_kv"], r["causal"]) == (s.head_dim, s.heads, s.heads, s.causal)
        flops = 4 * s.batch * s.heads * s.seqlen_q * s.seqlen_k * s.head_dim / (2 if s.causal else 1)
        assert r["tflops"] == pytest.approx(flops / 2e-3 / 1e12, rel=1e-5)  # 2 ms a call, the head_dim counted


def test_report_shows_the_head_dim_columns(monkeypatch):
    sh, rows, notes, _ = _head_dim_run(monkeypatch)
    gqa = shapes.Shape("t-gqa", "GQA 4/2", 1, 4, 64, 64, heads_kv=2, group="features")
    rows += [run.make_row(i, gqa, "ok", ms=1.0) for i in (TOP.key, "sdpa_cudnn")]
    rows.append(run.make_row("rung09", gqa, f"skipped: no grouped-query variant ({WHO})"))
    doc = run.build_results({"device": "NVIDIA H200"}, rows, [*sh, gqa], {"rounds": 3}, notes)
    assert [s["head_dim"] for s in doc["shapes"]] == [128, 64, 64, 256, 256, 128]
    assert {(r["shape"], r["head_dim"]) for r in doc["rows"]} == {(s.name, s.head_dim) for s in [*sh, gqa]}
    md = report.markdown_table(doc).splitlines()
    tables = [i for i, line in enumerate(md) if line.startswith("| impl")]
    assert md[tables[0]] == "| impl | main (B1 H2 S64) |"
    # every head_dim column's header gives its dimensions, D included
    assert md[tables[1]] == (
        "| impl | d64 (B2 H4 S64 D64) | d64 causal (B2 H4 S80 D64) | d256 (B2 H1 S64 D256) | "
        "d256 causal (B2 H1 S80 D256) | GQA 4/2 (B1 H4/2 S64) |"
    )
    title = next(line for line in md if line.startswith("**Causal and grouped-query attention, head_dim 64 and 256 "))
    assert "(issue 8)**: " in title and md.index(title) < tables[1]
    assert "bf16, head_dim 128 unless the column says (D64, D256: heads·head_dim = 2048 as in the FA papers)" in title
    assert "head_dim 128;" not in title  # the head_dim-128-only caption of the results without these columns
    feature_rows = [line for line in md[tables[1] + 2 :] if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in feature_rows] == [
        TOP_ROW,
        "| 97 crop",
        "| 98 fixed scale",
        "| SDPA cuDNN",
    ]
    assert feature_rows[0] == f"{TOP_ROW} | 0 (1.00×) | 0 (1.00×) | 0 (1.00×) | 0 (1.00×) | 0 (1.00×) |"
    foot = [line for line in md[tables[1] :] if "not run here" in line]
    assert foot == [f"- rung09: not run here (no causal, grouped-query, head_dim 64 or head_dim 256 variant; {WHO})"]
    for lab in ("d64", "d64 causal", "d256", "d256 causal"):
        assert sum(line.startswith(f"- rung98 at {lab}: error: wrong result (rel_l2") for line in md) == 1
        assert sum(line.startswith(f"- rung97 at {lab}: error: wrong result (output shape") for line in md) == 1
    assert "- rung97 at d64: error: wrong result (output shape (2, 4, 64, 128) != (2, 4, 64, 64))" in md
    # the main table and its caption, the rung pages and the chart keep to the main (head_dim 128) columns
    assert "bf16, head_dim 128, non-causal;" in md[2]
    page = report.rung_page_block(doc, TOP.number)
    assert "d64" not in page and "d256" not in page and f"| **this rung {TOP.number}** |" in page
    assert report._chart_columns(doc) == [("t-main", "main")]
    text = report.console_table(doc)
    assert "d64 (B2 H4 S64 D64)" in text and "head_dim 64 and 256" in " ".join(text.split())
    # results whose feature columns are all head_dim 128 keep the caption they had
    plain = dict(doc, shapes=[s for s in doc["shapes"] if s["head_dim"] == 128])
    intro = report.feature_model(plain)[0]
    assert (
        intro.startswith("Causal and grouped-query attention (issue 8): ")
        and "bf16, head_dim 128; causal columns:" in intro
    )


def test_report_of_the_default_feature_columns():
    """The feature table a default run writes (fabricated times; the skip reasons the runner would write):
    the headers of the head_dim columns give their dimensions although they are FA-paper columns."""
    sh = [shapes.fa_shape(4096), *shapes.FEATURE_SHAPES.values()]
    rows = []
    for s in sh:
        for rung in rungs.RUNGS:
            impl = peers.RungImpl(rung)
            why = impl.unsupported(s)
            rows.append(run.make_row(impl.key, s, f"skipped: {why}" if why else "ok", ms=1.0, label=impl.label))
        rows.append(run.make_row("sdpa_cudnn", s, "ok", ms=1.25))
    doc = run.build_results({"device": "NVIDIA H200"}, rows, sh, {"rounds": 3}, [])
    md = report.markdown_table(doc).splitlines()
    tables = [i for i, line in enumerate(md) if line.startswith("| impl")]
    assert md[tables[0]] == "| impl | 4k |"
    assert md[tables[1]] == (
        "| impl | 1k causal | 4k causal | 8k causal | 16k causal | 8k GQA 32/8 (B2 H32/8 S8192) | "
        "8k GQA 32/8 causal (B2 H32/8 S8192) | 8k d64 (B2 H32 S8192 D64) | 8k d64 causal (B2 H32 S8192 D64) | "
        "8k d256 (B2 H8 S8192 D256) | 8k d256 causal (B2 H8 S8192 D256) |"
    )
    assert [line.split(" | ")[0] for line in md[tables[1] + 2 :] if line.startswith("| ")] == [
        *(f"| {r.number} {r.name}" for r in FEATURED),
        "| SDPA cuDNN",
    ]
    assert [line for line in md if "not run here" in line] == [
        f"- rung00–rung09: not run here (no causal, grouped-query, head_dim 64 or head_dim 256 variant; {WHO})"
    ]
    title = next(line for line in md if line.startswith("**Causal and grouped-query attention, head_dim 64 and 256"))
    assert "; 16 heads where the column gives no dimensions, batch·seqlen = 16384;" in title
    by = {(r["impl"], r["shape"]): r for r in doc["rows"]}
    for name in shapes.FEATURE_ALIASES["hdim"]:  # 1 ms against 1.25 ms, and the FLOPs of fa-8k (halved if causal)
        r = by[(TOP.key, name)]
        assert r["ratio_to_cudnn"] == 1.25
        flops = shapes.fa_shape(8192).flops / (2 if r["causal"] else 1)
        assert r["tflops"] == pytest.approx(flops / 1e-3 / 1e12, rel=1e-5)  # (rows keep 6 digits)
