"""Procedural training clips: coloured shapes that move, bounce off the frame's edges, turn and change size.

Every clip is a function of one integer seed: its parameters come from ``numpy.random.default_rng(seed)``
(PCG64, the same on every platform), the motion is simulated frame by frame in float64 NumPy, and the
frames are rendered with torch, anti-aliased by a one-pixel ramp on each shape's signed distance. No file
is read and nothing is downloaded.

A clip is a float32 tensor ``(3, frames, size, size)`` with values in ``[0, 1]`` (the model works on
``2·x − 1``). :func:`generate_batch` renders many clips at once (vectorised over clips, frames and
shapes), on any torch device.
"""

from __future__ import annotations

import colorsys
import math
from dataclasses import asdict, dataclass

import numpy as np

KINDS = ("circle", "square", "diamond")


@dataclass(frozen=True)
class ClipSpec:
    """What the generator makes: ``frames`` frames of ``size × size`` pixels with 1..``max_shapes``
    shapes each, radii ``radius`` (fractions of ``size``), speeds ``speed`` (pixels per frame) and a size
    change of relative amplitude up to ``pulse``."""

    frames: int = 16
    size: int = 64
    min_shapes: int = 1
    max_shapes: int = 3
    radius: tuple = (0.09, 0.18)
    speed: tuple = (0.8, 2.6)
    pulse: float = 0.35

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> ClipSpec:
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})


@dataclass
class Trajectories:
    """The simulated motion of a batch of clips, padded to ``max_shapes`` shapes (``active`` says which
    are real). Arrays are float64 NumPy: ``center (B, F, S, 2)`` as (x, y) pixels, ``radius (B, F, S)``,
    ``angle (B, F, S)`` radians, ``kind (B, S)`` indices into :data:`KINDS`, ``color (B, S, 3)``,
    ``background (B, 3)`` and ``velocity (B, F, S, 2)`` (the velocity after each frame's step)."""

    center: np.ndarray
    radius: np.ndarray
    angle: np.ndarray
    kind: np.ndarray
    color: np.ndarray
    active: np.ndarray
    background: np.ndarray
    velocity: np.ndarray


def _clip_params(seed: int, spec: ClipSpec) -> dict:
    rng = np.random.default_rng(int(seed))
    n = int(rng.integers(spec.min_shapes, spec.max_shapes + 1))
    s = spec.size
    base = rng.uniform(*spec.radius, size=n) * s
    hue0 = rng.uniform()
    hues = (hue0 + np.arange(n) / max(n, 1) + rng.uniform(-0.08, 0.08, size=n)) % 1.0  # distinct colours
    colors = np.array([colorsys.hsv_to_rgb(h, rng.uniform(0.65, 1.0), rng.uniform(0.8, 1.0)) for h in hues])
    theta = rng.uniform(0, 2 * math.pi, size=n)
    speed = rng.uniform(*spec.speed, size=n)
    return {
        "n": n,
        "kind": rng.integers(0, len(KINDS), size=n),
        "color": colors,
        "base": base,
        "amp": rng.uniform(0.0, spec.pulse, size=n),
        "freq": rng.uniform(0.5, 2.0, size=n),  # size-change cycles per clip
        "phase": rng.uniform(0, 2 * math.pi, size=n),
        "pos": np.stack([rng.uniform(base * 1.4, s - base * 1.4), rng.uniform(base * 1.4, s - base * 1.4)], -1),
        "vel": np.stack([speed * np.cos(theta), speed * np.sin(theta)], -1),
        "angle0": rng.uniform(0, math.pi, size=n),
        "spin": rng.uniform(-0.15, 0.15, size=n),
        "background": rng.uniform(0.0, 0.22, size=3),
    }


def simulate(seeds, spec: ClipSpec) -> Trajectories:
    """Motion of the clips ``seeds`` under ``spec``.

    Each shape moves at a constant speed; when its (current) extent would cross an edge, its position is
    reflected at that edge and the velocity component turns over (a bounce). Its radius follows
    ``base · (1 + amp · sin(2π · freq · f / frames + phase))`` and squares and diamonds turn at a constant
    rate.
    """
    seeds = list(seeds)
    b, f, m = len(seeds), spec.frames, spec.max_shapes
    center = np.zeros((b, f, m, 2))
    velocity = np.zeros((b, f, m, 2))
    radius = np.zeros((b, f, m))
    angle = np.zeros((b, f, m))
    kind = np.zeros((b, m), dtype=np.int64)
    color = np.zeros((b, m, 3))
    active = np.zeros((b, m), dtype=bool)
    background = np.zeros((b, 3))
    frame = np.arange(f)
    for i, seed in enumerate(seeds):
        p = _clip_params(seed, spec)
        n = p["n"]
        active[i, :n] = True
        kind[i, :n] = p["kind"]
        color[i, :n] = p["color"]
        background[i] = p["background"]
        r = p["base"][None, :] * (
            1 + p["amp"][None, :] * np.sin(2 * math.pi * p["freq"] * frame[:, None] / f + p["phase"])
        )
        radius[i, :, :n] = r
        angle[i, :, :n] = p["angle0"][None, :] + p["spin"][None, :] * frame[:, None]
        pos, vel = p["pos"].copy(), p["vel"].copy()
        for t in range(f):
            if t:
                pos = pos + vel
            lo, hi = r[t][:, None], spec.size - r[t][:, None]  # the centre's room at this frame's radius
            below, above = pos < lo, pos > hi
            pos = np.where(below, 2 * lo - pos, np.where(above, 2 * hi - pos, pos))
            vel = np.where(below, np.abs(vel), np.where(above, -np.abs(vel), vel))
            pos = np.clip(pos, lo, hi)  # a shape bigger than the room after a reflection stays inside
            center[i, t, :n] = pos
            velocity[i, t, :n] = vel
    return Trajectories(center, radius, angle, kind, color, active, background, velocity)


def render(traj: Trajectories, spec: ClipSpec, device="cpu"):
    """Frames of the simulated clips: a float32 tensor ``(B, 3, frames, size, size)`` in ``[0, 1]``.

    Shapes are painted in order over the background, each with coverage ``clamp(0.5 − d, 0, 1)`` where ``d``
    is its distance (in pixels, negative inside) from the pixel centre: a one-pixel anti-aliased edge.
    """
    import torch

    def t(a, dtype=torch.float32):
        return torch.as_tensor(a, dtype=dtype, device=device)

    s = spec.size
    coords = torch.arange(s, device=device, dtype=torch.float32) + 0.5
    yy, xx = coords[:, None], coords[None, :]
    c, r, ang = t(traj.center), t(traj.radius), t(traj.angle)  # (B,F,M,2), (B,F,M), (B,F,M)
    dx = xx - c[..., 0, None, None]  # (B,F,M,H,W)
    dy = yy - c[..., 1, None, None]
    cos, sin = torch.cos(ang)[..., None, None], torch.sin(ang)[..., None, None]
    u, v = cos * dx + sin * dy, -sin * dx + cos * dy  # coordinates in the shape's turning frame
    rr = r[..., None, None]
    d_circle = torch.sqrt(dx * dx + dy * dy) - rr
    d_square = torch.maximum(u.abs(), v.abs()) - rr * 0.85
    d_diamond = (u.abs() + v.abs()) * (1 / math.sqrt(2)) - rr * 0.8
    kind = t(traj.kind, torch.long)[:, None, :, None, None]
    d = torch.where(kind == 0, d_circle, torch.where(kind == 1, d_square, d_diamond))
    cover = (0.5 - d).clamp(0, 1) * t(traj.active)[:, None, :, None, None]  # (B,F,M,H,W)
    img = t(traj.background)[:, :, None, None, None].expand(-1, -1, spec.frames, s, s).clone()  # (B,3,F,H,W)
    col = t(traj.color)  # (B,M,3)
    for k in range(traj.center.shape[2]):
        a = cover[:, None, :, k]  # (B,1,F,H,W)
        img = img * (1 - a) + col[:, k, :, None, None, None] * a
    return img.clamp_(0, 1)


def generate_batch(seeds, spec: ClipSpec = ClipSpec(), device="cpu"):
    """The clips ``seeds`` as ``(len(seeds), 3, frames, size, size)`` float32 in ``[0, 1]`` on ``device``."""
    return render(simulate(seeds, spec), spec, device)


def generate_clip(seed: int, spec: ClipSpec = ClipSpec(), device="cpu"):
    """One clip, ``(3, frames, size, size)`` float32 in ``[0, 1]``."""
    return generate_batch([seed], spec, device)[0]
