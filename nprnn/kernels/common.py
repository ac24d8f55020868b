"""Scalar math shared by the CPU (`@numba.njit`) and GPU (`@numba.cuda.jit`) twins.

Each function here works on one scalar. It is compiled with `numba.njit`, and numba-cuda can call
such a function from inside a `@cuda.jit` kernel as well, so the math exists exactly once and the
twins differ only in how they split the work.

Derivatives are written in terms of the *output* of the nonlinearity, because that is what the
forward pass stores for BPTT:

    y = tanh(a)     =>  dy/da = 1 - y**2
    y = sigmoid(a)  =>  dy/da = y * (1 - y)
"""
import math

import numba

# One decorator for all kernels of the project: compiled once per machine and cached on disk
# (numba writes the cache into __pycache__ beside the source), so later runs start in seconds.
njit = numba.njit(cache=True, fastmath=False, error_model="numpy")


@njit
def sigmoid(a):
    """sigma(a) = 1 / (1 + exp(-a)), written so that neither branch overflows."""
    if a >= 0:
        return 1.0 / (1.0 + math.exp(-a))
    e = math.exp(a)
    return e / (1.0 + e)


@njit
def dtanh_from_y(y):
    """d tanh(a) / da, given y = tanh(a)."""
    return 1.0 - y * y


@njit
def dsigmoid_from_y(y):
    """d sigma(a) / da, given y = sigma(a)."""
    return y * (1.0 - y)
