"""``python -m attnclimb capstone``: one denoising step of a production video diffusion transformer
(diffusers' ``WanTransformer3DModel``) with its attention routed through attnclimb and through its peers.

What is timed is the transformer's forward (30 or 40 blocks of self-attention over the video tokens,
cross-attention to the 512 text tokens and the feed-forward layers), once per attention route:

========================  ====================================================================================
route                     how the model's attention gets there
========================  ====================================================================================
``attnclimb``             diffusers backend ``"attnclimb"`` (:func:`attnclimb.register_diffusers_backend`)
``attnclimb_patch``       diffusers' ``"native"`` backend inside :func:`attnclimb.patch_sdpa`
``sdpa_cudnn``            ``"native"`` inside ``sdpa_kernel(CUDNN_ATTENTION)`` (the reference)
``sdpa_flash``            ``"native"`` inside ``sdpa_kernel(FLASH_ATTENTION)`` (torch's FlashAttention-2)
``sdpa``                  ``"native"``, torch's own choice of SDPA backend (the reference where cuDNN cannot run)
``fa4``                   a backend calling ``flash_attn.cute.flash_attn_func`` on diffusers' BSHD tensors
``none``                  a backend that returns the query: the step without attention, for the share
========================  ====================================================================================

The ``"native"`` routes hand torch's SDPA diffusers' BSHD tensors as ``(B, H, S, D)`` views, without copies.
Weights are random but deterministic (seeded) and of the real shapes, in bf16 with the modules diffusers
keeps in fp32 (``_keep_in_fp32_modules``) in fp32, as ``from_pretrained(torch_dtype=torch.bfloat16)`` loads
them; ``--weights DIR`` loads a local diffusers checkpoint instead. ``docs/capstone.md`` has the details.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

DESCRIPTION = (
    "Time one denoising step (the transformer forward) of diffusers' WanTransformer3DModel with the Wan2.1 "
    "configurations, attention routed through attnclimb, torch SDPA (cuDNN, flash), FlashAttention-4 when "
    "importable, and an attention-free stand-in; report step times, the attention's share, the speedup over "
    "cuDNN and each output's rel-L2 against the cuDNN path, and write a JSON under benchmarks/capstone/. "
    "Needs diffusers (pip install 'attnclimb[video]'); --config tiny runs on the CPU through the fallback."
)

# ------------------------------------------------------------------------------------------ configurations

# Wan2.1's VAE compresses 4x in time (plus the first frame) and 8x in space; the transformer then cuts the
# latent into 1x2x2 patches. diffusers' WanPipeline: height 480, width 832, num_frames 81 by default, prompt
# embeddings padded to max_sequence_length=512 umT5 tokens of dim 4096 (pipelines/wan/pipeline_wan.py).
VAE_STRIDE = (4, 8, 8)
TEXT_TOKENS = 512


def latent_shape(frames: int, height: int, width: int) -> tuple:
    """The VAE latent's ``(frames, height, width)`` for a video of that size: ``((F-1)/4+1, H/8, W/8)``."""
    st, sh, sw = VAE_STRIDE
    if (frames - 1) % st or height % sh or width % sw:
        raise ValueError(f"a {frames}x{height}x{width} video does not fit the VAE's strides {VAE_STRIDE}")
    return ((frames - 1) // st + 1, height // sh, width // sw)


@dataclass(frozen=True)
class WanConfig:
    """One configuration of the benchmark: the transformer's ``WanTransformer3DModel`` arguments, the latent
    it denoises and the text it attends to, and how many of its blocks run by default."""

    name: str
    label: str
    model: dict
    latent: tuple  # (frames, height, width) of the latent
    text_tokens: int
    video: tuple | None = None  # (frames, height, width) in pixels, for the label
    default_blocks: int | None = None  # None: all of them
    source: str = ""

    @property
    def num_layers(self) -> int:
        return self.model["num_layers"]

    def seqlen(self) -> int:
        """Video tokens: the latent cut into ``patch_size`` patches."""
        pt, ph, pw = self.model["patch_size"]
        f, h, w = self.latent
        return (f // pt) * (h // ph) * (w // pw)


# The transformer configurations diffusers converts the released checkpoints with: diffusers'
# scripts/convert_wan_to_diffusers.py, get_transformer_config("Wan-T2V-1.3B") and ("Wan-T2V-14B"), which
# are the transformer/config.json of the Wan-AI/Wan2.1-T2V-{1.3B,14B}-Diffusers checkpoints; the constructor
# defaults of WanTransformer3DModel (diffusers 0.42) supply rope_max_seq_len=1024.
_WAN_COMMON = {
    "patch_size": (1, 2, 2),
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "added_kv_proj_dim": None,
    "image_dim": None,
    "rope_max_seq_len": 1024,
}
_SOURCE = "diffusers scripts/convert_wan_to_diffusers.py get_transformer_config('{}')"

CONFIGS = {
    "wan2.1-1.3b": WanConfig(
        name="wan2.1-1.3b",
        label="Wan2.1-T2V-1.3B, 480x832, 81 frames",
        model={**_WAN_COMMON, "num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30},
        latent=latent_shape(81, 480, 832),  # (21, 60, 104) -> 32760 tokens
        text_tokens=TEXT_TOKENS,
        video=(81, 480, 832),
        source=_SOURCE.format("Wan-T2V-1.3B"),
    ),
    "wan2.1-14b": WanConfig(
        name="wan2.1-14b",
        label="Wan2.1-T2V-14B, 720x1280, 81 frames",
        model={**_WAN_COMMON, "num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40},
        latent=latent_shape(81, 720, 1280),  # (21, 90, 160) -> 75600 tokens
        text_tokens=TEXT_TOKENS,
        video=(81, 720, 1280),
        # A whole step is ~100 s on an H200 (40 x ~2 s of attention alone): 4 blocks keep every route's
        # warm-up and rounds inside one 10-minute device command. Blocks are alike, so the per-block
        # picture is the model's.
        default_blocks=4,
        source=_SOURCE.format("Wan-T2V-14B"),
    ),
    # The CPU smoke test: the same classes and code path at a size that runs in a second.
    "tiny": WanConfig(
        name="tiny",
        label="tiny test configuration (2 heads x 128, 2 blocks)",
        model={
            **_WAN_COMMON,
            "in_channels": 4,
            "out_channels": 4,
            "text_dim": 32,
            "freq_dim": 32,
            "num_attention_heads": 2,
            "ffn_dim": 64,
            "num_layers": 2,
            "rope_max_seq_len": 32,
        },
        latent=(3, 8, 8),
        text_tokens=16,
        source="attnclimb.capstone (test configuration)",
    ),
}

# ----------------------------------------------------------------------------------------------- routes

ROUTE_KEYS = ("attnclimb", "attnclimb_patch", "sdpa_cudnn", "sdpa_flash", "sdpa", "fa4", "none")
DEFAULT_ROUTES = ("attnclimb", "sdpa_cudnn", "sdpa_flash", "fa4", "none")
ROUTE_LABELS = {
    "attnclimb": "attnclimb (diffusers backend)",
    "attnclimb_patch": "attnclimb (patch_sdpa)",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_flash": "SDPA flash (FA2)",
    "sdpa": "SDPA (torch's choice)",
    "fa4": "FlashAttention-4 (sm90)",
    "none": "no attention (query passed through)",
}
REFERENCE_KEYS = ("sdpa_cudnn", "sdpa")  # the first of these that ran is the rel-L2 and speedup reference
FA4_BACKEND = "attnclimb_fa4"
NONE_BACKEND = "attnclimb_none"


def _one_line(exc: BaseException, limit: int = 200) -> str:
    msg = " ".join(str(exc).split()) or type(exc).__name__
    msg = f"{type(exc).__name__}: {msg}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _fa4_function():
    """``flash_attn.cute.flash_attn_func`` (FlashAttention-4), or raises ImportError."""
    from flash_attn.cute import flash_attn_func

    return flash_attn_func


def _fa4_backend(flash_attn_func):
    def fa4_attention(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
        _parallel_config=None,
    ):
        """diffusers' backend call on FlashAttention-4: it takes diffusers' BSHD tensors as they are."""
        if attn_mask is not None or dropout_p or return_lse or _parallel_config is not None:
            raise ValueError("the FA4 route takes no mask, dropout, return_lse or context parallelism")
        kwargs = {"causal": bool(is_causal)}
        if scale is not None:
            kwargs["softmax_scale"] = float(scale)
        out = flash_attn_func(query, key, value, **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out

    return fa4_attention


def _none_backend(query, key, value, *args, **kwargs):
    """The attention-free stand-in: the output of attention is the query itself (same shape, no work)."""
    return query


@dataclass
class Route:
    key: str
    label: str
    backend: str  # the diffusers backend the model is set to
    ctx: object = None  # zero-argument callable -> context manager entered around each call
    why_not: str | None = None  # set when the route cannot run here


def make_routes(keys, device: str) -> list:
    """The :class:`Route` objects for ``keys``, with the reason each one cannot run on ``device`` (if any).
    Registers the diffusers backends the routes need."""
    import torch

    from .integrations import diffusers as integ

    routes = []
    for key in keys:
        if key not in ROUTE_KEYS:
            raise ValueError(f"unknown route {key!r}; known: {', '.join(ROUTE_KEYS)}")
        r = Route(key=key, label=ROUTE_LABELS[key], backend="native")
        if key == "attnclimb":
            integ.register_diffusers_backend()
            r.backend = integ.BACKEND_NAME
        elif key == "attnclimb_patch":
            from .sdpa import patch_sdpa

            r.ctx = patch_sdpa
        elif key in ("sdpa_cudnn", "sdpa_flash"):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            which = SDPBackend.CUDNN_ATTENTION if key == "sdpa_cudnn" else SDPBackend.FLASH_ATTENTION
            r.ctx = lambda which=which: sdpa_kernel(which)
            if not device.startswith("cuda"):
                r.why_not = f"needs a CUDA device (running on {device})"
            elif key == "sdpa_cudnn" and not torch.backends.cudnn.is_available():
                r.why_not = "cuDNN is not available in this torch build"
        elif key == "fa4":
            try:
                fn = _fa4_function()
            except Exception as exc:
                r.why_not = f"flash_attn.cute not importable ({_one_line(exc, 120)})"
            else:
                integ.register_backend_function(FA4_BACKEND, _fa4_backend(fn))
                r.backend = FA4_BACKEND
                if not device.startswith("cuda"):
                    r.why_not = f"needs a CUDA device (running on {device})"
        elif key == "none":
            integ.register_backend_function(NONE_BACKEND, _none_backend)
            r.backend = NONE_BACKEND
        routes.append(r)
    return routes


def parse_routes(spec: str | None) -> list:
    """``--impls``: a comma list of route keys (or ``all``); ``None`` gives :data:`DEFAULT_ROUTES`."""
    if spec is None:
        return list(DEFAULT_ROUTES)
    keys = []
    for tok in (t.strip().lower() for t in spec.split(",")):
        if not tok:
            continue
        if tok == "all":
            keys += ROUTE_KEYS
        elif tok in ROUTE_KEYS:
            keys.append(tok)
        else:
            raise ValueError(f"unknown impl {tok!r}; known: {', '.join(ROUTE_KEYS)}, all")
    return list(dict.fromkeys(keys))


# ------------------------------------------------------------------------------------------------ model


def _keep_fp32(model_cls, name: str) -> bool:
    """diffusers' rule for ``_keep_in_fp32_modules`` when loading with a ``torch_dtype``: a parameter whose
    dotted name has one of those module names as a component stays fp32."""
    keep = getattr(model_cls, "_keep_in_fp32_modules", None) or []
    parts = name.split(".")
    return any(m in parts for m in keep)


def cast_like_from_pretrained(model, dtype):
    """Cast ``model``'s floating parameters and buffers to ``dtype`` except those diffusers keeps in fp32."""
    import torch

    for mod_name, module in model.named_modules():
        for attr, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is None or not tensor.is_floating_point():
                continue
            full = f"{mod_name}.{attr}" if mod_name else attr
            want = torch.float32 if _keep_fp32(type(model), full) else dtype
            if tensor.dtype != want:
                if attr in module._parameters:
                    module._parameters[attr] = torch.nn.Parameter(tensor.detach().to(want), requires_grad=False)
                else:
                    module._buffers[attr] = tensor.to(want)
    return model


def build_model(cfg: WanConfig, *, blocks: int | None, device: str, dtype, seed: int = 0, weights=None):
    """The transformer of ``cfg`` on ``device``, in eval mode, its first ``blocks`` blocks only.

    Random weights (``weights=None``): the model is constructed on ``device`` right after
    ``torch.manual_seed(seed)`` with ``num_layers=blocks`` (diffusers' own initialisation, so the same
    seed, device and torch give the same weights; the first ``blocks`` blocks are those of the full model
    built the same way), then cast as :func:`cast_like_from_pretrained` says.

    ``weights``: a local diffusers checkpoint (a folder with ``config.json``, or a pipeline folder with a
    ``transformer/`` subfolder), loaded with ``from_pretrained(torch_dtype=dtype)`` (diffusers needs
    ``accelerate`` for that with this model); its blocks after the first ``blocks`` are dropped.
    """
    import torch
    from diffusers import WanTransformer3DModel

    if weights is not None:
        weights = Path(weights)
        kw = {"subfolder": "transformer"} if (weights / "transformer" / "config.json").is_file() else {}
        if not kw and not (weights / "config.json").is_file():
            raise FileNotFoundError(f"{weights}: no config.json (nor transformer/config.json) of a diffusers model")
        try:
            import accelerate  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "loading a WanTransformer3DModel checkpoint needs accelerate (diffusers loads models with "
                "fp32-kept modules through it; pip install 'attnclimb[video]')"
            ) from exc
        model = WanTransformer3DModel.from_pretrained(str(weights), torch_dtype=dtype, **kw).to(device)
        if blocks is not None and blocks < len(model.blocks):
            model.blocks = torch.nn.ModuleList(list(model.blocks)[:blocks])
    else:
        kwargs = dict(cfg.model)
        if blocks is not None:
            kwargs["num_layers"] = blocks
        torch.manual_seed(seed)
        with torch.device(device):
            model = WanTransformer3DModel(**kwargs)
        cast_like_from_pretrained(model, dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def make_inputs(cfg: WanConfig, model_config, *, device: str, dtype, seed: int = 0, batch: int = 1) -> dict:
    """The forward's arguments: a latent ``(B, C, F, H, W)`` and text embeddings ``(B, T, text_dim)``, N(0, 1)
    from a CPU generator seeded with ``seed + 1`` (the same on every device), and timestep 500 of 1000."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    c = model_config["in_channels"]
    x = torch.randn(batch, c, *cfg.latent, generator=g)
    enc = torch.randn(batch, cfg.text_tokens, model_config["text_dim"], generator=g)
    return {
        "hidden_states": x.to(device=device, dtype=dtype),
        "timestep": torch.full((batch,), 500, device=device, dtype=torch.long),
        "encoder_hidden_states": enc.to(device=device, dtype=dtype),
        "return_dict": False,
    }


# ----------------------------------------------------------------------------------------------- timing


def _sync(device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_calls(fn, n: int, device: str) -> list:
    """Milliseconds of each of ``n`` calls of ``fn``: CUDA events on a GPU, ``perf_counter`` elsewhere."""
    import torch

    times = []
    if device.startswith("cuda"):
        for _ in range(n):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
    else:
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


@contextlib.contextmanager
def _on_route(model, route: Route):
    model.set_attention_backend(route.backend)
    with route.ctx() if route.ctx is not None else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def _quiet_diffusers():
    """set_attention_backend logs a warning ("experimental feature") on every call: keep errors only."""
    try:
        from diffusers.utils import logging as dlog
    except Exception:
        yield
        return
    old = dlog.get_verbosity()
    dlog.set_verbosity_error()
    try:
        yield
    finally:
        dlog.set_verbosity(old)


def run_routes(model, inputs, routes, *, device: str, rounds: int = 3, reps: int = 2, budget_s: float | None = None):
    """Run each route once (its output kept for the check) and time it in interleaved rounds.

    Every route that can run here gets one untimed call (which also compiles or loads what it needs, and
    gives the output for the rel-L2 check), then ``rounds`` rounds in which the routes take turns in the
    bench's order (:func:`attnclimb.bench.timing.round_order`: forwards, backwards, from half-way), each
    timing ``reps`` calls. ``budget_s`` lowers ``reps`` (to 1 at least) so that the rounds should take
    about that long by the untimed calls' times.

    Returns ``(results, outputs, reps)``: ``results[key]`` a dict (``status``, ``reason``, ``times_ms`` per
    round, ``fallbacks``), ``outputs[key]`` the first call's output.
    """
    import torch

    from . import sdpa as _sdpa
    from .bench.timing import round_order
    from .errors import AttnclimbFallbackWarning

    results, outputs, first_ms = {}, {}, {}
    live = []
    for r in routes:
        if r.why_not:
            results[r.key] = {"status": "skipped", "reason": r.why_not}
            continue
        _sdpa.reset_fallback_warnings()  # so a fallback of this route warns again, inside this record
        try:
            with warnings.catch_warnings(record=True) as caught, _on_route(model, r), torch.inference_mode():
                warnings.simplefilter("always", AttnclimbFallbackWarning)
                _sync(device)
                t0 = time.perf_counter()
                out = model(**inputs)[0]
                _sync(device)
                first_ms[r.key] = (time.perf_counter() - t0) * 1e3
        except Exception as exc:
            results[r.key] = {"status": "failed", "reason": _one_line(exc)}
            continue
        fallbacks = sorted({str(w.message) for w in caught if issubclass(w.category, AttnclimbFallbackWarning)})
        outputs[r.key] = out
        results[r.key] = {"status": "ok", "reason": "", "fallbacks": fallbacks, "first_call_ms": first_ms[r.key]}
        live.append(r)
    if budget_s is not None and live:
        per_rep = sum(first_ms[r.key] for r in live) / 1e3 * rounds
        reps = max(1, min(reps, int(budget_s // max(per_rep, 1e-9))))
    for i in range(rounds):
        for j in round_order(len(live), i, rounds):
            r = live[j]
            if results[r.key]["status"] != "ok":
                continue
            try:
                with warnings.catch_warnings(), _on_route(model, r), torch.inference_mode():
                    warnings.simplefilter("ignore")
                    times = time_calls(lambda: model(**inputs), reps, device)
            except Exception as exc:  # e.g. out of memory in a later round: the route fails, the others go on
                results[r.key].update(status="failed", reason=f"round {i}: {_one_line(exc)}")
                outputs.pop(r.key, None)
                continue
            results[r.key].setdefault("times_ms", []).append(times)
    model.set_attention_backend("native")
    return results, outputs, reps


def summarise(results: dict, outputs: dict, routes) -> tuple:
    """Rows of the report (one per route, in ``routes``' order) and the reference's key.

    A row's ``step_ms`` is the median over rounds of each round's median; ``speedup_vs_ref`` is the
    reference's step time over the row's; ``attention_ms`` the step time less the attention-free step's,
    ``attention_share`` that over the step time, ``attention_speedup_vs_ref`` the reference's attention
    time over the row's; ``rel_l2_vs_ref`` compares the outputs in float64.
    """
    from .bench.timing import median_of_rounds
    from .reference import rel_l2

    ref = next((k for k in REFERENCE_KEYS if results.get(k, {}).get("status") == "ok"), None)
    rows = []
    for r in routes:
        res = results[r.key]
        row = {"impl": r.key, "label": r.label, "backend": r.backend, **res}
        if res["status"] == "ok":
            rounds = [statistics.median(t) for t in res.get("times_ms", [])]
            row["round_medians_ms"] = rounds
            row["step_ms"] = median_of_rounds(rounds) if rounds else None
        rows.append(row)
    by = {row["impl"]: row for row in rows}
    t_ref = by[ref].get("step_ms") if ref else None
    t_none = by.get("none", {}).get("step_ms")
    for row in rows:
        t = row.get("step_ms")
        if t is None:
            continue
        row["speedup_vs_ref"] = t_ref / t if t_ref else None
        if t_none is not None and row["impl"] != "none":
            row["attention_ms"] = t - t_none
            row["attention_share"] = (t - t_none) / t
            a_ref = (t_ref - t_none) if t_ref is not None else None
            row["attention_speedup_vs_ref"] = a_ref / (t - t_none) if a_ref and t > t_none else None
        if ref is not None and row["impl"] != "none":
            err = rel_l2(outputs[row["impl"]], outputs[ref])
            row["rel_l2_vs_ref"] = err if math.isfinite(err) else None
            row["finite"] = math.isfinite(err)
    return rows, ref


# ------------------------------------------------------------------------------------------ environment


def _version(dist: str):
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def collect_env(device: str) -> dict:
    """Device, versions (torch, CUDA, cuDNN, diffusers, FA4, attnclimb), git commit and UTC date."""
    import torch

    from .bench.run import git_commit

    env = {
        "device": platform.processor() or platform.machine() or "cpu",
        "device_type": "cpu",
        "torch_version": torch.__version__,
        "diffusers_version": _version("diffusers"),
        "flash_attn_4_version": _version("flash-attn-4"),
        "attnclimb_version": __import__("attnclimb").__version__,
        "python_version": platform.python_version(),
        "commit": git_commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if device.startswith("cuda"):
        from .bench.run import collect_env as gpu_env

        env.update({k: v for k, v in gpu_env().items() if k not in ("commit", "date")})
        env["device_type"] = "cuda"
    return env


def default_out(device_slug: str, cfg: WanConfig, blocks: int, total: int, when: datetime | None = None) -> Path:
    """``benchmarks/capstone/<device>-<config>[-<N>of<M>blocks]-YYYYMMDD-HHMMSS.json`` in the checkout (or
    under the working directory when installed)."""
    when = when or datetime.now(timezone.utc)
    part = f"-{blocks}of{total}blocks" if blocks < total else ""
    return results_dir() / f"{device_slug}-{cfg.name}{part}-{when.strftime('%Y%m%d-%H%M%S')}.json"


# ---------------------------------------------------------------------------------------------- report


def _fmt(v, spec: str, empty: str = "—") -> str:
    return empty if v is None else format(v, spec)


def format_table(doc: dict) -> str:
    """The plain-text table printed at the end of a run."""
    head = ("impl", "step ms", "×ref", "attn ms", "attn share", "attn ×ref", "rel-L2 vs ref", "note")
    lines = []
    for row in doc["rows"]:
        note = row.get("reason") or ""
        if row.get("fallbacks"):
            note = (note + "; " if note else "") + f"fell back to torch SDPA ({len(row['fallbacks'])} reason(s))"
        if row["impl"] == doc.get("reference"):
            note = (note + "; " if note else "") + "reference"
        lines.append(
            (
                row["label"],
                _fmt(row.get("step_ms"), ".1f"),
                _fmt(row.get("speedup_vs_ref"), ".3f"),
                _fmt(row.get("attention_ms"), ".1f"),
                _fmt(row.get("attention_share"), ".1%"),
                _fmt(row.get("attention_speedup_vs_ref"), ".3f"),
                _fmt(row.get("rel_l2_vs_ref"), ".2e"),
                note if row["status"] == "ok" else f"{row['status']}: {note}",
            )
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = ["  ".join(str(x).ljust(w) for x, w in zip(head, widths)).rstrip()]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in lines]
    return "\n".join(out)


BEGIN, END = "<!-- capstone:begin -->", "<!-- capstone:end -->"
CONFIG_ORDER = ("wan2.1-1.3b", "wan2.1-14b")


def results_dir() -> Path:
    from .bench.paths import REPO_ROOT, in_checkout

    return (REPO_ROOT if in_checkout() else Path.cwd()) / "benchmarks" / "capstone"


def newest_per_config(folder) -> list:
    """The newest (by ``date``) capstone JSON of each real configuration in ``folder``, in
    :data:`CONFIG_ORDER`; files of other kinds, the tiny configuration and CPU runs are left out."""
    best = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("kind") != "capstone":
            continue
        name = doc.get("config", {}).get("name")
        if name not in CONFIG_ORDER or doc.get("device_type") != "cuda":
            continue
        if name not in best or str(doc.get("date", "")) > str(best[name][0].get("date", "")):
            best[name] = (doc, path)
    return [best[n] for n in CONFIG_ORDER if n in best]


def markdown_section(docs, video=None, video_dir: str = "benchmarks/capstone/video", rel=None) -> str:
    """The README's capstone section: one table row per configuration and route, the notes, and the video
    samples (GIF, frame strip, PSNR) when ``video`` (a ``samples.json`` record) is given. ``rel(path)`` turns a
    JSON's path into the link text (default: as given)."""
    rel = rel or (lambda p: str(p))
    out = []
    if not docs:
        out.append(
            "_No GPU run of `python -m attnclimb capstone` is committed yet; see [docs/capstone.md](docs/capstone.md)._"
        )
        out.append("")
    for doc, path in docs:
        c = doc["config"]
        blocks = (
            f"{c['blocks_run']} of {c['blocks_total']} blocks" if c["blocks_run"] < c["blocks_total"] else "all blocks"
        )
        ref = doc.get("reference")
        ref_label = ROUTE_LABELS.get(ref, ref)
        out.append(
            f"**{c['label']}** ({c['seqlen']} video tokens, {c['model']['num_attention_heads']} heads × 128, "
            f"{c['text_tokens']} text tokens; {blocks}) · {doc.get('device')} · torch {doc.get('torch_version')} · "
            f"diffusers {doc.get('diffusers_version')} · commit {str(doc.get('commit', ''))[:7]} · "
            f"{str(doc.get('date', ''))[:10]} · [JSON]({rel(path)})"
        )
        out.append("")
        out.append(
            f"| route | step ms | × {ref_label} | attention ms | attention share | attention × {ref_label} | "
            f"rel-L2 vs {ref_label} |"
        )
        out.append("|:---|---:|---:|---:|---:|---:|---:|")
        for row in doc["rows"]:
            if row.get("status") != "ok":
                out.append(f"| {row['label']} | {row['status']}: {row.get('reason', '')} | | | | | |")
                continue
            out.append(
                f"| {row['label']} | {_fmt(row.get('step_ms'), '.1f')} | {_fmt(row.get('speedup_vs_ref'), '.3f')}× | "
                f"{_fmt(row.get('attention_ms'), '.1f')} | {_fmt(row.get('attention_share'), '.1%')} | "
                f"{_fmt(row.get('attention_speedup_vs_ref'), '.3f')} | {_fmt(row.get('rel_l2_vs_ref'), '.2e')} |"
            )
        out += ["", *[f"- {n}" for n in doc.get("notes", [])], ""]
    if video:
        value = "identical" if video.get("identical") else f"{video['psnr_db']:.1f} dB"
        train = video.get("training") or {}
        out.append(
            f"**Sample videos** of the small video DiT ({video['model']['heads']} heads × 128, "
            f"{video['model']['depth']} blocks, trained {train.get('steps_done', '?')} steps in "
            f"{train.get('seconds', '?')} s), sampled from the same noise with attnclimb (left) and torch's SDPA "
            f"(right), {video['steps']} Euler steps, {video.get('device')}: PSNR between the two samplings {value}."
        )
        out.append("")
        out.append(f"![attnclimb and SDPA samples side by side]({video_dir}/side_by_side.gif)")
        out.append("")
        out.append(f"![frames of the samples]({video_dir}/frames.png)")
        out.append("")
    out.append(
        "<sub>Generated by `python -m attnclimb capstone --report` from the JSON in `benchmarks/capstone/`; "
        "do not edit by hand.</sub>"
    )
    return "\n".join(out)


def replace_section(text: str, section: str) -> str:
    """``text`` with what lies between :data:`BEGIN` and :data:`END` replaced by ``section``."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"the README has no {BEGIN} ... {END} block")
    return text[: i + len(BEGIN)] + "\n" + section + "\n" + text[j:]


def report_main(args) -> int:
    from .bench.paths import REPO_ROOT, default_readme

    folder = Path(args.results) if args.results else results_dir()
    docs = newest_per_config(folder)
    video_json = folder / "video" / "samples.json"
    video = json.loads(video_json.read_text()) if video_json.is_file() else None
    readme = Path(args.readme) if args.readme else default_readme()
    base = readme.parent if readme else REPO_ROOT

    def rel(path):
        try:
            return Path(os.path.relpath(Path(path).resolve(), base.resolve())).as_posix()
        except ValueError:
            return str(path)

    section = markdown_section(docs, video, rel(folder / "video"), rel)
    if readme is None:
        print(section)
        return 0
    text = readme.read_text()
    new = replace_section(text, section)
    if new != text:
        readme.write_text(new)
    print(f"{readme}: capstone section from {len(docs)} result file(s){' and the video samples' if video else ''}")
    return 0


def add_arguments(p) -> None:
    p.add_argument(
        "--config",
        default="wan2.1-1.3b",
        choices=sorted(CONFIGS),
        help="the model and video size (default: %(default)s; tiny: a CPU-sized test configuration)",
    )
    p.add_argument(
        "--blocks",
        type=int,
        default=None,
        metavar="N",
        help="run only the first N transformer blocks (default: all, except wan2.1-14b: 4 of 40)",
    )
    p.add_argument(
        "--weights",
        default=None,
        metavar="DIR",
        help="a local diffusers checkpoint (from_pretrained) instead of the seeded random weights",
    )
    p.add_argument(
        "--impls",
        default=None,
        metavar="LIST",
        help=f"comma list of routes: {', '.join(ROUTE_KEYS)} or all (default: {','.join(DEFAULT_ROUTES)})",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="the JSON to write, or a folder to write it in "
        "(default: benchmarks/capstone/<device>-<config>-<date>.json)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default: 0)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default: 3)")
    p.add_argument("--reps", type=int, default=3, help="timed steps per route per round, at most (default: 3)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="lower --reps so the timed rounds take about this many seconds (default: %(default)s)",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="run nothing: write the README's capstone section from the newest JSON of each configuration in "
        "--results and the video samples (benchmarks/capstone/video/samples.json)",
    )
    p.add_argument(
        "--results", default=None, metavar="DIR", help="--report: the JSON folder (default: benchmarks/capstone)"
    )
    p.add_argument(
        "--readme", default=None, metavar="FILE", help="--report: the README to update (default: the checkout's)"
    )


def main(args) -> int:
    if args.report:
        return report_main(args)
    try:
        import diffusers  # noqa: F401
    except ImportError as exc:
        print(f"capstone needs diffusers (pip install 'attnclimb[video]'): {exc}", file=sys.stderr)
        return 2
    import torch

    cfg = CONFIGS[args.config]
    try:
        keys = parse_routes(args.impls)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    blocks = args.blocks if args.blocks is not None else cfg.default_blocks
    if blocks is not None and not 1 <= blocks <= cfg.num_layers:
        print(f"--blocks must be 1..{cfg.num_layers} for {cfg.name}", file=sys.stderr)
        return 2
    dtype = torch.bfloat16
    notes = []
    t0 = time.perf_counter()
    model = build_model(cfg, blocks=blocks, device=device, dtype=dtype, seed=args.seed, weights=args.weights)
    build_s = time.perf_counter() - t0
    model_config = dict(model.config)
    total_blocks = int(model_config["num_layers"]) if args.weights else cfg.num_layers
    ran_blocks = len(model.blocks)
    if ran_blocks < total_blocks:
        notes.append(
            f"only the first {ran_blocks} of the model's {total_blocks} transformer blocks ran (--blocks): the "
            "whole step does not fit the time budget; blocks are alike, so times per block carry over"
        )
    inputs = make_inputs(cfg, model_config, device=device, dtype=dtype, seed=args.seed)
    if not any(k in keys for k in REFERENCE_KEYS):
        keys.append("sdpa_cudnn")
    routes = make_routes(keys, device)
    by_key = {r.key: r for r in routes}
    if by_key.get("sdpa_cudnn") and by_key["sdpa_cudnn"].why_not and "sdpa" not in by_key:
        routes += make_routes(["sdpa"], device)
        notes.append(f"SDPA cuDNN cannot run here ({by_key['sdpa_cudnn'].why_not}): torch's own SDPA is the reference")
    heads = model_config["num_attention_heads"]
    print(
        f"{cfg.label}: {ran_blocks}/{total_blocks} blocks, {heads} heads x {model_config['attention_head_dim']}, "
        f"{cfg.seqlen()} video tokens, {cfg.text_tokens} text tokens, {device}; model ready in {build_s:.1f} s",
        file=sys.stderr,
    )
    with _quiet_diffusers():
        results, outputs, reps = run_routes(
            model, inputs, routes, device=device, rounds=args.rounds, reps=args.reps, budget_s=args.budget_s
        )
    rows, ref = summarise(results, outputs, routes)
    if ref is None:
        notes.append("no reference route ran: no speedups or rel-L2")
    for row in rows:
        if device.startswith("cuda") and row["impl"].startswith("attnclimb") and row.get("fallbacks"):
            notes.append(
                f"{row['impl']} fell back to torch's SDPA, so its time is not the kernels': {row['fallbacks']}"
            )
    env = collect_env(device)
    doc = {
        "kind": "capstone",
        **env,
        "config": {
            "name": cfg.name,
            "label": cfg.label,
            "source": cfg.source if not args.weights else f"checkpoint {args.weights}",
            "model": {
                k: (list(v) if isinstance(v, tuple) else v) for k, v in model_config.items() if not k.startswith("_")
            },
            "blocks_run": ran_blocks,
            "blocks_total": total_blocks,
            "video": list(cfg.video) if cfg.video else None,
            "latent": list(cfg.latent),
            "seqlen": cfg.seqlen(),
            "text_tokens": cfg.text_tokens,
            "batch": 1,
            "dtype": "bfloat16",
            "weights": str(args.weights) if args.weights else f"random, seed {args.seed}",
        },
        "settings": {"rounds": args.rounds, "reps": reps, "budget_s": args.budget_s, "seed": args.seed},
        "reference": ref,
        "notes": notes,
        "rows": rows,
    }
    from .bench.run import device_slug

    out = default_out(device_slug(env["device"]) if device.startswith("cuda") else "cpu", cfg, ran_blocks, total_blocks)
    if args.out:
        out = Path(args.out) / out.name if Path(args.out).is_dir() else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, out)
    print(format_table(doc))
    for n in notes:
        print(f"- {n}")
    print(f"wrote {out}", file=sys.stderr)
    bad = [row["impl"] for row in rows if row["status"] == "failed"]
    return 1 if bad or ref is None else 0


__all__ = [
    "CONFIGS",
    "DEFAULT_ROUTES",
    "ROUTE_KEYS",
    "WanConfig",
    "build_model",
    "cast_like_from_pretrained",
    "latent_shape",
    "make_inputs",
    "make_routes",
    "run_routes",
    "summarise",
]
