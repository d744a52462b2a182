"""python -m attnclimb capstone on the CPU: the Wan2.1 configurations, the routes, the seeded random weights,
the --weights loading path (a tiny checkpoint written with save_pretrained and read back) and a whole run of
the tiny configuration through the fallback path. The tests that build a model need diffusers (the `video`
extra; the `test` extra installs it) and are skipped without it. The last test needs a Hopper GPU."""

import json
import math
import warnings

import pytest
import torch

import attnclimb
from attnclimb import capstone
from attnclimb.__main__ import main as cli_main


def test_configs_are_wan21_as_released():
    small, big = capstone.CONFIGS["wan2.1-1.3b"], capstone.CONFIGS["wan2.1-14b"]
    assert small.latent == (21, 60, 104) and small.seqlen() == 32760
    assert (small.model["num_attention_heads"], small.model["num_layers"], small.model["ffn_dim"]) == (12, 30, 8960)
    assert big.latent == (21, 90, 160) and big.seqlen() == 75600
    assert (big.model["num_attention_heads"], big.model["num_layers"], big.model["ffn_dim"]) == (40, 40, 13824)
    assert big.default_blocks == 4 and small.default_blocks is None
    for cfg in (small, big):
        assert cfg.model["attention_head_dim"] == 128 and cfg.model["text_dim"] == 4096 and cfg.text_tokens == 512
        assert cfg.model["patch_size"] == (1, 2, 2) and "convert_wan_to_diffusers" in cfg.source
    assert capstone.latent_shape(81, 480, 832) == (21, 60, 104)
    with pytest.raises(ValueError, match="strides"):
        capstone.latent_shape(80, 480, 832)


def test_parse_routes():
    assert capstone.parse_routes(None) == list(capstone.DEFAULT_ROUTES)
    assert capstone.parse_routes("none, attnclimb,none") == ["none", "attnclimb"]
    assert capstone.parse_routes("all") == list(capstone.ROUTE_KEYS)
    with pytest.raises(ValueError, match="unknown impl 'cudnn'"):
        capstone.parse_routes("cudnn")


def test_fa4_backend_passes_bshd_and_scale_through():
    seen = {}

    def fake(q, k, v, **kw):
        seen.update(shapes=(q.shape, k.shape), kw=kw, same=(q is qq))
        return q * 2, torch.zeros(1)  # (out, lse) as FA4 returns with return_lse

    fn = capstone._fa4_backend(fake)
    qq, kk = torch.randn(1, 5, 2, 128), torch.randn(1, 7, 2, 128)
    out = fn(qq, kk, kk, scale=0.5)
    assert torch.equal(out, qq * 2) and seen["same"]  # diffusers' BSHD tensors, not copies or transposes
    assert seen["shapes"] == ((1, 5, 2, 128), (1, 7, 2, 128)) and seen["kw"] == {"causal": False, "softmax_scale": 0.5}
    with pytest.raises(ValueError, match="mask"):
        fn(qq, kk, kk, attn_mask=torch.ones(1, 7, dtype=torch.bool))
    assert capstone._none_backend(qq, kk, kk, scale=1.0) is qq


def _row(key, t=None, status="ok", **kw):
    times = [[t]] if t is not None else []
    return key, {"status": status, "reason": "", "times_ms": times, **kw}


def test_summarise_shares_speedups_and_reference():
    routes = [capstone.Route(k, capstone.ROUTE_LABELS[k], "native") for k in ("attnclimb", "sdpa_cudnn", "none")]
    results = dict([_row("attnclimb", 80.0), _row("sdpa_cudnn", 100.0), _row("none", 40.0)])
    ref_out = torch.ones(4)
    outputs = {"attnclimb": ref_out * 1.01, "sdpa_cudnn": ref_out, "none": ref_out * 0}
    rows, ref = capstone.summarise(results, outputs, routes)
    by = {r["impl"]: r for r in rows}
    assert ref == "sdpa_cudnn"
    assert by["attnclimb"]["speedup_vs_ref"] == pytest.approx(1.25)
    assert by["attnclimb"]["attention_ms"] == pytest.approx(40.0) and by["attnclimb"][
        "attention_share"
    ] == pytest.approx(0.5)
    assert by["sdpa_cudnn"]["attention_share"] == pytest.approx(0.6)
    assert by["attnclimb"]["attention_speedup_vs_ref"] == pytest.approx(60 / 40)
    assert by["attnclimb"]["rel_l2_vs_ref"] == pytest.approx(0.01) and by["sdpa_cudnn"]["rel_l2_vs_ref"] == 0
    assert "rel_l2_vs_ref" not in by["none"] and "attention_share" not in by["none"]
    # cuDNN skipped: torch's own SDPA becomes the reference
    routes.append(capstone.Route("sdpa", "SDPA", "native"))
    results["sdpa_cudnn"] = {"status": "skipped", "reason": "needs a CUDA device"}
    results["sdpa"] = _row("sdpa", 50.0)[1]
    outputs["sdpa"] = ref_out
    rows, ref = capstone.summarise(results, outputs, routes)
    assert ref == "sdpa" and {r["impl"]: r for r in rows}["attnclimb"]["speedup_vs_ref"] == pytest.approx(50 / 80)


def test_make_routes_say_why_not_on_the_cpu(monkeypatch):
    pytest.importorskip("diffusers")

    def missing():
        raise ImportError("No module named 'flash_attn'")

    monkeypatch.setattr(capstone, "_fa4_function", missing)
    routes = {r.key: r for r in capstone.make_routes(capstone.ROUTE_KEYS, "cpu")}
    assert "CUDA" in routes["sdpa_cudnn"].why_not and "CUDA" in routes["sdpa_flash"].why_not
    assert "flash_attn" in routes["fa4"].why_not
    for key in ("attnclimb", "attnclimb_patch", "sdpa", "none"):
        assert routes[key].why_not is None, key
    assert routes["attnclimb"].backend == "attnclimb" and routes["none"].backend == capstone.NONE_BACKEND
    monkeypatch.setattr(capstone, "_fa4_function", lambda: lambda q, k, v, **kw: q)
    fa4 = capstone.make_routes(["fa4"], "cpu")[0]
    assert fa4.backend == capstone.FA4_BACKEND and "CUDA" in fa4.why_not


# ------------------------------------------------------------------------------------- with diffusers


@pytest.fixture
def diffusers():
    return pytest.importorskip("diffusers")


@pytest.fixture(autouse=True)
def _fresh_warnings():
    from attnclimb import sdpa

    sdpa.reset_fallback_warnings()
    yield
    sdpa.reset_fallback_warnings()


TINY = capstone.CONFIGS["tiny"]


def _forward(model, seed=0):
    inputs = capstone.make_inputs(TINY, dict(model.config), device="cpu", dtype=torch.bfloat16, seed=seed)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(**inputs)[0]


def test_random_weights_are_seeded_and_cast_like_from_pretrained(diffusers, tmp_path):
    a = capstone.build_model(TINY, blocks=None, device="cpu", dtype=torch.bfloat16, seed=3)
    b = capstone.build_model(TINY, blocks=None, device="cpu", dtype=torch.bfloat16, seed=3)
    c = capstone.build_model(TINY, blocks=None, device="cpu", dtype=torch.bfloat16, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    first = capstone.build_model(TINY, blocks=1, device="cpu", dtype=torch.bfloat16, seed=3)
    assert len(first.blocks) == 1
    assert all(torch.equal(v, sa[k]) for k, v in first.state_dict().items() if k.startswith("blocks.0."))
    # The dtypes from_pretrained(torch_dtype=bf16) gives the same model: fp32 kept where diffusers keeps it.
    pytest.importorskip("accelerate")  # from_pretrained with a torch_dtype needs it for this model
    torch.manual_seed(3)
    diffusers.WanTransformer3DModel(**TINY.model).save_pretrained(tmp_path / "ckpt")
    loaded = diffusers.WanTransformer3DModel.from_pretrained(tmp_path / "ckpt", torch_dtype=torch.bfloat16)
    ours = {k: v.dtype for k, v in a.named_parameters()}
    theirs = {k: v.dtype for k, v in loaded.named_parameters()}
    assert ours == theirs
    assert torch.float32 in set(ours.values()) and torch.bfloat16 in set(ours.values())
    # ... and the same values: from_pretrained rounds the saved fp32 weights to bf16 as we do
    assert all(torch.equal(v, dict(loaded.named_parameters())[k]) for k, v in a.named_parameters())


@pytest.mark.parametrize("layout", ["model", "pipeline"])
def test_weights_dir_round_trip(diffusers, tmp_path, layout):
    """--weights DIR: a checkpoint written with save_pretrained (a model folder, or a pipeline folder with
    transformer/) loads through from_pretrained and gives the saved model's output."""
    pytest.importorskip("accelerate")  # diffusers' from_pretrained needs it for this model
    torch.manual_seed(11)
    saved = diffusers.WanTransformer3DModel(**TINY.model)
    where = tmp_path / "ckpt"
    saved.save_pretrained(where / "transformer" if layout == "pipeline" else where)
    model = capstone.build_model(TINY, blocks=None, device="cpu", dtype=torch.bfloat16, weights=where)
    reference = capstone.cast_like_from_pretrained(saved, torch.bfloat16).eval()
    assert torch.equal(_forward(model), _forward(reference))
    cut = capstone.build_model(TINY, blocks=1, device="cpu", dtype=torch.bfloat16, weights=where)
    assert len(cut.blocks) == 1 and not torch.equal(_forward(cut), _forward(reference))
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        capstone.build_model(TINY, blocks=None, device="cpu", dtype=torch.bfloat16, weights=tmp_path / "nothing")


def test_backends_reach_the_model(diffusers, monkeypatch):
    """The none and FA4 backends are really what the model calls once set."""
    model = capstone.build_model(TINY, blocks=None, device="cpu", dtype=torch.bfloat16, seed=0)
    ref = _forward(model)
    calls = []

    def fake_fa4(q, k, v, softmax_scale=None, causal=False):
        calls.append(q.shape)
        o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return o.transpose(1, 2)

    monkeypatch.setattr(capstone, "_fa4_function", lambda: fake_fa4)
    routes = capstone.make_routes(["fa4", "none"], "cpu")
    for r in routes:
        model.set_attention_backend(r.backend)
        out = _forward(model)
        if r.key == "fa4":
            assert len(calls) == 4 and torch.equal(out, ref)  # 2 blocks x (self, cross)
        else:
            assert not torch.equal(out, ref) and torch.isfinite(out).all()
    model.set_attention_backend("native")


def test_cli_runs_the_tiny_config_end_to_end(diffusers, tmp_path, capsys):
    out = tmp_path / "cap.json"
    rc = cli_main(
        ["capstone", "--config", "tiny", "--out", str(out), "--rounds", "2", "--reps", "1", "--device", "cpu"]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    for key in ("device", "torch_version", "diffusers_version", "attnclimb_version", "commit", "date"):
        assert doc[key], key
    assert doc["reference"] == "sdpa" and any("reference" in n for n in doc["notes"])
    assert doc["config"]["seqlen"] == 48 and doc["config"]["blocks_run"] == doc["config"]["blocks_total"] == 2
    rows = {r["impl"]: r for r in doc["rows"]}
    assert set(rows) == {*capstone.DEFAULT_ROUTES, "sdpa"}
    assert rows["sdpa_cudnn"]["status"] == "skipped" and rows["sdpa_flash"]["status"] == "skipped"
    for key in ("attnclimb", "none", "sdpa"):
        r = rows[key]
        assert r["status"] == "ok" and len(r["times_ms"]) == 2 and r["step_ms"] > 0, r
    # the CPU falls back to torch's SDPA: the same numbers as the reference, and the row says why
    assert rows["attnclimb"]["rel_l2_vs_ref"] == 0 and rows["sdpa"]["rel_l2_vs_ref"] == 0
    assert len(rows["attnclimb"]["fallbacks"]) == 1 and "cpu" in rows["attnclimb"]["fallbacks"][0]
    assert math.isfinite(rows["attnclimb"]["attention_share"]) and rows["sdpa"]["speedup_vs_ref"] == 1
    text = capsys.readouterr().out
    assert "SDPA cuDNN" in text and "skipped: needs a CUDA device" in text


def test_cli_with_weights_and_blocks(diffusers, tmp_path):
    pytest.importorskip("accelerate")
    torch.manual_seed(5)
    diffusers.WanTransformer3DModel(**TINY.model).save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "cap.json"
    argv = ["capstone", "--config", "tiny", "--weights", str(tmp_path / "ckpt"), "--blocks", "1"]
    rc = cli_main([*argv, "--impls", "attnclimb,none", "--out", str(out), "--rounds", "1", "--reps", "1"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["blocks_run"] == 1 and doc["config"]["blocks_total"] == 2
    assert any("only the first 1 of the model's 2" in n for n in doc["notes"])
    assert doc["config"]["weights"] == str(tmp_path / "ckpt")
    assert {r["impl"] for r in doc["rows"]} == {"attnclimb", "none", "sdpa_cudnn", "sdpa"}  # a reference is added


def test_cli_without_diffusers_says_what_to_install(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_diffusers(name, *a, **kw):
        if name == "diffusers" or name.startswith("diffusers."):
            raise ImportError("No module named 'diffusers'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_diffusers)
    assert cli_main(["capstone", "--config", "tiny"]) == 2
    assert "attnclimb[video]" in capsys.readouterr().err


@pytest.mark.gpu
def test_tiny_forward_on_attnclimb_matches_cudnn_on_the_gpu(diffusers):
    """The kernel path inside the model (strict: a fallback raises) against SDPA's cuDNN path."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = capstone.build_model(TINY, blocks=None, device="cuda", dtype=torch.bfloat16, seed=0)
    inputs = capstone.make_inputs(TINY, dict(model.config), device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = model(**inputs)[0]
    attnclimb.register_diffusers_backend(strict=True)
    try:
        model.set_attention_backend("attnclimb")
        with torch.inference_mode():
            out = model(**inputs)[0]
    finally:
        model.set_attention_backend("native")
        attnclimb.register_diffusers_backend()
    from attnclimb.reference import rel_l2

    assert rel_l2(out, ref) < 1e-2


# ------------------------------------------------------------------------------------------------- report


def _doc(name, date, step, device_type="cuda", blocks=(30, 30)):
    cfg = capstone.CONFIGS[name]
    rows = [
        {"impl": "attnclimb", "label": "attnclimb (diffusers backend)", "status": "ok", "step_ms": step},
        {"impl": "sdpa_cudnn", "label": "SDPA cuDNN", "status": "ok", "step_ms": 600.0, "speedup_vs_ref": 1.0},
        {"impl": "fa4", "label": "FlashAttention-4 (sm90)", "status": "skipped", "reason": "not importable"},
    ]
    rows[0].update(speedup_vs_ref=600.0 / step, attention_share=0.55, attention_ms=300.0, rel_l2_vs_ref=3e-3)
    return {
        "kind": "capstone",
        "device": "NVIDIA H200",
        "device_type": device_type,
        "torch_version": "2.11.0",
        "diffusers_version": "0.42.1",
        "commit": "0123456789abcdef",
        "date": date,
        "config": {
            "name": name,
            "label": cfg.label,
            "seqlen": cfg.seqlen(),
            "text_tokens": cfg.text_tokens,
            "model": dict(cfg.model),
            "blocks_run": blocks[0],
            "blocks_total": blocks[1],
        },
        "reference": "sdpa_cudnn",
        "notes": [f"note of {date}"],
        "rows": rows,
    }


def test_report_writes_the_newest_run_of_each_config_into_the_readme(tmp_path, capsys):
    res = tmp_path / "benchmarks" / "capstone"
    (res / "video").mkdir(parents=True)
    docs = {
        "old.json": _doc("wan2.1-1.3b", "2026-12-01T10:00:00+00:00", 700.0),
        "new.json": _doc("wan2.1-1.3b", "2026-12-02T10:00:00+00:00", 550.0),
        "big.json": _doc("wan2.1-14b", "2026-12-01T11:00:00+00:00", 9000.0, blocks=(4, 40)),
        "cpu.json": _doc("wan2.1-1.3b", "2026-12-03T10:00:00+00:00", 1.0, device_type="cpu"),
        "tiny.json": _doc("tiny", "2026-12-03T10:00:00+00:00", 1.0),
    }
    for name, doc in docs.items():
        (res / name).write_text(json.dumps(doc))
    (res / "other.json").write_text("[1, 2]")
    video = {
        "identical": False,
        "psnr_db": 41.234,
        "steps": 32,
        "device": "NVIDIA H200",
        "model": {"heads": 2, "depth": 6},
        "training": {"steps_done": 4000, "seconds": 300.0},
    }
    (res / "video" / "samples.json").write_text(json.dumps(video))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{capstone.BEGIN}\nold text\n{capstone.END}\n\nafter\n")
    argv = ["capstone", "--report", "--results", str(res), "--readme", str(readme)]
    assert cli_main(argv) == 0
    text = readme.read_text()
    assert "old text" not in text and text.startswith("# x\n\nbefore\n") and text.endswith("after\n")
    assert "| attnclimb (diffusers backend) | 550.0 | 1.091× | 300.0 | 55.0% |" in text
    assert "700.0" not in text and "note of 2026-12-02" in text and "| 1.0 |" not in text
    assert "4 of 40 blocks" in text and "32760 video tokens" in text and "75600 video tokens" in text
    assert text.index("Wan2.1-T2V-1.3B") < text.index("Wan2.1-T2V-14B")
    assert "[JSON](benchmarks/capstone/new.json)" in text and "| FlashAttention-4 (sm90) | skipped" in text
    assert "![attnclimb and SDPA samples side by side](benchmarks/capstone/video/side_by_side.gif)" in text
    assert "PSNR between the two samplings 41.2 dB" in text and "4000 steps" in text
    assert cli_main(argv) == 0 and readme.read_text() == text  # idempotent
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="capstone:begin"):
        cli_main(argv)


def test_readme_capstone_section_is_current():
    """The README shows what `capstone --report` makes of the committed JSON (rerun it after adding one)."""
    from attnclimb.bench.paths import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text()
    folder = capstone.results_dir()
    video_json = folder / "video" / "samples.json"
    video = json.loads(video_json.read_text()) if video_json.is_file() else None

    def rel(path):
        return path.resolve().relative_to(REPO_ROOT).as_posix()

    section = capstone.markdown_section(capstone.newest_per_config(folder), video, rel(folder / "video"), rel)
    assert capstone.replace_section(readme, section) == readme


def test_default_out_names_the_device_config_and_blocks(tmp_path, diffusers):
    from datetime import datetime, timezone

    when = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc)
    big = capstone.CONFIGS["wan2.1-14b"]
    assert capstone.default_out("h200", big, 4, 40, when).name == "h200-wan2.1-14b-4of40blocks-20261201-100000.json"
    assert capstone.default_out("h200", big, 40, 40, when).parent == capstone.results_dir()
    # --out DIR: the default name inside that folder
    rc = cli_main(["capstone", "--config", "tiny", "--impls", "none", "--out", str(tmp_path), "--rounds", "1"])
    assert rc == 0 and [p.name.startswith("cpu-tiny-") for p in tmp_path.iterdir()] == [True]
