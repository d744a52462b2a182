"""Sampling the video model twice from the same noise, once with attnclimb's attention and once with torch's
SDPA, and writing the two side by side (MP4, GIF, PNG strip) with the PSNR between them.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

from .flow import sample, to_pixels


def psnr(a, b, peak: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB of ``a`` against ``b`` (pixels in ``[0, peak]``), over all elements;
    ``inf`` when they are equal."""
    mse = float(torch.mean((a.double() - b.double()) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def make_noise(shape, seed: int, device="cpu", dtype=torch.float32):
    """N(0, 1) noise from a CPU generator seeded with ``seed`` (the same on every device), moved to ``device``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


def attnclimb_attention(strict: bool):
    from .. import sdpa as _sdpa

    def attention(q, k, v):
        return _sdpa.scaled_dot_product_attention(q, k, v, strict=strict)

    return attention


def torch_attention(q, k, v):
    from .. import ops as _ops

    return _ops._TORCH_SDPA(q, k, v)  # torch's own, whatever patch_sdpa may have installed


def sample_both(model, noise, steps: int, strict: bool, shift: float = 1.0) -> dict:
    """``{"attnclimb": clips, "sdpa": clips, "fallbacks": [...]}``: ``[0, 1]`` float32 clips ``(N, 3, F, H, W)``
    sampled from ``noise`` with each attention function. ``strict=True`` makes a call the kernels cannot take
    raise instead of silently running torch's SDPA (which would make the comparison empty)."""
    from .. import sdpa as _sdpa
    from ..errors import AttnclimbFallbackWarning

    _sdpa.reset_fallback_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AttnclimbFallbackWarning)
        a = sample(model, noise, steps, attention=attnclimb_attention(strict), shift=shift)
    b = sample(model, noise, steps, attention=torch_attention, shift=shift)
    fallbacks = sorted({str(w.message) for w in caught if issubclass(w.category, AttnclimbFallbackWarning)})
    return {"attnclimb": to_pixels(a), "sdpa": to_pixels(b), "fallbacks": fallbacks}


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_outputs(
    clips_a, clips_b, out_dir, *, fps: float = 8, scale: int = 3, cols: int | None = None, mp4: bool = True
) -> dict:
    """``side_by_side.gif``, ``side_by_side.mp4`` (unless ``mp4`` is false or imageio-ffmpeg is missing:
    then the reason is returned) and ``frames.png`` in ``out_dir``. Returns ``{name: path or reason}``."""
    from . import writers as w

    out_dir = Path(out_dir)
    n = clips_a.shape[0]
    cols = cols or max(1, math.ceil(math.sqrt(n)))
    left = w.tile([w.upscale(w.to_frames(c), scale) for c in clips_a], cols)
    right = w.tile([w.upscale(w.to_frames(c), scale) for c in clips_b], cols)
    both = w.side_by_side(left, right)
    files = {"gif": str(w.write_gif(both, out_dir / "side_by_side.gif", fps))}
    if mp4:
        try:
            files["mp4"] = str(w.write_mp4(both, out_dir / "side_by_side.mp4", fps))
        except RuntimeError as exc:
            files["mp4_skipped"] = str(exc)
    rows = []
    for i in range(min(n, 2)):
        rows += [
            (f"#{i} attnclimb", w.upscale(w.to_frames(clips_a[i]), scale)),
            (f"#{i} SDPA", w.upscale(w.to_frames(clips_b[i]), scale)),
        ]
    files["png"] = str(w.write_strip(rows, out_dir / "frames.png", every=max(1, clips_a.shape[2] // 8)))
    return files


def run(
    weights,
    out_dir,
    *,
    num: int = 4,
    steps: int = 32,
    seed: int = 0,
    device=None,
    dtype=None,
    fps: float = 8,
    scale: int = 3,
    shift: float = 1.0,
    mp4: bool = True,
) -> dict:
    """Load ``weights``, sample ``num`` clips from seeded noise with attnclimb and with SDPA, write the files
    and ``samples.json``; returns that record. On a Hopper GPU the attnclimb sampling is strict (it raises
    rather than fall back); elsewhere it falls back to torch's SDPA, which the record says."""
    from .. import __version__
    from ..api import hopper_unavailable_reason
    from ..bench.run import git_commit
    from .train import load_weights

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = str(device).startswith("cuda")
    dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
    model, spec, record = load_weights(weights, device=device, dtype=dtype)
    cfg = model.cfg
    noise = make_noise((num, cfg.channels, cfg.frames, cfg.size, cfg.size), seed, device, dtype)
    why = hopper_unavailable_reason() if cuda else "not a CUDA device"
    res = sample_both(model, noise, steps, strict=why is None, shift=shift)
    files = write_outputs(res["attnclimb"], res["sdpa"], out_dir, fps=fps, scale=scale, mp4=mp4)
    per_clip = [psnr(a, b) for a, b in zip(res["attnclimb"], res["sdpa"])]
    value = psnr(res["attnclimb"], res["sdpa"])
    doc = {
        "kind": "video-samples",
        "psnr_db": value if math.isfinite(value) else None,
        "identical": value == math.inf,
        "psnr_db_per_clip": [p if math.isfinite(p) else None for p in per_clip],
        "max_abs_diff": float((res["attnclimb"] - res["sdpa"]).abs().max()),
        "attnclimb_kernels": why is None,
        "attnclimb_fallbacks": res["fallbacks"],
        "num": num,
        "steps": steps,
        "shift": shift,
        "seed": seed,
        "device": torch.cuda.get_device_name(torch.device(device)) if cuda else (platform.processor() or "cpu"),
        "dtype": str(dtype).replace("torch.", ""),
        "weights": str(weights),
        "weights_sha256": sha256(weights),
        "model": json.loads(cfg.to_json()),
        "clips": spec.to_dict(),
        "training": record,
        "files": files,
        "torch_version": torch.__version__,
        "attnclimb_version": __version__,
        "commit": git_commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if why is not None:
        doc["note"] = f"attnclimb's kernels cannot run here ({why}): both samplings ran torch's SDPA"
    out = Path(out_dir) / "samples.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    doc["files"]["json"] = str(out)
    return doc
