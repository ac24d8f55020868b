"""Memory on either device: buffers kept from call to call (`Workspace`, and `DeviceWorkspace` on
the GPU), arrays copied to the GPU (`to_device`), and batches uploaded without making the host wait
for the GPU (`Staging`), and the array helpers that every module above kernels/ takes from here
(`is_device_array`, `to_host`, `copy_into`, ...). Imports nothing of nprnn above kernels/, so the
cells, the data, the optimizers and the GPU path can all use it.
"""
import numpy as np

from ..kernels.gpu_common import (cuda, device_array, device_copy, fill,  # noqa: F401
                                  pinned_array, simulator_enabled)

# The array helpers of every module above kernels/: these four, and the GPU allocators above
# (device_array, device_copy, pinned_array, fill), which the kernels' own scratch memory uses.


def is_device_array(a):
    """Whether `a` lives on the GPU (a numba device array, or the simulator's stand-in). Safe to
    call without numba-cuda installed."""
    return hasattr(a, "copy_to_host")


def memory_of(a):
    """"GPU" or "host": where `a` lives, for messages."""
    return "GPU" if is_device_array(a) else "host"


def to_host(tree):
    """NumPy copies of a device array, or of every array in a dict (host arrays are copied too)."""
    if isinstance(tree, dict):
        return {k: to_host(v) for k, v in tree.items()}
    return tree.copy_to_host() if is_device_array(tree) else np.array(tree)


def copy_into(live, a):
    """live[...] = a, for a host array `a` and `live` a numpy array or a device array of the same
    shape. A numba device array takes no `[...]` assignment on a GPU (TypeError; the simulator's
    stand-in accepts it), so device arrays are written with copy_to_device."""
    if is_device_array(live):
        live.copy_to_device(np.ascontiguousarray(a, dtype=live.dtype))
    else:
        live[...] = a


def grown_view(memory, shape, dtype, allocate):
    """(memory, a): `a` an array of `shape` and `dtype` over the first bytes of `memory`, a 1-d
    uint8 view of a buffer (or None). Where memory is None or too small, `a` is allocated
    afresh, allocate(shape, dtype=dtype), and its bytes are the memory returned, so memory only
    grows. A zero-size `a` is always fresh (there are no bytes to view) and leaves memory as it
    was. What `Workspace` and the slots of `Staging` hold their buffers with."""
    shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes == 0:
        return memory, allocate(shape, dtype=dtype)
    if memory is None or memory.size < nbytes:
        a = allocate(shape, dtype=dtype)
        return a.reshape(a.size).view(np.uint8), a
    return memory, memory[:nbytes].view(dtype).reshape(shape)


class Workspace:
    """Arrays kept from call to call under a name, so that a training loop allocates its
    activations once instead of every step (fresh arrays of ~100 MB cost ~10 ms of page faults
    per call at B=128, T=784, n=128). `allocate` is np.empty here and cuda.device_array on the
    GPU.

    A name's memory only grows. Asked for an array that fits in it (a smaller batch after a larger
    one, as training at B=128 and evaluation at 256 with a short last batch alternate), `get`
    hands out a view of its first bytes, so once the largest size has been seen nothing more is
    allocated; the price is that the largest size stays held. A buffer holds whatever its last
    user left there: a cache built in a workspace is valid until the next forward pass that uses
    the same workspace."""

    def __init__(self, allocate=np.empty):
        self.allocate = allocate
        self.buffers = {}               # name -> (its memory as bytes, the array last handed out)
        self.allocations = 0            # buffers allocated so far (not views)

    def get(self, name, shape, dtype):
        shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        memory, last = self.buffers.get(name, (None, None))
        if last is not None and last.shape == shape and last.dtype == dtype:
            return last
        grown, a = grown_view(memory, shape, dtype, self.allocate)
        self.allocations += grown is not memory
        self.buffers[name] = (grown, a)
        return a


class DeviceWorkspace(Workspace):
    """Device buffers kept from call to call under a name (a Workspace on the GPU)."""

    def __init__(self):
        super().__init__(allocate=device_array)


class Staging:
    """Device buffers for a stream of batches, filled without making the host wait for the GPU.

    `cuda.to_device(a)` of a NumPy array costs the host a wait for the GPU: it copies from
    pageable memory with cuMemcpyHtoD, which waits for every kernel already queued, and the fresh
    array it allocates is freed later by numba's batched cudaFree, which waits for the whole GPU.
    Done once per training step, for the batch and its labels, that stops the host until the
    previous step has finished, and the GPU sits idle while the next step is launched.

    A Staging keeps `depth` slots per name and uses them in turn. A slot is a device buffer, and
    for `upload` also a page-locked host buffer and an event. `upload(name, a)` copies `a` into
    the host buffer and queues cuMemcpyHtoDAsync on the default stream, where every kernel runs:
    the call returns at once, and the GPU does the copy after the kernels queued before it and
    before those queued after it. Rewriting a host buffer first waits on its slot's event, which
    marks the copy made `depth` uploads ago under that name; the GPU reaches it when it has
    finished the step before it. So the host runs at most `depth` batches ahead of the GPU.

    The price: an array returned is overwritten by the `depth`-th next call under its name (in
    stream order, so kernels launched before that call read it intact). The training loop and
    evaluation use each batch before they ask for the next one, which is all this needs; a caller
    keeping batches wants fresh arrays instead (`Task.batches(..., reuse=False)`, the default).
    A slot's buffers grow when a larger array comes (a short last batch reuses them). Not
    thread-safe."""

    def __init__(self, depth=2):
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
            raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
        self.depth = int(depth)
        self._slots = {}                      # name -> [next slot index, list of slots]

    def _slot(self, name):
        turn = self._slots.setdefault(name, [0, [_Slot() for _ in range(self.depth)]])
        slot = turn[1][turn[0]]
        turn[0] = (turn[0] + 1) % self.depth
        return slot

    def buffer(self, name, shape, dtype):
        """The next device buffer of `shape` and `dtype` under `name`, for a kernel to fill."""
        return self._slot(name).device_view(shape, dtype)

    def upload(self, name, a):
        """A device array holding the NumPy array `a`, copied without waiting for the GPU."""
        a = np.ascontiguousarray(a)
        slot = self._slot(name)
        if slot.copied is not None:
            slot.copied.synchronize()         # the copy out of this host buffer has run
        host = slot.host_view(a.shape, a.dtype)
        host[...] = a
        d = slot.device_view(a.shape, a.dtype)
        d.copy_to_device(host, stream=cuda.default_stream())
        if slot.copied is None:
            slot.copied = _event()
        slot.copied.record(cuda.default_stream())
        return d


class _Slot:
    """One slot of a Staging: byte buffers on the device and in page-locked host memory, viewed
    with the shape and dtype asked for, and the event recorded after the slot's last copy."""

    def __init__(self):
        self.device = self.host = self.copied = None

    def device_view(self, shape, dtype):
        self.device, a = grown_view(self.device, shape, dtype, device_array)
        return a

    def host_view(self, shape, dtype):
        if 0 in shape:                        # nothing to pin (cuMemHostAlloc of 0 bytes)
            return np.empty(shape, dtype=dtype)
        self.host, a = grown_view(self.host, shape, dtype, pinned_array)
        return a


def _event():
    """An event that only orders (no timing, so cheaper to record); the simulator's takes no
    argument."""
    return cuda.event() if simulator_enabled() else cuda.event(timing=False)


def to_device(a, dtype=None, staging=None, name=None):
    """A device array holding `a` (a NumPy array, or already a device array: returned as is,
    TypeError if it is not of `dtype`): a fresh one, or with a Staging the next slot `name` of
    it."""
    if is_device_array(a):
        if dtype is not None and a.dtype != np.dtype(dtype):
            raise TypeError(f"a device array of dtype {a.dtype} where {np.dtype(dtype)} is "
                            f"needed; convert it first (numba device arrays have no astype)")
        return a
    a = np.ascontiguousarray(a, dtype=dtype)
    if staging is not None:
        return staging.upload(name, a)
    return device_copy(a)
