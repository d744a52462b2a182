"""A kernel launch whose parameters are packed once: ``cuLaunchKernel`` (``cuda.bindings.driver``) with a
``kernelParams`` array built at plan time, of which only O's and the LSE's addresses (and, for a rung with
``Rung.sched_slot``, its scheduler slot) change per call.

``cuda.core.launch`` packs every argument afresh on each call (its ``ParamHolder``), wraps the stream and
builds the driver's launch configuration before its ``cuLaunchKernelEx``. A planned launch of
:mod:`attnclimb.runtime.launch` has the same arguments every time but two pointers, so it packs them
once, with cuda.core's own packer (the very array ``cuda.core.launch`` would hand the driver), finds the
two pointer slots by placeholder values, and per call writes the two addresses into them and calls
``cuLaunchKernel`` on torch's raw stream handle. The driver copies the parameters when the launch is
enqueued (or recorded into a CUDA graph), so the slots can be rewritten by the next call; a lock per plan
keeps two threads from interleaving a write and a launch.

CUDA Driver API, ``cuLaunchKernel``: ``f`` a ``CUfunction`` or a ``CUkernel`` (launched in the current
context; cuda.core passes its kernel handle the same way), ``kernelParams`` an array of N pointers, each to
the value of one parameter, whose sizes and offsets the driver takes from the kernel image. The Python
binding takes ``kernelParams`` as the address of that array (an ``int``) and returns ``(CUresult,)``.

``ATTNCLIMB_LAUNCH=cuda.core`` in the environment (read at import) keeps every launch on
``cuda.core.launch``, as does anything this module cannot set up (then :func:`prepack` returns ``None``).
"""

from __future__ import annotations

import ctypes
import os
import threading

# Placeholders packed where O's and the LSE's addresses go, then looked for in the packed slots: a packer
# that did not store them as 8-byte values where kernelParams points is not used.
O_MARK = 0x0A77_C11B_0000_0010
LSE_MARK = 0x0A77_C11B_0000_0020
SLOT_MARK = 0x0A77_0030  # a 4-byte int parameter (the scheduler slot)
_PTR = ctypes.sizeof(ctypes.c_void_p)

ENABLED = os.environ.get("ATTNCLIMB_LAUNCH", "") != "cuda.core"


def _driver_launch(*args):
    """``cuda.bindings.driver.cuLaunchKernel``, imported on first use (and bound here from then on)."""
    global _driver_launch
    from cuda.bindings.driver import cuLaunchKernel

    _driver_launch = cuLaunchKernel
    return cuLaunchKernel(*args)


_STREAMS: dict = {}  # raw stream handle -> cuda.bindings.driver.CUstream (the binding's own stream type)
_streams_lock = threading.Lock()


def _stream(handle: int):
    """The ``CUstream`` of a raw ``cudaStream_t`` address, cached (a few per process: torch's streams). It
    only holds the address; a recycled address is the same stream to the driver (as in
    ``LoadedRung.stream_for_handle``)."""
    from cuda.bindings.driver import CUstream

    s = CUstream(handle)
    with _streams_lock:
        if len(_STREAMS) >= 16:
            _STREAMS.pop(next(iter(_STREAMS)))
        _STREAMS[handle] = s
    return s


def disable(exc: BaseException) -> None:
    """Stop packing new plans (their launches go through ``cuda.core.launch``), with one warning: the
    binding refused an argument of a packed launch (an installed cuda.bindings this was not written for)."""
    global ENABLED
    if ENABLED:
        ENABLED = False
        import warnings

        warnings.warn(
            f"attnclimb: cuda.bindings.driver.cuLaunchKernel refused a pre-packed launch ({exc!r}); "
            "launching through cuda.core.launch from now on",
            RuntimeWarning,
            stacklevel=3,
        )


class Packed:
    """One kernel's launch with its parameters packed: grid, block, dynamic shared memory, the function
    handle and the ``kernelParams`` array (``params``, an address), with cells for O's and the LSE's
    addresses (``lse_cell`` is ``None`` for a kernel without an LSE parameter) and for its scheduler slot
    (``slot_cell``, ``None`` for a kernel without one)."""

    __slots__ = (
        "_holder",
        "block",
        "func",
        "grid",
        "lock",
        "lse_cell",
        "o_cell",
        "params",
        "slot_cell",
        "smem",
        "success",
    )

    def launch(self, stream_handle: int, o_ptr: int, lse_ptr: int, slot: int = 0) -> None:
        """Launch on the raw stream ``stream_handle`` with O at ``o_ptr``, the LSE at ``lse_ptr`` and, for a
        kernel with a scheduler slot parameter, ``slot`` in it.

        ``RuntimeError`` when the driver reports an error; the binding's own ``TypeError`` (or similar) when
        it refuses an argument, in which case nothing was launched."""
        stream = _STREAMS.get(stream_handle)
        if stream is None:
            stream = _stream(stream_handle)
        gx, gy, gz = self.grid
        bx, by, bz = self.block
        with self.lock:
            self.o_cell.value = o_ptr
            if self.lse_cell is not None:
                self.lse_cell.value = lse_ptr
            if self.slot_cell is not None:
                self.slot_cell.value = slot
            res = _driver_launch(self.func, gx, gy, gz, bx, by, bz, self.smem, stream, self.params, 0)
        err = res[0] if type(res) is tuple else res
        if err != self.success:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {err!r}")

    def values(self, ctypes_types: list) -> list:
        """The packed parameters read back, one ``ctypes`` type per parameter (for tests)."""
        slot = [ctypes.c_void_p.from_address(self.params + i * _PTR).value for i in range(len(ctypes_types))]
        return [t.from_address(a).value for t, a in zip(ctypes_types, slot)]


def prepack(
    kernel,
    grid: tuple,
    block: tuple,
    smem: int,
    args: tuple,
    o_index: int,
    lse_index: int | None,
    slot_index: int | None = None,
):
    """A :class:`Packed` launch of ``kernel`` (a ``cuda.core`` ``Kernel``) with ``args`` as
    ``cuda.core.launch`` takes them, the arguments at ``o_index`` and ``lse_index`` (``None``: no LSE
    parameter) being O's and the LSE's addresses, and the one at ``slot_index`` (``None``: none) a 4-byte
    int, the scheduler slot, which each launch sets; ``None`` when disabled
    (``ATTNCLIMB_LAUNCH=cuda.core``) or when cuda.core's packer or cuda.bindings is not as expected (the
    caller then launches through ``cuda.core.launch``)."""
    if not ENABLED:
        return None
    try:
        from cuda.bindings import driver
        from cuda.core._kernel_arg_handler import ParamHolder

        func = driver.CUfunction(int(kernel.handle))
        success = driver.CUresult.CUDA_SUCCESS
        args = list(args)
        args[o_index] = O_MARK
        if lse_index is not None:
            args[lse_index] = LSE_MARK
        if slot_index is not None:
            import numpy as np

            args[slot_index] = np.int32(SLOT_MARK)
        holder = ParamHolder(tuple(args))
        params = int(holder.ptr)
        if not params:
            return None

        def cell(i, mark, ctype=ctypes.c_uint64):
            c = ctype.from_address(ctypes.c_void_p.from_address(params + i * _PTR).value)
            return c if c.value == mark else None

        o_cell = cell(o_index, O_MARK)
        lse_cell = None if lse_index is None else cell(lse_index, LSE_MARK)
        slot_cell = None if slot_index is None else cell(slot_index, SLOT_MARK, ctypes.c_int32)
        if o_cell is None or (lse_index is not None and lse_cell is None):
            return None
        if slot_index is not None and slot_cell is None:
            return None
    except Exception:  # an older or newer cuda.core/cuda.bindings than this was written for
        return None
    p = Packed()
    p._holder = holder  # owns the packed values (and keeps the tensor maps it packed alive)
    p.func, p.params, p.o_cell, p.lse_cell, p.success = func, params, o_cell, lse_cell, success
    p.slot_cell = slot_cell
    p.grid = (*grid, 1, 1, 1)[:3]
    p.block = (*block, 1, 1, 1)[:3]
    p.smem = int(smem)
    p.lock = threading.Lock()
    return p
