"""Load compiled rungs onto the GPU and launch them on torch's current stream, through ``cuda.core``.

``cuda.core`` loads the cubin (``ObjectCode.from_cubin``) and launches (``launch``); two things it lacks
are taken from ``cuda.bindings``: raising a kernel's dynamic shared-memory limit above 48 KB
(``cuKernelSetAttribute``), since ``Kernel.attributes`` is read-only in cuda.core 1.2.
TMA tensor maps (rungs 5+) are built with ``StridedMemoryView.as_tensor_map`` (CUDA driver API
``cuTensorMapEncodeTiled`` underneath; CUDA C++ Programming Guide, "Tensor Memory Access").
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np

from ..rungs import Rung
from . import packed as _packed
from .compiler import compile_rung

_lock = threading.Lock()
PANEL_COLS = 64  # a TMA box is one 64-column (128-byte) panel wide: the 128-byte swizzle's row


def _check(result, what: str):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed with CUDA error {err}")
    return result[1:] if isinstance(result, tuple) and len(result) > 1 else None


class LoadedRung:
    """A rung's kernels loaded on one device, ready to launch."""

    def __init__(self, rung: Rung, device_index: int):
        from cuda.core import Device, ObjectCode

        self.rung = rung
        self.device_index = device_index
        self.block = (rung.threads,)  # launch constants, computed once (smem_bytes is a derived property)
        self.smem_bytes = rung.smem_bytes
        self.device = Device(device_index)
        self.device.set_current()
        arch = f"sm_{self.device.compute_capability.major}{self.device.compute_capability.minor}"
        # Hopper's wgmma/setmaxnreg live in the arch-specific target sm_90a (PTX ISA, "Target ISA notes").
        arch = "sm_90a" if arch == "sm_90" else arch
        self.compiled = compile_rung(rung, arch=arch)
        self.module = ObjectCode.from_cubin(self.compiled.cubin)
        self.kernels = {name: self.module.get_kernel(name) for name in rung.kernel_names}
        if rung.smem_bytes > 48 * 1024:
            from cuda.bindings import driver

            attrs = driver.CUfunction_attribute
            for k in self.kernels.values():
                _check(
                    driver.cuKernelSetAttribute(
                        attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, rung.smem_bytes, k.handle, device_index
                    ),
                    "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                )
                # Prefer the largest shared-memory carveout so that rungs sized for 2 CTAs/SM get them.
                _check(
                    driver.cuKernelSetAttribute(
                        attrs.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100, k.handle, device_index
                    ),
                    "cuKernelSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)",
                )
        self._streams = {}
        self.num_sms = self.device.properties.multiprocessor_count
        self._resident = None  # CTAs per SM of attn_fwd, for persistent grids (queried on first use)

    def persistent_grid(self, num_tiles: int) -> int:
        """CTAs of a persistent launch: every resident CTA slot of the GPU, but no more than ``num_tiles``."""
        if self._resident is None:
            self._resident = max(1, self.ctas_per_sm())
        return min(num_tiles, self.num_sms * self._resident)

    def ctas_per_sm(self, name: str = "attn_fwd") -> int:
        """Resident CTAs per SM for ``name`` at this rung's block size and dynamic shared memory."""
        occ = self.kernels[name].occupancy
        return occ.max_active_blocks_per_multiprocessor(self.rung.threads, self.rung.smem_bytes)

    def stream(self, torch_stream):
        """The cuda.core wrapper of a torch stream: a ``torch.cuda.Stream`` or a device-generic
        ``torch.Stream`` (what ``torch.cuda.current_stream()`` can return under ``torch.compile``)."""
        return self.stream_for_handle(raw_stream_handle(torch_stream))

    def stream_for_handle(self, handle: int):
        """The cuda.core ``Stream`` for the raw ``cudaStream_t`` address ``handle``, cached by address.

        The wrapper borrows the stream (cuda.core neither owns nor destroys a stream it gets through the
        ``__cuda_stream__`` protocol); a recycled address on this device is the same stream to the driver,
        so a cached wrapper stays valid. Handle 0 is the legacy default stream, torch's default.
        """
        s = self._streams.get(handle)
        if s is None:
            s = self.device.create_stream(_StreamRef(handle))
            with _lock:
                if len(self._streams) >= 16:  # keep the cache small
                    self._streams.pop(next(iter(self._streams)))
                self._streams[handle] = s
        return s

    def launch(self, name: str, grid, block, smem: int, stream, *args):
        """Launch kernel ``name``: ``grid``/``block`` are tuples of ints, ``smem`` dynamic shared memory in
        bytes, ``args`` the kernel's parameters (ints as ``numpy.int32``, floats as ``numpy.float32``,
        pointers as Python ints, tensor maps as ``TensorMapDescriptor``).

        Host-only work plus one ``cuLaunchKernelEx`` on ``stream``: no synchronisation and no device
        allocation, so a launch can be captured into a CUDA graph."""
        _cuda_launch(stream, _launch_config(grid, block, smem), self.kernels[name], *args)


def _cuda_launch(*args):
    """``cuda.core.launch``, imported on first use (and bound here from then on)."""
    global _cuda_launch
    from cuda.core import launch

    _cuda_launch = launch
    return launch(*args)


class _StreamRef:
    """A raw ``cudaStream_t`` address behind the ``__cuda_stream__`` protocol that cuda.core accepts."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


_CONFIGS: dict = {}


def _launch_config(grid, block, smem: int):
    """A cached ``cuda.core.LaunchConfig`` (building one validates its fields: a few microseconds)."""
    key = (grid, block, smem)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        from cuda.core import LaunchConfig

        cfg = LaunchConfig(grid=grid, block=block, shmem_size=smem)
        with _lock:
            if len(_CONFIGS) >= 256:
                _CONFIGS.pop(next(iter(_CONFIGS)))
            _CONFIGS[key] = cfg
    return cfg


def raw_stream_handle(torch_stream) -> int:
    """The ``cudaStream_t`` address of a torch stream object.

    ``torch.cuda.Stream`` has it as ``cuda_stream``; a device-generic ``torch.Stream`` (returned by
    ``torch.cuda.current_stream()`` inside ``torch.compile``) has only ``stream_id``, ``device_index`` and
    ``device_type``, from which ``torch.cuda.Stream`` rebuilds the same stream.
    """
    handle = getattr(torch_stream, "cuda_stream", None)
    if handle is None:
        import torch

        handle = torch.cuda.Stream(
            stream_id=torch_stream.stream_id,
            device_index=torch_stream.device_index,
            device_type=torch_stream.device_type,
        ).cuda_stream
    return int(handle)


def current_stream_handle(device_index: int) -> int:
    """The raw handle of torch's current CUDA stream on ``device_index`` (the capture stream while a CUDA
    graph is being captured). ``torch._C._cuda_getCurrentRawStream`` is what torch's own compiled code
    calls; it skips building a Python stream object. Falls back to the public API if it is missing."""
    global _raw_stream_of
    if _raw_stream_of is None:
        import torch

        _raw_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda index: torch.cuda.current_stream(index).cuda_stream
        )
    return _raw_stream_of(device_index)


_raw_stream_of = None
_LOADED: dict = {}
_thread = threading.local()


def _ensure_context(lr: LoadedRung) -> None:
    """Make the device's primary context current in this thread, once per thread and device.

    The module is loaded once per process, but a CUDA context is current per thread: a thread whose first
    CUDA work is our launch (torch binds the context lazily, on its own first kernel or allocation) would
    otherwise launch with none. torch's runtime calls use the same primary context, so this changes
    nothing for them; the device guard of ``attnclimb.ops.forward`` keeps the right device selected.
    """
    done = getattr(_thread, "devices", None)
    if done is None:
        done = _thread.devices = set()
    if lr.device_index not in done:
        lr.device.set_current()
        done.add(lr.device_index)


def loaded(rung: Rung, device_index: int) -> LoadedRung:
    """Compile (cached on disk), load and memoise ``rung`` for device ``device_index``.

    A hit is one dictionary lookup; the first call per (rung, device) compiles and loads under a lock."""
    lr = _LOADED.get((rung, device_index))
    if lr is None:
        with _lock:
            lr = _LOADED.get((rung, device_index))
            if lr is None:
                lr = _LOADED[(rung, device_index)] = LoadedRung(rung, device_index)
    return lr


_TMAP_CACHE: dict = {}
_TMAP_CACHE_SIZE = 64


def cached_tensor_map(t3d, box_rows: int, l2_promotion: int = 0):
    """:func:`tensor_map`, memoised by (address, shape including head_dim, dtype, box, device).

    A tensor map encodes only those (plus the fixed strides and swizzle), so a hit is exactly the
    map a fresh encode would build, even if the memory was freed and reallocated in between. Saves the
    encode on the launch path, which matters for short sequences where a kernel runs for ~50 µs.
    """
    bh, rows, _ = t3d.shape
    return _tensor_map_of(t3d, bh, rows, box_rows, t3d.device.index, l2_promotion)


def _tensor_map_of(t, bh: int, rows: int, box_rows: int, device_index: int, l2_promotion: int = 0):
    """The cached map over contiguous ``t`` seen as ``(bh, rows, head_dim)``; the view is built on a miss only.

    The key holds head_dim (the map's row pitch and width): a head_dim 64 tensor that reuses the memory of
    a freed head_dim 128 one of the same ``(bh, rows)`` must not get the old map, whose rows are twice as
    far apart (every head but the first would be read from the wrong place). It holds the dtype too: an fp16
    tensor in the memory of a freed bf16 one must not get a map that declares its elements bf16; and the L2
    promotion (``Rung.l2_promotion``), so that two rungs that differ only in it never share a map."""
    key = (t.data_ptr(), bh, rows, t.shape[-1], t.dtype, box_rows, device_index, l2_promotion)
    tm = _TMAP_CACHE.get(key)
    if tm is None:
        tm = _remember(key, tensor_map(t.view(bh, rows, t.shape[-1]), box_rows, l2_promotion))
    return tm


def _remember(key, tm):
    """Store ``tm`` in the tensor-map cache under ``key``, dropping the oldest entry when it is full."""
    with _lock:
        if len(_TMAP_CACHE) >= _TMAP_CACHE_SIZE:
            _TMAP_CACHE.pop(next(iter(_TMAP_CACHE)))  # oldest first (dicts keep insertion order)
        _TMAP_CACHE[key] = tm
    return tm


def tensor_map(t3d, box_rows: int, l2_promotion: int = 0):
    """A TMA tensor map over a ``(batch*heads, seqlen, 128)`` bf16 or fp16 CUDA tensor.

    Dims innermost-first ``(128, seqlen, batch*heads)``, box ``(64, box_rows, 1)``, 128-byte swizzle,
    out-of-bounds elements read as zero (PTX ISA, "Tensor Copy" / "Tensor-map": ``cp.async.bulk.tensor``).
    ``t3d`` must be contiguous with a 16-byte aligned base (the API guarantees both). ``l2_promotion``: bytes
    per L2 fill on a miss (``Rung.l2_promotion``; 0 = none). Returns a ``cuda.core.TensorMapDescriptor`` to
    pass to :meth:`LoadedRung.launch` by value.
    """
    # cuda.core takes the box outermost-first: (bh, rows, cols)
    box = (1, box_rows, PANEL_COLS)
    return _encode_map(t3d.data_ptr(), tuple(t3d.shape), t3d.stride(), box, _is_fp16(t3d), l2_promotion)


def _is_fp16(t) -> bool:
    """Whether ``t`` holds fp16 (``torch.float16``) elements; the kernels take bf16 otherwise."""
    return str(t.dtype) == "torch.float16"


def _encode_map(data_ptr: int, shape: tuple, strides: tuple, box: tuple, fp16: bool = False, l2_promotion: int = 0):
    """A bf16 (``fp16``: fp16) tensor map (128-byte swizzle, zero OOB fill, L2 promotion ``l2_promotion``
    bytes, 0 = none) over memory at ``data_ptr`` of ``shape`` and element ``strides`` (outermost first, as
    torch gives them), box ``box`` (outermost first)."""
    if l2_promotion not in _L2_PROMOTION_NAMES:
        raise ValueError(f"l2_promotion must be one of {sorted(_L2_PROMOTION_NAMES)} (bytes), got {l2_promotion!r}")
    from cuda.core import TensorMapDescriptorOptions
    from cuda.core._tensor_map import TensorMapDataType, TensorMapL2Promotion, TensorMapOOBFill, TensorMapSwizzle
    from cuda.core.utils import StridedMemoryView

    # The descriptor keeps a reference to the object it was built from. Built on the tensor itself, every
    # cached map would keep its tensor alive (up to _TMAP_CACHE_SIZE of them: leaked GPU memory, and under
    # CUDA-graph capture "tensors in the cudagraph pool not tracked as outputs"). So it is built on a
    # non-owning __cuda_array_interface__ of the same memory; the map itself holds only the address.
    view = StridedMemoryView.from_cuda_array_interface(_UnownedBf16(data_ptr, shape, strides), stream_ptr=-1)
    opts = TensorMapDescriptorOptions(
        box_dim=box,
        data_type=TensorMapDataType.FLOAT16 if fp16 else TensorMapDataType.BFLOAT16,
        swizzle=TensorMapSwizzle.SWIZZLE_128B,
        l2_promotion=getattr(TensorMapL2Promotion, _L2_PROMOTION_NAMES[l2_promotion]),
        oob_fill=TensorMapOOBFill.NONE,
    )
    return view.as_tensor_map(options=opts)


_L2_PROMOTION_NAMES = {0: "NONE", 64: "L2_64B", 128: "L2_128B", 256: "L2_256B"}  # rungs.L2_PROMOTIONS


class _UnownedBf16:
    """The memory of a bf16 (or fp16) CUDA tensor as a CUDA Array Interface (v3) that does not own it.

    CAI has no bf16 type string, so it is described as 2-byte unsigned ints (``<u2``) and the tensor map
    gets the element type explicitly (``TensorMapDataType.BFLOAT16`` or ``FLOAT16``)."""

    def __init__(self, data_ptr: int, shape: tuple, strides: tuple):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": "<u2",
            "data": (data_ptr, False),
            "strides": tuple(2 * s for s in strides),
            "version": 3,
            "stream": None,
        }


def feature_variant(
    rung: Rung,
    causal: bool,
    gqa: bool,
    lse: bool,
    strided: bool = False,
    head_dim: int | None = None,
    seqlen_k: int | None = None,
    fp16: bool = False,
) -> Rung:
    """The compile-time variant of ``rung`` with the given features (``Rung.features``; issues 8 and 9) and
    ``head_dim`` (``rung.head_dim`` or a key of ``Rung.head_dims``, whose tile sizes the variant takes; the fp16
    variant takes ``Rung.fp16_head_dims``' where it has an entry),
    memoised so that each variant is compiled and loaded once. All off returns ``rung`` itself. A causal
    call of ``rung.head_dim`` with ``seqlen_k`` up to ``Rung.causal_short``'s bound takes that entry's tile
    sizes; a non-causal one with ``seqlen_k`` from ``Rung.long_kv``'s bound up takes that entry's. ``fp16``:
    fp16 Q, K, V, O (the ``"fp16"`` feature, macro ``FP16``; else bf16). ``ValueError`` when the rung lacks a
    requested feature or head_dim."""
    head_dim = rung.head_dim if head_dim is None else head_dim
    short = bool(causal and head_dim == rung.head_dim and rung.takes_causal_short(seqlen_k))
    long = bool(not causal and head_dim == rung.head_dim and rung.takes_long_kv(seqlen_k))
    return _variant(rung, bool(causal), bool(gqa), bool(lse), bool(strided), head_dim, short, bool(fp16), long)


@functools.cache
def _variant(
    rung: Rung,
    causal: bool,
    gqa: bool,
    lse: bool,
    strided: bool,
    head_dim: int,
    short: bool,
    fp16: bool = False,
    long: bool = False,
) -> Rung:
    want = {"causal": causal, "gqa": gqa, "lse": lse, "strided": strided, "fp16": fp16}
    missing = [f for f, on in want.items() if on and f not in rung.features]
    if missing:
        raise ValueError(f"{rung.key} does not support {', '.join(missing)} (supported: {rung.features or 'none'})")
    if head_dim != rung.head_dim and head_dim not in rung.head_dims:
        dims = sorted({rung.head_dim, *rung.head_dims})
        raise ValueError(f"{rung.key} does not support head_dim {head_dim} (supported: {dims})")
    if not any(want.values()) and head_dim == rung.head_dim and not long:
        return rung
    if head_dim != rung.head_dim:
        tiles = rung.fp16_head_dims.get(head_dim, rung.head_dims[head_dim]) if fp16 else rung.head_dims[head_dim]
        rung = dataclasses.replace(rung, head_dim=head_dim, **tiles)
    elif short:
        rung = dataclasses.replace(rung, **rung.causal_short[1])
    elif long:
        rung = dataclasses.replace(rung, **rung.long_kv[1])
    defines = {
        **rung.extra_defines,
        "CAUSAL": int(causal),
        "GQA": int(gqa),
        "WRITE_LSE": int(lse),
        "STRIDED": int(strided),
    }
    if fp16:  # FP16 is left out of the bf16 variants' macros (their compile-cache keys stay as they were)
        defines["FP16"] = 1
    return dataclasses.replace(rung, extra_defines=defines)


def _check_strided(q, k, v, o) -> None:
    """ValueError unless the strided variant can read Q, K, V and write O where they lie."""
    from .layout import tma_layout_reason

    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        why = tma_layout_reason(tuple(t.shape), t.stride(), t.data_ptr())
        if why is not None:
            raise ValueError(f"{name} cannot be read in place by TMA ({why}); pass a contiguous copy")
    if any(s % 2 for s in o.stride()[:3]) or o.data_ptr() % 4:
        raise ValueError(f"o's strides {o.stride()} must be even and its base 4-byte aligned (bf16x2 stores)")


def _tensor_map_4d(t, box_rows: int, device_index: int, l2_promotion: int = 0):
    """A 4-D TMA map over a strided ``(B, H, S, 128)`` bf16 or fp16 tensor, as it lies (box ``(64, box_rows, 1,
    1)``, 128-byte swizzle, zero OOB fill), memoised in the 3-D maps' cache by (address, shape, strides, dtype,
    box, device, L2 promotion). A dimension of size 1 is never stepped over; it gets the packed stride (torch may
    report any)."""
    key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, box_rows, device_index, l2_promotion)  # not a 3-D key
    tm = _TMAP_CACHE.get(key)
    if tm is None:
        strides = list(t.stride())
        packed = t.shape[-1]
        for i in range(len(strides) - 2, -1, -1):
            if t.shape[i] == 1:
                strides[i] = packed
            packed *= t.shape[i]
        box = (1, 1, box_rows, PANEL_COLS)
        tm = _remember(key, _encode_map(t.data_ptr(), tuple(t.shape), tuple(strides), box, _is_fp16(t), l2_promotion))
    return tm


def run_rung(rung: Rung, q, k, v, o, scale: float, *, causal: bool = False, lse=None):
    """Launch ``rung`` on torch's current stream: ``o = softmax(scale * q k^T) v``.

    ``causal`` applies torch's ``is_causal=True`` mask (top-left aligned); ``k``/``v`` may have fewer heads
    than ``q`` (a divisor: grouped-query attention, query head h reads K/V head ``h // (H // H_kv)``);
    ``lse``, an fp32 ``(B, H, Sq)`` contiguous tensor, receives the natural-log log-sum-exp of each row's
    scaled scores. These need a rung whose ``features`` include them (the top rung), else ``ValueError``.

    ``q, o``: ``(B, H, Sq, 128)``; ``k, v``: ``(B, H, Sk, 128)``; bf16 (or fp16, all four, on a rung with the
    ``"fp16"`` feature), contiguous, 16-byte aligned, on one
    CUDA device, every size >= 1, each tensor under 2^31 elements (:func:`attnclimb.ops.forward` splits
    larger calls with :func:`attnclimb.runtime.layout.plan_chunks`). Raises ``CompileError`` on a first-use
    compile failure and ``RuntimeError`` (or cuda.core's ``CUDAError``) when a CUDA call fails.

    Every grid is 1-D: batch·heads (times the query tiles) goes on ``gridDim.x``, which allows 2^31-1
    CTAs, so no batch·heads limit of ``gridDim.y/z`` (65535) applies. No synchronisation and, on the fused
    rungs, no device allocation: a call can be captured into a CUDA graph (after a first call has compiled
    and loaded the rung).

    Host time: everything a fused rung's launch needs but O's and the LSE's addresses and the stream (the
    variant, the checks, the tensor maps, grid and arguments) is a :class:`_Plan`, memoised by
    :func:`_plan_key` (rung, device, dtype, shapes, strides and addresses of Q, K, V, O's shape, strides and
    alignment, scale, causal, with or without LSE). A repeated call is that key, one dictionary lookup and
    the launch; a call that differs in any of them plans afresh (and raises as a fresh plan would).

    Returns the :class:`_Plan` it launched (``None`` for rung 0, which is not planned); the drop-in layer
    remembers it for a repeated call (``attnclimb.ops.fast_call``).
    """
    if rung.abi == "unfused":  # rung 0: a score workspace and three launches per call; not planned
        _run_unfused(rung, q, k, v, o, scale, causal, lse)
        return None
    dev = q.device.index
    key = _plan_key(rung, dev, q, k, v, o, scale, causal, lse)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _remember_plan(key, _plan(rung, q, k, v, o, scale, bool(causal), lse))
    launch_plan(plan, dev, o.data_ptr(), 0 if lse is None else lse.data_ptr())
    return plan


def launch_plan(plan: _Plan, dev: int, o_ptr: int, lse_ptr: int) -> None:
    """Launch ``plan`` (on device ``dev``) with O and the LSE at ``o_ptr`` and ``lse_ptr`` (0 for none) on
    torch's current stream, making the device's context current in this thread first (once per thread)."""
    lr = plan.lr
    _ensure_context(lr)
    handle = current_stream_handle(dev)
    slot = sched_slot(dev, handle) if plan.sched else 0
    packed = plan.packed  # read once: another thread may switch it off in between
    if packed is not None:  # cuLaunchKernel with the arguments packed at plan time (runtime/packed.py)
        try:
            packed.launch(handle, o_ptr, lse_ptr, slot)
            return
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # refused before launching
            _packed.disable(exc)
            plan.packed = None
    plan.launch(lr.stream_for_handle(handle), o_ptr, lse_ptr, slot)


SCHED_SLOTS = 1 << 16  # slots of a Rung.sched_slot kernel's counters (DYN_SCHED_SLOTS in make_variants.py's header)
STREAM_SLOTS = 1 << 14  # slots [0, STREAM_SLOTS) go to streams; the rest, one each, to launches captured into graphs
_stream_slots: dict = {}  # (device, raw stream handle) -> slot
_captured_next: dict = {}  # device -> the next slot for a captured launch


def _is_capturing(handle: int) -> bool:
    """Whether the raw stream ``handle`` is capturing into a CUDA graph (CUDA Driver API ``cuStreamIsCapturing``,
    asked of that stream itself, whatever device is current). An error (the legacy default stream while another
    stream captures in global mode, where a launch fails anyway) counts as not capturing."""
    from cuda.bindings import driver

    err, status = driver.cuStreamIsCapturing(driver.CUstream(handle))
    return (
        err == driver.CUresult.CUDA_SUCCESS and status == driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
    )


def sched_slot(dev: int, handle: int, capturing: bool | None = None) -> int:
    """The scheduler slot of a causal ``Rung.sched_slot`` launch on device ``dev`` and raw stream ``handle``.

    The kernel's counters of slot s are a module global that its launch's last CTA resets, so launches one after
    another on one stream can share a slot but launches that may overlap cannot: each stream gets its own slot
    for good (``STREAM_SLOTS`` of them per device), and a launch captured into a CUDA graph (``capturing``; asked
    of the stream when ``None``) a slot of its own for good, since the graph may be replayed on any stream.
    ``RuntimeError`` when a device's ``STREAM_SLOTS`` streams or ``SCHED_SLOTS - STREAM_SLOTS`` captured launches
    are used up (a slot is never handed on: its stream or graph may still be running)."""
    if capturing is None:
        capturing = _is_capturing(handle)
    if capturing:
        with _lock:
            slot = _captured_next.get(dev, STREAM_SLOTS)
            if slot >= SCHED_SLOTS:
                raise RuntimeError(f"more than {SCHED_SLOTS - STREAM_SLOTS} scheduler-slot launches captured")
            _captured_next[dev] = slot + 1
        return slot
    slot = _stream_slots.get((dev, handle))
    if slot is None:
        with _lock:
            slot = _stream_slots.get((dev, handle))
            if slot is None:
                slot = sum(1 for key in _stream_slots if key[0] == dev)
                if slot >= STREAM_SLOTS:
                    raise RuntimeError(
                        f"more than {STREAM_SLOTS} streams launched a scheduler-slot rung on device {dev}"
                    )
                _stream_slots[(dev, handle)] = slot
    return slot


def _plan_key(rung: Rung, dev, q, k, v, o, scale, causal, lse) -> tuple:
    """What a :class:`_Plan` depends on: the rung, device and dtype (bf16 or fp16: the variant and the tensor
    maps' element type); shapes, strides and addresses of Q, K and V (their tensor
    maps encode all three); O's shape and strides (the strided variant, O's stride arguments) and its
    address modulo 16 (the strided variant's alignment check); scale, causal, LSE or not. Not O's or the
    LSE's address (passed per launch) nor the stream (looked up per launch)."""
    return (
        rung,
        dev,
        q.dtype,
        q.shape,
        q.stride(),
        q.data_ptr(),
        k.shape,
        k.stride(),
        k.data_ptr(),
        v.shape,
        v.stride(),
        v.data_ptr(),
        o.shape,
        o.stride(),
        o.data_ptr() % 16,
        scale,
        bool(causal),
        lse is None,
    )


_PLANS: dict = {}
_PLANS_SIZE = 256  # a model's attention calls with distinct buffers (a few KB each: three tensor maps)


def _remember_plan(key, plan):
    """Store ``plan`` under ``key``, dropping the oldest plan when the cache is full."""
    with _lock:
        if len(_PLANS) >= _PLANS_SIZE:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = plan
    return plan


class _Plan:
    """One fused rung's launch with all but O's and the LSE's addresses and the stream fixed: the loaded
    (variant of the) rung, its ``attn_fwd`` kernel, grid (a 1-tuple) and launch configuration, and the kernel
    arguments before O's address (``head``), between it and the LSE's (``middle``) and after it (``tail``;
    ``None`` for a kernel without the top rung's extra arguments, which takes no LSE). ``packed``: the same
    launch with the arguments packed once for ``cuLaunchKernel`` (:func:`attnclimb.runtime.packed.prepack`), or
    ``None`` where it cannot be set up (:meth:`launch` through ``cuda.core.launch`` then). ``sched``: a causal
    build whose last argument is its scheduler slot (``Rung.sched_slot``; ``tail`` ends with a placeholder for
    it), set per launch; a non-causal build of such a rung never reads it and keeps the placeholder 0."""

    __slots__ = ("config", "grid", "head", "kernel", "lr", "middle", "packed", "sched", "tail")

    def __init__(
        self, lr: LoadedRung, grid: tuple, head: tuple, middle: tuple, tail: tuple | None, sched: bool = False
    ):
        self.lr, self.grid, self.head, self.middle, self.tail = lr, grid, head, middle, tail
        self.sched = bool(sched and tail is not None)
        self.config = _launch_config(grid, lr.block, lr.smem_bytes)
        self.kernel = lr.kernels["attn_fwd"]
        o, lse = len(head), (None if tail is None else len(head) + 1 + len(middle))
        args = (*head, 0, *middle) if tail is None else (*head, 0, *middle, 0, *tail)
        slot = len(args) - 1 if self.sched else None
        self.packed = _packed.prepack(self.kernel, grid, lr.block, lr.smem_bytes, args, o, lse, slot)

    def launch(self, stream, o_ptr: int, lse_ptr: int, slot: int = 0) -> None:
        """What :meth:`LoadedRung.launch` does, with O's and the LSE's addresses (and the scheduler slot) in
        their places."""
        if self.tail is None:
            _cuda_launch(stream, self.config, self.kernel, *self.head, o_ptr, *self.middle)
        elif self.sched:
            tail = (*self.tail[:-1], np.int32(slot))
            _cuda_launch(stream, self.config, self.kernel, *self.head, o_ptr, *self.middle, lse_ptr, *tail)
        else:
            _cuda_launch(stream, self.config, self.kernel, *self.head, o_ptr, *self.middle, lse_ptr, *self.tail)


def launch_variant(
    rung: Rung, causal: bool, gqa: bool, lse: bool, strided: bool, head_dim: int, seqlen_k: int, fp16: bool = False
) -> Rung:
    """The build that :func:`run_rung` launches for a call with these properties: ``rung`` itself when none of
    them needs a compile-time variant, else :func:`feature_variant`'s (memoised: the same object each time, so
    the same loaded module). ``ValueError`` when ``rung`` lacks one of them."""
    if causal or gqa or lse or strided or head_dim != rung.head_dim or fp16 or rung.takes_long_kv(seqlen_k):
        return feature_variant(rung, causal, gqa, lse, strided, head_dim, seqlen_k, fp16)
    return rung


def _checked_variant(rung: Rung, q, k, v, o, causal: bool, lse) -> tuple:
    """``(variant, strided)``: the checks of :func:`run_rung` and the compile-time variant it launches."""
    if 0 in q.shape or 0 in k.shape:  # a kernel would wait forever for a K tile that is never loaded
        raise ValueError(f"run_rung needs every size >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    gqa = k.shape[1] != q.shape[1]
    head_dim = q.shape[-1]
    # Non-contiguous Q, K, V or O: read and written in place through 4-D tensor maps and O's strides, on a
    # rung with the "strided" feature; each must pass layout.tma_layout_reason (and O's strides be even).
    strided = not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and o.is_contiguous())
    if not (q.dtype == k.dtype == v.dtype == o.dtype):
        raise ValueError(f"q, k, v, o must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}, {o.dtype}")
    fp16 = _is_fp16(q)
    rung = launch_variant(rung, bool(causal), gqa, lse is not None, strided, head_dim, k.shape[2], fp16)
    if strided:
        _check_strided(q, k, v, o)
    return rung, strided


def _plan(rung: Rung, q, k, v, o, scale: float, causal: bool, lse) -> _Plan:
    """The :class:`_Plan` of a pointer or TMA rung's launch (:func:`run_rung`'s checks run here)."""
    rung, strided = _checked_variant(rung, q, k, v, o, causal, lse)
    dev = q.device.index
    lr = loaded(rung, dev)
    b, h, sq, _ = q.shape
    sk = k.shape[2]
    bh = b * h
    bh_kv = b * k.shape[1]
    i32, f32 = np.int32, np.float32
    m_blocks = rung.num_m_blocks(sq)
    grid = (m_blocks * bh,)
    sizes = (i32(sq), i32(sk), i32(m_blocks), f32(scale))
    if rung.abi == "pointer":
        return _Plan(lr, grid, (q.data_ptr(), k.data_ptr(), v.data_ptr()), sizes, None)
    if rung.abi == "tma":
        if strided:
            maps = tuple(
                _tensor_map_4d(t, box, dev, rung.l2_promotion)
                for t, box in ((q, rung.q_box_rows), (k, rung.kv_box_rows), (v, rung.kv_box_rows))
            )
        else:
            maps = (
                _tensor_map_of(q, bh, sq, rung.q_box_rows, dev, rung.l2_promotion),
                _tensor_map_of(k, bh_kv, sk, rung.kv_box_rows, dev, rung.l2_promotion),
                _tensor_map_of(v, bh_kv, sk, rung.kv_box_rows, dev, rung.l2_promotion),
            )
        if rung.persistent:  # CTAs loop over the work tiles (docs/kernel-abi.md)
            if not (causal and rung.causal_per_tile):  # else one CTA per tile (Rung.causal_per_tile)
                grid = (lr.persistent_grid(grid[0]),)
            sizes += (i32(m_blocks * bh),)
        if not rung.features:
            return _Plan(lr, grid, maps, sizes, None)
        # heads_q, kv_group, lse, O's strides (docs/kernel-abi.md, "Top-rung features")
        i64 = np.int64
        ob, oh, os_, _ = o.stride()
        tail = (i64(ob), i64(oh), i64(os_)) + ((i32(0),) if rung.sched_slot else ())  # the slot: set per launch
        sched = rung.sched_slot and causal  # a causal build of a Rung.sched_slot rung: its slot looked up per launch
        return _Plan(lr, grid, maps, (*sizes, i32(h), i32(h // k.shape[1])), tail, sched)
    raise ValueError(f"unknown ABI {rung.abi!r} for {rung.key}")


def _run_unfused(rung: Rung, q, k, v, o, scale: float, causal: bool, lse) -> None:
    """Rung 0: ``qk_scores`` into an fp32 workspace, ``row_softmax`` on it in place, ``pv_product``."""
    import torch

    rung, _ = _checked_variant(rung, q, k, v, o, causal, lse)
    dev = q.device.index
    lr = loaded(rung, dev)
    _ensure_context(lr)
    stream = lr.stream_for_handle(current_stream_handle(dev))
    b, h, sq, _ = q.shape
    sk = k.shape[2]
    bh = b * h
    i32, f32 = np.int32, np.float32
    s = torch.empty((bh, sq, sk), device=q.device, dtype=torch.float32)
    tiles_m, tiles_n = -(-sq // rung.block_m), -(-sk // rung.block_n)
    lr.launch(
        "qk_scores",
        (tiles_n * tiles_m * bh,),
        (rung.threads,),
        0,
        stream,
        q.data_ptr(),
        k.data_ptr(),
        s.data_ptr(),
        i32(sq),
        i32(sk),
        f32(scale),
    )
    lr.launch("row_softmax", (bh * sq,), (rung.threads,), 0, stream, s.data_ptr(), i32(sk), f32(scale))
    lr.launch(
        "pv_product",
        (tiles_m * bh,),
        (rung.threads,),
        0,
        stream,
        s.data_ptr(),
        v.data_ptr(),
        o.data_ptr(),
        i32(sq),
        i32(sk),
    )
