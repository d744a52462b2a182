"""``python -m attnclimb video train | sample | clips``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

DESCRIPTION = (
    "A small video diffusion transformer (attention heads of 128) trained by rectified flow on clips of "
    "moving, bouncing, resizing shapes that the package generates. 'train' trains it with torch's SDPA and "
    "writes a safetensors file; 'sample' samples it from the same noise with attnclimb and with SDPA and "
    "writes an MP4, a GIF side by side, a PNG frame strip and the PSNR between the two; 'clips' writes a GIF "
    "of training clips."
)


def _repo_path(*parts) -> Path:
    from ..bench.paths import REPO_ROOT, in_checkout

    return (REPO_ROOT if in_checkout() else Path.cwd()).joinpath(*parts)


def default_weights() -> Path:
    """Where the trained weights live: ``assets/videodit-shapes.safetensors`` in the checkout."""
    return _repo_path("assets", "videodit-shapes.safetensors")


def default_samples() -> Path:
    return _repo_path("benchmarks", "capstone", "video")


PRESETS = {
    # What the H200 trains in a few minutes: 4096 tokens per clip (16 frames of 16 x 16 patches).
    "default": {"model": {}, "clips": {}, "batch": 32},
    # The CPU smoke test: 64 tokens per clip, one head.
    "tiny": {
        "model": {"frames": 4, "size": 16, "heads": 1, "depth": 2, "mlp_ratio": 2.0, "freq_dim": 64},
        "clips": {"frames": 4, "size": 16, "max_shapes": 2},
        "batch": 4,
    },
}


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="video_cmd", required=True, metavar="{train,sample,clips}")
    t = sub.add_parser("train", help="train the model on generated clips (torch SDPA)", description=DESCRIPTION)
    t.add_argument(
        "--minutes", type=float, default=None, help="wall-time budget in minutes (default: 5 without --steps)"
    )
    t.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    t.add_argument("--out", default=None, help="weights file (default: assets/videodit-shapes.safetensors)")
    t.add_argument(
        "--preset", choices=sorted(PRESETS), default="default", help="model and clip size (tiny: a CPU test)"
    )
    t.add_argument("--batch", type=int, default=None, help="clips per step (default: the preset's)")
    t.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (default: %(default)s)")
    t.add_argument("--seed", type=int, default=0, help="seed of the initial weights, clips and noise (default: 0)")
    t.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    t.add_argument("--fp32-weights", action="store_true", help="save fp32 weights instead of bf16")
    s = sub.add_parser(
        "sample", help="sample with attnclimb and with SDPA; MP4, GIF, PNG and PSNR", description=DESCRIPTION
    )
    s.add_argument("--weights", default=None, help="weights file (default: assets/videodit-shapes.safetensors)")
    s.add_argument("--out", default=None, help="output folder (default: benchmarks/capstone/video)")
    s.add_argument("--num", type=int, default=4, help="clips to sample (default: %(default)s)")
    s.add_argument("--steps", type=int, default=32, help="Euler steps (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="seed of the noise (default: %(default)s)")
    s.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    s.add_argument("--fps", type=float, default=8, help="frames per second of the GIF and MP4 (default: %(default)s)")
    s.add_argument("--scale", type=int, default=3, help="pixel enlargement in the outputs (default: %(default)s)")
    s.add_argument("--no-mp4", action="store_true", help="write no MP4")
    c = sub.add_parser("clips", help="write a GIF of generated training clips", description=DESCRIPTION)
    c.add_argument("--out", default=None, help="GIF file (default: benchmarks/capstone/video/clips.gif)")
    c.add_argument("--num", type=int, default=8, help="clips (default: %(default)s)")
    c.add_argument("--seed", type=int, default=0, help="seed of the first clip (default: %(default)s)")
    c.add_argument("--preset", choices=sorted(PRESETS), default="default", help="clip size")
    c.add_argument("--scale", type=int, default=3, help="pixel enlargement (default: %(default)s)")


def _train(args) -> int:
    import torch

    from .. import __version__
    from ..bench.run import git_commit
    from .clips import ClipSpec
    from .model import DiTConfig, VideoDiT
    from .train import TrainSettings, save_weights, settings_record, train

    preset = PRESETS[args.preset]
    cfg, spec = DiTConfig(**preset["model"]), ClipSpec(**preset["clips"])
    if (cfg.frames, cfg.size) != (spec.frames, spec.size):
        raise SystemExit(f"preset {args.preset}: the model's clip size differs from the generator's")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    minutes = args.minutes if args.minutes is not None or args.steps is not None else 5.0
    settings = TrainSettings(
        batch=args.batch or preset["batch"], lr=args.lr, seed=args.seed, steps=args.steps, minutes=minutes
    )
    torch.manual_seed(args.seed)
    model = VideoDiT(cfg)
    n = sum(p.numel() for p in model.parameters())
    print(
        f"video model: {n / 1e6:.2f} M parameters, {cfg.heads} heads x {cfg.head_dim}, {cfg.depth} blocks, "
        f"{cfg.tokens} tokens per clip; {device}",
        file=sys.stderr,
    )
    res = train(model, spec, settings, device=device, log=lambda m: print(m, file=sys.stderr))
    record = settings_record(settings, res, device)
    record.update(
        {
            "device_name": torch.cuda.get_device_name(torch.device(device))
            if str(device).startswith("cuda")
            else "cpu",
            "torch_version": torch.__version__,
            "attnclimb_version": __version__,
            "commit": git_commit(),
            "weights": "EMA",
        }
    )
    from datetime import datetime, timezone

    record["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out = Path(args.out) if args.out else default_weights()
    save_weights(out, res.ema_model, spec, record, dtype=torch.float32 if args.fp32_weights else torch.bfloat16)
    print(json.dumps({k: record[k] for k in ("steps_done", "seconds", "final_loss")}))
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)", file=sys.stderr)
    return 0


def _sample(args) -> int:
    from . import sample

    weights = Path(args.weights) if args.weights else default_weights()
    if not weights.is_file():
        print(
            f"{weights}: no such weights file; train first: python -m attnclimb video train --out {weights}",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out) if args.out else default_samples()
    doc = sample.run(
        weights,
        out,
        num=args.num,
        steps=args.steps,
        seed=args.seed,
        device=args.device,
        fps=args.fps,
        scale=args.scale,
        mp4=not args.no_mp4,
    )
    value = "identical (inf)" if doc["identical"] else f"{doc['psnr_db']:.2f} dB"
    print(f"PSNR attnclimb vs SDPA: {value}; max |diff| {doc['max_abs_diff']:.4f}; kernels: {doc['attnclimb_kernels']}")
    if doc.get("note"):
        print(f"note: {doc['note']}")
    for name, path in doc["files"].items():
        print(f"{name}: {path}")
    return 0


def _clips(args) -> int:
    from . import writers as w
    from .clips import ClipSpec, generate_batch

    spec = ClipSpec(**PRESETS[args.preset]["clips"])
    clips = generate_batch(range(args.seed, args.seed + args.num), spec)
    frames = w.tile([w.upscale(w.to_frames(c), args.scale) for c in clips], cols=min(args.num, 4))
    out = Path(args.out) if args.out else default_samples() / "clips.gif"
    print(f"wrote {w.write_gif(frames, out)}")
    return 0


def main(args) -> int:
    return {"train": _train, "sample": _sample, "clips": _clips}[args.video_cmd](args)
