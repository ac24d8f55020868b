"""Optimizer update kernels: SGD with momentum, Adagrad, and the squared gradient norm for clipping.

Every kernel works on one parameter tensor seen as a flat, contiguous 1-d array of N values, so a
kernel does not care whether the tensor was W (n, n) or b_h (n,). The updates, for each element:

    clipping (global norm):   s = min(1, c / ||g||)       ||g||^2 = sum over ALL tensors of g**2
                              (s = 1 when clipping is off; the caller passes s to the kernels)

    SGD with momentum:        v <- mu * v + s * g
                              p <- p - lr * v

    Adagrad (Duchi et al., 2011, diagonal form):
                              G <- G + (s * g)**2
                              p <- p - lr * s * g / (sqrt(G) + delta)

State (v, G) has the parameter's dtype. The scalars (lr, momentum, delta, scale) arrive as Python
floats, so each element's update is computed in float64 and rounded once into the parameter's
dtype; the cost is negligible beside a training step. Both updates leave p untouched wherever g
has always been 0, so a strictly upper-triangular W (whose gradient is 0 on and below the
diagonal) stays so.

Argument order is the project's: outputs first (updated in place), then inputs, then scalars, so
the GPU twins below (one thread per element) take exactly the same arguments.
"""
import math

import numpy as np

from .common import njit
from .gpu_common import cdiv, cuda, scratch


# ------------------------------------------------------------------------------------------
# CPU twins
# ------------------------------------------------------------------------------------------

@njit
def sum_squares_cpu(out, g):
    """out[0] += sum_i g_i**2, accumulated in out's dtype (float64). g (N,) read; out (1,)."""
    acc = 0.0
    for i in range(g.shape[0]):
        gi = np.float64(g[i])             # square in float64: a float32 square can overflow
        acc += gi * gi
    out[0] += acc


@njit
def sgd_momentum_cpu(p, v, g, lr, momentum, scale):
    """One step of SGD with momentum, in place.

    Updated (in place): p (N,) parameters, v (N,) velocity.   Read: g (N,) gradient.
        v_i = momentum * v_i + scale * g_i
        p_i = p_i - lr * v_i
    """
    for i in range(p.shape[0]):
        v[i] = momentum * v[i] + scale * g[i]
        p[i] -= lr * v[i]


@njit
def adagrad_cpu(p, G, g, lr, delta, scale):
    """One step of Adagrad, in place.

    Updated (in place): p (N,) parameters, G (N,) sum of squared (clipped) gradients.
    Read: g (N,) gradient.
        G_i = G_i + (scale * g_i)**2
        p_i = p_i - lr * scale * g_i / (sqrt(G_i) + delta)
    """
    for i in range(p.shape[0]):
        gi = scale * g[i]
        G[i] += gi * gi
        p[i] -= lr * gi / (math.sqrt(G[i]) + delta)


# ------------------------------------------------------------------------------------------
# GPU twins: one thread per element for the updates; the norm as a two-pass reduction
# ------------------------------------------------------------------------------------------
# Host functions take the CPU twins' arguments (device arrays; out is a float64 (1,) device
# array) and keyword-only launch options. The reduction uses a fixed number of blocks, so the
# sum is taken in the same order on every GPU and every run: training on the GPU is repeatable.

SUM_BLOCKS = 64


@cuda.jit
def sum_squares_block_kernel(block_sums, g):
    """block_sums[k] = sum of g_i**2 (in float64) over the elements i that block k visits:
    i = k * blockDim + tid, then strides of gridDim * blockDim. Written (=): block_sums (gridDim,).
    Each thread sums its elements, then the block adds its threads' sums in a tree in shared
    memory (blockDim must be a power of two)."""
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    sums = cuda.shared.array(0, dtype=block_sums.dtype)
    acc = block_sums.dtype.type(0)
    for i in range(cuda.grid(1), g.shape[0], cuda.gridDim.x * nthreads):
        gi = block_sums.dtype.type(g[i])     # square in float64: a float32 square can overflow
        acc += gi * gi
    sums[tid] = acc
    cuda.syncthreads()
    half = nthreads // 2
    while half > 0:
        if tid < half:
            sums[tid] += sums[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        block_sums[cuda.blockIdx.x] = sums[0]


@cuda.jit
def sum_block_sums_kernel(out, block_sums):
    """out[0] += sum_k block_sums[k], in order, by one thread (updated, +=)."""
    if cuda.grid(1) == 0:
        acc = out.dtype.type(0)
        for k in range(block_sums.shape[0]):
            acc += block_sums[k]
        out[0] += acc


def sum_squares_gpu(out, g, *, threads=256):
    """Twin of sum_squares_cpu: out[0] += sum_i g_i**2. out (1,) float64, g (N,) (device)."""
    if threads & (threads - 1):
        raise ValueError(f"threads must be a power of two, got {threads}")
    blocks = max(1, min(SUM_BLOCKS, cdiv(g.shape[0], threads)))
    block_sums = scratch("sum_squares", (blocks,), out.dtype)
    sum_squares_block_kernel[blocks, threads, 0, threads * out.dtype.itemsize](block_sums, g)
    sum_block_sums_kernel[1, 1](out, block_sums)


@cuda.jit
def sgd_momentum_kernel(p, v, g, lr, momentum, scale):
    """v_i = momentum v_i + scale g_i ; p_i = p_i - lr v_i (updated in place). One thread per
    element i; 1-d grid."""
    i = cuda.grid(1)
    if i < p.shape[0]:
        v[i] = momentum * v[i] + scale * g[i]
        p[i] -= lr * v[i]


@cuda.jit
def adagrad_kernel(p, G, g, lr, delta, scale):
    """G_i = G_i + (scale g_i)**2 ; p_i = p_i - lr scale g_i / (sqrt(G_i) + delta) (updated in
    place). One thread per element i; 1-d grid."""
    i = cuda.grid(1)
    if i < p.shape[0]:
        gi = scale * g[i]
        G[i] += gi * gi
        p[i] -= lr * gi / (math.sqrt(G[i]) + delta)


def sgd_momentum_gpu(p, v, g, lr, momentum, scale, *, threads=256):
    """Twin of sgd_momentum_cpu (device arrays): p, v (N,) updated in place."""
    sgd_momentum_kernel[max(1, cdiv(p.shape[0], threads)), threads](p, v, g, lr, momentum,
                                                                    scale)


def adagrad_gpu(p, G, g, lr, delta, scale, *, threads=256):
    """Twin of adagrad_cpu (device arrays): p, G (N,) updated in place."""
    adagrad_kernel[max(1, cdiv(p.shape[0], threads)), threads](p, G, g, lr, delta, scale)
