"""Rectified flow (flow matching with straight paths; Liu et al. 2022, Lipman et al. 2022): the objective the
video model is trained with and the Euler sampler that turns noise into clips.

Data ``x₀`` (clips scaled to ``[-1, 1]``) and Gaussian noise ``ε`` are joined by the straight path
``x_t = (1 − t)·x₀ + t·ε``; along it ``dx_t/dt = ε − x₀``, which the model learns to predict from
``(x_t, t)`` by mean squared error, with ``t`` drawn logit-normally (``sigmoid`` of a standard normal: more
weight on the middle of the path, as in Esser et al. 2024). Sampling integrates ``dx/dt = v(x, t)`` from
``t = 1`` (noise) to ``t = 0`` with Euler steps.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F


def to_model_range(clips):
    """``[0, 1]`` pixels -> ``[-1, 1]``."""
    return clips * 2 - 1


def to_pixels(x):
    """``[-1, 1]`` -> ``[0, 1]`` pixels, clamped, float32."""
    return ((x.float() + 1) / 2).clamp(0, 1)


def sample_times(batch: int, generator=None, device="cpu"):
    """``(batch,)`` times in ``(0, 1)``, logit-normal(0, 1), drawn on ``device`` (``generator``'s)."""
    return torch.sigmoid(torch.randn(batch, generator=generator, device=device))


def flow_loss(model, x0, noise, t, attention=None):
    """The rectified-flow loss: mean squared error of the predicted velocity against ``noise − x0`` at
    ``x_t = (1 − t)·x0 + t·noise``."""
    tt = t.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    xt = (1 - tt) * x0 + tt * noise
    pred = model(xt, t, attention=attention)
    return F.mse_loss(pred.float(), (noise - x0).float())


def time_grid(steps: int, shift: float = 1.0):
    """``steps + 1`` times from 1 to 0; ``shift > 1`` spends more steps near the noise end
    (``t' = shift·t / (1 + (shift − 1)·t)``)."""
    t = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return (shift * t / (1 + (shift - 1) * t)).tolist()


@torch.no_grad()
def sample(model, noise, steps: int = 32, attention=None, shift: float = 1.0):
    """Euler integration of the learnt velocity from ``noise`` (at ``t = 1``) to ``t = 0``; returns the
    model-range clips (``[-1, 1]``, not clamped), in ``noise``'s dtype. Deterministic for a given ``noise``,
    model and attention function."""
    ts = time_grid(steps, shift)
    x = noise
    b = noise.shape[0]
    for t0, t1 in itertools.pairwise(ts):
        t = torch.full((b,), t0, device=noise.device, dtype=torch.float32)
        v = model(x, t, attention=attention)
        x = x + (t1 - t0) * v.to(x.dtype)
    return x
