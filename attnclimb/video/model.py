"""A small video diffusion transformer whose attention heads are 128 wide, so that attnclimb's kernels
take its attention.

The clip ``(B, 3, F, H, W)`` is cut into ``patch`` patches (``(1, 4, 4)``: one frame, 4 × 4 pixels), each
a token; a fixed 3-D sinusoidal position code (a third of the width each for frame, row and column) is
added; ``depth`` transformer blocks with full self-attention over all the clip's tokens follow, each
modulated by the timestep through adaptive LayerNorm with zero-initialised gates (the DiT block of
Peebles & Xie, 2023); a last modulated LayerNorm and a linear layer map each token back to its patch.
Queries and keys are RMS-normalised per head before attention (keeps the logits bounded in bf16).

The model predicts the rectified-flow velocity ``ε − x₀`` at ``x_t = (1 − t)·x₀ + t·ε`` (see
:mod:`attnclimb.video.flow`). Attention is a function argument: by default
``torch.nn.functional.scaled_dot_product_attention`` looked up at call time (so ``attnclimb.patch_sdpa``
routes it), or any function with SDPA's ``(q, k, v)`` signature on ``(B, heads, tokens, 128)`` tensors,
such as ``attnclimb.scaled_dot_product_attention``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DiTConfig:
    """The model's size. The defaults make 6.5 M parameters (13 MB in bf16: the weights file must stay under
    the 16 MiB a file the GPU machine can send back) and 4096 tokens per 16-frame 64 × 64 clip."""

    frames: int = 16
    size: int = 64
    channels: int = 3
    patch: tuple = (1, 4, 4)
    heads: int = 2
    head_dim: int = 128
    depth: int = 6
    mlp_ratio: float = 3.0
    freq_dim: int = 256

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def grid(self) -> tuple:
        pt, ph, pw = self.patch
        if self.frames % pt or self.size % ph or self.size % pw:
            raise ValueError(f"patch {self.patch} does not divide {self.frames} x {self.size} x {self.size}")
        return (self.frames // pt, self.size // ph, self.size // pw)

    @property
    def tokens(self) -> int:
        return math.prod(self.grid)

    def to_json(self) -> str:
        d = asdict(self)
        d["patch"] = list(self.patch)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DiTConfig:
        d = json.loads(text)
        d["patch"] = tuple(d["patch"])
        return cls(**d)


def sinusoid(pos, dim: int, base: float = 10000.0):
    """``(..., dim)`` sin/cos code of the float positions ``pos``: frequencies ``base^(-i/(dim/2))``."""
    half = dim // 2
    freqs = torch.exp(-math.log(base) * torch.arange(half, dtype=torch.float32, device=pos.device) / half)
    args = pos.float()[..., None] * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def position_code(grid: tuple, dim: int) -> torch.Tensor:
    """The fixed ``(tokens, dim)`` code of a ``(frames, rows, cols)`` token grid, frame-major: a third of
    ``dim`` (rounded to even) for each axis, zeros in what is left over."""
    part = (dim // 3) // 2 * 2
    f, h, w = grid
    tt, yy, xx = torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij")
    code = torch.zeros(f * h * w, dim)
    for i, axis in enumerate((tt, yy, xx)):
        code[:, i * part : (i + 1) * part] = sinusoid(axis.reshape(-1), part)
    return code


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


class Block(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        d = cfg.dim
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d)
        self.q_norm, self.k_norm = RMSNorm(cfg.head_dim), RMSNorm(cfg.head_dim)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        hidden = int(d * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, d))
        self.ada = nn.Linear(d, 6 * d)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, c, attention):
        b, s, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(F.silu(c)).chunk(6, dim=-1)
        h = modulate(self.norm1(x), shift1, scale1)
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)  # (B, heads, tokens, head_dim)
        o = attention(q, k, v)
        x = x + gate1[:, None] * self.proj(o.transpose(1, 2).reshape(b, s, d))
        return x + gate2[:, None] * self.mlp(modulate(self.norm2(x), shift2, scale2))


def _default_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)  # looked up per call: patch_sdpa routes it


class VideoDiT(nn.Module):
    """See the module docstring. ``forward(x, t, attention=None)``: ``x`` ``(B, C, F, H, W)``, ``t`` ``(B,)``
    in ``[0, 1]``; returns the predicted velocity, shaped like ``x``."""

    def __init__(self, cfg: DiTConfig = DiTConfig()):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        pt, ph, pw = cfg.patch
        self.patch_dim = cfg.channels * pt * ph * pw
        self.embed = nn.Linear(self.patch_dim, d)
        self.register_buffer("pos", position_code(cfg.grid, d), persistent=False)
        self.t_mlp = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, self.patch_dim)
        for lin in (self.ada_out, self.out):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def patchify(self, x):
        b, c, f, h, w = x.shape
        pt, ph, pw = self.cfg.patch
        gf, gh, gw = f // pt, h // ph, w // pw
        x = x.reshape(b, c, gf, pt, gh, ph, gw, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
        return x.reshape(b, gf * gh * gw, self.patch_dim)

    def unpatchify(self, tokens):
        b = tokens.shape[0]
        c, (pt, ph, pw), (gf, gh, gw) = self.cfg.channels, self.cfg.patch, self.cfg.grid
        x = tokens.reshape(b, gf, gh, gw, c, pt, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return x.reshape(b, c, gf * pt, gh * ph, gw * pw)

    def forward(self, x, t, attention=None):
        attention = attention or _default_attention
        h = self.embed(self.patchify(x)) + self.pos.to(x.dtype)
        c = self.t_mlp(sinusoid(t * 1000.0, self.cfg.freq_dim).to(x.dtype))
        for blk in self.blocks:
            h = blk(h, c, attention)
        shift, scale = self.ada_out(F.silu(c)).chunk(2, dim=-1)
        return self.unpatchify(self.out(modulate(self.norm_out(h), shift, scale)))
