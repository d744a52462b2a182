"""Training the video model on generated clips (torch's SDPA, which has a backward), and its weights file.

The weights are one safetensors file: the tensors of the model's ``state_dict`` (the exponential moving
average of the weights, in bf16 by default) and, in the file's metadata, the model's :class:`DiTConfig`,
the :class:`ClipSpec` it was trained on and a record of the training (steps, batch, loss, device,
versions, commit, date). :func:`load_weights` needs nothing else to rebuild the model.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .clips import ClipSpec, generate_batch
from .flow import flow_loss, sample_times, to_model_range
from .model import DiTConfig, VideoDiT

FORMAT = "attnclimb-videodit"
FORMAT_VERSION = "1"


@dataclass
class TrainSettings:
    batch: int = 32
    lr: float = 5e-4
    warmup: int = 200
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ema: float = 0.999
    seed: int = 0
    steps: int | None = None  # stop after this many steps ...
    minutes: float | None = None  # ... or after this much wall time, whichever comes first
    log_every: int = 50


@dataclass
class TrainResult:
    steps: int
    seconds: float
    losses: list = field(default_factory=list)
    ema_model: object = None


def batch_seeds(settings: TrainSettings, step: int) -> list:
    """The clip seeds of training step ``step``: a disjoint range per step, offset by the run's seed."""
    base = settings.seed * 1_000_003_000 + step * settings.batch
    return list(range(base, base + settings.batch))


def _lr(settings: TrainSettings, step: int) -> float:
    return settings.lr * min(1.0, (step + 1) / max(1, settings.warmup))


def train(
    model: VideoDiT,
    spec: ClipSpec,
    settings: TrainSettings,
    *,
    device="cpu",
    fixed_batch: bool = False,
    log=None,
) -> TrainResult:
    """Train ``model`` in place with AdamW on the rectified-flow loss, and keep an EMA copy.

    Each step renders ``settings.batch`` new clips (:func:`batch_seeds`) on ``device`` and draws noise
    and times there from a generator seeded per step, so a run is reproducible on one kind of device up
    to the GPU's own nondeterminism. ``fixed_batch=True`` uses step 0's clips, noise and times at every step (the test
    that the optimisation works). Mixed precision: bf16 autocast on CUDA, fp32 elsewhere. Stops after
    ``settings.steps`` steps or ``settings.minutes`` minutes, whichever comes first (at least one step).
    """
    if settings.steps is None and settings.minutes is None:
        raise ValueError("give steps or minutes")
    model.to(device).train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.99))
    cuda = str(device).startswith("cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    losses = []
    t_start = time.perf_counter()
    deadline = t_start + settings.minutes * 60 if settings.minutes is not None else math.inf
    step = 0
    while True:
        k = 0 if fixed_batch else step
        x0 = to_model_range(generate_batch(batch_seeds(settings, k), spec, device))
        g = torch.Generator(device=device).manual_seed(settings.seed * 7919 + k)  # drawn where it is used
        noise = torch.randn(x0.shape, generator=g, device=device)
        t = sample_times(x0.shape[0], g, device)
        for group in opt.param_groups:
            group["lr"] = _lr(settings, step)
        with autocast:
            loss = flow_loss(model, x0, noise, t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if settings.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        decay = min(settings.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm.detach(), 1 - decay)
        losses.append(float(loss.detach()))
        step += 1
        if log is not None and (step % settings.log_every == 0 or step == 1):
            recent = losses[-settings.log_every :]
            log(f"step {step}: loss {sum(recent) / len(recent):.4f} ({time.perf_counter() - t_start:.0f} s)")
        if (settings.steps is not None and step >= settings.steps) or time.perf_counter() >= deadline:
            break
    model.eval()
    return TrainResult(steps=step, seconds=time.perf_counter() - t_start, losses=losses, ema_model=ema)


def save_weights(path, model: VideoDiT, spec: ClipSpec, record: dict | None = None, dtype=torch.bfloat16) -> Path:
    """Write ``model``'s weights (cast to ``dtype``), config, clip spec and ``record`` to ``path``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
        for k, v in model.state_dict().items()
    }
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model.cfg.to_json(),
        "clips": json.dumps(spec.to_dict(), sort_keys=True),
        "train": json.dumps(record or {}, sort_keys=True, default=str),
    }
    save_file(tensors, str(path), metadata=meta)
    return path


def load_weights(path, device="cpu", dtype=torch.float32):
    """``(model, clip_spec, record)`` from a file written by :func:`save_weights`; the model in eval mode on
    ``device`` in ``dtype``. ``ValueError`` for a file of another format."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not an attnclimb video model (format {meta.get('format')!r})")
    cfg = DiTConfig.from_json(meta["model"])
    spec = ClipSpec.from_dict(json.loads(meta["clips"]))
    model = VideoDiT(cfg)
    model.load_state_dict(load_file(str(path)))
    return model.to(device=device, dtype=dtype).eval(), spec, json.loads(meta.get("train", "{}"))


def settings_record(settings: TrainSettings, result: TrainResult, device) -> dict:
    """What :func:`save_weights` stores about a run."""
    tail = result.losses[-min(len(result.losses), 100) :]
    return {
        **asdict(settings),
        "steps_done": result.steps,
        "seconds": round(result.seconds, 1),
        "final_loss": sum(tail) / len(tail) if tail else None,
        "device": str(device),
    }
