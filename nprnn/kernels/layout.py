"""Batches in the kernels' layout: the datasets give x as (B, T, m), every cell kernel reads it
time-major, (T, B, m), so that step t is one contiguous (B, m) block. The CPU twin above the GPU
twins.

    time_major_cpu       out[t, b, j] = x[b, t, j], counting the non-finite values on the way
                         (the model refuses a NaN or Inf in its input)
    time_major_gpu       the same on the device (device inputs are not scanned)
    copy_leading_steps_gpu   x[:, :t0] = head: the image part of a noise-padded batch made on
                         the device, before its noise is drawn there
                         (nprnn.noise.head_then_noise_device)
"""
import math

import numba

from .common import njit_parallel
from .gpu_common import cuda, line_launch


# ------------------------------------------------------------------------------------------
# CPU twin
# ------------------------------------------------------------------------------------------

@njit_parallel
def time_major_cpu(out, x):
    """out[t, b, j] = x[b, t, j] (written, =, in out's dtype): x (B, T, m) of any strides, out
    (T, B, m) C-contiguous. Returns how many values of out are NaN or Inf: those of x, and any
    that overflow out's dtype (float64 x beyond float32's range). Steps are split over the CPU
    threads; for a padded-mnist batch (40 MB) this is a quarter of NumPy's single-threaded
    isfinite + transposing copy."""
    B, T, m = x.shape
    bad = 0
    for t in numba.prange(T):
        for b in range(B):
            for j in range(m):
                out[t, b, j] = x[b, t, j]
                if not math.isfinite(out[t, b, j]):
                    bad += 1
    return bad


# ------------------------------------------------------------------------------------------
# GPU twins
# ------------------------------------------------------------------------------------------

# The elements of the array written in its memory order, in a grid-stride loop over a 1-d grid
# (line_launch): a grid's second and third dimensions stop at 65,535 blocks on a GPU (not in the
# simulator), which T or B could exceed.

@cuda.jit(cache=True)
def time_major_kernel(out, x):
    """out[t, b, j] = x[b, t, j] (written, =; converted to out's dtype): x (B, T, m), out
    (T, B, m). Out's elements in its memory order (coalesced writes)."""
    T, B, m = out.shape
    for i in range(cuda.grid(1), T * B * m, cuda.gridsize(1)):
        t, r = i // (B * m), i % (B * m)
        out[t, r // m, r % m] = x[r // m, t, r % m]


def time_major_gpu(out, x, *, threads=256):
    """out (T, B, m) = x (B, T, m) with its first two axes swapped (written, =), on the device."""
    time_major_kernel[line_launch(out.size, threads)](out, x)


@cuda.jit(cache=True)
def copy_leading_steps_kernel(x, head):
    """x[b, t, j] = head[b, t, j] for t < t0 (written, =): head (B, t0, m) into x (B, T, m).
    Head's elements in its memory order."""
    B, t0, m = head.shape
    for i in range(cuda.grid(1), B * t0 * m, cuda.gridsize(1)):
        b, r = i // (t0 * m), i % (t0 * m)
        x[b, r // m, r % m] = head[b, r // m, r % m]


def copy_leading_steps_gpu(x, head, *, threads=256):
    """x[:, :t0] = head (written, =) for device arrays head (B, t0, m), x (B, T, m)."""
    copy_leading_steps_kernel[line_launch(head.size, threads)](x, head)
