"""attnclimb: a ladder of attention forward kernels for NVIDIA Hopper, from an unfused baseline to a
warp-specialised wgmma/TMA pipeline.

Entry points: :func:`scaled_dot_product_attention` (torch's SDPA signature, falls back to torch for what
the kernels cannot take), :func:`patch_sdpa` (routes a model's ``F.scaled_dot_product_attention`` calls to
it), :func:`attention` (the kernels alone, any rung; raises on what they cannot take) and
:func:`register_diffusers_backend`. ``docs/dropin.md`` describes them.

``import attnclimb`` does not import torch: the torch-facing names load on first use (PEP 562), so the
command line (``python -m attnclimb build``) stays light.
"""

from .errors import AttnclimbFallbackWarning, KernelUnsupportedError
from .rungs import RUNGS

__all__ = [
    "RUNGS",
    "AttnclimbFallbackWarning",
    "KernelUnsupportedError",
    "attention",
    "hopper_available",
    "hopper_unavailable_reason",
    "patch_sdpa",
    "register_diffusers_backend",
    "scaled_dot_product_attention",
]
__version__ = "0.1.0"

_LAZY = {
    "attention": "api",
    "hopper_available": "api",
    "hopper_unavailable_reason": "api",
    "scaled_dot_product_attention": "sdpa",
    "patch_sdpa": "sdpa",
    "register_diffusers_backend": "integrations.diffusers",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'attnclimb' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
