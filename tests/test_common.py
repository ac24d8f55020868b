"""The scalar math and CPU plumbing of nprnn/kernels/common.py: the float32 tanh and sigmoid, the
subnormal flushing of the float32 BPTT kernels, and BLAS held to one thread."""
import math
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from scipy.special import expit

from nprnn.kernels import common
from nprnn.kernels.common import (flush_denormals, flush_subnormal, restore_fp_mode, sigmoid,
                                 tanh)


def _elementwise(scalar_fn):
    """A compiled loop applying one of common.py's scalar functions to each value of an array."""
    @numba.njit
    def apply(a):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = scalar_fn(a[i])
        return out
    return apply


_apply_tanh = _elementwise(tanh)
_apply_sigmoid = _elementwise(sigmoid)
_apply_flush = _elementwise(flush_subnormal)


def _float32_grid():
    """Dense over the range that matters, every float32 near 0, and far beyond the clamp."""
    return np.unique(np.concatenate([
        np.linspace(-12, 12, 400_001, dtype=np.float32),
        np.float32(10.0) ** np.linspace(-30, 1, 2001, dtype=np.float32),
        -np.float32(10.0) ** np.linspace(-30, 1, 2001, dtype=np.float32),
        np.array([0.0, 8.999, 9.0, 9.001, 50, -50, 1e30, -1e30, np.finfo(np.float32).max],
                 dtype=np.float32)]))


def test_float32_tanh_is_within_5e_7_relative_of_the_exact_value():
    """The docstring's claim: the rational tanh's largest relative error in float32 is < 5e-7."""
    a = _float32_grid()
    got = _apply_tanh(a)
    assert got.dtype == np.float32
    exact = np.tanh(a.astype(np.float64))
    rel = np.abs(got.astype(np.float64) - exact) / np.maximum(np.abs(exact), 1e-300)
    assert rel.max() < 5e-7, f"worst at a = {a[rel.argmax()]!r}: {rel.max():.2e}"
    assert np.all(np.abs(got) <= 1) and np.all(np.sign(got) == np.sign(a))


def test_float32_sigmoid_is_close_to_the_exact_value_and_float64_exact():
    a = _float32_grid()
    got = _apply_sigmoid(a)
    assert got.dtype == np.float32
    exact = expit(a.astype(np.float64))
    # sigma = 1/2 + tanh(a/2) / 2: half the tanh's relative error bound (|tanh| <= 1), plus the
    # float32 rounding of the sum (half an ulp of 1). An absolute bound, since this form gives up
    # the relative accuracy of sigma's tiny values (below 1e-7, where 1 - sigma rounds to 1).
    assert np.abs(got - exact).max() < 0.5 * 5e-7 + 2 ** -24
    a64 = np.array([-800.0, -30.0, -1.0, 0.0, 0.5, 30.0, 800.0])
    want = np.array([1 / (1 + math.exp(-v)) if v > -700 else 0.0 for v in a64])
    np.testing.assert_allclose(_apply_sigmoid(a64), want, rtol=1e-15, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_goes_through_tanh_and_sigmoid_and_infinities_saturate(dtype):
    """A NaN pre-activation must give a NaN state, never a finite one that hides it (the GPU's
    side of this, no min/max in the PTX, is in tests/test_ptx.py)."""
    a = np.array([np.nan, np.inf, -np.inf], dtype=dtype)
    np.testing.assert_array_equal(_apply_tanh(a), np.array([np.nan, 1, -1], dtype=dtype))
    np.testing.assert_array_equal(_apply_sigmoid(a), np.array([np.nan, 1, 0], dtype=dtype))


def test_float32_subnormal_gradients_are_flushed_to_zero():
    """flush_subnormal: float32 subnormals become 0 (they cost ~100 cycles per operation in the
    products of BPTT); normal numbers and all float64 values pass through unchanged."""
    tiny = np.finfo(np.float32).tiny
    a32 = np.array([tiny / 4, -tiny / 2, tiny, -3e-20, 1.0], dtype=np.float32)
    np.testing.assert_array_equal(_apply_flush(a32), np.array([0, 0, tiny, -3e-20, 1], np.float32))
    a64 = np.array([1e-310, -1e-320, 1.0])
    np.testing.assert_array_equal(_apply_flush(a64), a64)


@numba.njit
def _products_in_flush_mode(a, b):
    """a * b elementwise inside a flush_denormals region, and the mode before, inside, after.
    Starts from the default mode, whatever an earlier caller left (torch.set_flush_denormal
    sets the same bits), and puts that back at the end."""
    outer = common._read_mxcsr()
    common._write_mxcsr(outer & ~common.MXCSR_FTZ_DAZ)
    before = common._read_mxcsr()
    mode = flush_denormals(a)
    inside = common._read_mxcsr()
    out = a * b
    restore_fp_mode(mode)
    after = common._read_mxcsr()
    common._write_mxcsr(outer)
    return out, before, inside, after


@pytest.mark.skipif(not common._X86, reason="the FTZ/DAZ mode is an x86 feature; elsewhere "
                                            "flush_denormals does nothing")
def test_float32_bptt_regions_flush_subnormals_and_restore_the_mode():
    tiny = np.finfo(np.float32).tiny
    a = np.array([1e-20, 1e-20, 1.0], np.float32)
    b = np.array([1e-20, tiny / 8, 2.0], np.float32)        # a subnormal result, input
    out, before, inside, after = _products_in_flush_mode(a, b)
    np.testing.assert_array_equal(out, np.array([0, 0, 2], np.float32))
    # the low six bits are status flags that arithmetic sets (underflow, inexact): not the mode
    control = ~0x3F
    assert inside & common.MXCSR_FTZ_DAZ == common.MXCSR_FTZ_DAZ
    assert after & control == before & control and before & common.MXCSR_FTZ_DAZ == 0
    # float64: the mode is not touched and subnormals survive
    a64, b64 = np.array([1e-160, 1.0]), np.array([1e-160, 2.0])
    out64, before, inside, after = _products_in_flush_mode(a64, b64)
    assert out64[0] == 1e-320
    assert before & control == inside & control == after & control


def test_one_blas_thread_holds_scipys_blas_even_if_made_before_it_is_loaded():
    """numba's np.dot calls scipy's BLAS, which loads lazily. The limit must reach it anyway,
    or every per-step product of the kernels would fan out to all cores."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("with one core BLAS runs on one thread anyway; nothing to tell apart")
    code = ("import sys\n"
            "from nprnn.kernels.common import one_blas_thread\n"
            "assert 'scipy.linalg.cython_blas' not in sys.modules\n"
            "with one_blas_thread():\n"
            "    import scipy.linalg.cython_blas\n"
            "    from threadpoolctl import threadpool_info\n"
            "    print([i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'])\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    counts = eval(out.stdout.strip())
    assert counts and all(c == 1 for c in counts), out.stdout


def test_every_cpu_kernel_runs_with_blas_on_one_thread():
    """backends.CPU runs every kernel, a readout's or a loss's as a cell's pass, with BLAS held
    to one thread: after a product large enough for OpenBLAS's own threads, they spin-wait and
    take the cores from the numba threads of the next kernel (docs/speed.md)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("with one core BLAS runs on one thread anyway; nothing to tell apart")
    import scipy.linalg.cython_blas  # noqa: F401  (numba's BLAS, loaded before the limits)
    from threadpoolctl import threadpool_info, threadpool_limits
    from nprnn.core.backends import CPU, Sequence
    from nprnn.kernels.common import Twins

    def blas_threads(seen):
        seen.append([i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"])

    seen = []
    kernel = Twins(blas_threads, None)
    with threadpool_limits(limits=2, user_api="blas"):      # what a user's BLAS may have
        CPU.run(kernel, seen)
        CPU.run_pass(kernel, False, seen, sequence=Sequence((), True))
        blas_threads(seen)                                   # outside: as the user left it
    assert seen[0] and seen[0] == seen[1] and set(seen[0]) == {1}, seen
    assert set(seen[2]) == {2}, seen
