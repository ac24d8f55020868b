"""Helpers of the GPU tests (tests/gpu): when they run, device arrays, and the comparison.

The GPU tests run wherever numba.cuda can run a kernel: on a real GPU, or under Numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1 set before numba is imported; tests/test_cuda.py starts such a
run in a subprocess when there is no GPU). Anywhere else they skip, naming the reason.

Sizes are tiny on purpose (the simulator runs every GPU thread as a Python thread) and chosen
to leave ragged edges everywhere: n = 6 units over blocks of 4 threads, B = 3 rows over blocks
of 2 rows, so every kernel runs several blocks and some threads find nothing to do. T = 4 differs
from B = 3, so that a kernel that mixes up the time and batch axes fails.
"""
import numpy as np
import pytest
from numba import cuda

from nprnn.core.backends import Launch
from nprnn.core.device import cuda_available

CUDA_OK, CUDA_WHY = cuda_available()
requires_cuda = pytest.mark.skipif(
    not CUDA_OK, reason=f"no CUDA target ({CUDA_WHY}); without a GPU tests/test_cuda.py runs "
                        f"these tests under the CUDA simulator")

T, B, M, N = 4, 3, 2, 6          # time steps, batch rows, input size, hidden units
STEP_BLOCK = (4, 2)              # version 1: 4 units x 2 rows per block -> 2 x 2 blocks
THREADS, ROWS = 4, 2             # version 2: 4 threads per block, 2 rows per block -> 2 blocks
TILE = 8                         # matmul_tn_gpu tile in the cell tests (it has its own test)
SMALL_LAUNCH = Launch(step_block=STEP_BLOCK, threads=THREADS, rows=ROWS, tile=TILE,
                      readout_block=(4, 2))
DTYPES = ("float64", "float32")

# |gpu - cpu| <= atol + rtol |cpu| (llm.c's validate_result): float64 to rounding, float32 with
# room for a different summation order and the CPU's rational tanh (relative error < 5e-7).
TOLERANCE = {"float64": (1e-12, 1e-12), "float32": (2e-5, 2e-5)}


def small_launch(monkeypatch):
    """Launch settings (nprnn.core.backends.LAUNCH, which models take when made) shrunk, so that each
    kernel runs several small, ragged blocks (the simulator runs each thread in Python)."""
    from nprnn.core import backends
    monkeypatch.setattr(backends, "LAUNCH", SMALL_LAUNCH)


def record_launches(monkeypatch, cell):
    """A list to which each GPU launch of `cell`'s passes appends (pass, version, layout), as it
    runs (the cell's forward_kernels and backward_kernels wrapped; for a split launch, its lanes
    in place of the layout)."""
    launched = []

    def recorded(run, direction, version):
        if run is None:
            return None
        return lambda *a, **kw: (launched.append((direction, version,
                                                  kw.get("layout", kw.get("lanes")))),
                                 run(*a, **kw))[1]
    for direction in ("forward", "backward"):
        twins = getattr(cell, f"{direction}_kernels")
        monkeypatch.setattr(cell, f"{direction}_kernels", twins._replace(
            gpu=recorded(twins.gpu, direction, "step"),
            gpu_persistent=recorded(twins.gpu_persistent, direction, "persistent"),
            gpu_split=recorded(twins.gpu_split, direction, "split")))
    return launched


def assert_close(got, want, dtype, what):
    """Compare a device (or host) array with the CPU twin's result."""
    got = got.copy_to_host() if hasattr(got, "copy_to_host") else np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, CPU twin {want.shape}"
    atol, rtol = TOLERANCE[str(dtype)]
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = atol + rtol * np.abs(want.astype(np.float64))
    if not (err <= bound).all():
        k = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"{what} ({dtype}): GPU {got[k]!r} vs CPU {want[k]!r} at index {k}; "
                             f"|diff| {err[k]:.3g} > {bound[k]:.3g} (max |diff| {err.max():.3g})")


def rand(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def empty_like(a):
    return cuda.device_array(a.shape, dtype=a.dtype)
