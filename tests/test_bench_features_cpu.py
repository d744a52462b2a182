"""The bench's feature columns (issue 8) without a GPU: the causal and GQA shapes and their FLOPs, the
--seqlens names, which implementations run them (the top rung and the peers; the other rungs are skipped
with the reason, whatever the limits), the causal/GQA calls of each peer, the bench loop's check on them,
and the report's separate table."""

import contextlib

import pytest

from attnclimb import rungs
from attnclimb.bench import peers, report, run, shapes, timing

torch = pytest.importorskip("torch")
F = torch.nn.functional
TOP = rungs.TOP


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
    ]
    assert all(s.group == "features" and not s.headline and s.head_dim == 128 for s in fs.values())
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
    ]
    assert (gqa.detail, gqa_c.detail) == ("B2 H32/8 S8192", "B2 H32/8 S8192")
    # no head_dim 64/256 or fp16 columns: the kernels do not have them yet
    assert all(s.head_dim == 128 for s in shapes.default_shapes())


def test_feature_columns_by_name_and_group():
    causal = ("fa-1k-causal", "fa-4k-causal", "fa-8k-causal", "fa-16k-causal")
    assert shapes.parse_seqlens("causal") == causal
    assert shapes.parse_seqlens("GQA") == ("fa-8k-gqa32x8", "fa-8k-gqa32x8-causal")
    assert shapes.parse_seqlens("features,causal") == tuple(shapes.FEATURE_SHAPES)
    assert shapes.parse_seqlens("4k,fa-16k-causal,wan") == (4096, "fa-16k-causal", "wan")
    sel = shapes.default_shapes(shapes.parse_seqlens("fa-8k-gqa32x8-causal,8k,causal"))
    assert [s.name for s in sel] == ["fa-8k", *causal, "fa-8k-gqa32x8-causal"]  # column order
    assert shapes.default_shapes(shapes.parse_seqlens("causal,4k"), features=False) == [shapes.fa_shape(4096)]
    for bad in ("causals", "fa-4k-gqa"):
        with pytest.raises(ValueError, match="causal"):
            shapes.parse_seqlens(bad)


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
    impl = peers.RungImpl(rung)
    for s in shapes.default_shapes(features=False):
        assert impl.unsupported(s) is None
    for s in shapes.FEATURE_SHAPES.values():
        why = impl.unsupported(s)
        if rung is TOP:
            assert why is None
            continue
        want = "no causal or grouped-query variant" if s.causal and s.gqa else "no causal" if s.causal else "no grouped"
        assert why.startswith(want) and "only the top rung" in why
    for key in peers.PEER_KEYS:
        assert all(peers.make_peer(key).unsupported(s) is None for s in shapes.FEATURE_SHAPES.values())


def test_for_shape_sets_the_variant_on_a_copy():
    impl = peers.make_peer("sdpa_cudnn")
    plain, causal_gqa = shapes.fa_shape(4096), shapes.FEATURE_SHAPES["fa-8k-gqa32x8-causal"]
    assert impl.for_shape(plain) is impl
    c = impl.for_shape(causal_gqa)
    assert c is not impl and (c.causal, c.gqa, c.key, c.backend_name) == (True, True, "sdpa_cudnn", impl.backend_name)
    assert (impl.causal, impl.gqa) == (False, False)  # the original is untouched
    assert c.for_shape(causal_gqa) is c and c.for_shape(plain).causal is False


def _qkv(b, h, hkv, s, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n, s, 128, generator=g, dtype=torch.bfloat16) for n in (h, hkv, hkv))


@pytest.mark.parametrize("name", ["fa-4k-causal", "fa-8k-gqa32x8", "fa-8k-gqa32x8-causal"])
def test_peer_calls_compute_the_variant(name):
    """SDPA (called without its backend pin, on the CPU) and FA4 (a stand-in with flash_attn_func's
    interface: BSHD, K/V with fewer heads, causal=) compute the shape's variant: the bench's float32
    reference (causal, GQA) accepts their output."""
    s = shapes.FEATURE_SHAPES[name]
    small = shapes.Shape("t", "t", 1, s.heads, 96, 96, causal=s.causal, heads_kv=s.heads_kv, group="features")
    q, k, v = _qkv(1, small.heads, small.kv_heads, 96)
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
    assert seen[0] == ((1, 96, s.heads, 128), (1, 96, s.kv_heads, 128), s.causal)


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
        _CpuRung(rungs.BY_NUMBER[11]),
        _CpuRung(TOP),
        _Blind("rung99", "99 blind", "rung"),
        _CpuSdpa("sdpa_cudnn"),
    ]
    impls[0].max_bench_seqlen = 70  # a limit that would skip rung 11 on the main column without --no-limits
    rows, notes, settings = run.run_bench(
        impls, sh, 1, 1, respect_limits=respect_limits, progress=_Quiet(), device="cpu"
    )
    return sh, rows, notes, settings


def test_bench_loop_runs_the_feature_columns(monkeypatch):
    _, rows, _, _ = _feature_run(monkeypatch)
    st = {(r["impl"], r["shape"]): r["status"] for r in rows}
    for s in ("t-causal", "t-gqa", "t-gqa-causal"):
        assert st[("rung12", s)] == "ok" and st[("sdpa_cudnn", s)] == "ok"
    assert st[("rung11", "t-main")] == "ok"
    assert st[("rung11", "t-causal")] == "skipped: no causal variant (issue 8: only the top rung has them)"
    assert st[("rung11", "t-gqa")] == "skipped: no grouped-query variant (issue 8: only the top rung has them)"
    assert st[("rung11", "t-gqa-causal")].startswith("skipped: no causal or grouped-query variant")
    assert st[("rung99", "t-causal")].startswith("error: wrong result (rel_l2")  # the check knows the mask
    assert st[("rung99", "t-gqa")].startswith("error: ")  # torch refuses 4 query heads on 2 K/V heads
    by = {(r["impl"], r["shape"]): r for r in rows}
    r = by[("rung12", "t-gqa-causal")]
    assert (r["heads"], r["heads_kv"], r["causal"]) == (4, 2, True)
    assert r["tflops"] == pytest.approx(shapes.tflops(2 * 4 * 64 * 64 * 128, 2.0))  # the halved count
    # the rungs without the variants are skipped there even when the limits are ignored
    _, rows2, _, _ = _feature_run(monkeypatch, respect_limits=False)
    assert {(r["impl"], r["shape"]): r["status"] for r in rows2}[("rung11", "t-causal")] == st[("rung11", "t-causal")]


def test_footnote_helpers():
    assert report._impl_ranges(["rung00", "rung01", "rung02", "rung05", "rung07", "rung08", "fa4"]) == (
        "rung00–rung02, rung05, rung07, rung08, fa4"
    )
    assert report._impl_ranges(["sdpa_flash", "rung03", "rung04", "rung05"]) == "sdpa_flash, rung03–rung05"
    assert report._reasons(["a (x)", "b (x)", "a (x)"]) == "a / b; x"
    assert report._reasons(["a (x)", "b (y)"]) == "a (x) / b (y)"
    assert report._reasons(["a", "a"]) == "a"


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
    assert [line.split(" | ")[0] for line in feature_rows] == ["| 12 wide_tiles", "| 99 blind", "| SDPA cuDNN"]
    assert feature_rows[0] == "| 12 wide_tiles | 0 (1.00×) | 0 (1.00×) | 0 (1.00×) |"
    foot = [line for line in md[tables[1] :] if "not run here" in line]
    assert foot == [
        "- rung11: not run here (no causal variant / no grouped-query variant / no causal or grouped-query "
        "variant; issue 8: only the top rung has them)"
    ]
    assert any(line.startswith("- rung99 at causal: error: wrong result") for line in md)
    # the main table's phrase stays "non-causal": the variants are the other table's
    assert "bf16, head_dim 128, non-causal;" in md[2]
    # rung pages and the chart show the main columns only
    page = report.rung_page_block(doc, 12)
    assert "causal" not in page and "| **this rung 12** |" in page
    text = report.console_table(doc)
    assert "Causal and grouped-query attention" in text and "rung11" in text.split("Causal and grouped")[1]
    assert report._chart_columns(doc) == [("t-main", "main")]
