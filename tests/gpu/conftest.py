"""Settings every GPU test shares."""
import os
import sys

import numpy as np
import pytest

from nprnn.kernels import gpu_common

if gpu_common.simulator_enabled():
    from numba.cuda import types
    from numba.cuda.np import numpy_support
    from numba.cuda.simulator import kernelapi

    _dynamic_shared = kernelapi.FakeCUDAShared.array

    def _shared_array(self, shape, dtype, alignment=None):
        """The simulator's cuda.shared.array, made safe for its threads. The simulator gives
        the array of one source line to every thread of a block, and makes it when a thread
        first asks: two threads that both find none each make their own (numba-cuda 0.30.4
        looks up, then stores), and one block's threads then write and read different arrays,
        of uninitialised memory. dict.setdefault keeps the first one made (one step under the
        GIL: the key is a tuple of a str and an int)."""
        if shape == 0 or alignment is not None:        # dynamic shared memory: one buffer
            return _dynamic_shared(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        line = (caller.f_code.co_filename, caller.f_lineno)
        array = self._allocations.get(line)
        if array is None:
            if isinstance(dtype, types.Type):
                dtype = numpy_support.as_dtype(dtype)
            array = self._allocations.setdefault(line, np.empty(shape, dtype))
        return array

    kernelapi.FakeCUDAShared.array = _shared_array


@pytest.fixture(autouse=True)
def short_gil_turns():
    """Under the simulator, threads take turns with the GIL every 0.2 ms, not 5 ms: each GPU
    thread of a block is a Python thread, which the simulator's block manager polls in a loop,
    and a thread waiting for the GIL gets it when the holder has run for the switch interval,
    so every thread's turn at every barrier cost up to 5 ms. The GPU tests run about three times
    as fast. (Shorter turns made the race that `_shared_array` mends common; at 5 ms a thread
    seldom lost the GIL between its two steps. Beside a Dask cluster they also hung a trial:
    tests/gpu/test_gpu_sweep.py turns Dask's profiler off.)"""
    if not gpu_common.simulator_enabled():
        yield
        return
    default = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)
    yield
    sys.setswitchinterval(default)


@pytest.fixture(autouse=True)
def few_line_blocks(monkeypatch):
    """1-d element-wise launches (gpu_common.line_launch) take at most 2 blocks, so that at the
    tests' sizes their kernels' grid-stride loops run several rounds, and the simulator, which
    runs each GPU thread in Python, runs a few hundred threads where it ran thousands."""
    monkeypatch.setattr(gpu_common, "LINE_BLOCKS", 2)


def pytest_collection_modifyitems(config, items):
    """NPRNN_TEST_SHARD=i/n keeps the i-th of every n tests (i from 1): tests/test_cuda.py runs
    the longest files under the simulator in n processes, so that none is the suite's last."""
    shard = os.environ.get("NPRNN_TEST_SHARD")
    if not shard:
        return
    i, n = (int(k) for k in shard.split("/"))
    kept, left = [], []
    for k, item in enumerate(items):
        (kept if k % n == i - 1 else left).append(item)
    config.hook.pytest_deselected(items=left)
    items[:] = kept
