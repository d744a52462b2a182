"""CPU-only tests of the bench harness: FLOP count, shapes, JSON rows, README table, chart, no-GPU exit."""

import json
import math
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from scripts_loader import load_script

from attnclimb.bench import peers, report, run, shapes, timing
from attnclimb.rungs import RUNGS, TOP

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ FLOPs


def test_flop_formula():
    assert shapes.attention_flops(4, 16, 4096, 4096, 128) == 4 * 4 * 16 * 4096 * 4096 * 128
    assert shapes.attention_flops(4, 16, 4096, 4096, 128, causal=True) == 2 * 4 * 16 * 4096 * 4096 * 128
    assert shapes.attention_flops(1, 2, 3, 5, 128) == 4 * 2 * 3 * 5 * 128  # Sq != Sk
    # head_dim counts linearly: 32 heads of 64 and 8 heads of 256 do the work of 16 heads of 128
    assert shapes.attention_flops(2, 32, 8192, 8192, 64) == 4 * 2 * 32 * 8192 * 8192 * 64
    assert shapes.attention_flops(2, 8, 8192, 8192, 256, causal=True) == 2 * 2 * 8 * 8192 * 8192 * 256
    assert shapes.attention_flops(2, 32, 8192, 8192, 64) == shapes.attention_flops(2, 16, 8192, 8192, 128)
    assert shapes.attention_flops(2, 8, 8192, 8192, 256) == shapes.attention_flops(2, 16, 8192, 8192, 128)
    assert shapes.attention_flops(1, 1, 10, 10, 256) == 2 * shapes.attention_flops(1, 1, 10, 10, 128)
    d256 = shapes.FEATURE_SHAPES["fa-8k-d256-causal"]
    row = run.make_row("rung16", d256, "ok", ms=2.0)
    assert (row["head_dim"], row["heads"], row["causal"]) == (256, 8, True)
    assert row["tflops"] == pytest.approx(2 * 2 * 8 * 8192 * 8192 * 256 / 2e-3 / 1e12, rel=1e-5)
    # 1 ms for 1e12 FLOPs is 1000 TFLOP/s
    assert shapes.tflops(1e12, 1.0) == pytest.approx(1000.0)
    # the FA 4k shape at 0.9 ms: 4*4*16*4096^2*128 / 0.9e-3 / 1e12
    s = shapes.fa_shape(4096)
    assert shapes.tflops(s.flops, 0.9) == pytest.approx(549755813888 / 0.9e-3 / 1e12)
    with pytest.raises(ValueError):
        shapes.tflops(1e12, 0.0)


# ----------------------------------------------------------------------------------------- shapes


def test_default_shapes():
    every = shapes.default_shapes()
    sh = [s for s in every if s.group == "main"]
    assert sh == shapes.default_shapes(features=False) and every[: len(sh)] == sh  # the feature group comes last
    assert [s.name for s in every[len(sh) :]] == list(shapes.FEATURE_SHAPES)
    fa = [s for s in sh if s.name.startswith("fa-")]
    assert [s.seqlen_q for s in fa] == [1024, 2048, 4096, 8192, 16384]
    for s in fa:
        assert s.batch * s.seqlen_q == 16384
        assert (s.heads, s.head_dim, s.causal, s.seqlen_k, s.kv_heads) == (16, 128, False, s.seqlen_q, 16)
        assert s.headline == (s.seqlen_q in (4096, 8192, 16384))
    assert [s.name for s in sh[len(fa) :]] == ["wan2.1-1.3b-480p", "wan2.1-14b-720p", "wan2.1-14b-720p-cross"]
    wan, wan14, cross = sh[len(fa) :]
    assert (wan.batch, wan.heads, wan.seqlen_q, wan.seqlen_k, wan.head_dim, wan.causal) == (
        1,
        12,
        32760,
        32760,
        128,
        False,
    )
    assert 21 * (480 // 16) * (832 // 16) == wan.seqlen_q  # 21 latent frames x 30 x 52 patches
    # Wan2.1-14B, 720p, 81 frames: 1 + 80/4 = 21 latent frames of (720/8/2) x (1280/8/2) patches; dim 5120
    assert (wan14.batch, wan14.heads, wan14.seqlen_q, wan14.seqlen_k) == (1, 40, 75600, 75600)
    assert (1 + 80 // 4) * (720 // 16) * (1280 // 16) == wan14.seqlen_q and wan14.heads * wan14.head_dim == 5120
    assert (cross.batch, cross.heads, cross.seqlen_q, cross.seqlen_k) == (1, 40, 75600, 512)  # 512 umT5 tokens
    assert all((s.head_dim, s.causal, s.kv_heads, s.headline) == (128, False, s.heads, False) for s in (wan14, cross))
    assert [s.label for s in fa] == ["1k", "2k", "4k", "8k", "16k"]
    assert [s.label for s in sh[len(fa) :]] == ["Wan2.1-1.3B 480p", "Wan2.1-14B 720p", "Wan2.1-14B 720p cross-attn"]
    assert [s.detail for s in sh[len(fa) :]] == ["B1 H12 S32760", "B1 H40 S75600", "B1 H40 Sq75600 Sk512"]
    assert len({s.name for s in every}) == len(every) and len({s.label for s in every}) == len(every)


def test_new_wan_shapes_flops_and_bytes():
    wan14, cross = shapes.WAN14B_SHAPE, shapes.WAN_CROSS_SHAPE
    assert wan14.flops == 117_050_572_800_000.0 == 4 * 40 * 75600 * 75600 * 128  # ~1.17e14
    assert cross.flops == 792_723_456_000.0 == 4 * 40 * 75600 * 512 * 128
    assert shapes.tflops(wan14.flops, 200.0) == pytest.approx(585.25, abs=0.01)  # ~200 ms a call at 585
    assert wan14.qkv_bytes() == 3 * 40 * 75600 * 128 * 2
    assert cross.qkv_bytes() == 40 * (75600 + 2 * 512) * 128 * 2  # q is long, k and v short
    assert cross.seqlen == 75600  # what max_bench_seqlen is compared with


def test_quick_and_parsed_shapes():
    quick = shapes.default_shapes(quick=True)
    assert [(s.seqlen_q, s.group) for s in quick] == [(4096, "main"), (16384, "main"), (32760, "main")] + [
        (4096, "features"),
        (8192, "features"),
        (8192, "features"),
        (8192, "features"),
    ]
    # one feature column each: causal, GQA, and the head dims 64 and 256 (each with tile sizes of its own)
    names = ["fa-4k-causal", "fa-8k-gqa32x8-causal", "fa-8k-d64-causal", "fa-8k-d256-causal"]
    assert [s.name for s in quick[3:]] == names
    assert [s.head_dim for s in quick] == [128] * 5 + [64, 256]
    assert TOP.head_dims[256] and TOP.head_dims[64]  # why both: each variant changes the tiles
    assert [s.seqlen_q for s in shapes.default_shapes(quick=True, features=False)] == [4096, 16384, 32760]
    assert shapes.parse_seqlens("1k, 4096,wan,4k") == (1024, 4096, "wan")
    assert shapes.parse_seqlens("wan-cross,WAN14B,wan2.1-14b-720p,wan2.1-1.3b-480p") == ("wan-cross", "wan14b", "wan")
    assert shapes.parse_seqlens("wan2.1-14b-720p-cross,wancross,wan14b-cross,wan2.1-14b") == ("wan-cross", "wan14b")
    sel = shapes.default_shapes(shapes.parse_seqlens("wan-cross,8k,wan14b"))  # column order, not the given order
    assert [s.name for s in sel] == ["fa-8k", "wan2.1-14b-720p", "wan2.1-14b-720p-cross"]
    sel = shapes.default_shapes(shapes.parse_seqlens("8k,2k"))
    assert [s.name for s in sel] == ["fa-2k", "fa-8k"]
    odd = shapes.fa_shape(1000)  # not a multiple of 1024: tails get exercised
    assert (odd.label, odd.batch) == ("1000", 16)
    for bad in ("x", "0", "-4", ",", "wan14", "wan-crosss"):
        with pytest.raises(ValueError):
            shapes.parse_seqlens(bad)


def test_shape_variants_carry_causal_gqa_and_head_dim_consistently():
    base = shapes.fa_shape(4096)
    assert (base.name, base.label, base.detail, base.headline) == ("fa-4k", "4k", "B4 H16 S4096", True)
    causal = shapes.fa_shape(4096, causal=True)
    assert (causal.name, causal.label, causal.headline) == ("fa-4k-causal", "4k causal", False)
    assert causal.flops == base.flops / 2 and causal.qkv_bytes() == base.qkv_bytes()
    d64 = shapes.fa_shape(16384, head_dim=64)  # the FA papers keep heads * head_dim = 2048
    assert (d64.name, d64.label, d64.heads, d64.detail) == ("fa-16k-d64", "16k d64", 32, "B1 H32 S16384 D64")
    assert d64.flops == shapes.fa_shape(16384).flops
    d256 = shapes.fa_shape(4096, head_dim=256, causal=True)
    assert (d256.name, d256.label, d256.heads) == ("fa-4k-d256-causal", "4k d256 causal", 8)
    gqa = shapes.fa_shape(8192, heads=32, heads_kv=8)  # an LLM's grouped-query attention
    assert (gqa.name, gqa.label, gqa.detail) == ("fa-8k-gqa32x8", "8k GQA 32/8", "B2 H32/8 S8192")
    assert (gqa.kv_heads, gqa.gqa) == (8, True)
    assert gqa.flops == 4 * 2 * 32 * 8192 * 8192 * 128  # FLOPs count query heads
    assert gqa.qkv_bytes() == 2 * (32 + 2 * 8) * 8192 * 128 * 2  # bytes count K/V heads
    assert shapes.fa_shape(4096, heads=8).name == "fa-4k-h8"  # a non-standard head count is named
    assert shapes.fa_shape(4096, heads_kv=16) == base  # equal head counts are the plain shape
    variants = (base, causal, d64, d256, gqa)
    assert len({s.name for s in variants}) == len({s.label for s in variants}) == len(variants)
    with pytest.raises(ValueError):
        shapes.Shape("x", "x", 1, 32, 64, 64, heads_kv=12)  # 12 does not divide 32
    with pytest.raises(ValueError):
        shapes.Shape("x", "x", 1, 0, 64, 64)


def test_input_sets_exceed_twice_l2():
    l2 = 60 * 1024 * 1024
    for s in shapes.default_shapes() + [shapes.fa_shape(64)]:
        n = timing.num_input_sets(s.qkv_bytes(), l2)
        assert n >= 3
        assert n * s.qkv_bytes() > 2 * l2
    assert shapes.fa_shape(4096).qkv_bytes() == 3 * 16384 * 16 * 128 * 2


def test_round_order():
    # 4 impls, 3 rounds: forwards, backwards, then forwards from half-way down the list
    assert [timing.round_order(4, r, 3) for r in range(3)] == [[0, 1, 2, 3], [3, 2, 1, 0], [2, 3, 0, 1]]
    assert [timing.round_order(2, r, 2) for r in range(2)] == [[0, 1], [1, 0]]
    assert [timing.round_order(3, r, 4) for r in range(4)] == [[0, 1, 2], [2, 1, 0], [1, 2, 0], [0, 2, 1]]
    assert timing.round_order(5, 0, 1) == [0, 1, 2, 3, 4] and timing.round_order(0, 1, 3) == []
    for n in (1, 2, 3, 7, 14, 15):
        for rounds in (2, 3, 5):
            orders = [timing.round_order(n, r, rounds) for r in range(rounds)]
            assert all(sorted(o) == list(range(n)) for o in orders)  # each impl once per round
            for a, b in zip(orders[::2], orders[1::2]):  # a forward/backward pair: equal mean positions
                assert all(a.index(i) + b.index(i) == n - 1 for i in range(n))
            if n >= 2:
                assert orders[1] != orders[0]
            if n >= 3 and rounds >= 3:  # and the next pair starts elsewhere
                assert orders[2] not in orders[:2]
    for bad in ((3, 3, 3), (3, -1, 3), (3, 0, 0), (-1, 0, 1)):
        with pytest.raises(ValueError):
            timing.round_order(*bad)


def test_median_of_rounds():
    assert timing.median_of_rounds([3.0, 1.0, 2.0]) == 2.0  # the middle round, whatever its position
    assert timing.median_of_rounds([1.0, 9.0, 1.5]) == 1.5  # one slow round does not move it
    assert timing.median_of_rounds([4.0, 1.0, 2.0, 10.0]) == 3.0  # even count: mean of the middle two
    assert timing.median_of_rounds([0.7]) == 0.7
    with pytest.raises(ValueError):
        timing.median_of_rounds([])
    s = shapes.fa_shape(4096)
    r = run.make_row("rung04", s, "ok", rounds_ms=[1.25, 1.0, 1.5])
    assert r["ms"] == 1.25 and r["rounds_ms"] == [1.25, 1.0, 1.5]
    assert r["tflops"] == pytest.approx(s.flops / 1.25e-3 / 1e12, rel=1e-5)
    assert run.make_row("rung04", s, "skipped: x", rounds_ms=[1.0])["rounds_ms"] is None


def test_rotating_cycles_through_sets():
    seen = []
    fn = timing.rotating(seen.append, ["a", "b", "c"])
    for _ in range(7):
        fn()
    assert seen == ["a", "b", "c", "a", "b", "c", "a"]


def test_rel_l2_and_reference_on_cpu():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 128, generator=g) for _ in range(3))
    pairs = [(0, 0), (1, 2)]
    refs = timing.reference_slices(q, k, v, pairs, chunk_rows=16)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    for (b, h), r in zip(pairs, refs):
        assert timing.rel_l2(r, sdpa[b, h]) < 1e-5
    a = torch.tensor([3.0, 4.0])
    assert timing.rel_l2(a + torch.tensor([0.3, 0.4]), a) == pytest.approx(0.1)
    assert timing.rel_l2(torch.tensor([float("nan"), 0.0]), a) == float("inf")
    shape = shapes.Shape("t", "t", 2, 3, 37, 37)
    ok, err, _ = timing.check_output(sdpa.bfloat16(), refs, pairs, shape)
    assert ok and err < 1e-2
    bad = sdpa.clone()
    bad[1, 2, 20:] = 0  # a wrong tail in the last head must be caught
    ok, err, why = timing.check_output(bad, refs, pairs, shape)
    assert not ok and err > 1e-2 and "rel_l2" in why


@pytest.mark.parametrize("causal", [False, True])
def test_inputs_and_reference_for_gqa_and_causal_on_cpu(causal):
    torch = pytest.importorskip("torch")
    shape = shapes.Shape("g", "g", 2, 4, 40, 24, causal=causal, heads_kv=2)  # Sq > Sk: some rows see all keys
    sets = timing.make_inputs(shape, 2, device="cpu")
    q, k, v = sets[0]
    assert q.shape == (2, 4, 40, 128) and k.shape == v.shape == (2, 2, 24, 128)
    assert not torch.equal(sets[0][0], sets[1][0])
    for d in (64, 256):  # the inputs take the shape's head_dim
        other = shapes.Shape("g", "g", 2, 4, 40, 24, head_dim=d, causal=causal, heads_kv=2)
        oq, ok_, ov = timing.make_inputs(other, 1, device="cpu")[0]
        assert (oq.shape, ok_.shape, ov.shape) == ((2, 4, 40, d), (2, 2, 24, d), (2, 2, 24, d))
        assert oq.dtype == ok_.dtype == ov.dtype == torch.bfloat16
    pairs = [(0, 0), (0, 1), (1, 2), (1, 3)]
    refs = timing.reference_slices(q, k, v, pairs, chunk_rows=7, causal=causal)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=causal, enable_gqa=True
    )
    for (b, h), r in zip(pairs, refs):
        assert timing.rel_l2(r, want[b, h]) < 1e-5
    # the wrong K/V head or the wrong mask is caught
    other = timing.reference_slices(q, k, v, pairs, chunk_rows=7, causal=not causal)
    assert timing.rel_l2(other[0], want[0, 0]) > 1e-2
    swapped = timing.reference_slices(q, k.flip(1), v.flip(1), pairs, causal=causal)
    assert timing.rel_l2(swapped[0], want[0, 0]) > 1e-2


# --------------------------------------------------------------------------------------- impls


def test_impl_selection():
    keys = lambda impls: [i.key for i in impls]
    all_keys = [r.key for r in RUNGS] + list(peers.PEER_KEYS)
    assert keys(peers.select_impls()) == all_keys
    assert keys(peers.select_impls("0,1")) == ["rung00", "rung01", *peers.PEER_KEYS]
    assert keys(peers.select_impls(None, "sdpa_cudnn,fa4")) == ["sdpa_cudnn", "fa4"]
    assert keys(peers.select_impls("1", "fa4,sdpa_cudnn")) == ["rung01", "sdpa_cudnn", "fa4"]
    assert keys(peers.select_impls("rung1,00", "rung2")) == ["rung00", "rung01"]
    assert keys(peers.select_impls(None, "rung00,sdpa")) == ["rung00", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient"]
    with pytest.raises(ValueError):
        peers.select_impls("999")
    with pytest.raises(ValueError):
        peers.select_impls(None, "cublas")


def test_slow_rungs_skip_big_shapes():
    limited = [r for r in RUNGS if r.max_bench_seqlen is not None]
    if not limited:
        pytest.skip("no rung has a max_bench_seqlen")
    r = limited[0]
    impl = peers.RungImpl(r)
    fits = shapes.fa_shape(r.max_bench_seqlen)
    assert impl.skip_reason(fits) is None
    too_big = shapes.WAN_SHAPE
    assert too_big.seqlen > r.max_bench_seqlen
    assert f"> {r.max_bench_seqlen}" in impl.skip_reason(too_big)
    assert peers.make_peer("sdpa_cudnn").skip_reason(too_big) is None


# ---------------------------------------------------------------------------------- rows / JSON


def _synthetic_doc():
    sh = [shapes.fa_shape(4096), shapes.fa_shape(8192), shapes.WAN_SHAPE]
    tf = {"rung02": 300.0, "rung04": 450.0, "sdpa_cudnn": 600.0, "sdpa_flash": 340.0, "fa4": 660.0}
    rows = []
    for s in sh:
        for impl, t in tf.items():
            label = {"rung02": "02 mma_sync", "rung04": "04 fast_softmax"}.get(impl)
            if impl == "rung02" and s.name == "fa-8k":
                rows.append(run.make_row(impl, s, "error: wrong result (rel_l2 2.0e-01 > 0.01)", label=label))
            elif impl == "rung02" and s is shapes.WAN_SHAPE:
                rows.append(
                    run.make_row(impl, s, "skipped: too slow for seqlen > 8192 (max_bench_seqlen)", label=label)
                )
            else:
                ms = s.flops / (t * 1e12) * 1e3
                rows.append(run.make_row(impl, s, "ok", ms=ms, label=label, rel_l2=2.5e-3))
    env = {
        "device": "NVIDIA H200",
        "driver_version": "580.95.05",
        "torch_version": "2.11.0+cu130",
        "cuda_version": "13.0",
        "cudnn_version": 91900,
        "commit": "0123456789abcdef0123" + "0" * 20 + "-dirty",
        "date": "2026-11-30T12:34:56+00:00",
        "gpu_clocks": {"start": None, "end": None},
    }
    return run.build_results(env, rows, sh, {"warmup_ms": 50, "rep_ms": 200}, ["fa4 skipped: test"])


def test_json_row_schema_and_ratios(tmp_path):
    doc = _synthetic_doc()
    for k in (
        "device",
        "driver_version",
        "torch_version",
        "cudnn_version",
        "cuda_version",
        "commit",
        "date",
        "gpu_clocks",
        "rows",
        "shapes",
    ):
        assert k in doc
    required = {
        "impl",
        "batch",
        "heads",
        "seqlen_q",
        "seqlen_k",
        "head_dim",
        "causal",
        "ms",
        "tflops",
        "ratio_to_cudnn",
        "status",
    }
    for r in doc["rows"]:
        assert required <= set(r)
        assert set(r) == set(run.ROW_FIELDS)
        assert r["status"] == "ok" or r["status"].startswith(("skipped: ", "error: "))
        if r["status"] == "ok":
            assert r["ms"] > 0 and r["tflops"] > 0
        else:
            assert r["ms"] is None and r["tflops"] is None and r["ratio_to_cudnn"] is None
    by = {(r["impl"], r["shape"]): r for r in doc["rows"]}
    assert by[("rung04", "fa-4k")]["tflops"] == pytest.approx(450.0, abs=0.01)
    assert by[("rung04", "fa-4k")]["ratio_to_cudnn"] == pytest.approx(0.75)
    assert by[("fa4", "wan2.1-1.3b-480p")]["ratio_to_cudnn"] == pytest.approx(1.1)
    assert by[("sdpa_cudnn", "fa-8k")]["ratio_to_cudnn"] == 1.0
    w = by[("rung04", "wan2.1-1.3b-480p")]
    assert (w["batch"], w["heads"], w["seqlen_q"], w["seqlen_k"], w["head_dim"], w["causal"]) == (
        1,
        12,
        32760,
        32760,
        128,
        False,
    )
    assert w["ms"] == pytest.approx(shapes.WAN_SHAPE.flops / 450e12 * 1e3, rel=1e-4)

    when = datetime(2026, 11, 30, 1, 2, 3, tzinfo=timezone.utc)
    stamped, latest = run.write_results(doc, tmp_path, when)
    assert stamped.name == "h200-20261130-010203.json"
    assert not latest.is_symlink() and latest.read_text() == stamped.read_text()
    assert json.loads(latest.read_text()) == json.loads(json.dumps(doc))


def test_row_validation_and_missing_cudnn():
    s = shapes.fa_shape(1024)
    with pytest.raises(ValueError):
        run.make_row("rung04", s, "ok")  # ok without a time
    with pytest.raises(ValueError):
        run.make_row("rung04", s, "weird")
    rows = run.fill_ratios([run.make_row("rung04", s, "ok", ms=1.0)])
    assert rows[0]["ratio_to_cudnn"] is None
    assert run.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert run.device_slug("NVIDIA H200") == "h200"
    assert run.device_slug("") == "gpu"


# --------------------------------------------------------------------------------------- report


def test_markdown_table_content():
    doc = _synthetic_doc()
    md = report.markdown_table(doc)
    lines = md.splitlines()
    assert lines[0] == (
        "_NVIDIA H200 · driver 580.95.05 · torch 2.11.0+cu130 · CUDA 13.0 · cuDNN 9.19.0 · "
        "commit 0123456789ab-dirty · 2026-11-30T12:34:56+00:00_"
    )
    header = next(line for line in lines if line.startswith("| impl"))
    assert header == "| impl | 4k | 8k | Wan2.1-1.3B 480p (B1 H12 S32760) |"
    assert lines[2] == (
        "Forward TFLOP/s (4·B·H·Sq·Sk·D / median time), bf16, head_dim 128, non-causal; FA-paper columns: "
        "16 heads, batch·seqlen = 16384; × = ratio to SDPA cuDNN / to FlashAttention-4 (sm90) in the same run."
    )
    body = [line for line in lines if line.startswith("| ") and not line.startswith("| impl")]
    assert body == [  # ratio to cuDNN / ratio to FA4 (660)
        "| 02 mma_sync | 300 (0.50× / 0.45×) | error | — |",
        "| 04 fast_softmax | 450 (0.75× / 0.68×) | 450 (0.75× / 0.68×) | 450 (0.75× / 0.68×) |",
        "| SDPA cuDNN | 600 (1.00× / 0.91×) | 600 (1.00× / 0.91×) | 600 (1.00× / 0.91×) |",
        "| SDPA flash (FA2) | 340 (0.57× / 0.52×) | 340 (0.57× / 0.52×) | 340 (0.57× / 0.52×) |",
        "| FlashAttention-4 (sm90) | 660 (1.10× / 1.00×) | 660 (1.10× / 1.00×) | 660 (1.10× / 1.00×) |",
    ]
    assert "- rung02 at 8k: error: wrong result (rel_l2 2.0e-01 > 0.01)" in lines
    assert "- rung02 at Wan2.1-1.3B 480p: skipped: too slow for seqlen > 8192 (max_bench_seqlen)" in lines
    assert report.format_cudnn(91900) == "9.19.0" and report.format_cudnn(8907) == "8.9.7"
    text = report.console_table(doc)
    assert "450 (0.75x / 0.68x)" in text and text.splitlines()[0] == lines[0].strip("_")
    assert text.splitlines()[1] == "TFLOP/s (x cuDNN / x FA4)"


def _old_schema(doc):
    """``doc`` as bench wrote it before the FA4 ratio, the rounds and the Wan2.1-14B shapes (schema 1)."""
    old = json.loads(json.dumps(doc))
    old["schema"] = 1
    old["settings"].pop("rounds", None)
    for r in old["rows"]:
        del r["ratio_to_fa4"], r["rounds_ms"]
    for s in old["shapes"]:
        s.pop("heads_kv", None)
    return old


def test_report_on_results_without_the_new_fields_and_shapes():
    """A results file written before this change renders exactly as it did (the lines below are the
    pre-change output): no FA4 ratio, no rounds phrase, no shape notes; the chart still draws."""
    old = _old_schema(_synthetic_doc())
    assert {s["name"] for s in old["shapes"]} == {"fa-4k", "fa-8k", "wan2.1-1.3b-480p"}
    lines = report.markdown_table(old).splitlines()
    assert lines[2] == (
        "Forward TFLOP/s (4·B·H·Sq·Sk·D / median time), bf16, head_dim 128, non-causal; FA-paper columns: "
        "16 heads, batch·seqlen = 16384; × = ratio to SDPA cuDNN in the same run."
    )
    assert [line for line in lines if line.startswith("| ")] == [
        "| impl | 4k | 8k | Wan2.1-1.3B 480p (B1 H12 S32760) |",
        "| 02 mma_sync | 300 (0.50×) | error | — |",
        "| 04 fast_softmax | 450 (0.75×) | 450 (0.75×) | 450 (0.75×) |",
        "| SDPA cuDNN | 600 (1.00×) | 600 (1.00×) | 600 (1.00×) |",
        "| SDPA flash (FA2) | 340 (0.57×) | 340 (0.57×) | 340 (0.57×) |",
        "| FlashAttention-4 (sm90) | 660 (1.10×) | 660 (1.10×) | 660 (1.10×) |",
    ]
    assert report.console_table(old).splitlines()[1] == "TFLOP/s (x cuDNN)"
    assert "| **this rung 4** | 450 (0.75×) | 450 (0.75×) | 450 (0.75×) |" in report.rung_page_block(old, 4)
    assert report._chart_columns(old) == [("fa-4k", "4k"), ("fa-8k", "8k")]


def test_committed_results_still_render_the_committed_readme_table():
    """The committed README block renders again, byte for byte, from the committed results file it
    names, whatever that file's schema (report is the only writer of the block)."""
    text = (REPO / "README.md").read_text()
    m = re.search(r"Generated by `python -m attnclimb report ([^`]+)`", text)
    if report.MARK_BEGIN not in text or not m or not (REPO / m.group(1)).is_file():
        pytest.skip("no README results block naming a committed results file")
    block = report.markdown_table(report.load_results(REPO / m.group(1)), source=m.group(1))
    assert report.replace_between_markers(text, block) == text


def test_report_with_the_new_wan_shapes_and_rounds():
    sh = [shapes.fa_shape(4096), shapes.WAN_SHAPE, shapes.WAN14B_SHAPE, shapes.WAN_CROSS_SHAPE]
    tf = {"rung09": {"wan2.1-14b-720p-cross": 391.0}, "sdpa_cudnn": {"wan2.1-14b-720p-cross": 511.0}, "fa4": {}}
    rows = []
    for s in sh:
        for impl, per in tf.items():
            t = per.get(s.name, 580.0 if impl != "fa4" else 640.0)
            if impl == "fa4" and s is shapes.WAN14B_SHAPE:
                rows.append(run.make_row(impl, s, "error: out of memory (test)"))
                continue
            ms = s.flops / (t * 1e12) * 1e3
            rows.append(run.make_row(impl, s, "ok", rounds_ms=[ms * 1.01, ms, ms * 0.98], label=impl))
    doc = run.build_results({"device": "NVIDIA H200"}, rows, sh, {"rounds": 3})
    md = report.markdown_table(doc)
    lines = md.splitlines()
    assert lines[2].startswith("Forward TFLOP/s (4·B·H·Sq·Sk·D / median time; median over 3 interleaved rounds)")
    assert "Wan2.1-14B 720p cross-attn: its cross-attention from those 75600 video tokens to the 512 umT5" in lines[2]
    header = next(line for line in lines if line.startswith("| impl"))
    assert header == (
        "| impl | 4k | Wan2.1-1.3B 480p (B1 H12 S32760) | Wan2.1-14B 720p (B1 H40 S75600) | "
        "Wan2.1-14B 720p cross-attn (B1 H40 Sq75600 Sk512) |"
    )
    body = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and "impl" not in line}
    # the median round (ms) is reported; the FA4 ratio is missing where FA4 failed
    assert body["rung09"] == (
        "| rung09 | 580 (1.00× / 0.91×) | 580 (1.00× / 0.91×) | 580 (1.00× / —) | 391 (0.77× / 0.61×) |"
    )
    assert "- fa4 at Wan2.1-14B 720p: error: out of memory (test)" in lines
    by = {(r["impl"], r["shape"]): r for r in doc["rows"]}
    r = by[("rung09", "wan2.1-14b-720p")]
    assert r["rounds_ms"][1] == r["ms"] and r["ratio_to_fa4"] is None and r["ratio_to_cudnn"] == 1.0
    assert by[("sdpa_cudnn", "wan2.1-14b-720p-cross")]["ratio_to_fa4"] == pytest.approx(511 / 640, abs=1e-3)
    assert report._chart_columns(doc) == [("fa-4k", "4k")]  # the chart stays the FA headline sweep


def test_readme_replacement_between_markers(tmp_path):
    doc = _synthetic_doc()
    block = report.markdown_table(doc)
    before = "# Title\n\nintro\n\n" + report.MARK_BEGIN + "\n"
    after = report.MARK_END + "\n\n![chart](x.png)\ntrailing <!-- results:end --> text\n"
    readme = tmp_path / "README.md"
    readme.write_text(before + "old table\nline 2\n" + after)
    assert report.update_readme(readme, block) == "updated"
    assert readme.read_text() == before + block + "\n" + after
    assert report.update_readme(readme, block) == "unchanged"  # idempotent
    assert readme.read_text() == before + block + "\n" + after

    plain = tmp_path / "NOMARK.md"
    plain.write_text("# no markers here\n")
    assert report.update_readme(plain, block) is None
    assert plain.read_text() == "# no markers here\n"
    assert report.update_readme(tmp_path / "missing.md", block) is None
    assert report.replace_between_markers(report.MARK_END + " x " + report.MARK_BEGIN, "t") is None


def test_report_cli(tmp_path):
    doc = _synthetic_doc()
    _, latest = run.write_results(doc, tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{report.MARK_BEGIN}\n{report.MARK_END}\nb\n")
    from attnclimb.__main__ import main

    assert main(["report", str(latest), "--readme", str(readme), "--no-chart"]) == 0
    text = readme.read_text()
    assert text.startswith(f"a\n{report.MARK_BEGIN}\n_NVIDIA H200") and text.endswith(f"{report.MARK_END}\nb\n")
    assert "| 04 fast_softmax | 450 (0.75× / 0.68×)" in text
    assert main(["report", str(tmp_path / "nope.json"), "--readme", str(readme), "--no-chart"]) == 1


def test_report_pages_only(tmp_path, monkeypatch, capsys):
    """``report FILE --pages RUNGS`` fills those rungs' pages from FILE (a bench that the README's table is not
    drawn from, e.g. an H100's) and touches neither the README nor the chart."""
    from attnclimb import rungs
    from attnclimb.__main__ import main
    from attnclimb.bench import paths

    _, latest = run.write_results(_synthetic_doc(), tmp_path / "res")
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    pages = {n: tmp_path / rungs.get(n).page for n in (2, 4)}
    for page in pages.values():
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text("# p\n<!-- measured:begin -->\nold\n<!-- measured:end -->\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{report.MARK_BEGIN}\nold\n{report.MARK_END}\n")
    assert main(["report", str(latest), "--readme", str(readme), "--pages", "3-4"]) == 0
    assert "| **this rung 4** | 450 (0.75× / 0.68×)" in pages[4].read_text()
    assert "old" in pages[2].read_text() and "old" in readme.read_text()
    assert not (latest.parent / "ladder.png").exists()
    assert "1 of 2 pages changed" in capsys.readouterr().out
    assert report.parse_rung_list("9,11-13") == [9, 11, 12, 13]
    for bad in ("", "a-b", "10-", "1;2", "16-10"):
        with pytest.raises(ValueError):
            report.parse_rung_list(bad)
    assert main(["report", str(latest), "--pages", "x"]) == 1
    assert main(["report", str(latest), "--readme", str(readme), "--pages", ""]) == 1  # not "every page"
    assert "old" in readme.read_text() and not (latest.parent / "ladder.png").exists()


def test_report_says_unchanged_and_leaves_the_readme_alone(tmp_path, capsys):
    _, latest = run.write_results(_synthetic_doc(), tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{report.MARK_BEGIN}\nold\n{report.MARK_END}\nb\n")
    from attnclimb.__main__ import main

    args = ["report", str(latest), "--readme", str(readme), "--no-chart"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("updated ")
    os.utime(readme, (1_000_000_000, 1_000_000_000))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "unchanged" in out and "updated" not in out
    assert readme.stat().st_mtime == 1_000_000_000  # not rewritten


def test_report_and_bench_agree_on_the_results_folder_when_installed(tmp_path):
    """Installed without -e (no checkout above the package): both use ./benchmarks/results."""
    import shutil

    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "attnclimb", site / "attnclimb", ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    run.write_results(_synthetic_doc(), work / "benchmarks" / "results")
    env = dict(os.environ, PYTHONPATH=str(site), COLUMNS="1000")  # COLUMNS: argparse does not wrap the paths

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "attnclimb", *args], cwd=work, env=env, capture_output=True, text=True, timeout=120
        )

    results = work / "benchmarks" / "results"
    bench_help, report_help = cli("bench", "--help").stdout, cli("report", "--help").stdout
    assert f"(default: {results}," in bench_help
    assert f"(default: {results / 'latest.json'}," in report_help
    p = cli("report", "--no-chart")  # reads ./benchmarks/results/latest.json, where bench writes it
    assert p.returncode == 0, p.stderr
    assert "the table:" in p.stdout and "| 04 fast_softmax | 450 (0.75× / 0.68×)" in p.stdout
    assert not (site / "benchmarks").exists() and not (tmp_path / "README.md").exists()


def test_results_folder_in_a_checkout():
    from attnclimb.bench import paths

    assert paths.in_checkout()
    assert paths.results_dir() == REPO / "benchmarks" / "results"
    assert paths.default_readme() == REPO / "README.md"


def test_label_spreading():
    ys = [610.0, 611.0, 612.0, 340.0]
    out = report.spread_labels(ys, 10.0)
    top = sorted(out[:3])
    assert top[1] - top[0] >= 10 - 1e-9 and top[2] - top[1] >= 10 - 1e-9
    assert sum(out) == pytest.approx(sum(ys))
    assert report.spread_labels([], 1.0) == []


def test_chart_written(tmp_path):
    pytest.importorskip("matplotlib")
    png = report.write_chart(_synthetic_doc(), tmp_path / "sub" / "ladder.png")
    assert png == tmp_path / "sub" / "ladder.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# ------------------------------------------------------------------------------------- no Hopper


def test_bench_without_hopper_exits_2(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("a Hopper GPU is present")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(
        [sys.executable, "-m", "attnclimb", "bench", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    out = (p.stdout + p.stderr).strip().splitlines()
    assert len(out) == 1, out
    assert re.search(r"no Hopper GPU", out[0])
    assert list(tmp_path.iterdir()) == []  # nothing written


# ------------------------------------------------------------------------ the bench loop, on CPU


class _Quiet:
    def describe(self, text):
        pass

    def advance(self, n=1):
        pass

    def log(self, text):
        pass


def _fake_impls(torch):
    F = torch.nn.functional

    class Good(peers.Impl):
        def call(self, p):
            q, k, v = p
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).bfloat16()

    class Wrong(Good):
        def call(self, p):
            out = super().call(p)
            out[-1, -1, -1] += 1.0  # one wrong row in the last head
            return out

    class Boom(peers.Impl):
        def call(self, p):
            raise RuntimeError("kernel exploded\nsecond line")

    class Away(peers.Impl):
        def available(self):
            return False, "not installed here"

    class Bshd(peers.Fa4Impl):  # FA4's layout handling, with sdpa standing in for flash_attn_func
        def available(self):
            def fn(q, k, v, causal=False):
                o = F.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)))
                return o.transpose(1, 2).bfloat16(), None

            self._fn = fn
            return True, ""

    return [
        Good("rung07", "07 good", "rung"),
        Good("rung08", "08 small", "rung", max_bench_seqlen=64),
        Wrong("rung09", "09 wrong", "rung"),
        Boom("rung10", "10 boom", "rung"),
        Away("rung11", "11 away", "rung"),
        Good("sdpa_cudnn", "SDPA cuDNN", "peer"),
        Bshd(),
    ]


def test_bench_loop_on_cpu(monkeypatch):
    torch = pytest.importorskip("torch")
    seen = []

    def fake_median_ms(fn, warmup_ms, rep_ms):
        for _ in range(4):
            fn()
        return 2.0

    monkeypatch.setattr(timing, "median_ms", fake_median_ms)
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    orig_rotating = timing.rotating

    def spy_rotating(call, prepared):
        def spy(p):
            seen.append(next(i for i, x in enumerate(prepared) if x is p))
            return call(p)

        return orig_rotating(spy, prepared)

    monkeypatch.setattr(timing, "rotating", spy_rotating)
    sh = [shapes.Shape("t-64", "64", 2, 2, 64, 64), shapes.Shape("t-odd", "odd", 1, 3, 100, 77)]
    rows, notes, settings = run.run_bench(_fake_impls(torch), sh, 1, 1, progress=_Quiet(), device="cpu")
    assert notes == ["rung11 skipped: not installed here"]
    st = {(r["impl"], r["shape"]): r["status"] for r in rows}
    assert len(rows) == 14
    for s in ("t-64", "t-odd"):
        assert st[("rung07", s)] == "ok" and st[("sdpa_cudnn", s)] == "ok" and st[("fa4", s)] == "ok"
        assert st[("rung09", s)].startswith("error: wrong result (rel_l2")
        assert st[("rung10", s)] == "error: RuntimeError: kernel exploded second line"
        assert st[("rung11", s)] == "skipped: not installed here"
    assert st[("rung08", "t-64")] == "ok"
    assert st[("rung08", "t-odd")] == "skipped: too slow for seqlen > 64 (max_bench_seqlen)"
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 7 and all(r["ms"] == 2.0 and r["rel_l2"] < 1e-2 for r in ok)
    assert seen[:4] == [0, 1, 2, 0]  # the timed function cycles through the input sets
    assert settings["input_sets"] == {"t-64": 3, "t-odd": 3}
    doc = run.build_results({"device": "cpu"}, rows, sh, settings, notes)
    assert all(r["ratio_to_cudnn"] == 1.0 for r in doc["rows"] if r["status"] == "ok")


def test_bench_loop_interleaves_rounds(monkeypatch):
    """Every impl is checked first (in list order), then timed once per round in the order
    forwards / backwards / forwards from half-way; a row's ms is the median of its rounds."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    F = torch.nn.functional
    calls = []  # every impl.call, in order: ("call", key)

    class Rec(peers.Impl):
        def call(self, p):
            calls.append(self.key)
            q, k, v = p
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).bfloat16()

    class Flaky(Rec):  # passes the check, then raises in its second timing round
        def call(self, p):
            if calls.count(self.key) == 2:
                calls.append(self.key)
                raise RuntimeError("flaky")
            return super().call(p)

    class Wrong(Rec):
        def call(self, p):
            return super().call(p) * 2

    impls = [
        Rec("rung01", "01", "rung"),
        Wrong("rung02", "02", "rung"),
        Rec("rung03", "03", "rung", max_bench_seqlen=16),
        Flaky("rung04", "04", "rung"),
        Rec("rung05", "05", "rung"),
        Rec("sdpa_cudnn", "cuDNN", "peer"),
    ]
    # per impl, the times its three rounds return (rung04's second round raises)
    per_round = {"rung01": [3.0, 1.0, 2.0], "rung05": [5.0, 5.5, 4.0], "sdpa_cudnn": [1.0, 1.0, 7.0], "rung04": [2.0]}
    timed = []  # the impl each timer call measured, in order

    def stub_timer(fn, warmup_ms, rep_ms):
        assert (warmup_ms, rep_ms) == (25.0, 100.0)
        n = len(calls)
        fn()  # the rotating call of one impl
        key = calls[n]
        timed.append(key)
        return per_round[key][timed.count(key) - 1]

    shape = shapes.Shape("t-32", "32", 1, 2, 32, 32)
    rows, notes, settings = run.run_bench(
        impls, [shape], 25.0, 100.0, progress=_Quiet(), device="cpu", rounds=3, timer=stub_timer
    )
    # checks first, in list order (rung03 skipped by its limit), each with one call
    assert calls[:5] == ["rung01", "rung02", "rung04", "rung05", "sdpa_cudnn"]
    # then the four that passed: forwards, backwards, forwards from the third (4 * 1 // 2 = 2); rung04
    # raised in round 2 and is not timed again
    assert calls[5:] == [
        "rung01", "rung04", "rung05", "sdpa_cudnn",
        "sdpa_cudnn", "rung05", "rung04", "rung01",
        "rung05", "sdpa_cudnn", "rung01",
    ]  # fmt: skip
    assert timed == [k for i, k in enumerate(calls[5:]) if i != 6]  # the raising call returned no time
    by = {r["impl"]: r for r in rows}
    assert [r["impl"] for r in rows] == [i.key for i in impls]  # rows in impl order
    assert (by["rung01"]["ms"], by["rung01"]["rounds_ms"]) == (2.0, [3.0, 1.0, 2.0])
    assert (by["rung05"]["ms"], by["rung05"]["rounds_ms"]) == (5.0, [5.0, 5.5, 4.0])
    assert (by["sdpa_cudnn"]["ms"], by["sdpa_cudnn"]["rounds_ms"]) == (1.0, [1.0, 1.0, 7.0])
    assert by["rung01"]["tflops"] == pytest.approx(shape.flops / 2.0e-3 / 1e12, rel=1e-5)
    assert by["rung02"]["status"].startswith("error: wrong result") and by["rung02"]["rounds_ms"] is None
    assert by["rung03"]["status"].startswith("skipped: too slow")
    assert by["rung04"]["status"] == "error: RuntimeError: flaky" and by["rung04"]["ms"] is None
    assert by["rung04"]["rounds_ms"] is None
    assert settings["rounds"] == 3 and "backwards" in settings["order"] and notes == []
    with pytest.raises(ValueError):
        run.run_bench(impls, [shape], 1, 1, progress=_Quiet(), device="cpu", rounds=0, timer=stub_timer)


def test_contest_picks_the_close_ones():
    assert timing.contest([1.0, 1.2, 1.3, 5.0], 1.25) == [0, 1]
    assert timing.contest([2.0, 1.0, 1.25, 1.26], 1.25) == [1, 2]
    assert timing.contest([1.0, 3.0], 1.25) == []  # one alone is not a contest
    assert timing.contest([1.0, 1.0], 0.0) == [] and timing.contest([], 1.25) == []
    assert timing.contest([1.0, 1.0, 9.0], 100.0) == [0, 1, 2]


def test_chunk_medians_are_medians_of_consecutive_slices():
    assert timing.chunk_medians([1, 2, 3, 10, 20, 30, 7], 3) == [1.5, 6.5, 20]  # 1, 2 | 3, 10 | 20, 30, 7
    assert timing.chunk_medians([4.0], 1) == [4.0]
    assert timing.chunk_medians([5, 1, 3, 2], 2) == [3.0, 2.5]
    with pytest.raises(ValueError):
        timing.chunk_medians([1.0], 2)
    with pytest.raises(ValueError):
        timing.chunk_medians([1.0], 0)


def test_call_order_rotates_and_reverses():
    n = 5
    orders = [timing.call_order(n, r) for r in range(2 * n)]
    assert all(sorted(o) == list(range(n)) for o in orders)
    assert orders[0] == [0, 1, 2, 3, 4] and orders[1] == [4, 3, 2, 1, 0] and orders[2] == [1, 2, 3, 4, 0]
    for a, b in zip(orders[::2], orders[1::2]):  # within a pair every impl has the same mean position
        assert b == a[::-1]
    # over n pairs each impl is first once in the forward repetitions: its predecessor changes
    assert sorted(o[0] for o in orders[::2]) == list(range(n))
    assert timing.call_order(0, 3) == []
    with pytest.raises(ValueError):
        timing.call_order(3, -1)


def _recording_impls(torch, calls):
    F = torch.nn.functional

    class Rec(peers.Impl):
        def call(self, p):
            calls.append(self.key)
            q, k, v = p
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).bfloat16()

    return [
        Rec("rung01", "01", "rung"),
        Rec("rung02", "02", "rung"),
        Rec("rung03", "03", "rung"),
        Rec("fa4", "F", "peer"),
    ]


def _estimator(calls, estimates):
    """A run_bench ``estimator``: calls ``fn`` once and returns ``estimates`` of the impl it called."""

    def estimator(fn):
        n = len(calls)
        fn()
        return estimates[calls[n]]

    return estimator


def _budget_timer(calls, budgets, time_of):
    """A run_bench ``timer``: calls ``fn`` once, adds ``(warmup_ms, rep_ms)`` to ``budgets[impl key]`` and returns
    ``time_of(impl key)``."""

    def timer(fn, warmup_ms, rep_ms):
        n = len(calls)
        fn()
        budgets.setdefault(calls[n], set()).add((warmup_ms, rep_ms))
        return time_of(calls[n])

    return timer


def test_bench_loop_times_the_close_ones_call_by_call(monkeypatch):
    """The impls within contest_span of the fastest estimate go to the interleaver together (with the budget
    of their rounds, their contexts, `rounds` slices); the others are timed in rounds by the timer."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    calls = []
    impls = _recording_impls(torch, calls)
    estimates = {"rung01": 10.0, "rung02": 1.2, "rung03": 1.0, "fa4": 1.1}
    seen = {}

    estimator = _estimator(calls, estimates)

    def interleaver(fns, warmup_ms, budget_ms, chunks, contexts=None):
        keys = []
        for f in fns:
            n = len(calls)
            f()
            keys.append(calls[n])
        seen.update(keys=keys, warmup=warmup_ms, budget=budget_ms, chunks=chunks, contexts=len(contexts))
        return [[estimates[k]] * chunks for k in keys]

    def stub_timer(fn, warmup_ms, rep_ms):
        fn()
        return 7.0

    shape = shapes.Shape("t-32", "32", 1, 2, 32, 32)
    rows, notes, settings = run.run_bench(
        impls, [shape], 5.0, 20.0, progress=_Quiet(), device="cpu", rounds=3, timer=stub_timer,
        contest_span=1.25, estimator=estimator, interleaver=interleaver, interleave=True,
    )  # fmt: skip
    assert seen == {
        "keys": ["rung02", "rung03", "fa4"],
        "warmup": 5.0,
        "budget": 3 * 20.0 * 3,
        "chunks": 3,
        "contexts": 3,
    }
    by = {r["impl"]: r for r in rows}
    assert by["rung03"]["rounds_ms"] == [1.0, 1.0, 1.0] and by["rung03"]["ms"] == 1.0
    assert by["fa4"]["ms"] == 1.1 and by["rung02"]["ms"] == 1.2
    assert by["rung01"]["rounds_ms"] == [7.0, 7.0, 7.0]  # alone: three rounds of the timer
    assert settings["interleaved"] == {"t-32": ["rung02", "rung03", "fa4"]} and settings["contest_span"] == 1.25
    assert settings["contenders"] == settings["interleaved"] and settings["contest_mode"] == "interleaved"
    assert notes == []
    # span below 1: no contest, all in rounds; without an estimator on the CPU: the same
    calls.clear()
    rows, _, settings = run.run_bench(
        impls, [shape], 5.0, 20.0, progress=_Quiet(), device="cpu", rounds=3, timer=stub_timer,
        contest_span=0.0, estimator=estimator, interleaver=interleaver, interleave=True,
    )  # fmt: skip
    assert settings["interleaved"] == {} and all(r["rounds_ms"] == [7.0] * 3 for r in rows)
    rows, _, settings = run.run_bench(
        impls, [shape], 5.0, 20.0, progress=_Quiet(), device="cpu", rounds=3, timer=stub_timer
    )
    assert settings["interleaved"] == {} and settings["contest_span"] is None


def test_bench_loop_gives_the_contenders_longer_rounds(monkeypatch):
    """By default the contenders on a main shape are timed in the rounds with the contest's warm-up and rep; a
    feature-group shape has no contest."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    calls = []
    impls = _recording_impls(torch, calls)
    estimates = {"rung01": 10.0, "rung02": 1.2, "rung03": 1.0, "fa4": 1.05}
    budgets = {}

    estimator = _estimator(calls, estimates)

    stub_timer = _budget_timer(calls, budgets, lambda key: estimates[key])

    def no_interleaver(*a, **k):
        raise AssertionError("not without interleave")

    main = shapes.Shape("t-32", "32", 1, 2, 32, 32)
    feat = shapes.Shape("t-32c", "32c", 1, 2, 32, 32, causal=True, group=shapes.FEATURE_GROUP)
    rows, notes, settings = run.run_bench(
        impls, [main], 5.0, 20.0, progress=_Quiet(), device="cpu", rounds=3, timer=stub_timer,
        estimator=estimator, interleaver=no_interleaver, contest_warmup_ms=70.0, contest_rep_ms=30.0,
        contest_span=1.1,
    )  # fmt: skip
    assert settings["contenders"] == {"t-32": ["rung03", "fa4"]} and settings["interleaved"] == {}
    assert settings["contest_span"] == 1.1 and settings["contest_mode"] == "rounds"
    assert budgets == {
        "rung01": {(5.0, 20.0)},
        "rung02": {(5.0, 20.0)},
        "rung03": {(70.0, 30.0)},
        "fa4": {(70.0, 30.0)},
    }
    assert all(len(r["rounds_ms"]) == 3 for r in rows) and notes == []
    phrase = report._timing_phrase({"settings": settings})
    assert phrase == (
        "; median over 3 interleaved rounds, in which those within 1.1× of a column's fastest run 70 ms before "
        "30 ms of timed calls (the power-capped clock settles)"
    )
    budgets.clear()
    rows, notes, settings = run.run_bench(
        impls, [feat], 5.0, 20.0, progress=_Quiet(), device="cpu", rounds=3, timer=stub_timer,
        estimator=estimator, interleaver=no_interleaver, contest_span=1.1,
    )  # fmt: skip
    assert settings["contenders"] == {} and all(b == {(5.0, 20.0)} for b in budgets.values())
    # the default: no contest (a bench run with one was not steadier; run.DEFAULT_CONTEST_SPAN)
    budgets.clear()
    rows, notes, settings = run.run_bench(
        impls, [main], 5.0, 20.0, progress=_Quiet(), device="cpu", rounds=3, timer=stub_timer,
        estimator=estimator, interleaver=no_interleaver,
    )  # fmt: skip
    assert run.DEFAULT_CONTEST_SPAN == 0.0 and settings["contenders"] == {}
    assert all(b == {(5.0, 20.0)} for b in budgets.values()) and len(budgets) == 4


def test_bench_loop_falls_back_to_rounds_when_the_interleaver_fails(monkeypatch):
    """A raising interleaver (after it timed some calls) leaves a note; every impl is then timed in rounds, the
    contenders with the contest's times, and nothing the interleaver did is kept."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    calls = []
    impls = _recording_impls(torch, calls)
    estimates = {"rung01": 10.0, "rung02": 1.0, "rung03": 1.05, "fa4": 1.0}
    budgets = {}

    estimator = _estimator(calls, estimates)

    def interleaver(fns, warmup_ms, budget_ms, chunks, contexts=None):
        for f in fns:
            f()
        raise RuntimeError("events\nbroke")

    stub_timer = _budget_timer(calls, budgets, lambda key: 3.0)

    shape = shapes.Shape("t-32", "32", 1, 2, 32, 32)
    rows, notes, settings = run.run_bench(
        impls, [shape], 5.0, 20.0, progress=_Quiet(), device="cpu", rounds=2, timer=stub_timer,
        estimator=estimator, interleaver=interleaver, interleave=True, contest_span=1.1,
        contest_warmup_ms=70.0, contest_rep_ms=30.0,
    )  # fmt: skip
    assert notes == ["t-32: timed in rounds only, the call-by-call timing failed (RuntimeError: events broke)"]
    assert settings["interleaved"] == {} and settings["contenders"] == {"t-32": ["rung02", "rung03", "fa4"]}
    assert all(r["status"] == "ok" and r["rounds_ms"] == [3.0, 3.0] for r in rows)
    assert budgets == {
        "rung01": {(5.0, 20.0)},
        "rung02": {(70.0, 30.0)},
        "rung03": {(70.0, 30.0)},
        "fa4": {(70.0, 30.0)},
    }


def test_bench_main_writes_json_chart_and_prints_table_last(monkeypatch, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import functools

    monkeypatch.setattr(run, "hopper_status", lambda: None)
    monkeypatch.setattr(
        run,
        "collect_env",
        lambda when=None: {"device": "NVIDIA H200", "commit": "abc", "date": "d", "gpu_clocks": {"start": None}},
    )
    monkeypatch.setattr(run, "gpu_clocks", lambda: None)
    monkeypatch.setattr(timing, "median_ms", lambda fn, w, r: (fn(), 1.5)[1])
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)  # not thousands of tiny ones
    tiny = [
        shapes.Shape("fa-4k", "4k", 1, 2, 48, 48, headline=True),
        shapes.Shape("fa-8k", "8k", 1, 2, 80, 80, headline=True),
    ]
    monkeypatch.setattr(run.shapes_mod, "default_shapes", lambda seqlens=None, quick=False, features=True: tiny)
    fakes = _fake_impls(torch)
    monkeypatch.setattr(run.peers_mod, "select_impls", lambda r, i: fakes)
    monkeypatch.setattr(run, "run_bench", functools.partial(run.run_bench, progress=_Quiet(), device="cpu"))
    # the drop-in rows: fakes for the top rung, cuDNN and FA4 on two tiny shapes; host overhead on the CPU
    from attnclimb.bench import dropin

    monkeypatch.setattr(shapes, "BSHD_VIEW_SHAPES", (shapes.Shape("t-v", "v", 1, 2, 32, 32),))
    monkeypatch.setattr(dropin, "bshd_view_impls", lambda: [fakes[0], fakes[5], fakes[6]])
    out_host = torch.zeros(1, 1, 128, 128, dtype=torch.bfloat16)

    def host_fakes(with_op=False):
        def make(q, k, v):
            out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).bfloat16()
            out_host.copy_(out)
            return lambda: out_host

        return [dropin.HostCall(key, key, f"{key}()", make) for key in ("attnclimb_sdpa", "sdpa_cudnn")]

    monkeypatch.setattr(dropin, "host_calls", host_fakes)
    monkeypatch.setattr(
        dropin, "run_host_overhead", functools.partial(dropin.run_host_overhead, device="cpu", progress=_Quiet())
    )
    from attnclimb.__main__ import main

    rc = main(["bench", "--out", str(tmp_path)])
    assert rc == 1  # the fake 'wrong' and 'boom' rungs are errors
    names = sorted(p.name for p in tmp_path.iterdir())
    jsons = [n for n in names if re.fullmatch(r"h200-\d{8}-\d{6}\.json", n)]
    assert len(jsons) == 1 and "latest.json" in names
    doc = json.loads((tmp_path / "latest.json").read_text())
    assert (tmp_path / jsons[0]).read_text() == (tmp_path / "latest.json").read_text()
    assert doc["settings"]["warmup_ms"] == run.DEFAULT_WARMUP_MS and "elapsed_s" in doc["settings"]
    assert {r["impl"] for r in doc["rows"]} == {i.key for i in fakes}
    try:
        import matplotlib  # noqa: F401

        assert "ladder.png" in names
    except ImportError:
        pass
    out = capsys.readouterr().out.rstrip("\n").splitlines()
    # the tables come last: the main one and its notes, then the BSHD-view and host-overhead tables
    main_end = out.index("  rung11 at 4k, 8k: skipped: not installed here")
    assert out[main_end + 1] == "" and out[main_end + 2].startswith("BSHD views (goal ≤ 1.02x)")
    assert out[-2].startswith("attnclimb_sdpa ") and out[-1].startswith("sdpa_cudnn ") and out[-1].endswith(" 1.00x")
    assert "  rung10 at 4k, 8k: error: RuntimeError: kernel exploded second line" in out
    assert any(line.startswith("07 good") and "(1.00x / 1.00x)" in line for line in out)
    assert doc["settings"]["rounds"] == run.DEFAULT_ROUNDS == 3 and doc["schema"] == 5
    assert all(len(r["rounds_ms"]) == 3 for r in doc["rows"] if r["status"] == "ok")
    bshd = {r["impl"]: r for r in doc["bshd_view"]["rows"]}
    assert list(bshd) == ["rung07", "sdpa_cudnn", "fa4"] and {r["shape"] for r in bshd.values()} == {"t-v"}
    assert all(r["status"] == "ok" and r["ratio"] == 1.0 for r in bshd.values())  # the fake timer says 1.5 ms
    # the BSHD rows take at least dropin.BSHD_ROUNDS rounds (a 2 % goal needs more than the main table's)
    assert doc["bshd_view"]["settings"]["rounds"] == 6 == dropin.BSHD_ROUNDS
    assert "elapsed_s" in doc["bshd_view"]["settings"]
    host = doc["host_overhead"]
    assert [r["key"] for r in host["rows"]] == ["attnclimb_sdpa", "sdpa_cudnn"]
    assert all(r["status"] == "ok" and r["us_per_call"] > 0 for r in host["rows"])
    assert host["rows"][1]["ratio_to_cudnn"] == 1.0
    assert (host["settings"]["calls"], host["settings"]["reps"], host["settings"]["rounds"]) == (2000, 5, 3)

    assert main(["bench", "--out", str(tmp_path / "two"), "--rounds", "2", "--no-chart", "--quick"]) == 1
    doc = json.loads((tmp_path / "two" / "latest.json").read_text())
    assert doc["settings"]["rounds"] == 2
    assert {len(r["rounds_ms"]) for r in doc["rows"] if r["status"] == "ok"} == {2}
    assert {len(r["view_rounds_ms"]) for r in doc["bshd_view"]["rows"]} == {2}
    assert (doc["host_overhead"]["settings"]["calls"], doc["host_overhead"]["settings"]["reps"]) == (1000, 3)
    capsys.readouterr()
    assert main(["bench", "--out", str(tmp_path / "three"), "--no-chart", "--no-dropin-rows"]) == 1
    doc = json.loads((tmp_path / "three" / "latest.json").read_text())
    assert "bshd_view" not in doc and "host_overhead" not in doc and doc["schema"] == 5
    out = capsys.readouterr().out.rstrip("\n").splitlines()
    assert out[-1] == "  rung11 at 4k, 8k: skipped: not installed here"  # without them, the main table is last
    capsys.readouterr()
    assert main(["bench", "--out", str(tmp_path / "zero"), "--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err and not (tmp_path / "zero").exists()


def test_rung_page_measured_block(tmp_path):
    doc = _synthetic_doc()
    page = tmp_path / "03-x.md"
    page.write_text("# rung 3\nintro\n<!-- measured:begin -->\nold\n<!-- measured:end -->\ntail\n")
    # rung 3 has no rows: the page is left alone
    assert report.update_rung_pages(doc, {3: page}) == []
    page4 = tmp_path / "04-x.md"
    page4.write_text(page.read_text())
    assert report.update_rung_pages(doc, {4: page4}) == [page4]
    text = page4.read_text()
    assert text.startswith("# rung 3\nintro\n<!-- measured:begin -->\n") and text.endswith(
        "<!-- measured:end -->\ntail\n"
    )
    assert "old" not in text
    # rung 4 at 450 vs cuDNN 600 -> 0.75x; the rung below (3) is absent -> no gain figure
    assert "| TFLOP/s (×cuDNN / ×FA4) | 4k | 8k | Wan2.1-1.3B 480p |" in text
    assert "| **this rung 4** | 450 (0.75× / 0.68×)" in text
    assert "| before: rung 3 | — |" in text
    block = report.rung_page_block(doc, 2)
    assert "| **this rung 2** | 300 (0.50× / 0.45×) | error | skipped |" in block


def test_rung_pages_take_only_rows_of_their_own_kernel(tmp_path):
    """Results from before a re-cut of the ladder (issue 13) name, under a rung's number, the kernel that number
    had then (the row label "04 fast_softmax"): with the ladder's names, a page whose rung has another kernel
    today is left alone, and a rung below with another kernel shows "—", not the old kernel's figures."""
    doc = _synthetic_doc()
    page4 = tmp_path / "04-x.md"
    page4.write_text("# rung 4\n<!-- measured:begin -->\nold\n<!-- measured:end -->\n")
    assert report.update_rung_pages(doc, {4: page4}, {4: "something_else"}) == []
    assert "old" in page4.read_text()
    assert report.update_rung_pages(doc, {4: page4}, {4: "fast_softmax"}) == [page4]
    assert "| **this rung 4** | 450 (0.75× / 0.68×)" in page4.read_text()
    rows3 = [dict(r, impl="rung03", label="03 cp_async") for r in doc["rows"] if r["impl"] == "rung02"]
    doc3 = dict(doc, rows=doc["rows"] + rows3)
    block = report.rung_page_block(doc3, 4, {3: "cp_async", 4: "fast_softmax"})
    assert "| before: rung 3 | 300 (0.50× / 0.45×) | error | skipped |" in block and "| 1.50× |" in block
    block = report.rung_page_block(doc3, 4, {3: "renamed", 4: "fast_softmax"})
    assert "| before: rung 3 | — | — | — |" in block and "| gain over the rung below | — | — | — |" in block


@pytest.mark.parametrize(
    "doc",
    [
        {"rows": []},
        {"rows": [1]},
        {"rows": [{"impl": "x", "shape": "s"}]},
        {"rows": [{"impl": "x", "shape": "s", "status": "ok", "ms": 1, "tflops": "fast"}]},
    ],
)
def test_report_refuses_malformed_results(tmp_path, doc):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError):
        report.load_results(path)


def test_timing_phrase_says_which_were_timed_call_by_call():
    old = {"settings": {"rounds": 3}}
    assert report._timing_phrase(old) == "; median over 3 interleaved rounds"
    new = {"settings": {"rounds": 3, "contest_span": 1.25, "interleaved": {"fa-4k": ["rung16", "fa4"]}}}
    phrase = report._timing_phrase(new)
    assert "within 1.25× of a column's fastest: calls interleaved one by one" in phrase
    assert phrase.endswith("the others: median over 3 interleaved rounds")
    none_close = {"settings": {"rounds": 3, "contest_span": 1.25, "interleaved": {}}}
    assert report._timing_phrase(none_close) == "; median over 3 interleaved rounds"
    assert report._timing_phrase({"settings": {"rounds": 1}}) == ""


def test_bench_loop_gives_the_headline_longer_rounds_by_name(monkeypatch):
    """The headline impls (by key) get the contest's warm-up and rep on a main shape without any estimate; a
    feature-group shape and the other impls keep the plain budgets; the settings and the report say so."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    calls = []
    impls = _recording_impls(torch, calls)
    budgets = {}

    stub_timer = _budget_timer(calls, budgets, lambda key: 1.0)

    main = shapes.Shape("t-32", "32", 1, 2, 32, 32)
    feat = shapes.Shape("t-32f", "32f", 1, 2, 32, 32, group=shapes.FEATURE_GROUP)
    rows, notes, settings = run.run_bench(
        impls, [main, feat], 5.0, 20.0, progress=_Quiet(), device="cpu", rounds=3, timer=stub_timer,
        contest_warmup_ms=70.0, contest_rep_ms=30.0, headline=("rung02", "fa4", "rung99"),
    )  # fmt: skip
    assert settings["contenders"] == {"t-32": ["rung02", "fa4"]} and settings["headline"] == ["rung02", "fa4", "rung99"]
    assert settings["contest_mode"] == "rounds" and notes == []
    assert all(r["status"] == "ok" and len(r["rounds_ms"]) == 3 for r in rows)
    assert budgets == {
        "rung01": {(5.0, 20.0)},
        "rung02": {(70.0, 30.0), (5.0, 20.0)},
        "rung03": {(5.0, 20.0)},
        "fa4": {(70.0, 30.0), (5.0, 20.0)},
    }
    # the phrase names what was timed so: rung99 matched no implementation
    assert report._timing_phrase({"settings": settings}) == (
        "; median over 3 interleaved rounds, in which rung02, fa4 run 70 ms before 30 ms of timed calls on "
        "the main shapes (the power-capped clock settles), the others 5 + 20 ms"
    )
    both = {**settings, "contest_span": 1.1}
    assert report._timing_phrase({"settings": both}) == (
        "; median over 3 interleaved rounds, in which rung02, fa4 and those within 1.1× of a column's fastest run "
        "70 ms before 30 ms of timed calls on the main shapes (the power-capped clock settles), the others 5 + 20 ms"
    )
    # --interleave without --contest-span: the headline ones call by call (no "within 0×")
    inter = {**settings, "contest_span": 0.0, "interleaved": {"t-32": ["rung02", "fa4"]}}
    assert report._timing_phrase({"settings": inter}) == (
        "; rung02, fa4: calls interleaved one by one, median over 3 consecutive slices of them; the others: median "
        "over 3 interleaved rounds"
    )


def test_headline_defaults_to_the_schedule_rungs_and_both_peers():
    """Rung 9 (the first of issue 13's ladder) to the top, top first, then both peers: each neighbour step from
    rung 9 up gets the long windows; rung 8 and below keep the short ones."""
    from attnclimb import rungs

    keys = run.headline_keys()
    top = rungs.TOP.number
    assert run.SCHEDULE_RUNGS_FROM == 9 and rungs.get(9).name == "softmax_overlap"
    assert keys == (*(f"rung{n:02d}" for n in range(top, 8, -1)), "sdpa_cudnn", "fa4")
    assert run.parse_headline(None) == keys and run.parse_headline("none") == () and run.parse_headline("") == ()
    assert run.parse_headline(" rung05, fa4 ,") == ("rung05", "fa4")
    p = __import__("argparse").ArgumentParser()
    run.add_arguments(p)
    assert p.parse_args([]).headline is None and p.parse_args(["--headline", "none"]).headline == "none"
    assert (run.CONTEST_WARMUP_MS, run.CONTEST_REP_MS) == (100.0, 400.0)


def _load_ab_rungs(monkeypatch):
    """scripts/ab_rungs.py as a module; the CPU CI has no triton (ab_rungs imports triton.testing): a stand-in."""
    import importlib.util
    import types

    if importlib.util.find_spec("triton") is None:
        fake = types.ModuleType("triton")
        fake.testing = types.ModuleType("triton.testing")
        monkeypatch.setitem(sys.modules, "triton", fake)
        monkeypatch.setitem(sys.modules, "triton.testing", fake.testing)
    return load_script("ab_rungs")


def test_ab_rungs_long_kv_overrides(monkeypatch, tmp_path):
    """scripts/ab_rungs.py: long_kv_FIELD=N changes that field of the long-K/V tiles only; an unknown field or a
    rung without long-K/V tiles is an error, not a silent no-op; a rung in ``carriers`` is not timed, its variant is."""
    pytest.importorskip("torch")
    from attnclimb import rungs

    ab = _load_ab_rungs(monkeypatch)
    assert ab.overrides("long_kv_block_n=64,NUM_STAGES=3,block_n=176") == (
        {"long_kv_block_n": 64, "block_n": 176},
        {"NUM_STAGES": 3},
    )
    with pytest.raises(SystemExit, match="long-K/V tiles have the fields"):
        ab.overrides("long_kv_blockn=64")
    top = rungs.TOP
    src = tmp_path / top.source.name
    src.write_text(top.source.read_text())
    copy = rungs.KERNEL_DIR / f"{top.source.stem}_v.cu"
    try:
        out = ab.variants([f"k64={tmp_path}@long_kv_block_n=64,long_kv_kv_box_rows=64"], [top.number])
        (label, v), (_, plain) = out
        assert label == f"{top.key}-k64" and plain is top
        assert v.long_kv == (top.long_kv[0], {**top.long_kv[1], "block_n": 64, "kv_box_rows": 64})
        assert v.block_n == top.block_n  # the two-warpgroup tiles are untouched
        ab.cleanup()
        assert not v.source.exists() and ab.COPIED == []
        # --carriers: the rung's variant is timed, the rung itself is not
        out = ab.variants([f"v={tmp_path}"], [top.number - 1, top.number], [top.number])
        assert [label for label, _ in out] == [rungs.get(top.number - 1).key, f"{top.key}-v"]
        ab.cleanup()
        for carriers in ([top.number - 1], [top.number - 2]):  # a carrier with no variant, or not among the rungs
            with pytest.raises(SystemExit, match="carrier"):
                ab.variants([f"v={tmp_path}"], [top.number - 1, top.number], carriers)
            assert ab.COPIED == [copy] and copy.exists()  # raised after the copy: the run's cleanup() removes it
            ab.cleanup()
            assert not copy.exists()
    finally:
        ab.cleanup()
        copy.unlink(missing_ok=True)
        (rungs.KERNEL_DIR / f"{top.source.stem}_k64.cu").unlink(missing_ok=True)
    no_long = next(r for r in rungs.RUNGS if r.long_kv is None and r.abi == "tma")
    (tmp_path / no_long.source.name).write_text(no_long.source.read_text())
    with pytest.raises(SystemExit, match="no long-K/V tiles"):
        ab.variants([f"x={tmp_path}@long_kv_block_n=64"], [no_long.number])
    assert not (rungs.KERNEL_DIR / f"{no_long.source.stem}_x.cu").exists()  # raised before copying


def test_after_device_names_files_by_card(monkeypatch, tmp_path):
    """scripts/after_device.py: an A/B's file is named by the commit and card in its meta, and a bench from a card
    other than the H200 goes beside the A/Bs, never to latest.json (the README's table is an H200 run)."""
    import datetime as dt

    ad = load_script("after_device")
    assert ad.device_slug("NVIDIA H200") == "h200" and ad.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert ad.device_slug(None) == "gpu"
    root, out = tmp_path / "repo", tmp_path / "out"
    for d in ("benchmarks/ab", "benchmarks/results", "out"):
        (root / d).mkdir(parents=True)
    out.mkdir()
    monkeypatch.setattr(ad, "ROOT", root)
    h100 = "NVIDIA H100 80GB HBM3"
    (out / "ab_recut.json").write_text(json.dumps({"meta": {"device": h100, "commit": "40ea14bcafe"}, "tflops": []}))
    bench = {"device": h100, "commit": "abcdef0123", "date": "2026-12-07T01:02:03+00:00", "rows": [], "shapes": []}
    (out / "h100-20261207-010203.json").write_text(json.dumps(bench))
    h200 = {**bench, "device": "NVIDIA H200", "date": "2026-12-07T02:00:00+00:00"}
    (out / "h200-20261207-020000.json").write_text(json.dumps(h200))
    ran = []
    monkeypatch.setattr(ad.subprocess, "run", lambda cmd, **kw: ran.append(cmd))  # the report and the diff quotes
    assert ad.main([out]) == 0
    today = dt.date.today().strftime("%Y%m%d")
    assert sorted(p.name for p in (root / "benchmarks" / "ab").iterdir()) == [
        f"ab-recut-40ea14b-h100-{today}.json",
        "bench-abcdef0-h100-20261207-010203.json",
    ]
    results = root / "benchmarks" / "results"
    assert sorted(p.name for p in results.iterdir()) == ["h200-20261207-020000.json", "latest.json"]
    assert json.loads((results / "latest.json").read_text())["device"] == "NVIDIA H200" and len(ran) == 2
    assert ad.main([out]) == 0  # the same files again: nothing changes
    (out / "ab_recut.json").write_text(json.dumps({"meta": {"device": h100, "commit": "40ea14b"}, "tflops": [1]}))
    with pytest.raises(SystemExit, match="other contents"):  # another run of the same name is never overwritten
        ad.main([out])
    assert ad.short_commit("40ea14bcafe-dirty") == "40ea14b-dirty" and ad.short_commit(None) == "nocommit"


def test_after_device_retires_the_other_benchs_notes(tmp_path):
    """scripts/after_device.py ``retire_notes``: on the pages whose measured block an H200 bench refilled, the
    paragraph that said the block is the H100 bench goes; README's note on which bench its table is goes once the
    table names another commit; a page the bench did not refill, and everything else, is kept byte for byte; the
    files that still await hand-written ratios are named. (Once the next H200 bench has retired the real notes this
    test says it has become vacuous: remove it, and ``retire_notes``, in that commit.)"""
    from attnclimb.bench import paths

    ad = load_script("after_device")
    repo = paths.REPO_ROOT
    (tmp_path / "docs" / "rungs").mkdir(parents=True)
    pages = sorted((repo / "docs" / "rungs").glob("*.md"))
    files = [repo / "README.md", *pages]
    for f in files:
        (tmp_path / f.relative_to(repo)).write_text(f.read_text())
    noted = [f for f in pages if "The table below is the H100 bench" in f.read_text()]
    readme_note = "> The table below is the last full bench" in (repo / "README.md").read_text()
    assert len(noted) >= 2 and readme_note, "nothing to retire: this test has become vacuous; remove it"
    left = ad.retire_notes(tmp_path)  # nothing refilled yet: nothing goes
    assert all((tmp_path / f.relative_to(repo)).read_text() == f.read_text() for f in files)

    def refill(f, begin, old, new):  # what `report` does to the block's caption when it refills the block
        t = (tmp_path / f.relative_to(repo)).read_text()
        head, block = t.split(begin, 1)
        assert old in block.split("\n", 2)[1], (f, block[:200])
        (tmp_path / f.relative_to(repo)).write_text(head + begin + block.replace(old, new, 1))

    refilled, kept = noted[:-1], noted[-1]  # the last noted page: not refilled (its rung not in the bench)
    for f in refilled:
        refill(f, "<!-- measured:begin -->", "_NVIDIA H100 80GB HBM3", "_NVIDIA H200")
    caption = (repo / "README.md").read_text().split("<!-- results:begin -->", 1)[1].split("\n", 2)[1]
    refill(repo / "README.md", "<!-- results:begin -->", caption.split("· commit ")[1].split(" ")[0], "abcdef0")
    before_pass = {f: (tmp_path / f.relative_to(repo)).read_text() for f in files}
    left = ad.retire_notes(tmp_path)
    for f in files:
        before, after = before_pass[f], (tmp_path / f.relative_to(repo)).read_text()
        if f in refilled or f.name == "README.md":
            assert "The table below is the H100 bench" not in after
            assert "> The table below is the last full" not in after
            assert len(after) < len(before)
            kept_lines = iter(before.splitlines())  # only whole paragraphs go, the rest in the same order
            assert all(line in kept_lines for line in after.splitlines())
            for marker in ("<!-- measured:begin -->", "<!-- results:begin -->", ad.PROSE_MARKER):
                assert after.count(marker) == before.count(marker)
        else:
            assert after == before, f
    assert "The table below is the H100 bench" in (tmp_path / kept.relative_to(repo)).read_text()
    assert left == [str(f.relative_to(repo)) for f in files if ad.PROSE_MARKER in f.read_text()]
    assert ad.retire_notes(tmp_path) == left  # a second pass changes nothing
    assert all((tmp_path / p).read_text().count(ad.PROSE_MARKER) for p in left)


def test_rung_pages_say_when_their_measured_block_is_not_the_h200s():
    """A page whose measured block comes from another card (``report FILE --pages``: the H100 bench of the
    twenty-first session) says so above it, and the note goes when the H200 bench refills the block."""
    from attnclimb import rungs
    from attnclimb.bench import paths

    for r in rungs.RUNGS:
        text = (paths.REPO_ROOT / r.page).read_text()
        if report.PAGE_BEGIN not in text:
            continue
        block = text.split(report.PAGE_BEGIN, 1)[1].split(report.PAGE_END, 1)[0].strip()
        caption = block.splitlines()[0] if block else ""
        noted = "The table below is the H100 bench" in text
        assert noted == ("H100" in caption), (
            f"{r.page}: caption {caption[:60]!r}, H100 note {'present' if noted else 'absent'}"
        )


def test_ab_rungs_variant_headers(monkeypatch, tmp_path):
    """scripts/ab_rungs.py: a variant's header the package lacks is copied beside the kernels; one the package has
    must be the same file, else the variant would silently build against the package's copy."""
    pytest.importorskip("torch")
    from attnclimb import rungs

    ab = _load_ab_rungs(monkeypatch)
    top = rungs.TOP
    (tmp_path / top.source.name).write_text(top.source.read_text())
    mine = rungs.KERNEL_DIR / "common.cuh"
    (tmp_path / "common.cuh").write_bytes(mine.read_bytes())  # the same file: fine
    new = rungs.KERNEL_DIR / "zz_test_variant_only.cuh"
    (tmp_path / new.name).write_text("// a variant's own header\n")
    try:
        ab.variants([f"v={tmp_path}"], [top.number])
        assert new.read_text() == "// a variant's own header\n"
        (tmp_path / "common.cuh").write_bytes(mine.read_bytes() + b"// changed\n")
        with pytest.raises(SystemExit, match=r"differs from the package's common\.cuh"):
            ab.variants([f"w={tmp_path}"], [top.number])
        v_src = rungs.KERNEL_DIR / f"{top.source.stem}_v.cu"
        assert ab.COPIED == [new, v_src]  # the run removes them at the end, however it ends
        ab.cleanup()
        assert not new.exists() and not v_src.exists()
    finally:
        ab.cleanup()
        new.unlink(missing_ok=True)
        for label in ("v", "w"):  # also when the refusal failed and the w= variant's source was copied
            (rungs.KERNEL_DIR / f"{top.source.stem}_{label}.cu").unlink(missing_ok=True)


def test_ab_rungs_checks_every_output_against_cudnn(monkeypatch):
    """scripts/ab_rungs.py: before timing a shape, each implementation runs once with O poisoned with NaN and is
    compared with SDPA cuDNN's output; a variant that leaves a tile uncomputed gives NaN (and a warning), one that
    computes every row agrees to bf16 rounding."""
    torch = pytest.importorskip("torch")
    ab = _load_ab_rungs(monkeypatch)

    def exact(q, k, v, scale, causal):
        s = scale * q.float() @ k.float().transpose(-1, -2)
        if causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, -1) @ v.float()

    def fake_run(r, q, k, v, o, scale, causal=False):
        out = exact(q, k, v, scale, causal).to(o.dtype)
        if r == "skips_a_tile":
            out[:, :, 64:128] = float("nan")  # as if no CTA took that m-block: O keeps its poison
        elif r == "no_mask":
            out = exact(q, k, v, scale, False).to(o.dtype)
        o.copy_(out)

    monkeypatch.setattr(ab, "run_rung", fake_run)
    monkeypatch.setattr(
        ab, "sdpa", lambda q, k, v, scale, backend, causal=False: exact(q, k, v, scale, causal).to(q.dtype)
    )
    g = torch.Generator().manual_seed(0)
    qkv = tuple(torch.randn(1, 2, 256, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    got = ab.output_check([("good", "good"), ("bad", "skips_a_tile"), ("nomask", "no_mask")], qkv, 0.125, True)
    assert got["good"] == 0.0 and math.isnan(got["bad"]) and got["nomask"] > 1e-2
