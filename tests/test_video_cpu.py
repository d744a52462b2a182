"""Part 2 of the capstone on the CPU: the clip generator (shapes, determinism, motion, bounces, size change),
the video model, a few training steps whose loss must fall on a fixed batch, the weights file, the sampler
and the writers (GIF, MP4, PNG), and `python -m attnclimb video` end to end at the tiny preset.
The writers' tests need Pillow / imageio-ffmpeg (the `video` extra) and are skipped without them."""

import json
import math
import warnings

import numpy as np
import pytest
import torch

import attnclimb
from attnclimb.__main__ import main as cli_main
from attnclimb.video import flow
from attnclimb.video.cli import PRESETS
from attnclimb.video.clips import KINDS, ClipSpec, Trajectories, generate_batch, generate_clip, render, simulate
from attnclimb.video.model import DiTConfig, VideoDiT, position_code
from attnclimb.video.sample import make_noise, psnr, sample_both
from attnclimb.video.train import TrainSettings, load_weights, save_weights, train

TINY_MODEL = DiTConfig(**PRESETS["tiny"]["model"])
TINY_CLIPS = ClipSpec(**PRESETS["tiny"]["clips"])


@pytest.fixture(autouse=True)
def _fresh_warnings():
    from attnclimb import sdpa

    sdpa.reset_fallback_warnings()
    yield
    sdpa.reset_fallback_warnings()


# ------------------------------------------------------------------------------------------------- clips


def test_clips_have_the_spec_shape_and_range():
    spec = ClipSpec()
    x = generate_batch(range(3), spec)
    assert x.shape == (3, 3, spec.frames, spec.size, spec.size) and x.dtype == torch.float32
    assert float(x.min()) >= 0 and float(x.max()) <= 1
    small = generate_clip(7, TINY_CLIPS)
    assert small.shape == (3, 4, 16, 16)


def test_clips_are_deterministic_and_independent_of_the_batch():
    a = generate_batch([5, 6, 7])
    assert torch.equal(a, generate_batch([5, 6, 7]))
    assert torch.equal(a[1], generate_clip(6))  # a clip depends on its seed alone
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(generate_clip(5, ClipSpec(frames=8)), generate_clip(5)[:, :8])  # the spec matters


def test_clips_move_bounce_and_change_size():
    spec = ClipSpec()
    seeds = range(40)
    traj = simulate(seeds, spec)
    x = generate_batch(seeds, spec)
    # every clip changes from each frame to the next
    step_change = (x[:, :, 1:] - x[:, :, :-1]).abs().mean(dim=(1, 3, 4))  # (B, F-1)
    assert float(step_change.min()) > 0
    act = traj.active
    r = traj.radius
    # shapes stay inside the frame ...
    c = traj.center
    inside = (c >= r[..., None] - 1e-9) & (c <= spec.size - r[..., None] + 1e-9)
    assert inside[np.broadcast_to(act[:, None, :, None], inside.shape)].all()
    # ... by bouncing: a velocity component turns over, next to the edge it turned at
    vx = traj.velocity[..., 0]
    flips = (np.sign(vx[:, 1:]) != np.sign(vx[:, :-1])) & act[:, None, :]
    assert flips.sum() >= 5
    b, f, s = np.nonzero(flips)
    x_at = c[b, f + 1, s, 0]
    room = r[b, f + 1, s]
    near = np.minimum(x_at - room, spec.size - room - x_at)
    assert (near <= spec.speed[1] + 1e-6).all()
    # speeds are kept by the bounces
    speed = np.linalg.norm(traj.velocity, axis=-1)  # (B, F, S)
    assert np.allclose(np.where(act[:, None, :], speed - speed[:, :1], 0), 0)
    # sizes change over the clip
    ratio = r.max(axis=1) / np.where(act, r.min(axis=1), 1)
    assert ratio[act].max() > 1.3
    assert set(traj.kind[act].tolist()) == set(range(len(KINDS)))


def test_render_paints_each_kind_where_it_is():
    spec = ClipSpec(frames=1, size=32, max_shapes=1)
    for kind in range(len(KINDS)):
        traj = Trajectories(
            center=np.array([[[[10.0, 20.0]]]]),
            radius=np.array([[[6.0]]]),
            angle=np.zeros((1, 1, 1)),
            kind=np.array([[kind]]),
            color=np.array([[[1.0, 0.0, 0.0]]]),
            active=np.array([[True]]),
            background=np.array([[0.0, 0.0, 1.0]]),
            velocity=np.zeros((1, 1, 1, 2)),
        )
        img = render(traj, spec)[0, :, 0]  # (3, H, W)
        assert img[:, 20, 10].tolist() == [1.0, 0.0, 0.0], KINDS[kind]  # row y=20, column x=10: the shape
        assert img[:, 2, 30].tolist() == [0.0, 0.0, 1.0]  # far away: the background
        traj.active[:] = False
        assert img.shape == (3, 32, 32) and render(traj, spec)[0, :, 0, 20, 10].tolist() == [0.0, 0.0, 1.0]


# ------------------------------------------------------------------------------------------------- model


def test_model_shapes_and_patches():
    torch.manual_seed(0)
    m = VideoDiT(TINY_MODEL)
    x = torch.randn(2, 3, 4, 16, 16)
    assert torch.equal(m.unpatchify(m.patchify(x)), x)
    assert m.patchify(x).shape == (2, TINY_MODEL.tokens, 48) and TINY_MODEL.tokens == 64
    assert m(x, torch.rand(2)).shape == x.shape
    assert position_code((4, 4, 4), 128).shape == (64, 128)
    assert DiTConfig().dim == 256 and DiTConfig().tokens == 4096 and DiTConfig().head_dim == 128


def test_default_weights_fit_one_file_the_gpu_machine_sends_back():
    """The trained weights come back from the device as one file of at most 16 MiB, in bf16."""
    n = sum(p.numel() for p in VideoDiT(DiTConfig()).parameters())
    assert 4e6 < n and 2 * n < 15 * 2**20
    with pytest.raises(ValueError, match="patch"):
        _ = DiTConfig(size=30).grid


def test_model_attention_is_a_function_argument_and_patch_sdpa_routes_the_default():
    torch.manual_seed(0)
    m = VideoDiT(TINY_MODEL)
    for p in m.parameters():  # non-zero outputs, so that the attention shows in them
        torch.nn.init.normal_(p, std=0.05)
    x, t = torch.randn(1, 3, 4, 16, 16), torch.rand(1)
    seen = []

    def spy(q, k, v):
        seen.append(tuple(q.shape))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    with torch.no_grad():
        ref = m(x, t)
        assert torch.equal(m(x, t, attention=spy), ref)
        assert seen == [(1, 1, 64, 128)] * TINY_MODEL.depth  # (B, heads, tokens, 128)
        assert not torch.equal(m(x, t, attention=lambda q, k, v: v), ref)
        with pytest.warns(attnclimb.AttnclimbFallbackWarning, match="float32"), attnclimb.patch_sdpa():
            assert torch.equal(m(x, t), ref)


# ---------------------------------------------------------------------------------------------- training


def test_training_lowers_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    m = VideoDiT(TINY_MODEL)
    res = train(m, TINY_CLIPS, TrainSettings(batch=4, lr=1e-3, warmup=5, steps=40, seed=0), fixed_batch=True)
    assert res.steps == 40 and len(res.losses) == 40 and all(math.isfinite(v) for v in res.losses)
    first, last = sum(res.losses[:3]) / 3, sum(res.losses[-3:]) / 3
    assert last < 0.7 * first, res.losses
    # the EMA copy moved away from the start, toward the trained weights
    torch.manual_seed(0)
    start = VideoDiT(TINY_MODEL)
    ema, trained = dict(res.ema_model.named_parameters()), dict(m.named_parameters())
    with torch.no_grad():
        moved = sum(float((ema[k] - p).abs().sum()) for k, p in start.named_parameters())
    assert moved > 0 and all(torch.isfinite(trained[k]).all() for k in trained)


def test_training_stops_by_steps_or_minutes_and_batches_differ():
    torch.manual_seed(0)
    m = VideoDiT(TINY_MODEL)
    res = train(m, TINY_CLIPS, TrainSettings(batch=2, steps=3))
    assert res.steps == 3 and len(set(res.losses)) == 3
    res = train(m, TINY_CLIPS, TrainSettings(batch=2, minutes=0.0))
    assert res.steps == 1
    with pytest.raises(ValueError):
        train(m, TINY_CLIPS, TrainSettings())


def test_weights_file_round_trip(tmp_path):
    pytest.importorskip("safetensors")
    torch.manual_seed(1)
    m = VideoDiT(TINY_MODEL)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.05)
    path = save_weights(tmp_path / "w.safetensors", m, TINY_CLIPS, {"steps_done": 3}, dtype=torch.float32)
    loaded, spec, record = load_weights(path)
    assert loaded.cfg == TINY_MODEL and spec == TINY_CLIPS and record == {"steps_done": 3}
    x, t = torch.randn(1, 3, 4, 16, 16), torch.rand(1)
    with torch.no_grad():
        assert torch.equal(loaded(x, t), m(x, t))
    bf16 = save_weights(tmp_path / "b.safetensors", m, TINY_CLIPS)
    assert bf16.stat().st_size < path.stat().st_size * 0.6
    assert load_weights(bf16, dtype=torch.bfloat16)[0].embed.weight.dtype == torch.bfloat16
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not an attnclimb video model"):
        load_weights(tmp_path / "other.safetensors")


# ----------------------------------------------------------------------------------------------- sampling


def test_time_grid_and_an_untrained_model_keeps_the_noise():
    assert flow.time_grid(4) == [1.0, 0.75, 0.5, 0.25, 0.0]
    shifted = flow.time_grid(4, shift=3.0)
    assert shifted[0] == 1.0 and shifted[-1] == 0.0 and shifted[2] > 0.5
    m = VideoDiT(TINY_MODEL)  # zero-initialised output layer: velocity 0
    noise = make_noise((1, 3, 4, 16, 16), seed=0)
    assert torch.equal(flow.sample(m, noise, steps=3), noise)


def test_sampler_shape_and_determinism():
    torch.manual_seed(2)
    m = VideoDiT(TINY_MODEL).eval()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.05)
    noise = make_noise((2, 3, 4, 16, 16), seed=4)
    assert torch.equal(noise, make_noise((2, 3, 4, 16, 16), seed=4))
    a, b = flow.sample(m, noise, steps=3), flow.sample(m, noise.clone(), steps=3)
    assert a.shape == noise.shape and torch.equal(a, b) and not torch.equal(a, noise)
    c = flow.sample(m, make_noise((2, 3, 4, 16, 16), seed=5), steps=3)
    assert not torch.equal(a, c)


def test_sample_both_on_the_cpu_is_identical_and_says_it_fell_back():
    torch.manual_seed(2)
    m = VideoDiT(TINY_MODEL).eval()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.05)
    res = sample_both(m, make_noise((1, 3, 4, 16, 16), seed=0), steps=2, strict=False)
    assert res["attnclimb"].shape == (1, 3, 4, 16, 16) and torch.equal(res["attnclimb"], res["sdpa"])
    assert float(res["attnclimb"].min()) >= 0 and float(res["attnclimb"].max()) <= 1
    assert len(res["fallbacks"]) == 1 and "float32" in res["fallbacks"][0]  # the first reason met on the CPU
    with pytest.raises(attnclimb.KernelUnsupportedError):
        sample_both(m, make_noise((1, 3, 4, 16, 16), seed=0), steps=1, strict=True)


def test_psnr():
    a = torch.zeros(2, 3)
    assert psnr(a, a) == math.inf
    assert psnr(a, a + 0.1) == pytest.approx(20.0)
    assert psnr(a, a + 0.01) == pytest.approx(40.0)


# ------------------------------------------------------------------------------------------------ writers


def _frames(n=6, h=20, w=28):
    g = np.random.default_rng(0)
    return g.integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


def test_layouts():
    from attnclimb.video import writers as w

    clip = torch.rand(3, 5, 8, 8)
    fr = w.to_frames(clip)
    assert fr.shape == (5, 8, 8, 3) and fr.dtype == np.uint8
    assert w.upscale(fr, 3).shape == (5, 24, 24, 3)
    grid = w.tile([fr] * 3, cols=2)
    assert grid.shape == (5, 2 * 8 + w.GAP, 2 * 8 + w.GAP, 3)
    pytest.importorskip("PIL")
    both = w.side_by_side(fr, fr, gap=10)
    assert both.shape == (5, w.CAPTION_HEIGHT + 8, 2 * 8 + 10, 3)
    assert w.pad_to(both, 16).shape[1] % 16 == 0 and w.pad_to(both, 16).shape[2] % 16 == 0
    with pytest.raises(ValueError):
        w.side_by_side(fr, fr[:, :4])


def test_gif_and_png_writers(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    from attnclimb.video import writers as w

    frames = _frames()
    gif = w.write_gif(frames, tmp_path / "a" / "x.gif", fps=10)
    with Image.open(gif) as im:
        assert im.n_frames == 6 and im.size == (28, 20) and im.info["loop"] == 0 and im.info["duration"] == 100
    png = w.write_strip([("one", frames), ("two", frames)], tmp_path / "s.png", every=2)
    with Image.open(png) as im:
        assert im.size == (90 + 3 * (28 + w.GAP), w.CAPTION_HEIGHT + 2 * (20 + w.GAP))


def test_mp4_writer(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    import imageio.v2 as iio

    from attnclimb.video import writers as w

    path = w.write_mp4(_frames(n=7), tmp_path / "x.mp4", fps=8)
    assert path.stat().st_size > 0
    reader = iio.get_reader(str(path), format="FFMPEG")
    try:
        assert reader.count_frames() == 7
        assert reader.get_data(0).shape == (32, 32, 3)  # padded to multiples of 16
    finally:
        reader.close()


def test_cli_train_then_sample(tmp_path, capsys):
    pytest.importorskip("safetensors")
    pytest.importorskip("PIL")
    weights = tmp_path / "w.safetensors"
    assert (
        cli_main(["video", "train", "--preset", "tiny", "--steps", "2", "--out", str(weights), "--device", "cpu"]) == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps_done"] == 2
    _, spec, record = load_weights(weights)
    assert spec == TINY_CLIPS and record["steps_done"] == 2 and record["weights"] == "EMA" and record["commit"]
    out = tmp_path / "samples"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = cli_main(
            [
                "video",
                "sample",
                "--weights",
                str(weights),
                "--out",
                str(out),
                "--num",
                "2",
                "--steps",
                "2",
                "--device",
                "cpu",
            ]
        )
    assert rc == 0
    doc = json.loads((out / "samples.json").read_text())
    assert doc["identical"] and doc["psnr_db"] is None and not doc["attnclimb_kernels"] and "note" in doc
    assert (out / "side_by_side.gif").is_file() and (out / "frames.png").is_file()
    assert ("mp4" in doc["files"]) == (out / "side_by_side.mp4").is_file()
    from PIL import Image

    with Image.open(out / "side_by_side.gif") as im:
        assert im.n_frames <= 4  # Pillow merges identical neighbouring frames; 4 frames were written
    assert "PSNR attnclimb vs SDPA: identical" in capsys.readouterr().out
    assert cli_main(["video", "sample", "--weights", str(tmp_path / "missing.safetensors")]) == 2
    assert cli_main(["video", "clips", "--preset", "tiny", "--num", "2", "--out", str(tmp_path / "c.gif")]) == 0
    assert (tmp_path / "c.gif").is_file()


@pytest.mark.gpu
def test_samplings_agree_on_the_gpu():
    """Default-size model in bf16 on a Hopper GPU: the strict attnclimb sampling (the kernels, or an error)
    against torch's SDPA from the same noise."""
    torch.manual_seed(0)
    m = VideoDiT(DiTConfig(depth=2))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.02)
    m = m.to("cuda", torch.bfloat16).eval()
    noise = make_noise((2, 3, 16, 64, 64), seed=0, device="cuda", dtype=torch.bfloat16)
    res = sample_both(m, noise, steps=4, strict=True)
    assert res["fallbacks"] == [] and not torch.equal(res["attnclimb"], res["sdpa"])
    assert psnr(res["attnclimb"], res["sdpa"]) > 30
