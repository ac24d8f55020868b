"""A race and barrier checker for kernels run under Numba's CUDA simulator.

The simulator runs each GPU thread of a block as a Python thread that goes on until it ends or
waits at a barrier, so a missing `cuda.syncthreads()` mostly shows there as wrong numbers, which
the tests against the CPU twins catch (we removed each barrier of the persistent kernels in turn:
every one was caught so). What the simulator cannot show: a barrier that only some threads of a
block reach (undefined behaviour on a GPU; the simulator lets the waiting threads go when the
others end), two threads whose unordered accesses its schedule happens to put in the right order,
and two blocks writing one address (it runs blocks one after another). This checker judges what
every thread touches rather than what it computes, so those fail under the simulator too.

Inside `with RaceCheck() as check:` every element access to a kernel's array arguments (global
memory) and to its shared arrays is logged as (block, thread, epoch, read or write, address),
where a thread's epoch is the number of barriers it has passed.

Warp shuffles. The simulator has no `shfl_down_sync`, and nprnn's stand-in
(`gpu_common.shfl_down`) exchanges through shared memory between two block-wide barriers. On a
GPU a shuffle orders only the 32 threads of its warp. So the barriers that the stand-in passes
count as warp barriers here: they order two accesses of threads of one warp, never of two warps
(each thread keeps a warp epoch beside its block epoch). Otherwise a kernel that relies on a
shuffle to order two warps, as a split kernel with one shared buffer where it needs two would,
passes here and races on a GPU. When a launch ends its log is
judged, launch by launch (launches on one stream are ordered, so only accesses within one
launch can race):

  shared memory  two threads of a block touch one address in the same epoch, one of them writing
                 (no barrier orders them);
  global memory  the same within a block; and any address written by one block and touched by
                 another (blocks never wait for each other);
  barriers       the threads of a block pass different sequences of barriers (a barrier in a
                 branch or loop that some threads skip: undefined behaviour on a GPU, where the
                 simulator may simply go on). Every thread that starts counts, also one that
                 returns before touching any array: an early `return` ahead of a barrier is
                 reported too, though recent GPUs let exited threads out of barriers.

A slice assignment (`a[i, :] = v`) is logged as a write of each element it covers, and a slice
read as the elements then read from it; the elements an array-to-array slice copy reads from its
source are not logged (no kernel of nprnn copies that way).

`check.launches` lists one Launch(kernel, problems, shared, global_) per launch, with the
numbers of shared and global accesses seen; `check.assert_clean()` raises with the problems. It
reaches into the simulator's classes (FakeCUDAArray, FakeCUDAShared, BlockThread,
FakeCUDAKernel), which numba-cuda may change: if they move, this module fails loudly at
`RaceCheck()` rather than checking nothing (and the tests require shared accesses to be seen).
On a real GPU, NVIDIA's compute-sanitizer (`--tool racecheck`, `--tool synccheck`) does this job.
"""
import os
import sys
import threading
from collections import defaultdict, namedtuple

import numpy as np

Launch = namedtuple("Launch", "kernel problems shared global_")
WARP = 32
SHUFFLE_STAND_IN = "shfl_down"           # gpu_common's stand-in for cuda.shfl_down_sync


def _simulator():
    from numba.cuda.simulator import kernel, kernelapi
    from numba.cuda.simulator.cudadrv import devicearray
    return kernel, kernelapi, devicearray


class RaceCheck:
    """Context manager: log and judge every kernel launch made inside it (simulator only)."""

    def __init__(self):
        self.kernel, self.kernelapi, self.devicearray = _simulator()
        self.launches = []              # a Launch per kernel launch
        self._log = []                  # (shared?, block, thread, epoch, write?, address)
        self._barriers = defaultdict(list)     # (block, thread) -> [file:line of each barrier]
        self._saved = []

    # -- installing and removing the hooks --------------------------------------------------
    def _patch(self, owner, name, new):
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def __enter__(self):
        check, array_class = self, self.devicearray.FakeCUDAArray
        get, put = array_class.__getitem__, array_class.__setitem__
        shared_array = self.kernelapi.FakeCUDAShared.array
        sync = self.kernel.BlockThread.syncthreads
        run = self.kernel.BlockThread.run
        launch = self.kernel.FakeCUDAKernel.__call__

        def logged_get(array, index):
            check._access(array, index, write=False)
            value = get(array, index)
            if getattr(array, "_racecheck_shared", False) and isinstance(value, array_class):
                value.__dict__["_racecheck_shared"] = True     # a slice of shared memory
            return value

        def logged_put(array, index, value):
            check._access(array, index, write=True)
            return put(array, index, value)

        def logged_shared_array(shared, shape, dtype, alignment=None):
            # the simulator hands out plain NumPy arrays for shared memory: wrap them so that
            # their accesses are seen too
            wrapped = array_class(shared_array(shared, shape, dtype, alignment))
            wrapped.__dict__["_racecheck_shared"] = True
            return wrapped

        def counted_sync(thread):
            caller = sys._getframe(2)            # the kernel line that called cuda.syncthreads
            check._barriers[(tuple(thread.blockIdx), tuple(thread.threadIdx))].append(
                f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}")
            sync(thread)
            # the shuffle stand-in's barriers order the thread's warp only (module docstring)
            epoch = ("_racecheck_warp_epoch" if caller.f_code.co_name == SHUFFLE_STAND_IN
                     else "_racecheck_epoch")
            setattr(thread, epoch, getattr(thread, epoch, 0) + 1)

        def started_run(thread):
            # a thread that passes no barrier and touches nothing is still one of its block's
            check._barriers.setdefault((tuple(thread.blockIdx), tuple(thread.threadIdx)), [])
            return run(thread)

        def judged_launch(kernel, *args):
            if kernel._device or check.kernel._kernel_context:
                return launch(kernel, *args)     # a device function called inside a kernel
            check._log.clear()
            check._barriers.clear()
            try:
                return launch(kernel, *args)
            finally:
                shared = sum(1 for entry in check._log if entry[0])
                check.launches.append(Launch(kernel.fn.__name__, check._judge(), shared,
                                             len(check._log) - shared))

        self._patch(array_class, "__getitem__", logged_get)
        self._patch(array_class, "__setitem__", logged_put)
        self._patch(self.kernelapi.FakeCUDAShared, "array", logged_shared_array)
        self._patch(self.kernel.BlockThread, "syncthreads", counted_sync)
        self._patch(self.kernel.BlockThread, "run", started_run)
        self._patch(self.kernel.FakeCUDAKernel, "__call__", judged_launch)
        return self

    def __exit__(self, *exc):
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)
        return False

    # -- logging -------------------------------------------------------------------------------
    def _access(self, array, index, write):
        thread = threading.current_thread()
        if not isinstance(thread, self.kernel.BlockThread):
            return                               # host code reading a result
        address = _address(array._ary, index)
        if address is not None:
            addresses = [address]
        elif write:
            addresses = _slice_addresses(array._ary, index)
        else:
            return                               # a slice read: its elements are logged when read
        entry = (getattr(array, "_racecheck_shared", False), tuple(thread.blockIdx),
                 tuple(thread.threadIdx), getattr(thread, "_racecheck_epoch", 0),
                 thread.thread_id // WARP, getattr(thread, "_racecheck_warp_epoch", 0), write)
        self._log.extend(entry + (a,) for a in addresses)

    # -- judging one launch --------------------------------------------------------------------
    def _judge(self):
        problems = []
        per_block = defaultdict(dict)            # every thread seen: its barrier sites
        for _, block, thread, *_ in self._log:
            per_block[block][thread] = ()
        for (block, thread), sites in self._barriers.items():
            per_block[block][thread] = tuple(sites)
        for block, sites in per_block.items():
            if len(set(sites.values())) > 1:
                counts = sorted({len(s) for s in sites.values()})
                problems.append(f"block {block}: its threads pass different barriers "
                                f"({counts} barriers per thread)")
        touches = defaultdict(list)     # address -> [(block, thread, epoch, warp, warp epoch,
        for shared, block, thread, *rest, address in self._log:             # write)]
            key = ("shared", block, address) if shared else ("global", address)
            touches[key].append((block, thread, *rest))
        for key, accesses in touches.items():
            if not any(write for *_, write in accesses):
                continue                         # only reads: never a race
            space, address = key[0], key[-1]
            if space == "global":
                blocks = sorted({block for block, *_ in accesses})
                if len(blocks) > 1:
                    problems.append(f"global {address:#x}: written and touched by blocks "
                                    f"{blocks}")
                    continue
            by_epoch = defaultdict(set)
            for block, thread, epoch, warp, warp_epoch, write in accesses:
                by_epoch[(block, epoch)].add((thread, warp, warp_epoch, write))
            for (block, epoch), group in by_epoch.items():
                # unordered: two threads of two warps, or of one warp between the same shuffles
                clash = sorted({(a[0], b[0]) for a in group if a[3] for b in group
                                if b[0] != a[0] and (b[1] != a[1] or b[2] == a[2])})
                if clash:
                    writers = sorted({w for w, _ in clash})
                    threads = sorted({t for pair in clash for t in pair})
                    problems.append(f"{space} {address:#x} in block {block}, between barriers "
                                    f"{epoch} and {epoch + 1}: written by threads {writers}, "
                                    f"touched by {threads}")
        return problems

    def assert_clean(self):
        """AssertionError listing the problems of every launch that had any."""
        bad = [launch for launch in self.launches if launch.problems]
        if bad:
            lines = [f"{b.kernel}: {len(b.problems)} problem(s), e.g. {b.problems[:3]}"
                     for b in bad]
            raise AssertionError("races or barrier mismatches:\n  " + "\n  ".join(lines))


def _slice_addresses(a, index):
    """The byte addresses of the elements that a[index] = ... writes, for a basic (view) index."""
    view = a[index]
    if not np.shares_memory(view, a):
        raise NotImplementedError(f"racecheck: index {index!r} is not a view of its array")
    start = view.__array_interface__["data"][0]
    offsets = sum(np.arange(size).reshape((-1,) + (1,) * (view.ndim - 1 - d)) * stride
                  for d, (size, stride) in enumerate(zip(view.shape, view.strides)))
    return [start + int(o) for o in np.ravel(offsets)]


def _address(a, index):
    """The byte address of element a[index] for an integer index (tuple), else None."""
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) != a.ndim or not all(isinstance(i, (int, np.integer)) for i in index):
        return None
    offset = 0
    for i, size, stride in zip(index, a.shape, a.strides):
        i = int(i) + (size if int(i) < 0 else 0)
        if not 0 <= i < size:
            raise IndexError(f"index {index} is out of bounds for shape {a.shape}")
        offset += i * stride
    return a.__array_interface__["data"][0] + offset
