"""Gaussian noise for the noise-padded tasks: exact N(0, 1), reproducible from a key, and cheap.

A batch of `mnist-noise` holds 128 x 972 x 28 = 3.5 million fresh Gaussians, one of `padded-mnist`
128 x 99 x 784 = 9.9 million. NumPy's `Generator.standard_normal` costs about 17 ns per float32
draw on the 2-core machine this was written on (its ziggurat is reached through a function pointer
for every draw), which made drawing the noise 5-10 % of an mnist-noise training step. The same two
ingredients NumPy uses, compiled into one loop with numba, cost about 7 ns per draw:

Random bits: SplitMix64 (Steele, Lea & Flood 2014), a 64-bit counter passed through a mixing
function:
    s <- s + 0x9E3779B97F4A7C15 ;  w = mix(s)
Each example's noise is its own stream, started at s_0 = hash(key) for an integer key such as
(seed, epoch, batch, row); the hash is the same mixing function chained over the key's entries.
Streams start 2^64-uniformly apart, so two streams of L numbers overlap with probability about
2 L / 2^64 per pair.

Gaussians: the ziggurat (Marsaglia & Tsang 2000) with N = 256 layers of equal area v under
f(x) = exp(-x^2 / 2), x >= 0. With boundaries r = x_1 > x_2 > ... > x_N = 0,
    x_0 = v / f(r),   x_{i+1} = f^{-1}(f(x_i) + v / x_i),   f^{-1}(y) = sqrt(-2 ln y),
layer i >= 1 is the box [0, x_i] x [f(x_i), f(x_{i+1})] and layer 0 the box [0, r] x [0, f(r)]
plus the tail x > r. One 64-bit word w gives the layer i = w mod 256, the sign (bit 8) and
u = (w >> 11) / 2^53 in [0, 1); z = u x_i is returned at once when z < x_{i+1} (98.8 % of the
draws). Otherwise, in layer 0, z comes from the tail (Marsaglia 1964: a = -ln(U1) / r,
b = -ln(U2) until 2 b > a^2, z = r + a); in layer i >= 1 it is kept if
f(x_i) + U (f(x_{i+1}) - f(x_i)) < f(z), else the draw starts over.
"""
import math

import numba
import numpy as np

from .kernels.common import njit_parallel

ZIGGURAT_LAYERS = 256
ZIGGURAT_R = 3.6541528853610088          # x_1 for 256 layers (Marsaglia & Tsang 2000)
ZIGGURAT_V = 4.92867323399e-3            # area of each layer


def ziggurat_tables(N=ZIGGURAT_LAYERS, r=ZIGGURAT_R, v=ZIGGURAT_V):
    """(x, k, fx): boundaries x (N + 1,), acceptance ratios k_i = x_{i+1} / x_i (N,), and
    f(x_i) (N + 1,), all float64, by the recursion in the module docstring."""
    f = lambda t: math.exp(-0.5 * t * t)        # noqa: E731
    x = np.zeros(N + 1)
    x[0], x[1] = v / f(r), r
    for i in range(1, N - 1):
        x[i + 1] = math.sqrt(-2.0 * math.log(f(x[i]) + v / x[i]))
    x[N] = 0.0
    fx = np.exp(-0.5 * x * x)
    return x, x[1:] / x[:-1], fx


ZIG_X, ZIG_K, ZIG_F = ziggurat_tables()

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_2M53 = 1.0 / 9007199254740992.0         # 2^-53


@numba.njit(cache=True, inline="always")
def _mix(z):
    """SplitMix64's output function (a bijection of 64-bit words)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@numba.njit(cache=True, inline="always")
def _next(s):
    """(new state, 64-bit word): one SplitMix64 step."""
    s = s + _GAMMA
    return s, _mix(s)


@numba.njit(cache=True)
def stream_starts(keys):
    """Starting states (B,) uint64 of the streams keyed by the rows of keys (B, k) uint64:
    h = 0; h = mix(h + gamma + key_j) for each entry of the row."""
    starts = np.empty(keys.shape[0], dtype=np.uint64)
    for b in range(keys.shape[0]):
        h = np.uint64(0)
        for j in range(keys.shape[1]):
            h = _mix(h + _GAMMA + keys[b, j])
        starts[b] = h
    return starts


@numba.njit(cache=True, inline="always")
def _uniform_open(s):
    """(state, U) with U uniform in (0, 1] (safe for log)."""
    s, w = _next(s)
    return s, np.float64((w >> np.uint64(11)) + np.uint64(1)) * _2M53


@numba.njit(cache=True)
def _gaussian_slow(s, i, z, negative, X, K, F):
    """(state, z) for a draw that left layer i's core box: the tail (i = 0) or the wedge test,
    and a fresh draw when the wedge rejects (the rare path, 1.5 % of draws)."""
    while True:
        if i == 0:                                             # the tail beyond r
            while True:
                s, u1 = _uniform_open(s)
                s, u2 = _uniform_open(s)
                a = -math.log(u1) / X[1]
                b = -math.log(u2)
                if b + b > a * a:
                    z = X[1] + a
                    return s, -z if negative else z
        s, u3 = _uniform_open(s)
        if F[i] + u3 * (F[i + 1] - F[i]) < math.exp(-0.5 * z * z):   # the wedge
            return s, -z if negative else z
        s, w = _next(s)                                        # rejected: draw again
        i = np.int64(w & np.uint64(0xFF))
        negative = (w >> np.uint64(8)) & np.uint64(1)
        u = np.float64(w >> np.uint64(11)) * _2M53
        z = u * X[i]
        if u < K[i]:
            return s, -z if negative else z


@njit_parallel
def gaussian_fill(x, t0, starts, X, K, F):
    """x[b, t0:, :] = N(0, 1) draws (float32) from the stream started at starts[b], in row-major
    order, for every b. x (B, T, m) float32 C-contiguous, starts (B,) uint64.

    The common case is written out here (one word: layer, sign, u; accept u < k_i), the rest is
    `_gaussian_slow`. The examples are split over the CPU threads (numba.prange); each has its own
    stream, so the result does not depend on the number of threads."""
    B, T, m = x.shape
    for b in numba.prange(B):
        s = starts[b]
        row = x[b].reshape(T * m)                              # a view: x is C-contiguous
        for n in range(t0 * m, T * m):
            s, w = _next(s)
            i = np.int64(w & np.uint64(0xFF))
            negative = (w >> np.uint64(8)) & np.uint64(1)
            u = np.float64(w >> np.uint64(11)) * _2M53         # [0, 1)
            z = u * X[i]
            if u < K[i]:                                       # inside the core box: done
                row[n] = z * (1.0 - 2.0 * np.float64(negative))   # the sign without a branch
            else:
                s, z = _gaussian_slow(s, i, z, negative, X, K, F)
                row[n] = z


def fill_gaussian(x, t0, keys):
    """x[b, t0:] = i.i.d. N(0, 1) float32 noise from the stream of keys[b], for b < B.

    x float32 (B, T, m) C-contiguous (written in place); keys (B, k) non-negative ints."""
    if x.dtype != np.float32 or x.ndim != 3 or not x.flags.c_contiguous:
        raise ValueError(f"x must be C-contiguous float32 of shape (B, T, m), got {x.dtype} "
                         f"{x.shape}")
    keys = np.asarray(keys)
    if keys.ndim != 2 or keys.shape[0] != x.shape[0] or (keys < 0).any():
        raise ValueError(f"need one row of non-negative integer keys per example: x has "
                         f"{x.shape[0]} rows, keys have shape {keys.shape}")
    if not 0 <= t0 <= x.shape[1]:
        raise ValueError(f"t0 must lie in [0, T = {x.shape[1]}], got {t0}")
    starts = stream_starts(keys.astype(np.uint64))
    gaussian_fill(x, int(t0), starts, ZIG_X, ZIG_K, ZIG_F)
