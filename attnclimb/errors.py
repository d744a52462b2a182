"""The warning and error types of the drop-in API (no torch import: ``import attnclimb`` stays light)."""

from __future__ import annotations


class AttnclimbFallbackWarning(UserWarning):
    """:func:`attnclimb.scaled_dot_product_attention` handed a call to
    ``torch.nn.functional.scaled_dot_product_attention`` because the kernels cannot take it.

    Emitted once per distinct reason per process (the message names the reason); filter it like any
    warning, e.g. ``warnings.simplefilter("error", attnclimb.AttnclimbFallbackWarning)`` to make every
    fallback an error, or pass ``strict=True``.
    """


class KernelUnsupportedError(RuntimeError):
    """``strict=True`` and the kernels cannot take the call (a mask, dropout, causal, an unsupported dtype,
    head_dim, device, ...). ``reason`` is the :class:`attnclimb.support.Unsupported` record that says why.

    A ``RuntimeError``, like torch's own "No available kernel" error when ``sdpa_kernel`` pins a backend
    that cannot take the input.
    """

    def __init__(self, reason):
        super().__init__(f"attnclimb cannot run this call on its kernels: {reason.message}")
        self.reason = reason
