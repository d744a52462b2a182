"""``python -m attnclimb cp-bench`` on the CPU: shapes, skips, the communication model, rows, the table, the
results file, the exits without torchrun or a GPU; and a whole ``torchrun --nproc-per-node 4`` dry run over
gloo (``--device cpu``: the float64 reference as the local attention)."""

import json
import math
import os
import subprocess
import sys
from argparse import Namespace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from attnclimb.bench import cp
from attnclimb.bench.shapes import WAN14B_SHAPE, Shape

REPO = Path(__file__).resolve().parents[1]


def test_parse_shapes_and_schemes():
    assert [s.name for s in cp.parse_shapes(None)] == ["wan2.1-14b-720p", "wan2.1-14b-720p-161f"]
    assert cp.parse_shapes("wan14b-161f")[0].seqlen_q == 147600 == 41 * 45 * 80
    shapes = cp.parse_shapes("32k, 1000,wan14b,32768")
    assert [(s.heads, s.seqlen_q) for s in shapes] == [(40, 32768), (40, 1000), (40, 75600)]
    for bad in ("wan99", "0", "", "x1k"):
        with pytest.raises(ValueError):
            cp.parse_shapes(bad if bad else ",")
    assert cp.parse_schemes(None) == ["ring", "ulysses"]
    assert cp.parse_schemes("ulysses,ring,ulysses") == ["ulysses", "ring"]
    with pytest.raises(ValueError, match="unknown scheme"):
        cp.parse_schemes("ring,tree")


def test_layouts_and_skips():
    assert cp.layout_for("ring", True) == "load_balanced"
    assert cp.layout_for("ring", False) == cp.layout_for("ulysses", True) == "contiguous"
    assert cp.skip_reason(WAN14B_SHAPE, "ring", True, 8) is None  # 75600 = 16 x 4725
    assert cp.skip_reason(WAN14B_SHAPE, "ulysses", False, 8) is None  # 40 heads / 8
    assert "heads" in cp.skip_reason(WAN14B_SHAPE, "ulysses", False, 3)
    assert "chunks" in cp.skip_reason(cp.WAN14B_161F_SHAPE, "ring", False, 7)
    for n in (2, 3, 4, 5, 6, 8):
        assert cp.skip_reason(cp.WAN14B_161F_SHAPE, "ring", True, n) is None


def test_comm_model_matches_the_formulas_of_the_docs():
    """docs/distributed.md, "Scaling": the ring sends N-1 K/V blocks of 2 B H_kv S_l D bf16 values and does
    S_l H / H_kv FLOPs per byte per step; Ulysses moves (N-1)/N of Q, K, V and O and does S N / (2 (N-1))."""
    n, s_l = 8, 75600 // 8
    ring = cp.comm_model(WAN14B_SHAPE, "ring", n)
    step_bytes = 2 * 2 * 40 * s_l * 128
    assert ring["bytes_per_rank"] == (n - 1) * step_bytes
    assert ring["flops_per_byte"] == pytest.approx(s_l)
    assert ring["flops_per_rank"] == pytest.approx(WAN14B_SHAPE.flops / n)
    assert cp.comm_model(WAN14B_SHAPE, "ring", n, causal=True)["flops_per_byte"] == pytest.approx(s_l / 2)
    uly = cp.comm_model(WAN14B_SHAPE, "ulysses", n)
    assert uly["bytes_per_rank"] == pytest.approx((n - 1) / n * 4 * 40 * s_l * 128 * 2)
    assert uly["flops_per_byte"] == pytest.approx(75600 * n / (2 * (n - 1)))
    gqa = Shape(name="g", label="g", batch=1, heads=32, heads_kv=8, seqlen_q=8192, seqlen_k=8192)
    assert cp.comm_model(gqa, "ring", 2)["flops_per_byte"] == pytest.approx(4096 * 4)
    assert math.isinf(cp.comm_model(WAN14B_SHAPE, "ring", 1)["flops_per_byte"])
    # 600 TFLOP/s on one H200: the ring's step at N = 8 hides its transfer above ~63 GB/s.
    assert cp.break_even_gbs(ring, 600.0) == pytest.approx(600e12 / s_l / 1e9)
    assert cp.break_even_gbs(ring, None) is None
    with pytest.raises(ValueError):
        cp.comm_model(WAN14B_SHAPE, "tree", 2)


def test_rows_efficiency_and_table(tmp_path):
    ok = cp.make_row(
        WAN14B_SHAPE,
        "ring",
        False,
        2,
        ms_1gpu=200.0,
        ms=110.0,
        ms_1gpu_ranks=[199, 201],
        rel_l2_1gpu=1e-3,
        rel_l2_f64=2e-3,
    )
    assert ok["speedup"] == pytest.approx(200 / 110, rel=1e-5) and ok["efficiency"] == pytest.approx(
        200 / 220, rel=1e-5
    )
    assert ok["tflops_1gpu"] == pytest.approx(WAN14B_SHAPE.flops / 0.2 / 1e12, rel=1e-5)
    assert ok["tflops_per_gpu"] == pytest.approx(WAN14B_SHAPE.flops / 0.11 / 1e12 / 2, rel=1e-5)
    assert ok["layout"] == "contiguous" and ok["break_even_gbs"] > 0
    assert ok["rel_l2_vs_1gpu"] == 1e-3 and ok["ms_1gpu_ranks"] == [199, 201]
    causal = cp.make_row(WAN14B_SHAPE, "ring", True, 2, ms_1gpu=100.0, ms=60.0)
    assert causal["layout"] == "load_balanced" and causal["tflops_1gpu"] == pytest.approx(ok["tflops_1gpu"])
    skipped = cp.make_row(WAN14B_SHAPE, "ulysses", False, 3, status="skipped: 40 heads", ms_1gpu=200.0)
    assert skipped["ms"] is None and skipped["efficiency"] is None
    with pytest.raises(ValueError, match="status"):
        cp.make_row(WAN14B_SHAPE, "ring", False, 2, status="fine")
    env = {"device": "NVIDIA H200", "world_size": 2, "torch_version": "2.13", "backend": "nccl", "commit": "abc"}
    when = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc)
    doc = cp.build_doc(dict(env, date=when.isoformat()), [ok, causal, skipped], [WAN14B_SHAPE], {"iters": 5})
    assert doc["kind"] == "cp-bench" and doc["shapes"][0]["seqlen_q"] == 75600 and doc["notes"][0] == cp.TIME_NOTE
    table = cp.console_table(doc)
    assert "NVIDIA H200 x2" in table and "ring (load_balanced)" in table and "91 %" in table
    assert "skipped: 40 heads" in table
    stamped, latest = cp.write_doc(doc, tmp_path / "x2", when)
    assert stamped.name == "h200-20261201-100000.json" and json.loads(latest.read_text()) == doc
    assert cp.write_doc(doc, tmp_path / "x2", when)[0].name == "h200-20261201-100000-1.json"


def _args(**kw):
    base = {"seqlens": None, "schemes": None, "causal": False, "warmup": 1, "iters": 1, "out": None, "device": "cuda"}
    return Namespace(**{**base, **kw})


def test_report_writes_the_readme_block_from_latest_json(tmp_path, capsys):
    """``cp-bench --report`` (no torchrun): the README's multi-GPU block from x<N>/latest.json, fewest GPUs
    first, the rest of the README byte for byte; exit 1 without results or without the markers."""
    rows = [cp.make_row(WAN14B_SHAPE, "ring", False, n, ms_1gpu=200.0, ms=200.0 / n / 0.95) for n in (2, 4)]
    when = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc)
    for n, row in zip((4, 2), reversed(rows)):
        env = {"device": "NVIDIA H200", "world_size": n, "backend": "nccl", "commit": "abcdef123", "date": "d"}
        cp.write_doc(cp.build_doc(env, [row], [WAN14B_SHAPE], {}), tmp_path / "cp" / f"x{n}", when)
    readme = tmp_path / "README.md"
    readme.write_text("# t\nbefore\n<!-- cp:begin -->\nold\n<!-- cp:end -->\nafter\n")
    args = Namespace(report=True, out=str(tmp_path / "cp"), readme=str(readme))
    assert cp.main(args) == 0
    text = readme.read_text()
    assert text.startswith("# t\nbefore\n<!-- cp:begin -->\n_NVIDIA H200 × 2") and text.endswith(
        "<!-- cp:end -->\nafter\n"
    )
    assert "old" not in text and text.index("× 2 ·") < text.index("× 4 ·")
    assert "| Wan2.1-14B 720p | full | ring (contiguous) | 200.00 | 105.26 | 1.90× | 95 % | — / — |" in text
    assert "[JSON](cp/x2/latest.json)" in text and "commit abcdef1" in text
    readme.write_text("no markers\n")
    assert cp.main(args) == 1 and "has no <!-- cp:begin -->" in capsys.readouterr().err
    assert cp.main(Namespace(report=True, out=str(tmp_path / "none"), readme=str(readme))) == 1


def test_main_exits_2_without_torchrun_or_hopper(monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cp.main(_args()) == 2
    assert "torchrun --nproc-per-node" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cp.main(_args(seqlens="wan99")) == 2
    assert "unknown shape" in capsys.readouterr().err
    assert cp.main(_args(iters=0)) == 2
    monkeypatch.setattr(cp, "hopper_reason", lambda device: f"{device}: compute capability 8.0")
    assert cp.main(_args()) == cp.NO_GPU_EXIT
    assert "cuda:0: compute capability 8.0" in capsys.readouterr().err


def test_cpu_dry_run_defaults_to_a_short_sequence_and_refuses_long_ones(monkeypatch, capsys):
    """--device cpu runs the float64 reference: the default GPU shapes would need 1.8 TB of scores."""
    assert [s.seqlen_q for s in cp.select_shapes(None, on_cpu=True)] == [int(cp.CPU_DEFAULT_SEQLENS)]
    assert [s.seqlen_q for s in cp.select_shapes(None, on_cpu=False)] == [75600, 147600]
    assert cp.select_shapes("2k", on_cpu=True)[0].seqlen_q == 2048
    with pytest.raises(ValueError, match="1,703 GiB"):
        cp.select_shapes("64,wan14b", on_cpu=True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cp.main(_args(device="cpu", seqlens="wan14b-161f")) == 2  # before any process group
    assert "shorter --seqlens" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_torchrun_dry_run_on_four_cpu_ranks(tmp_path):
    """The launch the GPU session uses, on the CPU: torchrun, 4 ranks over gloo, ring and Ulysses, full and
    causal; the JSON in <out>/x4/ and the table on stdout."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m", "attnclimb"]
    cmd += ["cp-bench", "--device", "cpu", "--seqlens", "64", "--causal", "--iters", "1", "--warmup", "0"]
    res = subprocess.run([*cmd, "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((tmp_path / "x4" / "latest.json").read_text())
    assert doc["world_size"] == 4 and doc["backend"] == "gloo" and doc["settings"]["device"] == "cpu"
    assert doc["commit"] and doc["date"] and doc["torch_version"]
    rows = {(r["scheme"], r["causal"]): r for r in doc["rows"]}
    assert set(rows) == {("ring", False), ("ring", True), ("ulysses", False), ("ulysses", True)}
    for r in rows.values():
        assert r["status"] == "ok", r
        assert r["rel_l2_vs_1gpu"] < 1e-5 and r["rel_l2_vs_float64"] < 1e-5
        assert r["ms"] > 0 and r["efficiency"] > 0 and len(r["ms_1gpu_ranks"]) == 4
    assert rows[("ring", True)]["layout"] == "load_balanced"
    assert "B1 H40 S64" in res.stdout and "wrote" in res.stdout
