"""attnclimb: a ladder of attention forward kernels for NVIDIA Hopper, from an unfused baseline to a
warp-specialised wgmma/TMA pipeline. ``attention`` is the public entry point."""

from .api import attention, hopper_available, hopper_unavailable_reason
from .rungs import RUNGS

__all__ = ["RUNGS", "attention", "hopper_available", "hopper_unavailable_reason"]
__version__ = "0.1.0"
