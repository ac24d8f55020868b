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

State (v, G) has the parameter's dtype. Both updates leave p untouched wherever g has always been
0, so a strictly upper-triangular W (whose gradient is 0 on and below the diagonal) stays so.

Argument order is the project's: outputs first (updated in place), then inputs, then scalars, so
the GPU twins below (one thread per element) take exactly the same arguments.
"""
import math

import numpy as np

from .common import njit


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
